#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! The crate root re-exports everything a plugin needs; the modules are
//! `tool`, `context`, `channel` and `policy` (one per plugin kind), `fs`,
//! `glob`, `http`, `log`, `secrets`, `testing` (native only) and `bindings` (generated). Every
//! other module is private.
#![deny(unsafe_code)]

// The generated export macros name this crate by path, also from inside it.
extern crate self as warden_guest;

pub mod bindings;
mod channel;
mod context;
mod export;
pub mod fs;
pub mod glob;
mod host;
pub mod http;
mod json;
pub mod log;
mod policy;
pub mod secrets;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
mod tool;
mod types;

#[doc(hidden)]
pub use export::__private;

pub use channel::ChannelPlugin;
pub use context::ContextPlugin;
pub use host::config;
pub use policy::{PolicyPlugin, RequestedCall, Subject};
pub use tool::{Tool, ToolPlugin, Toolbox};
pub use types::{
    Call, ContextError, ContextItem, ContextRequest, Decision, Delivery, DeliveryError, Effect,
    Failure, LogLevel, PolicyError, PolicyHook, PolicyRequest, Preview, Rejection, SourceSpec,
    ToolError, ToolOutput, ToolSpec,
};
