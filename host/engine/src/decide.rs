//! Deciding the next action of a run: [`decide`] is pure, from the folded
//! [`RunState`] and the [`AgentView`] alone.
//!
//! | the state                                   | the action |
//! | ------------------------------------------- | ---------- |
//! | terminal                                    | [`Action::Idle`] (terminal) |
//! | parked: approval, input, budget, a wait, a dangling write | [`Action::Idle`] (why) |
//! | a model intent without completion (crash)   | [`Action::CallModel`], intent already recorded |
//! | a compaction intent without completion (crash) | [`Action::Compact`], intent already recorded |
//! | calls of the turn in flight (a parallel batch), fewer than `max_parallel_calls`, the next would start as a read, idempotent (or allowed write) call or a child | that start ([`Action::CallTool`], [`Action::StartChild`], or [`Action::ObserveClock`] first); see `batch.rs` |
//! | a read/idempotent intent without completion | [`Action::CallTool`], intent already recorded (same key) |
//! | the model's last N tool calls were rejected as invalid (N = the agent's `max_invalid_tool_calls`) | [`Action::Fail`] |
//! | no model call yet, a `run_start` policy has not decided | [`Action::ConsultPolicy`] |
//! | last response recorded, an `after_response` policy has not decided | [`Action::ConsultPolicy`] |
//! | a policy denied (not a tool call) or failed | [`Action::Fail`] |
//! | next call pending and past a host ceiling: its place in the response, a response's or the run's child runs (`ceilings.rs`) | [`Action::RejectToolCall`] ([`ToolCallError::CeilingReached`]) |
//! | next call names no tool, or its arguments fail the tool's schema | [`Action::RejectToolCall`] |
//! | next call pending, a `before_tool_call` policy has not decided | [`Action::ConsultPolicy`] |
//! | next call is a human tool                   | [`Action::Park`] (suspend, with the answer's schema) |
//! | next call is an agent (`[agents.<name>]`), budgets left | [`Action::StartChild`] (its budgets capped by the parent's remaining) |
//! | … a budget the child would need used up     | [`Action::Park`] (budget exceeded) |
//! | a child run started and not finished (running, or found waiting) | [`Action::DriveChild`] |
//! | next call pending, budget used up, or a model budget crossed | [`Action::Park`] (budget exceeded) |
//! | next call pending, wall-time budget, clock stale | [`Action::ObserveClock`] |
//! | next call pending and needs approval        | [`Action::RequestApproval`] |
//! | next call pending (no approval) or approved | [`Action::CallTool`] with frozen arguments |
//! | last model call failed permanently          | [`Action::Fail`] |
//! | … transiently, the agent's `max_attempts` reached | [`Action::Fail`] |
//! | … transiently, its next attempt due later than `max_retry_wait` after it, not waited for yet | [`Action::Park`] (wait until due) |
//! | … transiently, attempts left | [`Action::CallModel`], next attempt (budgets checked; the driver waits until its recorded due time) |
//! | last turn has no tool calls, cut by max_tokens | [`Action::Fail`] |
//! | last turn has no tool calls, the model refused, `on_refusal = "fail"` | [`Action::Fail`] ([`RunError::Refused`]) |
//! | … `on_refusal = "complete"` | [`Action::Finish`] with the refusal's text |
//! | last turn has no tool calls, output schema violated, not yet sent back | [`Action::RejectOutput`] |
//! | … violated again                            | [`Action::Fail`] ([`RunError::OutputInvalid`]) |
//! | … valid, a `before_finish` policy has not decided | [`Action::ConsultPolicy`] |
//! | last turn has no tool calls                 | [`Action::Finish`] with its text (or its validated JSON) |
//! | before a step's model call (new or retried), a context source with `on_error = "fail"` failed | [`Action::Fail`] |
//! | … a context source is due (each step, or once per turn) | [`Action::ResolveContext`] |
//! | … a new step's prompt over the agent's budget, something left to cut, no failure this step | [`Action::Compact`] |
//! | otherwise (start, or every call settled)    | budgets, then [`Action::CallModel`] for the next step |
//! | a model call or compaction not yet made whose input alone would cross the input-token or cost budget | [`Action::Park`] (budget exceeded, with what it needed) |
//!
//! Budgets are checked before every effect in [`BudgetKind::ORDER`]; see
//! [`super::budget`] for which apply to which effect. Wall time is only
//! measured from a clock reading recorded right before the check, so replay
//! sees the same numbers.
//!
//! The runtime performs an action and records it: for a model or tool call,
//! intent ([`ModelCall::intent`], [`ToolInvocation::intent`]) then the effect
//! then the completion, all in one step (deciding again between intent and
//! completion would see the intent in flight); for the others,
//! [`Action::event`] is the one event to append.

mod batch;
mod policies;

use serde_json::Value;

use super::agent::child_agents::{child_limits, child_run_id};
use super::budget::{
    BudgetKind, BudgetOverrun, Pricing, first_crossed, first_exhausted, input_overrun,
};
use super::ceilings::Ceiling;
use super::compaction::{cut, estimate_tokens, request as compaction_request};
use super::context::{ContextOutcome, ContextState, OnContextError, ResolveWhen};
use super::events::ChildStarted;
use super::events::{
    ApprovalRequested, ApprovalWithdrawn, CompactionCompleted, CompactionFailed, CompactionIntent,
    Event, ExternalCallRequested, InvocationOutcome, ModelCallCompleted, ModelCallError,
    ModelCallFailed, ModelCallIntent, OutputRejected, PreflightOutcome, Preview, RunCompleted,
    RunError, RunFailed, Suspended, ToolCallAttemptFailed, ToolCallCompleted, ToolCallDeduplicated,
    ToolCallError, ToolCallIntent, ToolCallRejected, ToolCallResult, ToolRef, WaitStarted,
    WithdrawReason,
};
use super::ids::{CallDigest, CallId, RequestHash, RunId, commitment_key, idempotency_key};
use super::output::{MAX_OUTPUT_REJECTIONS, check_final_answer};
use super::policy_hooks::{PolicyConsult, PolicyPoint, PolicySubject};
use super::prompt::{build_request, request_frame};
use super::refusal::OnRefusal;
use super::request_hash::{RequestHasher, request_hash, request_size};
use super::retry::RetryPolicy;
use super::schema::{CompiledSchemas, SchemaError};
use super::state::{
    ModelCallProgress, Parked, RunState, ToolCallProgress, ToolCallState, key_argument,
};
use super::status::RunStatus;
use super::view::{AgentTool, AgentView, ToolTarget};
use batch::launch;
use policies::gate;
use warden_plugins::grant::EffectClass;
use warden_providers::{ModelRequest, ModelResponse, ProviderError, StopReason, ToolCall};
use warden_sandbox::{UsageReceipt, wit};
use warden_syntax::json_limits;

