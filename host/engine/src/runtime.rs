//! The [`Runtime`]: drives runs over an [`EventStore`], a [`PluginHost`] and
//! model providers, one step at a time, and offers the verbs a host needs:
//! `start`, `step`, `drive`, `recover`, `resume`, `approve`, `deny`,
//! `resolve`, `abandon`, `cancel`, `verify`, `subscribe`; sessions
//! (`StartOptions::session`, `session_runs`) and live turns (`start_turn`,
//! `continue_turn`, in `turn.rs`).
//!
//! One step: load (or keep) the log, fold it, [`decide`](super::decide()), then perform the
//! action: for a model or tool call, append the intent, perform the effect,
//! append the completion; for anything else, append its one event. Every
//! append carries the log length it expects, so two drivers of one run
//! cannot both write (the loser gets [`RuntimeError::Conflict`] and writes
//! nothing).
//!
//! # Durability
//!
//! Every event is committed before the driver makes the next effect, but
//! not every one is its own append, and not every append waits for the
//! disk. An event after which the run only decides, with no effect in
//! between, is held (`Log::held`) and rides with the run's next append:
//! a model call's completion (with the tool intents or the end the model's
//! answer leads to), a tool call's completion (with the next model call's
//! intent). An append the run can lose in a machine crash and make again
//! without harm is [deferred](Durability::Deferred) to the store's next
//! synced write, which syncs it too: a model call's completion (its intent
//! is synced; lost, the call is made again, as after a crash mid-stream),
//! a read's intent and completion (lost, the read is made again: harmless
//! by definition). Everything else is synced: a write's intent before the
//! write starts (the write-ahead rule), its completion before any further
//! effect starts, a keyed call's settlement, approvals, parks, the end.
//! What a step does before anything it appends (a context source, a policy,
//! a child, a call recorded before a crash, a delivery) has what is held
//! written first (`writes_first`), and so does every end of a drive or a
//! step. A turn calling one read tool costs two appends (the model's
//! completion with the read's intent, the read's completion with the next
//! model call's intent) and one fsync; a turn calling a write two of each
//! (its intent, and the next model call's). A store keeps
//! what a crash leaves a prefix of what it acknowledged, so what a crash
//! can leave is a log cut at some append boundary after the last synced
//! append: a state the crash tests already recover from (`all::engine`,
//! every boundary).
//!
//! Clock and randomness are injected ([`Runtime::with_hooks`]) so that a
//! killed-and-recovered run records the same log as an uninterrupted one;
//! so is the sleep a driver waits out a model call's backoff with
//! ([`Runtime::with_sleep`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::agent::{Agent, AgentError};
use super::budget::{InputTooLarge, check_input_size};
use super::ceilings::RunCeilings;
use super::channels::{Channel, Delivery, outcome_error, settle};
use super::decide::{
    Action, ApprovalRequest, CompactionCall, ContextResolution, Idle, MAX_TOOL_ATTEMPTS, ModelCall,
    RequestDetail, ToolInvocation, decide_with, input_gate,
};
use super::events::{
    ApprovalDenied, ApprovalGranted, ClockObserved, ContextError, ContextFailed, ContextItem,
    ContextResolved, Event, EventError, ExternalCallCompleted, InvocationOutcome, KeyReleased,
    KeySettled, Reconciled, ReconciliationRequired, RunAbandoned, RunCancelled, RunStarted,
    ToolCallResolved, ToolCallResult, Unrecordable, UnresolvedWrite, WaitEnded, decode,
    encode_readable,
};
use super::events::{DeliveryError, DeliveryFailed, DeliveryIntent};
use super::ids::{AgentDigest, CallDigest, CallId, RunId, SessionId};
use super::keys::{KeyInfo, KeyState};
use super::policy_hooks::{
    DEFAULT_POLICY_TIMEOUT, Policy, PolicyConsult, PolicyVerdict, consult as consult_policy,
};
use super::policy_plugin::consult_plugin as consult_policy_plugin;
use super::prompt::PromptCache;
use super::replay::{ReplayError, ReplayOptions, replay};
use super::retry::{RetrySleep, TokioSleep};
use super::start::StartOptions;
use super::state::{FoldError, ModelCallProgress, Parked, ResumeError, RunState, fold};
use super::state::{next_delivery, owed_count};
use super::status::RunStatus;
use super::view::{AgentView, AgentViewError};
use super::witness::Witness;
use warden_plugins::grant::EffectClass;
use warden_plugins::{LoadedPlugin, PluginError, PluginHost};
use warden_providers::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderEvent, ResponseAssembler,
};
use warden_sandbox::{LeaseFailure, Leased, RunBound, ValidUntil, wit};
use warden_store::{
    ChainBreak, Claim, CommitmentFilter, Durability, EventStore, Finding, Holder, KeyClaim,
    Listing, ListingStatus, RunMeta, SETTLED_STATUSES, Settle, Settlement, SettlingAppend,
    StoreError, StoredEvent, VerifyReport,
};

mod batch;
mod children;
mod fork;
mod rules;
mod session;
pub use children::ChildRefusal;
pub use fork::{FORKED_FROM_LABEL, ForkOptions, ForkRefusal};
pub use rules::ApprovalScope;
pub use session::{SessionRun, SessionSummary, resolve_history};

/// Where the runtime reads the time. Injected so tests and recoveries are
/// deterministic.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Where the runtime draws random numbers (run ids and seeds).
pub trait Random: Send + Sync {
    /// A random 64-bit value.
    fn next_u64(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// The operating system's random source.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsRandom;

impl Random for OsRandom {
    fn next_u64(&self) -> u64 {
        rand::random()
    }
}

/// A clock that always reads the same time: for tests and deterministic
/// replays.
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

/// A random source that always returns the same value: for tests.
#[derive(Clone, Copy, Debug)]
pub struct FixedRandom(pub u64);

impl Random for FixedRandom {
    fn next_u64(&self) -> u64 {
        self.0
    }
}

/// A verb that cannot be carried out. Nothing is written when a verb fails,
/// except where the variant says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A child run that cannot be started or driven (see
    /// `runtime/children.rs`).
    #[error("run `{run_id}`: {reason}")]
    ChildRefused {
        /// The parent run.
        run_id: RunId,
        /// Why.
        reason: ChildRefusal,
    },
    /// A fork that cannot be made ([`Runtime::fork`]).
    #[error("run `{run_id}` cannot be forked: {reason}")]
    ForkRefused {
        /// The source run.
        run_id: RunId,
        /// Why.
        reason: ForkRefusal,
    },
    /// The run is a fork a crash left half written: its log holds only the
    /// source's first event. Make the same fork again with this id to
    /// finish it.
    #[error(
        "run `{run_id}` is an unfinished fork of run `{source_run}`: fork `{source_run}` again with id `{run_id}` to finish it"
    )]
    UnfinishedFork {
        /// The fork.
        run_id: RunId,
        /// The run its only event comes from.
        source_run: RunId,
    },
    /// No run has this id.
    #[error("unknown run `{run_id}`")]
    UnknownRun {
        /// The id.
        run_id: RunId,
    },
    /// `start` with an id (`StartOptions::id`) that already has history.
    #[error("run `{run_id}` already exists")]
    AlreadyStarted {
        /// The id.
        run_id: RunId,
    },
    /// The verb needs a parked run of another kind.
    #[error("run `{run_id}` is {status}, not {needed}")]
    NotParked {
        /// The run.
        run_id: RunId,
        /// Its status.
        status: RunStatus,
        /// What the verb needs.
        needed: &'static str,
    },
    /// `complete` named a call that is not the external call the run waits for.
    #[error(
        "run `{run_id}`: call `{call_id}` is not the external call it awaits (awaiting: {awaiting})"
    )]
    NotAwaitingExternal {
        /// The run.
        run_id: RunId,
        /// The call named.
        call_id: CallId,
        /// The external call the run waits for.
        awaiting: CallId,
    },
    /// An approval named the digest of a call other than the one awaiting
    /// approval (its arguments are not what the approver saw); nothing was
    /// recorded.
    #[error(
        "run `{run_id}`: call `{call_id}` has digest {actual}, not {expected}: nothing was approved"
    )]
    DigestMismatch {
        /// The run.
        run_id: RunId,
        /// The call awaiting approval.
        call_id: CallId,
        /// The digest the approver named.
        expected: String,
        /// The call's digest.
        actual: CallDigest,
    },
    /// `approve`/`deny` named a call that is not the one awaiting approval.
    #[error("run `{run_id}`: call `{call_id}` is not awaiting approval (awaiting: {awaiting})")]
    NotAwaitingApproval {
        /// The run.
        run_id: RunId,
        /// The call named.
        call_id: CallId,
        /// The call that is awaiting approval, if any.
        awaiting: String,
    },
    /// `resume` input was rejected before anything was written.
    #[error("run `{run_id}`: input rejected: {error}")]
    InputRejected {
        /// The run.
        run_id: RunId,
        /// Why.
        error: ResumeError,
    },
    /// `resolve` on a run whose log does not end at a dangling write.
    #[error("run `{run_id}` is {status}: there is no write to resolve")]
    NotReconcilable {
        /// The run.
        run_id: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// An automatic verb on a run whose last write has an unknown outcome:
    /// a human must `resolve` or `abandon` it.
    #[error(
        "run `{run_id}` needs reconciliation: write `{}` to `{}` has no recorded outcome; resolve it with its outcome or abandon the run",
        write.call_id, write.tool.model_name()
    )]
    NeedsReconciliation {
        /// The run.
        run_id: RunId,
        /// The write, with its frozen arguments.
        write: Box<UnresolvedWrite>,
    },
    /// An automatic verb on a run whose log may be missing what it did (it
    /// was restored from a backup): a human must check, then record it
    /// (`resolve`) or abandon the run.
    #[error("run `{run_id}` needs reconciliation: {reason}; check what it did{}, then resolve it (it goes on from its log) or abandon it", since_ms.map(|ms| format!(" after {}", warden_syntax::units::utc_text(ms))).unwrap_or_default())]
    ReconciliationRequired {
        /// The run.
        run_id: RunId,
        /// Why.
        reason: String,
        /// Since when its log may be missing events (milliseconds since
        /// the epoch), if known.
        since_ms: Option<i64>,
    },
    /// The verb needs a run that is not over.
    #[error("run `{run_id}` is already {status}")]
    AlreadyTerminal {
        /// The run.
        run_id: RunId,
        /// How it ended.
        status: RunStatus,
    },
    /// The run's log does not fit the agent as it is now.
    #[error("run `{run_id}`: {error}")]
    Replay {
        /// The run.
        run_id: RunId,
        /// The divergence or changed agent.
        error: ReplayError,
    },
    /// A newer claim was issued on the run (another host took it over), or
    /// this driver's claim was released; nothing was written.
    #[error(
        "run `{run_id}`: claim {token} was superseded by claim {current}; another driver owns the run"
    )]
    Fenced {
        /// The run.
        run_id: RunId,
        /// This driver's fencing token.
        token: u64,
        /// The run's newest token.
        current: u64,
    },
    /// This driver's claim ran out by its own clock before it was renewed
    /// (the process was paused, say, or the store did not answer): it
    /// stopped before any further effect or append, and another driver
    /// takes the run over once the claim expires in the store.
    #[error(
        "run `{run_id}`: this driver's claim ran out before it could renew it; it stopped without further effect, and another driver takes the run over"
    )]
    ClaimExpired {
        /// The run.
        run_id: RunId,
    },
    /// A worker holds a live claim covering the run (its own, its
    /// parent's up the tree, or a child's in flight): it may be making the
    /// write a reconciliation verb would settle, so the verb is refused and
    /// nothing was written. Wait for the worker; if it is gone, its claim
    /// runs out at `expires_ms` and the verb is accepted then.
    #[error(
        "run `{run_id}` is driven by worker `{owner}` under its claim on run `{claimed_run}` until {expires_ms} (ms since the epoch): its write may still be in progress; nothing was recorded: wait for that worker to finish, or, if it is gone, for its claim to run out, then check the write and try again"
    )]
    DrivenByWorker {
        /// The run the verb named.
        run_id: RunId,
        /// The run the claim is on (`run_id`, a parent or a child).
        claimed_run: RunId,
        /// The worker holding it.
        owner: String,
        /// When the claim expires unless renewed, in milliseconds since the
        /// Unix epoch.
        expires_ms: i64,
    },
    /// The runtime's witness (`WARDEN_WITNESS`) says the run's log was
    /// rolled back or rewritten: driving it would make again what the cut
    /// tail recorded. Nothing was written; restore the log, or check what
    /// the run did and abandon or fork it.
    #[error(
        "run `{run_id}` is not driven: {problem} (witness `{}`); nothing was recorded",
        .witness.display()
    )]
    RolledBack {
        /// The run.
        run_id: RunId,
        /// Where the witness was read from.
        witness: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Another driver appended to the run first; nothing was written.
    #[error(
        "run `{run_id}` was changed by another driver (expected {expected} events, found {actual})"
    )]
    Conflict {
        /// The run.
        run_id: RunId,
        /// The length this driver expected.
        expected: u64,
        /// The length found.
        actual: u64,
    },
    /// The run's log cannot be read as events.
    #[error("run `{run_id}`: event {seq} cannot be read: {error}")]
    Log {
        /// The run.
        run_id: RunId,
        /// The event's position, from 1.
        seq: u64,
        /// Why.
        error: EventError,
    },
    /// The run's log is not a possible history.
    #[error("run `{run_id}`: {error}")]
    Fold {
        /// The run.
        run_id: RunId,
        /// Where and why.
        error: FoldError,
    },
    /// An input (of a new run, or given to a parked one) is over the
    /// agent's size cap; nothing was written.
    #[error("{}{error}", run_id.as_ref().map(|r| format!("run `{r}`: ")).unwrap_or_default())]
    InputTooLarge {
        /// The run, when the input was for a run that exists.
        run_id: Option<RunId>,
        /// The sizes.
        error: InputTooLarge,
    },
    /// The run's labels (its own with the agent's and the runtime's)
    /// break a label limit: the caller's to fix; nothing was written.
    #[error("labels: {error}")]
    InvalidLabels {
        /// What is wrong, naming the label.
        error: super::agent::LabelError,
    },
    /// The agent's plugins cannot be loaded or do not fit together.
    #[error("agent `{agent}`: {message}")]
    Agent {
        /// The agent.
        agent: String,
        /// What is wrong.
        message: String,
    },
    /// The agent's model provider cannot be set up.
    #[error("agent `{agent}`: {error}")]
    Provider {
        /// The agent.
        agent: String,
        /// Why.
        error: ProviderError,
    },
    /// A standing approval rule that cannot be made or read.
    #[error(transparent)]
    Rule(crate::approvals::RuleError),
    /// The store failed.
    #[error("{error}")]
    Store {
        /// Why.
        error: StoreError,
    },
    /// An external tool's reported output does not satisfy its schema;
    /// nothing was written.
    #[error(
        "run `{run_id}`: the output reported for external call `{call_id}` is rejected: {reason}"
    )]
    OutputRejected {
        /// The run.
        run_id: RunId,
        /// The call.
        call_id: CallId,
        /// The schema violation.
        reason: String,
    },
    /// An external tool's reported output differs from the recorded call
    /// in a field the operator marked; nothing was written.
    #[error(
        "run `{run_id}`: the output reported for external call `{call_id}` has `{field}` = {given}, but the call was made with {recorded}"
    )]
    ExternalMismatch {
        /// The run.
        run_id: RunId,
        /// The call.
        call_id: CallId,
        /// The marked field.
        field: String,
        /// The call's argument.
        recorded: Box<Value>,
        /// The reported output's value (null when missing).
        given: Box<Value>,
    },
    /// The agent enables a policy that is not registered on this runtime
    /// ([`Runtime::with_policy`]); nothing was written.
    #[error(
        "agent `{agent}` enables policy `{policy}`, which is not registered on this runtime (set `plugin` in [policies.{policy}] to a policy plugin of the agent, or register it with Runtime::with_policy)"
    )]
    PolicyNotRegistered {
        /// The agent.
        agent: String,
        /// The policy.
        policy: String,
    },
    /// A run was started in a session that has an active run (running,
    /// queued, or parked for a human); nothing was written. The session is
    /// released when that run ends.
    #[error("session `{session_id}` is busy: run `{active_run}` is still active in it")]
    SessionBusy {
        /// The session.
        session_id: SessionId,
        /// The run that holds it.
        active_run: RunId,
    },
    /// `finish_with` on a run that cannot finish now (a call outstanding or
    /// in flight, a model call in flight, parked); nothing was written.
    #[error("run `{run_id}` cannot be finished now: {reason}")]
    CannotFinish {
        /// The run.
        run_id: RunId,
        /// Why.
        reason: String,
    },
    /// `finish_with` was given an output that violates the agent's output
    /// schema; nothing was written.
    #[error("run `{run_id}`: the output given to finish the run is rejected: {violation}")]
    FinishRejected {
        /// The run.
        run_id: RunId,
        /// What is wrong with it.
        violation: String,
    },
    /// An event holds a value nested too deeply to be read back once
    /// stored (an input, a reported output, a resolution); nothing was
    /// written.
    #[error("run `{run_id}`: refused before recording: {error}")]
    Unrecordable {
        /// The run.
        run_id: RunId,
        /// What was too deep.
        error: Unrecordable,
    },
    /// A keyed call's commitment is held by another run that has not
    /// settled it (it may be running the call, or its outcome may be unknown
    /// there); this run waited and will try again when driven again.
    #[error(
        "run `{run_id}`: call `{call_id}` shares idempotency commitment {key} with run `{}` call `{}`, which has not settled it; the run is recorded and waits: continue it once that call is settled with `warden runs resume {run_id}`",
        holder.run_id, holder.call_id
    )]
    CommitmentHeld {
        /// The waiting run.
        run_id: RunId,
        /// Its call.
        call_id: CallId,
        /// The commitment key.
        key: String,
        /// Who holds it.
        holder: Holder,
    },
    /// A keyed call's commitment is held unsettled by a run that ended
    /// (abandoned or cancelled with the call's outcome unknown) or is gone:
    /// nothing will settle it but an operator. Reported at once, not after
    /// a wait.
    #[error(
        "run `{run_id}`: call `{call_id}` shares idempotency commitment {key} with run `{}` call `{}`, which ended ({holder_status}) without settling it: check whether that call had its effect; if it did not, `warden keys release {key}` lets this run make the call (if it did, `warden keys settle {key} --output JSON` gives this run its result); the run is recorded and waits: then continue it with `warden runs resume {run_id}`",
        holder.run_id, holder.call_id
    )]
    CommitmentOrphaned {
        /// The run that wanted the key.
        run_id: RunId,
        /// Its call.
        call_id: CallId,
        /// The commitment key.
        key: String,
        /// Who holds it (boxed: the error stays small).
        holder: Box<Holder>,
        /// The holder run's status, or `gone` when it was pruned.
        holder_status: String,
    },
    /// No idempotency commitment has this key.
    #[error("no idempotency key `{key}` is recorded")]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// The key is held unsettled by a run that has not ended: its call may
    /// be running, or wait for a human there. Nothing was released.
    #[error(
        "idempotency key `{key}` is held by run `{}` call `{}`, which is {status} and may still make the call: resolve or abandon that run first",
        holder.run_id, holder.call_id
    )]
    KeyInUse {
        /// The key.
        key: String,
        /// Who holds it.
        holder: Holder,
        /// The holder run's status.
        status: String,
    },
    /// The key is settled already: later runs get its result. Nothing was
    /// recorded.
    #[error(
        "idempotency key `{key}` is already settled by run `{}` call `{}`: later runs get its result; release it first to settle it again",
        holder.run_id, holder.call_id
    )]
    KeyAlreadySettled {
        /// The key.
        key: String,
        /// Who holds it.
        holder: Holder,
    },
    /// The run that holds the key was pruned: no log is left to record a
    /// release in. Nothing was released.
    #[error(
        "idempotency key `{key}` is held by run `{}`, which was pruned: no log is left to record its release in",
        holder.run_id
    )]
    KeyHolderGone {
        /// The key.
        key: String,
        /// Who holds it.
        holder: Holder,
    },
}

