//! The verbs on runs: starting one (`start`, `submit`, each with its
//! [`StartOptions`]), `step`, `drive`, `recover`, `resume`, a human's
//! answers (`approve`, `deny`, `complete_external`, `finish_with`,
//! `resolve`, `require_reconciliation`, `abandon`, `cancel`) and the reads
//! (`tools`, `sessions`, `session_runs`, `owed_delivery`, `state`,
//! `events`, `verify`). Each loads the run's log (`log.rs`), checks it and
//! appends what it records; driving is `driving.rs`'s.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::Runtime;
use super::driving::Step;
use super::error::RuntimeError;
use super::live::Cancellation;
use super::log::{Held, Log, recordable, refuse_unfinished_fork, verify_log};
use super::session::{SessionRun, SessionSummary};
use crate::agent::Agent;
use crate::budget::check_input_size;
use crate::events::{
    ApprovalDenied, ApprovalGranted, DeliveryIntent, Event, ExternalCallCompleted, Reconciled,
    ReconciliationRequired, RunAbandoned, RunCancelled, RunStarted, ToolCallResolved,
    ToolCallResult, UnresolvedWrite,
};
use crate::ids::{CallId, RunId, SessionId};
use crate::prompt::PromptCache;
use crate::replay::{ReplayOptions, replay};
use crate::start::StartOptions;
use crate::state::{Parked, RunState, next_delivery};
use crate::status::RunStatus;
use warden_sandbox::ValidUntil;
use warden_store::{
    Claim, Holder, ListingStatus, RunMeta, Settle, Settlement, StoreError, VerifyReport,
};

impl Runtime {
    /// The tools a run of `agent` offers its model and accepts from it, by
    /// the names the model calls them, with their effective effect classes
    /// and approval rules: the agent's plugins loaded under their grants,
    /// as a run would (`warden mcp serve` lists these).
    pub async fn tools(&self, agent: &Agent) -> Result<Vec<crate::view::AgentTool>, RuntimeError> {
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
        super::session::runs(&*self.inner.store, session_id).await
    }

    /// Every session the store's runs belong to, by name, with whether it
    /// is busy.
    pub async fn sessions(&self) -> Result<Vec<SessionSummary>, RuntimeError> {
        super::session::summaries(&*self.inner.store).await
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
        crate::agent::validate_labels(&all)
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
                    let (opening, held) = super::session::read(&*self.inner.store, id).await?;
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
    pub(super) async fn recover_with(
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
        crate::schema::check(&request.output_schema, &output).map_err(|e| {
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
        if let crate::state::ModelCallProgress::InFlight { step, .. } = state.model_call {
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
            crate::output::check_output(schema, &output).map_err(|violation| {
                RuntimeError::FinishRejected {
                    run_id: run_id.clone(),
                    violation,
                }
            })?;
        }
        let event = Event::RunCompleted(crate::events::RunCompleted {
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
        let inherited = super::fork::inherited_in_flight(&log.events, &log.state, &write.call_id);
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
}

/// How many times a start in a session reads the session again after the
/// store found it changed since it was read.
const SESSION_READ_ATTEMPTS: u32 = 5;