/// Attempts at one `read` or `idempotent` tool call before a run of
/// retryable failures becomes its result. A `write` is tried once.
pub const MAX_TOOL_ATTEMPTS: u32 = 3;

/// What to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Call the model.
    CallModel(ModelCall),
    /// Run a tool.
    CallTool(ToolInvocation),
    /// Ask a human to approve a tool call (after its preflight).
    RequestApproval(ApprovalRequest),
    /// Record that the approval of the next call approves nothing: it
    /// names a digest that is not the call's.
    WithdrawApproval(ApprovalWithdrawn),
    /// Refuse a tool call the model made; the error is its result.
    RejectToolCall(ToolCallRejected),
    /// Send a final answer that violates the output schema back to the
    /// model.
    RejectOutput(OutputRejected),
    /// Read the clock and record it (a wall-time budget is about to be
    /// checked).
    ObserveClock,
    /// Ask a policy and record its decision.
    ConsultPolicy(PolicyConsult),
    /// Resolve a context source before the step's model call, and record
    /// what it returned (or how it failed).
    ResolveContext(ContextResolution),
    /// Summarise older history before the step's model call: the prompt
    /// outgrew the agent's budget.
    Compact(CompactionCall),
    /// The run is done.
    Finish(RunCompleted),
    /// Park the run for a human.
    Park(Park),
    /// The run cannot go on.
    Fail(RunError),
    /// Start the child run of a call to another agent: create it, then
    /// record `child_started`.
    StartChild(ChildStarted),
    /// Drive the child run of the call in flight, then record how it ended
    /// (or that it waits).
    DriveChild(ChildDrive),
    /// Nothing to do until a human acts, or ever.
    Idle(Idle),
}

/// The child run to drive: the call in flight and its child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildDrive {
    /// The parent's call.
    pub call_id: CallId,
    /// The child run.
    pub child_run: RunId,
}

impl Action {
    /// The one event that records this action, for the actions that are
    /// nothing but a record (reject, finish, park, fail). `None` for effects
    /// (recorded as intent and completion), clock reads and idling.
    pub fn event(&self) -> Option<Event> {
        match self {
            Action::RejectToolCall(r) => Some(Event::ToolCallRejected(r.clone())),
            Action::RejectOutput(r) => Some(Event::OutputRejected(r.clone())),
            Action::WithdrawApproval(w) => Some(Event::ApprovalWithdrawn(w.clone())),
            Action::Finish(c) => Some(Event::RunCompleted(c.clone())),
            Action::Park(Park::BudgetExceeded(o)) => Some(Event::BudgetExceeded(*o)),
            Action::Park(Park::Suspend(s)) => Some(Event::Suspended(s.clone())),
            Action::Park(Park::External(r)) => Some(Event::ExternalCallRequested(r.clone())),
            Action::Park(Park::Wait(w)) => Some(Event::WaitStarted(*w)),
            Action::Fail(e) => Some(Event::RunFailed(RunFailed { error: e.clone() })),
            Action::CallModel(_)
            | Action::CallTool(_)
            | Action::RequestApproval(_)
            | Action::ObserveClock
            | Action::ConsultPolicy(_)
            | Action::ResolveContext(_)
            | Action::Compact(_)
            | Action::StartChild(_)
            | Action::DriveChild(_)
            | Action::Idle(_) => None,
        }
    }
}

/// A model call to make.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelCall {
    /// The step, from 1.
    pub step: u32,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The request.
    pub request: ModelRequest,
    /// Its hash.
    pub request_hash: RequestHash,
    /// How many bytes its hash covers ([`request_size`]): what its input
    /// is estimated from. 0 when the request was built without its
    /// messages.
    pub request_size: u64,
    /// The provider that reaches the model ([`AgentView::provider`]),
    /// recorded with the intent.
    pub provider: String,
    /// Whether the intent is already in the log (a crash came between it
    /// and the completion): then make the call without recording a new
    /// intent. [`replay`](super::replay::replay) has compared the recorded
    /// hash with this request's at the intent's position.
    pub recorded: bool,
}

impl ModelCall {
    /// The intent to record; the request rides along when prompts are
    /// recorded.
    pub fn intent(&self, record_prompts: bool) -> Event {
        Event::ModelCallIntent(ModelCallIntent {
            step: self.step,
            attempt: self.attempt,
            request_hash: self.request_hash.clone(),
            request: record_prompts.then(|| self.request.clone()),
            provider: Some(self.provider.clone()),
            model: Some(self.request.model.clone()),
        })
    }

