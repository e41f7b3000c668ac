//! The export macros that bind a plugin type to its world's WIT exports, and
//! the glue functions they expand to (`__private`, not public API).
//!
//! Each macro defines a hidden type implementing the generated `Guest` trait
//! by forwarding to the plugin's trait, then runs wit-bindgen's export macro
//! for the world, which also embeds the world's type information in the
//! plugin. Use at most one of them, once, per plugin crate.
//!
//! Off wasm the wit-bindgen export is left out (its symbol names, such as
//! `warden:plugin/tool@0.1.0#invoke`, do not link into a native `cdylib`);
//! the glue is still type-checked, and native tests call the plugin's
//! trait or `Toolbox` directly.

/// Exports a [`ToolPlugin`](crate::ToolPlugin) as the WIT world
/// `tool-plugin`. Use it once, at the plugin crate's root.
///
/// ```
/// use warden_guest::{ToolPlugin, Toolbox};
///
/// struct Empty;
/// impl ToolPlugin for Empty {
///     fn toolbox() -> Toolbox {
///         Toolbox::new()
///     }
/// }
/// warden_guest::export_tool_plugin!(Empty);
/// ```
#[macro_export]
macro_rules! export_tool_plugin {
    ($plugin:ty) => {
        const _: () = {
            #[allow(dead_code)]
            struct __WardenToolExport;
            impl $crate::bindings::exports::warden::plugin::tool::Guest for __WardenToolExport {
                fn describe() -> ::std::vec::Vec<$crate::ToolSpec> {
                    $crate::__private::tool_describe::<$plugin>()
                }
                fn preflight(
                    call: $crate::Call,
                ) -> ::core::result::Result<$crate::Preview, $crate::ToolError> {
                    $crate::__private::tool_preflight::<$plugin>(call)
                }
                fn invoke(
                    call: $crate::Call,
                ) -> ::core::result::Result<$crate::ToolOutput, $crate::ToolError> {
                    $crate::__private::tool_invoke::<$plugin>(call)
                }
            }
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::export_tool_world!(
                __WardenToolExport with_types_in $crate::bindings
            );
        };
    };
}

/// Exports a [`ContextPlugin`](crate::ContextPlugin) as the WIT world
/// `context-plugin`. Use it once, at the plugin crate's root.
///
/// ```
/// use warden_guest::{ContextError, ContextItem, ContextPlugin, ContextRequest, SourceSpec};
///
/// struct Motd;
/// impl ContextPlugin for Motd {
///     fn describe() -> SourceSpec {
///         SourceSpec::new("motd", "The message of the day")
///     }
///     fn resolve(_: ContextRequest) -> Result<Vec<ContextItem>, ContextError> {
///         Ok(vec![ContextItem::new("motd", "be kind")])
///     }
/// }
/// warden_guest::export_context_plugin!(Motd);
/// ```
#[macro_export]
macro_rules! export_context_plugin {
    ($plugin:ty) => {
        const _: () = {
            #[allow(dead_code)]
            struct __WardenContextExport;
            impl $crate::bindings::context::exports::warden::plugin::context_source::Guest
                for __WardenContextExport
            {
                fn describe() -> $crate::SourceSpec {
                    <$plugin as $crate::ContextPlugin>::describe()
                }
                fn resolve(
                    request: $crate::ContextRequest,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::ContextItem>,
                    $crate::ContextError,
                > {
                    <$plugin as $crate::ContextPlugin>::resolve(request)
                }
            }
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::context::export_context_world!(
                __WardenContextExport with_types_in $crate::bindings::context
            );
        };
    };
}

/// Exports a [`ChannelPlugin`](crate::ChannelPlugin) as the WIT world
/// `channel-plugin`. Use it once, at the plugin crate's root.
///
/// ```
/// use warden_guest::{ChannelPlugin, Delivery, DeliveryError, SourceSpec};
///
/// struct Discard;
/// impl ChannelPlugin for Discard {
///     fn describe() -> SourceSpec {
///         SourceSpec::new("discard", "Accepts and drops every delivery")
///     }
///     fn deliver(_: Delivery) -> Result<(), DeliveryError> {
///         Ok(())
///     }
/// }
/// warden_guest::export_channel_plugin!(Discard);
/// ```
#[macro_export]
macro_rules! export_channel_plugin {
    ($plugin:ty) => {
        const _: () = {
            #[allow(dead_code)]
            struct __WardenChannelExport;
            impl $crate::bindings::channel::exports::warden::plugin::channel::Guest
                for __WardenChannelExport
            {
                fn describe() -> $crate::SourceSpec {
                    <$plugin as $crate::ChannelPlugin>::describe()
                }
                fn deliver(
                    delivery: $crate::Delivery,
                ) -> ::core::result::Result<(), $crate::DeliveryError> {
                    <$plugin as $crate::ChannelPlugin>::deliver(delivery)
                }
            }
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::channel::export_channel_world!(
                __WardenChannelExport with_types_in $crate::bindings::channel
            );
        };
    };
}

/// Exports a [`PolicyPlugin`](crate::PolicyPlugin) as the WIT world
/// `policy-plugin`. Use it once, at the plugin crate's root.
///
/// ```
/// use warden_guest::{Decision, PolicyError, PolicyPlugin, PolicyRequest, SourceSpec, Subject};
///
/// struct NoDeletes;
/// impl PolicyPlugin for NoDeletes {
///     fn describe() -> SourceSpec {
///         SourceSpec::new("no-deletes", "Denies every tool whose name says delete")
///     }
///     fn decide(request: PolicyRequest) -> Result<Decision, PolicyError> {
///         Ok(match request.subject()? {
///             Subject::BeforeToolCall { tool, .. } if tool.contains("delete") => {
///                 Decision::deny(format!("`{tool}` deletes"))
///             }
///             _ => Decision::Allow,
///         })
///     }
/// }
/// warden_guest::export_policy_plugin!(NoDeletes);
/// ```
#[macro_export]
macro_rules! export_policy_plugin {
    ($plugin:ty) => {
        const _: () = {
            #[allow(dead_code)]
            struct __WardenPolicyExport;
            impl $crate::bindings::policy::exports::warden::plugin::policy::Guest
                for __WardenPolicyExport
            {
                fn describe() -> $crate::SourceSpec {
                    <$plugin as $crate::PolicyPlugin>::describe()
                }
                fn decide(
                    request: $crate::PolicyRequest,
                ) -> ::core::result::Result<$crate::Decision, $crate::PolicyError> {
                    <$plugin as $crate::PolicyPlugin>::decide(request)
                }
            }
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::policy::export_policy_world!(
                __WardenPolicyExport with_types_in $crate::bindings::policy
            );
        };
    };
}

/// What the export macros expand to. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;

    use crate::tool::ToolPlugin;
    use crate::types::{Call, Preview, ToolError, ToolOutput, ToolSpec};

    pub fn tool_describe<P: ToolPlugin>() -> Vec<ToolSpec> {
        P::toolbox().describe()
    }

    pub fn tool_preflight<P: ToolPlugin>(call: Call) -> Result<Preview, ToolError> {
        P::toolbox().preflight(&call)
    }

    pub fn tool_invoke<P: ToolPlugin>(call: Call) -> Result<ToolOutput, ToolError> {
        P::toolbox().invoke(&call)
    }
}
