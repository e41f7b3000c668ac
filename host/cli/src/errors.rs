//! What a failed command tells a script: a stable `code`, the one-line
//! `message`, and `details` carrying the evidence (the run, the call, the
//! dangling write, the file and key). In `--json` mode this is printed as
//! the envelope `{"v", "error": {"code", "message", "details"}}` on stdout
//! (`contract.rs`); in text mode only the message is printed, on stderr.
//!
//! Codes are part of the command line's interface: a code once published
//! keeps its meaning. They are derived from the typed errors of the library
//! (`RuntimeError`, `StoreError`, `AgentError`, `PluginError`,
//! `ProviderError`: the mapping is the library's own, `warden::errors`,
//! which the Python package's exceptions share) and from the command line's
//! own [`CliError`]; any other error (a bad flag value, an unreadable file)
//! is `invalid`.

use serde_json::{Value, json};

/// An error the command line finds itself, with its code and evidence.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct CliError {
    /// The stable code.
    pub(crate) code: &'static str,
    /// The one-line message.
    pub(crate) message: String,
    /// The evidence.
    pub(crate) details: Value,
}

impl CliError {
    /// An error with `code` and `message` and no details.
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
            details: json!({}),
        }
    }

    /// The same error carrying `details`.
    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
}

/// A failure as reported: code, message and details.
#[derive(Debug, PartialEq)]
pub(crate) struct Report {
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) details: Value,
}

impl Report {
    /// The `--json` envelope.
    pub(crate) fn envelope(&self) -> Value {
        json!({
            "v": super::contract::VERSION,
            "error": {
                "code": self.code,
                "message": self.message,
                "details": self.details,
            }
        })
    }
}

/// The report of `error`: the message is the whole chain on one line; code
/// and details come from the first typed error found along the chain.
pub(crate) fn report(error: &anyhow::Error) -> Report {
    let message = format!("{error:#}");
    for cause in error.chain() {
        if let Some((code, details)) = classify(cause) {
            return Report {
                code,
                message,
                details,
            };
        }
    }
    Report {
        code: "invalid",
        message,
        details: json!({}),
    }
}

/// The report of `error` and its sources (an error the HTTP API meets, not
/// wrapped in `anyhow`): the same codes as [`report`].
pub(crate) fn report_cause(error: &(dyn std::error::Error + 'static)) -> Report {
    let message = warden_server::error::chain(error);
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some((code, details)) = classify(e) {
            return Report {
                code,
                message,
                details,
            };
        }
        cause = e.source();
    }
    Report {
        code: "invalid",
        message,
        details: json!({}),
    }
}

fn classify(cause: &(dyn std::error::Error + 'static)) -> Option<(&'static str, Value)> {
    if let Some(e) = cause.downcast_ref::<CliError>() {
        return Some((e.code, e.details.clone()));
    }
    if let Some(e) = cause.downcast_ref::<warden_server::TokenError>() {
        return Some((e.code(), json!({})));
    }
    if let Some(e) = cause.downcast_ref::<warden_server::BindError>() {
        return Some((e.code(), json!({})));
    }
    if let Some(e) = cause.downcast_ref::<warden_mcp::McpError>() {
        return Some((e.code(), e.details()));
    }
    if let Some(e) = cause.downcast_ref::<warden_server::tls::TlsError>() {
        return Some(("tls_invalid", json!({ "file": e.file })));
    }
    if let Some(found) = warden::errors::classify(cause) {
        return Some(found);
    }
    if let Some(e) = cause.downcast_ref::<super::config::ConfigError>() {
        return Some(("config_invalid", e.details()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden::engine::{CallId, RunId, RunStatus, RuntimeError};
    use warden::store::StoreError;

    fn code_of(error: anyhow::Error) -> (&'static str, Value) {
        let r = report(&error);
        (r.code, r.details)
    }

    #[test]
    fn typed_errors_map_to_stable_codes_with_their_evidence() {
        let run = RunId::new("r1").unwrap();
        let cases: Vec<(anyhow::Error, &str, Value)> = vec![
            (
                RuntimeError::UnknownRun {
                    run_id: run.clone(),
                }
                .into(),
                "unknown_run",
                json!({"run_id": "r1"}),
            ),
            (
                RuntimeError::NotAwaitingApproval {
                    run_id: run.clone(),
                    call_id: CallId::from_text("call-9-9"),
                    awaiting: "call-3-1".into(),
                }
                .into(),
                "not_awaiting_approval",
                json!({"run_id": "r1", "call_id": "call-9-9", "awaiting": "call-3-1"}),
            ),
            (
                RuntimeError::DigestMismatch {
                    run_id: run.clone(),
                    call_id: CallId::from_text("call-1-1"),
                    expected: "ab".into(),
                    actual: warden::engine::CallDigest::from_hex("cd"),
                }
                .into(),
                "digest_mismatch",
                json!({"run_id": "r1", "call_id": "call-1-1", "expected": "ab", "actual": "cd"}),
            ),
            (
                RuntimeError::NotAwaitingExternal {
                    run_id: run.clone(),
                    call_id: CallId::from_text("call-9-9"),
                    awaiting: CallId::from_text("call-1-1"),
                }
                .into(),
                "not_awaiting_external",
                json!({"run_id": "r1", "call_id": "call-9-9", "awaiting": "call-1-1"}),
            ),
            (
                RuntimeError::NotReconcilable {
                    run_id: run.clone(),
                    status: RunStatus::AwaitingApproval,
                }
                .into(),
                "nothing_to_resolve",
                json!({"run_id": "r1", "status": "awaiting_approval"}),
            ),
            (
                StoreError::UnknownRun {
                    run_id: run.clone(),
                }
                .into(),
                "unknown_run",
                json!({"run_id": "r1"}),
            ),
            (
                RuntimeError::SessionBusy {
                    session_id: warden::engine::SessionId::new("chat").unwrap(),
                    active_run: run.clone(),
                }
                .into(),
                "session_busy",
                json!({"session": "chat", "active_run": "r1"}),
            ),
            (
                StoreError::SessionChanged {
                    session: "chat".into(),
                    expected: 2,
                    found: 3,
                }
                .into(),
                "session_changed",
                json!({"session": "chat", "expected": 2, "found": 3}),
            ),
            (
                warden::plugins::PluginError::ComponentFile {
                    manifest: "plugins/p/plugin.toml".into(),
                    path: "/dev/zero".into(),
                    problem: warden::plugins::ComponentFileError::TooLarge { limit: 1 },
                }
                .into(),
                "component_refused",
                json!({"file": "/dev/zero", "manifest": "plugins/p/plugin.toml"}),
            ),
            (CliError::new("usage", "bad").into(), "usage", json!({})),
            (anyhow::anyhow!("plain"), "invalid", json!({})),
        ];
        for (error, code, details) in cases {
            assert_eq!(code_of(error), (code, details));
        }
    }

    #[test]
    fn context_keeps_the_code_of_the_typed_error_underneath() {
        let error = anyhow::Error::from(RuntimeError::AlreadyTerminal {
            run_id: RunId::new("done").unwrap(),
            status: RunStatus::Completed,
        })
        .context("cannot approve");
        let r = report(&error);
        assert_eq!(r.code, "run_terminal");
        assert_eq!(r.message, "cannot approve: run `done` is already completed");
        assert_eq!(
            r.envelope()["error"]["details"],
            json!({"run_id": "done", "status": "completed"})
        );
    }
}
