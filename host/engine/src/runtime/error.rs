//! [`RuntimeError`]: why a verb could not be carried out, one variant per
//! refusal, each naming what was wrong and what to do next (its stable
//! code is `codes.rs`'s), and how a store's and a plugin's errors become
//! one.

use std::path::PathBuf;

use serde_json::Value;

use super::{ChildRefusal, ForkRefusal};
use crate::budget::InputTooLarge;
use crate::events::{EventError, Unrecordable, UnresolvedWrite};
use crate::ids::{CallDigest, CallId, RunId, SessionId};
use crate::replay::ReplayError;
use crate::state::{FoldError, ResumeError};
use crate::status::RunStatus;
use crate::view::AgentView;
use warden_plugins::PluginError;
use warden_providers::ProviderError;
use warden_store::{Holder, StoreError};

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
    /// A fork that cannot be made ([`Runtime::fork`](super::Runtime::fork)).
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
        error: crate::agent::LabelError,
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
    /// ([`Runtime::with_policy`](super::Runtime::with_policy)); nothing was written.
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

pub(super) fn plugin_error(view: &AgentView, e: PluginError) -> RuntimeError {
    RuntimeError::Agent {
        agent: view.name.clone(),
        message: e.to_string(),
    }
}
