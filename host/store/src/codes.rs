//! The stable codes of [`StoreError`] and the evidence each carries: what
//! the command line's `--json` envelope, the HTTP API and the Python
//! package report (docs/json-output.md). The match is exhaustive, so a new
//! variant cannot ship without choosing its code.

use serde_json::{Value, json};

use super::StoreError;

impl StoreError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::UnknownRun { .. } => "unknown_run",
            StoreError::AlreadyExists { .. } => "run_exists",
            StoreError::UnknownRule { .. } => "unknown_rule",
            StoreError::RuleExists { .. } => "rule_exists",
            StoreError::Conflict { .. } => "conflict",
            StoreError::Tampered { .. } | StoreError::RowTampered { .. } => "tampered",
            StoreError::SchemaTooNew { .. } => "store_too_new",
            StoreError::SchemaTooOld { .. } => "store_too_old",
            StoreError::ChainModeMismatch { .. } => "store_chain_mode",
            StoreError::Pruned { .. } => "pruned",
            StoreError::Fenced { .. } => "fenced",
            StoreError::Unsupported { .. } => "unsupported",
            StoreError::SessionBusy { .. } => "session_busy",
            StoreError::SessionChanged { .. } => "session_changed",
            StoreError::Damaged { .. } | StoreError::SchemaInvalid { .. } => "store_damaged",
            StoreError::HistoryBroken { .. } => "history_broken",
            StoreError::ReadOnly { .. } => "store_read_only",
            StoreError::NoStore { .. } => "store_missing",
            StoreError::EmptyAppend { .. }
            | StoreError::Backend { .. }
            | StoreError::Closed
            | StoreError::Claimed { .. }
            | StoreError::CommitmentNotHeld { .. } => "store_failed",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            StoreError::UnknownRun { run_id }
            | StoreError::AlreadyExists { run_id }
            | StoreError::EmptyAppend { run_id } => json!({ "run_id": run_id }),
            StoreError::UnknownRule { id } | StoreError::RuleExists { id } => {
                json!({ "rule": id })
            }
            StoreError::Conflict {
                run_id,
                expected,
                actual,
            } => json!({ "run_id": run_id, "expected": expected, "actual": actual }),
            StoreError::Tampered {
                run_id,
                seq,
                reason,
            } => json!({ "run_id": run_id, "seq": seq, "reason": reason.to_string() }),
            StoreError::RowTampered { table, row, reason } => {
                json!({ "table": table, "row": row, "reason": reason.to_string() })
            }
            StoreError::SchemaTooNew { found, supported }
            | StoreError::SchemaTooOld { found, supported } => {
                json!({ "found": found, "supported": supported })
            }
            StoreError::SchemaInvalid { found } => json!({ "found": found }),
            StoreError::ChainModeMismatch { found, configured } => {
                json!({ "found": found, "configured": configured })
            }
            StoreError::Pruned {
                run_id,
                event_count,
                head,
            } => json!({ "run_id": run_id, "event_count": event_count, "head": head.to_string() }),
            StoreError::Fenced {
                run_id,
                token,
                current,
            } => json!({ "run_id": run_id, "token": token, "current": current }),
            StoreError::Unsupported { store, operation } => {
                json!({ "store": store, "operation": operation })
            }
            StoreError::SessionBusy {
                session,
                active_run,
            } => json!({ "session": session, "active_run": active_run }),
            StoreError::SessionChanged {
                session,
                expected,
                found,
            } => json!({ "session": session, "expected": expected, "found": found }),
            StoreError::Damaged { location, .. }
            | StoreError::ReadOnly { location, .. }
            | StoreError::NoStore { location, .. } => json!({ "store": location }),
            StoreError::Claimed { run_id, owner, .. } => {
                json!({ "run_id": run_id, "held_by": owner })
            }
            StoreError::CommitmentNotHeld {
                key,
                run_id,
                call_id,
            } => json!({ "key": key, "run_id": run_id, "call_id": call_id }),
            StoreError::HistoryBroken { head, at, reason } => json!({
                "head": head.to_string(),
                "at": at.to_string(),
                "reason": reason,
            }),
            StoreError::Backend { .. } | StoreError::Closed => json!({}),
        }
    }
}
