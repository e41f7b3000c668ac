//! Folding a run's log into its state: [`fold`] (and [`RunState::apply`],
//! one event at a time) is pure, and rejects impossible sequences with a
//! [`FoldError`] naming the position. [`RunStatus`] and the conversation the
//! model sees are derived from the state, so from the log alone.
//!
//! Rules the fold enforces, among others: `run_started` first and only
//! there; nothing after a terminal event but deliveries (their own lane,
//! which never changes the status); one effect in flight at a time;
//! tool calls of a model turn settled in order, each intent matching the
//! model's call (same tool, same frozen arguments, the derived idempotency
//! key); completions only for intents in flight; approvals only for pending
//! requests; a model call only once every tool call of the previous turn is
//! settled; terminal events carrying exactly the dangling write, if any.

mod approvals;
mod children;
mod deliveries;
mod lifecycle;
mod model_calls;
mod policies;
mod tool_calls;

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::budget::{
    BudgetKind, BudgetLimits, BudgetOverrun, BudgetUsage, ExtensionError, RecordedLimits,
    parse_extension,
};
use super::ceilings::RunCeilings;
use super::channels::Deliveries;
use super::compaction::CompactionProgress;
use super::context::ContextState;
use super::events::{
    BudgetExtended, Event, EventKind, ExternalCallRequested, GrantingRule, ModelCallError,
    ReconciliationRequired, Resumed, RunAbandoned, RunCancelled, RunCompleted, RunFailed,
    RunForked, RunStarted, ToolCallError, ToolCallIntent, ToolCallResult,
};
use super::ids::{AgentDigest, CallDigest, CallId, RequestHash, RunId, SessionId};
use super::policy_hooks::{PolicyHook, PolicyPoint, RecordedDecision, denial_result};
use super::schema::{self, SchemaError};
use super::status::RunStatus;
use super::tool_errors::compact_tool_error;
pub use deliveries::{next_delivery, owed_count};
use warden_plugins::grant::EffectClass;
use warden_providers::{Message, StopReason, ToolCall};

/// The state of a run, folded from its log.
#[derive(Clone, Debug, PartialEq)]
pub struct RunState {
    /// The run.
    pub run_id: RunId,
    /// The agent's name.
    pub agent: String,
    /// The digest of the agent's definition when the run started.
    pub agent_digest: AgentDigest,
    /// The run's input.
    pub input: Value,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The clock reading the run started at.
    pub clock_seed_ms: u64,
    /// The seed of its randomness.
    pub random_seed: u64,
    /// How many events were folded: the position of the next event.
    pub event_count: usize,
    /// What it has used.
    pub usage: BudgetUsage,
    /// The limits in force when it started, as recorded (`None` in logs
    /// written before they were recorded).
    pub limits: Option<RecordedLimits>,
    /// Budget limits raised by humans, replacing the agent's.
    pub extensions: BudgetLimits,
    /// The latest clock reading, in milliseconds since the Unix epoch.
    pub last_clock_ms: Option<u64>,
    /// Whether the latest event is a clock reading (so wall time is current).
    pub clock_fresh: bool,
    /// Random values drawn, in order.
    pub random_values: Vec<u64>,
    /// The model's turns, one per completed step.
    pub turns: Vec<Turn>,
    /// The model call in progress, or the last one's failure.
    pub model_call: ModelCallProgress,
    /// The wait the last failure parked the run on (`wait_started`), and
    /// whether it ended; cleared by the next model call intent.
    pub wait: Option<RetryWait>,
    /// The budget the run is parked on.
    pub budget_exceeded: Option<BudgetOverrun>,
    /// How the run ended.
    pub terminal: Option<Terminal>,
    /// The session the run was started in, if any.
    pub session_id: Option<SessionId>,
    /// Its place in the session (from 0), if in one.
    pub session_position: Option<u64>,
    /// The earlier completed runs of the session whose transcripts are this
    /// run's history, oldest first (recorded in `run_started`).
    pub history_runs: Vec<RunId>,
    /// What the log recorded of each context source, by name: its latest
    /// resolution or failure.
    pub context: BTreeMap<String, ContextState>,
    /// Tool calls rejected in a row for the model's own mistake (unknown
    /// tool, arguments failing the schema, a missing key argument); any
    /// call that goes ahead resets it.
    pub invalid_calls_in_a_row: u32,
    /// The last such rejection, as the model saw it.
    pub last_invalid_call: Option<String>,
    /// Summaries of older history, in flight, done and failed.
    pub compaction: CompactionProgress,
    /// Final answers sent back for violating the output schema.
    pub output_rejections: u32,
    /// Its deliveries to channels: a lane of their own that never changes
    /// the status and goes on after a terminal event.
    pub deliveries: Deliveries,
    /// Policy decisions, by the point they were made at, in log order.
    policy_decisions: HashMap<PolicyPoint, Vec<RecordedDecision>>,
    /// The conversation, appended to as events settle (it only grows: turns
    /// and tool results come in log order). It opens with the session
    /// history recorded in `run_started`, `history_len` messages.
    messages: Vec<Message>,
    /// How many messages of `messages` are the session history.
    history_len: usize,
    /// The last tool error shown to the model, whole, and how many times in
    /// a row it came back: repeats are collapsed to one line.
    last_tool_error: Option<(String, u32)>,
    /// What a human must check before the run goes on, when its log may be
    /// missing what it did (a restore): set by `reconciliation_required`,
    /// cleared by `reconciled`.
    hold: Option<ReconciliationRequired>,
    /// Where the run was forked from, when it is a fork: the latest
    /// `run_forked` (a fork of a fork inherits its source's too).
    pub fork: Option<RunForked>,
    /// Child runs the run has started (`child_started`), for the
    /// `children_per_run` ceiling.
    pub children_started: u32,
    /// How many calls of the latest turn have their results in
    /// `messages`: results are appended in the model's order, so a call of
    /// a parallel batch settled before an earlier one waits for it.
    results_shown: usize,
}

/// A run parked until a failed model call's next attempt is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryWait {
    /// The step whose model call waits.
    pub step: u32,
    /// Since when (the failure's time).
    pub since_ms: u64,
    /// The wake-up time.
    pub until_ms: u64,
    /// When a driver took the run up again (`wait_ended`), if it did.
    pub ended_ms: Option<u64>,
}

