//! The events of a run's log: one serde-tagged [`Event`] enum, its payload
//! structs, and the versioned encoding every store keeps ([`encode`],
//! [`decode`]).
//!
//! A stored event is `{"v":<format version>,"event":{"type":"<kind>",...}}`.
//! Every payload rejects unknown fields. Compatibility rules:
//! - a new optional field is `Option` with `skip_serializing_if`, so events
//!   written without it keep their exact bytes and still decode;
//! - a log written by a newer format ([`FORMAT_VERSION`] below the stored
//!   `v`) is refused with [`EventError::NewerFormat`], never misread;
//! - a change that old readers could misread bumps [`FORMAT_VERSION`], and
//!   [`decode`] keeps reading every older version it knows.
//!
//! Every kind has a pinned-JSON test below, and the conformance test counts
//! the kinds, so a new kind cannot go uncovered.

mod children;
mod delivery;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::budget::{BudgetLimits, BudgetOverrun, Pricing, RecordedLimits};
use super::ceilings::Ceiling;
use super::ids::{AgentDigest, CallDigest, CallId, RequestHash, RunId, SessionId};
use super::policy_hooks::{PolicyConsult, PolicyHook, PolicyPoint, PolicyVerdict};
pub use children::{ChildFinished, ChildParked, ChildStarted, ParentLink};
pub use delivery::{
    DeliveryAttemptFailed, DeliveryCompleted, DeliveryError, DeliveryFailed, DeliveryIntent,
};
use warden_plugins::grant::EffectClass;
use warden_providers::{
    Message, ModelRequest, ProviderError, RawBlock, StopReason, ToolCall, Usage,
};
use warden_sandbox::{LeaseError, Outcome, UsageReceipt, wit};
pub use warden_store::HistoryDigest;
use warden_syntax::json_limits;

/// The format version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// One event of a run's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The run began. Always the first event, and only there.
    RunStarted(RunStarted),
    /// A model call is about to be made (intent).
    ModelCallIntent(ModelCallIntent),
    /// A model call answered (completion).
    ModelCallCompleted(ModelCallCompleted),
    /// A model call failed (completion).
    ModelCallFailed(ModelCallFailed),
    /// A tool call the model made was refused before anything ran: the error
    /// is the call's result.
    ToolCallRejected(ToolCallRejected),
    /// A tool call is about to run (intent), with frozen arguments.
    ToolCallIntent(ToolCallIntent),
    /// A tool call ran (completion), with its lease's receipt.
    ToolCallCompleted(ToolCallCompleted),
    /// A human recorded the completion of a write whose outcome the log did
    /// not have.
    ToolCallResolved(ToolCallResolved),
    /// One attempt at a tool call failed and the call stays in flight: a
    /// `read` or `idempotent` call about to be tried again, or a write whose
    /// lease died mid-call, so its outcome is unknown.
    ToolCallAttemptFailed(ToolCallAttemptFailed),
    /// A failed model call's next attempt is due later than a driver waits
    /// (`[model] max_retry_wait`): the run is parked until then.
    WaitStarted(WaitStarted),
    /// A parked run's wait is over (it was driven again at or after its
    /// wake-up time); the model call's next attempt follows.
    WaitEnded(WaitEnded),
    /// Another run already executed this call under the same idempotency
    /// commitment: its recorded result is this call's result, and nothing
    /// ran here.
    ToolCallDeduplicated(ToolCallDeduplicated),
    /// The model called an external tool: the run waits for the embedding
    /// application to perform it and report its output.
    ExternalCallRequested(ExternalCallRequested),
    /// The application reported an external tool's output (validated
    /// against its schema and the recorded arguments before it was written).
    ExternalCallCompleted(ExternalCallCompleted),
    /// A tool call waits for a human's approval.
    ApprovalRequested(ApprovalRequested),
    /// A human approved a tool call.
    ApprovalGranted(ApprovalGranted),
    /// A human denied a tool call; the denial is the call's result.
    ApprovalDenied(ApprovalDenied),
    /// An approval recorded for a call approves nothing at execution time
    /// (its digest is not the call's, or the rule that granted it was
    /// revoked or expired): the call waits for approval again.
    ApprovalWithdrawn(ApprovalWithdrawn),
    /// The run waits for input that must satisfy a schema.
    Suspended(Suspended),
    /// A human gave the input a suspended run waited for.
    Resumed(Resumed),
    /// A budget was used up: the run is parked.
    BudgetExceeded(BudgetExceeded),
    /// A human raised budgets of a run parked over budget.
    BudgetExtended(BudgetExtended),
    /// The injected clock was read.
    ClockObserved(ClockObserved),
    /// The injected random source was read.
    RandomObserved(RandomObserved),
    /// A policy decided at a hook (allow, deny, feedback, or failed).
    PolicyDecided(PolicyDecided),
    /// The model's final answer does not satisfy the agent's output schema:
    /// the violation is sent back to the model (once).
    OutputRejected(OutputRejected),
    /// The run finished with an output. Terminal.
    RunCompleted(RunCompleted),
    /// The run failed. Terminal.
    RunFailed(RunFailed),
    /// The run was cancelled. Terminal.
    RunCancelled(RunCancelled),
    /// A human abandoned the run. Terminal.
    RunAbandoned(RunAbandoned),
    /// A context source returned items for the model call of a step: what
    /// the prompt quotes, recorded whole so replay never resolves again.
    ContextResolved(ContextResolved),
    /// A context source failed before the model call of a step; the agent
    /// says whether the step goes on without it or fails.
    ContextFailed(ContextFailed),
    /// The prompt outgrew the agent's budget: a model call summarising the
    /// older conversation is about to be made (intent).
    CompactionIntent(CompactionIntent),
    /// The summary came back; it replaces the summarised messages in later
    /// prompts (completion).
    CompactionCompleted(CompactionCompleted),
    /// The summarising call failed (completion); the step goes on with the
    /// prompt uncompacted.
    CompactionFailed(CompactionFailed),
    /// A delivery to a channel is about to be made (intent), with its
    /// stable id and frozen payload. May follow a terminal event.
    DeliveryIntent(DeliveryIntent),
    /// One attempt at a delivery failed; it is tried again at `retry_at_ms`.
    DeliveryAttemptFailed(DeliveryAttemptFailed),
    /// A channel took a delivery (completion), with its lease's receipt.
    DeliveryCompleted(DeliveryCompleted),
    /// A delivery was given up (completion); the run's result is unchanged.
    DeliveryFailed(DeliveryFailed),
    /// The log may be missing what the run did (it was restored from a
    /// backup): the run needs reconciliation until a human says what
    /// happened ([`Event::Reconciled`]) or abandons it.
    ReconciliationRequired(ReconciliationRequired),
    /// A human checked what the run did that its log may be missing, and
    /// let it go on from its log.
    Reconciled(Reconciled),
    /// An operator released an idempotency key this run held: the next run
    /// with the key makes the call. May follow a terminal event.
    KeyReleased(KeyReleased),
    /// An operator settled an idempotency key this run held unsettled with
    /// the call's outcome, found by hand: later runs with the key get it.
    /// May follow a terminal event.
    KeySettled(KeySettled),
    /// This run is a fork: every event before this one was copied, byte for
    /// byte, from another run's log up to a position, and is inherited
    /// (reused, never executed again). From here on the run is its own,
    /// with the agent and limits recorded here.
    RunForked(RunForked),
    /// A call to another agent started a child run (already created, its
    /// id derived from this run's and the call's).
    ChildStarted(ChildStarted),
    /// The child run of the call in flight waits (for a human, the
    /// application, a timer): so does this run, at the call.
    ChildParked(ChildParked),
    /// The child run of the call in flight ended: its output (or how it
    /// ended) is the call's result, and what it used is charged here.
    ChildFinished(ChildFinished),
}

/// The kind of an [`Event`], as its `type` tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// [`Event::RunStarted`].
    RunStarted,
    /// [`Event::ModelCallIntent`].
    ModelCallIntent,
    /// [`Event::ModelCallCompleted`].
    ModelCallCompleted,
    /// [`Event::ModelCallFailed`].
    ModelCallFailed,
    /// [`Event::ToolCallRejected`].
    ToolCallRejected,
    /// [`Event::ToolCallIntent`].
    ToolCallIntent,
    /// [`Event::ToolCallCompleted`].
    ToolCallCompleted,
    /// [`Event::ToolCallResolved`].
    ToolCallResolved,
    /// [`Event::ToolCallAttemptFailed`].
    ToolCallAttemptFailed,
    /// [`Event::ToolCallDeduplicated`].
    ToolCallDeduplicated,
    /// [`Event::WaitStarted`].
    WaitStarted,
    /// [`Event::WaitEnded`].
    WaitEnded,
    /// [`Event::ExternalCallRequested`].
    ExternalCallRequested,
    /// [`Event::ExternalCallCompleted`].
    ExternalCallCompleted,
    /// [`Event::ApprovalRequested`].
    ApprovalRequested,
    /// [`Event::ApprovalGranted`].
    ApprovalGranted,
    /// [`Event::ApprovalDenied`].
    ApprovalDenied,
    /// [`Event::ApprovalWithdrawn`].
    ApprovalWithdrawn,
    /// [`Event::Suspended`].
    Suspended,
    /// [`Event::Resumed`].
    Resumed,
    /// [`Event::BudgetExceeded`].
    BudgetExceeded,
    /// [`Event::BudgetExtended`].
    BudgetExtended,
    /// [`Event::ClockObserved`].
    ClockObserved,
    /// [`Event::RandomObserved`].
    RandomObserved,
    /// [`Event::PolicyDecided`].
    PolicyDecided,
    /// [`Event::OutputRejected`].
    OutputRejected,
    /// [`Event::RunCompleted`].
    RunCompleted,
    /// [`Event::RunFailed`].
    RunFailed,
    /// [`Event::RunCancelled`].
    RunCancelled,
    /// [`Event::RunAbandoned`].
    RunAbandoned,
    /// [`Event::ContextResolved`].
    ContextResolved,
    /// [`Event::ContextFailed`].
    ContextFailed,
    /// [`Event::CompactionIntent`].
    CompactionIntent,
    /// [`Event::CompactionCompleted`].
    CompactionCompleted,
    /// [`Event::CompactionFailed`].
    CompactionFailed,
    /// [`Event::DeliveryIntent`].
    DeliveryIntent,
    /// [`Event::DeliveryAttemptFailed`].
    DeliveryAttemptFailed,
    /// [`Event::DeliveryCompleted`].
    DeliveryCompleted,
    /// [`Event::DeliveryFailed`].
    DeliveryFailed,
    /// [`Event::ReconciliationRequired`].
    ReconciliationRequired,
    /// [`Event::Reconciled`].
    Reconciled,
    /// [`Event::KeyReleased`].
    KeyReleased,
    /// [`Event::KeySettled`].
    KeySettled,
    /// [`Event::RunForked`].
    RunForked,
    /// [`Event::ChildStarted`].
    ChildStarted,
    /// [`Event::ChildParked`].
    ChildParked,
    /// [`Event::ChildFinished`].
    ChildFinished,
}

/// Calls macro `$m` with every event kind's name, in [`EventKind::ALL`]'s
/// order: `ALL` and the matches over every kind are made from this list.
macro_rules! every_kind {
    ($m:ident) => {
        $m!(
            RunStarted,
            ModelCallIntent,
            ModelCallCompleted,
            ModelCallFailed,
            ToolCallRejected,
            ToolCallIntent,
            ToolCallCompleted,
            ToolCallResolved,
            ApprovalRequested,
            ApprovalGranted,
            ApprovalDenied,
            Suspended,
            Resumed,
            BudgetExceeded,
            BudgetExtended,
            ClockObserved,
            RandomObserved,
            RunCompleted,
            RunFailed,
            RunCancelled,
            RunAbandoned,
            ToolCallAttemptFailed,
            ToolCallDeduplicated,
            ExternalCallRequested,
            ExternalCallCompleted,
            OutputRejected,
            ContextResolved,
            ContextFailed,
            CompactionIntent,
            CompactionCompleted,
            CompactionFailed,
            DeliveryIntent,
            DeliveryAttemptFailed,
            DeliveryCompleted,
            DeliveryFailed,
            PolicyDecided,
            ReconciliationRequired,
            Reconciled,
            WaitStarted,
            WaitEnded,
            KeyReleased,
            KeySettled,
            RunForked,
            ChildStarted,
            ChildParked,
            ChildFinished,
            ApprovalWithdrawn
        )
    };
}

