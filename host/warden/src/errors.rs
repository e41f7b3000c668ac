//! The stable error codes of the library's typed errors: what a failed
//! operation tells a program, whichever surface it came through (the
//! command line's `--json` envelope, the Python package's exceptions). A
//! code once published keeps its meaning; docs/json-output.md lists them.
//!
//! [`classify`] names the code and the evidence (`details`: the run, the
//! call, the file and key) of one error of the host's crates
//! ([`RuntimeError`], [`StoreError`], [`AgentError`], [`PluginError`],
//! [`ProviderError`], ...); [`code_of`] walks an error's chain for the first
//! it knows. The command line adds its own codes on top (its `CliError`
//! and configuration errors) and makes anything else `invalid`.

use std::ffi::OsStr;

use serde_json::{Value, json};

use warden_engine::mcp_servers::McpServerError;
use warden_engine::{AgentError, ReplayError, RuntimeError};
use warden_plugins::PluginError;
use warden_plugins::grant::GrantError;
use warden_plugins::manifest::ManifestError;
use warden_providers::ProviderError;
use warden_sandbox::SandboxError;
use warden_store::StoreError;

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
    if let Some(e) = cause.downcast_ref::<RuntimeError>() {
        return Some(runtime(e));
    }
    if let Some(e) = cause.downcast_ref::<StoreError>() {
        return Some(store(e));
    }
    if let Some(e) = cause.downcast_ref::<AgentError>() {
        return Some(agent(e));
    }
    if let Some(e) = cause.downcast_ref::<PluginError>() {
        return Some(plugin(e));
    }
    if let Some(e) = cause.downcast_ref::<ManifestError>() {
        return Some(manifest(e));
    }
    if let Some(e) = cause.downcast_ref::<GrantError>() {
        return Some(grant(e));
    }
    if let Some(e) = cause.downcast_ref::<SandboxError>() {
        return Some(sandbox(e));
    }
    if let Some(e) = cause.downcast_ref::<ProviderError>() {
        return Some(provider(e));
    }
    if let Some(e) = cause.downcast_ref::<McpServerError>() {
        return Some(mcp_server(e));
    }
    if cause
        .downcast_ref::<warden_engine::view::AgentViewError>()
        .is_some()
    {
        return Some(("agent_invalid", json!({})));
    }
    None
}