/// One completed model call and its tool calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// The step, from 1.
    pub step: u32,
    /// The model's text.
    pub text: String,
    /// Why the model stopped.
    pub stop_reason: StopReason,
    /// Its tool calls, in order.
    pub calls: Vec<ToolCallState>,
    /// Whether a final answer (no tool calls) was sent back to the model
    /// (its output was rejected), so the run goes on with another step.
    pub continued: bool,
}

/// One tool call of a turn.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallState {
    /// The engine's id for it.
    pub call_id: CallId,
    /// The call as the model made it (with the provider's id).
    pub call: ToolCall,
    /// How far it got.
    pub progress: ToolCallProgress,
    /// Attempts that failed while it was in flight (retried, or a write's
    /// unknown outcome).
    pub failed_attempts: u32,
}

impl ToolCallState {
    /// What an approval of this call binds to: its tool and its frozen
    /// arguments, as the log recorded them.
    pub fn digest(&self) -> CallDigest {
        CallDigest::of_call(&self.call.name, &self.call.arguments)
    }
}

/// How far a tool call got.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolCallProgress {
    /// Nothing recorded yet.
    Pending,
    /// Waiting for a human's approval.
    AwaitingApproval,
    /// Approved; not yet run.
    Approved {
        /// Who approved.
        by: String,
        /// The digest the approval names (none in logs written before
        /// approvals were bound): it approves the call only if it is the
        /// call's own ([`ToolCallState::digest`]).
        digest: Option<CallDigest>,
        /// The standing rule that granted it, if automatic.
        rule: Option<GrantingRule>,
    },
    /// Suspended for a human's input.
    Suspended {
        /// Why.
        reason: String,
        /// The schema the input must satisfy.
        schema: Value,
    },
    /// The intent is recorded and has no completion.
    InFlight(ToolCallIntent),
    /// Refused before anything ran. Settled.
    Rejected(ToolCallError),
    /// Denied by a policy before it ran. Settled.
    PolicyDenied {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// Denied by a human. Settled.
    Denied {
        /// Who denied.
        by: String,
        /// Why.
        reason: String,
    },
    /// Ran. Settled.
    Completed(ToolCallResult),
    /// A human recorded what the write did. Settled.
    Resolved {
        /// Who.
        by: String,
        /// The output they recorded.
        output: Value,
    },
    /// An external tool: the application performs it and reports its
    /// output.
    AwaitingExternal(ExternalCallRequested),
    /// A human answered a suspension at this call. Settled.
    Answered {
        /// The input.
        input: Value,
    },
    /// A call to another agent: its child run was started, and has not
    /// ended.
    Child {
        /// The child run.
        child_run: RunId,
        /// The child's status when it was last found waiting
        /// (`child_parked`); `None` while it runs.
        parked: Option<RunStatus>,
        /// The budgets granted to it (`child_started`): reserved from the
        /// parent's until it ends, so a call started beside it cannot
        /// spend them too.
        granted: BudgetLimits,
    },
    /// Another run had already executed the same keyed call; its result is
    /// this call's. Settled.
    Deduplicated {
        /// The recorded result.
        result: ToolCallResult,
        /// The run that ran it.
        origin_run: RunId,
        /// Its call there.
        origin_call: CallId,
    },
}

impl ToolCallProgress {
    /// Whether the call has its result.
    pub fn is_settled(&self) -> bool {
        matches!(
            self,
            ToolCallProgress::Rejected(_)
                | ToolCallProgress::Denied { .. }
                | ToolCallProgress::PolicyDenied { .. }
                | ToolCallProgress::Completed(_)
                | ToolCallProgress::Resolved { .. }
                | ToolCallProgress::Answered { .. }
                | ToolCallProgress::Deduplicated { .. }
        )
    }

    fn name(&self) -> &'static str {
        match self {
            ToolCallProgress::Pending => "pending",
            ToolCallProgress::AwaitingApproval => "awaiting approval",
            ToolCallProgress::Approved { .. } => "approved",
            ToolCallProgress::Suspended { .. } => "suspended",
            ToolCallProgress::InFlight(_) => "in flight",
            ToolCallProgress::Rejected(_) => "rejected",
            ToolCallProgress::Denied { .. } => "denied",
            ToolCallProgress::PolicyDenied { .. } => "denied by a policy",
            ToolCallProgress::Completed(_) => "completed",
            ToolCallProgress::Resolved { .. } => "resolved",
            ToolCallProgress::Answered { .. } => "answered",
            ToolCallProgress::AwaitingExternal(_) => "awaiting external",
            ToolCallProgress::Deduplicated { .. } => "deduplicated",
            ToolCallProgress::Child { parked: None, .. } => "running a child",
            ToolCallProgress::Child { .. } => "awaiting a child",
        }
    }

    /// The result the model sees, once settled: the text and whether it is
    /// an error.
    pub fn result_for_model(&self) -> Option<(String, bool)> {
        match self {
            ToolCallProgress::Completed(ToolCallResult::Output(v))
            | ToolCallProgress::Deduplicated {
                result: ToolCallResult::Output(v),
                ..
            }
            | ToolCallProgress::Resolved { output: v, .. }
            | ToolCallProgress::Answered { input: v } => Some((value_text(v), false)),
            ToolCallProgress::Completed(ToolCallResult::Error(e))
            | ToolCallProgress::Deduplicated {
                result: ToolCallResult::Error(e),
                ..
            }
            | ToolCallProgress::Rejected(e) => Some((e.to_string(), true)),
            ToolCallProgress::Denied { by, reason } => {
                Some((format!("the call was denied by {by}: {reason}"), true))
            }
            ToolCallProgress::PolicyDenied { policy, reason } => {
                Some((denial_result(policy, reason), true))
            }
            _ => None,
        }
    }
}

/// Whether a call with `progress` started and has not settled: its
/// intent is recorded without completion, or its child run has not ended.
fn is_started(progress: &ToolCallProgress) -> bool {
    matches!(
        progress,
        ToolCallProgress::InFlight(_) | ToolCallProgress::Child { .. }
    )
}

