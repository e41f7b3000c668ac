//! The stable error codes of the library's typed errors: what a failed
//! operation tells a program, whichever surface it came through (the
//! command line's `--json` envelope, the Python package's exceptions). A
//! code once published keeps its meaning; docs/json-output.md lists them.
//!
//! Each typed error of the host's crates names its own code and evidence
//! (`code()` and `details()`: the run, the call, the file and key, on
//! [`RuntimeError`], [`StoreError`], [`AgentError`], [`PluginError`],
//! [`ProviderError`], ...); [`classify`] finds which of them an error is,
//! and [`code_of`] walks an error's chain for the first it knows. The
//! command line adds its own codes on top (its `CliError` and configuration
//! errors) and makes anything else `invalid`.

use serde_json::{Value, json};

use warden_engine::mcp_servers::McpServerError;
use warden_engine::view::AgentViewError;
use warden_engine::witness::WitnessError;
use warden_engine::{AgentError, RuntimeError};
use warden_plugins::grant::GrantError;
use warden_plugins::lock::LockError;
use warden_plugins::manifest::ManifestError;
use warden_plugins::{PluginError, TrustError};
use warden_providers::ProviderError;
use warden_sandbox::SandboxError;
use warden_store::StoreError;

pub use warden_syntax::evidence::escaped;

/// The code given to an error no typed error along its chain explains.
pub const INVALID: &str = "invalid";

/// The code and details of the first error along `error`'s chain (itself,
/// then its sources) that is one of the library's typed errors; `invalid`
/// and no details when none is.
pub fn code_of(error: &(dyn std::error::Error + 'static)) -> (&'static str, Value) {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(found) = classify(e) {
            return found;
        }
        cause = e.source();
    }
    (INVALID, json!({}))
}

/// The code and details of `cause` if it is one of the library's typed
/// errors (not looking at its sources).
pub fn classify(cause: &(dyn std::error::Error + 'static)) -> Option<(&'static str, Value)> {
    macro_rules! first_of {
        ($($error:ty),* $(,)?) => {
            $(if let Some(e) = cause.downcast_ref::<$error>() {
                return Some((e.code(), e.details()));
            })*
        };
    }
    // An error wrapping another (a plugin error wrapping a grant error)
    // takes the inner one's code itself, so the order does not matter.
    first_of!(
        RuntimeError,
        StoreError,
        AgentError,
        PluginError,
        TrustError,
        LockError,
        ManifestError,
        GrantError,
        SandboxError,
        ProviderError,
        AgentViewError,
        McpServerError,
        WitnessError,
    );
    None
}