/// A full check of one run's log: the store's chain check, then, when the
/// chain holds, every event decoded (an event that does not decode is a
/// finding: the run could not be shown, driven or recovered).
pub async fn verify_log(
    store: &dyn EventStore,
    run_id: &RunId,
) -> Result<VerifyReport, StoreError> {
    let mut report = store.verify(run_id).await?;
    if report.is_intact() {
        let stored = store.load(run_id).await?;
        let mut first = None;
        for event in &stored {
            match decode(&event.bytes) {
                Ok(decoded) if event.seq == 1 => first = Some(decoded),
                Ok(_) => {}
                Err(error) => report.findings.push(Finding {
                    seq: event.seq,
                    kind: ChainBreak::Unreadable {
                        detail: format!("the event does not decode: {error}"),
                    },
                }),
            }
        }
        // The session history the first event names is part of what the
        // run recorded: it must come back whole and unaltered.
        if let Some(event) = first {
            match resolve_history(store, &mut [event]).await {
                Ok(()) => {}
                Err(error @ StoreError::HistoryBroken { .. }) => report.findings.push(Finding {
                    seq: 1,
                    kind: ChainBreak::Unreadable {
                        detail: format!("its session history cannot be read back: {error}"),
                    },
                }),
                Err(error) => return Err(error),
            }
        }
    }
    Ok(report)
}

/// The bytes to store for `event`, or the typed refusal of an event that
/// could not be read back.
/// A log whose run is another run (its only event is a source's first,
/// copied by a fork that did not finish) is never driven or changed.
fn refuse_unfinished_fork(run_id: &RunId, state: &RunState) -> Result<(), RuntimeError> {
    if state.run_id != *run_id {
        return Err(RuntimeError::UnfinishedFork {
            run_id: run_id.clone(),
            source_run: state.run_id.clone(),
        });
    }
    Ok(())
}

fn recordable(run_id: &RunId, event: &Event) -> Result<Bytes, RuntimeError> {
    encode_readable(event)
        .map(Bytes::from)
        .map_err(|error| RuntimeError::Unrecordable {
            run_id: run_id.clone(),
            error,
        })
}

impl From<StoreError> for RuntimeError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Conflict {
                run_id,
                expected,
                actual,
            } => RuntimeError::Conflict {
                run_id,
                expected,
                actual,
            },
            StoreError::UnknownRun { run_id } => RuntimeError::UnknownRun { run_id },
            StoreError::AlreadyExists { run_id } => RuntimeError::AlreadyStarted { run_id },
            StoreError::Fenced {
                run_id,
                token,
                current,
            } => RuntimeError::Fenced {
                run_id,
                token,
                current,
            },
            StoreError::SessionBusy {
                session,
                active_run,
            } => match SessionId::new(session.clone()) {
                Ok(session_id) => RuntimeError::SessionBusy {
                    session_id,
                    active_run,
                },
                Err(_) => RuntimeError::Store {
                    error: StoreError::SessionBusy {
                        session,
                        active_run,
                    },
                },
            },
            error => RuntimeError::Store { error },
        }
    }
}

/// What a subscriber receives.
#[derive(Clone, Debug, PartialEq)]
pub enum RunUpdate {
    /// An event was appended at `seq`.
    Event {
        /// Its position, from 1.
        seq: u64,
        /// The event.
        event: Arc<Event>,
    },
    /// Text streamed by the model, not yet recorded (the completion event
    /// records the whole text).
    TextDelta {
        /// The model call's step.
        step: u32,
        /// The text.
        text: String,
    },
    /// The subscriber fell behind and missed this many updates; it can load
    /// the events it missed from the store.
    Lagged {
        /// Updates missed.
        missed: u64,
    },
}

/// Updates buffered per run for slow subscribers before they lag.
const SUBSCRIBER_BUFFER: usize = 256;

/// The engine: runs, verbs and subscribers over a store, plugins and
/// providers. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn EventStore>,
    plugins: PluginHost,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    sleep: Arc<dyn RetrySleep>,
    record_prompts: bool,
    labels: BTreeMap<String, String>,
    provider: Option<Arc<dyn ModelProvider>>,
    commitment_wait: Duration,
    policies: BTreeMap<String, Arc<dyn Policy>>,
    policy_timeout: Duration,
    witness: Option<Arc<Witness>>,
    ceilings: RunCeilings,
    prepared: Mutex<HashMap<AgentDigest, Arc<Prepared>>>,
    live: Mutex<HashMap<RunId, Live>>,
}

/// An agent with its plugins loaded and its provider made.
struct Prepared {
    view: AgentView,
    plugins: HashMap<String, LoadedPlugin>,
    /// Each context source's plugin, by source name, loaded under the
    /// plugin's grant with the source's own limits over it.
    context: HashMap<String, LoadedPlugin>,
    /// Each policy carried out by a plugin, by policy name.
    policy_plugins: HashMap<String, LoadedPlugin>,
    /// Each MCP server, by its key: its calls are made as a plugin's are.
    mcp: HashMap<String, Arc<crate::mcp_servers::McpConnection>>,
    provider: Arc<dyn ModelProvider>,
}

/// A run this process knows about: its subscribers, and its driver if one
/// is running here.
struct Live {
    updates: broadcast::Sender<RunUpdate>,
    driver: Option<Driver>,
}

struct Driver {
    cancel: CancellationToken,
    reason: Arc<Mutex<Cancellation>>,
    done: watch::Receiver<bool>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("record_prompts", &self.inner.record_prompts)
            .field("labels", &self.inner.labels)
            .finish_non_exhaustive()
    }
}

/// The log of one run as a driver holds it: events and folded state.
struct Log {
    run_id: RunId,
    events: Vec<Event>,
    state: RunState,
    /// The claim every append of this driver carries (issue 9: a driver
    /// under a claim writes only while its claim is the run's newest). A
    /// child run's driver carries its parent's (issue 36): the claim of the
    /// run at the top of the tree, which the worker holds and renews.
    fence: Option<Claim>,
    /// This driver's own view of that claim (issue 15): once it has passed,
    /// the driver makes no further effect (every lease it starts carries
    /// it) and appends nothing.
    valid: Option<ValidUntil>,
    /// The agent's channels, when this process knows the agent (a driver,
    /// or a verb on a run whose agent it prepared): every append writes how
    /// many deliveries the run owes into its listing. `None`: only the
    /// delivery in flight is counted.
    channels: Option<Arc<[Channel]>>,
    /// The next model request's messages and hash, kept as the state's
    /// conversation grows (so a long run's model call does not rebuild
    /// them whole).
    prompt: PromptCache,
    /// Events folded and in `events` but not yet in the store: they ride
    /// with the next write (see "Durability" in the module docs).
    held: Held,
    /// What the runtime's witness found wrong with the log as loaded, if
    /// anything: every write refuses it (issue 36).
    rolled_back: Option<String>,
}

impl Log {
    /// The claim this driver holds and its view of it, for a child it
    /// drives (`runtime/children.rs`).
    fn claimed(&self) -> Option<(Claim, ValidUntil)> {
        self.fence.clone().zip(self.valid.clone())
    }
}

/// The trailing events of a [`Log`] not yet written, encoded, and how
/// durable the write that carries them must be.
#[derive(Default)]
struct Held {
    bytes: Vec<Bytes>,
    /// Whether a held event must be on disk before the next effect starts
    /// (a write's completion); otherwise they may be deferred.
    synced: bool,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The durability of a write carrying these events and new ones that
    /// ask for `asked`: synced if either is.
    fn durability(&self, asked: Durability) -> Durability {
        if self.synced {
            Durability::Synced
        } else {
            asked
        }
    }
}

impl Runtime {
    /// A runtime over `store` and `plugins`, with the system clock, the OS
    /// random source, prompts not recorded, no extra labels, and each agent's
    /// own model provider.
    pub fn new(store: Arc<dyn EventStore>, plugins: PluginHost) -> Self {
        Runtime {
            inner: Arc::new(Inner {
                store,
                plugins,
                clock: Arc::new(SystemClock),
                random: Arc::new(OsRandom),
                sleep: Arc::new(TokioSleep),
                record_prompts: false,
                labels: BTreeMap::new(),
                provider: None,
                commitment_wait: DEFAULT_COMMITMENT_WAIT,
                policies: BTreeMap::new(),
                policy_timeout: DEFAULT_POLICY_TIMEOUT,
                witness: None,
                ceilings: RunCeilings::DEFAULT,
                prepared: Mutex::default(),
                live: Mutex::default(),
            }),
        }
    }