/// A JSON value as the model reads it: a string as itself, anything else
/// as compact JSON.
pub fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The model call in progress, or how the last one ended.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelCallProgress {
    /// None in progress; the last one, if any, completed.
    Idle,
    /// The intent is recorded and has no completion.
    InFlight {
        /// The step.
        step: u32,
        /// The attempt.
        attempt: u32,
        /// The recorded request hash.
        request_hash: RequestHash,
    },
    /// The last attempt failed.
    Failed {
        /// The step.
        step: u32,
        /// Attempts made at this step.
        attempts: u32,
        /// The last error.
        error: ModelCallError,
        /// When it failed, if recorded.
        at_ms: Option<u64>,
        /// When the next attempt is due, if there is one and it was
        /// recorded (a log written before it was: at once).
        retry_at_ms: Option<u64>,
    },
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Terminal {
    /// It completed.
    Completed(RunCompleted),
    /// It failed.
    Failed(RunFailed),
    /// It was cancelled.
    Cancelled(RunCancelled),
    /// It was abandoned.
    Abandoned(RunAbandoned),
}

/// What a parked run waits for.
#[derive(Clone, Debug, PartialEq)]
pub enum Parked<'a> {
    /// Approval of a call.
    Approval {
        /// The call.
        call: &'a ToolCallState,
    },
    /// Input satisfying a schema, which becomes the call's result.
    Input {
        /// The call.
        call_id: &'a CallId,
        /// Why.
        reason: &'a str,
        /// The schema.
        schema: &'a Value,
    },
    /// An external tool's output, reported by the application.
    External(&'a ExternalCallRequested),
    /// A budget extension.
    Budget(BudgetOverrun),
    /// Its wake-up time: a failed model call's next attempt is due then.
    Wait(&'a RetryWait),
    /// A human's word on a write whose outcome is unknown.
    Reconciliation(&'a ToolCallIntent),
    /// A human's word on what the run did that its log may be missing
    /// (it was restored from a backup).
    Hold(&'a ReconciliationRequired),
    /// Its child run, which waits itself (`status`): act on the child, then
    /// drive this run (which drives the child).
    Child {
        /// The call.
        call_id: &'a CallId,
        /// The child run.
        child_run: &'a RunId,
        /// The child's status when it was found waiting.
        status: RunStatus,
    },
}

/// A `resume` that cannot be recorded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The run is neither suspended nor over budget.
    #[error("the run is {status}: only a suspended run or one over budget can be resumed")]
    NotResumable {
        /// Its status.
        status: RunStatus,
    },
    /// The input does not satisfy the suspension's recorded schema.
    #[error("resume input rejected: {0}")]
    InputRejected(SchemaError),
    /// The input is not an extension that lifts the overrun.
    #[error("budget extension rejected: {0}")]
    ExtensionRejected(ExtensionError),
}

/// A log that cannot be folded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FoldError {
    /// There are no events.
    #[error("the log is empty")]
    Empty,
    /// The event at `position` cannot follow the ones before it.
    #[error("impossible event at position {position} ({kind}): {problem}")]
    Impossible {
        /// Its position in the log, from 0.
        position: usize,
        /// Its kind.
        kind: EventKind,
        /// Why it is impossible there.
        problem: FoldProblem,
    },
}

/// Why an event is impossible where it is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FoldProblem {
    /// The first event is not `run_started`.
    #[error("a log must start with run_started")]
    NotStarted,
    /// `run_started` after the first event.
    #[error("the run has already started")]
    AlreadyStarted,
    /// `run_started` names its session history by its chain, and the
    /// history was not read from the store (see
    /// [`resolve_history`](crate::runtime::resolve_history)).
    #[error("the run's session history was not read from the store")]
    HistoryUnresolved,
    /// `wait_started` without a failed model call of its step to wait for,
    /// or while a wait was already recorded for it.
    #[error("wait_started needs a failed model call of its step that no wait was recorded for")]
    NoFailedModelCall,
    /// `wait_ended` while the run is not waiting.
    #[error("wait_ended while the run is not waiting")]
    NotWaiting,
    /// `wait_ended` before the wake-up time.
    #[error("wait_ended at {at_ms} is before the wake-up time {until_ms}")]
    WokeEarly {
        /// When it was recorded.
        at_ms: u64,
        /// The wake-up time.
        until_ms: u64,
    },
    /// An event after a terminal one.
    #[error("the run is already {status}")]
    AfterTerminal {
        /// The terminal status.
        status: RunStatus,
    },
    /// An intent while a model call is in flight.
    #[error("the model call of step {step} is still in flight")]
    ModelCallInFlight {
        /// Its step.
        step: u32,
    },
    /// An intent while a tool call is in flight.
    #[error("tool call `{call_id}` is still in flight")]
    ToolCallInFlight {
        /// The call.
        call_id: CallId,
    },
    /// A model completion with no matching intent.
    #[error("no model call of step {step} is in flight")]
    NoModelCallInFlight {
        /// The step the event names.
        step: u32,
    },
    /// A model intent for the wrong step or attempt.
    #[error(
        "expected step {expected_step} attempt {expected_attempt}, found step {step} attempt {attempt}"
    )]
    StepMismatch {
        /// The next step.
        expected_step: u32,
        /// The next attempt.
        expected_attempt: u32,
        /// The step recorded.
        step: u32,
        /// The attempt recorded.
        attempt: u32,
    },
    /// A model call after the model gave its final answer.
    #[error("the model already gave its final answer at step {step}")]
    AfterFinalAnswer {
        /// That step.
        step: u32,
    },
    /// A model call or a finish while a tool call is not settled.
    #[error("tool call `{call_id}` is not settled")]
    ToolCallOutstanding {
        /// The call.
        call_id: CallId,
    },
    /// An event about a call that is not the next one to settle.
    #[error("`{found}` is not the next tool call to settle (that is {})", .expected.as_ref().map_or("none".to_owned(), |c| format!("`{c}`")))]
    NotNextCall {
        /// The next call, if any.
        expected: Option<CallId>,
        /// The call the event names.
        found: CallId,
    },
    /// An event that the call's progress does not allow.
    #[error("tool call `{call_id}` is {state}, not {needed}")]
    WrongCallState {
        /// The call.
        call_id: CallId,
        /// Its progress.
        state: &'static str,
        /// What the event needs.
        needed: &'static str,
    },
    /// An intent or request that does not match the model's call.
    #[error("the {field} recorded for `{call_id}` does not match the model's call")]
    CallMismatch {
        /// The call.
        call_id: CallId,
        /// Which field differs.
        field: &'static str,
    },
    /// An event the run's parking does not allow.
    #[error("the run is {status}")]
    Parked {
        /// The status.
        status: RunStatus,
    },
    /// A budget extension while no budget is exceeded.
    #[error("no budget is exceeded")]
    NoBudgetExceeded,
    /// A `reconciled` event while nothing required reconciliation.
    #[error("nothing requires reconciliation")]
    NothingToReconcile,
    /// A policy decision whose step or call does not fit its hook.
    #[error("a {hook} decision needs {}", match .hook { PolicyHook::RunStart => "neither a step nor a call", PolicyHook::BeforeToolCall => "a call and no step", _ => "a step and no call" })]
    PolicyPointMalformed {
        /// The hook.
        hook: PolicyHook,
    },
    /// A policy decision where its policy already decided, or after another
    /// policy stopped the point.
    #[error("policy `{policy}` already decided here")]
    PolicyAlreadyDecided {
        /// The policy.
        policy: String,
    },
    /// Feedback at a hook other than `before_finish`.
    #[error("feedback is only possible before_finish, not at {hook}")]
    FeedbackOutsideFinish {
        /// The hook.
        hook: PolicyHook,
    },
    /// A policy decision for a point the run is no longer (or not yet) at.
    #[error("the run is not at that {hook} point")]
    PolicyPointPassed {
        /// The hook.
        hook: PolicyHook,
    },
    /// An output rejection that names no final answer of the latest turn.
    #[error("step {step} is not the latest turn's final answer")]
    NotAFinalAnswer {
        /// The step the event names.
        step: u32,
    },
    /// More output rejections than the engine makes.
    #[error("a final answer is sent back at most {limit} time(s)")]
    OutputRejectedTooOften {
        /// The most.
        limit: u32,
    },
    /// A resumption with no suspension.
    #[error("the run is not suspended")]
    NotSuspended,
    /// An intent while a compaction is in flight.
    #[error("the compaction of step {step} is still in flight")]
    CompactionInFlight {
        /// Its step.
        step: u32,
    },
    /// A compaction completion with no matching intent.
    #[error("no compaction of step {step} up to message {upto} is in flight")]
    NoCompactionInFlight {
        /// The step the event names.
        step: u32,
        /// The cut it names.
        upto: u32,
    },
    /// A compaction whose cut summarises nothing new or cuts past the
    /// conversation.
    #[error(
        "a compaction up to message {upto} must cut past message {done} and before the end ({len} messages)"
    )]
    CompactionCut {
        /// The cut recorded.
        upto: u32,
        /// The cut of the summary in force (1 for none).
        done: usize,
        /// The conversation's length.
        len: usize,
    },
    /// A context resolution for another step than the next model call's.
    #[error("context resolved for step {step}, but the next model call is step {expected}")]
    ContextStepMismatch {
        /// The next model call's step.
        expected: u32,
        /// The step recorded.
        step: u32,
    },
    /// A run event while a delivery is in flight.
    #[error("delivery `{delivery_id}` is still in flight")]
    DeliveryInFlight {
        /// The delivery.
        delivery_id: String,
    },
    /// A delivery event that does not fit the deliveries recorded before.
    #[error("delivery `{delivery_id}`: {reason}")]
    DeliveryMismatch {
        /// The delivery the event names.
        delivery_id: String,
        /// What does not fit.
        reason: String,
    },
    /// A `run_forked` naming another source than the run its prefix
    /// belongs to.
    #[error(
        "run_forked names source `{recorded}`, but the inherited events are run `{inherited}`'s"
    )]
    ForkSourceMismatch {
        /// The source it names.
        recorded: RunId,
        /// The run the prefix belongs to.
        inherited: RunId,
    },
    /// A `run_forked` whose position is not where it stands.
    #[error("run_forked says {recorded} events are inherited, but it follows {inherited}")]
    ForkPositionMismatch {
        /// The position it records.
        recorded: u64,
        /// The events before it.
        inherited: u64,
    },
    /// A `run_forked` that does not withdraw exactly the approval granted
    /// for a call that has not run.
    #[error("run_forked must withdraw the approval of {}", .approved.as_ref().map_or("no call".to_owned(), |c| format!("`{c}`")))]
    ForkApprovalMismatch {
        /// The approved call that has not run, if any.
        approved: Option<CallId>,
    },
    /// A terminal event whose `unresolved_write` is not the dangling write.
    #[error("unresolved_write must name the dangling write ({})", .expected.as_ref().map_or("none".to_owned(), |c| format!("`{c}`")))]
    UnresolvedWriteMismatch {
        /// The dangling write, if any.
        expected: Option<CallId>,
    },
}