/// The kinds named, as an array.
macro_rules! kind_array {
    ($($name:ident),*) => {
        [$(EventKind::$name),*]
    };
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 47] = every_kind!(kind_array);

    /// The `type` tag.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunStarted => "run_started",
            EventKind::ModelCallIntent => "model_call_intent",
            EventKind::ModelCallCompleted => "model_call_completed",
            EventKind::ModelCallFailed => "model_call_failed",
            EventKind::ToolCallRejected => "tool_call_rejected",
            EventKind::ToolCallIntent => "tool_call_intent",
            EventKind::ToolCallCompleted => "tool_call_completed",
            EventKind::ToolCallResolved => "tool_call_resolved",
            EventKind::ToolCallAttemptFailed => "tool_call_attempt_failed",
            EventKind::ToolCallDeduplicated => "tool_call_deduplicated",
            EventKind::WaitStarted => "wait_started",
            EventKind::WaitEnded => "wait_ended",
            EventKind::ExternalCallRequested => "external_call_requested",
            EventKind::ExternalCallCompleted => "external_call_completed",
            EventKind::ApprovalRequested => "approval_requested",
            EventKind::ApprovalGranted => "approval_granted",
            EventKind::ApprovalDenied => "approval_denied",
            EventKind::ApprovalWithdrawn => "approval_withdrawn",
            EventKind::Suspended => "suspended",
            EventKind::Resumed => "resumed",
            EventKind::BudgetExceeded => "budget_exceeded",
            EventKind::BudgetExtended => "budget_extended",
            EventKind::ClockObserved => "clock_observed",
            EventKind::RandomObserved => "random_observed",
            EventKind::OutputRejected => "output_rejected",
            EventKind::PolicyDecided => "policy_decided",
            EventKind::RunCompleted => "run_completed",
            EventKind::RunFailed => "run_failed",
            EventKind::RunCancelled => "run_cancelled",
            EventKind::RunAbandoned => "run_abandoned",
            EventKind::ContextResolved => "context_resolved",
            EventKind::ContextFailed => "context_failed",
            EventKind::CompactionIntent => "compaction_intent",
            EventKind::CompactionCompleted => "compaction_completed",
            EventKind::CompactionFailed => "compaction_failed",
            EventKind::DeliveryIntent => "delivery_intent",
            EventKind::DeliveryAttemptFailed => "delivery_attempt_failed",
            EventKind::DeliveryCompleted => "delivery_completed",
            EventKind::DeliveryFailed => "delivery_failed",
            EventKind::ReconciliationRequired => "reconciliation_required",
            EventKind::Reconciled => "reconciled",
            EventKind::KeyReleased => "key_released",
            EventKind::KeySettled => "key_settled",
            EventKind::RunForked => "run_forked",
            EventKind::ChildStarted => "child_started",
            EventKind::ChildParked => "child_parked",
            EventKind::ChildFinished => "child_finished",
        }
    }

    /// Whether an event of this kind ends the run.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            EventKind::RunCompleted
                | EventKind::RunFailed
                | EventKind::RunCancelled
                | EventKind::RunAbandoned
        )
    }

    /// Whether an event of this kind belongs to the deliveries' lane (it
    /// may follow a terminal event and never changes the run's status).
    pub fn is_delivery(self) -> bool {
        matches!(
            self,
            EventKind::DeliveryIntent
                | EventKind::DeliveryAttemptFailed
                | EventKind::DeliveryCompleted
                | EventKind::DeliveryFailed
        )
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Event {
    /// The injected clock's reading the event carries, if any. Wall time is
    /// measured between readings, parked time excluded (see
    /// [`RunState`](super::state::RunState)).
    pub fn clock_reading(&self) -> Option<u64> {
        match self {
            Event::ClockObserved(c) => Some(c.at_ms),
            Event::ContextResolved(c) => Some(c.at_ms),
            Event::ContextFailed(c) => Some(c.at_ms),
            Event::ModelCallCompleted(c) => c.at_ms,
            Event::ModelCallFailed(f) => f.at_ms,
            Event::WaitEnded(e) => Some(e.at_ms),
            Event::ApprovalRequested(e) => e.at_ms,
            Event::ApprovalGranted(e) => e.at_ms,
            Event::ApprovalDenied(e) => e.at_ms,
            Event::ApprovalWithdrawn(e) => e.at_ms,
            Event::Resumed(e) => e.at_ms,
            Event::BudgetExtended(e) => e.at_ms,
            Event::ExternalCallCompleted(e) => e.at_ms,
            Event::ToolCallResolved(e) => e.at_ms,
            Event::Reconciled(e) => e.at_ms,
            _ => None,
        }
    }

    /// The event's kind.
    pub fn kind(&self) -> EventKind {
        macro_rules! kind_of {
            ($($name:ident),*) => {
                match self {
                    $(Event::$name(_) => EventKind::$name,)*
                }
            };
        }
        every_kind!(kind_of)
    }

    /// Whether the event belongs to the deliveries' lane.
    pub fn is_delivery(&self) -> bool {
        self.kind().is_delivery()
    }
}

/// [`Event::RunStarted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunStarted {
    /// The run.
    pub run_id: RunId,
    /// The agent's name.
    pub agent: String,
    /// The digest of the agent's definition, compared on recovery.
    pub agent_digest: AgentDigest,
    /// The run's input.
    pub input: Value,
    /// Correlation labels. Omitted when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The injected clock's reading when the run started, in milliseconds
    /// since the Unix epoch: wall time is measured from it.
    pub clock_seed_ms: u64,
    /// The seed of the run's randomness, drawn from the injected source.
    pub random_seed: u64,
    /// The agent file the run was started from, as a hint for tools that
    /// continue it later (`warden runs approve` and friends); the digest, not
    /// the path, decides whether an agent may continue the run. Omitted when
    /// the agent was not read from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_file: Option<String>,
    /// The session the run was started in and the history it sees, fixed
    /// when it started. Omitted for a run outside any session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionStart>,
    /// The limits in force when the run started: its budgets (raised later
    /// only by recorded extensions), its input-size cap and its cost's
    /// currency. Omitted in logs written before they were recorded (the
    /// agent's limits apply then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RecordedLimits>,
    /// The parent run and call, when this run is a child run (an agent
    /// called as a tool). Omitted for a run started on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// The tools each MCP server of the agent (`[mcp_servers]`) offered
    /// the run, by the server's key: which pinned list and which of its
    /// tools, so the log says exactly which tool descriptions the model
    /// saw (the operator's overrides are in the agent's digest). Replay
    /// compares it with what the servers offer now. Omitted when the agent
    /// uses no MCP server.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_tools: BTreeMap<String, McpToolsOffered>,
}

/// What one MCP server offered a run (see [`RunStarted::mcp_tools`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolsOffered {
    /// The digest of the server's pinned tool list (`sha256:…`, as in the
    /// pin file).
    pub pins: String,
    /// The tools offered, by the server's names, sorted: each one listed
    /// exactly as pinned (a tool that changed since is withheld).
    pub offered: Vec<String>,
}

/// The session part of [`RunStarted`]: which session, and the history the
/// run sees, fixed when it started (see `runtime/session.rs`).
///
/// A run records its history by reference: [`chain`](Self::chain) names the
/// newest of the store's shared history chunks, so a run's first event has
/// the same size at turn 200 as at turn 2. Logs written before chunks
/// existed carry the history inline in `runs` and `history`, and are read
/// as they are. The runtime fills `runs` and `history` from the chunks when
/// it loads a log ([`resolve_history`](crate::runtime::resolve_history)),
/// and folding a run whose chain was not resolved is refused
/// ([`FoldProblem::HistoryUnresolved`](crate::state::FoldProblem::HistoryUnresolved)),
/// so no run is ever driven on a history it does not have.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionStart {
    /// The session.
    pub session_id: SessionId,
    /// The run's place in the session: how many runs (of any outcome) the
    /// session held when it started, so its first run is 0.
    pub position: u64,
    /// The earlier completed runs whose transcripts make the history,
    /// oldest first: recorded in logs written before history chunks, and
    /// filled from the chunks when a log is loaded. Omitted when none
    /// (the session's first run, or only cancelled or failed runs before
    /// it) and in every log that records a chain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunId>,
    /// Their transcripts, in order: each run's input, the model's turns and
    /// the tool results, as the model saw them. Inline and filled as
    /// `runs` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// The shared history chunk the history ends with, and how many runs
    /// and messages the whole chain holds. Omitted when there is no
    /// history, and in logs written before history chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<HistoryChain>,
}

impl SessionStart {
    /// How many earlier runs the history holds, resolved or not.
    pub fn history_run_count(&self) -> u64 {
        self.chain
            .as_ref()
            .map_or(self.runs.len() as u64, |c| c.runs)
    }

    /// How many messages the history holds, resolved or not.
    pub fn history_message_count(&self) -> u64 {
        self.chain
            .as_ref()
            .map_or(self.history.len() as u64, |c| c.messages)
    }

    /// Whether `runs` and `history` hold the whole history: always for a
    /// log without a chain, and for one with a chain once it was resolved.
    pub fn is_resolved(&self) -> bool {
        self.chain.as_ref().is_none_or(|c| {
            c.runs == self.runs.len() as u64 && c.messages == self.history.len() as u64
        })
    }
}

/// A run's history by reference (see [`SessionStart::chain`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryChain {
    /// The newest chunk: its digest commits to every chunk before it.
    pub head: HistoryDigest,
    /// How many runs the chain's chunks name, in all.
    pub runs: u64,
    /// How many messages they hold, in all.
    pub messages: u64,
}

/// [`Event::ModelCallIntent`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCallIntent {
    /// The step, from 1.
    pub step: u32,
    /// The attempt at this step, from 1.
    pub attempt: u32,
    /// The hash of the request, always.
    pub request_hash: RequestHash,
    /// The request itself, only when the operator records prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<ModelRequest>,
    /// The provider that reaches the model (`scripted`, `openai`,
    /// `anthropic`, `plan`), so traces name who answered. Omitted in logs
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model, as the provider names it. Omitted in logs written before
    /// it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// [`Event::ModelCallCompleted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCallCompleted {
    /// The step.
    pub step: u32,
    /// The answer's text. Omitted when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// The tool calls, in order, with the provider's ids. Omitted when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Content blocks kept verbatim (reasoning and its signature, server
    /// tool blocks), sent back to the provider with the conversation.
    /// Omitted when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<RawBlock>,
    /// Tokens used.
    pub usage: Usage,
    /// What the call cost, in nano-units of the pricing's currency. Omitted
    /// when the agent has no pricing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nanos: Option<u64>,
    /// The pricing the cost was computed with. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
    /// Why the model stopped.
    pub stop_reason: StopReason,
    /// When the completion arrived, in the injected clock's milliseconds
    /// (timings and the wall-time budget count the call up to here).
    /// Omitted in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::ModelCallFailed`]: one attempt's failure, as the engine's one
/// retry layer decides from it (see `engine/retry.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCallFailed {
    /// The step.
    pub step: u32,
    /// What went wrong.
    pub error: ModelCallError,
    /// When the failure arrived, in the injected clock's milliseconds.
    /// Omitted in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// When the next attempt is due (the backoff, or what `Retry-After`
    /// asked for, from `at_ms`), so a driver that recovers the run after a
    /// crash waits the same. Omitted when there is no next attempt (the
    /// error is permanent or the attempts are used up), and in logs written
    /// before it was recorded (the next attempt is then due at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_ms: Option<u64>,
}

/// [`Event::WaitStarted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitStarted {
    /// The step whose model call waits.
    pub step: u32,
    /// Since when the run waits: the failure's time.
    pub since_ms: u64,
    /// The wake-up time: when the next attempt is due.
    pub until_ms: u64,
}

/// [`Event::WaitEnded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitEnded {
    /// When a driver took the run up again, in the injected clock's
    /// milliseconds (at or after the wake-up time).
    pub at_ms: u64,
}

/// A failed model call, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCallError {
    /// Whether trying again may succeed.
    pub transient: bool,
    /// The provider's error, as text.
    pub message: String,
    /// The HTTP status, if the provider got one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What the server's `Retry-After` asked for, in milliseconds, if it
    /// said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl From<&ProviderError> for ModelCallError {
    fn from(e: &ProviderError) -> Self {
        let (status, retry_after_ms) = match e {
            ProviderError::Http {
                status,
                retry_after_ms,
                ..
            } => (Some(*status), *retry_after_ms),
            _ => (None, None),
        };
        ModelCallError {
            transient: e.is_transient(),
            message: e.to_string(),
            status,
            retry_after_ms,
        }
    }
}

/// A tool, by the agent's name for its plugin and the plugin's name for the
/// tool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRef {
    /// The plugin's key in the agent file.
    pub plugin: String,
    /// The tool's name within the plugin.
    pub tool: String,
}

impl ToolRef {
    /// The name the model calls the tool by: `<plugin>__<tool>`.
    pub fn model_name(&self) -> String {
        format!("{}__{}", self.plugin, self.tool)
    }
}

