//! Warden: a durable agent runtime whose extensions run sandboxed.
//!
//! Where to look:
//! - [`sandbox`]: the wasmtime engine, component loading and its cache,
//!   capabilities, limits and leases (one fresh instance per invocation).
//! - [`plugins`]: manifests, built-in plugins, and the [`plugins::PluginHost`]
//!   that loads a plugin under a grant and calls its tools.
//! - [`policy`]: grants, requested ∩ granted, and effect classes.
//! - [`providers`]: the [`providers::ModelProvider`] trait and the models
//!   behind it: scripted transcripts, OpenAI-compatible chat completions
//!   and the Anthropic Messages API over one pooled HTTP client.
//! - [`worker`]: the work queue's consumer: claims runs from a shared
//!   store and drives them under fenced leases (`warden worker`).
//! - [`json_limits`]: how deeply nested a JSON value a run accepts, so
//!   that every recorded event can be read back.
//! - [`testkit`]: for plugin authors' tests: load a component under chosen
//!   grants and limits, call it, assert on the result and receipt.
//!
//! ARCHITECTURE.md in the repository maps every module and its invariants.

pub mod cli;
pub mod engine;
pub mod json_limits;
pub mod plugins;
pub mod policy;
pub mod providers;
pub mod sandbox;
pub mod store;
pub mod testkit;
pub mod toml_errors;
pub mod units;
pub mod worker;
