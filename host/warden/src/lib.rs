//! Warden: a durable agent runtime whose extensions run sandboxed.
//!
//! This is the crate to embed: it re-exports the host's crates under one
//! name, and the types most embedders start from at its root
//! ([`Runtime`], [`Agent`], [`Sandbox`], [`PluginHost`], the stores). Each
//! module is one crate of the host, lowest first:
//!
//! - [`sandbox`] (`warden-sandbox`): the wasmtime engine, component loading
//!   and its cache, capabilities, limits and leases (one fresh instance per
//!   invocation). Knows nothing of runs.
//! - [`store`] (`warden-store`): the [`EventStore`] trait, the hash chain,
//!   and the in-memory, SQLite and PostgreSQL stores.
//! - [`providers`] (`warden-providers`): the
//!   [`providers::ModelProvider`] trait and the models behind it: scripted
//!   transcripts, OpenAI-compatible chat completions and the Anthropic
//!   Messages API over one pooled HTTP client, and their `[model]`
//!   configuration.
//! - [`plugins`] (`warden-plugins`): manifests, built-in plugins, and the
//!   [`PluginHost`] that loads a plugin under a grant and calls its tools;
//!   [`grant`] is its grants, requested ∩ granted, and effect classes.
//! - [`engine`] (`warden-engine`): agents, the event log, deciding and
//!   replaying runs, the [`Runtime`]; [`worker`] is the work queue's
//!   consumer (`warden worker`).
//! - [`testkit`] (`warden-testkit`): for plugin authors' tests: load a
//!   component under chosen grants and limits, call it, assert on the
//!   result and receipt.
//! - [`units`], [`json_limits`], [`toml_errors`], [`untrusted`]
//!   (`warden-syntax`): sizes and durations, JSON nesting limits, one-line
//!   TOML errors, and the one renderer of text Warden did not write.
//!
//! - [`errors`]: the stable error codes and details of the crates' typed
//!   errors, shared by every surface (the command line, the Python package).
//! - [`threat_model`]: the surfaces and attackers the security model
//!   covers, which the suite's attack matrix crosses.
//! - [`fault_model`]: the effect kinds Warden performs on a run's behalf
//!   and the faults around them, which the suite's effects matrix crosses.
//!
//! Features (all on by default): `sqlite` and `postgres` (the stores),
//! `builtin` (the first-party plugins, built and embedded).
//!
//! ARCHITECTURE.md in the repository maps every crate and its invariants.

pub mod errors;
pub mod fault_model;
pub mod threat_model;

pub use warden_engine as engine;
pub use warden_engine::worker;
pub use warden_plugins as plugins;
pub use warden_plugins::grant;
pub use warden_providers as providers;
pub use warden_sandbox as sandbox;
pub use warden_store as store;
pub use warden_syntax::{json_limits, toml_errors, units, untrusted};
pub use warden_testkit as testkit;

pub use warden_engine::{Agent, RunId, RunStatus, Runtime, RuntimeError};
pub use warden_plugins::PluginHost;
pub use warden_sandbox::{Sandbox, SandboxConfig};
#[cfg(feature = "postgres")]
pub use warden_store::PostgresStore;
#[cfg(feature = "sqlite")]
pub use warden_store::SqliteStore;
pub use warden_store::{EventStore, MemoryStore};