    /// The completion to record for `response`, priced with `pricing` (the
    /// agent's, recorded with it).
    ///
    /// A tool call's arguments nested deeper than [`json_limits::MAX_DEPTH`]
    /// are recorded as their JSON text: the event stays readable, and the
    /// call is refused to the model as invalid arguments saying why.
    pub fn completion(
        &self,
        response: &ModelResponse,
        pricing: Option<&Pricing>,
        at_ms: u64,
    ) -> Event {
        let tool_calls = response
            .tool_calls
            .iter()
            .map(|call| match json_limits::check(&call.arguments) {
                Ok(()) => call.clone(),
                Err(_) => ToolCall {
                    arguments: Value::String(call.arguments.to_string()),
                    ..call.clone()
                },
            })
            .collect();
        Event::ModelCallCompleted(ModelCallCompleted {
            at_ms: Some(at_ms),
            step: self.step,
            text: response.text.clone(),
            tool_calls,
            blocks: response.blocks.clone(),
            usage: response.usage,
            cost_nanos: pricing.map(|p| p.cost_nanos(&response.usage)),
            pricing: pricing.cloned(),
            stop_reason: response.stop_reason.unwrap_or(StopReason::Other),
        })
    }

    /// The failure to record for `error`, which arrived at `at_ms`, with
    /// the next attempt due when `retry` says (see `engine/retry.rs`).
    pub fn failure(
        &self,
        error: &ProviderError,
        at_ms: u64,
        retry: &RetryPolicy,
        jitter: u64,
    ) -> Event {
        let error = ModelCallError::from(error);
        let retry_at_ms = retry.next_attempt_at(self.attempt, &error, at_ms, jitter);
        Event::ModelCallFailed(ModelCallFailed {
            step: self.step,
            error,
            at_ms: Some(at_ms),
            retry_at_ms,
        })
    }
}

/// A context source to resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextResolution {
    /// The source's name in the agent.
    pub source: String,
    /// The step whose model call it is for.
    pub step: u32,
}

/// A compaction call to make.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionCall {
    /// The step whose model call it is for.
    pub step: u32,
    /// The cut: messages `1..upto` are summarised.
    pub upto: usize,
    /// The summarising request.
    pub request: ModelRequest,
    /// Its hash.
    pub request_hash: RequestHash,
    /// Whether the intent is already in the log (a crash came between it
    /// and the completion).
    pub recorded: bool,
}

impl CompactionCall {
    /// The intent to record; the request rides along when prompts are
    /// recorded.
    pub fn intent(&self, record_prompts: bool) -> Event {
        Event::CompactionIntent(CompactionIntent {
            step: self.step,
            upto: self.upto as u32,
            request_hash: self.request_hash.clone(),
            request: record_prompts.then(|| self.request.clone()),
        })
    }

    /// The completion to record for `response`: its text is the summary
    /// (an empty one is a failure), priced with `pricing`.
    pub fn completion(&self, response: &ModelResponse, pricing: Option<&Pricing>) -> Event {
        if response.text.trim().is_empty() {
            return Event::CompactionFailed(CompactionFailed {
                step: self.step,
                upto: self.upto as u32,
                error: ModelCallError {
                    transient: false,
                    message: "the model returned an empty summary".into(),
                    status: None,
                    retry_after_ms: None,
                },
            });
        }
        Event::CompactionCompleted(CompactionCompleted {
            step: self.step,
            upto: self.upto as u32,
            summary: response.text.clone(),
            usage: response.usage,
            cost_nanos: pricing.map(|p| p.cost_nanos(&response.usage)),
            pricing: pricing.cloned(),
        })
    }

    /// The failure to record for `error`.
    pub fn failure(&self, error: &ProviderError) -> Event {
        Event::CompactionFailed(CompactionFailed {
            step: self.step,
            upto: self.upto as u32,
            error: ModelCallError::from(error),
        })
    }
}

/// A tool call to run.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInvocation {
    /// Its intent: the tool, frozen arguments, effect class, key.
    pub intent: ToolCallIntent,
    /// The attempt, from 1: earlier attempts of a `read` or `idempotent`
    /// call failed and were recorded.
    pub attempt: u32,
    /// Whether the intent is already in the log (a crash came between it and
    /// the completion of a `read` or `idempotent` call): then run it again
    /// without recording a new intent.
    pub recorded: bool,
}

impl ToolInvocation {
    /// The intent to record.
    pub fn intent(&self) -> Event {
        Event::ToolCallIntent(self.intent.clone())
    }

    /// The call to hand the plugin.
    pub fn wit_call(&self, run_id: &RunId) -> wit::Call {
        wit::Call {
            idempotency_key: self.intent.idempotency_key.clone(),
            ..wit_call(
                run_id,
                &self.intent.call_id,
                &self.intent.tool,
                &self.intent.arguments,
            )
        }
    }

    /// The record of a failed attempt; the call stays in flight.
    pub fn attempt_failed(
        &self,
        outcome: &InvocationOutcome,
        receipt: UsageReceipt,
        outcome_unknown: bool,
    ) -> Event {
        let error = match ToolCallResult::from_invocation(outcome) {
            ToolCallResult::Error(e) => e,
            ToolCallResult::Output(_) => ToolCallError::InvalidOutput {
                message: "the attempt returned an output".into(),
            },
        };
        Event::ToolCallAttemptFailed(ToolCallAttemptFailed {
            call_id: self.intent.call_id.clone(),
            attempt: self.attempt,
            error,
            receipt,
            outcome_unknown,
        })
    }

    /// The record that another run already executed this keyed call.
    pub fn deduplicated(
        &self,
        result: ToolCallResult,
        origin_run: RunId,
        origin_call: CallId,
    ) -> Event {
        Event::ToolCallDeduplicated(ToolCallDeduplicated {
            call_id: self.intent.call_id.clone(),
            idempotency_key: self.intent.idempotency_key.clone(),
            result,
            origin_run,
            origin_call,
        })
    }

    /// The completion to record for what the lease returned.
    pub fn completion(&self, outcome: &InvocationOutcome, receipt: UsageReceipt) -> Event {
        Event::ToolCallCompleted(ToolCallCompleted {
            call_id: self.intent.call_id.clone(),
            result: ToolCallResult::from_invocation(outcome),
            receipt,
        })
    }
}

