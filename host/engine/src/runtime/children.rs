//! Child runs: a call to another agent (`[agents.<name>]`, see
//! `child_agents.rs`) is an effect of its parent, carried out as a run of
//! its own in the same store.
//!
//! - Starting ([`Action::StartChild`](crate::decide::Action::StartChild)):
//!   the child is created first (its `run_started` names the parent and the
//!   call, its limits are the budgets carved from the parent's), then the
//!   parent records `child_started`. The child's id is derived from the
//!   parent's run id and the call id, not drawn at random and recorded as
//!   an intent: a crash between the two writes leaves a child the retry
//!   finds under the same id (the store refuses to create it twice, and its
//!   `run_started` must name this parent and call), so no crash can start
//!   a second child, and no extra event is needed before the child exists.
//! - Driving ([`Action::DriveChild`](crate::decide::Action::DriveChild)):
//!   the child is recovered (replayed against its agent, then driven) under
//!   the engine's rules, so a write it made is never made again, and under
//!   its parent driver's claim (a worker's): each of its appends is fenced
//!   by that claim and each of its leases bounded by the driver's view of
//!   it, as the parent's are (issue 36); when it
//!   ends, the parent records `child_finished` (its output or how it
//!   ended, and what it used, which is charged to the parent); when it
//!   waits, the parent records `child_parked` once per status it finds and
//!   waits too (`awaiting_child`). Driving the parent again drives the
//!   child, so an approval given to the child is followed by a drive of the
//!   parent, which continues both.
//! - Cancelling ([`Runtime::cancel`]) a parent cancels its child in flight
//!   first (and the child's, down the tree).

use std::future::Future;
use std::pin::Pin;

use warden_sandbox::ValidUntil;
use warden_store::{Claim, ListingStatus, RunMeta, StoreError};

use super::agents::Prepared;
use super::log::{Log, recordable, still_valid};
use super::{Runtime, RuntimeError, Step};
use crate::agent::Agent;
use crate::budget::RecordedLimits;
use crate::decide::{ChildDrive, Idle};
use crate::events::{ChildFinished, ChildParked, ChildStarted, ParentLink};
use crate::events::{Event, RunStarted, ToolCallError, ToolCallResult};
use crate::ids::{CallId, RunId};
use crate::replay::ReplayOptions;
use crate::state::{RunState, Terminal, ToolCallProgress};
use crate::status::RunStatus;
use crate::view::ToolTarget;

/// Why a child run cannot be started or driven; nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChildRefusal {
    /// The run the call's child id names is not this call's child: a run
    /// of that id was there already, or this run is a fork that
    /// inherited its source's child in flight (the source drives it; the
    /// fork cannot know what it did until it ends, so abandon the fork or
    /// fork again before the call).
    #[error("run `{child_run}` is not the child of this call{}", .parent.as_ref().map(|p| format!(" (it is run `{p}`'s)")).unwrap_or_default())]
    NotThisCall {
        /// The run.
        child_run: RunId,
        /// The parent it names, if any.
        parent: Option<RunId>,
    },
    /// The call's tool is no longer an agent of the parent's agent.
    #[error("`{tool}` is no longer an agent this agent calls")]
    NotAnAgent {
        /// The tool the model called.
        tool: String,
    },
}

