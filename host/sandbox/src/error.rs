//! Typed errors of the sandbox: [`SandboxError`] for setting up the engine and
//! loading components, [`LeaseError`] for an invocation the host had to stop.

use std::path::PathBuf;
use std::time::Duration;

use super::Outcome;
use super::compile::CompileLimit;

/// Setting up the sandbox or loading a component failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The wasmtime engine could not be configured.
    #[error("cannot configure the wasmtime engine: {reason}")]
    Engine {
        /// What wasmtime said.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{action} `{path}`: {error}")]
    Io {
        /// What was being done, for example "cannot read component".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The component's bytes do not match the sha256 pinned in the manifest.
    #[error("plugin `{plugin}`: component sha256 is {actual}, but the manifest pins {expected}")]
    IntegrityMismatch {
        /// The plugin.
        plugin: String,
        /// The pinned digest, hex.
        expected: String,
        /// The digest of the bytes found, hex.
        actual: String,
    },
    /// The bytes are not a valid component, or wasmtime could not compile it.
    #[error("plugin `{plugin}`: cannot compile component: {reason}")]
    Compile {
        /// The plugin.
        plugin: String,
        /// What wasmtime said.
        reason: String,
    },
    /// Compiling the component passed one of the operator's compile limits
    /// (see `compile.rs`): it was refused, or its compile stopped.
    #[error(
        "plugin `{plugin}`: compiling the component passed its {limit} limit of {value} ({used}); \
         a component this costly is refused: if it is trusted, raise `{}` in warden.toml",
        .limit.setting()
    )]
    CompileLimit {
        /// The plugin.
        plugin: String,
        /// Which limit.
        limit: CompileLimit,
        /// The limit, in human units.
        value: String,
        /// What the component took, or would have.
        used: String,
    },
    /// The component imports something the sandbox does not offer.
    #[error(
        "plugin `{plugin}`: component imports `{import}`, which the sandbox does not offer \
         (allowed: warden:plugin/host, warden:plugin/types, the WASI 0.2 cli, clocks, \
         filesystem, io and random interfaces, and wasi:http/outgoing-handler toward granted \
         hosts; never wasi:sockets)"
    )]
    DisallowedImport {
        /// The plugin.
        plugin: String,
        /// The full import name, for example `wasi:sockets/tcp@0.2.6`.
        import: String,
    },
    /// The component exports none of the plugin worlds.
    #[error(
        "plugin `{plugin}`: component exports none of warden:plugin/tool, context-source or \
         channel@0.1.0 (it exports: {exports})"
    )]
    NotAPlugin {
        /// The plugin.
        plugin: String,
        /// What it does export, comma-separated.
        exports: String,
    },
    /// The component's imports could not be satisfied.
    #[error("plugin `{plugin}`: cannot link component: {reason}")]
    Link {
        /// The plugin.
        plugin: String,
        /// What wasmtime said.
        reason: String,
    },
}

impl SandboxError {
    /// The stable code naming this error in the command line's `--json`
    /// envelope, the HTTP API and the Python package (docs/json-output.md).
    pub fn code(&self) -> &'static str {
        match self {
            SandboxError::IntegrityMismatch { .. } => "integrity_mismatch",
            SandboxError::DisallowedImport { .. } => "import_refused",
            SandboxError::Io { .. } => "io_failed",
            SandboxError::Engine { .. }
            | SandboxError::Compile { .. }
            | SandboxError::CompileLimit { .. }
            | SandboxError::NotAPlugin { .. }
            | SandboxError::Link { .. } => "component_refused",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            SandboxError::IntegrityMismatch {
                plugin,
                expected,
                actual,
            } => json!({ "plugin": plugin, "expected": expected, "actual": actual }),
            SandboxError::DisallowedImport { plugin, import } => {
                json!({ "plugin": plugin, "import": import })
            }
            SandboxError::Io { path, .. } => json!({ "file": warden_syntax::evidence::path(path) }),
            SandboxError::Compile { plugin, .. }
            | SandboxError::NotAPlugin { plugin, .. }
            | SandboxError::Link { plugin, .. } => json!({ "plugin": plugin }),
            SandboxError::CompileLimit {
                plugin,
                limit,
                value,
                ..
            } => json!({ "plugin": plugin, "limit": limit.to_string(), "value": value }),
            SandboxError::Engine { .. } => json!({}),
        }
    }
}