fn wit_call(run_id: &RunId, call_id: &CallId, tool: &ToolRef, arguments: &Value) -> wit::Call {
    wit::Call {
        id: call_id.to_string(),
        run_id: run_id.to_string(),
        tool: tool.tool.clone(),
        arguments: arguments.to_string(),
        idempotency_key: idempotency_key(run_id, call_id),
    }
}

/// A tool call that needs a human's approval.
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalRequest {
    /// The call.
    pub call_id: CallId,
    /// The tool.
    pub tool: ToolRef,
    /// Its frozen arguments.
    pub arguments: Value,
    /// Its effect class.
    pub effect: EffectClass,
}

impl ApprovalRequest {
    /// What an approval of the call must name.
    pub fn digest(&self) -> CallDigest {
        CallDigest::of_call(&self.tool.model_name(), &self.arguments)
    }

    /// The call to hand the plugin's preflight.
    pub fn wit_call(&self, run_id: &RunId) -> wit::Call {
        wit_call(run_id, &self.call_id, &self.tool, &self.arguments)
    }

    /// The event to record for what the preflight returned (`None` when no
    /// preflight ran), at the clock reading `at_ms`: the run parks there.
    pub fn event(&self, preflight: Option<(&PreflightOutcome, UsageReceipt)>, at_ms: u64) -> Event {
        let (preview, preflight_error, receipt) = match preflight {
            None => (None, None, None),
            Some((Ok(Ok(p)), receipt)) => (Some(Preview::from(p)), None, Some(receipt)),
            Some((Ok(Err(e)), receipt)) => (None, Some(ToolCallError::from_wit(e)), Some(receipt)),
            Some((Err(e), receipt)) => (None, Some(ToolCallError::from_lease(e)), Some(receipt)),
        };
        Event::ApprovalRequested(ApprovalRequested {
            call_id: self.call_id.clone(),
            tool: self.tool.clone(),
            effect: Some(self.effect),
            preview,
            preflight_error,
            receipt,
            digest: Some(self.digest()),
            at_ms: Some(at_ms),
        })
    }
}

/// Why to park.
#[derive(Clone, Debug, PartialEq)]
pub enum Park {
    /// A budget is used up.
    BudgetExceeded(BudgetOverrun),
    /// The model asked a human: suspend until input arrives.
    Suspend(Suspended),
    /// The model called an external tool: wait for the application.
    External(ExternalCallRequested),
    /// A failed model call's next attempt is due later than a driver
    /// waits: park until then.
    Wait(WaitStarted),
}

/// Why there is nothing to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Idle {
    /// The run is over.
    Terminal(RunStatus),
    /// A call waits for approval.
    AwaitingApproval {
        /// The call.
        call_id: CallId,
    },
    /// The run waits for input.
    Suspended {
        /// The call the input answers.
        call_id: CallId,
    },
    /// The run waits for the application to report an external tool's
    /// output.
    AwaitingExternal {
        /// The call.
        call_id: CallId,
    },
    /// The child run of a call waits (`status`).
    AwaitingChild {
        /// The call.
        call_id: CallId,
        /// The child run.
        child_run: RunId,
        /// The child's status.
        status: RunStatus,
    },
    /// A budget is used up.
    BudgetExceeded(BudgetOverrun),
    /// A failed model call's next attempt is due at `until_ms`: a driver
    /// that finds the time has come records `wait_ended` and goes on.
    Waiting {
        /// The wake-up time, in the injected clock's milliseconds.
        until_ms: u64,
    },
    /// A write's outcome is unknown: a human must resolve it.
    NeedsReconciliation {
        /// The write.
        call_id: CallId,
    },
    /// The log may be missing what the run did (a restore): a human must
    /// check and record `reconciled`, or abandon the run.
    ReconciliationRequired {
        /// Since when, if known (milliseconds since the epoch).
        since_ms: Option<i64>,
    },
}

/// Budgets checked before a model call for a new step.
const NEW_STEP_BUDGETS: [BudgetKind; 5] = [
    BudgetKind::Steps,
    BudgetKind::InputTokens,
    BudgetKind::OutputTokens,
    BudgetKind::Cost,
    BudgetKind::WallTime,
];
/// Budgets checked before retrying a step's model call.
const RETRY_BUDGETS: [BudgetKind; 4] = [
    BudgetKind::InputTokens,
    BudgetKind::OutputTokens,
    BudgetKind::Cost,
    BudgetKind::WallTime,
];
/// Budgets checked before a tool call or its approval request.
const TOOL_BUDGETS: [BudgetKind; 3] = [
    BudgetKind::ToolCalls,
    BudgetKind::Fuel,
    BudgetKind::WallTime,
];
/// Budgets that must not be crossed (over, not merely at, the limit) for a
/// tool call or its approval request to start: the model call that crossed
/// one starts none of the tool calls it asked for.
const CROSSED_BEFORE_TOOLS: [BudgetKind; 3] = [
    BudgetKind::InputTokens,
    BudgetKind::OutputTokens,
    BudgetKind::Cost,
];

/// The next action of the run in `state`, for the agent `view`.
pub fn decide(state: &RunState, view: &AgentView) -> Action {
    decide_with(state, view, RequestDetail::Full)
}

/// How much of a model request [`decide_with`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestDetail {
    /// The whole request and its hash.
    Full,
    /// The request without its messages, and an empty hash: for replay,
    /// which hashes the conversation incrementally (building every request
    /// of a long run in full would cost time quadratic in its length).
    Frame,
}