/// How many runs up and down a tree [`Runtime::refuse_driven`] looks:
/// far more than agents nest, and a bound on a log that names a cycle.
const MAX_TREE_DEPTH: usize = 64;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Runtime {
    /// Creates the child run (or finds the one a crash left), then records
    /// `child_started` in the parent.
    pub(super) async fn start_child(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        start: ChildStarted,
    ) -> Result<Step, RuntimeError> {
        let agent = child_agent(log, prepared, &start.call_id)?;
        // The child's plugins are loaded before anything is written.
        let child = self.prepare(&agent).await?;
        let link = ParentLink {
            run_id: log.run_id.clone(),
            call_id: start.call_id.clone(),
        };
        let now = self.inner.clock.now_ms();
        let mut labels = self.inner.labels.clone();
        labels.extend(agent.labels.clone());
        let started = Event::RunStarted(RunStarted {
            run_id: start.child_run.clone(),
            agent: agent.name.clone(),
            agent_digest: agent.digest.clone(),
            input: start.input.clone(),
            labels: labels.clone(),
            clock_seed_ms: now,
            random_seed: self.inner.random.next_u64(),
            agent_file: agent
                .path
                .to_str()
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
            session: None,
            limits: Some(RecordedLimits {
                budgets: start.budgets,
                ..agent.recorded_limits(&self.inner.ceilings)
            }),
            parent: Some(link.clone()),
            mcp_tools: child.view.mcp_tools.clone(),
        });
        let meta = RunMeta {
            agent: agent.name.clone(),
            labels,
            session: None,
            session_runs: None,
            history: Vec::new(),
            history_head: None,
            created_ms: now as i64,
        };
        // Listed as running but never queued nor claimed: no worker takes
        // a child; its parent's driver does, under the parent's claim. A
        // driver past that claim creates nothing.
        still_valid(log)?;
        let created = self
            .inner
            .store
            .create(
                &start.child_run,
                meta,
                recordable(&start.child_run, &started)?,
                ListingStatus::RUNNING,
            )
            .await;
        match created {
            Ok(_) => self.publish(&start.child_run, 1, started),
            // A start a crash cut short: the child is there already.
            Err(StoreError::AlreadyExists { .. }) => {
                self.check_parent(&start.child_run, &link).await?;
            }
            Err(error) => return Err(error.into()),
        }
        self.append(log, vec![Event::ChildStarted(start)]).await?;
        Ok(Step::Progressed)
    }

    /// Drives the child of the call in flight, then records how it ended,
    /// or that it waits.
    pub(super) async fn drive_child(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        drive: ChildDrive,
    ) -> Result<Step, RuntimeError> {
        let agent = child_agent(log, prepared, &drive.call_id)?;
        // Only this call's own child is driven: a fork that inherited a
        // child in flight names its source's child, which the source
        // drives (see `ChildRefusal::NotThisCall`).
        let link = ParentLink {
            run_id: log.run_id.clone(),
            call_id: drive.call_id.clone(),
        };
        let status = self
            .child_drive(link, drive.child_run.clone(), agent, log.claimed())
            .await?;
        self.record_child(log, drive, status).await
    }

    /// The child `child_run` of the call `link` names, driven until it
    /// ends or waits: its status then. Owns what it needs, so it can run as
    /// a task of its own (`runtime/batch.rs`).
    ///
    /// `claimed` is the parent driver's claim and its view of it: the
    /// child is driven under them (every append fenced by the parent's
    /// claim, every lease bounded by its validity), so a worker paused past
    /// its claim makes no further effect in a child either, and an operator
    /// reconciling the child is refused while the claim is live.
    pub(super) fn child_drive(
        &self,
        link: ParentLink,
        child_run: RunId,
        agent: Agent,
        claimed: Option<(Claim, ValidUntil)>,
    ) -> Boxed<'static, Result<RunStatus, RuntimeError>> {
        let runtime = self.clone();
        Box::pin(async move {
            runtime.check_parent(&child_run, &link).await?;
            match runtime.recover_child(&child_run, &agent, claimed).await {
                Ok(status) => Ok(status),
                // A write of the child's with no recorded outcome: the child
                // needs a human, and the parent waits for it.
                Err(
                    RuntimeError::NeedsReconciliation { run_id, .. }
                    | RuntimeError::ReconciliationRequired { run_id, .. },
                ) if run_id == child_run => Ok(RunStatus::NeedsReconciliation),
                Err(error) => Err(error),
            }
        })
    }

    /// Records how the child of `drive` ended (`child_finished`), or that
    /// it waits with `status` (`child_parked`, unless already recorded).
    pub(super) async fn record_child(
        &self,
        log: &mut Log,
        drive: ChildDrive,
        status: RunStatus,
    ) -> Result<Step, RuntimeError> {
        if status.is_terminal() {
            let state = self.state(&drive.child_run).await?;
            let result = match &state.terminal {
                Some(Terminal::Completed(c)) => ToolCallResult::Output(c.output.clone()),
                other => ToolCallResult::Error(ToolCallError::ChildEnded {
                    child_run: drive.child_run.clone(),
                    status: status.as_str().to_owned(),
                    message: match other {
                        Some(Terminal::Failed(f)) => f.error.to_string(),
                        Some(Terminal::Cancelled(_)) => "it was cancelled".into(),
                        Some(Terminal::Abandoned(a)) => match &a.by {
                            Some(by) => format!("it was abandoned by {by}"),
                            None => "it was abandoned".into(),
                        },
                        _ => String::new(),
                    },
                }),
            };
            let finished = Event::ChildFinished(ChildFinished {
                call_id: drive.call_id,
                child_run: drive.child_run,
                status,
                result,
                usage: state.usage,
            });
            self.append(log, vec![finished]).await?;
            return Ok(Step::Progressed);
        }
        let recorded = match log.state.call(&drive.call_id).map(|c| &c.progress) {
            Some(ToolCallProgress::Child { parked, .. }) => *parked,
            _ => None,
        };
        if recorded != Some(status) {
            let parked = Event::ChildParked(ChildParked {
                call_id: drive.call_id.clone(),
                child_run: drive.child_run.clone(),
                status,
            });
            self.append(log, vec![parked]).await?;
        }
        Ok(Step::Idle(Idle::AwaitingChild {
            call_id: drive.call_id,
            child_run: drive.child_run,
            status,
        }))
    }

    /// Cancels the child run of `run_id`'s call in flight, if it has one
    /// of its own that has not ended (a child a fork inherited is its
    /// source's, and left alone).
    pub(super) fn cancel_child<'a>(
        &'a self,
        run_id: &'a RunId,
        by: Option<&'a str>,
        reason: Option<String>,
    ) -> Boxed<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let state = self.state(run_id).await?;
            if state.terminal.is_some() {
                return Ok(());
            }
            // Every child in flight: a parallel batch may run several.
            for (call_id, child_run) in state.children_in_flight() {
                let link = ParentLink {
                    run_id: run_id.clone(),
                    call_id: call_id.clone(),
                };
                if self.check_parent(child_run, &link).await.is_err() {
                    continue;
                }
                match self.cancel(child_run, by, reason.clone()).await {
                    Ok(()) | Err(RuntimeError::AlreadyTerminal { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(())
        })
    }

    /// The parent and call `run_id`'s `run_started` names, if it is a
    /// child.
    async fn parent_link(&self, run_id: &RunId) -> Result<Option<ParentLink>, RuntimeError> {
        let first = self.inner.store.load(run_id).await?;
        Ok(first
            .first()
            .and_then(|s| crate::events::decode(&s.bytes).ok())
            .and_then(|e| match e {
                Event::RunStarted(s) => s.parent,
                _ => None,
            }))
    }

    /// Refuses with [`RuntimeError::DrivenByWorker`] while a worker holds a
    /// live claim covering the run `log` holds (see
    /// [`driving_claim`](Self::driving_claim)).
    pub(super) async fn refuse_driven(&self, log: &Log) -> Result<(), RuntimeError> {
        match self
            .claim_over(&log.run_id, &log.events, &log.state)
            .await?
        {
            Some(claim) => Err(RuntimeError::DrivenByWorker {
                run_id: log.run_id.clone(),
                claimed_run: claim.run_id,
                owner: claim.owner,
                expires_ms: claim.expires_ms,
            }),
            None => Ok(()),
        }
    }

    /// The live claim of a worker covering `run_id`, if any: its own, that
    /// of a run above it (a child is driven under the claim of the run at
    /// the top of its tree), or that of a child of it in flight. While
    /// there is one, what a reconciliation verb would settle, or a driver
    /// without a claim would start again, may be in progress under it, so
    /// `resolve` and every driver without a claim refuse the run (issue
    /// 36). Expiry is judged by this runtime's clock, as a worker's claims
    /// are timed.
    pub async fn driving_claim(&self, run_id: &RunId) -> Result<Option<Claim>, RuntimeError> {
        let log = self.load_log(run_id).await?;
        self.claim_over(run_id, &log.events, &log.state).await
    }

    /// [`driving_claim`](Self::driving_claim) of the run whose log holds
    /// `events`, folded to `state` (not loaded again).
    async fn claim_over(
        &self,
        run_id: &RunId,
        events: &[Event],
        state: &RunState,
    ) -> Result<Option<Claim>, RuntimeError> {
        let now = self.inner.clock.now_ms() as i64;
        let store = &self.inner.store;
        let live = |claim: Option<Claim>| claim.filter(|c| !c.is_expired(now));
        if let Some(claim) = live(store.summary(run_id).await?.claim) {
            return Ok(Some(claim));
        }
        // Up the tree (bounded: a tree is as deep as its agents nest).
        let mut parent = match events.first() {
            Some(Event::RunStarted(started)) => started.parent.clone(),
            _ => None,
        };
        for _ in 0..MAX_TREE_DEPTH {
            let Some(link) = parent else { break };
            if let Some(claim) = live(store.summary(&link.run_id).await?.claim) {
                return Ok(Some(claim));
            }
            parent = self.parent_link(&link.run_id).await?;
        }
        // Down to the children in flight, and theirs.
        let mut seen: Vec<RunId> = Vec::new();
        let mut pending: Vec<RunId> = state
            .children_in_flight()
            .map(|(_, child)| child.clone())
            .collect();
        while let Some(child) = pending.pop() {
            if seen.contains(&child) || seen.len() >= MAX_TREE_DEPTH * 8 {
                continue;
            }
            // A child a crash left uncreated, or pruned: nothing holds it.
            let Ok(summary) = store.summary(&child).await else {
                continue;
            };
            if let Some(claim) = live(summary.claim) {
                return Ok(Some(claim));
            }
            if let Ok(below) = self.state(&child).await {
                pending.extend(below.children_in_flight().map(|(_, c)| c.clone()));
            }
            seen.push(child);
        }
        Ok(None)
    }

    /// Refuses `child_run` unless its `run_started` names `link`.
    async fn check_parent(&self, child_run: &RunId, link: &ParentLink) -> Result<(), RuntimeError> {
        let named = self.parent_link(child_run).await?;
        if named.as_ref() == Some(link) {
            return Ok(());
        }
        Err(RuntimeError::ChildRefused {
            run_id: link.run_id.clone(),
            reason: ChildRefusal::NotThisCall {
                child_run: child_run.clone(),
                parent: named.map(|p| p.run_id),
            },
        })
    }

    /// [`Runtime::recover`] of a child, boxed: a child's drive may start
    /// and drive children of its own.
    fn recover_child<'a>(
        &'a self,
        child_run: &'a RunId,
        agent: &'a Agent,
        claimed: Option<(Claim, ValidUntil)>,
    ) -> Boxed<'a, Result<RunStatus, RuntimeError>> {
        // Under the parent's claim, or under none, checked for the whole
        // tree when the parent's drive began.
        Box::pin(self.recover_with(child_run, agent, ReplayOptions::default(), claimed, false))
    }
}

/// The agent the call `call_id` of the run calls.
pub(super) fn child_agent(
    log: &Log,
    prepared: &Prepared,
    call_id: &CallId,
) -> Result<Agent, RuntimeError> {
    let name = log
        .state
        .call(call_id)
        .map(|c| c.call.name.clone())
        .unwrap_or_default();
    match prepared.view.tool(&name).map(|t| &t.target) {
        Some(ToolTarget::Agent { agent, .. }) => Ok(Agent::clone(agent)),
        _ => Err(RuntimeError::ChildRefused {
            run_id: log.run_id.clone(),
            reason: ChildRefusal::NotAnAgent { tool: name },
        }),
    }
}