impl std::fmt::Display for ToolRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.plugin, self.tool)
    }
}

/// [`Event::ToolCallRejected`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallRejected {
    /// The call.
    pub call_id: CallId,
    /// Why, as returned to the model.
    pub error: ToolCallError,
}

/// [`Event::ToolCallIntent`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIntent {
    /// The call.
    pub call_id: CallId,
    /// The tool.
    pub tool: ToolRef,
    /// The arguments, frozen as the model gave them.
    pub arguments: Value,
    /// The effect class it runs with: decides what recovery may re-execute.
    pub effect: EffectClass,
    /// Passed to the tool; the same on every execution of this call.
    pub idempotency_key: String,
    /// When the operator named an argument as the tool's idempotency key:
    /// the key is the commitment key derived from that argument (the same
    /// for every run making the same call), not one derived from the run
    /// and call ids. Omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed_by: Option<KeyedBy>,
}

/// The argument a call's idempotency key comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyedBy {
    /// The argument's name.
    pub field: String,
    /// What the key is unique within: `<plugin>/<tool>`, by the plugin's
    /// manifest name, so every agent using the plugin shares it.
    pub scope: String,
}

/// [`Event::ToolCallAttemptFailed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallAttemptFailed {
    /// The call.
    pub call_id: CallId,
    /// Which attempt failed, from 1.
    pub attempt: u32,
    /// How it failed.
    pub error: ToolCallError,
    /// What the attempt's lease used.
    pub receipt: UsageReceipt,
    /// Whether the effect may have happened: a write whose lease died
    /// mid-call. The run then needs reconciliation. Omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outcome_unknown: bool,
}

/// [`Event::ExternalCallRequested`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalCallRequested {
    /// The call.
    pub call_id: CallId,
    /// The external tool, as the model named it.
    pub tool: String,
    /// The arguments, frozen as the model gave them.
    pub arguments: Value,
    /// The JSON Schema the reported output must satisfy.
    pub output_schema: Value,
    /// Output fields that must equal the arguments' fields of the same name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub must_match: Vec<String>,
}

/// [`Event::ExternalCallCompleted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalCallCompleted {
    /// The call.
    pub call_id: CallId,
    /// The output the application reported.
    pub output: Value,
    /// Who reported it. Omitted when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::ToolCallDeduplicated`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallDeduplicated {
    /// The call.
    pub call_id: CallId,
    /// The commitment key it shares with the call that ran.
    pub idempotency_key: String,
    /// The result recorded by the call that ran.
    pub result: ToolCallResult,
    /// The run that ran it.
    pub origin_run: RunId,
    /// Its call there.
    pub origin_call: CallId,
}

/// [`Event::ToolCallCompleted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallCompleted {
    /// The call.
    pub call_id: CallId,
    /// Its output or typed error.
    pub result: ToolCallResult,
    /// What the lease used and how it ended.
    pub receipt: UsageReceipt,
}

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolCallResult {
    /// The tool's output, a JSON value.
    Output(Value),
    /// The call failed.
    Error(ToolCallError),
}

/// What a tool invocation's lease returned: the host's verdict, then the
/// guest's.
pub type InvocationOutcome = Result<Result<wit::ToolOutput, wit::ToolError>, LeaseError>;

/// What a preflight's lease returned: the host's verdict, then the guest's.
pub type PreflightOutcome = Result<Result<wit::Preview, wit::ToolError>, LeaseError>;

impl ToolCallResult {
    /// The result of an invocation: the lease's outcome, then the guest's.
    pub fn from_invocation(outcome: &InvocationOutcome) -> ToolCallResult {
        match outcome {
            Ok(Ok(output)) => match json_limits::parse(&output.content) {
                Ok(value) => ToolCallResult::Output(value),
                Err(json_limits::ParseError::Syntax(e)) => {
                    ToolCallResult::Error(ToolCallError::InvalidOutput {
                        message: format!("the tool's output is not JSON: {e}"),
                    })
                }
                Err(json_limits::ParseError::TooDeep(e)) => {
                    ToolCallResult::Error(ToolCallError::InvalidOutput {
                        message: format!("the tool's output is {e}"),
                    })
                }
            },
            Ok(Err(error)) => ToolCallResult::Error(ToolCallError::from_wit(error)),
            Err(lease) => ToolCallResult::Error(ToolCallError::from_lease(lease)),
        }
    }
}

/// A tool call that did not produce an output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ToolCallError {
    /// The model called a tool the agent does not offer.
    #[error("there is no tool `{name}`")]
    UnknownTool {
        /// The name the model used.
        name: String,
    },
    /// The arguments do not fit the tool.
    #[error("invalid arguments: {message}")]
    InvalidArguments {
        /// Why.
        message: String,
    },
    /// The model's answer was cut off by `max_tokens` in the middle of the
    /// call: its arguments are incomplete, so nothing ran.
    #[error(
        "the call was cut off by max_tokens before its arguments were complete (received `{received}`): call the tool again with complete arguments, asking for less at once"
    )]
    TruncatedCall {
        /// The argument text that arrived, at most 200 bytes of it.
        received: String,
    },
    /// The tool refused (outside its mount, not permitted, …).
    #[error("denied by the tool: {message}")]
    Denied {
        /// Why.
        message: String,
    },
    /// The tool tried and failed.
    #[error("failed: {message}")]
    Failed {
        /// Why.
        message: String,
        /// Whether trying again later may succeed.
        retryable: bool,
    },
    /// The sandbox ended the lease: a limit, a trap, a cancellation.
    #[error("the sandbox stopped the call ({outcome}): {message}")]
    LeaseFailed {
        /// How the lease ended.
        outcome: Outcome,
        /// What happened.
        message: String,
    },
    /// The tool returned something that is not a JSON value.
    #[error("{message}")]
    InvalidOutput {
        /// What was wrong.
        message: String,
    },
    /// The tool could not be called at all (its plugin failed to load, …).
    #[error("the tool is unavailable: {message}")]
    Unavailable {
        /// Why.
        message: String,
    },
    /// The operator named an argument as the tool's idempotency key and the
    /// call lacks it (or it is not a string, number or boolean).
    #[error("the argument `{field}` is required: it is the tool's idempotency key")]
    MissingIdempotencyKey {
        /// The argument.
        field: String,
    },
    /// The call is past one of the host's ceilings on what a response or
    /// a run may start (`[ceilings]` in `warden.toml`): it did not start.
    #[error(
        "refused: past the host's ceiling `{ceiling}` = {limit} ({}); ask for less at once, or an operator raises `[ceilings] {ceiling}` in warden.toml",
        match .ceiling {
            Ceiling::ToolCallsPerResponse => "the most tool calls of one response that start",
            Ceiling::ChildrenPerResponse => "the most calls to other agents of one response that start",
            Ceiling::ChildrenPerRun => "the most child runs one run starts",
            Ceiling::FuelPerRun => "the fuel one run uses",
        }
    )]
    CeilingReached {
        /// Which ceiling.
        ceiling: Ceiling,
        /// Its value in the run (as its `run_started` records it).
        limit: u64,
    },
    /// The agent called as a tool (a child run) did not complete.
    #[error("the agent's run `{child_run}` ended {status}: {message}")]
    ChildEnded {
        /// The child run.
        child_run: RunId,
        /// How it ended: `failed`, `cancelled` or `abandoned`.
        status: String,
        /// Why.
        message: String,
    },
}

impl ToolCallError {
    /// Whether this rejection is the caller's mistake (an unknown tool,
    /// arguments that do not fit, a call cut off, a missing key argument):
    /// what the run counts as its model's invalid calls in a row, up to the
    /// agent's `max_invalid_tool_calls`.
    pub fn is_invalid_call(&self) -> bool {
        matches!(
            self,
            ToolCallError::UnknownTool { .. }
                | ToolCallError::InvalidArguments { .. }
                | ToolCallError::TruncatedCall { .. }
                | ToolCallError::MissingIdempotencyKey { .. }
        )
    }

    /// The error a guest returned.
    pub fn from_wit(error: &wit::ToolError) -> ToolCallError {
        match error {
            wit::ToolError::InvalidArguments(message) => ToolCallError::InvalidArguments {
                message: message.clone(),
            },
            wit::ToolError::Denied(message) => ToolCallError::Denied {
                message: message.clone(),
            },
            wit::ToolError::Failed(f) => ToolCallError::Failed {
                message: f.message.clone(),
                retryable: f.retryable,
            },
        }
    }

    /// A lease the host stopped.
    pub fn from_lease(error: &LeaseError) -> ToolCallError {
        ToolCallError::LeaseFailed {
            outcome: error.failure.outcome(),
            message: error.to_string(),
        }
    }
}

/// [`Event::ToolCallResolved`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallResolved {
    /// The dangling write.
    pub call_id: CallId,
    /// Who checked what the write did.
    pub by: String,
    /// The output they observed, recorded as the tool's output.
    pub output: Value,
    /// What they found, for the audit trail. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::ApprovalRequested`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequested {
    /// The call.
    pub call_id: CallId,
    /// The tool.
    pub tool: ToolRef,
    /// The call's effect class, as the grant made it (what Warden, not the
    /// plugin, says the call is). Omitted in logs written before it was
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<EffectClass>,
    /// What the tool's side-effect-free preflight says the call would do.
    /// Omitted when the preflight failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<Preview>,
    /// Why the preflight failed. Omitted when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight_error: Option<ToolCallError>,
    /// The preflight lease's receipt. Omitted when no lease ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<UsageReceipt>,
    /// The call's digest ([`CallDigest`]): what an approval of it must
    /// name. Omitted in logs written before approvals were bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<CallDigest>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// What a preflight shows the approver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preview {
    /// One line.
    pub summary: String,
    /// Detail, such as a diff. Omitted when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl From<&wit::Preview> for Preview {
    fn from(p: &wit::Preview) -> Self {
        Preview {
            summary: p.summary.clone(),
            detail: p.detail.clone(),
        }
    }
}

/// [`Event::RunForked`]: where a fork comes from and what it changed.
///
/// A fork's log is the source's events `1..=position`, copied byte for byte
/// (its own hash chain covers them; `source_head` pins them to the source's
/// chain), then this event. Folding it makes the run its own: later
/// idempotency keys and delivery ids derive from `run_id`, the agent with
/// `agent_digest` continues it under `limits`, and an approval granted
/// before the fork point for a call that had not run is withdrawn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunForked {
    /// The fork.
    pub run_id: RunId,
    /// The run it was forked from.
    pub source_run: RunId,
    /// How many of the source's events it inherits (this event's own
    /// position, counted from 1, is `position + 1`).
    pub position: u64,
    /// The source's chain hash at `position` (hex): the inherited prefix is
    /// exactly the source's log up to there.
    pub source_head: String,
    /// The digest of the agent the fork continues with.
    pub agent_digest: AgentDigest,
    /// The agent file it was forked with, as a hint for the verbs that
    /// continue it (like `run_started`'s). Omitted when not read from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_file: Option<String>,
    /// The limits in force from here on: the budgets (the source's in
    /// force at the fork point, its extensions included, unless the
    /// operator set others), the input-size cap and the currency.
    pub limits: RecordedLimits,
    /// What the operator changed against the source, by name
    /// (`instructions`, `model`, `tools`, `budgets`, …; `agent` when the
    /// definition changed in a way not named). Omitted when nothing did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
    /// The call whose approval, granted before the fork point, was withdrawn
    /// (it had not run): the fork asks for it again. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn_approval: Option<CallId>,
    /// Who forked it.
    pub by: String,
    /// The injected clock's reading when the fork was made. The time between
    /// the source's last inherited event and the fork is not counted as the
    /// fork's wall time.
    pub at_ms: u64,
}

/// [`Event::ApprovalGranted`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalGranted {
    /// The call.
    pub call_id: CallId,
    /// Who approved: a person (`api:<token>`, a CLI user) or, for an
    /// automatic approval, `rule:<id>`.
    pub by: String,
    /// The digest of the call approved ([`CallDigest`]): the approval
    /// approves that call with exactly those arguments, and nothing else.
    /// Omitted in logs written before approvals were bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<CallDigest>,
    /// The standing rule that granted it, for an automatic approval, and
    /// who created that rule. Omitted for a person's approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<GrantingRule>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// The rule behind an automatic approval, as [`ApprovalGranted`] records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantingRule {
    /// The rule's id.
    pub id: String,
    /// Who created the rule.
    pub created_by: String,
}