/// [`decide`], building model requests in `detail`. With
/// [`RequestDetail::Frame`], a new model call's input is not checked
/// against the budgets (its size is not known here): the caller does it
/// with [`input_gate`] once it knows the size.
pub(crate) fn decide_with(state: &RunState, view: &AgentView, detail: RequestDetail) -> Action {
    let action = decide_unchecked(state, view, detail);
    let size = match &action {
        Action::CallModel(call) if !call.recorded && detail == RequestDetail::Full => {
            call.request_size
        }
        Action::Compact(call) if !call.recorded => request_size(&call.request),
        _ => return action,
    };
    input_gate(state, view, size).unwrap_or(action)
}

/// Parks the run, when a model call whose request is `request_size` bytes
/// (of what its hash covers) would cross the input-token or cost budget by
/// its input alone: its input is estimated at a token per 4 bytes.
pub(crate) fn input_gate(state: &RunState, view: &AgentView, request_size: u64) -> Option<Action> {
    let limits = state.effective_limits(&view.budgets);
    input_overrun(
        request_size.div_ceil(4),
        &state.usage,
        &limits,
        view.pricing.as_ref(),
    )
    .map(|overrun| Action::Park(Park::BudgetExceeded(overrun)))
}

fn decide_unchecked(state: &RunState, view: &AgentView, detail: RequestDetail) -> Action {
    if state.terminal.is_some() {
        return Action::Idle(Idle::Terminal(state.status()));
    }
    if let Some(Parked::Child {
        call_id, child_run, ..
    }) = state.parked()
    {
        // The child may have moved on since it was found waiting: driving
        // the parent drives the child.
        return Action::DriveChild(ChildDrive {
            call_id: call_id.clone(),
            child_run: child_run.clone(),
        });
    }
    if let Some(parked) = state.parked() {
        return Action::Idle(match parked {
            Parked::Approval { call } => Idle::AwaitingApproval {
                call_id: call.call_id.clone(),
            },
            Parked::Input { call_id, .. } => Idle::Suspended {
                call_id: call_id.clone(),
            },
            Parked::External(request) => Idle::AwaitingExternal {
                call_id: request.call_id.clone(),
            },
            Parked::Budget(overrun) => Idle::BudgetExceeded(overrun),
            Parked::Wait(wait) => Idle::Waiting {
                until_ms: wait.until_ms,
            },
            Parked::Reconciliation(intent) => Idle::NeedsReconciliation {
                call_id: intent.call_id.clone(),
            },
            Parked::Hold(hold) => Idle::ReconciliationRequired {
                since_ms: hold.since_ms,
            },
            Parked::Child { .. } => unreachable!("a waiting child is driven above"),
        });
    }
    if let ModelCallProgress::InFlight { step, attempt, .. } = state.model_call {
        return Action::CallModel(model_call(state, view, step, attempt, true, detail));
    }
    if let Some((step, upto, _)) = &state.compaction.in_flight {
        return Action::Compact(compaction_call(state, view, *step, *upto, true));
    }
    // A parallel batch: the next call starts beside those in flight when
    // it may (`batch.rs`); otherwise the first in flight is seen to.
    if let Some(action) = launch(state, view, |call| decide_call(state, view, call)) {
        return action;
    }
    if let Some(intent) = state.in_flight_tool() {
        // Not a write: a dangling write parks the run above. The same
        // intent, so the same idempotency key, on every attempt.
        let failed = state.next_call().map_or(0, |c| c.failed_attempts);
        return Action::CallTool(ToolInvocation {
            intent: intent.clone(),
            attempt: failed + 1,
            recorded: true,
        });
    }
    if let Some((call_id, child_run)) = state.child_in_flight() {
        return Action::DriveChild(ChildDrive {
            call_id: call_id.clone(),
            child_run: child_run.clone(),
        });
    }
    if state.invalid_calls_in_a_row >= view.max_invalid_tool_calls {
        return Action::Fail(RunError::InvalidToolCalls {
            count: state.invalid_calls_in_a_row,
            last: state.last_invalid_call.clone().unwrap_or_default(),
        });
    }
    if let Some(action) = policy_gates(state, view) {
        return action;
    }
    if let Some(call) = state.next_call() {
        return decide_call(state, view, call);
    }
    if let ModelCallProgress::Failed {
        step,
        attempts,
        error,
        at_ms,
        retry_at_ms,
    } = &state.model_call
    {
        if !error.transient {
            return Action::Fail(RunError::ModelCallFailed {
                step: *step,
                message: error.message.clone(),
            });
        }
        if *attempts >= view.retry.max_attempts {
            return Action::Fail(RunError::ModelAttemptsExhausted {
                step: *step,
                attempts: *attempts,
                message: error.message.clone(),
            });
        }
        if let (Some(since_ms), Some(until_ms)) = (*at_ms, *retry_at_ms)
            && view.retry.parks(since_ms, until_ms)
            && state.wait.is_none()
        {
            return Action::Park(Park::Wait(WaitStarted {
                step: *step,
                since_ms,
                until_ms,
            }));
        }
        return gated(state, view, &RETRY_BUDGETS, || {
            context_then_call(state, view, *step, attempts + 1, detail)
        });
    }
    if let Some(turn) = state.last_turn()
        && turn.calls.is_empty()
        && !turn.continued
    {
        if turn.stop_reason == StopReason::MaxTokens {
            return Action::Fail(RunError::OutputTruncated { step: turn.step });
        }
        let refused = turn.stop_reason == StopReason::Refusal;
        if refused && view.on_refusal == OnRefusal::Fail {
            return Action::Fail(RunError::Refused {
                step: turn.step,
                message: preview_text(&turn.text),
            });
        }
        let output = match &view.output_schema {
            // A refusal completes with its text: it cannot meet a schema.
            _ if refused => Value::String(turn.text.clone()),
            None => Value::String(turn.text.clone()),
            Some(schema) => match check_final_answer(schema, &turn.text) {
                Ok(value) => value,
                Err(violation) if state.output_rejections < MAX_OUTPUT_REJECTIONS => {
                    return Action::RejectOutput(OutputRejected {
                        step: turn.step,
                        violation,
                    });
                }
                Err(violation) => {
                    return Action::Fail(RunError::OutputInvalid {
                        step: turn.step,
                        violation,
                    });
                }
            },
        };
        let point = PolicyPoint::BeforeFinish { step: turn.step };
        if let Some(action) = gate(state, view, point, || PolicySubject::BeforeFinish {
            step: turn.step,
            output: output.clone(),
        }) {
            return action;
        }
        return Action::Finish(RunCompleted {
            output,
            by_host: false,
        });
    }
    let step = state.turns.len() as u32 + 1;
    gated(state, view, &NEW_STEP_BUDGETS, || {
        context_then_call(state, view, step, 1, detail)
    })
}