    fn rebuild(self, f: impl FnOnce(&mut Inner)) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            store: Arc::clone(&shared.store),
            plugins: shared.plugins.clone(),
            clock: Arc::clone(&shared.clock),
            random: Arc::clone(&shared.random),
            sleep: Arc::clone(&shared.sleep),
            record_prompts: shared.record_prompts,
            labels: shared.labels.clone(),
            provider: shared.provider.clone(),
            commitment_wait: shared.commitment_wait,
            policies: shared.policies.clone(),
            policy_timeout: shared.policy_timeout,
            witness: shared.witness.clone(),
            ceilings: shared.ceilings,
            prepared: Mutex::default(),
            live: Mutex::default(),
        });
        let mut inner = inner;
        f(&mut inner);
        Runtime {
            inner: Arc::new(inner),
        }
    }

    /// Uses `clock` and `random` instead of the system's. Default: the
    /// system clock and the OS random source.
    pub fn with_hooks(self, clock: Arc<dyn Clock>, random: Arc<dyn Random>) -> Self {
        self.rebuild(|i| {
            i.clock = clock;
            i.random = random;
        })
    }

    /// Waits out a model call's backoff with `sleep` instead of the tokio
    /// timer (a test's sleep can move an injected clock instead). Default:
    /// [`TokioSleep`].
    pub fn with_sleep(self, sleep: Arc<dyn RetrySleep>) -> Self {
        self.rebuild(|i| i.sleep = sleep)
    }

    /// Records each model request in full with its intent. Default: off
    /// (prompts may hold secrets; only their hash is recorded).
    pub fn with_record_prompts(self, record: bool) -> Self {
        self.rebuild(|i| i.record_prompts = record)
    }

    /// Checks every run this runtime records anything on against
    /// `witness` (see `engine/witness.rs`): a run whose log holds fewer
    /// events than the witness saw, or another event at that position, is
    /// refused ([`RuntimeError::RolledBack`]) by every verb that writes
    /// (driving it, resuming, approving, denying, resolving, forking it),
    /// before anything is written or performed. Default: none.
    pub fn with_witness(self, witness: Witness) -> Self {
        let witness = Arc::new(witness);
        self.rebuild(|i| i.witness = Some(witness))
    }

    /// The ceilings every run this runtime starts records and meets (see
    /// [`crate::ceilings`]). Default: [`RunCeilings::DEFAULT`].
    pub fn with_ceilings(self, ceilings: RunCeilings) -> Self {
        self.rebuild(|i| i.ceilings = ceilings)
    }

    /// Labels added to every run this runtime starts (a run's own and its
    /// agent's win on the same key). Default: none.
    pub fn with_labels(self, labels: BTreeMap<String, String>) -> Self {
        self.rebuild(|i| i.labels = labels)
    }

    /// Calls `provider` for every agent instead of the agent's own. Default:
    /// each agent's provider, from its `[model]` table.
    pub fn with_provider(self, provider: Arc<dyn ModelProvider>) -> Self {
        self.rebuild(|i| i.provider = Some(provider))
    }

    /// How long a keyed call waits for another run that holds its
    /// idempotency commitment unsettled before the drive stops with
    /// [`RuntimeError::CommitmentHeld`]. Default: 2 minutes.
    pub fn with_commitment_wait(self, wait: Duration) -> Self {
        self.rebuild(|i| i.commitment_wait = wait)
    }

    /// Registers `policy` under `name`: agents that enable `[policies.<name>]`
    /// have it asked at their hooks (see [`super::policy_hooks`]). A run of
    /// an agent enabling a policy no one registered is refused at start;
    /// replay never needs the policy (it reads the recorded decisions).
    pub fn with_policy(self, name: impl Into<String>, policy: Arc<dyn Policy>) -> Self {
        let name = name.into();
        self.rebuild(|i| {
            i.policies.insert(name, policy);
        })
    }

    /// How long a policy may take to decide before its decision is recorded
    /// as failed (and the run fails). Default: 30 s.
    pub fn with_policy_timeout(self, timeout: Duration) -> Self {
        self.rebuild(|i| i.policy_timeout = timeout)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn EventStore> {
        &self.inner.store
    }

    /// The tools a run of `agent` offers its model and accepts from it, by
    /// the names the model calls them, with their effective effect classes
    /// and approval rules: the agent's plugins loaded under their grants,
    /// as a run would (`warden mcp serve` lists these).
    pub async fn tools(&self, agent: &Agent) -> Result<Vec<super::view::AgentTool>, RuntimeError> {
        Ok(self.prepare(agent).await?.view.tools.clone())
    }

    /// Starts a run of `agent` on `input`, as `options` say (its id, labels
    /// of its own, its session; see [`StartOptions`]). The run is recorded,
    /// not driven: call [`drive`](Self::drive). An id with any history is
    /// refused; in a session, so is a start while another run of the
    /// session is active ([`RuntimeError::SessionBusy`], nothing written).
    pub async fn start(
        &self,
        agent: &Agent,
        input: Value,
        options: StartOptions,
    ) -> Result<RunId, RuntimeError> {
        self.start_as(agent, input, options, ListingStatus::RUNNING)
            .await
    }

    /// The runs of session `session_id`, in the order they were started,
    /// with their statuses derived from their logs.
    pub async fn session_runs(
        &self,
        session_id: &SessionId,
    ) -> Result<Vec<SessionRun>, RuntimeError> {
        session::runs(&*self.inner.store, session_id).await
    }

    /// Every session the store's runs belong to, by name, with whether it
    /// is busy.
    pub async fn sessions(&self) -> Result<Vec<SessionSummary>, RuntimeError> {
        session::summaries(&*self.inner.store).await
    }

    /// A fresh run id from the injected randomness.
    pub(crate) fn random_run_id(&self) -> RunId {
        RunId::from_random(
            (u128::from(self.inner.random.next_u64()) << 64)
                | u128::from(self.inner.random.next_u64()),
        )
    }

    /// Records a run for workers to drive: like [`start`](Self::start), but
    /// listed as [`QUEUED`](ListingStatus::QUEUED) until a worker claims it
    /// (see `store/claim.rs`). Nothing drives it here. In a session, the
    /// session counts the queued run as active, so another start or submit
    /// there is refused until it settles.
    pub async fn submit(
        &self,
        agent: &Agent,
        input: Value,
        options: StartOptions,
    ) -> Result<RunId, RuntimeError> {
        self.start_as(agent, input, options, ListingStatus::QUEUED)
            .await
    }

    async fn start_as(
        &self,
        agent: &Agent,
        input: Value,
        options: StartOptions,
        status: ListingStatus,
    ) -> Result<RunId, RuntimeError> {
        let StartOptions {
            run_id,
            labels,
            session,
        } = options;
        let run_id = run_id.unwrap_or_else(|| self.random_run_id());
        let session_id = session.as_ref();
        check_input_size(&input, agent.max_input_bytes).map_err(|error| {
            RuntimeError::InputTooLarge {
                run_id: None,
                error,
            }
        })?;
        // Load the plugins first: an agent that cannot run is refused before
        // anything is recorded.
        let prepared = self.prepare(agent).await?;
        if let Some(missing) = agent
            .policies
            .iter()
            .find(|p| p.plugin.is_none() && !self.inner.policies.contains_key(&p.name))
        {
            return Err(RuntimeError::PolicyNotRegistered {
                agent: agent.name.clone(),
                policy: missing.name.clone(),
            });
        }
        let mut all = self.inner.labels.clone();
        all.extend(agent.labels.clone());
        all.extend(labels);
        super::agent::validate_labels(&all)
            .map_err(|error| RuntimeError::InvalidLabels { error })?;
        let now = self.inner.clock.now_ms();
        let random_seed = self.inner.random.next_u64();
        let mut attempt = 0;
        let started = loop {
            // A run in a session reads the session's history; the store
            // refuses the start if the session changed in between, and it
            // is read again.
            let (session, session_runs, history) = match session_id {
                Some(id) => {
                    let (opening, held) = session::read(&*self.inner.store, id).await?;
                    (Some(opening.start), Some(held), opening.chunks)
                }
                None => (None, None, Vec::new()),
            };
            let history_head = session
                .as_ref()
                .and_then(|s| s.chain.as_ref())
                .map(|c| c.head);
            let started = Event::RunStarted(RunStarted {
                run_id: run_id.clone(),
                agent: agent.name.clone(),
                agent_digest: agent.digest.clone(),
                input: input.clone(),
                labels: all.clone(),
                clock_seed_ms: now,
                random_seed,
                // Only a path text holds faithfully: a mangled one would
                // name another file when the run is continued.
                agent_file: agent
                    .path
                    .to_str()
                    .filter(|p| !p.is_empty())
                    .map(str::to_owned),
                session,
                limits: Some(agent.recorded_limits(&self.inner.ceilings)),
                parent: None,
                mcp_tools: prepared.view.mcp_tools.clone(),
            });
            let meta = RunMeta {
                agent: agent.name.clone(),
                labels: all.clone(),
                session: session_id.map(|s| s.as_str().to_owned()),
                session_runs,
                history,
                history_head,
                created_ms: now as i64,
            };
            match self
                .inner
                .store
                .create(&run_id, meta, recordable(&run_id, &started)?, status)
                .await
            {
                Ok(_) => break started,
                Err(StoreError::SessionChanged { .. }) if attempt < SESSION_READ_ATTEMPTS => {
                    attempt += 1;
                }
                Err(error) => return Err(error.into()),
            }
        };
        self.publish(&run_id, 1, started);
        Ok(run_id)
    }

    /// Performs one logical operation of the run (one model call, one tool
    /// call, one approval request, or one record) and returns whether there
    /// is more to do.
    pub async fn step(&self, run_id: &RunId, agent: &Agent) -> Result<Step, RuntimeError> {
        let prepared = self.prepare(agent).await?;
        let mut log = self.load_log(run_id).await?;
        self.check_digest(&log, agent, false)?;
        self.refuse_driven(&log).await?;
        log.channels = Some(prepared.view.channels.clone().into());
        let driver = self.register_driver(run_id);
        let stepped = self.step_once(&mut log, &prepared, &driver).await;
        let result = self.flushed(&mut log, stepped).await;
        self.unregister_driver(run_id);
        result
    }

    /// Steps the run until it is terminal or parked, and returns its status.
    /// A run whose last write has no recorded outcome is refused
    /// ([`RuntimeError::NeedsReconciliation`]).
    pub async fn drive(&self, run_id: &RunId, agent: &Agent) -> Result<RunStatus, RuntimeError> {
        let prepared = self.prepare(agent).await?;
        let mut log = self.load_log(run_id).await?;
        self.check_digest(&log, agent, false)?;
        self.refuse_driven(&log).await?;
        log.channels = Some(prepared.view.channels.clone().into());
        self.drive_log(&mut log, &prepared).await
    }

    /// Replays the recorded log against the agent as it is now, checking
    /// every recorded decision, then continues live from the first
    /// unrecorded step. A model call or `read`/`idempotent` tool call whose
    /// intent has no completion is performed again (the same idempotency
    /// key); a `write` is never guessed: the run needs reconciliation and is
    /// refused. Refused before anything while a worker holds a live claim
    /// covering the run ([`RuntimeError::DrivenByWorker`]).
    pub async fn recover(
        &self,
        run_id: &RunId,
        agent: &Agent,
        options: ReplayOptions,
    ) -> Result<RunStatus, RuntimeError> {
        self.recover_with(run_id, agent, options, None, true).await
    }

    /// [`recover`](Self::recover) under `claim`: every append carries the
    /// claim's fencing token, and once a newer claim exists on the run the
    /// next append is refused ([`RuntimeError::Fenced`]) and nothing more is
    /// written.
    ///
    /// `valid` is the caller's own view of the claim, on its monotonic
    /// clock: every plugin lease the drive starts carries it, so once it
    /// passes no tool call, delivery or other plugin call makes a further
    /// effect (the sandbox traps it), no step starts and nothing is
    /// appended; the drive ends with [`RuntimeError::ClaimExpired`]. This is
    /// what stops a driver that was paused past its claim and wakes after
    /// another took the run over. Renewing the claim, extending `valid`
    /// from the start of each successful renewal, and releasing it are the
    /// caller's (a worker).
    pub async fn recover_claimed(
        &self,
        agent: &Agent,
        options: ReplayOptions,
        claim: Claim,
        valid: ValidUntil,
    ) -> Result<RunStatus, RuntimeError> {
        let run_id = claim.run_id.clone();
        self.recover_with(&run_id, agent, options, Some((claim, valid)), false)
            .await
    }

    /// Recovers `run_id` under `claimed` (a worker's claim and its view of
    /// it, or none). `check_driven`: refuse the run while a worker's claim
    /// covers it ([`RuntimeError::DrivenByWorker`]), for a driver without a
    /// claim whose parent's drive did not check it already.
    async fn recover_with(
        &self,
        run_id: &RunId,
        agent: &Agent,
        options: ReplayOptions,
        claimed: Option<(Claim, ValidUntil)>,
        check_driven: bool,
    ) -> Result<RunStatus, RuntimeError> {
        let (fence, valid) = claimed.unzip();
        let prepared = self.prepare(agent).await?;
        let (events, rolled_back) = self.load_witnessed(run_id).await?;
        // Refused before replay: nothing of a rolled-back run is driven.
        self.refuse_rolled_back(run_id, rolled_back.as_ref())?;
        let state =
            replay(&events, &prepared.view, options).map_err(|error| RuntimeError::Replay {
                run_id: run_id.clone(),
                error,
            })?;
        refuse_unfinished_fork(run_id, &state)?;
        let mut log = Log {
            run_id: run_id.clone(),
            events,
            state,
            fence,
            valid,
            channels: Some(prepared.view.channels.clone().into()),
            prompt: PromptCache::new(),
            held: Held::default(),
            rolled_back,
        };
        // A driver without a claim (`runs recover`, `runs resume`) never
        // drives a run a worker holds: it would be a second writer, and
        // could repeat what the worker is doing.
        if check_driven {
            self.refuse_driven(&log).await?;
        }
        self.drive_log(&mut log, &prepared).await
    }

    /// Gives a parked run what it waits for: the input of a suspended run
    /// (validated against the schema recorded in the log) or a budget
    /// extension of a run over budget. Validated before anything is written;
    /// records one event. Drive the run afterwards.
    pub async fn resume(
        &self,
        run_id: &RunId,
        agent: &Agent,
        input: Value,
        by: Option<String>,
    ) -> Result<RunStatus, RuntimeError> {
        let log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        let status = log.state.status();
        if !matches!(status, RunStatus::Suspended | RunStatus::BudgetExceeded) {
            return Err(RuntimeError::NotParked {
                run_id: run_id.clone(),
                status,
                needed: "suspended or budget_exceeded",
            });
        }
        let limit = log.state.max_input_bytes(agent.max_input_bytes);
        check_input_size(&input, limit).map_err(|error| RuntimeError::InputTooLarge {
            run_id: Some(run_id.clone()),
            error,
        })?;
        let mut event = log
            .state
            .check_resume(&agent.budgets, &input, by)
            .map_err(|error| RuntimeError::InputRejected {
                run_id: run_id.clone(),
                error,
            })?;
        let now = self.inner.clock.now_ms();
        match &mut event {
            Event::Resumed(e) => e.at_ms = Some(now),
            Event::BudgetExtended(e) => e.at_ms = Some(now),
            _ => {}
        }
        let mut log = log;
        self.append(&mut log, vec![event]).await?;
        Ok(log.state.status())
    }

    /// Approves the call awaiting approval. Records one event; drive the run
    /// afterwards.
    pub async fn approve(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        by: &str,
    ) -> Result<(), RuntimeError> {
        self.approve_digest(run_id, call_id, by, None).await
    }

    /// [`approve`](Self::approve), refused with
    /// [`RuntimeError::DigestMismatch`] (nothing recorded) unless the call's
    /// digest is `expected` when one is given: the approver approves the
    /// call they saw. Either way the approval records the call's digest,
    /// and approves nothing if the call that runs has another.
    pub async fn approve_digest(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        by: &str,
        expected: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let mut log = self.awaiting_approval(run_id, call_id).await?;
        let digest = log
            .state
            .next_call()
            .expect("a run awaiting approval has a next call")
            .digest();
        if let Some(expected) = expected
            && expected != digest.as_str()
        {
            return Err(RuntimeError::DigestMismatch {
                run_id: run_id.clone(),
                call_id: call_id.clone(),
                expected: expected.to_owned(),
                actual: digest,
            });
        }
        let event = Event::ApprovalGranted(ApprovalGranted {
            call_id: call_id.clone(),
            by: by.to_owned(),
            digest: Some(digest),
            rule: None,
            at_ms: Some(self.inner.clock.now_ms()),
        });
        self.append(&mut log, vec![event]).await
    }

    /// Denies the call awaiting approval; the denial is the tool's result
    /// the model sees. Records one event; drive the run afterwards.
    pub async fn deny(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        by: &str,
        reason: &str,
    ) -> Result<(), RuntimeError> {
        let mut log = self.awaiting_approval(run_id, call_id).await?;
        let event = Event::ApprovalDenied(ApprovalDenied {
            call_id: call_id.clone(),
            by: by.to_owned(),
            reason: reason.to_owned(),
            at_ms: Some(self.inner.clock.now_ms()),
        });
        self.append(&mut log, vec![event]).await
    }

    /// Records the output of the external tool call the run waits for, as the
    /// embedding application reports it after performing the call. The
    /// output is checked against the tool's output schema and every field
    /// the operator marked must equal the recorded call's argument of the
    /// same name; nothing is written otherwise. Exactly one event; drive the
    /// run afterwards.
    pub async fn complete_external(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        output: Value,
        by: Option<String>,
    ) -> Result<(), RuntimeError> {
        let mut log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        let request = match log.state.parked() {
            Some(Parked::External(request)) if &request.call_id == call_id => request.clone(),
            Some(Parked::External(request)) => {
                return Err(RuntimeError::NotAwaitingExternal {
                    run_id: run_id.clone(),
                    call_id: call_id.clone(),
                    awaiting: request.call_id.clone(),
                });
            }
            _ => {
                return Err(RuntimeError::NotParked {
                    run_id: run_id.clone(),
                    status: log.state.status(),
                    needed: "awaiting_external",
                });
            }
        };
        super::schema::check(&request.output_schema, &output).map_err(|e| {
            RuntimeError::OutputRejected {
                run_id: run_id.clone(),
                call_id: call_id.clone(),
                reason: e.to_string(),
            }
        })?;
        for field in &request.must_match {
            let recorded = request.arguments.get(field).cloned().unwrap_or(Value::Null);
            let given = output.get(field).cloned().unwrap_or(Value::Null);
            if recorded != given {
                return Err(RuntimeError::ExternalMismatch {
                    run_id: run_id.clone(),
                    call_id: call_id.clone(),
                    field: field.clone(),
                    recorded: Box::new(recorded),
                    given: Box::new(given),
                });
            }
        }
        let event = Event::ExternalCallCompleted(ExternalCallCompleted {
            call_id: call_id.clone(),
            output,
            by,
            at_ms: Some(self.inner.clock.now_ms()),
        });
        self.append(&mut log, vec![event]).await
    }

    /// Finishes the run with an output the host supplies instead of the
    /// model's final answer, without another model call: for a host that
    /// drives a run step by step (typically once the tool results it needs
    /// are recorded). The output is validated against the agent's output
    /// schema, when it declares one, exactly as a final answer is; an
    /// invalid output, a run that is terminal, parked, or has a model or tool
    /// call in flight or outstanding, and an agent that changed since the
    /// run started are refused and nothing is written. Records one
    /// `run_completed` marked `by_host`.
    pub async fn finish_with(
        &self,
        run_id: &RunId,
        agent: &Agent,
        output: Value,
    ) -> Result<(), RuntimeError> {
        let mut log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        self.check_digest(&log, agent, false)?;
        // The agent's channels say which deliveries the finished run owes.
        log.channels = Some(self.prepare(agent).await?.view.channels.clone().into());
        let cannot = |reason: String| RuntimeError::CannotFinish {
            run_id: run_id.clone(),
            reason,
        };
        let state = &log.state;
        if state.parked().is_some() {
            return Err(cannot(format!("it is {}", state.status())));
        }
        if let super::state::ModelCallProgress::InFlight { step, .. } = state.model_call {
            return Err(cannot(format!(
                "the model call of step {step} is in flight"
            )));
        }
        if let Some(call) = state.next_call() {
            return Err(cannot(format!(
                "tool call `{}` is not settled",
                call.call_id
            )));
        }
        if let Some(schema) = &agent.output_schema {
            super::output::check_output(schema, &output).map_err(|violation| {
                RuntimeError::FinishRejected {
                    run_id: run_id.clone(),
                    violation,
                }
            })?;
        }
        let event = Event::RunCompleted(super::events::RunCompleted {
            output,
            by_host: true,
        });
        self.append(&mut log, vec![event]).await
    }

    /// Records by hand the outcome of the write whose completion is missing
    /// (a human checked what happened). Exactly one event; refused unless
    /// the run needs reconciliation, and refused while a worker holds a live
    /// claim covering the run ([`RuntimeError::DrivenByWorker`]). Recover
    /// or drive the run afterwards.
    pub async fn resolve(
        &self,
        run_id: &RunId,
        output: Value,
        by: &str,
        note: Option<String>,
    ) -> Result<(), RuntimeError> {
        let mut log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        // A worker driving the run (or its tree) may be making the write.
        self.refuse_driven(&log).await?;
        // What a restore may have lost comes first: it includes any write.
        if log.state.held().is_some() {
            let event = Event::Reconciled(Reconciled {
                by: by.to_owned(),
                note,
                at_ms: Some(self.inner.clock.now_ms()),
            });
            return self.append(&mut log, vec![event]).await;
        }
        let Some(write) = log.state.dangling_write() else {
            return Err(RuntimeError::NotReconcilable {
                run_id: run_id.clone(),
                status: log.state.status(),
            });
        };
        // A keyed write a fork inherited in flight is held by its source:
        // settling it is the source's business, not the fork's.
        let inherited = fork::inherited_in_flight(&log.events, &log.state, &write.call_id);
        let settlement = write
            .keyed_by
            .as_ref()
            .filter(|_| !inherited)
            .map(|_| Settlement {
                key: write.idempotency_key.clone(),
                holder: Holder {
                    run_id: run_id.clone(),
                    call_id: write.call_id.to_string(),
                },
                outcome: Settle::Result(Bytes::from(
                    serde_json::to_vec(&ToolCallResult::Output(output.clone()))
                        .expect("a tool call result serializes"),
                )),
            });
        let event = Event::ToolCallResolved(ToolCallResolved {
            call_id: write.call_id.clone(),
            by: by.to_owned(),
            output,
            note,
            at_ms: Some(self.inner.clock.now_ms()),
        });
        self.append_with(&mut log, vec![event], settlement.as_ref())
            .await
    }

    /// The idempotency keys `filter` matches, in key order, each with the
    /// state its holder run leaves it in.
    pub async fn keys(&self, filter: &CommitmentFilter) -> Result<Vec<KeyInfo>, RuntimeError> {
        let mut keys = Vec::new();
        for commitment in self.inner.store.commitments(filter).await? {
            let status = self.listed_status(&commitment.holder.run_id).await?;
            keys.push(KeyInfo::new(commitment, status));
        }
        Ok(keys)
    }

    /// The idempotency key `key`, or [`RuntimeError::UnknownKey`].
    pub async fn key(&self, key: &str) -> Result<KeyInfo, RuntimeError> {
        self.keys(&CommitmentFilter::new().key(key))
            .await?
            .pop()
            .ok_or_else(|| RuntimeError::UnknownKey {
                key: key.to_owned(),
            })
    }

    /// Releases idempotency key `key`, so that the next run with it makes
    /// the call: recorded as [`Event::KeyReleased`] in the holder run's log,
    /// in the transaction that deletes the commitment. Refused while the
    /// holder run has not ended and the key is unsettled
    /// ([`RuntimeError::KeyInUse`]: its call may be running) and when the
    /// holder run was pruned ([`RuntimeError::KeyHolderGone`]). Returns the
    /// key as it was.
    pub async fn release_key(
        &self,
        key: &str,
        by: &str,
        note: Option<String>,
    ) -> Result<KeyInfo, RuntimeError> {
        let info = self.key(key).await?;
        let holder = Holder {
            run_id: info.run_id.clone(),
            call_id: info.call_id.clone(),
        };
        let Some(status) = &info.run_status else {
            return Err(RuntimeError::KeyHolderGone {
                key: key.to_owned(),
                holder,
            });
        };
        if info.state == KeyState::Held {
            return Err(RuntimeError::KeyInUse {
                key: key.to_owned(),
                status: status.clone(),
                holder,
            });
        }
        let mut log = self.load_log(&holder.run_id).await?;
        let event = Event::KeyReleased(KeyReleased {
            key: key.to_owned(),
            call_id: CallId::from_text(holder.call_id.clone()),
            by: by.to_owned(),
            note,
        });
        let release = Settlement {
            key: key.to_owned(),
            holder,
            outcome: Settle::Release,
        };
        self.append_with(&mut log, vec![event], Some(&release))
            .await?;
        Ok(info)
    }

    /// Settles idempotency key `key`, held unsettled by a run that ended
    /// (orphaned), with `output`, the call's outcome as the operator found
    /// it: later runs with the key get it (a `tool_call_deduplicated`) and
    /// make no call. Recorded as [`Event::KeySettled`] in the holder run's
    /// log, in the transaction that settles the key, with `by` and `note`.
    /// Refused while the holder has not ended ([`RuntimeError::KeyInUse`]:
    /// `resolve` settles it there), when it is settled already
    /// ([`RuntimeError::KeyAlreadySettled`]) and when the holder was pruned.
    pub async fn settle_key(
        &self,
        key: &str,
        output: Value,
        by: &str,
        note: Option<String>,
    ) -> Result<KeyInfo, RuntimeError> {
        let info = self.key(key).await?;
        let holder = Holder {
            run_id: info.run_id.clone(),
            call_id: info.call_id.clone(),
        };
        let Some(status) = &info.run_status else {
            return Err(RuntimeError::KeyHolderGone {
                key: key.to_owned(),
                holder,
            });
        };
        match info.state {
            KeyState::Held => {
                return Err(RuntimeError::KeyInUse {
                    key: key.to_owned(),
                    status: status.clone(),
                    holder,
                });
            }
            KeyState::Settled => {
                return Err(RuntimeError::KeyAlreadySettled {
                    key: key.to_owned(),
                    holder,
                });
            }
            KeyState::Orphaned => {}
        }
        let result = ToolCallResult::Output(output.clone());
        let mut log = self.load_log(&holder.run_id).await?;
        let event = Event::KeySettled(KeySettled {
            key: key.to_owned(),
            call_id: CallId::from_text(holder.call_id.clone()),
            output,
            by: by.to_owned(),
            note,
        });
        let settle = Settlement {
            key: key.to_owned(),
            holder,
            outcome: Settle::Result(Bytes::from(
                serde_json::to_vec(&result).expect("a tool call result serializes"),
            )),
        };
        self.append_with(&mut log, vec![event], Some(&settle))
            .await?;
        Ok(info)
    }

    /// The listed status of run `run_id`, `None` when it was pruned.
    async fn listed_status(&self, run_id: &RunId) -> Result<Option<String>, RuntimeError> {
        match self.inner.store.summary(run_id).await {
            Ok(s) => Ok(Some(s.status)),
            Err(StoreError::UnknownRun { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Records that the run's log may be missing what it did since
    /// `since_ms` (it was restored from a backup taken then): the run needs
    /// reconciliation until a human [`resolve`](Self::resolve)s it (it then
    /// goes on from its log) or abandons it. Refused on a finished run.
    pub async fn require_reconciliation(
        &self,
        run_id: &RunId,
        reason: &str,
        since_ms: Option<i64>,
        by: &str,
    ) -> Result<(), RuntimeError> {
        let mut log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        let event = Event::ReconciliationRequired(ReconciliationRequired {
            reason: reason.to_owned(),
            since_ms,
            by: by.to_owned(),
        });
        self.append(&mut log, vec![event]).await
    }

    /// Ends a run for good, whatever state it is in (short of terminal),
    /// carrying the unresolved write if there is one; `by` is recorded as
    /// who did it, as an approval records its approver.
    pub async fn abandon(
        &self,
        run_id: &RunId,
        by: &str,
        reason: &str,
    ) -> Result<(), RuntimeError> {
        let mut log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        let event = Event::RunAbandoned(RunAbandoned {
            reason: reason.to_owned(),
            by: Some(by.to_owned()),
            unresolved_write: log.state.dangling_write().map(UnresolvedWrite::from),
        });
        self.append(&mut log, vec![event]).await
    }

    /// Cancels a run. If this process is driving it, the driver is
    /// interrupted (an in-flight lease through its cancellation, an
    /// in-flight model stream by dropping it) and records the cancellation;
    /// otherwise the cancellation is recorded now. A write interrupted
    /// mid-call is carried in the event as unresolved. `by`, when given, is
    /// recorded as who cancelled it (an application cancelling its own turn
    /// may name no one).
    pub async fn cancel(
        &self,
        run_id: &RunId,
        by: Option<&str>,
        reason: Option<String>,
    ) -> Result<(), RuntimeError> {
        // Its child first: a driver of this run waiting on the child then
        // records how the child ended and stops.
        self.cancel_child(run_id, by, reason.clone()).await?;
        let asked = Cancellation {
            reason,
            by: by.map(str::to_owned),
        };
        let driver = {
            let live = self.lock_live();
            live.get(run_id).and_then(|l| {
                l.driver
                    .as_ref()
                    .map(|d| (d.cancel.clone(), Arc::clone(&d.reason), d.done.clone()))
            })
        };
        if let Some((token, slot, mut done)) = driver {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = asked.clone();
            token.cancel();
            // The driver records the cancellation when it stops.
            while !*done.borrow() {
                if done.changed().await.is_err() {
                    break;
                }
            }
            let log = self.load_log(run_id).await?;
            if log.state.status() == RunStatus::Cancelled {
                return Ok(());
            }
        }
        let mut log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        let event = Event::RunCancelled(RunCancelled {
            reason: asked.reason,
            by: asked.by,
            unresolved_write: log.state.dangling_write().map(UnresolvedWrite::from),
        });
        self.append(&mut log, vec![event]).await
    }

    /// The delivery the run owes now, if any: the one in flight, or the
    /// next event `agent`'s channels receive and were not given. A run that
    /// owes one, even a terminal run, is finished by [`drive`](Self::drive)
    /// or [`recover`](Self::recover).
    pub async fn owed_delivery(
        &self,
        run_id: &RunId,
        agent: &Agent,
    ) -> Result<Option<DeliveryIntent>, RuntimeError> {
        let prepared = self.prepare(agent).await?;
        let log = self.load_log(run_id).await?;
        Ok(next_delivery(
            &log.events,
            &log.state,
            &prepared.view.name,
            &prepared.view.channels,
        )
        .map(|d| d.intent))
    }

    /// The run's folded state, from its log.
    pub async fn state(&self, run_id: &RunId) -> Result<RunState, RuntimeError> {
        Ok(self.load_log(run_id).await?.state)
    }

    /// The run's decoded events.
    pub async fn events(&self, run_id: &RunId) -> Result<Vec<Event>, RuntimeError> {
        self.load_events(run_id).await
    }

    /// Checks the run's hash chain end to end and reports every break.
    pub async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, RuntimeError> {
        Ok(verify_log(self.inner.store.as_ref(), run_id).await?)
    }

    /// Every event appended to the run from now on, plus the model's text
    /// deltas as they stream. A slow subscriber never blocks the run: it
    /// gets [`RunUpdate::Lagged`] and can load what it missed.
    pub fn subscribe(&self, run_id: &RunId) -> RunUpdates {
        let receiver = self.live_entry(run_id, |l| l.updates.subscribe());
        RunUpdates {
            receiver,
            runtime: Arc::downgrade(&self.inner),
            run_id: run_id.clone(),
        }
    }

    // ---- driving ----

    async fn drive_log(
        &self,
        log: &mut Log,
        prepared: &Prepared,
    ) -> Result<RunStatus, RuntimeError> {
        let driver = self.register_driver(&log.run_id);
        let result = async {
            loop {
                match self.step_once(log, prepared, &driver).await? {
                    Step::Progressed => continue,
                    Step::Idle(Idle::ReconciliationRequired { since_ms }) => {
                        let reason = log
                            .state
                            .held()
                            .map(|h| h.reason.clone())
                            .unwrap_or_default();
                        return Err(RuntimeError::ReconciliationRequired {
                            run_id: log.run_id.clone(),
                            reason,
                            since_ms,
                        });
                    }
                    Step::Idle(Idle::NeedsReconciliation { .. }) => {
                        let write = log
                            .state
                            .dangling_write()
                            .map(|w| Box::new(UnresolvedWrite::from(w)))
                            .expect("a run needing reconciliation has a dangling write");
                        return Err(RuntimeError::NeedsReconciliation {
                            run_id: log.run_id.clone(),
                            write,
                        });
                    }
                    Step::Idle(_) => return Ok(log.state.status()),
                }
            }
        }
        .await;
        let result = self.flushed(log, result).await;
        self.unregister_driver(&log.run_id);
        result
    }

    /// `result`, once what `log` holds is written: a flush that fails
    /// fails an `Ok` (what was held is lost, as in a crash), and an error
    /// stays the error it was.
    async fn flushed<T>(
        &self,
        log: &mut Log,
        result: Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let flushed = self.flush(log).await;
        let value = result?;
        flushed.map(|()| value)
    }

    async fn step_once(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
    ) -> Result<Step, RuntimeError> {
        still_valid(log)?;
        if driver.cancel.is_cancelled() {
            if log.state.terminal.is_some() {
                // Only deliveries are left; the next drive makes them.
                return Ok(Step::Idle(Idle::Terminal(log.state.status())));
            }
            return self.record_cancel(log, driver, None).await;
        }
        if let Some(delivery) = next_delivery(
            &log.events,
            &log.state,
            &prepared.view.name,
            &prepared.view.channels,
        ) {
            self.flush(log).await?;
            return self.deliver(log, prepared, driver, delivery).await;
        }
        let action = decide_next(log, &prepared.view);
        if !writes_first(&action) {
            self.flush(log).await?;
        }
        match action {
            Action::Idle(Idle::Waiting { until_ms }) => {
                // A durable timer: whoever drives the run once it is due
                // ends the wait; before that the run stays parked.
                let now = self.inner.clock.now_ms();
                if now < until_ms {
                    return Ok(Step::Idle(Idle::Waiting { until_ms }));
                }
                self.append(log, vec![Event::WaitEnded(WaitEnded { at_ms: now })])
                    .await?;
                Ok(Step::Progressed)
            }
            Action::Idle(idle) => Ok(Step::Idle(idle)),
            // Calls of the turn side by side (`runtime/batch.rs`).
            action if batch::runs_as_batch(log, prepared, &action) => {
                self.run_batch(log, prepared, driver).await
            }
            Action::CallModel(call) => self.call_model(log, prepared, driver, call).await,
            Action::CallTool(invocation) => {
                // The rule that approved the call must still stand when it
                // runs (a revocation reaches every call not yet run).
                if !invocation.recorded
                    && let Some(withdrawn) = self.lapsed_rule(log).await?
                {
                    self.append(log, vec![withdrawn]).await?;
                    return Ok(Step::Progressed);
                }
                self.call_tool(log, prepared, driver, invocation).await
            }
            Action::RequestApproval(request) => {
                self.request_approval(log, prepared, driver, request).await
            }
            Action::ConsultPolicy(consult) => {
                self.consult_policy(log, prepared, driver, consult).await
            }
            Action::ObserveClock => {
                let event = Event::ClockObserved(ClockObserved {
                    at_ms: self.inner.clock.now_ms(),
                });
                self.append(log, vec![event]).await?;
                Ok(Step::Progressed)
            }
            Action::Compact(call) => self.compact(log, prepared, driver, call).await,
            Action::StartChild(start) => self.start_child(log, prepared, start).await,
            Action::DriveChild(drive) => self.drive_child(log, prepared, drive).await,
            Action::ResolveContext(resolution) => {
                self.resolve_context(log, prepared, driver, resolution)
                    .await
            }
            other => {
                let event = other
                    .event()
                    .expect("every other action is recorded as one event");
                self.append(log, vec![event]).await?;
                Ok(Step::Progressed)
            }
        }
    }

    async fn call_model(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        mut call: ModelCall,
    ) -> Result<Step, RuntimeError> {
        if let ModelCallProgress::Failed {
            retry_at_ms: Some(due),
            ..
        } = log.state.model_call
        {
            // Wait until the recorded due time (the backoff, or what
            // Retry-After asked for), so a driver that recovers after a
            // crash waits only what is left of it.
            let wait = due.saturating_sub(self.inner.clock.now_ms());
            if wait > 0 {
                tracing::debug!(run_id = %log.run_id, step = call.step, attempt = call.attempt, wait_ms = wait, "waiting before the next model call attempt");
                tokio::select! {
                    () = driver.cancel.cancelled() => return self.record_cancel(log, driver, None).await,
                    () = self.inner.sleep.sleep(Duration::from_millis(wait)) => {}
                }
            }
        }
        // The request's messages, lent by the log's prompt cache for the
        // call (a copy of the conversation would cost as much as it is long).
        call.request.messages = log.prompt.lend(&log.state);
        if !call.recorded {
            self.append(log, vec![call.intent(self.inner.record_prompts)])
                .await?;
        }
        let streamed = stream_response(
            prepared.provider.as_ref(),
            &driver.cancel,
            &call.request,
            |text| {
                self.send(
                    &log.run_id,
                    RunUpdate::TextDelta {
                        step: call.step,
                        text: text.to_owned(),
                    },
                );
            },
        )
        .await;
        log.prompt
            .give_back(std::mem::take(&mut call.request.messages));
        let Some(outcome) = streamed else {
            return self.record_cancel(log, driver, None).await;
        };
        match outcome {
            Ok(response) => {
                let event = call.completion(
                    &response,
                    prepared.view.pricing.as_ref(),
                    self.inner.clock.now_ms(),
                );
                // Held for the run's next write, deferred: lost in a crash,
                // the call is made again (its intent is synced), as after a
                // crash mid-stream. Whatever the turn does next that is not
                // safe to repeat syncs it with its own first append (a
                // write's intent, an approval request).
                self.hold(log, event, Durability::Deferred)?;
            }
            Err(error) => {
                // Recorded, and shown from the record: not logged again.
                tracing::debug!(run_id = %log.run_id, step = call.step, attempt = call.attempt, %error, "model call failed");
                let event = call.failure(
                    &error,
                    self.inner.clock.now_ms(),
                    &prepared.view.retry,
                    self.inner.random.next_u64(),
                );
                self.append(log, vec![event]).await?;
            }
        }
        Ok(Step::Progressed)
    }

    async fn call_tool(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        invocation: ToolInvocation,
    ) -> Result<Step, RuntimeError> {
        let holder = Holder {
            run_id: log.run_id.clone(),
            call_id: invocation.intent.call_id.to_string(),
        };
        if invocation.intent.keyed_by.is_some() {
            // Claim the commitment before anything is recorded or run: the
            // call runs here only if no other run ran it or is running it.
            match self.claim(log, driver, &invocation, &holder).await? {
                Claimed::Granted => {}
                Claimed::Cancelled => return self.record_cancel(log, driver, None).await,
                Claimed::Settled(event) => {
                    self.append(log, vec![*event]).await?;
                    return Ok(Step::Progressed);
                }
            }
        }
        // The intent of a read rides with the next synced write: lost in a
        // machine crash, the read is decided and made again, which is
        // harmless by definition. Every other intent is on disk before its
        // effect starts (the write-ahead rule).
        let repeatable =
            invocation.intent.effect == EffectClass::Read && invocation.intent.keyed_by.is_none();
        if !invocation.recorded {
            if repeatable {
                self.append_deferred(log, vec![invocation.intent()]).await?;
            } else {
                self.append(log, vec![invocation.intent()]).await?;
            }
        }
        // The intent may have taken a while to record: no effect starts
        // past the claim.
        still_valid(log)?;
        let leased = self
            .tool_lease(log, prepared, driver, &invocation, None)
            .await?;
        match self
            .record_tool_outcome(log, driver, &invocation, leased)
            .await?
        {
            ToolOutcome::Recorded => Ok(Step::Progressed),
            ToolOutcome::Stopped(step) => Ok(step),
            ToolOutcome::Retry(delay) => {
                tokio::select! {
                    () = driver.cancel.cancelled() => self.record_cancel(log, driver, None).await,
                    () = tokio::time::sleep(delay) => Ok(Step::Progressed),
                }
            }
        }
    }

    /// One attempt at the tool call `invocation` (its intent recorded):
    /// a lease of its plugin within what is left of the run's budgets (its
    /// fuel at most `fuel`, when given: its share in a parallel batch), or a
    /// call to its MCP server. Everything it needs is taken now, so the
    /// returned future can run as a task of its own.
    fn tool_lease(
        &self,
        log: &Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        invocation: &ToolInvocation,
        fuel: Option<u64>,
    ) -> impl Future<Output = Result<Leased<ToolReturn>, RuntimeError>> + Send + use<> {
        let tool = &invocation.intent.tool;
        let call = invocation.wit_call(&log.run_id);
        let span = tracing::info_span!("tool_call", run_id = %log.run_id, call_id = %invocation.intent.call_id, plugin = %tool.plugin, tool = %tool.tool, attempt = invocation.attempt);
        let cancel = driver.cancel.clone();
        let agent = prepared.view.name.clone();
        let mut bound = lease_bound(log, prepared);
        if let Some(share) = fuel {
            bound.fuel = Some(bound.fuel.map_or(share, |left| left.min(share)));
        }
        let target = match prepared.mcp.get(&tool.plugin) {
            // An MCP server's tool: the same effect, made by its sandboxed
            // process instead of a WASM lease, within the run's budgets.
            Some(server) => Err((server.clone(), bound.wall_time)),
            None => {
                let plugin = prepared
                    .plugins
                    .get(&tool.plugin)
                    .expect("the agent view only names loaded plugins and MCP servers");
                Ok(fenced(&plugin.bounded(&bound), log))
            }
        };
        async move {
            match target {
                Err((server, wall_time)) => Ok(tracing::Instrument::instrument(
                    server.invoke(&call, wall_time, Some(&cancel)),
                    span,
                )
                .await),
                Ok(plugin) => {
                    let leased = {
                        let _enter = span.enter();
                        plugin.invoke(&call, Some(&cancel))
                    };
                    leased.await.map_err(|e| RuntimeError::Agent {
                        agent,
                        message: e.to_string(),
                    })
                }
            }
        }
    }

    /// Records what one attempt at `invocation` returned: its completion
    /// (settling its key, when keyed), a failed attempt to retry after the
    /// returned delay, a write's unknown outcome, or the run's cancellation.
    async fn record_tool_outcome(
        &self,
        log: &mut Log,
        driver: &DriverHandle,
        invocation: &ToolInvocation,
        leased: Leased<ToolReturn>,
    ) -> Result<ToolOutcome, RuntimeError> {
        if matches!(
            &leased.result,
            Err(e) if e.failure == LeaseFailure::Cancelled
        ) {
            // The call was interrupted: record the cancellation, carrying the
            // write if it was one (its outcome is unknown).
            return Ok(ToolOutcome::Stopped(
                self.record_cancel(log, driver, None).await?,
            ));
        }
        let holder = Holder {
            run_id: log.run_id.clone(),
            call_id: invocation.intent.call_id.to_string(),
        };
        let repeatable =
            invocation.intent.effect == EffectClass::Read && invocation.intent.keyed_by.is_none();
        match disposition(invocation.intent.effect, invocation.attempt, &leased.result) {
            Disposition::Complete => {
                let event = invocation.completion(&leased.result, leased.receipt);
                // A call that failed leaves nothing to reuse: its key is
                // released, so a later run (once the cause is fixed) makes
                // the call instead of being handed this error.
                let result = ToolCallResult::from_invocation(&leased.result);
                let outcome = match &result {
                    ToolCallResult::Output(_) => Settle::Result(Bytes::from(
                        serde_json::to_vec(&result).expect("a tool call result serializes"),
                    )),
                    ToolCallResult::Error(_) => Settle::Release,
                };
                let settlement = invocation.intent.keyed_by.as_ref().map(|_| Settlement {
                    key: invocation.intent.idempotency_key.clone(),
                    holder,
                    outcome,
                });
                // A keyed call's settlement is written with its completion,
                // synced. Any other completion rides with the run's next
                // write, which comes before any further effect: a read's
                // deferred (lost, the read is made again), any other call's
                // synced, so it is on disk before the next effect starts.
                match settlement {
                    Some(settlement) => {
                        self.append_with(log, vec![event], Some(&settlement))
                            .await?;
                    }
                    None if repeatable => self.hold(log, event, Durability::Deferred)?,
                    None => self.hold(log, event, Durability::Synced)?,
                }
                Ok(ToolOutcome::Recorded)
            }
            Disposition::Retry => {
                tracing::info!(run_id = %log.run_id, call_id = %invocation.intent.call_id, attempt = invocation.attempt, "tool call failed; trying again");
                let event = invocation.attempt_failed(&leased.result, leased.receipt, false);
                self.append(log, vec![event]).await?;
                Ok(ToolOutcome::Retry(Duration::from_millis(
                    100u64 << (invocation.attempt - 1).min(4),
                )))
            }
            Disposition::OutcomeUnknown => {
                tracing::warn!(run_id = %log.run_id, call_id = %invocation.intent.call_id, "a write's lease died mid-call: its outcome is unknown");
                let event = invocation.attempt_failed(&leased.result, leased.receipt, true);
                self.append(log, vec![event]).await?;
                Ok(ToolOutcome::Recorded)
            }
        }
    }

    /// Makes one attempt at a delivery: its intent first (unless recorded),
    /// the wait its last failure recorded, one lease of the channel, then
    /// its completion, a failed attempt with the time of the next, or the
    /// delivery given up. Never fails the run: a channel's errors are
    /// recorded as the delivery's.
    async fn deliver(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        delivery: Delivery,
    ) -> Result<Step, RuntimeError> {
        if !delivery.recorded {
            self.append(log, vec![Event::DeliveryIntent(delivery.intent.clone())])
                .await?;
        }
        if let Some(due) = delivery.not_before_ms {
            let wait = due.saturating_sub(self.inner.clock.now_ms());
            if wait > 0 {
                tokio::select! {
                    () = driver.cancel.cancelled() => {
                        if log.state.terminal.is_some() {
                            return Ok(Step::Idle(Idle::Terminal(log.state.status())));
                        }
                        return self.record_cancel(log, driver, None).await;
                    }
                    () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                }
            }
        }
        let intent = &delivery.intent;
        let channel = prepared
            .view
            .channels
            .iter()
            .find(|c| c.name == intent.channel);
        let plugin = channel.and_then(|c| prepared.plugins.get(&c.plugin));
        let event = match (channel, plugin) {
            (Some(channel), Some(plugin)) => {
                let span = tracing::info_span!("delivery", run_id = %log.run_id, delivery_id = %intent.delivery_id, channel = %channel.name, attempt = delivery.attempt);
                let message = intent.wit_delivery(log.run_id.as_str());
                // Not bounded by the run's budgets (a finished run still
                // delivers), but stopped with the driver's claim.
                let plugin = fenced(plugin, log);
                still_valid(log)?;
                let leased = {
                    let _enter = span.enter();
                    plugin.deliver(&message, None)
                }
                .await;
                let (error, receipt) = match leased {
                    Ok(leased) => (outcome_error(&leased.result), Some(leased.receipt)),
                    Err(e) => (
                        Some(DeliveryError::Unavailable {
                            message: e.to_string(),
                        }),
                        None,
                    ),
                };
                match receipt {
                    Some(receipt) => {
                        if let Some(error) = &error {
                            tracing::warn!(run_id = %log.run_id, delivery_id = %intent.delivery_id, attempt = delivery.attempt, %error, "delivery failed");
                        }
                        settle(
                            &delivery,
                            channel,
                            error,
                            receipt,
                            self.inner.clock.now_ms(),
                        )
                    }
                    None => Event::DeliveryFailed(DeliveryFailed {
                        delivery_id: intent.delivery_id.clone(),
                        attempts: delivery.attempt,
                        error: error.expect("no receipt means the plugin refused"),
                        receipt: None,
                    }),
                }
            }
            _ => Event::DeliveryFailed(DeliveryFailed {
                delivery_id: intent.delivery_id.clone(),
                attempts: delivery.attempt,
                error: DeliveryError::Unavailable {
                    message: format!("the agent has no channel `{}` any more", intent.channel),
                },
                receipt: None,
            }),
        };
        match self.append(log, vec![event.clone()]).await {
            // A human's verb (an approval, say) was recorded while the
            // channel ran: the log was reloaded; record the outcome after it
            // if the delivery is still the one in flight.
            Err(RuntimeError::Conflict { .. })
                if log.state.deliveries.in_flight.as_ref().is_some_and(|d| {
                    d.intent.delivery_id == intent.delivery_id
                        && d.failed_attempts + 1 == delivery.attempt
                }) =>
            {
                self.append(log, vec![event]).await?;
            }
            other => other?,
        }
        Ok(Step::Progressed)
    }

    /// Claims a keyed call's commitment, waiting while another run holds it
    /// unsettled.
    async fn claim(
        &self,
        log: &Log,
        driver: &DriverHandle,
        invocation: &ToolInvocation,
        holder: &Holder,
    ) -> Result<Claimed, RuntimeError> {
        let key = &invocation.intent.idempotency_key;
        let mut delay = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        loop {
            match self.inner.store.claim_commitment(key, holder).await? {
                KeyClaim::Granted => return Ok(Claimed::Granted),
                KeyClaim::Settled { holder, result } => {
                    let result: ToolCallResult =
                        serde_json::from_slice(&result).map_err(|e| RuntimeError::Store {
                            error: StoreError::Backend {
                                context: format!(
                                    "commitment {key}: the recorded result cannot be read"
                                ),
                                error: Box::new(e),
                            },
                        })?;
                    let origin_call = CallId::from_text(holder.call_id);
                    return Ok(Claimed::Settled(Box::new(invocation.deduplicated(
                        result,
                        holder.run_id,
                        origin_call,
                    ))));
                }
                KeyClaim::Held(other) => {
                    if let Some(status) = self.ended_status(&other.run_id).await? {
                        return Err(RuntimeError::CommitmentOrphaned {
                            run_id: log.run_id.clone(),
                            call_id: invocation.intent.call_id.clone(),
                            key: key.clone(),
                            holder: Box::new(other),
                            holder_status: status,
                        });
                    }
                    if waited >= self.inner.commitment_wait {
                        return Err(RuntimeError::CommitmentHeld {
                            run_id: log.run_id.clone(),
                            call_id: invocation.intent.call_id.clone(),
                            key: key.clone(),
                            holder: other,
                        });
                    }
                    tokio::select! {
                        () = driver.cancel.cancelled() => return Ok(Claimed::Cancelled),
                        () = tokio::time::sleep(delay) => {}
                    }
                    waited += delay;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// The listed status of run `run_id` if it ended (`gone` when it was
    /// pruned), `None` while it has not.
    async fn ended_status(&self, run_id: &RunId) -> Result<Option<String>, RuntimeError> {
        match self.inner.store.summary(run_id).await {
            Ok(s) if SETTLED_STATUSES.contains(&s.status.as_str()) => Ok(Some(s.status)),
            Ok(_) => Ok(None),
            Err(StoreError::UnknownRun { .. }) => Ok(Some("gone".to_owned())),
            Err(e) => Err(e.into()),
        }
    }

    /// Asks a policy and records its decision (a failure is a decision too:
    /// `failed`, and the run then fails).
    async fn consult_policy(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        consult: PolicyConsult,
    ) -> Result<Step, RuntimeError> {
        let request = consult.request(&log.run_id, &prepared.view.name);
        let timeout = self.inner.policy_timeout;
        let asked = async {
            if let Some(plugin) = prepared.policy_plugins.get(&consult.policy) {
                let plugin = for_run(plugin, log, prepared);
                return Ok(consult_policy_plugin(&plugin, &request, timeout).await);
            }
            let Some(policy) = self.inner.policies.get(&consult.policy) else {
                return Err(RuntimeError::PolicyNotRegistered {
                    agent: prepared.view.name.clone(),
                    policy: consult.policy.clone(),
                });
            };
            let (verdict, reason) = consult_policy(policy, &request, timeout).await;
            Ok((verdict, reason, None))
        };
        let (verdict, reason, receipt) = tokio::select! {
            () = driver.cancel.cancelled() => return self.record_cancel(log, driver, None).await,
            decided = asked => decided?,
        };
        if verdict == PolicyVerdict::Failed {
            tracing::warn!(run_id = %log.run_id, policy = %consult.policy, hook = %consult.point.hook(), reason = reason.as_deref().unwrap_or_default(), "policy failed; the run fails closed");
        }
        self.append(log, vec![consult.decided(verdict, reason, receipt)])
            .await?;
        Ok(Step::Progressed)
    }

    async fn request_approval(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        request: ApprovalRequest,
    ) -> Result<Step, RuntimeError> {
        if prepared.mcp.contains_key(&request.tool.plugin) {
            // MCP has no side-effect-free preview: the human sees the call.
            let event = request.event(None, self.inner.clock.now_ms());
            let granted = self.granting_rule(log, &request).await?;
            self.append(log, std::iter::once(event).chain(granted).collect())
                .await?;
            return Ok(Step::Progressed);
        }
        let plugin = prepared
            .plugins
            .get(&request.tool.plugin)
            .expect("the agent view only names loaded plugins");
        let call = request.wit_call(&log.run_id);
        let leased = for_run(plugin, log, prepared)
            .preflight(&call, Some(&driver.cancel))
            .await
            .map_err(|e| plugin_error(&prepared.view, e))?;
        if matches!(&leased.result, Err(e) if e.failure == LeaseFailure::Cancelled) {
            return self.record_cancel(log, driver, None).await;
        }
        let event = request.event(
            Some((&leased.result, leased.receipt)),
            self.inner.clock.now_ms(),
        );
        // A standing rule approves it in the same append, the rule named;
        // otherwise it parks for a human.
        let granted = self.granting_rule(log, &request).await?;
        self.append(log, std::iter::once(event).chain(granted).collect())
            .await?;
        Ok(Step::Progressed)
    }

    /// Makes a compaction call: intent, the summarising request, then the
    /// summary or the failure (never retried within the step: the step
    /// goes on uncompacted).
    async fn compact(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        call: CompactionCall,
    ) -> Result<Step, RuntimeError> {
        if !call.recorded {
            self.append(log, vec![call.intent(self.inner.record_prompts)])
                .await?;
        }
        // A summary is not an answer: its deltas go to no subscriber.
        let streamed = stream_response(
            prepared.provider.as_ref(),
            &driver.cancel,
            &call.request,
            |_| {},
        )
        .await;
        let Some(outcome) = streamed else {
            return self.record_cancel(log, driver, None).await;
        };
        let event = match outcome {
            Ok(response) => call.completion(&response, prepared.view.pricing.as_ref()),
            Err(error) => {
                tracing::warn!(run_id = %log.run_id, step = call.step, %error, "compaction failed; the prompt goes on uncompacted");
                call.failure(&error)
            }
        };
        self.append(log, vec![event]).await?;
        Ok(Step::Progressed)
    }

    /// Resolves one context source in a fresh lease and records what it
    /// returned, or how it failed, with the clock reading ages are measured
    /// from.
    async fn resolve_context(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        resolution: ContextResolution,
    ) -> Result<Step, RuntimeError> {
        let source = prepared
            .view
            .context_source(&resolution.source)
            .expect("decide names the agent's sources");
        let plugin = prepared
            .context
            .get(&resolution.source)
            .expect("every source's plugin is loaded");
        let request = wit::ContextRequest {
            run_id: log.run_id.to_string(),
            query: source.query.clone(),
        };
        let span = tracing::info_span!("context", run_id = %log.run_id, source = %source.name, plugin = %source.plugin, step = resolution.step);
        let plugin = for_run(plugin, log, prepared);
        let leased = {
            let _enter = span.enter();
            plugin.resolve(&request, Some(&driver.cancel))
        }
        .await;
        let at_ms = self.inner.clock.now_ms();
        let failed = |error: ContextError, receipt| {
            tracing::warn!(run_id = %log.run_id, source = %source.name, %error, "context source failed");
            Event::ContextFailed(ContextFailed {
                source: source.name.clone(),
                step: resolution.step,
                at_ms,
                error,
                receipt,
            })
        };
        let event = match leased {
            Err(e) => failed(
                ContextError::Unavailable {
                    message: e.to_string(),
                },
                None,
            ),
            Ok(leased) => match &leased.result {
                Err(e) if e.failure == LeaseFailure::Cancelled => {
                    return self.record_cancel(log, driver, None).await;
                }
                Err(e) => failed(ContextError::from_lease(e), Some(leased.receipt)),
                Ok(Err(e)) => failed(ContextError::from_wit(e), Some(leased.receipt)),
                Ok(Ok(items)) => {
                    let items: Vec<ContextItem> = items.iter().map(ContextItem::from).collect();
                    Event::ContextResolved(ContextResolved {
                        source: source.name.clone(),
                        step: resolution.step,
                        at_ms,
                        digest: super::context::digest(&items),
                        items,
                        receipt: leased.receipt,
                    })
                }
            },
        };
        self.append(log, vec![event]).await?;
        Ok(Step::Progressed)
    }

    async fn record_cancel(
        &self,
        log: &mut Log,
        driver: &DriverHandle,
        reason: Option<String>,
    ) -> Result<Step, RuntimeError> {
        let asked = driver
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let event = Event::RunCancelled(RunCancelled {
            reason: reason.or(asked.reason),
            by: asked.by,
            unresolved_write: log.state.dangling_write().map(UnresolvedWrite::from),
        });
        self.append(log, vec![event]).await?;
        Ok(Step::Idle(Idle::Terminal(RunStatus::Cancelled)))
    }

    // ---- the log ----

    /// The run's decoded events, its session history resolved.
    async fn load_events(&self, run_id: &RunId) -> Result<Vec<Event>, RuntimeError> {
        Ok(self.load_witnessed(run_id).await?.0)
    }

    /// [`load_events`](Self::load_events), and what the runtime's witness
    /// finds wrong with the stored log, if anything.
    async fn load_witnessed(
        &self,
        run_id: &RunId,
    ) -> Result<(Vec<Event>, Option<String>), RuntimeError> {
        let store = self.inner.store.as_ref();
        let stored = store.load(run_id).await?;
        let rolled_back = self.witness_problem(run_id, &stored);
        let mut events = decoded(run_id, &stored)?;
        resolve_history(store, &mut events).await?;
        Ok((events, rolled_back))
    }

    /// What the runtime's witness finds wrong with `run_id`'s stored log.
    fn witness_problem(&self, run_id: &RunId, stored: &[StoredEvent]) -> Option<String> {
        self.inner
            .witness
            .as_ref()
            .and_then(|w| w.problem(run_id, stored))
    }

    /// [`RuntimeError::RolledBack`] when the runtime's witness finds
    /// `problem` with `run_id`.
    fn refuse_rolled_back(
        &self,
        run_id: &RunId,
        problem: Option<&String>,
    ) -> Result<(), RuntimeError> {
        match (problem, &self.inner.witness) {
            (Some(problem), Some(witness)) => Err(RuntimeError::RolledBack {
                run_id: run_id.clone(),
                witness: witness.source().to_owned(),
                problem: problem.clone(),
            }),
            _ => Ok(()),
        }
    }

    async fn load_log(&self, run_id: &RunId) -> Result<Log, RuntimeError> {
        let (events, rolled_back) = self.load_witnessed(run_id).await?;
        let state = fold(&events).map_err(|error| RuntimeError::Fold {
            run_id: run_id.clone(),
            error,
        })?;
        refuse_unfinished_fork(run_id, &state)?;
        let channels = self.known_channels(&state.agent_digest);
        Ok(Log {
            run_id: run_id.clone(),
            events,
            state,
            fence: None,
            valid: None,
            channels,
            prompt: PromptCache::new(),
            held: Held::default(),
            rolled_back,
        })
    }

    /// Appends `new` to the log: folded first (an impossible event is a bug
    /// and is refused before it is written), then written with the length
    /// the log had, then published.
    async fn append(&self, log: &mut Log, new: Vec<Event>) -> Result<(), RuntimeError> {
        self.append_with(log, new, None).await
    }

    /// [`append`](Self::append), its sync deferred to the store's next
    /// synced write ([`Durability::Deferred`]): only for events whose loss
    /// in a machine crash the run repairs by doing the same again (see
    /// "Durability" in the module docs).
    async fn append_deferred(&self, log: &mut Log, new: Vec<Event>) -> Result<(), RuntimeError> {
        self.write(log, new, None, Durability::Deferred).await
    }

    /// [`append`](Self::append), settling an idempotency commitment in the
    /// same transaction when `settlement` is given.
    async fn append_with(
        &self,
        log: &mut Log,
        new: Vec<Event>,
        settlement: Option<&Settlement>,
    ) -> Result<(), RuntimeError> {
        self.write(log, new, settlement, Durability::Synced).await
    }

    /// Folds `event` into the log and holds it for the log's next write,
    /// which carries it as durable as `needs` says at least. Only for an
    /// event after which the run decides before it starts any effect: the
    /// next step writes first or [flushes](Self::flush) (`step_once`), and
    /// every end of a drive flushes.
    fn hold(&self, log: &mut Log, event: Event, needs: Durability) -> Result<(), RuntimeError> {
        still_valid(log)?;
        let bytes = recordable(&log.run_id, &event)?;
        log.state
            .apply(&event)
            .map_err(|error| RuntimeError::Fold {
                run_id: log.run_id.clone(),
                error,
            })?;
        log.events.push(event);
        log.held.bytes.push(bytes);
        log.held.synced |= needs == Durability::Synced;
        Ok(())
    }

    /// Writes what the log holds, if anything, as durable as it needs.
    async fn flush(&self, log: &mut Log) -> Result<(), RuntimeError> {
        if log.held.is_empty() {
            return Ok(());
        }
        self.write(log, Vec::new(), None, Durability::Deferred)
            .await
    }

    /// Folds `new` into the log's state and writes it after what the log
    /// holds, as durable as `durability` or the held events say.
    async fn write(
        &self,
        log: &mut Log,
        new: Vec<Event>,
        settlement: Option<&Settlement>,
        durability: Durability,
    ) -> Result<(), RuntimeError> {
        // A driver past its own view of its claim records nothing more:
        // what it would record may come from a lease the sandbox stopped.
        still_valid(log)?;
        // Nor does anyone on a log its witness says was rolled back: this
        // is the one write path, and every effect is preceded by a write
        // (its intent), so no verb of any front end drives such a run.
        self.refuse_rolled_back(&log.run_id, log.rolled_back.as_ref())?;
        // Encode and fold first: an event that could not be read back, or
        // an impossible one, is refused before it is written. One event (the
        // usual case) is folded in place, without copying the state and its
        // conversation; `apply` leaves the state unchanged when it refuses.
        let encoded = new
            .iter()
            .map(|e| recordable(&log.run_id, e))
            .collect::<Result<Vec<Bytes>, _>>()?;
        let fold_error = |error| RuntimeError::Fold {
            run_id: log.run_id.clone(),
            error,
        };
        match new.as_slice() {
            [] => {}
            [event] => log.state.apply(event).map_err(fold_error)?,
            _ => {
                let mut state = log.state.clone();
                for event in &new {
                    state.apply(event).map_err(fold_error)?;
                }
                log.state = state;
            }
        }
        let held = std::mem::take(&mut log.held);
        let durability = held.durability(durability);
        let mut bytes = held.bytes;
        let held = bytes.len();
        bytes.extend(encoded);
        let expected = (log.events.len() - held) as u64;
        let (status, now) = (log.state.status(), self.inner.clock.now_ms() as i64);
        let mut listing = Listing::new(status.listing())
            .owing(Self::owed(log, &new, status))
            .waking_at(log.state.waiting().map(|w| w.until_ms as i64));
        if durability == Durability::Deferred {
            listing = listing.deferred();
        }
        let store = &self.inner.store;
        let written = match (settlement, &log.fence) {
            (None, None) => {
                store
                    .append(&log.run_id, expected, &bytes, listing, now)
                    .await
            }
            (None, Some(claim)) => {
                store
                    .append_fenced_to(&log.run_id, claim, expected, &bytes, listing, now)
                    .await
            }
            (Some(s), fence) => {
                store
                    .append_settling(
                        SettlingAppend::new(&log.run_id, expected, &bytes, s)
                            .fenced(fence.as_ref())
                            .listing(listing)
                            .at(now),
                    )
                    .await
            }
        };
        if let Err(error) = written {
            // The state is ahead of the store: take the store's word again
            // (what was held is gone, as in a crash), so a caller that goes
            // on with this log sees what is recorded.
            if let Ok(fresh) = self.load_log(&log.run_id).await {
                log.events = fresh.events;
                log.state = fresh.state;
                log.prompt = fresh.prompt;
            }
            return Err(error.into());
        }
        let first_held = log.events.len() - held;
        for (i, event) in log.events[first_held..].iter().enumerate() {
            self.publish(&log.run_id, expected + 1 + i as u64, event.clone());
        }
        for (i, event) in new.into_iter().enumerate() {
            let seq = expected + 1 + (held + i) as u64;
            log.events.push(event.clone());
            self.publish(&log.run_id, seq, event);
        }
        Ok(())
    }

    /// How many deliveries the run owes once `new` is appended to `log`
    /// (whose state already folded `new`), for its listing: counted only
    /// when the run waits or is finished (a running run is claimable
    /// anyway, and counting would scan its log on every step); with the
    /// agent's channels unknown, only the delivery in flight.
    fn owed(log: &Log, new: &[Event], status: RunStatus) -> u32 {
        if status == RunStatus::Running {
            return 0;
        }
        match &log.channels {
            Some(channels) => owed_count(log.events.iter().chain(new), &log.state, channels),
            None => u32::from(log.state.deliveries.in_flight.is_some()),
        }
    }

    /// The channels of the agent with `digest`, if this runtime prepared it.
    fn known_channels(&self, digest: &AgentDigest) -> Option<Arc<[Channel]>> {
        self.inner
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .map(|p| p.view.channels.clone().into())
    }

    fn check_digest(&self, log: &Log, agent: &Agent, accept: bool) -> Result<(), RuntimeError> {
        if !accept && log.state.agent_digest != agent.digest {
            return Err(RuntimeError::Replay {
                run_id: log.run_id.clone(),
                error: ReplayError::AgentChanged {
                    agent: agent.name.clone(),
                    recorded: log.state.agent_digest.clone(),
                    current: agent.digest.clone(),
                },
            });
        }
        Ok(())
    }

    fn refuse_terminal(&self, log: &Log) -> Result<(), RuntimeError> {
        let status = log.state.status();
        if status.is_terminal() {
            return Err(RuntimeError::AlreadyTerminal {
                run_id: log.run_id.clone(),
                status,
            });
        }
        Ok(())
    }

    async fn awaiting_approval(
        &self,
        run_id: &RunId,
        call_id: &CallId,
    ) -> Result<Log, RuntimeError> {
        let log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        match log.state.parked() {
            Some(Parked::Approval { call }) if &call.call_id == call_id => Ok(log),
            Some(Parked::Approval { call }) => Err(RuntimeError::NotAwaitingApproval {
                run_id: run_id.clone(),
                call_id: call_id.clone(),
                awaiting: call.call_id.to_string(),
            }),
            _ => Err(RuntimeError::NotParked {
                run_id: run_id.clone(),
                status: log.state.status(),
                needed: "awaiting_approval",
            }),
        }
    }

    // ---- agents ----

    /// Loads the agent's plugins (once per agent digest) and makes its
    /// provider.
    async fn prepare(&self, agent: &Agent) -> Result<Arc<Prepared>, RuntimeError> {
        if let Some(p) = self
            .inner
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&agent.digest)
        {
            return Ok(Arc::clone(p));
        }
        let mut plugins = HashMap::new();
        for p in &agent.plugins {
            let loaded = self
                .inner
                .plugins
                .load(&p.source, &p.grant, &p.grant_base)
                .await
                .map_err(|e| RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: format!("plugin `{}`: {e}", p.key),
                })?;
            plugins.insert(p.key.clone(), loaded);
        }
        agent
            .check_plugin_kinds(|key| (plugins[key].kinds(), plugins[key].source().to_string()))
            .map_err(|e| match e {
                AgentError::Invalid { key, message, .. } => RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: format!("key `{key}`: {message}"),
                },
                other => RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: other.to_string(),
                },
            })?;
        let mut context = HashMap::new();
        for source in &agent.context {
            let plugin = agent
                .plugins
                .iter()
                .find(|p| p.key == source.plugin)
                .expect("validated: a context source names a plugin of the agent");
            let mut grant = plugin.grant.clone();
            grant.limits = super::context::overlay(&grant.limits, &source.limits);
            let loaded = self
                .inner
                .plugins
                .load(&plugin.source, &grant, &plugin.grant_base)
                .await
                .map_err(|e| RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: format!(
                        "context source `{}`: plugin `{}`: {e}",
                        source.name, plugin.key
                    ),
                })?;
            context.insert(source.name.clone(), loaded);
        }
        let policy_plugins = agent
            .policies
            .iter()
            .filter_map(|p| Some((p.name.clone(), plugins[p.plugin.as_ref()?].clone())))
            .collect();
        let mut mcp = HashMap::new();
        for server in &agent.mcp_servers {
            let connection = crate::mcp_servers::McpConnection::connect(server)
                .await
                .map_err(|e| RuntimeError::Agent {
                    agent: agent.name.clone(),
                    message: e.to_string(),
                })?;
            mcp.insert(server.key.clone(), connection);
        }
        let tools: Vec<(&str, &[warden_plugins::ToolDescriptor])> = agent
            .plugins
            .iter()
            .map(|p| (p.key.as_str(), plugins[&p.key].tools()))
            .chain(
                agent
                    .mcp_servers
                    .iter()
                    .map(|s| (s.key.as_str(), mcp[&s.key].tools())),
            )
            .collect();
        let mut view =
            AgentView::new(agent, &tools).map_err(|e: AgentViewError| RuntimeError::Agent {
                agent: agent.name.clone(),
                message: e.to_string(),
            })?;
        view.mcp_tools = mcp
            .iter()
            .map(|(key, c)| (key.clone(), c.offered()))
            .collect();
        // A plan decides its own steps: a runtime-wide provider stands in
        // for models, not for plans.
        let provider = match &self.inner.provider {
            Some(p) if agent.model.plan.is_none() => Arc::clone(p),
            _ => agent
                .model
                .provider()
                .map_err(|error| RuntimeError::Provider {
                    agent: agent.name.clone(),
                    error,
                })?,
        };
        let prepared = Arc::new(Prepared {
            view,
            plugins,
            context,
            policy_plugins,
            mcp,
            provider,
        });
        self.inner
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent.digest.clone(), Arc::clone(&prepared));
        Ok(prepared)
    }

    // ---- live runs: subscribers and drivers ----

    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Live>> {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live_entry<R>(&self, run_id: &RunId, f: impl FnOnce(&mut Live) -> R) -> R {
        let mut live = self.lock_live();
        let entry = live.entry(run_id.clone()).or_insert_with(|| Live {
            updates: broadcast::channel(SUBSCRIBER_BUFFER).0,
            driver: None,
        });
        f(entry)
    }

    fn publish(&self, run_id: &RunId, seq: u64, event: Event) {
        self.send(
            run_id,
            RunUpdate::Event {
                seq,
                event: Arc::new(event),
            },
        );
    }

    fn send(&self, run_id: &RunId, update: RunUpdate) {
        let live = self.lock_live();
        if let Some(l) = live.get(run_id) {
            // No receivers is fine: nobody is watching.
            let _ = l.updates.send(update);
        }
    }

    fn register_driver(&self, run_id: &RunId) -> DriverHandle {
        let cancel = CancellationToken::new();
        let reason = Arc::new(Mutex::new(Cancellation::default()));
        let (done_tx, done_rx) = watch::channel(false);
        self.live_entry(run_id, |l| {
            l.driver = Some(Driver {
                cancel: cancel.clone(),
                reason: Arc::clone(&reason),
                done: done_rx,
            })
        });
        DriverHandle {
            cancel,
            reason,
            done: done_tx,
        }
    }

    fn unregister_driver(&self, run_id: &RunId) {
        let mut live = self.lock_live();
        if let Some(l) = live.get_mut(run_id) {
            l.driver = None;
            if l.updates.receiver_count() == 0 {
                live.remove(run_id);
            }
        }
    }
}

/// Streams one request to the provider and assembles the response, handing
/// each text delta to `on_delta` as it arrives. `None` when `cancel` fired
/// first: the stream is dropped, and the caller records the cancellation.
/// Otherwise the response, or the provider's error (a failed stream, or
/// events that do not assemble).
async fn stream_response(
    provider: &dyn ModelProvider,
    cancel: &CancellationToken,
    request: &ModelRequest,
    mut on_delta: impl FnMut(&str),
) -> Option<Result<ModelResponse, ProviderError>> {
    let mut stream = provider.stream(request);
    let mut assembler = ResponseAssembler::new(provider.name());
    loop {
        let item = tokio::select! {
            () = cancel.cancelled() => return None,
            item = stream.next() => item,
        };
        match item {
            None => return Some(assembler.finish()),
            Some(Err(e)) => return Some(Err(e)),
            Some(Ok(event)) => {
                if let ProviderEvent::TextDelta(text) = &event {
                    on_delta(text);
                }
                if let Err(e) = assembler.push(event) {
                    return Some(Err(e));
                }
            }
        }
    }
}

/// What the driver of one run holds.
struct DriverHandle {
    cancel: CancellationToken,
    reason: Arc<Mutex<Cancellation>>,
    done: watch::Sender<bool>,
}

/// What a [`Runtime::cancel`] asked of the driver it interrupts, for the
/// event the driver records when it stops.
#[derive(Clone, Debug, Default)]
struct Cancellation {
    reason: Option<String>,
    by: Option<String>,
}

impl Drop for DriverHandle {
    fn drop(&mut self) {
        let _ = self.done.send(true);
    }
}

/// What [`decide`](super::decide()) decides for the run in `log`, a model call's request
/// and hash taken from the log's [`PromptCache`] (the messages are lent to
/// the request when the call is made, [`Runtime::call_model`]), so a long
/// run's step does not rebuild and rehash the whole conversation.
fn decide_next(log: &mut Log, view: &AgentView) -> Action {
    let mut action = decide_with(&log.state, view, RequestDetail::Frame);
    if let Action::CallModel(call) = &mut action {
        (call.request_hash, call.request_size) = log.prompt.hash(&log.state, &call.request);
        // The input check `decide` makes once it knows the request's size.
        if !call.recorded
            && let Some(park) = input_gate(&log.state, view, call.request_size)
        {
            return park;
        }
    }
    action
}

/// Whether `action`, taken by `step_once`, appends before it starts any
/// effect, so that what the log holds may ride with that append: a new
/// model or tool call's intent, or a record of one event. Anything else (a
/// preview for an approval, context to resolve, a policy to ask, a child to
/// start, a call recorded before a crash, a wait) has the held events
/// written first.
fn writes_first(action: &Action) -> bool {
    match action {
        Action::CallModel(call) => !call.recorded,
        Action::Compact(call) => !call.recorded,
        // A keyed call claims its key first, which another run may wait on.
        Action::CallTool(invocation) => {
            !invocation.recorded && invocation.intent.keyed_by.is_none()
        }
        Action::ObserveClock
        | Action::RejectToolCall(_)
        | Action::RejectOutput(_)
        | Action::WithdrawApproval(_)
        | Action::Finish(_)
        | Action::Park(_)
        | Action::Fail(_) => true,
        Action::RequestApproval(_)
        | Action::ConsultPolicy(_)
        | Action::ResolveContext(_)
        | Action::StartChild(_)
        | Action::DriveChild(_)
        | Action::Idle(_) => false,
    }
}

/// The events of `run_id`'s stored log, decoded; an event that does not
/// decode is [`RuntimeError::Log`] naming its position.
fn decoded(run_id: &RunId, stored: &[StoredEvent]) -> Result<Vec<Event>, RuntimeError> {
    stored
        .iter()
        .map(|s| {
            decode(&s.bytes).map_err(|error| RuntimeError::Log {
                run_id: run_id.clone(),
                seq: s.seq,
                error,
            })
        })
        .collect()
}

/// What is left of the run's wall-time and fuel budgets (with recorded
/// extensions): every lease the run makes fits in it, whatever the plugin's
/// own limits say.
fn lease_bound(log: &Log, prepared: &Prepared) -> RunBound {
    let state = &log.state;
    let limits = state.effective_limits(&prepared.view.budgets);
    RunBound {
        wall_time: limits
            .wall_time_ms
            .map(|max| Duration::from_millis(max.saturating_sub(state.usage.wall_time_ms))),
        fuel: limits.fuel.map(|max| max.saturating_sub(state.usage.fuel)),
    }
}

/// `plugin` as the run's leases use it: within what is left of the run's
/// budgets, and [`fenced`].
fn for_run(plugin: &LoadedPlugin, log: &Log, prepared: &Prepared) -> LoadedPlugin {
    fenced(&plugin.bounded(&lease_bound(log, prepared)), log)
}

/// `plugin` whose leases stop making effects once the driver's view of its
/// claim has passed; unchanged for a driver without a claim (`warden run`).
fn fenced(plugin: &LoadedPlugin, log: &Log) -> LoadedPlugin {
    match &log.valid {
        Some(valid) => plugin.valid_until(valid.clone()),
        None => plugin.clone(),
    }
}

/// [`RuntimeError::ClaimExpired`] once the driver's view of its claim has
/// passed.
fn still_valid(log: &Log) -> Result<(), RuntimeError> {
    match &log.valid {
        Some(valid) if !valid.is_valid() => Err(RuntimeError::ClaimExpired {
            run_id: log.run_id.clone(),
        }),
        _ => Ok(()),
    }
}

fn plugin_error(view: &AgentView, e: PluginError) -> RuntimeError {
    RuntimeError::Agent {
        agent: view.name.clone(),
        message: e.to_string(),
    }
}

/// How many times a start in a session reads the session again after the
/// store found it changed since it was read.
const SESSION_READ_ATTEMPTS: u32 = 5;

/// How long a keyed call waits for another run holding its commitment
/// before the drive gives up (the run stays as it was), by default.
const DEFAULT_COMMITMENT_WAIT: Duration = Duration::from_secs(120);

/// What claiming a keyed call's commitment decided.
enum Claimed {
    /// Run the call here.
    Granted,
    /// Another run ran it: record its result.
    Settled(Box<Event>),
    /// The run was cancelled while waiting.
    Cancelled,
}

/// What a tool's lease (or MCP call) returns: the guest's output or error.
type ToolReturn = Result<wit::ToolOutput, wit::ToolError>;

/// What [`Runtime::record_tool_outcome`] recorded.
enum ToolOutcome {
    /// The attempt's completion, or a write's unknown outcome.
    Recorded,
    /// A failed attempt: try again after the delay.
    Retry(Duration),
    /// The run stopped (cancelled) with this step.
    Stopped(Step),
}

/// What to record after a tool call's attempt.
#[derive(Debug, PartialEq, Eq)]
enum Disposition {
    /// Its completion: an output, or an error whose outcome is known.
    Complete,
    /// A failed attempt, then another attempt (`read` and `idempotent`
    /// calls only).
    Retry,
    /// A failed attempt of a write whose lease died: it may have happened.
    OutcomeUnknown,
}

/// Retries by effect class: a `read` or `idempotent` call is tried again
/// after a retryable guest failure or a deadline, up to
/// [`MAX_TOOL_ATTEMPTS`]; a write is tried once, and a write whose lease
/// died mid-call (anything but a typed error of its own, or a lease refused
/// before the guest ran) has an unknown outcome.
fn disposition(effect: EffectClass, attempt: u32, outcome: &InvocationOutcome) -> Disposition {
    let may_retry = effect != EffectClass::Write && attempt < MAX_TOOL_ATTEMPTS;
    match outcome {
        Ok(Ok(_)) => Disposition::Complete,
        Ok(Err(wit::ToolError::Failed(f))) if f.retryable && may_retry => Disposition::Retry,
        Ok(Err(_)) => Disposition::Complete,
        Err(lease) => match lease.failure {
            LeaseFailure::Refused { .. } => Disposition::Complete,
            _ if effect == EffectClass::Write => Disposition::OutcomeUnknown,
            LeaseFailure::Timeout { .. } if may_retry => Disposition::Retry,
            _ => Disposition::Complete,
        },
    }
}

/// What one [`Runtime::step`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Something was recorded; there may be more to do.
    Progressed,
    /// Nothing to do: the run is terminal or waits for a human.
    Idle(Idle),
}

/// The updates of one run, as a stream. Dropping it unsubscribes.
pub struct RunUpdates {
    receiver: broadcast::Receiver<RunUpdate>,
    runtime: std::sync::Weak<Inner>,
    run_id: RunId,
}

impl std::fmt::Debug for RunUpdates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunUpdates")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl Drop for RunUpdates {
    fn drop(&mut self) {
        // The last subscriber of a run nobody drives here takes the run's
        // channel with it.
        if let Some(inner) = self.runtime.upgrade() {
            let mut live = inner.live.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(l) = live.get(&self.run_id)
                && l.driver.is_none()
                && l.updates.receiver_count() <= 1
            {
                live.remove(&self.run_id);
            }
        }
    }
}

impl RunUpdates {
    /// The next update, or `None` once the runtime is gone.
    pub async fn next(&mut self) -> Option<RunUpdate> {
        match self.receiver.recv().await {
            Ok(update) => Some(update),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(RunUpdate::Lagged { missed }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_sandbox::{Sandbox, SandboxConfig};
    use warden_store::MemoryStore;

    fn runtime() -> Runtime {
        let sandbox = Sandbox::new(SandboxConfig {
            max_concurrent_leases: 1,
            ..SandboxConfig::default()
        })
        .unwrap();
        Runtime::new(Arc::new(MemoryStore::new()), PluginHost::new(sandbox))
    }

    #[test]
    fn a_dropped_subscription_leaves_nothing_behind() {
        let rt = runtime();
        let run = RunId::new("r").unwrap();
        let first = rt.subscribe(&run);
        let second = rt.subscribe(&run);
        assert_eq!(rt.lock_live().len(), 1);
        drop(first);
        assert_eq!(rt.lock_live().len(), 1, "one subscriber is still there");
        drop(second);
        assert!(rt.lock_live().is_empty());
    }

    #[test]
    fn the_builders_keep_what_was_set_before() {
        let rt = runtime()
            .with_record_prompts(true)
            .with_labels(BTreeMap::from([("team".into(), "ops".into())]))
            .with_hooks(Arc::new(FixedClock(5)), Arc::new(FixedRandom(9)));
        assert!(rt.inner.record_prompts);
        assert_eq!(rt.inner.labels["team"], "ops");
        assert_eq!(rt.inner.clock.now_ms(), 5);
        assert_eq!(rt.inner.random.next_u64(), 9);
    }
}
