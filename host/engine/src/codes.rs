//! The stable codes of the engine's errors ([`RuntimeError`],
//! [`AgentError`], [`ReplayError`], [`RuleError`], [`AgentViewError`]) and
//! the evidence each carries: what the command line's `--json` envelope,
//! the HTTP API and the Python package report (docs/json-output.md). The
//! matches are exhaustive, so a new variant cannot ship without choosing its
//! code; an error wrapping another crate's takes that error's code.

use serde_json::{Value, json};
use warden_syntax::evidence;

use super::agent::AgentError;
use super::approvals::RuleError;
use super::replay::ReplayError;
use super::runtime::RuntimeError;
use super::view::AgentViewError;

impl RuntimeError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            RuntimeError::UnknownRun { .. } => "unknown_run",
            RuntimeError::AlreadyStarted { .. } => "run_exists",
            RuntimeError::NotParked { .. } => "not_parked",
            RuntimeError::NotAwaitingApproval { .. } => "not_awaiting_approval",
            RuntimeError::DigestMismatch { .. } => "digest_mismatch",
            RuntimeError::NotAwaitingExternal { .. } => "not_awaiting_external",
            RuntimeError::InputRejected { .. } => "input_rejected",
            RuntimeError::NotReconcilable { .. } => "nothing_to_resolve",
            RuntimeError::NeedsReconciliation { .. }
            | RuntimeError::ReconciliationRequired { .. } => "needs_reconciliation",
            RuntimeError::AlreadyTerminal { .. } => "run_terminal",
            RuntimeError::Replay { error, .. } => error.code(),
            RuntimeError::Fenced { .. } => "fenced",
            RuntimeError::ClaimExpired { .. } => "claim_expired",
            RuntimeError::DrivenByWorker { .. } => "run_claimed",
            RuntimeError::RolledBack { .. } => "rolled_back",
            RuntimeError::Conflict { .. } => "conflict",
            RuntimeError::Log { .. } => "log_unreadable",
            RuntimeError::Fold { .. } => "log_invalid",
            RuntimeError::InputTooLarge { .. } => "input_too_large",
            RuntimeError::InvalidLabels { .. } => "invalid_labels",
            RuntimeError::Agent { .. } => "agent_unusable",
            RuntimeError::Provider { error, .. } => error.code(),
            RuntimeError::Store { error } => error.code(),
            RuntimeError::Rule(error) => error.code(),
            RuntimeError::OutputRejected { .. } => "output_rejected",
            RuntimeError::ExternalMismatch { .. } => "external_mismatch",
            RuntimeError::CommitmentHeld { .. } => "commitment_held",
            RuntimeError::CommitmentOrphaned { .. } => "commitment_orphaned",
            RuntimeError::UnknownKey { .. } => "unknown_key",
            RuntimeError::KeyInUse { .. } => "key_in_use",
            RuntimeError::KeyAlreadySettled { .. } => "key_settled",
            RuntimeError::KeyHolderGone { .. } => "key_holder_gone",
            RuntimeError::Unrecordable { .. } => "value_too_deep",
            RuntimeError::PolicyNotRegistered { .. } => "policy_not_registered",
            RuntimeError::SessionBusy { .. } => "session_busy",
            RuntimeError::CannotFinish { .. } => "cannot_finish",
            RuntimeError::FinishRejected { .. } => "finish_rejected",
            RuntimeError::ForkRefused { .. } => "fork_refused",
            RuntimeError::UnfinishedFork { .. } => "unfinished_fork",
            RuntimeError::ChildRefused { .. } => "child_refused",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            RuntimeError::UnknownRun { run_id }
            | RuntimeError::AlreadyStarted { run_id }
            | RuntimeError::ClaimExpired { run_id } => json!({ "run_id": run_id }),
            RuntimeError::NotParked {
                run_id,
                status,
                needed,
            } => json!({ "run_id": run_id, "status": status, "needed": needed }),
            RuntimeError::NotAwaitingApproval {
                run_id,
                call_id,
                awaiting,
            } => json!({ "run_id": run_id, "call_id": call_id, "awaiting": awaiting }),
            RuntimeError::NotAwaitingExternal {
                run_id,
                call_id,
                awaiting,
            } => json!({ "run_id": run_id, "call_id": call_id, "awaiting": awaiting }),
            RuntimeError::DigestMismatch {
                run_id,
                call_id,
                expected,
                actual,
            } => json!({
                "run_id": run_id, "call_id": call_id, "expected": expected, "actual": actual
            }),
            RuntimeError::InputRejected { run_id, error } => {
                json!({ "run_id": run_id, "reason": error.to_string() })
            }
            RuntimeError::NotReconcilable { run_id, status }
            | RuntimeError::AlreadyTerminal { run_id, status } => {
                json!({ "run_id": run_id, "status": status })
            }
            RuntimeError::NeedsReconciliation { run_id, write } => {
                json!({ "run_id": run_id, "write": write })
            }
            RuntimeError::ReconciliationRequired {
                run_id,
                reason,
                since_ms,
            } => json!({ "run_id": run_id, "reason": reason, "since_ms": since_ms }),
            RuntimeError::Replay { run_id, error } => {
                let mut details = error.details();
                details["run_id"] = json!(run_id);
                details
            }
            RuntimeError::Fenced {
                run_id,
                token,
                current,
            } => json!({ "run_id": run_id, "token": token, "current": current }),
            RuntimeError::DrivenByWorker {
                run_id,
                claimed_run,
                owner,
                expires_ms,
            } => json!({
                "run_id": run_id,
                "claimed_run": claimed_run,
                "held_by": owner,
                "expires_ms": expires_ms,
            }),
            RuntimeError::RolledBack {
                run_id,
                witness,
                problem,
            } => json!({ "run_id": run_id, "witness": witness, "problem": problem }),
            RuntimeError::Conflict {
                run_id,
                expected,
                actual,
            } => json!({ "run_id": run_id, "expected": expected, "actual": actual }),
            RuntimeError::Log { run_id, seq, .. } => json!({ "run_id": run_id, "seq": seq }),
            RuntimeError::Fold { run_id, error } => {
                json!({ "run_id": run_id, "reason": error.to_string() })
            }
            RuntimeError::InputTooLarge { run_id, error } => {
                json!({ "run_id": run_id, "size": error.size, "limit": error.limit })
            }
            RuntimeError::InvalidLabels { error } => {
                json!({ "key": error.key(), "label": error.label(), "reason": error.to_string() })
            }
            RuntimeError::Agent { agent, .. } => json!({ "agent": agent }),
            RuntimeError::Provider { agent, error } => {
                let mut details = error.details();
                details["agent"] = json!(agent);
                details
            }
            RuntimeError::Store { error } => error.details(),
            RuntimeError::Rule(error) => error.details(),
            RuntimeError::OutputRejected {
                run_id,
                call_id,
                reason,
            } => json!({ "run_id": run_id, "call_id": call_id, "reason": reason }),
            RuntimeError::ExternalMismatch {
                run_id,
                call_id,
                field,
                recorded,
                given,
            } => json!({
                "run_id": run_id, "call_id": call_id, "field": field,
                "recorded": recorded, "given": given
            }),
            RuntimeError::CommitmentHeld {
                run_id,
                call_id,
                key,
                holder,
            } => json!({
                "run_id": run_id, "call_id": call_id, "key": key,
                "holder_run": holder.run_id, "holder_call": holder.call_id
            }),
            RuntimeError::CommitmentOrphaned {
                run_id,
                call_id,
                key,
                holder,
                holder_status,
            } => json!({
                "run_id": run_id, "call_id": call_id, "key": key,
                "holder_run": holder.run_id, "holder_call": holder.call_id,
                "holder_status": holder_status, "next": format!("warden keys release {key}")
            }),
            RuntimeError::UnknownKey { key } => json!({ "key": key }),
            RuntimeError::KeyInUse {
                key,
                holder,
                status,
            } => json!({
                "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id,
                "holder_status": status
            }),
            RuntimeError::KeyAlreadySettled { key, holder }
            | RuntimeError::KeyHolderGone { key, holder } => json!({
                "key": key, "holder_run": holder.run_id, "holder_call": holder.call_id
            }),
            RuntimeError::Unrecordable { run_id, error } => json!({
                "run_id": run_id, "event": error.kind, "depth": error.depth, "limit": error.limit
            }),
            RuntimeError::PolicyNotRegistered { agent, policy } => {
                json!({ "agent": agent, "policy": policy })
            }
            RuntimeError::SessionBusy {
                session_id,
                active_run,
            } => json!({ "session": session_id, "active_run": active_run }),
            RuntimeError::CannotFinish { run_id, reason } => {
                json!({ "run_id": run_id, "reason": reason })
            }
            RuntimeError::FinishRejected { run_id, violation } => {
                json!({ "run_id": run_id, "violation": violation })
            }
            RuntimeError::ForkRefused { run_id, reason } => {
                json!({ "run_id": run_id, "reason": reason.to_string() })
            }
            RuntimeError::UnfinishedFork { run_id, source_run } => {
                json!({ "run_id": run_id, "source_run": source_run })
            }
            RuntimeError::ChildRefused { run_id, reason } => {
                json!({ "run_id": run_id, "reason": reason.to_string() })
            }
        }
    }
}

