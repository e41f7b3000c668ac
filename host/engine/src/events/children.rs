//! The payloads of a parent's events about its child runs (agents called
//! as tools): where a child comes from, the child started, parked and
//! finished. The calls themselves are `child_agents.rs`'s and
//! `runtime/children.rs`'s.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ToolCallResult;
use crate::budget::{BudgetKind, BudgetLimits, BudgetUsage};
use crate::ids::{AgentDigest, CallId, RunId};
use crate::status::RunStatus;

/// Where a child run comes from: recorded in its `run_started`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentLink {
    /// The parent run.
    pub run_id: RunId,
    /// The parent's call that started this run.
    pub call_id: CallId,
}

/// [`Event::ChildStarted`](super::Event::ChildStarted): a call to
/// another agent started a child run (created before this is recorded).
/// A decision: replay checks it against what the parent decides now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildStarted {
    /// The parent's call.
    pub call_id: CallId,
    /// The child run ([`child_run_id`](crate::agent::child_agents::child_run_id) of the parent and the call).
    pub child_run: RunId,
    /// The child's agent.
    pub agent: String,
    /// The digest of the child's agent.
    pub agent_digest: AgentDigest,
    /// The child's input: the call's arguments.
    pub input: Value,
    /// The budgets granted to the child (its `run_started` records them).
    pub budgets: BudgetLimits,
    /// The budgets capped by what the parent had left. Omitted when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capped: Vec<BudgetKind>,
}

/// [`Event::ChildParked`](super::Event::ChildParked): the child
/// run waits (for a human, the application, a timer): the parent waits at
/// the call, `awaiting_child`, until a drive finds the child moved on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildParked {
    /// The parent's call.
    pub call_id: CallId,
    /// The child run.
    pub child_run: RunId,
    /// The child's status.
    pub status: RunStatus,
}

/// [`Event::ChildFinished`](super::Event::ChildFinished): the
/// child run ended; its output (or how it ended) is the call's result and
/// what it used is charged to the parent. A fact, read from the child's
/// log when it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildFinished {
    /// The parent's call.
    pub call_id: CallId,
    /// The child run.
    pub child_run: RunId,
    /// How it ended.
    pub status: RunStatus,
    /// The call's result: the child's output, or an error naming how it
    /// ended.
    pub result: ToolCallResult,
    /// What the child used, charged to the parent (wall time excepted: the
    /// parent's own clock readings span the child's).
    pub usage: BudgetUsage,
}