/// [`Event::ApprovalWithdrawn`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalWithdrawn {
    /// The call.
    pub call_id: CallId,
    /// Why the approval approves nothing.
    pub reason: WithdrawReason,
    /// The digest the approval named. Omitted when it named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<CallDigest>,
    /// The digest of the call as recorded.
    pub call: CallDigest,
    /// The rule that had granted it. Omitted for a person's approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The injected clock's reading when it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// Why an [`ApprovalWithdrawn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WithdrawReason {
    /// The approval names a digest that is not the call's.
    DigestMismatch,
    /// The rule that granted it was revoked before the call ran.
    RuleRevoked,
    /// The rule that granted it expired before the call ran.
    RuleExpired,
}

impl WithdrawReason {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            WithdrawReason::DigestMismatch => "digest_mismatch",
            WithdrawReason::RuleRevoked => "rule_revoked",
            WithdrawReason::RuleExpired => "rule_expired",
        }
    }
}

/// [`Event::ApprovalDenied`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDenied {
    /// The call.
    pub call_id: CallId,
    /// Who denied.
    pub by: String,
    /// Why; the model sees it.
    pub reason: String,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::Suspended`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suspended {
    /// The call the run is suspended at: the input becomes its result.
    pub call_id: CallId,
    /// Why, for the human.
    pub reason: String,
    /// The JSON Schema the resume input must satisfy.
    pub schema: Value,
}

/// [`Event::Resumed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resumed {
    /// The input, validated against the suspension's schema.
    pub input: Value,
    /// Who gave it. Omitted when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::BudgetExceeded`].
pub type BudgetExceeded = BudgetOverrun;

/// [`Event::BudgetExtended`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetExtended {
    /// The new limits, replacing the agent's (and earlier extensions').
    pub limits: BudgetLimits,
    /// Who extended. Omitted when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::ClockObserved`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockObserved {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// [`Event::RandomObserved`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomObserved {
    /// The value drawn.
    pub value: u64,
}

/// [`Event::PolicyDecided`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDecided {
    /// The hook.
    pub hook: PolicyHook,
    /// The step, for `after_response` and `before_finish`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// The call, for `before_tool_call`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<CallId>,
    /// The policy, by the name the agent enables it under.
    pub policy: String,
    /// What it decided.
    pub decision: PolicyVerdict,
    /// Why it denied, what its feedback says, or why it failed. Omitted for
    /// `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the lease of a policy plugin used (its fuel counts against the
    /// run's budget). Omitted for a native policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<UsageReceipt>,
}

// The recorded decision of a policy, built from and read back into the
// point it was asked at.
impl PolicyConsult {
    /// The event recording `verdict`, with the receipt of a policy plugin's
    /// lease.
    pub fn decided(
        &self,
        verdict: PolicyVerdict,
        reason: Option<String>,
        receipt: Option<UsageReceipt>,
    ) -> Event {
        let (step, call_id) = match &self.point {
            PolicyPoint::RunStart => (None, None),
            PolicyPoint::AfterResponse { step } | PolicyPoint::BeforeFinish { step } => {
                (Some(*step), None)
            }
            PolicyPoint::BeforeToolCall { call_id } => (None, Some(call_id.clone())),
        };
        Event::PolicyDecided(PolicyDecided {
            hook: self.point.hook(),
            step,
            call_id,
            policy: self.policy.clone(),
            decision: verdict,
            reason,
            receipt,
        })
    }
}

impl PolicyDecided {
    /// The point the decision is about; `None` when the fields do not fit
    /// the hook (a step for `after_response` and `before_finish`, a call for
    /// `before_tool_call`, neither for `run_start`).
    pub fn point(&self) -> Option<PolicyPoint> {
        match (self.hook, self.step, &self.call_id) {
            (PolicyHook::RunStart, None, None) => Some(PolicyPoint::RunStart),
            (PolicyHook::AfterResponse, Some(step), None) => {
                Some(PolicyPoint::AfterResponse { step })
            }
            (PolicyHook::BeforeToolCall, None, Some(call_id)) => {
                Some(PolicyPoint::BeforeToolCall {
                    call_id: call_id.clone(),
                })
            }
            (PolicyHook::BeforeFinish, Some(step), None) => {
                Some(PolicyPoint::BeforeFinish { step })
            }
            _ => None,
        }
    }
}

/// [`Event::OutputRejected`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputRejected {
    /// The step whose final answer was rejected.
    pub step: u32,
    /// What is wrong with it, as the model is told.
    pub violation: String,
}

/// [`Event::RunCompleted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCompleted {
    /// The run's output: the final answer's text, or, for an agent with an
    /// output schema, the JSON value it validated to.
    pub output: Value,
    /// Whether the host supplied the output
    /// ([`Runtime::finish_with`](super::Runtime::finish_with)) instead of
    /// the model's final answer. Omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_host: bool,
}

/// [`Event::RunFailed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFailed {
    /// Why.
    pub error: RunError,
}

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum RunError {
    /// A model call failed with a permanent error.
    #[error("the model call at step {step} failed: {message}")]
    ModelCallFailed {
        /// The step.
        step: u32,
        /// The provider's error.
        message: String,
    },
    /// A model call failed with transient errors too many times in a row.
    #[error("the model call at step {step} failed {attempts} times: {message}")]
    ModelAttemptsExhausted {
        /// The step.
        step: u32,
        /// How many attempts were made.
        attempts: u32,
        /// The last error.
        message: String,
    },
    /// The model refused to answer (a refusal, or a content filter), and
    /// the agent's `on_refusal` is `fail` (the default).
    #[error("the model refused at step {step}: {message}")]
    Refused {
        /// The step.
        step: u32,
        /// What the model said, at most 200 bytes of it.
        message: String,
    },
    /// The model's final answer was cut short by `max_tokens`.
    #[error("the model's answer at step {step} was cut short by max_tokens")]
    OutputTruncated {
        /// The step.
        step: u32,
    },
    /// The final answer violated the agent's output schema again after the
    /// violation was sent back to the model.
    #[error("the final answer at step {step} is invalid: {violation}")]
    OutputInvalid {
        /// The step of the last answer.
        step: u32,
        /// What is wrong with it.
        violation: String,
    },
    /// A policy denied the run at a hook (not a tool call's: that denial is
    /// the call's result).
    #[error("policy `{policy}` denied the run at {hook}: {reason}")]
    PolicyDenied {
        /// The policy.
        policy: String,
        /// The hook.
        hook: PolicyHook,
        /// Why.
        reason: String,
    },
    /// A policy failed (error, panic, timeout, or an answer its hook does
    /// not take): the run fails closed.
    #[error("policy `{policy}` failed at {hook}: {message}")]
    PolicyFailed {
        /// The policy.
        policy: String,
        /// The hook.
        hook: PolicyHook,
        /// What went wrong.
        message: String,
    },
    /// The host could not go on (a plugin failed to load, …).
    #[error("{message}")]
    Host {
        /// What happened.
        message: String,
    },
    /// A context source whose agent setting is `on_error = "fail"` failed
    /// before the model call of `step`.
    #[error("context source `{name}` failed before the model call of step {step}: {message}")]
    ContextFailed {
        /// The source's name in the agent (`[context.<name>]`).
        name: String,
        /// The step.
        step: u32,
        /// The source's error.
        message: String,
    },
    /// The model made `count` invalid tool calls in a row (unknown tools,
    /// arguments failing the schema), the agent's limit.
    #[error("the model made {count} invalid tool calls in a row; the last: {last}")]
    InvalidToolCalls {
        /// How many, in a row.
        count: u32,
        /// The last rejection, as the model saw it.
        last: String,
    },
}

/// [`Event::ContextResolved`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextResolved {
    /// The source's name in the agent (`[context.<name>]`).
    pub source: String,
    /// The step whose model call the items are for.
    pub step: u32,
    /// The injected clock's reading when the items came back: their ages
    /// in the prompt are measured from it.
    pub at_ms: u64,
    /// What the source returned, whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ContextItem>,
    /// The sha256 of the items' canonical JSON, so a source's answers can be
    /// compared across steps and runs without reading them.
    pub digest: String,
    /// What the lease used.
    pub receipt: UsageReceipt,
}

/// One piece of context, as a source returned it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextItem {
    /// Where it came from inside the source (a path, a note's id).
    pub source: String,
    /// The content, possibly cut short by the source.
    pub content: String,
    /// The original's size in bytes.
    pub size: u64,
    /// Its last modification, milliseconds since the Unix epoch. Omitted
    /// when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_ms: Option<u64>,
    /// Whether the source cut `content` short. Omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl From<&wit::ContextItem> for ContextItem {
    fn from(item: &wit::ContextItem) -> Self {
        ContextItem {
            source: item.source.clone(),
            content: item.content.clone(),
            size: item.size,
            modified_ms: item.modified_ms,
            truncated: item.truncated,
        }
    }
}

/// [`Event::ContextFailed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextFailed {
    /// The source's name in the agent.
    pub source: String,
    /// The step whose model call it was resolving for.
    pub step: u32,
    /// The injected clock's reading when it failed.
    pub at_ms: u64,
    /// How it failed.
    pub error: ContextError,
    /// What the lease used. Omitted when no lease ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<UsageReceipt>,
}

/// A context source that returned no items.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ContextError {
    /// The source refused the request (the agent's `query`).
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// Why.
        message: String,
    },
    /// The source was not allowed to read what it needed.
    #[error("denied: {message}")]
    Denied {
        /// Why.
        message: String,
    },
    /// The source tried and failed.
    #[error("failed: {message}")]
    Failed {
        /// Why.
        message: String,
        /// Whether trying again later may succeed.
        retryable: bool,
    },
    /// The sandbox ended the lease: a limit, a trap.
    #[error("the sandbox stopped the source ({outcome}): {message}")]
    LeaseFailed {
        /// How the lease ended.
        outcome: Outcome,
        /// What happened.
        message: String,
    },
    /// The source could not be called at all.
    #[error("the source is unavailable: {message}")]
    Unavailable {
        /// Why.
        message: String,
    },
}

impl ContextError {
    /// The error a guest returned.
    pub fn from_wit(error: &wit::ContextError) -> ContextError {
        match error {
            wit::ContextError::InvalidRequest(message) => ContextError::InvalidRequest {
                message: message.clone(),
            },
            wit::ContextError::Denied(message) => ContextError::Denied {
                message: message.clone(),
            },
            wit::ContextError::Failed(f) => ContextError::Failed {
                message: f.message.clone(),
                retryable: f.retryable,
            },
        }
    }

    /// A lease the host stopped.
    pub fn from_lease(error: &LeaseError) -> ContextError {
        ContextError::LeaseFailed {
            outcome: error.failure.outcome(),
            message: error.to_string(),
        }
    }
}

/// [`Event::CompactionIntent`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionIntent {
    /// The step whose model call the compaction is for.
    pub step: u32,
    /// The cut: the conversation's messages from the second (the input
    /// stays) up to this index, exclusive, are summarised.
    pub upto: u32,
    /// The hash of the summarising request, always.
    pub request_hash: RequestHash,
    /// The request itself, only when the operator records prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<ModelRequest>,
}

/// [`Event::CompactionCompleted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionCompleted {
    /// The step.
    pub step: u32,
    /// The cut, as in the intent.
    pub upto: u32,
    /// The summary, as the model wrote it.
    pub summary: String,
    /// Tokens used (counted against the token budgets, not the steps).
    pub usage: Usage,
    /// What the call cost. Omitted when the agent has no pricing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nanos: Option<u64>,
    /// The pricing the cost was computed with. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
}

/// [`Event::CompactionFailed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionFailed {
    /// The step.
    pub step: u32,
    /// The cut, as in the intent.
    pub upto: u32,
    /// What went wrong.
    pub error: ModelCallError,
}

/// [`Event::RunCancelled`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCancelled {
    /// Why. Omitted when none was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who cancelled it. Omitted when no one was named (an application's
    /// turn, a dropped handle) and in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The write left without a completion, if the log ended at one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved_write: Option<UnresolvedWrite>,
}

/// [`Event::ReconciliationRequired`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconciliationRequired {
    /// Why, for the human who must check.
    pub reason: String,
    /// Since when the log may be missing what the run did (milliseconds
    /// since the epoch): a backup's time. Omitted when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Who recorded it.
    pub by: String,
}

/// [`Event::Reconciled`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reconciled {
    /// Who checked.
    pub by: String,
    /// What they found. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The injected clock's reading when it was recorded (wall time stops
    /// while the run is parked, and goes on from a human's act). Omitted in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// [`Event::KeyReleased`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyReleased {
    /// The idempotency key.
    pub key: String,
    /// The call of this run that held it.
    pub call_id: CallId,
    /// Who released it.
    pub by: String,
    /// What they found. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// [`Event::KeySettled`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySettled {
    /// The idempotency key.
    pub key: String,
    /// The call of this run that held it.
    pub call_id: CallId,
    /// The call's output, as the operator found it: what later runs with
    /// the key get.
    pub output: Value,
    /// Who settled it.
    pub by: String,
    /// What they found. Omitted when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// [`Event::RunAbandoned`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAbandoned {
    /// Why.
    pub reason: String,
    /// Who abandoned it. Omitted in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The write left without a completion, if the log ended at one: the
    /// abandonment never claims to know what it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved_write: Option<UnresolvedWrite>,
}