impl ReplayError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            ReplayError::AgentChanged { .. } => "agent_changed",
            ReplayError::Divergence { .. } => "divergence",
            ReplayError::Fold(_) => "log_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            ReplayError::AgentChanged {
                agent,
                recorded,
                current,
            } => json!({
                "agent": agent, "recorded": recorded.as_str(), "current": current.as_str()
            }),
            ReplayError::Divergence {
                position,
                kind,
                expected,
                recorded,
            } => json!({
                "position": position, "kind": kind.to_string(),
                "expected": expected, "recorded": recorded
            }),
            ReplayError::Fold(fold) => json!({ "reason": fold.to_string() }),
        }
    }
}

impl RuleError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            RuleError::Unreadable { .. } => "rule_unreadable",
            RuleError::NoSession { .. } => "not_in_session",
            RuleError::TooBroad
            | RuleError::PluginMismatch { .. }
            | RuleError::EmptyName { .. }
            | RuleError::EmptyArgument
            | RuleError::ClimbingPattern { .. }
            | RuleError::AlreadyExpired { .. } => "rule_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            RuleError::Unreadable { id, .. } => json!({ "rule": id }),
            RuleError::NoSession { run_id } => json!({ "run_id": run_id }),
            RuleError::TooBroad
            | RuleError::PluginMismatch { .. }
            | RuleError::EmptyName { .. }
            | RuleError::EmptyArgument
            | RuleError::ClimbingPattern { .. }
            | RuleError::AlreadyExpired { .. } => json!({ "reason": self.to_string() }),
        }
    }
}