/// Folds a whole log.
pub fn fold(events: &[Event]) -> Result<RunState, FoldError> {
    let (first, rest) = events.split_first().ok_or(FoldError::Empty)?;
    let Event::RunStarted(started) = first else {
        return Err(FoldError::Impossible {
            position: 0,
            kind: first.kind(),
            problem: FoldProblem::NotStarted,
        });
    };
    if started.session.as_ref().is_some_and(|s| !s.is_resolved()) {
        return Err(FoldError::Impossible {
            position: 0,
            kind: first.kind(),
            problem: FoldProblem::HistoryUnresolved,
        });
    }
    let mut state = RunState::start(started);
    for event in rest {
        state.apply(event)?;
    }
    Ok(state)
}

impl RunState {
    /// The state right after `run_started`.
    pub fn start(started: &RunStarted) -> RunState {
        let history: &[Message] = started
            .session
            .as_ref()
            .map_or(&[], |s| s.history.as_slice());
        RunState {
            run_id: started.run_id.clone(),
            agent: started.agent.clone(),
            agent_digest: started.agent_digest.clone(),
            input: started.input.clone(),
            labels: started.labels.clone(),
            clock_seed_ms: started.clock_seed_ms,
            random_seed: started.random_seed,
            event_count: 1,
            usage: BudgetUsage::default(),
            limits: started.limits.clone(),
            extensions: BudgetLimits::default(),
            last_clock_ms: None,
            clock_fresh: false,
            random_values: Vec::new(),
            turns: Vec::new(),
            model_call: ModelCallProgress::Idle,
            wait: None,
            budget_exceeded: None,
            terminal: None,
            context: BTreeMap::new(),
            invalid_calls_in_a_row: 0,
            last_invalid_call: None,
            compaction: CompactionProgress::default(),
            output_rejections: 0,
            deliveries: Deliveries::default(),
            policy_decisions: HashMap::new(),
            session_id: started.session.as_ref().map(|s| s.session_id.clone()),
            session_position: started.session.as_ref().map(|s| s.position),
            history_runs: started
                .session
                .as_ref()
                .map(|s| s.runs.clone())
                .unwrap_or_default(),
            messages: history
                .iter()
                .cloned()
                .chain([Message::User {
                    content: value_text(&started.input),
                }])
                .collect(),
            history_len: history.len(),
            last_tool_error: None,
            hold: None,
            fork: None,
            children_started: 0,
            results_shown: 0,
        }
    }