/// A write intent with no completion, carried by a terminal event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnresolvedWrite {
    /// The call.
    pub call_id: CallId,
    /// The tool.
    pub tool: ToolRef,
    /// Its frozen arguments.
    pub arguments: Value,
}

impl From<&ToolCallIntent> for UnresolvedWrite {
    fn from(intent: &ToolCallIntent) -> Self {
        UnresolvedWrite {
            call_id: intent.call_id.clone(),
            tool: intent.tool.clone(),
            arguments: intent.arguments.clone(),
        }
    }
}

/// An event that cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The event was written by a newer format than this build reads.
    #[error(
        "event format version {found} is newer than this build reads (up to {supported}): upgrade warden to read this log"
    )]
    NewerFormat {
        /// The stored version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// The stored version is not one this build knows.
    #[error("event format version {found} is not known (this build reads 1 to {supported})")]
    UnknownFormat {
        /// The stored version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// The bytes are not an event of the stored version.
    #[error("malformed event{}: {message}", .kind.as_ref().map(|k| format!(" of type `{k}`")).unwrap_or_default())]
    Malformed {
        /// The `type` tag, when it could be read.
        kind: Option<String>,
        /// What the parser said.
        message: String,
    },
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    v: u32,
    event: &'a Event,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeV1 {
    v: u32,
    event: Event,
}

/// [`EnvelopeV1`] read with its event's `type` first, as [`encode`] writes
/// it (see [`TagFirst`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeTagFirst {
    v: u32,
    event: TagFirst,
}

/// An [`Event`] whose `type` is its first field, read in one pass. Serde's
/// derive for an internally tagged enum buffers every event whole before
/// it can look at the tag; here the tag is read first and the rest of the
/// object goes straight to the variant's own `Deserialize`, which refuses an
/// unknown field (a second `type` included) as the derive does. Anything
/// else (the tag later, an unknown tag) fails here, and [`decode`] reads it
/// again with the derive, so what decodes, and the errors, are the derive's.
struct TagFirst(Event);

impl<'de> Deserialize<'de> for TagFirst {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TagFirstVisitor)
    }
}

struct TagFirstVisitor;

/// The key `type`, read without allocating.
struct TypeKey;

impl<'de> Deserialize<'de> for TypeKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl serde::de::Visitor<'_> for KeyVisitor {
            type Value = TypeKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the key `type` first")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<TypeKey, E> {
                match key {
                    "type" => Ok(TypeKey),
                    _ => Err(E::custom("the key `type` is not first")),
                }
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

impl<'de> serde::de::Visitor<'de> for TagFirstVisitor {
    type Value = TagFirst;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an event object with its `type` first")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TagFirst, A::Error> {
        let Some(TypeKey) = map.next_key::<TypeKey>()? else {
            return Err(serde::de::Error::custom("an event without a `type`"));
        };
        let kind: EventKind = map.next_value()?;
        let rest = serde::de::value::MapAccessDeserializer::new(map);
        // One arm per kind; the match is exhaustive, so a new kind cannot
        // be left out.
        macro_rules! by_kind {
            ($($name:ident),*) => {
                match kind {
                    $(EventKind::$name => Event::$name(Deserialize::deserialize(rest)?),)*
                }
            };
        }
        Ok(TagFirst(every_kind!(by_kind)))
    }
}

#[derive(Deserialize)]
struct Probe {
    v: Option<u32>,
    event: Option<KindProbe>,
}

#[derive(Deserialize)]
struct KindProbe {
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// The bytes a store keeps for `event`: the current format version and the
/// event, as compact JSON.
pub fn encode(event: &Event) -> Vec<u8> {
    serde_json::to_vec(&EnvelopeOut {
        v: FORMAT_VERSION,
        event,
    })
    .expect("events serialize to JSON")
}

/// An event whose bytes could not be read back once stored: nested deeper
/// than decoding reads. Values from outside are bounded when accepted
/// ([`json_limits::MAX_DEPTH`]), so this refuses only what slipped past
/// that, before anything is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a `{kind}` event would be stored nested {depth} levels deep, and stored events are read back only to {limit}"
)]
pub struct Unrecordable {
    /// The event's type.
    pub kind: &'static str,
    /// How deeply its encoding nests.
    pub depth: usize,
    /// What decoding reads, [`json_limits::DECODE_DEPTH`].
    pub limit: usize,
}

/// [`encode`], refusing an event that [`decode`] could not read back.
pub fn encode_readable(event: &Event) -> Result<Vec<u8>, Unrecordable> {
    let bytes = encode(event);
    match json_limits::text_depth(&bytes) {
        depth if depth > json_limits::DECODE_DEPTH => Err(Unrecordable {
            kind: event.kind().as_str(),
            depth,
            limit: json_limits::DECODE_DEPTH,
        }),
        _ => Ok(bytes),
    }
}