fn runtime(e: &RuntimeError) -> (&'static str, Value) {
    match e {
        RuntimeError::UnknownRun { run_id } => ("unknown_run", json!({ "run_id": run_id })),
        RuntimeError::AlreadyStarted { run_id } => ("run_exists", json!({ "run_id": run_id })),
        RuntimeError::NotParked {
            run_id,
            status,
            needed,
        } => (
            "not_parked",
            json!({ "run_id": run_id, "status": status, "needed": needed }),
        ),
        RuntimeError::NotAwaitingApproval {
            run_id,
            call_id,
            awaiting,
        } => (
            "not_awaiting_approval",
            json!({ "run_id": run_id, "call_id": call_id, "awaiting": awaiting }),
        ),
        RuntimeError::DigestMismatch {
            run_id,
            call_id,
            expected,
            actual,
        } => (
            "digest_mismatch",
            json!({ "run_id": run_id, "call_id": call_id, "expected": expected, "actual": actual }),
        ),
        RuntimeError::NotAwaitingExternal {
            run_id,
            call_id,
            awaiting,
        } => (
            "not_awaiting_external",
            json!({ "run_id": run_id, "call_id": call_id, "awaiting": awaiting }),
        ),
        RuntimeError::InputRejected { run_id, error } => (
            "input_rejected",
            json!({ "run_id": run_id, "reason": error.to_string() }),
        ),
        RuntimeError::NotReconcilable { run_id, status } => (
            "nothing_to_resolve",
            json!({ "run_id": run_id, "status": status }),
        ),
        RuntimeError::NeedsReconciliation { run_id, write } => (
            "needs_reconciliation",
            json!({ "run_id": run_id, "write": write }),
        ),
        RuntimeError::AlreadyTerminal { run_id, status } => (
            "run_terminal",
            json!({ "run_id": run_id, "status": status }),
        ),
        RuntimeError::Replay { run_id, error } => match error {
            ReplayError::AgentChanged {
                agent,
                recorded,
                current,
            } => (
                "agent_changed",
                json!({ "run_id": run_id, "agent": agent, "recorded": recorded.as_str(), "current": current.as_str() }),
            ),
            ReplayError::Divergence {
                position,
                kind,
                expected,
                recorded,
            } => (
                "divergence",
                json!({ "run_id": run_id, "position": position, "kind": kind.to_string(), "expected": expected, "recorded": recorded }),
            ),
            ReplayError::Fold(fold) => (
                "log_invalid",
                json!({ "run_id": run_id, "reason": fold.to_string() }),
            ),
            _ => ("runtime_failed", json!({ "run_id": run_id })),
        },
        RuntimeError::Conflict {
            run_id,
            expected,
            actual,
        } => (
            "conflict",
            json!({ "run_id": run_id, "expected": expected, "actual": actual }),
        ),
        RuntimeError::Log { run_id, seq, .. } => {
            ("log_unreadable", json!({ "run_id": run_id, "seq": seq }))
        }
        RuntimeError::Fold { run_id, error } => (
            "log_invalid",
            json!({ "run_id": run_id, "reason": error.to_string() }),
        ),
        RuntimeError::InputTooLarge { run_id, error } => (
            "input_too_large",
            json!({ "run_id": run_id, "size": error.size, "limit": error.limit }),
        ),
        RuntimeError::Agent { agent, .. } => ("agent_unusable", json!({ "agent": agent })),
        RuntimeError::Provider { agent, error } => {
            let (code, mut details) = provider(error);
            details["agent"] = json!(agent);
            (code, details)
        }
        RuntimeError::Store { error } => store(error),
        RuntimeError::Rule(e) => match e {
            warden_engine::approvals::RuleError::Unreadable { id, .. } => {
                ("rule_unreadable", json!({ "rule": id }))
            }
            warden_engine::approvals::RuleError::NoSession { run_id } => {
                ("not_in_session", json!({ "run_id": run_id }))
            }
            _ => ("rule_invalid", json!({ "reason": e.to_string() })),
        },
        RuntimeError::OutputRejected {
            run_id,
            call_id,
            reason,
        } => (
            "output_rejected",
            json!({ "run_id": run_id, "call_id": call_id, "reason": reason }),
        ),
        RuntimeError::ExternalMismatch {
            run_id,
            call_id,
            field,
            recorded,
            given,
        } => (
            "external_mismatch",
            json!({ "run_id": run_id, "call_id": call_id, "field": field, "recorded": recorded, "given": given }),
        ),
        RuntimeError::CommitmentHeld {
            run_id,
            call_id,
            key,
            holder,
        } => (
            "commitment_held",
            json!({ "run_id": run_id, "call_id": call_id, "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id }),
        ),
        RuntimeError::CommitmentOrphaned {
            run_id,
            call_id,
            key,
            holder,
            holder_status,
        } => (
            "commitment_orphaned",
            json!({ "run_id": run_id, "call_id": call_id, "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id, "holder_status": holder_status, "next": format!("warden keys release {key}") }),
        ),
        RuntimeError::UnknownKey { key } => ("unknown_key", json!({ "key": key })),
        RuntimeError::KeyInUse {
            key,
            holder,
            status,
        } => (
            "key_in_use",
            json!({ "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id, "holder_status": status }),
        ),
        RuntimeError::KeyAlreadySettled { key, holder } => (
            "key_settled",
            json!({ "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id }),
        ),
        RuntimeError::KeyHolderGone { key, holder } => (
            "key_holder_gone",
            json!({ "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id }),
        ),
        RuntimeError::Unrecordable { run_id, error } => (
            "value_too_deep",
            json!({ "run_id": run_id, "event": error.kind, "depth": error.depth, "limit": error.limit }),
        ),
        RuntimeError::PolicyNotRegistered { agent, policy } => (
            "policy_not_registered",
            json!({ "agent": agent, "policy": policy }),
        ),
        RuntimeError::SessionBusy {
            session_id,
            active_run,
        } => (
            "session_busy",
            json!({ "session": session_id, "active_run": active_run }),
        ),
        RuntimeError::CannotFinish { run_id, reason } => (
            "cannot_finish",
            json!({ "run_id": run_id, "reason": reason }),
        ),
        RuntimeError::FinishRejected { run_id, violation } => (
            "finish_rejected",
            json!({ "run_id": run_id, "violation": violation }),
        ),
        RuntimeError::ReconciliationRequired {
            run_id,
            reason,
            since_ms,
        } => (
            "needs_reconciliation",
            json!({ "run_id": run_id, "reason": reason, "since_ms": since_ms }),
        ),
        RuntimeError::ForkRefused { run_id, reason } => (
            "fork_refused",
            json!({ "run_id": run_id, "reason": reason.to_string() }),
        ),
        RuntimeError::UnfinishedFork { run_id, source_run } => (
            "unfinished_fork",
            json!({ "run_id": run_id, "source_run": source_run }),
        ),
        RuntimeError::ChildRefused { run_id, reason } => (
            "child_refused",
            json!({ "run_id": run_id, "reason": reason.to_string() }),
        ),
        // A variant added later has this code until it gets its own.
        #[allow(unreachable_patterns)]
        _ => ("runtime_failed", json!({})),
    }
}

fn store(e: &StoreError) -> (&'static str, Value) {
    match e {
        StoreError::UnknownRun { run_id } => ("unknown_run", json!({ "run_id": run_id })),
        StoreError::AlreadyExists { run_id } => ("run_exists", json!({ "run_id": run_id })),
        StoreError::UnknownRule { id } => ("unknown_rule", json!({ "rule": id })),
        StoreError::RuleExists { id } => ("rule_exists", json!({ "rule": id })),
        StoreError::Conflict {
            run_id,
            expected,
            actual,
        } => (
            "conflict",
            json!({ "run_id": run_id, "expected": expected, "actual": actual }),
        ),
        StoreError::Tampered {
            run_id,
            seq,
            reason,
        } => (
            "tampered",
            json!({ "run_id": run_id, "seq": seq, "reason": reason.to_string() }),
        ),
        StoreError::SchemaTooNew { found, supported } => (
            "store_too_new",
            json!({ "found": found, "supported": supported }),
        ),
        StoreError::ChainModeMismatch { found, configured } => (
            "store_chain_mode",
            json!({ "found": found, "configured": configured }),
        ),
        StoreError::Pruned {
            run_id,
            event_count,
            head,
        } => (
            "pruned",
            json!({ "run_id": run_id, "event_count": event_count, "head": head.to_string() }),
        ),
        StoreError::Fenced {
            run_id,
            token,
            current,
        } => (
            "fenced",
            json!({ "run_id": run_id, "token": token, "current": current }),
        ),
        StoreError::Unsupported { store, operation } => (
            "unsupported",
            json!({ "store": store, "operation": operation }),
        ),
        StoreError::SessionBusy {
            session,
            active_run,
        } => (
            "session_busy",
            json!({ "session": session, "active_run": active_run }),
        ),
        StoreError::SessionChanged {
            session,
            expected,
            found,
        } => (
            "session_changed",
            json!({ "session": session, "expected": expected, "found": found }),
        ),
        StoreError::Damaged { location, .. } => ("store_damaged", json!({ "store": location })),
        StoreError::ReadOnly { location, .. } => ("store_read_only", json!({ "store": location })),
        StoreError::SchemaTooOld { found, supported } => (
            "store_too_old",
            json!({ "found": found, "supported": supported }),
        ),
        StoreError::NoStore { location, .. } => ("store_missing", json!({ "store": location })),
        _ => ("store_failed", json!({})),
    }
}

fn agent(e: &AgentError) -> (&'static str, Value) {
    match e {
        AgentError::Read { path, .. } => ("agent_unreadable", json!({ "file": shown(path) })),
        AgentError::Parse { path, .. } => ("agent_invalid", json!({ "file": shown(path) })),
        AgentError::Invalid { path, key, .. } => {
            ("agent_invalid", json!({ "file": shown(path), "key": key }))
        }
        // A variant added later has this code until it gets its own.
        #[allow(unreachable_patterns)]
        _ => ("agent_invalid", json!({})),
    }
}

fn mcp_server(e: &McpServerError) -> (&'static str, Value) {
    match e {
        McpServerError::SandboxUnavailable { server, .. } => {
            ("mcp_sandbox_unavailable", json!({ "server": server }))
        }
        McpServerError::Failed { server, .. } => ("mcp_server_failed", json!({ "server": server })),
        McpServerError::Pins { path, .. } => ("mcp_pins_invalid", json!({ "file": shown(path) })),
        McpServerError::UnknownServer { agent, server, .. } => (
            "unknown_mcp_server",
            json!({ "agent": agent, "server": server }),
        ),
        // A variant added later has this code until it gets its own.
        #[allow(unreachable_patterns)]
        _ => ("mcp_server_failed", json!({})),
    }
}

fn plugin(e: &PluginError) -> (&'static str, Value) {
    match e {
        PluginError::Manifest(m) => manifest(m),
        PluginError::Grant(p) => grant(p),
        PluginError::Sandbox(s) => sandbox(s),
        PluginError::UnknownBuiltin { name, .. } => (
            "unknown_plugin",
            json!({ "plugin": format!("builtin:{name}") }),
        ),
        PluginError::NoComponent { path } => ("manifest_invalid", json!({ "file": shown(path) })),
        PluginError::ComponentFile { manifest, path, .. } => (
            "component_refused",
            json!({ "file": shown(path), "manifest": shown(manifest) }),
        ),
        PluginError::KindMismatch { plugin, .. } | PluginError::WrongKind { plugin, .. } => {
            ("wrong_kind", json!({ "plugin": plugin }))
        }
        PluginError::Describe { plugin, .. } => ("plugin_failed", json!({ "plugin": plugin })),
        PluginError::InvalidToolSpec { plugin, tool, .. } => (
            "tool_spec_invalid",
            json!({ "plugin": plugin, "tool": tool }),
        ),
        PluginError::UnknownTool { plugin, tool, .. } => {
            ("unknown_tool", json!({ "plugin": plugin, "tool": tool }))
        }
        // A variant added later has this code until it gets its own.
        #[allow(unreachable_patterns)]
        _ => ("plugin_failed", json!({})),
    }
}

fn manifest(e: &ManifestError) -> (&'static str, Value) {
    match e {
        ManifestError::Read { path, .. } => ("manifest_unreadable", json!({ "file": shown(path) })),
        ManifestError::Parse { path, .. } => ("manifest_invalid", json!({ "file": shown(path) })),
        ManifestError::Invalid { path, key, .. } => (
            "manifest_invalid",
            json!({ "file": shown(path), "key": key }),
        ),
        // A variant added later has this code until it gets its own.
        #[allow(unreachable_patterns)]
        _ => ("manifest_invalid", json!({})),
    }
}

fn grant(e: &GrantError) -> (&'static str, Value) {
    match e {
        GrantError::UnrequestedMount { plugin, mount, .. } => (
            "grant_not_requested",
            json!({ "plugin": plugin, "mount": mount }),
        ),
        GrantError::UnrequestedEnv { plugin, var } => (
            "grant_not_requested",
            json!({ "plugin": plugin, "env": var }),
        ),
        GrantError::UnrequestedHost { plugin, host } => (
            "grant_not_requested",
            json!({ "plugin": plugin, "host": host }),
        ),
        GrantError::EnvMissing { plugin, var } => {
            ("env_missing", json!({ "plugin": plugin, "env": var }))
        }
        GrantError::Mount { plugin, .. } => ("mount_invalid", json!({ "plugin": plugin })),
        GrantError::Invalid { plugin, key, .. } => {
            ("grant_invalid", json!({ "plugin": plugin, "key": key }))
        }
        // A variant added later has this code until it gets its own.
        #[allow(unreachable_patterns)]
        _ => ("grant_invalid", json!({})),
    }
}

fn sandbox(e: &SandboxError) -> (&'static str, Value) {
    match e {
        SandboxError::IntegrityMismatch {
            plugin,
            expected,
            actual,
        } => (
            "integrity_mismatch",
            json!({ "plugin": plugin, "expected": expected, "actual": actual }),
        ),
        SandboxError::DisallowedImport { plugin, import } => (
            "import_refused",
            json!({ "plugin": plugin, "import": import }),
        ),
        SandboxError::Io { path, .. } => ("io_failed", json!({ "file": shown(path) })),
        _ => ("component_refused", json!({})),
    }
}

fn provider(e: &ProviderError) -> (&'static str, Value) {
    match e {
        ProviderError::Transport { provider, .. } => {
            ("provider_unreachable", json!({ "provider": provider }))
        }
        ProviderError::Http {
            provider,
            status,
            url,
            ..
        } => (
            "provider_http",
            json!({ "provider": provider, "status": status, "url": url }),
        ),
        ProviderError::InvalidRequest { provider, .. } => {
            ("provider_invalid", json!({ "provider": provider }))
        }
        ProviderError::Script(_) => ("transcript_invalid", json!({})),
        _ => ("provider_failed", json!({})),
    }
}

/// A path as evidence: serde refuses a path that is not UTF-8, so each such
/// byte is shown as `\xNN`.
fn shown(path: &std::path::Path) -> String {
    escaped(path.as_os_str())
}

/// `text` as UTF-8, each byte that is not valid UTF-8 shown as `\xNN`.
pub fn escaped(text: &OsStr) -> String {
    let mut shown = String::new();
    for chunk in text.as_encoded_bytes().utf8_chunks() {
        shown.push_str(chunk.valid());
        for byte in chunk.invalid() {
            shown.push_str(&format!("\\x{byte:02X}"));
        }
    }
    shown
}