    /// The status, derived from the state.
    pub fn status(&self) -> RunStatus {
        match &self.terminal {
            Some(Terminal::Completed(_)) => return RunStatus::Completed,
            Some(Terminal::Failed(_)) => return RunStatus::Failed,
            Some(Terminal::Cancelled(_)) => return RunStatus::Cancelled,
            Some(Terminal::Abandoned(_)) => return RunStatus::Abandoned,
            None => {}
        }
        if self.hold.is_some() || self.dangling_write().is_some() {
            return RunStatus::NeedsReconciliation;
        }
        match self.next_call().map(|c| &c.progress) {
            Some(ToolCallProgress::AwaitingApproval) => return RunStatus::AwaitingApproval,
            Some(ToolCallProgress::Suspended { .. }) => return RunStatus::Suspended,
            Some(ToolCallProgress::AwaitingExternal(_)) => return RunStatus::AwaitingExternal,
            Some(ToolCallProgress::Child {
                parked: Some(_), ..
            }) => return RunStatus::AwaitingChild,
            _ => {}
        }
        if self.budget_exceeded.is_some() {
            return RunStatus::BudgetExceeded;
        }
        if self.waiting().is_some() {
            return RunStatus::Waiting;
        }
        RunStatus::Running
    }

    /// The wait the run is parked on, if it is: one `wait_started` has
    /// recorded and no `wait_ended` has closed.
    pub fn waiting(&self) -> Option<&RetryWait> {
        self.wait.as_ref().filter(|w| w.ended_ms.is_none())
    }