/// Reads stored bytes back. A newer format is refused, never misread.
pub fn decode(bytes: &[u8]) -> Result<Event, EventError> {
    // The usual case, read in one pass: the current format, whole. Anything
    // else is read again below to say what it is (a replay reads every
    // event of a log, and probing first would parse each twice).
    if let Ok(envelope) = serde_json::from_slice::<EnvelopeTagFirst>(bytes)
        && envelope.v == 1
    {
        return Ok(envelope.event.0);
    }
    if let Ok(envelope) = serde_json::from_slice::<EnvelopeV1>(bytes)
        && envelope.v == 1
    {
        return Ok(envelope.event);
    }
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| EventError::Malformed {
        kind: None,
        message: e.to_string(),
    })?;
    let kind = probe.event.and_then(|e| e.kind);
    match probe.v {
        None => Err(EventError::Malformed {
            kind,
            message: "missing the format version `v`".into(),
        }),
        Some(found) if found > FORMAT_VERSION => Err(EventError::NewerFormat {
            found,
            supported: FORMAT_VERSION,
        }),
        Some(1) => serde_json::from_slice::<EnvelopeV1>(bytes)
            .map(|envelope| envelope.event)
            .map_err(|e| EventError::Malformed {
                kind,
                message: e.to_string(),
            }),
        Some(found) => Err(EventError::UnknownFormat {
            found,
            supported: FORMAT_VERSION,
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::budget::{BudgetKind, BudgetUsage};
    use serde_json::json;
    use warden_sandbox::{LeaseFailure, Outcome};

    pub(crate) fn receipt(fuel: u64) -> UsageReceipt {
        UsageReceipt {
            outcome: Outcome::Ok,
            fuel_consumed: fuel,
            peak_memory_bytes: 65536,
            wall_time_us: 1200,
            output_bytes: 20,
            stdout_bytes: 0,
            stderr_bytes: 0,
            log_bytes: 0,
            stdio_dropped_bytes: 0,
            denied_growth: None,
            network: None,
            unlisted: None,
            secrets: Vec::new(),
            bundle: None,
        }
    }

    fn fs_write() -> ToolRef {
        ToolRef {
            plugin: "fs".into(),
            tool: "write_file".into(),
        }
    }

    /// A field added after the first release is omitted when absent, so the
    /// bytes of events that lack it never change.
    #[test]
    fn run_started_carries_the_agent_file_only_when_known() {
        let started = RunStarted {
            run_id: RunId::new("r1").unwrap(),
            agent: "demo".into(),
            agent_digest: AgentDigest::from_hex("ab12"),
            input: json!("go"),
            labels: BTreeMap::new(),
            clock_seed_ms: 1,
            random_seed: 2,
            agent_file: Some("/agents/demo.toml".into()),
            session: None,
            limits: None,
            parent: None,
            mcp_tools: BTreeMap::new(),
        };
        let bytes = encode(&Event::RunStarted(started.clone()));
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"v":1,"event":{"type":"run_started","run_id":"r1","agent":"demo","agent_digest":"ab12","input":"go","clock_seed_ms":1,"random_seed":2,"agent_file":"/agents/demo.toml"}}"#
        );
        assert_eq!(decode(&bytes).unwrap(), Event::RunStarted(started));
    }

    /// A run in a session records the session and its history; the first
    /// run of a session records no history at all.
    #[test]
    fn run_started_in_a_session_carries_its_history() {
        let mut started = RunStarted {
            run_id: RunId::new("r3").unwrap(),
            agent: "demo".into(),
            agent_digest: AgentDigest::from_hex("ab12"),
            input: json!("and now?"),
            labels: BTreeMap::new(),
            clock_seed_ms: 1,
            random_seed: 2,
            agent_file: None,
            session: Some(SessionStart {
                session_id: SessionId::new("chat-1").unwrap(),
                position: 2,
                runs: vec![RunId::new("r1").unwrap()],
                history: vec![
                    Message::User {
                        content: "hello".into(),
                    },
                    Message::Assistant {
                        text: "hi".into(),
                        tool_calls: vec![],
                        blocks: vec![],
                    },
                ],
                chain: None,
            }),
            limits: None,
            parent: None,
            mcp_tools: BTreeMap::new(),
        };
        let bytes = encode(&Event::RunStarted(started.clone()));
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"v":1,"event":{"type":"run_started","run_id":"r3","agent":"demo","agent_digest":"ab12","input":"and now?","clock_seed_ms":1,"random_seed":2,"session":{"session_id":"chat-1","position":2,"runs":["r1"],"history":[{"role":"user","content":"hello"},{"role":"assistant","text":"hi"}]}}}"#
        );
        assert_eq!(decode(&bytes).unwrap(), Event::RunStarted(started.clone()));
        // What a run records now: its history by reference, the same size
        // however long the session.
        started.session = Some(SessionStart {
            session_id: SessionId::new("chat-1").unwrap(),
            position: 2,
            runs: vec![],
            history: vec![],
            chain: Some(HistoryChain {
                head: format!("sha256:{}", "ab".repeat(32)).parse().unwrap(),
                runs: 1,
                messages: 2,
            }),
        });
        let bytes = encode(&Event::RunStarted(started.clone()));
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            format!(
                r#"{{"v":1,"event":{{"type":"run_started","run_id":"r3","agent":"demo","agent_digest":"ab12","input":"and now?","clock_seed_ms":1,"random_seed":2,"session":{{"session_id":"chat-1","position":2,"chain":{{"head":"sha256:{}","runs":1,"messages":2}}}}}}}}"#,
                "ab".repeat(32)
            )
        );
        assert_eq!(decode(&bytes).unwrap(), Event::RunStarted(started.clone()));
        let bad_head = String::from_utf8(bytes)
            .unwrap()
            .replace("sha256:ab", "sha256:AB");
        assert!(decode(bad_head.as_bytes()).is_err());
        started.session = Some(SessionStart {
            session_id: SessionId::new("chat-1").unwrap(),
            position: 0,
            runs: vec![],
            history: vec![],
            chain: None,
        });
        let bytes = encode(&Event::RunStarted(started.clone()));
        assert!(
            String::from_utf8(bytes.clone())
                .unwrap()
                .ends_with(r#""random_seed":2,"session":{"session_id":"chat-1","position":0}}}"#)
        );
        assert_eq!(decode(&bytes).unwrap(), Event::RunStarted(started));
        let unknown = r#"{"v":1,"event":{"type":"run_started","run_id":"r3","agent":"demo","agent_digest":"ab12","input":"x","clock_seed_ms":1,"random_seed":2,"session":{"session_id":"chat-1","position":0,"extra":1}}}"#;
        assert!(decode(unknown.as_bytes()).is_err());
        let invalid = r#"{"v":1,"event":{"type":"run_started","run_id":"r3","agent":"demo","agent_digest":"ab12","input":"x","clock_seed_ms":1,"random_seed":2,"session":{"session_id":"a b","position":0}}}"#;
        assert!(decode(invalid.as_bytes()).is_err());
    }

    /// One sample of every kind, with its pinned bytes.
    fn samples() -> Vec<(Event, &'static str)> {
        vec![
            (
                Event::RunStarted(RunStarted {
                    run_id: RunId::new("r1").unwrap(),
                    agent: "demo".into(),
                    agent_digest: AgentDigest::from_hex("ab12"),
                    input: json!("read my notes"),
                    labels: BTreeMap::from([("team".into(), "ops".into())]),
                    clock_seed_ms: 1_700_000_000_000,
                    random_seed: 42,
                    agent_file: None,
                    session: None,
                    limits: None,
                    parent: None,
                    mcp_tools: Default::default(),
                }),
                r#"{"v":1,"event":{"type":"run_started","run_id":"r1","agent":"demo","agent_digest":"ab12","input":"read my notes","labels":{"team":"ops"},"clock_seed_ms":1700000000000,"random_seed":42}}"#,
            ),
            (
                Event::ModelCallIntent(ModelCallIntent {
                    step: 1,
                    attempt: 1,
                    request_hash: RequestHash::from_hex("cd34"),
                    request: None,
                    provider: None,
                    model: None,
                }),
                r#"{"v":1,"event":{"type":"model_call_intent","step":1,"attempt":1,"request_hash":"cd34"}}"#,
            ),
            (
                Event::ModelCallCompleted(ModelCallCompleted {
                    step: 1,
                    text: "Let me look.".into(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "fs__write_file".into(),
                        arguments: json!({"path": "a.txt", "content": "hi"}),
                    }],
                    blocks: vec![],
                    usage: Usage {
                        input_tokens: 120,
                        output_tokens: 9,
                    },
                    cost_nanos: Some(495_000),
                    pricing: Some(Pricing {
                        currency: "USD".into(),
                        input_micros_per_million: 3_000_000,
                        output_micros_per_million: 15_000_000,
                    }),
                    stop_reason: StopReason::ToolUse,
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"model_call_completed","step":1,"text":"Let me look.","tool_calls":[{"id":"c1","name":"fs__write_file","arguments":{"content":"hi","path":"a.txt"}}],"usage":{"input_tokens":120,"output_tokens":9},"cost_nanos":495000,"pricing":{"currency":"USD","input_micros_per_million":3000000,"output_micros_per_million":15000000},"stop_reason":"tool_use"}}"#,
            ),
            (
                Event::ModelCallFailed(ModelCallFailed {
                    step: 2,
                    error: ModelCallError {
                        transient: true,
                        message: "provider `p`: https://api.example.com answered 429: slow".into(),
                        status: Some(429),
                        retry_after_ms: Some(120_000),
                    },
                    at_ms: Some(1_700_000_000_000),
                    retry_at_ms: Some(1_700_000_120_000),
                }),
                r#"{"v":1,"event":{"type":"model_call_failed","step":2,"error":{"transient":true,"message":"provider `p`: https://api.example.com answered 429: slow","status":429,"retry_after_ms":120000},"at_ms":1700000000000,"retry_at_ms":1700000120000}}"#,
            ),
            (
                Event::ToolCallRejected(ToolCallRejected {
                    call_id: CallId::new(1, 2),
                    error: ToolCallError::UnknownTool {
                        name: "rm_rf".into(),
                    },
                }),
                r#"{"v":1,"event":{"type":"tool_call_rejected","call_id":"call-1-2","error":{"kind":"unknown_tool","name":"rm_rf"}}}"#,
            ),
            (
                Event::ToolCallIntent(ToolCallIntent {
                    call_id: CallId::new(1, 1),
                    tool: fs_write(),
                    arguments: json!({"path": "a.txt", "content": "hi"}),
                    effect: EffectClass::Write,
                    idempotency_key: "9f0e".into(),
                    keyed_by: None,
                }),
                r#"{"v":1,"event":{"type":"tool_call_intent","call_id":"call-1-1","tool":{"plugin":"fs","tool":"write_file"},"arguments":{"content":"hi","path":"a.txt"},"effect":"write","idempotency_key":"9f0e"}}"#,
            ),
            (
                Event::ToolCallCompleted(ToolCallCompleted {
                    call_id: CallId::new(1, 1),
                    result: ToolCallResult::Output(json!({"written": 2})),
                    receipt: receipt(1000),
                }),
                r#"{"v":1,"event":{"type":"tool_call_completed","call_id":"call-1-1","result":{"output":{"written":2}},"receipt":{"outcome":"ok","fuel_consumed":1000,"peak_memory_bytes":65536,"wall_time_us":1200,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0}}}"#,
            ),
            (
                Event::ToolCallResolved(ToolCallResolved {
                    call_id: CallId::new(1, 1),
                    by: "alice".into(),
                    output: json!({"written": 2}),
                    note: Some("file is there".into()),
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"tool_call_resolved","call_id":"call-1-1","by":"alice","output":{"written":2},"note":"file is there"}}"#,
            ),
            (
                Event::ApprovalRequested(ApprovalRequested {
                    call_id: CallId::new(1, 1),
                    tool: fs_write(),
                    effect: Some(EffectClass::Write),
                    preview: Some(Preview {
                        summary: "write 2 bytes to a.txt".into(),
                        detail: "+hi".into(),
                    }),
                    preflight_error: None,
                    receipt: Some(receipt(500)),
                    digest: Some(CallDigest::from_hex("0b")),
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"approval_requested","call_id":"call-1-1","tool":{"plugin":"fs","tool":"write_file"},"effect":"write","preview":{"summary":"write 2 bytes to a.txt","detail":"+hi"},"receipt":{"outcome":"ok","fuel_consumed":500,"peak_memory_bytes":65536,"wall_time_us":1200,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0},"digest":"0b"}}"#,
            ),
            (
                Event::ApprovalGranted(ApprovalGranted {
                    call_id: CallId::new(1, 1),
                    by: "alice".into(),
                    digest: None,
                    rule: None,
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"approval_granted","call_id":"call-1-1","by":"alice"}}"#,
            ),
            (
                Event::ApprovalDenied(ApprovalDenied {
                    call_id: CallId::new(1, 1),
                    by: "bob".into(),
                    reason: "not that file".into(),
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"approval_denied","call_id":"call-1-1","by":"bob","reason":"not that file"}}"#,
            ),
            (
                Event::Suspended(Suspended {
                    call_id: CallId::new(2, 1),
                    reason: "human tool `ask_operator`: {\"question\":\"which file?\"}".into(),
                    schema: json!({"type": "string"}),
                }),
                r#"{"v":1,"event":{"type":"suspended","call_id":"call-2-1","reason":"human tool `ask_operator`: {\"question\":\"which file?\"}","schema":{"type":"string"}}}"#,
            ),
            (
                Event::Resumed(Resumed {
                    input: json!("notes.txt"),
                    by: Some("alice".into()),
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"resumed","input":"notes.txt","by":"alice"}}"#,
            ),
            (
                Event::BudgetExceeded(BudgetOverrun {
                    budget: BudgetKind::Steps,
                    used: 10,
                    limit: 10,
                    needed: None,
                }),
                r#"{"v":1,"event":{"type":"budget_exceeded","budget":"steps","used":10,"limit":10}}"#,
            ),
            (
                Event::BudgetExtended(BudgetExtended {
                    limits: BudgetLimits {
                        steps: Some(20),
                        ..BudgetLimits::default()
                    },
                    by: None,
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"budget_extended","limits":{"steps":20}}}"#,
            ),
            (
                Event::ClockObserved(ClockObserved {
                    at_ms: 1_700_000_001_500,
                }),
                r#"{"v":1,"event":{"type":"clock_observed","at_ms":1700000001500}}"#,
            ),
            (
                Event::RandomObserved(RandomObserved { value: 7 }),
                r#"{"v":1,"event":{"type":"random_observed","value":7}}"#,
            ),
            (
                Event::RunCompleted(RunCompleted {
                    output: json!("The notes say hello."),
                    by_host: false,
                }),
                r#"{"v":1,"event":{"type":"run_completed","output":"The notes say hello."}}"#,
            ),
            (
                Event::RunFailed(RunFailed {
                    error: RunError::OutputTruncated { step: 3 },
                }),
                r#"{"v":1,"event":{"type":"run_failed","error":{"kind":"output_truncated","step":3}}}"#,
            ),
            (
                Event::RunCancelled(RunCancelled {
                    reason: Some("operator pressed ctrl-c".into()),
                    by: None,
                    unresolved_write: None,
                }),
                r#"{"v":1,"event":{"type":"run_cancelled","reason":"operator pressed ctrl-c"}}"#,
            ),

            (
                Event::RunAbandoned(RunAbandoned {
                    reason: "superseded".into(),
                    by: Some("alice".into()),
                    unresolved_write: Some(UnresolvedWrite {
                        call_id: CallId::new(1, 1),
                        tool: fs_write(),
                        arguments: json!({"path": "a.txt"}),
                    }),
                }),
                r#"{"v":1,"event":{"type":"run_abandoned","reason":"superseded","by":"alice","unresolved_write":{"call_id":"call-1-1","tool":{"plugin":"fs","tool":"write_file"},"arguments":{"path":"a.txt"}}}}"#,
            ),
            (
                Event::ToolCallAttemptFailed(ToolCallAttemptFailed {
                    call_id: CallId::new(1, 1),
                    attempt: 1,
                    error: ToolCallError::Failed {
                        message: "busy".into(),
                        retryable: true,
                    },
                    receipt: receipt(1000),
                    outcome_unknown: false,
                }),
                r#"{"v":1,"event":{"type":"tool_call_attempt_failed","call_id":"call-1-1","attempt":1,"error":{"kind":"failed","message":"busy","retryable":true},"receipt":{"outcome":"ok","fuel_consumed":1000,"peak_memory_bytes":65536,"wall_time_us":1200,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0}}}"#,
            ),
            (
                Event::ToolCallDeduplicated(ToolCallDeduplicated {
                    call_id: CallId::new(2, 1),
                    idempotency_key: "c0ffee".into(),
                    result: ToolCallResult::Output(json!({"paid": true})),
                    origin_run: RunId::new("r0").unwrap(),
                    origin_call: CallId::new(1, 1),
                }),
                r#"{"v":1,"event":{"type":"tool_call_deduplicated","call_id":"call-2-1","idempotency_key":"c0ffee","result":{"output":{"paid":true}},"origin_run":"r0","origin_call":"call-1-1"}}"#,
            ),
            (
                Event::ExternalCallRequested(ExternalCallRequested {
                    call_id: CallId::new(3, 1),
                    tool: "pay_invoice".into(),
                    arguments: json!({"invoice_id": "inv-1", "amount": 12}),
                    output_schema: json!({"type": "object"}),
                    must_match: vec!["invoice_id".into()],
                }),
                r#"{"v":1,"event":{"type":"external_call_requested","call_id":"call-3-1","tool":"pay_invoice","arguments":{"amount":12,"invoice_id":"inv-1"},"output_schema":{"type":"object"},"must_match":["invoice_id"]}}"#,
            ),
            (
                Event::ExternalCallCompleted(ExternalCallCompleted {
                    call_id: CallId::new(3, 1),
                    output: json!({"invoice_id": "inv-1", "status": "paid"}),
                    by: Some("billing-service".into()),
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"external_call_completed","call_id":"call-3-1","output":{"invoice_id":"inv-1","status":"paid"},"by":"billing-service"}}"#,
            ),
            (
                Event::OutputRejected(OutputRejected {
                    step: 2,
                    violation: "the output does not satisfy the schema: at `/count`: \"3\" is not of type \"integer\"".into(),
                }),
                r#"{"v":1,"event":{"type":"output_rejected","step":2,"violation":"the output does not satisfy the schema: at `/count`: \"3\" is not of type \"integer\""}}"#,
            ),
            (
                Event::ContextResolved(ContextResolved {
                    source: "notes".into(),
                    step: 1,
                    at_ms: 1_700_000_000_000,
                    items: vec![
                        ContextItem {
                            source: "todo.md".into(),
                            content: "- buy milk".into(),
                            size: 10,
                            modified_ms: Some(1_699_999_000_000),
                            truncated: false,
                        },
                        ContextItem {
                            source: "big.md".into(),
                            content: "abc".into(),
                            size: 9000,
                            modified_ms: None,
                            truncated: true,
                        },
                    ],
                    digest: "e3b0".into(),
                    receipt: receipt(300),
                }),
                r#"{"v":1,"event":{"type":"context_resolved","source":"notes","step":1,"at_ms":1700000000000,"items":[{"source":"todo.md","content":"- buy milk","size":10,"modified_ms":1699999000000},{"source":"big.md","content":"abc","size":9000,"truncated":true}],"digest":"e3b0","receipt":{"outcome":"ok","fuel_consumed":300,"peak_memory_bytes":65536,"wall_time_us":1200,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0}}}"#,
            ),
            (
                Event::ContextFailed(ContextFailed {
                    source: "memory".into(),
                    step: 2,
                    at_ms: 1_700_000_000_500,
                    error: ContextError::Denied {
                        message: "read /notes: permission denied".into(),
                    },
                    receipt: None,
                }),
                r#"{"v":1,"event":{"type":"context_failed","source":"memory","step":2,"at_ms":1700000000500,"error":{"kind":"denied","message":"read /notes: permission denied"}}}"#,
            ),
            (
                Event::CompactionIntent(CompactionIntent {
                    step: 7,
                    upto: 9,
                    request_hash: RequestHash::from_hex("ef56"),
                    request: None,
                }),
                r#"{"v":1,"event":{"type":"compaction_intent","step":7,"upto":9,"request_hash":"ef56"}}"#,
            ),
            (
                Event::CompactionCompleted(CompactionCompleted {
                    step: 7,
                    upto: 9,
                    summary: "Read todo.md: three open items.".into(),
                    usage: Usage {
                        input_tokens: 900,
                        output_tokens: 12,
                    },
                    cost_nanos: None,
                    pricing: None,
                }),
                r#"{"v":1,"event":{"type":"compaction_completed","step":7,"upto":9,"summary":"Read todo.md: three open items.","usage":{"input_tokens":900,"output_tokens":12}}}"#,
            ),
            (
                Event::CompactionFailed(CompactionFailed {
                    step: 7,
                    upto: 9,
                    error: ModelCallError {
                        transient: false,
                        message: "the model returned an empty summary".into(),
                        status: None,
                        retry_after_ms: None,
                    },
                }),
                r#"{"v":1,"event":{"type":"compaction_failed","step":7,"upto":9,"error":{"transient":false,"message":"the model returned an empty summary"}}}"#,
            ),
            (
                Event::DeliveryIntent(DeliveryIntent {
                    delivery_id: "r1/outbox/12".into(),
                    channel: "outbox".into(),
                    source: 12,
                    kind: "completed".into(),
                    payload: json!({"agent": "demo", "position": 12, "event": {"type": "run_completed", "output": "done"}}),
                }),
                r#"{"v":1,"event":{"type":"delivery_intent","delivery_id":"r1/outbox/12","channel":"outbox","source":12,"kind":"completed","payload":{"agent":"demo","event":{"output":"done","type":"run_completed"},"position":12}}}"#,
            ),
            (
                Event::DeliveryAttemptFailed(DeliveryAttemptFailed {
                    delivery_id: "r1/outbox/12".into(),
                    attempt: 1,
                    error: DeliveryError::Rejected {
                        status: 503,
                        message: "busy".into(),
                    },
                    receipt: receipt(300),
                    retry_at_ms: 1_700_000_001_000,
                }),
                r#"{"v":1,"event":{"type":"delivery_attempt_failed","delivery_id":"r1/outbox/12","attempt":1,"error":{"kind":"rejected","status":503,"message":"busy"},"receipt":{"outcome":"ok","fuel_consumed":300,"peak_memory_bytes":65536,"wall_time_us":1200,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0},"retry_at_ms":1700000001000}}"#,
            ),
            (
                Event::DeliveryCompleted(DeliveryCompleted {
                    delivery_id: "r1/outbox/12".into(),
                    attempt: 2,
                    receipt: receipt(400),
                }),
                r#"{"v":1,"event":{"type":"delivery_completed","delivery_id":"r1/outbox/12","attempt":2,"receipt":{"outcome":"ok","fuel_consumed":400,"peak_memory_bytes":65536,"wall_time_us":1200,"output_bytes":20,"stdout_bytes":0,"stderr_bytes":0,"log_bytes":0,"stdio_dropped_bytes":0}}}"#,
            ),
            (
                Event::DeliveryFailed(DeliveryFailed {
                    delivery_id: "r1/outbox/12".into(),
                    attempts: 3,
                    error: DeliveryError::Failed {
                        message: "disk full".into(),
                        retryable: true,
                    },
                    receipt: None,
                }),
                r#"{"v":1,"event":{"type":"delivery_failed","delivery_id":"r1/outbox/12","attempts":3,"error":{"kind":"failed","message":"disk full","retryable":true}}}"#,
            ),
            (
                Event::PolicyDecided(PolicyDecided {
                    hook: PolicyHook::BeforeToolCall,
                    step: None,
                    call_id: Some(CallId::new(1, 2)),
                    policy: "no-deletes".into(),
                    decision: PolicyVerdict::Deny,
                    reason: Some("deleting is not allowed".into()),
                    receipt: None,
                }),
                r#"{"v":1,"event":{"type":"policy_decided","hook":"before_tool_call","call_id":"call-1-2","policy":"no-deletes","decision":"deny","reason":"deleting is not allowed"}}"#,
            ),
            (
                Event::ReconciliationRequired(ReconciliationRequired {
                    reason: "restored from a backup".into(),
                    since_ms: Some(1_700_000_000_000),
                    by: "ops".into(),
                }),
                r#"{"v":1,"event":{"type":"reconciliation_required","reason":"restored from a backup","since_ms":1700000000000,"by":"ops"}}"#,
            ),
            (
                Event::Reconciled(Reconciled {
                    by: "ops".into(),
                    note: None,
                    at_ms: None,
                }),
                r#"{"v":1,"event":{"type":"reconciled","by":"ops"}}"#,
            ),
            (
                Event::WaitStarted(WaitStarted {
                    step: 2,
                    since_ms: 1_700_000_000_000,
                    until_ms: 1_700_000_120_000,
                }),
                r#"{"v":1,"event":{"type":"wait_started","step":2,"since_ms":1700000000000,"until_ms":1700000120000}}"#,
            ),
            (
                Event::WaitEnded(WaitEnded {
                    at_ms: 1_700_000_120_250,
                }),
                r#"{"v":1,"event":{"type":"wait_ended","at_ms":1700000120250}}"#,
            ),
            (
                Event::KeyReleased(KeyReleased {
                    key: "k-1".into(),
                    call_id: CallId::from_text("call-1-1"),
                    by: "ops".into(),
                    note: Some("never paid".into()),
                }),
                r#"{"v":1,"event":{"type":"key_released","key":"k-1","call_id":"call-1-1","by":"ops","note":"never paid"}}"#,
            ),
            (
                Event::KeySettled(KeySettled {
                    key: "k-1".into(),
                    call_id: CallId::from_text("call-1-1"),
                    output: serde_json::json!({ "paid": true }),
                    by: "ops".into(),
                    note: None,
                }),
                r#"{"v":1,"event":{"type":"key_settled","key":"k-1","call_id":"call-1-1","output":{"paid":true},"by":"ops"}}"#,
            ),
            (
                Event::RunForked(RunForked {
                    run_id: RunId::new("r2").unwrap(),
                    source_run: RunId::new("r1").unwrap(),
                    position: 7,
                    source_head: "ab".into(),
                    agent_digest: AgentDigest::from_hex("cd"),
                    agent_file: None,
                    limits: RecordedLimits {
                        budgets: BudgetLimits {
                            steps: Some(3),
                            ..BudgetLimits::default()
                        },
                        max_input_bytes: 100,
                        currency: None,
                        ceilings: None,
                    },
                    changed: vec!["budgets".into()],
                    withdrawn_approval: Some(CallId::from_text("call-2-0")),
                    by: "ops".into(),
                    at_ms: 5,
                }),
                r#"{"v":1,"event":{"type":"run_forked","run_id":"r2","source_run":"r1","position":7,"source_head":"ab","agent_digest":"cd","limits":{"budgets":{"steps":3},"max_input_bytes":100},"changed":["budgets"],"withdrawn_approval":"call-2-0","by":"ops","at_ms":5}}"#,
            ),
            (
                Event::ChildStarted(ChildStarted {
                    call_id: CallId::new(1, 1),
                    child_run: RunId::new("r1.call-1-1").unwrap(),
                    agent: "worker".into(),
                    agent_digest: AgentDigest::from_hex("cd"),
                    input: json!({"task": "t"}),
                    budgets: BudgetLimits {
                        steps: Some(3),
                        ..BudgetLimits::default()
                    },
                    capped: vec![BudgetKind::Steps],
                }),
                r#"{"v":1,"event":{"type":"child_started","call_id":"call-1-1","child_run":"r1.call-1-1","agent":"worker","agent_digest":"cd","input":{"task":"t"},"budgets":{"steps":3},"capped":["steps"]}}"#,
            ),
            (
                Event::ChildParked(ChildParked {
                    call_id: CallId::new(1, 1),
                    child_run: RunId::new("r1.call-1-1").unwrap(),
                    status: crate::status::RunStatus::AwaitingApproval,
                }),
                r#"{"v":1,"event":{"type":"child_parked","call_id":"call-1-1","child_run":"r1.call-1-1","status":"awaiting_approval"}}"#,
            ),
            (
                Event::ChildFinished(ChildFinished {
                    call_id: CallId::new(1, 1),
                    child_run: RunId::new("r1.call-1-1").unwrap(),
                    status: crate::status::RunStatus::Completed,
                    result: ToolCallResult::Output(json!({"done": true})),
                    usage: BudgetUsage {
                        steps: 2,
                        ..BudgetUsage::default()
                    },
                }),
                r#"{"v":1,"event":{"type":"child_finished","call_id":"call-1-1","child_run":"r1.call-1-1","status":"completed","result":{"output":{"done":true}},"usage":{"steps":2,"input_tokens":0,"output_tokens":0,"cost_nanos":0,"tool_calls":0,"fuel":0,"wall_time_ms":0}}}"#,
            ),
            (
                Event::ApprovalWithdrawn(ApprovalWithdrawn {
                    call_id: CallId::new(1, 1),
                    reason: WithdrawReason::DigestMismatch,
                    approved: Some(CallDigest::from_hex("0a")),
                    call: CallDigest::from_hex("0b"),
                    rule: None,
                    at_ms: Some(6),
                }),
                r#"{"v":1,"event":{"type":"approval_withdrawn","call_id":"call-1-1","reason":"digest_mismatch","approved":"0a","call":"0b","at_ms":6}}"#,
            ),
        ]
    }

    /// Fails to compile when a kind is added without a place in `ALL`.
    fn position_in_all(kind: EventKind) -> usize {
        match kind {
            EventKind::RunStarted => 0,
            EventKind::ModelCallIntent => 1,
            EventKind::ModelCallCompleted => 2,
            EventKind::ModelCallFailed => 3,
            EventKind::ToolCallRejected => 4,
            EventKind::ToolCallIntent => 5,
            EventKind::ToolCallCompleted => 6,
            EventKind::ToolCallResolved => 7,
            EventKind::ApprovalRequested => 8,
            EventKind::ApprovalGranted => 9,
            EventKind::ApprovalDenied => 10,
            EventKind::Suspended => 11,
            EventKind::Resumed => 12,
            EventKind::BudgetExceeded => 13,
            EventKind::BudgetExtended => 14,
            EventKind::ClockObserved => 15,
            EventKind::RandomObserved => 16,
            EventKind::RunCompleted => 17,
            EventKind::RunFailed => 18,
            EventKind::RunCancelled => 19,
            EventKind::RunAbandoned => 20,
            EventKind::ToolCallAttemptFailed => 21,
            EventKind::ToolCallDeduplicated => 22,
            EventKind::ExternalCallRequested => 23,
            EventKind::ExternalCallCompleted => 24,
            EventKind::OutputRejected => 25,
            EventKind::ContextResolved => 26,
            EventKind::ContextFailed => 27,
            EventKind::CompactionIntent => 28,
            EventKind::CompactionCompleted => 29,
            EventKind::CompactionFailed => 30,
            EventKind::DeliveryIntent => 31,
            EventKind::DeliveryAttemptFailed => 32,
            EventKind::DeliveryCompleted => 33,
            EventKind::DeliveryFailed => 34,
            EventKind::PolicyDecided => 35,
            EventKind::ReconciliationRequired => 36,
            EventKind::Reconciled => 37,
            EventKind::WaitStarted => 38,
            EventKind::WaitEnded => 39,
            EventKind::KeyReleased => 40,
            EventKind::KeySettled => 41,
            EventKind::RunForked => 42,
            EventKind::ChildStarted => 43,
            EventKind::ChildParked => 44,
            EventKind::ChildFinished => 45,
            EventKind::ApprovalWithdrawn => 46,
        }
    }

    #[test]
    fn a_model_call_failure_written_before_retry_times_still_decodes() {
        let old = br#"{"v":1,"event":{"type":"model_call_failed","step":2,"error":{"transient":true,"message":"busy","status":503}}}"#;
        match decode(old).unwrap() {
            Event::ModelCallFailed(f) => {
                assert_eq!(
                    (f.at_ms, f.retry_at_ms, f.error.retry_after_ms),
                    (None, None, None)
                );
                assert_eq!(encode(&Event::ModelCallFailed(f)), old.to_vec());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_automatic_approval_names_its_rule_and_creator() {
        let (event, pinned) = (
            Event::ApprovalGranted(ApprovalGranted {
                call_id: CallId::new(1, 1),
                by: "rule:rule-1".into(),
                digest: Some(CallDigest::from_hex("0b")),
                rule: Some(GrantingRule {
                    id: "rule-1".into(),
                    created_by: "api:ops".into(),
                }),
                at_ms: Some(5),
            }),
            r#"{"v":1,"event":{"type":"approval_granted","call_id":"call-1-1","by":"rule:rule-1","digest":"0b","rule":{"id":"rule-1","created_by":"api:ops"},"at_ms":5}}"#,
        );
        assert_eq!(String::from_utf8(encode(&event)).unwrap(), pinned);
        assert_eq!(decode(pinned.as_bytes()).unwrap(), event);
    }

    #[test]
    fn every_kind_has_pinned_bytes() {
        for (event, pinned) in samples() {
            let bytes = encode(&event);
            assert_eq!(
                String::from_utf8(bytes).unwrap(),
                pinned,
                "{} changed its bytes",
                event.kind()
            );
        }
    }

    #[test]
    fn conformance_every_kind_round_trips_and_none_is_uncovered() {
        let samples = samples();
        assert_eq!(EventKind::ALL.len(), 47, "a kind was added or removed");
        assert_eq!(samples.len(), EventKind::ALL.len());
        for (i, kind) in EventKind::ALL.iter().enumerate() {
            assert_eq!(position_in_all(*kind), i);
            // The serde tag and `as_str` agree.
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                json!(kind.as_str()),
                "{kind}"
            );
        }
        let kinds: Vec<EventKind> = samples.iter().map(|(e, _)| e.kind()).collect();
        assert_eq!(kinds, EventKind::ALL, "one sample per kind, in order");
        for (event, pinned) in samples {
            let decoded = decode(pinned.as_bytes()).unwrap();
            assert_eq!(decoded, event);
            assert_eq!(encode(&decoded), pinned.as_bytes());
            assert!(pinned.contains(&format!("\"type\":\"{}\"", event.kind())));
        }
    }

    /// What the one-pass read of a tag-first event accepts, and how it
    /// reads it, is the derive's: every kind, and the variants of the
    /// bytes that only the derive reads or that both refuse.
    #[test]
    fn the_tag_first_read_agrees_with_the_derive() {
        let derived = |bytes: &str| {
            serde_json::from_slice::<EnvelopeV1>(bytes.as_bytes()).map(|e| (e.v, e.event))
        };
        let tag_first = |bytes: &str| {
            serde_json::from_slice::<EnvelopeTagFirst>(bytes.as_bytes()).map(|e| (e.v, e.event.0))
        };
        for (event, pinned) in samples() {
            assert_eq!(tag_first(pinned).unwrap(), (1, event.clone()), "{pinned}");
            assert_eq!(decode(pinned.as_bytes()).unwrap(), event);
        }
        let kind = r#""type":"model_call_intent""#;
        let fields = r#""step":3,"attempt":2,"request_hash":"ff""#;
        // The tag later in the object: only the derive reads it, and
        // `decode` reads it with the derive.
        let later = format!(r#"{{"v":1,"event":{{{fields},{kind}}}}}"#);
        assert!(tag_first(&later).is_err());
        assert_eq!(
            decode(later.as_bytes()).unwrap(),
            derived(&later).unwrap().1
        );
        // Refused by both, and `decode` says what the derive says.
        for refused in [
            format!(r#"{{"v":1,"event":{{{kind},{fields},{kind}}}}}"#),
            format!(r#"{{"v":1,"event":{{{kind},{fields},"extra":1}}}}"#),
            format!(r#"{{"v":1,"event":{{{kind},"step":3}}}}"#),
            format!(r#"{{"v":1,"event":{{"type":"no_such_kind",{fields}}}}}"#),
            format!(r#"{{"v":1,"event":{{{kind},{fields}}},"extra":1}}"#),
            format!(r#"{{"v":1,"event":{{{kind},{fields}}}}} trailing"#),
        ] {
            assert!(tag_first(&refused).is_err(), "{refused}");
            let why = derived(&refused).map(|_| ()).unwrap_err().to_string();
            match decode(refused.as_bytes()) {
                Err(EventError::Malformed { message, .. }) => assert_eq!(message, why, "{refused}"),
                other => panic!("{refused}: {other:?}"),
            }
        }
        let not_a_tag = format!(r#"{{"v":1,"event":{{"type":7,{fields}}}}}"#);
        assert!(tag_first(&not_a_tag).is_err());
        assert!(matches!(
            decode(not_a_tag.as_bytes()),
            Err(EventError::Malformed { .. })
        ));
    }

    #[test]
    fn optional_fields_are_omitted_and_old_bytes_stay_identical() {
        // An event written before an optional field existed decodes and
        // re-encodes to the same bytes.
        let old = r#"{"v":1,"event":{"type":"model_call_intent","step":3,"attempt":2,"request_hash":"ff"}}"#;
        assert_eq!(encode(&decode(old.as_bytes()).unwrap()), old.as_bytes());
        // With prompts recorded, the request rides along.
        let with_request = Event::ModelCallIntent(ModelCallIntent {
            step: 1,
            attempt: 1,
            request_hash: RequestHash::from_hex("ff"),
            request: Some(ModelRequest {
                model: "m".into(),
                instructions: "i".into(),
                context: String::new(),
                messages: vec![],
                tools: vec![],
                max_tokens: 5,
            }),
            provider: Some("openai".into()),
            model: Some("m".into()),
        });
        assert_eq!(
            String::from_utf8(encode(&with_request)).unwrap(),
            r#"{"v":1,"event":{"type":"model_call_intent","step":1,"attempt":1,"request_hash":"ff","request":{"model":"m","instructions":"i","messages":[],"tools":[],"max_tokens":5},"provider":"openai","model":"m"}}"#
        );
    }

    #[test]
    fn a_host_supplied_output_and_an_invalid_output_are_pinned() {
        let by_host = Event::RunCompleted(RunCompleted {
            output: json!({"title": "notes", "count": 3}),
            by_host: true,
        });
        assert_eq!(
            String::from_utf8(encode(&by_host)).unwrap(),
            r#"{"v":1,"event":{"type":"run_completed","output":{"count":3,"title":"notes"},"by_host":true}}"#
        );
        let failed = Event::RunFailed(RunFailed {
            error: RunError::OutputInvalid {
                step: 3,
                violation:
                    "the final answer is not a JSON value: expected value at line 1 column 1".into(),
            },
        });
        let pinned = r#"{"v":1,"event":{"type":"run_failed","error":{"kind":"output_invalid","step":3,"violation":"the final answer is not a JSON value: expected value at line 1 column 1"}}}"#;
        assert_eq!(String::from_utf8(encode(&failed)).unwrap(), pinned);
        assert_eq!(decode(pinned.as_bytes()).unwrap(), failed);
    }

    #[test]
    fn policy_decisions_and_failures_are_pinned_at_every_hook() {
        let cases = [
            (
                PolicyDecided {
                    hook: PolicyHook::RunStart,
                    step: None,
                    call_id: None,
                    policy: "audit".into(),
                    decision: PolicyVerdict::Allow,
                    reason: None,
                    receipt: None,
                },
                r#"{"v":1,"event":{"type":"policy_decided","hook":"run_start","policy":"audit","decision":"allow"}}"#,
            ),
            (
                PolicyDecided {
                    hook: PolicyHook::BeforeFinish,
                    step: Some(3),
                    call_id: None,
                    policy: "reviewer".into(),
                    decision: PolicyVerdict::Feedback,
                    reason: Some("cite the file".into()),
                    receipt: None,
                },
                r#"{"v":1,"event":{"type":"policy_decided","hook":"before_finish","step":3,"policy":"reviewer","decision":"feedback","reason":"cite the file"}}"#,
            ),
            (
                PolicyDecided {
                    hook: PolicyHook::AfterResponse,
                    step: Some(1),
                    call_id: None,
                    policy: "audit".into(),
                    decision: PolicyVerdict::Failed,
                    reason: Some("the policy panicked: bug".into()),
                    receipt: None,
                },
                r#"{"v":1,"event":{"type":"policy_decided","hook":"after_response","step":1,"policy":"audit","decision":"failed","reason":"the policy panicked: bug"}}"#,
            ),
        ];
        for (decided, pinned) in cases {
            let event = Event::PolicyDecided(decided);
            assert_eq!(String::from_utf8(encode(&event)).unwrap(), pinned);
            assert_eq!(decode(pinned.as_bytes()).unwrap(), event);
        }
        let failed = Event::RunFailed(RunFailed {
            error: RunError::PolicyDenied {
                policy: "audit".into(),
                hook: PolicyHook::RunStart,
                reason: "not on weekends".into(),
            },
        });
        assert_eq!(
            String::from_utf8(encode(&failed)).unwrap(),
            r#"{"v":1,"event":{"type":"run_failed","error":{"kind":"policy_denied","policy":"audit","hook":"run_start","reason":"not on weekends"}}}"#
        );
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        let cases = [
            (
                r#"{"v":1,"event":{"type":"clock_observed","at_ms":1,"extra":true}}"#,
                "malformed event of type `clock_observed`: unknown field `extra`",
            ),
            (
                r#"{"v":1,"event":{"type":"run_exploded"}}"#,
                "malformed event of type `run_exploded`: unknown variant `run_exploded`",
            ),
            (
                r#"{"v":1,"event":{"type":"random_observed","value":1},"x":1}"#,
                "unknown field `x`",
            ),
            (
                r#"{"event":{"type":"random_observed","value":1}}"#,
                "missing the format version",
            ),
            (
                r#"{"v":1,"event":{"type":"tool_call_rejected","call_id":"c","error":{"kind":"unknown_tool","name":"x","why":"y"}}}"#,
                "unknown field `why`",
            ),
            ("not json", "malformed event: expected ident"),
        ];
        for (bytes, expected) in cases {
            let err = decode(bytes.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(expected), "{bytes}: {err}");
        }
    }

    #[test]
    fn a_newer_format_is_refused_not_misread() {
        // Even an event that would parse as a v1 event is refused.
        let newer = r#"{"v":2,"event":{"type":"random_observed","value":1}}"#;
        let err = decode(newer.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                EventError::NewerFormat {
                    found: 2,
                    supported: 1
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("upgrade warden"), "{err}");
        let zero = r#"{"v":0,"event":{"type":"random_observed","value":1}}"#;
        assert!(matches!(
            decode(zero.as_bytes()).unwrap_err(),
            EventError::UnknownFormat { found: 0, .. }
        ));
    }

    #[test]
    fn invocation_outcomes_become_typed_results() {
        let ok: Result<Result<wit::ToolOutput, wit::ToolError>, LeaseError> =
            Ok(Ok(wit::ToolOutput {
                content: r#"{"a":1}"#.into(),
            }));
        assert_eq!(
            ToolCallResult::from_invocation(&ok),
            ToolCallResult::Output(json!({"a": 1}))
        );
        let not_json = Ok(Ok(wit::ToolOutput {
            content: "{".into(),
        }));
        assert!(matches!(
            ToolCallResult::from_invocation(&not_json),
            ToolCallResult::Error(ToolCallError::InvalidOutput { .. })
        ));
        let failed = Ok(Err(wit::ToolError::Failed(wit::Failure {
            message: "disk full".into(),
            retryable: true,
        })));
        assert_eq!(
            ToolCallResult::from_invocation(&failed),
            ToolCallResult::Error(ToolCallError::Failed {
                message: "disk full".into(),
                retryable: true
            })
        );
        let lease = Err(LeaseError {
            plugin: "fs".into(),
            operation: "tool `write_file`".into(),
            failure: LeaseFailure::OutOfFuel { limit: 10 },
        });
        let ToolCallResult::Error(ToolCallError::LeaseFailed { outcome, message }) =
            ToolCallResult::from_invocation(&lease)
        else {
            panic!("a lease failure is a lease_failed error");
        };
        assert_eq!(outcome, Outcome::OutOfFuel);
        assert_eq!(
            message,
            "plugin `fs` tool `write_file` ran out of fuel (limit 10)"
        );
    }

    /// What [`encode_readable`] lets through decodes; one level more is
    /// refused before it could be stored.
    #[test]
    fn encode_readable_refuses_exactly_what_decode_cannot_read() {
        let completed = |levels: usize| {
            let output = (0..levels).fold(json!(1), |inner, _| json!([inner]));
            Event::RunCompleted(RunCompleted {
                output,
                by_host: false,
            })
        };
        // The output sits two levels down: {"v":1,"event":{…,"output":…}}.
        let deepest = completed(json_limits::DECODE_DEPTH - 2);
        let bytes = encode_readable(&deepest).unwrap();
        assert_eq!(decode(&bytes).unwrap(), deepest);
        let refused = encode_readable(&completed(json_limits::DECODE_DEPTH - 1)).unwrap_err();
        assert_eq!(
            refused,
            Unrecordable {
                kind: "run_completed",
                depth: json_limits::DECODE_DEPTH + 1,
                limit: json_limits::DECODE_DEPTH,
            }
        );
        assert!(decode(&encode(&completed(json_limits::DECODE_DEPTH - 1))).is_err());
    }
}
