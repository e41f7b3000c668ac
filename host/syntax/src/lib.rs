//! How Warden reads text that people and models write, shared by the
//! crates that parse it:
//!
//! - [`units`]: sizes and durations in configuration files (`64MiB`, `10s`).
//! - [`toml_errors`]: a TOML parse error as one line naming line and key.
//! - [`json_limits`]: how deeply nested a JSON value a run accepts, so that
//!   every recorded event can be read back.
//! - [`evidence`]: text that may not be UTF-8 (paths, arguments) shown in
//!   an error's details.
//! - [`untrusted`]: text from a plugin, a model, an MCP server or a tool's
//!   output, shown to a person as data (controls and escape sequences
//!   made visible, lengths bounded).

pub mod evidence;
pub mod json_limits;
pub mod toml_errors;
pub mod units;
pub mod untrusted;
