//! The wit-bindgen bindings of the four Warden worlds, generated once here.
//!
//! `tool-plugin` generates the shared interfaces `warden:plugin/types`,
//! `warden:plugin/host` and `warden:plugin/secrets`; `context-plugin`, `channel-plugin` and
//! `policy-plugin` reuse them
//! through wit-bindgen's `with` option, so every WIT type has exactly one Rust
//! type. The export macros are public (`pub_export_macro`) and find their
//! runtime through this crate, so a plugin crate depends on `warden-guest`
//! alone. Plugin authors use the `export_*_plugin!` macros at the crate root,
//! not these generated ones.
//!
//! `http_client` holds the WASI 0.2 HTTP client interfaces
//! (`wasi:http/outgoing-handler` and what it uses), from `wit/http/`; only
//! plugins that call [`http::send`](crate::http::send) import them.
//!
//! This is the only module of the crate that contains unsafe code: the
//! canonical ABI glue wit-bindgen generates.
#![allow(unsafe_code, missing_docs, clippy::all)]

wit_bindgen::generate!({
    world: "tool-plugin",
    path: "../wit",
    additional_derives: [PartialEq, Eq],
    pub_export_macro: true,
    export_macro_name: "export_tool_world",
    default_bindings_module: "::warden_guest::bindings",
    runtime_path: "::warden_guest::__private::wit_bindgen::rt",
});

/// Bindings of the `context-plugin` world; shared interfaces come from the
/// parent module.
pub mod context {
    wit_bindgen::generate!({
        world: "context-plugin",
        path: "../wit",
        additional_derives: [PartialEq, Eq],
        with: {
            "warden:plugin/types@0.1.0": crate::bindings::warden::plugin::types,
            "warden:plugin/host@0.1.0": crate::bindings::warden::plugin::host,
            "warden:plugin/secrets@0.1.0": crate::bindings::warden::plugin::secrets,
        },
        pub_export_macro: true,
        export_macro_name: "export_context_world",
        default_bindings_module: "::warden_guest::bindings::context",
        runtime_path: "::warden_guest::__private::wit_bindgen::rt",
    });
}

/// Bindings of the `channel-plugin` world; shared interfaces come from the
/// parent module.
pub mod channel {
    wit_bindgen::generate!({
        world: "channel-plugin",
        path: "../wit",
        additional_derives: [PartialEq, Eq],
        with: {
            "warden:plugin/types@0.1.0": crate::bindings::warden::plugin::types,
            "warden:plugin/host@0.1.0": crate::bindings::warden::plugin::host,
            "warden:plugin/secrets@0.1.0": crate::bindings::warden::plugin::secrets,
        },
        pub_export_macro: true,
        export_macro_name: "export_channel_world",
        default_bindings_module: "::warden_guest::bindings::channel",
        runtime_path: "::warden_guest::__private::wit_bindgen::rt",
    });
}

/// Bindings of the `policy-plugin` world; shared interfaces come from the
/// parent module.
pub mod policy {
    wit_bindgen::generate!({
        world: "policy-plugin",
        path: "../wit",
        additional_derives: [PartialEq, Eq],
        with: {
            "warden:plugin/types@0.1.0": crate::bindings::warden::plugin::types,
            "warden:plugin/host@0.1.0": crate::bindings::warden::plugin::host,
            "warden:plugin/secrets@0.1.0": crate::bindings::warden::plugin::secrets,
        },
        pub_export_macro: true,
        export_macro_name: "export_policy_world",
        default_bindings_module: "::warden_guest::bindings::policy",
        runtime_path: "::warden_guest::__private::wit_bindgen::rt",
    });
}

/// Bindings of `wasi:http/outgoing-handler@0.2.12` and the interfaces it
/// uses, for [`http`](crate::http).
pub mod http_client {
    wit_bindgen::generate!({
        world: "warden:http-client/http-client",
        path: "wit/http",
        generate_all,
        runtime_path: "::warden_guest::__private::wit_bindgen::rt",
    });
}