/// Before the model call of `step`: a source that failed and must fail the
/// run does; then each source not yet resolved for the step (or, resolved
/// once per turn, not yet at all) is resolved, in the agent's order; then
/// the call.
fn context_then_call(
    state: &RunState,
    view: &AgentView,
    step: u32,
    attempt: u32,
    detail: RequestDetail,
) -> Action {
    for source in &view.context {
        let recorded = state.context.get(&source.name);
        if source.on_error == OnContextError::Fail
            && let Some(ContextState {
                step: failed_at,
                outcome: ContextOutcome::Failed(error),
                ..
            }) = recorded
        {
            return Action::Fail(RunError::ContextFailed {
                name: source.name.clone(),
                step: *failed_at,
                message: error.to_string(),
            });
        }
    }
    for source in &view.context {
        let recorded = state.context.get(&source.name);
        let due = match source.resolve {
            ResolveWhen::EachCall => recorded.is_none_or(|c| c.step != step),
            ResolveWhen::OncePerTurn => recorded.is_none(),
        };
        if due {
            return Action::ResolveContext(ContextResolution {
                source: source.name.clone(),
                step,
            });
        }
    }
    if attempt == 1
        && let Some(settings) = view.compaction
        && state.compaction.failed_at_step != Some(step)
    {
        let request = build_request(state, view, max_tokens(state, view));
        if estimate_tokens(&request) > settings.max_prompt_tokens {
            let done = state.compaction.summary.as_ref().map_or(1, |s| s.upto);
            if let Some(upto) = cut(state.conversation(), done, settings.keep_recent) {
                return Action::Compact(compaction_call(state, view, step, upto, false));
            }
        }
    }
    Action::CallModel(model_call(state, view, step, attempt, false, detail))
}

fn compaction_call(
    state: &RunState,
    view: &AgentView,
    step: u32,
    upto: usize,
    recorded: bool,
) -> CompactionCall {
    let request = compaction_request(
        &view.model,
        state.conversation(),
        state.compaction.summary.as_ref(),
        upto,
        max_tokens(state, view),
    );
    CompactionCall {
        step,
        upto,
        request_hash: request_hash(&request),
        request,
        recorded,
    }
}

/// Output tokens for the next call: the agent's cap, within what the
/// output-token budget has left.
fn max_tokens(state: &RunState, view: &AgentView) -> u32 {
    let limits = state.effective_limits(&view.budgets);
    let remaining = limits
        .output_tokens
        .map(|limit| limit.saturating_sub(state.usage.output_tokens).max(1));
    match remaining {
        Some(r) => view.max_tokens.min(u32::try_from(r).unwrap_or(u32::MAX)),
        None => view.max_tokens,
    }
}

/// Why a call's arguments are not a JSON object, if they are not: cut off
/// by the token cap (the turn stopped at `max_tokens` and they are not
/// whole JSON), not JSON at all (kept as the text that came), or some
/// other JSON value.
fn malformed_arguments(state: &RunState, arguments: &Value) -> Option<ToolCallError> {
    if arguments.is_object() {
        return None;
    }
    let cut = state
        .last_turn()
        .is_some_and(|t| t.stop_reason == StopReason::MaxTokens);
    Some(match arguments {
        Value::String(text) if cut => ToolCallError::TruncatedCall {
            received: preview_text(text),
        },
        Value::String(text) => ToolCallError::InvalidArguments {
            message: match json_limits::parse(text) {
                Err(json_limits::ParseError::TooDeep(e)) => format!("the arguments are {e}"),
                _ => format!("the arguments are not valid JSON: `{}`", preview_text(text)),
            },
        },
        other => ToolCallError::InvalidArguments {
            message: format!("arguments must be a JSON object, got `{other}`"),
        },
    })
}