    /// What the run waits for, if it is parked.
    pub fn parked(&self) -> Option<Parked<'_>> {
        if self.terminal.is_some() {
            return None;
        }
        if let Some(hold) = &self.hold {
            return Some(Parked::Hold(hold));
        }
        if let Some(intent) = self.dangling_write() {
            return Some(Parked::Reconciliation(intent));
        }
        if let Some(call) = self.next_call() {
            match &call.progress {
                ToolCallProgress::AwaitingApproval => return Some(Parked::Approval { call }),
                ToolCallProgress::Suspended { reason, schema } => {
                    return Some(Parked::Input {
                        call_id: &call.call_id,
                        reason,
                        schema,
                    });
                }
                ToolCallProgress::AwaitingExternal(request) => {
                    return Some(Parked::External(request));
                }
                ToolCallProgress::Child {
                    child_run,
                    parked: Some(status),
                    ..
                } => {
                    return Some(Parked::Child {
                        call_id: &call.call_id,
                        child_run,
                        status: *status,
                    });
                }
                _ => {}
            }
        }
        if let Some(overrun) = self.budget_exceeded {
            return Some(Parked::Budget(overrun));
        }
        self.waiting().map(Parked::Wait)
    }

    /// The policy decisions recorded at `point`, in log order.
    pub fn policy_decisions(&self, point: &PolicyPoint) -> &[RecordedDecision] {
        self.policy_decisions.get(point).map_or(&[], Vec::as_slice)
    }

    /// The run's output, once it completed.
    pub fn output(&self) -> Option<&Value> {
        match &self.terminal {
            Some(Terminal::Completed(c)) => Some(&c.output),
            _ => None,
        }
    }

    /// The latest turn.
    pub fn last_turn(&self) -> Option<&Turn> {
        self.turns.last()
    }

    /// The first tool call of the latest turn that is not settled.
    pub fn next_call(&self) -> Option<&ToolCallState> {
        self.turns
            .last()?
            .calls
            .iter()
            .find(|c| !c.progress.is_settled())
    }

    /// The tool call whose intent has no completion, if any.
    pub fn in_flight_tool(&self) -> Option<&ToolCallIntent> {
        match &self.next_call()?.progress {
            ToolCallProgress::InFlight(intent) => Some(intent),
            _ => None,
        }
    }

    /// The call whose child run has not ended, and the child, if any
    /// (running or found waiting).
    pub fn child_in_flight(&self) -> Option<(&CallId, &RunId)> {
        let call = self.next_call()?;
        match &call.progress {
            ToolCallProgress::Child { child_run, .. } => Some((&call.call_id, child_run)),
            _ => None,
        }
    }

    /// The calls of the latest turn that started and have not settled, in
    /// the model's order: a tool call whose intent has no completion, a
    /// call whose child run has not ended. More than one while a parallel
    /// batch runs (see `batch.rs`).
    pub fn started_calls(&self) -> impl Iterator<Item = &ToolCallState> {
        self.turns
            .last()
            .into_iter()
            .flat_map(|t| t.calls.iter())
            .filter(|c| is_started(&c.progress))
    }

    /// The children in flight (started and not ended, running or found
    /// waiting): each call and its child, in the model's order.
    pub fn children_in_flight(&self) -> impl Iterator<Item = (&CallId, &RunId)> {
        self.started_calls().filter_map(|c| match &c.progress {
            ToolCallProgress::Child { child_run, .. } => Some((&c.call_id, child_run)),
            _ => None,
        })
    }

    /// What the run has used plus what its children in flight were
    /// granted and are not yet charged for: what a call started now must
    /// fit beside (a child's usage is charged when it ends, so its grant
    /// is reserved until then). Equal to `usage` when no child is in
    /// flight.
    pub fn committed_usage(&self) -> BudgetUsage {
        let mut committed = self.usage;
        for call in self.started_calls() {
            if let ToolCallProgress::Child { granted, .. } = &call.progress {
                let c = &mut committed;
                let add = |used: u64, kind| used.saturating_add(granted.get(kind).unwrap_or(0));
                c.steps = add(c.steps, BudgetKind::Steps);
                c.input_tokens = add(c.input_tokens, BudgetKind::InputTokens);
                c.output_tokens = add(c.output_tokens, BudgetKind::OutputTokens);
                c.cost_nanos = add(c.cost_nanos, BudgetKind::Cost);
                c.tool_calls = add(c.tool_calls, BudgetKind::ToolCalls);
                c.fuel = add(c.fuel, BudgetKind::Fuel);
            }
        }
        committed
    }

    /// What a human must check before the run goes on, when its log may
    /// be missing what it did (a restore), if anything.
    pub fn held(&self) -> Option<&ReconciliationRequired> {
        self.hold.as_ref()
    }

    /// The write whose intent has no completion, if any.
    pub fn dangling_write(&self) -> Option<&ToolCallIntent> {
        self.in_flight_tool()
            .filter(|i| i.effect == EffectClass::Write)
    }

    /// Whether a model call, a compaction, or a tool call that may still
    /// complete is in flight (a dangling write is not: it waits for a
    /// human). A delivery intent is not recorded then.
    pub fn effect_in_flight(&self) -> bool {
        let dangling = self.dangling_write().map(|w| &w.call_id);
        matches!(self.model_call, ModelCallProgress::InFlight { .. })
            || self.compaction.in_flight.is_some()
            || self.started_calls().any(|c| {
                matches!(&c.progress, ToolCallProgress::InFlight(i) if Some(&i.call_id) != dangling)
            })
    }

    /// The tool call with `call_id` in the latest turn.
    pub fn call(&self, call_id: &CallId) -> Option<&ToolCallState> {
        self.turns
            .last()?
            .calls
            .iter()
            .find(|c| &c.call_id == call_id)
    }

    /// The budgets in force: those recorded when the run started (else,
    /// in a log that does not record them, the agent's `limits`), with the
    /// recorded extensions applied.
    pub fn effective_limits(&self, limits: &BudgetLimits) -> BudgetLimits {
        self.limits
            .as_ref()
            .map_or(limits, |recorded| &recorded.budgets)
            .overridden_by(&self.extensions)
    }

    /// The input-size cap in force: the recorded one, else the agent's
    /// `max_input_bytes`.
    pub fn max_input_bytes(&self, max_input_bytes: u64) -> u64 {
        self.limits
            .as_ref()
            .map_or(max_input_bytes, |recorded| recorded.max_input_bytes)
    }

    /// The host's ceilings the run started under, when the log records
    /// them (none in logs written before there were any).
    pub fn ceilings(&self) -> Option<&RunCeilings> {
        self.limits.as_ref().and_then(|l| l.ceilings.as_ref())
    }

    /// The currency cost is counted in, when the log records it.
    pub fn currency(&self) -> Option<&str> {
        self.limits.as_ref().and_then(|l| l.currency.as_deref())
    }

    /// The conversation the model sees: the session history recorded when
    /// the run started (if any), then the input, then each turn and the
    /// results of its settled tool calls, in order.
    pub fn conversation(&self) -> &[Message] {
        &self.messages
    }

    /// The session history this run started with (empty outside a session).
    pub fn history(&self) -> &[Message] {
        &self.messages[..self.history_len]
    }

    /// This run's own transcript: the conversation without the session
    /// history. A later run of the session sees it as history once this run
    /// has completed.
    pub fn transcript(&self) -> &[Message] {
        &self.messages[self.history_len..]
    }

    /// Checks `input` as an extension of the budget the run is parked on
    /// (the agent's limits are `limits`) and returns the event to record.
    /// Nothing is recorded when this fails.
    pub fn check_extension(
        &self,
        limits: &BudgetLimits,
        input: &Value,
        by: Option<String>,
    ) -> Result<BudgetExtended, ExtensionError> {
        let overrun = self.budget_exceeded.ok_or(ExtensionError::NotExceeded)?;
        let extension = parse_extension(input)?;
        let given = extension.get(overrun.budget);
        let effective = self
            .effective_limits(limits)
            .overridden_by(&extension)
            .get(overrun.budget);
        if effective.is_some_and(|limit| limit < overrun.least_lifting_limit()) {
            return Err(ExtensionError::TooSmall {
                needed: overrun,
                given,
            });
        }
        Ok(BudgetExtended {
            limits: extension,
            by,
            at_ms: None,
        })
    }

    /// Checks `input` for a `resume` of this run and returns the one event to
    /// record: for a suspended run, [`Event::Resumed`] once the input
    /// satisfies the schema recorded in the log; for a run over budget,
    /// [`Event::BudgetExtended`] once the input is an extension that lifts
    /// the overrun (the agent's limits are `limits`). Nothing is recorded
    /// when this fails.
    pub fn check_resume(
        &self,
        limits: &BudgetLimits,
        input: &Value,
        by: Option<String>,
    ) -> Result<Event, ResumeError> {
        match self.parked() {
            Some(Parked::Input { schema, .. }) => {
                schema::check(schema, input).map_err(ResumeError::InputRejected)?;
                Ok(Event::Resumed(Resumed {
                    input: input.clone(),
                    by,
                    at_ms: None,
                }))
            }
            Some(Parked::Budget(_)) => self
                .check_extension(limits, input, by)
                .map(Event::BudgetExtended)
                .map_err(ResumeError::ExtensionRejected),
            _ => Err(ResumeError::NotResumable {
                status: self.status(),
            }),
        }
    }

    /// Folds one more event. On error the state is unchanged.
    pub fn apply(&mut self, event: &Event) -> Result<(), FoldError> {
        let position = self.event_count;
        let kind = event.kind();
        self.check(event).map_err(|problem| FoldError::Impossible {
            position,
            kind,
            problem,
        })?;
        self.deliveries.note(position as u64, event);
        let parked_before = self.parked().is_some();
        self.update(event);
        if let Some(at) = event.clock_reading() {
            self.observe_clock(at, parked_before);
        }
        self.clock_fresh = matches!(event, Event::ClockObserved(_));
        self.event_count += 1;
        Ok(())
    }

    /// Counts the time up to the clock reading `at` as active unless the
    /// run was parked until this event: then the time since the last
    /// reading (the park, up to the act or event that ended it) is not
    /// counted. Any park counts, whatever ended it, so wall time is active
    /// time however a run comes to wait.
    fn observe_clock(&mut self, at: u64, parked_before: bool) {
        if !parked_before {
            let since = self.last_clock_ms.unwrap_or(self.clock_seed_ms);
            self.usage.wall_time_ms = self
                .usage
                .wall_time_ms
                .saturating_add(at.saturating_sub(since));
        }
        // A reading behind the last one (a clock set back) moves nothing.
        self.last_clock_ms = Some(self.last_clock_ms.map_or(at, |last| last.max(at)));
    }

    fn parked_problem(&self) -> Result<(), FoldProblem> {
        let status = self.status();
        if status.is_parked() {
            return Err(FoldProblem::Parked { status });
        }
        Ok(())
    }

    fn nothing_in_flight(&self) -> Result<(), FoldProblem> {
        if let ModelCallProgress::InFlight { step, .. } = self.model_call {
            return Err(FoldProblem::ModelCallInFlight { step });
        }
        if let Some((step, ..)) = self.compaction.in_flight {
            return Err(FoldProblem::CompactionInFlight { step });
        }
        if let Some(call) = self
            .started_calls()
            .find(|c| matches!(c.progress, ToolCallProgress::InFlight(_)))
        {
            return Err(FoldProblem::ToolCallInFlight {
                call_id: call.call_id.clone(),
            });
        }
        Ok(())
    }

    /// The next call to start, which must be `call_id`: the first call of
    /// the latest turn that has neither settled nor started (every call
    /// before it settled, or started and still in flight: a parallel
    /// batch).
    fn expect_launchable(&self, call_id: &CallId) -> Result<&ToolCallState, FoldProblem> {
        let next = self.turns.last().and_then(|t| {
            t.calls
                .iter()
                .find(|c| !c.progress.is_settled() && !is_started(&c.progress))
        });
        match next {
            Some(call) if &call.call_id == call_id => Ok(call),
            other => Err(FoldProblem::NotNextCall {
                expected: other.map(|c| c.call_id.clone()),
                found: call_id.clone(),
            }),
        }
    }

    /// The call whose outcome is recorded next, which must be `call_id`:
    /// outcomes are recorded in the model's order, so every call before it
    /// has its outcome (settled, or its child found waiting), whatever
    /// finished first.
    fn expect_reporting(&self, call_id: &CallId) -> Result<&ToolCallState, FoldProblem> {
        let calls = self.turns.last().map_or(&[][..], |t| &t.calls[..]);
        let reported = |c: &ToolCallState| match &c.progress {
            ToolCallProgress::Child { parked, .. } => parked.is_some(),
            // A write whose outcome is unknown has its outcome recorded:
            // that it is unknown.
            ToolCallProgress::InFlight(i) => {
                i.effect == EffectClass::Write && c.failed_attempts > 0
            }
            p => p.is_settled(),
        };
        let found = calls.iter().position(|c| &c.call_id == call_id);
        let first_unreported = calls.iter().position(|c| !reported(c));
        match found {
            Some(i)
                if !calls[i].progress.is_settled() && first_unreported.is_none_or(|u| i <= u) =>
            {
                Ok(&calls[i])
            }
            _ => Err(FoldProblem::NotNextCall {
                expected: first_unreported.map(|u| calls[u].call_id.clone()),
                found: call_id.clone(),
            }),
        }
    }

    /// The next call to settle, which must be `call_id`.
    fn expect_next(&self, call_id: &CallId) -> Result<&ToolCallState, FoldProblem> {
        match self.next_call() {
            Some(call) if &call.call_id == call_id => Ok(call),
            other => Err(FoldProblem::NotNextCall {
                expected: other.map(|c| c.call_id.clone()),
                found: call_id.clone(),
            }),
        }
    }

    /// A call about to run (or be settled without running) must be pending
    /// or approved.
    fn expect_pending_or_approved(call: &ToolCallState) -> Result<(), FoldProblem> {
        Self::expect_progress(
            call,
            |p| {
                matches!(
                    p,
                    ToolCallProgress::Pending | ToolCallProgress::Approved { .. }
                )
            },
            "pending or approved",
        )
    }

    fn expect_progress(
        call: &ToolCallState,
        allowed: fn(&ToolCallProgress) -> bool,
        needed: &'static str,
    ) -> Result<(), FoldProblem> {
        if allowed(&call.progress) {
            Ok(())
        } else {
            Err(FoldProblem::WrongCallState {
                call_id: call.call_id.clone(),
                state: call.progress.name(),
                needed,
            })
        }
    }

    fn check(&self, event: &Event) -> Result<(), FoldProblem> {
        if event.is_delivery() {
            return self.check_delivery(event);
        }
        // An operator's release or settlement of a key: at any time,
        // finished runs included (the store checked the run held the key).
        if matches!(event, Event::KeyReleased(_) | Event::KeySettled(_)) {
            return Ok(());
        }
        if let Some(d) = &self.deliveries.in_flight
            && matches!(
                event,
                Event::ModelCallIntent(_) | Event::ToolCallIntent(_) | Event::CompactionIntent(_)
            )
        {
            return Err(FoldProblem::DeliveryInFlight {
                delivery_id: d.intent.delivery_id.clone(),
            });
        }
        if self.terminal.is_some() {
            return Err(FoldProblem::AfterTerminal {
                status: self.status(),
            });
        }
        match concern(event) {
            Concern::Start => Err(FoldProblem::AlreadyStarted),
            Concern::ModelCall => self.check_model_call(event),
            Concern::ToolCall => self.check_tool_call(event),
            Concern::Approval => self.check_approval(event),
            Concern::Child => self.check_child(event),
            Concern::Policy => self.check_policy(event),
            Concern::Lifecycle => self.check_lifecycle(event),
            Concern::Key => unreachable!("key releases and settlements are checked above"),
            Concern::Delivery => unreachable!("delivery events are checked above"),
        }
    }

    fn next_call_mut(&mut self) -> &mut ToolCallState {
        self.turns
            .last_mut()
            .and_then(|t| t.calls.iter_mut().find(|c| !c.progress.is_settled()))
            .expect("checked: there is a next call")
    }

    /// The call `call_id` of the latest turn (checked to be there).
    fn call_mut(&mut self, call_id: &CallId) -> &mut ToolCallState {
        self.turns
            .last_mut()
            .and_then(|t| t.calls.iter_mut().find(|c| &c.call_id == call_id))
            .expect("checked: the call is in the latest turn")
    }

    /// Settles the next call with `progress` and appends its result to the
    /// conversation.
    fn settle(&mut self, progress: ToolCallProgress) {
        let call_id = self.next_call_mut().call_id.clone();
        self.settle_call(&call_id, progress);
    }

    /// Settles the call `call_id` with `progress`, then appends to the
    /// conversation the results of the settled calls not yet shown, in the
    /// model's order up to the first call still unsettled.
    fn settle_call(&mut self, call_id: &CallId, progress: ToolCallProgress) {
        self.call_mut(call_id).progress = progress;
        loop {
            let Some(call) = self
                .turns
                .last()
                .and_then(|t| t.calls.get(self.results_shown))
                .filter(|c| c.progress.is_settled())
            else {
                return;
            };
            let message = call
                .progress
                .result_for_model()
                .expect("a settled call has a result");
            let (id, name) = (call.call.id.clone(), call.call.name.clone());
            self.results_shown += 1;
            self.show_result(id, name, message);
        }
    }

    /// Appends one call's result to the conversation.
    fn show_result(&mut self, call_id: String, name: String, (content, is_error): (String, bool)) {
        // Errors are compacted for the model; the log keeps them whole.
        let content = if is_error {
            let repeats = match &self.last_tool_error {
                Some((last, n)) if *last == content => n + 1,
                _ => 1,
            };
            let shown = compact_tool_error(&content, repeats);
            self.last_tool_error = Some((content, repeats));
            shown
        } else {
            self.last_tool_error = None;
            content
        };
        self.messages.push(Message::Tool {
            call_id,
            name,
            content,
            is_error,
        });
    }

    /// Applies a checked event.
    fn update(&mut self, event: &Event) {
        match concern(event) {
            Concern::Start => unreachable!("checked: run_started is only first"),
            Concern::ModelCall => self.update_model_call(event),
            Concern::ToolCall => self.update_tool_call(event),
            Concern::Approval => self.update_approval(event),
            Concern::Child => self.update_child(event),
            Concern::Policy => self.update_policy(event),
            Concern::Lifecycle => self.update_lifecycle(event),
            Concern::Key => {}
            Concern::Delivery => self.update_delivery(event),
        }
    }
}