impl AgentError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::Read { .. } => "agent_unreadable",
            AgentError::Parse { .. } | AgentError::Invalid { .. } => "agent_invalid",
            AgentError::Plan { .. } => "plan_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            AgentError::Read { path, .. } | AgentError::Parse { path, .. } => {
                json!({ "file": evidence::path(path) })
            }
            AgentError::Invalid { path, key, .. } => {
                json!({ "file": evidence::path(path), "key": key })
            }
            AgentError::Plan { path, error } => json!({
                "file": evidence::path(path),
                "key": error.key(),
                "problem": error.problem(),
            }),
        }
    }
}

impl AgentViewError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            AgentViewError::MissingPlugin { .. }
            | AgentViewError::UnknownPlugin { .. }
            | AgentViewError::ApprovalForUnknownTool { .. }
            | AgentViewError::NameTooLong { .. }
            | AgentViewError::DuplicateName { .. } => "agent_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> Value {
        match self {
            AgentViewError::MissingPlugin { agent, .. }
            | AgentViewError::UnknownPlugin { agent, .. }
            | AgentViewError::ApprovalForUnknownTool { agent, .. }
            | AgentViewError::NameTooLong { agent, .. }
            | AgentViewError::DuplicateName { agent, .. } => json!({ "agent": agent }),
        }
    }
}
