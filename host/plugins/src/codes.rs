//! The stable codes of the plugin host's errors ([`PluginError`],
//! [`ManifestError`], [`GrantError`]) and the evidence each carries: what
//! the command line's `--json` envelope, the HTTP API and the Python
//! package report (docs/json-output.md). The matches are exhaustive, so a
//! new variant cannot ship without choosing its code.

use serde_json::{Value, json};
use warden_syntax::evidence;

use super::PluginError;
use super::grant::GrantError;
use super::manifest::ManifestError;

impl PluginError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            PluginError::Manifest(e) => e.code(),
            PluginError::Grant(e) => e.code(),
            PluginError::Sandbox(e) => e.code(),
            PluginError::Trust(e) => e.code(),
            PluginError::UnknownBuiltin { .. } => "unknown_plugin",
            PluginError::NoComponent { .. } => "manifest_invalid",
            PluginError::ComponentFile { .. } => "component_refused",
            PluginError::KindMismatch { .. } | PluginError::WrongKind { .. } => "wrong_kind",
            PluginError::Describe { .. } => "plugin_failed",
            PluginError::InvalidToolSpec { .. } => "tool_spec_invalid",
            PluginError::UnknownTool { .. } => "unknown_tool",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            PluginError::Manifest(e) => e.details(),
            PluginError::Grant(e) => e.details(),
            PluginError::Sandbox(e) => e.details(),
            PluginError::Trust(e) => e.details(),
            PluginError::UnknownBuiltin { name, .. } => {
                json!({ "plugin": format!("builtin:{name}") })
            }
            PluginError::NoComponent { path } => json!({ "file": evidence::path(path) }),
            PluginError::ComponentFile { manifest, path, .. } => {
                json!({ "file": evidence::path(path), "manifest": evidence::path(manifest) })
            }
            PluginError::KindMismatch { plugin, .. }
            | PluginError::WrongKind { plugin, .. }
            | PluginError::Describe { plugin, .. } => json!({ "plugin": plugin }),
            PluginError::InvalidToolSpec { plugin, tool, .. }
            | PluginError::UnknownTool { plugin, tool, .. } => {
                json!({ "plugin": plugin, "tool": tool })
            }
        }
    }
}

impl ManifestError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            ManifestError::Read { .. } => "manifest_unreadable",
            ManifestError::Parse { .. } | ManifestError::Invalid { .. } => "manifest_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            ManifestError::Read { path, .. } | ManifestError::Parse { path, .. } => {
                json!({ "file": evidence::path(path) })
            }
            ManifestError::Invalid { path, key, .. } => {
                json!({ "file": evidence::path(path), "key": key })
            }
        }
    }
}

impl GrantError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            GrantError::UnrequestedMount { .. }
            | GrantError::UnrequestedEnv { .. }
            | GrantError::UnrequestedHost { .. }
            | GrantError::UnrequestedSecret { .. } => "grant_not_requested",
            GrantError::SecretUnavailable { .. } => "secret_unavailable",
            GrantError::EnvMissing { .. } => "env_missing",
            GrantError::Mount { .. } => "mount_invalid",
            GrantError::Invalid { .. } => "grant_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            GrantError::UnrequestedMount { plugin, mount, .. } => {
                json!({ "plugin": plugin, "mount": mount })
            }
            GrantError::UnrequestedEnv { plugin, var } | GrantError::EnvMissing { plugin, var } => {
                json!({ "plugin": plugin, "env": var })
            }
            GrantError::UnrequestedHost { plugin, host } => {
                json!({ "plugin": plugin, "host": host })
            }
            GrantError::UnrequestedSecret { plugin, secret }
            | GrantError::SecretUnavailable { plugin, secret, .. } => {
                json!({ "plugin": plugin, "secret": secret })
            }
            GrantError::Mount { plugin, .. } => json!({ "plugin": plugin }),
            GrantError::Invalid { plugin, key, .. } => json!({ "plugin": plugin, "key": key }),
        }
    }
}