/// The state machine an event belongs to: [`RunState::apply`] checks and
/// applies each event with its concern's (one file each under `state/`).
#[derive(Clone, Copy)]
enum Concern {
    /// `run_started`, the first event and only there.
    Start,
    ModelCall,
    ToolCall,
    Approval,
    Child,
    Policy,
    Lifecycle,
    /// An operator's release or settlement of a key.
    Key,
    Delivery,
}

fn concern(event: &Event) -> Concern {
    match event {
        Event::RunStarted(_) => Concern::Start,
        Event::ModelCallIntent(_)
        | Event::ModelCallCompleted(_)
        | Event::ModelCallFailed(_)
        | Event::WaitStarted(_)
        | Event::WaitEnded(_)
        | Event::CompactionIntent(_)
        | Event::CompactionCompleted(_)
        | Event::CompactionFailed(_)
        | Event::ContextResolved(_)
        | Event::ContextFailed(_) => Concern::ModelCall,
        Event::ToolCallRejected(_)
        | Event::ToolCallIntent(_)
        | Event::ToolCallAttemptFailed(_)
        | Event::ExternalCallRequested(_)
        | Event::ExternalCallCompleted(_)
        | Event::ToolCallDeduplicated(_)
        | Event::ToolCallCompleted(_)
        | Event::ToolCallResolved(_) => Concern::ToolCall,
        Event::ApprovalRequested(_)
        | Event::ApprovalGranted(_)
        | Event::ApprovalDenied(_)
        | Event::ApprovalWithdrawn(_)
        | Event::Suspended(_)
        | Event::Resumed(_) => Concern::Approval,
        Event::ChildStarted(_) | Event::ChildParked(_) | Event::ChildFinished(_) => Concern::Child,
        Event::PolicyDecided(_) => Concern::Policy,
        Event::BudgetExceeded(_)
        | Event::BudgetExtended(_)
        | Event::ClockObserved(_)
        | Event::RandomObserved(_)
        | Event::RunCompleted(_)
        | Event::OutputRejected(_)
        | Event::RunFailed(_)
        | Event::RunCancelled(_)
        | Event::RunAbandoned(_)
        | Event::RunForked(_)
        | Event::ReconciliationRequired(_)
        | Event::Reconciled(_) => Concern::Lifecycle,
        Event::KeyReleased(_) | Event::KeySettled(_) => Concern::Key,
        Event::DeliveryIntent(_)
        | Event::DeliveryAttemptFailed(_)
        | Event::DeliveryCompleted(_)
        | Event::DeliveryFailed(_) => Concern::Delivery,
    }
}

/// The value of a call's idempotency-key argument: a string, number or
/// boolean; `None` when absent or of another type.
pub fn key_argument<'a>(arguments: &'a Value, field: &str) -> Option<&'a Value> {
    arguments
        .get(field)
        .filter(|v| v.is_string() || v.is_number() || v.is_boolean())
}