/// At most 200 bytes of `text`, cut at a character boundary.
fn preview_text(text: &str) -> String {
    const MAX: usize = 200;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Why `arguments` do not fit `tool`'s input schema (or the schema is
/// unusable), if they do not.
fn schema_rejection(
    tool: &AgentTool,
    schemas: &CompiledSchemas,
    arguments: &Value,
) -> Option<ToolCallError> {
    match schemas.check(&tool.name, &tool.input_schema, arguments) {
        Ok(()) => None,
        Err(e @ SchemaError::Violation { .. }) => Some(ToolCallError::InvalidArguments {
            message: e.to_string(),
        }),
        Err(e @ SchemaError::InvalidSchema { .. }) => Some(ToolCallError::Unavailable {
            message: format!("the tool's input schema is unusable: {e}"),
        }),
    }
}

/// The mistake in a call of `tool` with `arguments`, if it has one: the
/// rejections [`decide`] would record for it and count as the model's
/// invalid calls (arguments that are not an object or do not fit the
/// input schema, a missing idempotency-key argument), by the same checks.
///
/// For a caller that is not the run's model: an MCP client's call is
/// checked with this before the run is offered it, so the client's mistake
/// is answered to that call and never counted against the session's run
/// (whose model is the client, its calls independent requests).
pub fn call_mistake(
    tool: &AgentTool,
    schemas: &CompiledSchemas,
    arguments: &Value,
) -> Option<ToolCallError> {
    if !arguments.is_object() {
        return Some(ToolCallError::InvalidArguments {
            message: format!("arguments must be a JSON object, got `{arguments}`"),
        });
    }
    if let Some(error) = schema_rejection(tool, schemas, arguments) {
        return error.is_invalid_call().then_some(error);
    }
    match &tool.target {
        ToolTarget::Plugin { key: Some(k), .. } if key_argument(arguments, &k.field).is_none() => {
            Some(ToolCallError::MissingIdempotencyKey {
                field: k.field.clone(),
            })
        }
        _ => None,
    }
}

fn decide_call(state: &RunState, view: &AgentView, call: &ToolCallState) -> Action {
    let reject = |error| {
        Action::RejectToolCall(ToolCallRejected {
            call_id: call.call_id.clone(),
            error,
        })
    };
    // An approval approves one frozen call: checked here, before anything
    // else is done with the call, on every host that drives the run.
    if let ToolCallProgress::Approved {
        digest: Some(approved),
        rule,
        ..
    } = &call.progress
    {
        let digest = call.digest();
        if *approved != digest {
            return Action::WithdrawApproval(ApprovalWithdrawn {
                call_id: call.call_id.clone(),
                reason: WithdrawReason::DigestMismatch,
                approved: Some(approved.clone()),
                call: digest,
                rule: rule.as_ref().map(|r| r.id.clone()),
                at_ms: None,
            });
        }
    }
    if matches!(call.progress, ToolCallProgress::Pending)
        && let Some(error) = past_ceiling(state, view, call)
    {
        return reject(error);
    }
    let Some(tool) = view.tool(&call.call.name) else {
        return reject(ToolCallError::UnknownTool {
            name: call.call.name.clone(),
        });
    };
    if matches!(call.progress, ToolCallProgress::Pending) {
        if let Some(error) = malformed_arguments(state, &call.call.arguments) {
            return reject(error);
        }
        if let Some(error) = schema_rejection(tool, &view.input_schemas, &call.call.arguments) {
            return reject(error);
        }
    }
    if matches!(call.progress, ToolCallProgress::Pending) {
        let point = PolicyPoint::BeforeToolCall {
            call_id: call.call_id.clone(),
        };
        if let Some(action) = gate(state, view, point, || PolicySubject::BeforeToolCall {
            call_id: call.call_id.clone(),
            tool: call.call.name.clone(),
            arguments: call.call.arguments.clone(),
            effect: match &tool.target {
                ToolTarget::Plugin { effect, .. } => Some(*effect),
                _ => None,
            },
        }) {
            return action;
        }
    }
    match (&tool.target, &call.progress) {
        (ToolTarget::Human { response_schema }, ToolCallProgress::Pending) => {
            Action::Park(Park::Suspend(Suspended {
                call_id: call.call_id.clone(),
                reason: format!(
                    "human tool `{}` called with {}",
                    tool.name, call.call.arguments
                ),
                schema: response_schema.clone(),
            }))
        }
        (
            ToolTarget::Plugin {
                tool,
                effect,
                needs_approval,
                key,
            },
            progress @ (ToolCallProgress::Pending | ToolCallProgress::Approved { .. }),
        ) => {
            let idempotency_key = match key {
                None => idempotency_key(&state.run_id, &call.call_id),
                Some(k) => match key_argument(&call.call.arguments, &k.field) {
                    Some(value) => commitment_key(&k.scope, value),
                    None => {
                        return reject(ToolCallError::MissingIdempotencyKey {
                            field: k.field.clone(),
                        });
                    }
                },
            };
            gated_tool(state, view, || {
                if *needs_approval && matches!(progress, ToolCallProgress::Pending) {
                    Action::RequestApproval(ApprovalRequest {
                        call_id: call.call_id.clone(),
                        tool: tool.clone(),
                        arguments: call.call.arguments.clone(),
                        effect: *effect,
                    })
                } else {
                    Action::CallTool(ToolInvocation {
                        intent: ToolCallIntent {
                            call_id: call.call_id.clone(),
                            tool: tool.clone(),
                            arguments: call.call.arguments.clone(),
                            effect: *effect,
                            idempotency_key: idempotency_key.clone(),
                            keyed_by: key.clone(),
                        },
                        attempt: 1,
                        recorded: false,
                    })
                }
            })
        }
        (
            ToolTarget::External {
                output_schema,
                must_match,
            },
            ToolCallProgress::Pending,
        ) => Action::Park(Park::External(ExternalCallRequested {
            call_id: call.call_id.clone(),
            tool: tool.name.clone(),
            arguments: call.call.arguments.clone(),
            output_schema: output_schema.clone(),
            must_match: must_match.clone(),
        })),
        (ToolTarget::Agent { budgets, agent }, ToolCallProgress::Pending) => {
            gated_tool(state, view, || {
                let limits = state.effective_limits(&view.budgets);
                // Beside children in flight, what they were granted is
                // not the parent's to give again.
                let committed = state.committed_usage();
                match child_limits(budgets, &agent.budgets, &limits, &committed) {
                    Ok((budgets, capped)) => Action::StartChild(ChildStarted {
                        call_id: call.call_id.clone(),
                        child_run: child_run_id(&state.run_id, &call.call_id),
                        agent: agent.name.clone(),
                        agent_digest: agent.digest.clone(),
                        input: call.call.arguments.clone(),
                        budgets,
                        capped,
                    }),
                    // Nothing left to give: the parent parks, as it would
                    // before spending it itself.
                    Err(kind) => Action::Park(Park::BudgetExceeded(BudgetOverrun {
                        budget: kind,
                        used: committed.get(kind),
                        limit: limits.get(kind).unwrap_or_default(),
                        needed: None,
                    })),
                }
            })
        }
        // An approved call whose tool became a human, external or agent
        // tool: the agent changed under the run. Refuse it rather than
        // guess.
        (ToolTarget::Human { .. } | ToolTarget::External { .. } | ToolTarget::Agent { .. }, _) => {
            reject(ToolCallError::Unavailable {
                message: format!("`{}` is no longer a plugin tool", tool.name),
            })
        }
        // Settled, in flight or parked calls are handled before this.
        (ToolTarget::Plugin { .. }, _) => {
            unreachable!("decide_call sees pending or approved calls")
        }
    }
}

/// The host's ceiling a pending call is past, if any (`ceilings.rs`): its
/// place in the response past `tool_calls_per_response`; for a call to a
/// plugin or another agent, the run's fuel (its children's and what
/// children in flight were granted included) reaching `fuel_per_run`; for
/// a call to another agent, the calls to agents before it in the response
/// reaching `children_per_response`, or the children the run started
/// reaching `children_per_run`. Checked before anything else is done with
/// the call, so a refused call reaches no policy, approval or plugin.
fn past_ceiling(state: &RunState, view: &AgentView, call: &ToolCallState) -> Option<ToolCallError> {
    let ceilings = state.ceilings()?;
    let turn = state.last_turn()?;
    let place = turn.calls.iter().position(|c| c.call_id == call.call_id)?;
    let reached = |ceiling: Ceiling| {
        Some(ToolCallError::CeilingReached {
            ceiling,
            limit: ceilings.get(ceiling),
        })
    };
    if place as u64 >= ceilings.get(Ceiling::ToolCallsPerResponse) {
        return reached(Ceiling::ToolCallsPerResponse);
    }
    let is_child = |c: &ToolCallState| {
        view.tool(&c.call.name)
            .is_some_and(|t| matches!(t.target, ToolTarget::Agent { .. }))
    };
    let uses_fuel = view.tool(&call.call.name).is_some_and(|t| {
        matches!(
            t.target,
            ToolTarget::Plugin { .. } | ToolTarget::Agent { .. }
        )
    });
    if uses_fuel && state.committed_usage().fuel >= ceilings.get(Ceiling::FuelPerRun) {
        return reached(Ceiling::FuelPerRun);
    }
    if !is_child(call) {
        return None;
    }
    let earlier = turn.calls[..place].iter().filter(|c| is_child(c)).count();
    if earlier as u64 >= ceilings.get(Ceiling::ChildrenPerResponse) {
        return reached(Ceiling::ChildrenPerResponse);
    }
    if u64::from(state.children_started) >= ceilings.get(Ceiling::ChildrenPerRun) {
        return reached(Ceiling::ChildrenPerRun);
    }
    None
}

/// The `run_start` and `after_response` policies: asked before the first
/// model call, and after each response before anything else is done with it.
fn policy_gates(state: &RunState, view: &AgentView) -> Option<Action> {
    if view.policies.is_empty() || !matches!(state.model_call, ModelCallProgress::Idle) {
        return None;
    }
    match state.last_turn() {
        None => gate(state, view, PolicyPoint::RunStart, || {
            PolicySubject::RunStart {
                input: state.input.clone(),
                session: state.session_id.as_ref().map(ToString::to_string),
            }
        }),
        Some(turn) => gate(
            state,
            view,
            PolicyPoint::AfterResponse { step: turn.step },
            || PolicySubject::AfterResponse {
                step: turn.step,
                text: turn.text.clone(),
                tool_calls: turn.calls.iter().map(|c| c.call.clone()).collect(),
            },
        ),
    }
}

/// [`gated`] for a tool call: a model budget crossed parks the run too.
fn gated_tool(state: &RunState, view: &AgentView, then: impl FnOnce() -> Action) -> Action {
    let limits = state.effective_limits(&view.budgets);
    if let Some(overrun) = first_crossed(&CROSSED_BEFORE_TOOLS, &state.committed_usage(), &limits) {
        return Action::Park(Park::BudgetExceeded(overrun));
    }
    gated(state, view, &TOOL_BUDGETS, then)
}

/// `then()` unless a budget in `kinds` is used up (park) or the wall time
/// must be read first.
fn gated(
    state: &RunState,
    view: &AgentView,
    kinds: &[BudgetKind],
    then: impl FnOnce() -> Action,
) -> Action {
    let limits = state.effective_limits(&view.budgets);
    let counted: Vec<BudgetKind> = kinds
        .iter()
        .copied()
        .filter(|k| *k != BudgetKind::WallTime)
        .collect();
    // What children in flight were granted counts as spent: a call started
    // beside them must fit in what is left (equal to `usage` otherwise).
    if let Some(overrun) = first_exhausted(&counted, &state.committed_usage(), &limits) {
        return Action::Park(Park::BudgetExceeded(overrun));
    }
    if kinds.contains(&BudgetKind::WallTime) && limits.wall_time_ms.is_some() {
        if !state.clock_fresh {
            return Action::ObserveClock;
        }
        if let Some(overrun) = first_exhausted(&[BudgetKind::WallTime], &state.usage, &limits) {
            return Action::Park(Park::BudgetExceeded(overrun));
        }
    }
    then()
}

fn model_call(
    state: &RunState,
    view: &AgentView,
    step: u32,
    attempt: u32,
    recorded: bool,
    detail: RequestDetail,
) -> ModelCall {
    let max_tokens = max_tokens(state, view);
    let (request, request_hash, request_size) = match detail {
        RequestDetail::Full => {
            let request = build_request(state, view, max_tokens);
            let mut hasher = RequestHasher::new();
            for message in &request.messages {
                hasher.push(message);
            }
            let (hash, size) = hasher.finish_sized(&request);
            (request, hash, size)
        }
        RequestDetail::Frame => (
            request_frame(state, view, max_tokens),
            RequestHash::from_hex(String::new()),
            0,
        ),
    };
    ModelCall {
        step,
        attempt,
        request,
        request_hash,
        request_size,
        provider: view.provider.clone(),
        recorded,
    }
}