/// Why the host stopped or refused one invocation. A guest's own typed error
/// is not a `LeaseError`: it is the call's result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseFailure {
    /// The guest used up its fuel.
    #[error("ran out of fuel (limit {limit})")]
    OutOfFuel {
        /// The fuel limit.
        limit: u64,
    },
    /// The wall-clock deadline passed.
    #[error("hit its deadline of {limit:?}")]
    Timeout {
        /// The deadline.
        limit: Duration,
    },
    /// Linear memory growth was denied.
    #[error("hit its memory limit of {limit} bytes (asked for {requested})")]
    MemoryLimit {
        /// Bytes the guest would have had in use.
        requested: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// Table growth was denied.
    #[error("hit its table limit of {limit} elements (asked for {requested})")]
    TableLimit {
        /// Elements the table would have held.
        requested: u64,
        /// The limit.
        limit: u64,
    },
    /// The guest returned more than its output limit.
    #[error("returned {bytes} bytes, over its output limit of {limit}")]
    OutputLimit {
        /// Bytes returned.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The guest trapped.
    #[error("trapped: {message}")]
    Trap {
        /// The trap and, where known, the guest's backtrace.
        message: String,
    },
    /// The host cancelled the lease.
    #[error("was cancelled")]
    Cancelled,
    /// The lease's [`ValidUntil`](super::ValidUntil) passed: the authority
    /// it was made under ended, and the host stopped it before any further
    /// effect (or refused to start it).
    #[error("was stopped: the authority it ran under expired")]
    Expired,
    /// The lease could not be set up, so the guest never ran.
    #[error("was refused: {reason}")]
    Refused {
        /// Why, for example a granted directory that does not exist.
        reason: String,
    },
    /// The guest returned something the host cannot accept, for example a
    /// tool spec with an invalid name.
    #[error("returned an invalid result: {reason}")]
    InvalidResult {
        /// What was wrong.
        reason: String,
    },
}

impl LeaseFailure {
    /// The receipt outcome this failure is recorded as.
    pub fn outcome(&self) -> Outcome {
        match self {
            LeaseFailure::OutOfFuel { .. } => Outcome::OutOfFuel,
            LeaseFailure::Timeout { .. } => Outcome::Timeout,
            LeaseFailure::MemoryLimit { .. } => Outcome::MemoryLimit,
            LeaseFailure::TableLimit { .. } => Outcome::TableLimit,
            LeaseFailure::OutputLimit { .. } => Outcome::OutputLimit,
            LeaseFailure::Trap { .. } | LeaseFailure::InvalidResult { .. } => Outcome::Trap,
            // Stopped by the host, as a cancellation is.
            LeaseFailure::Cancelled | LeaseFailure::Expired => Outcome::Cancelled,
            LeaseFailure::Refused { .. } => Outcome::Refused,
        }
    }

    /// Whether the failure came from a limit (fuel, time, memory, table,
    /// output) rather than from the guest's own fault or the host.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            LeaseFailure::OutOfFuel { .. }
                | LeaseFailure::Timeout { .. }
                | LeaseFailure::MemoryLimit { .. }
                | LeaseFailure::TableLimit { .. }
                | LeaseFailure::OutputLimit { .. }
        )
    }
}

/// An invocation the host stopped or refused, naming the plugin and the
/// operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("plugin `{plugin}` {operation} {failure}")]
pub struct LeaseError {
    /// The plugin.
    pub plugin: String,
    /// What was called, for example "tool `read_file`" or "describe".
    pub operation: String,
    /// What happened.
    pub failure: LeaseFailure,
}
