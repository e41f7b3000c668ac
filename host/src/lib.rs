//! Warden: a durable agent runtime whose extensions run sandboxed.
//!
//! Where to look:
//! - [`sandbox`]: the wasmtime engine, component loading and its cache,
//!   capabilities, limits and leases (one fresh instance per invocation).
//!
//! ARCHITECTURE.md in the repository maps every module and its invariants.

pub mod sandbox;
