//! Parallel batches, the executor: the calls of one turn that may run side
//! by side (`batch.rs` decides which, `batch::launch`) run as
//! tasks, at most `max_parallel_calls` at once, while the driver records,
//! in the model's order, each call's intent before it starts and each
//! call's outcome once every call before it has its own. So the log is the
//! same whatever finishes first; a task that finished early waits for the
//! calls before it.
//!
//! What is durable before a call starts, and what a crash leaves:
//! - a read's intent rides with the next synced write (lost in a machine
//!   crash, the read is decided and made again); an idempotent call's
//!   intent is synced before it starts; a child run is created, then
//!   `child_started` is synced, before its drive starts.
//! - a crash in the middle of a batch leaves intents without outcomes.
//!   The next drive runs them again, side by side, from the log: each read,
//!   each idempotent call with its recorded key, each child found again by
//!   its derived id and driven on (never started twice). A write is never
//!   run again: one without an outcome parks the run (needs reconciliation)
//!   once every call before it has its outcome recorded.
//! - a driver that stops (an error, an outcome that stops the run) aborts
//!   its tool calls and waits for the children it drives to end, so when it
//!   returns nothing it started still writes; one dropped mid-batch (its
//!   future cancelled) can only abort them all. What they returned was not
//!   recorded, so it is made again as above.
//!
//! Fuel, charged when a lease ends, is shared out here: each lease started
//! beside others gets at most what the run's fuel budget has left after
//! the leases in flight and the children in flight reserved theirs, so a
//! batch never spends more than the budget had left when it started.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::agents::Prepared;
use super::calls::{ToolOutcome, ToolReturn};
use super::children::child_agent;
use super::driving::decide_next;
use super::live::DriverHandle;
use super::log::{Log, still_valid};
use super::{Runtime, RuntimeError, Step};
use crate::decide::{Action, ChildDrive, Idle, ToolInvocation};
use crate::events::ParentLink;
use crate::events::{ClockObserved, Event};
use crate::ids::{CallId, RunId};
use crate::state::{Parked, ToolCallProgress};
use crate::status::RunStatus;
use warden_plugins::grant::EffectClass;
use warden_sandbox::Leased;

/// A task that is aborted when dropped: a driver that stops leaves no
/// effect running behind it.
struct Task<T>(JoinHandle<T>);

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T: Send + 'static> Task<T> {
    fn spawn(future: impl Future<Output = T> + Send + 'static) -> Self {
        Task(tokio::spawn(future))
    }

    /// Waits until it has ended, whatever it returned.
    async fn finish(mut self) {
        let _ = (&mut self.0).await;
    }

    /// Its output; a panic in the task goes on in the driver.
    async fn output(mut self) -> T {
        match (&mut self.0).await {
            Ok(output) => output,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => unreachable!("a batch's task is aborted only when dropped: {error}"),
        }
    }
}

/// One call of the batch in flight.
enum Running {
    /// A plugin's (or MCP server's) tool call, and the fuel its lease may
    /// use at most (reserved from the run's fuel budget while it runs).
    Tool {
        invocation: ToolInvocation,
        fuel: u64,
        task: Task<Result<Leased<ToolReturn>, RuntimeError>>,
    },
    /// A child run being driven.
    Child {
        drive: ChildDrive,
        task: Task<Result<RunStatus, RuntimeError>>,
    },
}

impl Running {
    fn reserved_fuel(&self) -> u64 {
        match self {
            Running::Tool { fuel, .. } => *fuel,
            Running::Child { .. } => 0,
        }
    }
}

/// The fuel a lease started now may use.
enum FuelShare {
    /// The run has no fuel budget.
    Unbounded,
    /// What the budget has left after what the calls in flight reserved,
    /// at most the plugin's own limit.
    Share(u64),
    /// Nothing is left to share until a call in flight ends.
    Wait,
}

/// Whether `action` is one the executor runs: a call that may start
/// beside others, or calls left in flight (a crash, a child waiting) that
/// should run again side by side.
pub(super) fn runs_as_batch(log: &Log, prepared: &Prepared, action: &Action) -> bool {
    let parallel = prepared.view.parallel;
    if parallel.max_calls <= 1 {
        return false;
    }
    let several_in_flight = || log.state.started_calls().nth(1).is_some();
    match action {
        Action::CallTool(call) if call.recorded => several_in_flight(),
        Action::CallTool(call) => launches(log, call) && parallel.admits(&call.intent),
        Action::StartChild(_) => true,
        Action::DriveChild(_) => several_in_flight(),
        _ => false,
    }
}

/// Whether the executor starts `call`: a new call that may run beside
/// others, not waiting on an approval (an approved call starts alone,
/// after its rule is checked once more).
fn launches(log: &Log, call: &ToolInvocation) -> bool {
    !call.recorded
        && matches!(
            log.state.call(&call.intent.call_id).map(|c| &c.progress),
            Some(ToolCallProgress::Pending)
        )
}

impl Runtime {
    /// Runs the latest turn's calls side by side, as far as they may:
    /// first again those a crash (or a wait) left in flight, then each next
    /// call that may start beside them, up to the bound; records each
    /// outcome in the model's order. Returns once none is in flight.
    ///
    /// However it returns (an outcome that stops the run, an error), it
    /// returns only once no child it drives is still writing: tool calls
    /// left in flight are aborted (they append nothing), children are
    /// awaited, so a caller that drives the run again right away is not
    /// refused by its own leftover drive.
    pub(super) async fn run_batch(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
    ) -> Result<Step, RuntimeError> {
        let mut running: VecDeque<Running> = VecDeque::new();
        let result = self
            .run_batch_calls(log, prepared, driver, &mut running)
            .await;
        // Tool calls are aborted as they are dropped here, all before the
        // first child is awaited.
        let children: Vec<_> = running
            .into_iter()
            .filter_map(|left| match left {
                Running::Child { task, .. } => Some(task),
                Running::Tool { .. } => None,
            })
            .collect();
        for task in children {
            // Its outcome is not recorded: the next drive finds the child
            // by its id and drives it on.
            task.finish().await;
        }
        result
    }

    async fn run_batch_calls(
        &self,
        log: &mut Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        running: &mut VecDeque<Running>,
    ) -> Result<Step, RuntimeError> {
        let view = &prepared.view;
        let bound = view.parallel.max_calls as usize;
        // What is in flight and runs again: reads and idempotent calls from
        // their intents, children by their ids. A write in flight is never
        // made again; it and the calls after it wait.
        let left: Vec<_> = log.state.started_calls().cloned().collect();
        if !left.is_empty() {
            // What the log holds is written before those effects start.
            self.flush(log).await?;
        }
        for call in left {
            match call.progress {
                ToolCallProgress::InFlight(intent) if intent.effect != EffectClass::Write => {
                    let invocation = ToolInvocation {
                        intent,
                        attempt: call.failed_attempts + 1,
                        recorded: true,
                    };
                    let Some(next) =
                        self.start_tool(log, prepared, driver, running, invocation, None)
                    else {
                        break;
                    };
                    running.push_back(next);
                }
                ToolCallProgress::Child { child_run, .. } => {
                    running.push_back(self.start_drive(log, prepared, call.call_id, child_run)?);
                }
                _ => break,
            }
        }
        loop {
            // Start what may start beside what runs.
            while running.len() < bound && !driver.cancel.is_cancelled() {
                match decide_next(log, view) {
                    Action::ObserveClock if !running.is_empty() => {
                        let at_ms = self.inner.clock.now_ms();
                        self.append(log, vec![Event::ClockObserved(ClockObserved { at_ms })])
                            .await?;
                    }
                    Action::CallTool(call)
                        if launches(log, &call) && view.parallel.admits(&call.intent) =>
                    {
                        if matches!(
                            self.fuel_share(log, prepared, running, &call),
                            FuelShare::Wait
                        ) {
                            break;
                        }
                        // Write-ahead: the intent before the effect (a
                        // read's rides with the next synced write).
                        if call.intent.effect == EffectClass::Read {
                            self.append_deferred(log, vec![call.intent()]).await?;
                        } else {
                            self.append(log, vec![call.intent()]).await?;
                        }
                        still_valid(log)?;
                        let recorded = ToolInvocation {
                            recorded: true,
                            ..call
                        };
                        let next = self
                            .start_tool(log, prepared, driver, running, recorded, None)
                            .expect("the share was there before the intent");
                        running.push_back(next);
                    }
                    Action::StartChild(start) => {
                        let (call_id, child_run) = (start.call_id.clone(), start.child_run.clone());
                        // Created, then `child_started` synced: only then
                        // is it driven.
                        self.start_child(log, prepared, start).await?;
                        running.push_back(self.start_drive(log, prepared, call_id, child_run)?);
                    }
                    _ => break,
                }
            }
            // The first call in flight, in the model's order, has its
            // outcome recorded next; the others go on meanwhile.
            let Some(first) = running.pop_front() else {
                break;
            };
            // A write's completion held is on disk before the run waits on
            // another call (a read's may wait: lost, the read is made again).
            if log.held.synced {
                self.flush(log).await?;
            }
            match first {
                Running::Tool {
                    invocation, task, ..
                } => {
                    let leased = task.output().await?;
                    match self
                        .record_tool_outcome(log, driver, &invocation, leased)
                        .await?
                    {
                        ToolOutcome::Recorded => {}
                        ToolOutcome::Stopped(step) => return Ok(step),
                        ToolOutcome::Retry(delay) => {
                            let again = ToolInvocation {
                                attempt: invocation.attempt + 1,
                                ..invocation
                            };
                            // Its share was freed with its lease: taken
                            // again, as a new lease's. Without one the
                            // next attempt waits until the others end.
                            // (Dropping the others, unrecorded, makes them
                            // again on the next drive, as after a crash.)
                            match self.start_tool(
                                log,
                                prepared,
                                driver,
                                running,
                                again,
                                Some(delay),
                            ) {
                                Some(next) => running.push_front(next),
                                None => return Ok(Step::Progressed),
                            }
                        }
                    }
                }
                Running::Child { drive, task } => {
                    let status = task.output().await?;
                    self.record_child(log, drive, status).await?;
                }
            }
        }
        // Nothing in flight. A child found waiting first in the turn parks
        // the run at its call, as one drive of it would.
        if let Some(Parked::Child {
            call_id,
            child_run,
            status,
        }) = log.state.parked()
        {
            return Ok(Step::Idle(Idle::AwaitingChild {
                call_id: call_id.clone(),
                child_run: child_run.clone(),
                status,
            }));
        }
        Ok(Step::Progressed)
    }

    /// Starts an attempt at the tool call `invocation` (its intent
    /// recorded) as a task, after `delay` if given, with its share of the
    /// fuel budget; `None` when no share is left now.
    fn start_tool(
        &self,
        log: &Log,
        prepared: &Prepared,
        driver: &DriverHandle,
        running: &VecDeque<Running>,
        invocation: ToolInvocation,
        delay: Option<Duration>,
    ) -> Option<Running> {
        let (share, fuel) = match self.fuel_share(log, prepared, running, &invocation) {
            FuelShare::Wait => return None,
            FuelShare::Unbounded => (None, 0),
            FuelShare::Share(n) => (Some(n), n),
        };
        let lease = self.tool_lease(log, prepared, driver, &invocation, share);
        let cancel = driver.cancel.clone();
        let task = Task::spawn(async move {
            if let Some(delay) = delay {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(delay) => {}
                }
            }
            lease.await
        });
        Some(Running::Tool {
            invocation,
            fuel,
            task,
        })
    }

    /// Starts driving the child `child_run` of the call `call_id` as a
    /// task.
    fn start_drive(
        &self,
        log: &Log,
        prepared: &Prepared,
        call_id: CallId,
        child_run: RunId,
    ) -> Result<Running, RuntimeError> {
        let agent = child_agent(log, prepared, &call_id)?;
        let link = ParentLink {
            run_id: log.run_id.clone(),
            call_id: call_id.clone(),
        };
        let task = Task::spawn(self.child_drive(link, child_run.clone(), agent, log.claimed()));
        Ok(Running::Child {
            drive: ChildDrive { call_id, child_run },
            task,
        })
    }

    /// The fuel a lease of `invocation` may use if started now beside
    /// `running` (see [`FuelShare`]).
    fn fuel_share(
        &self,
        log: &Log,
        prepared: &Prepared,
        running: &VecDeque<Running>,
        invocation: &ToolInvocation,
    ) -> FuelShare {
        let limits = log.state.effective_limits(&prepared.view.budgets);
        let Some(max) = limits.fuel else {
            return FuelShare::Unbounded;
        };
        // An MCP server's tool uses no fuel.
        let Some(plugin) = prepared.plugins.get(&invocation.intent.tool.plugin) else {
            return FuelShare::Share(0);
        };
        let reserved: u64 = running.iter().map(Running::reserved_fuel).sum();
        let left = max
            .saturating_sub(log.state.committed_usage().fuel)
            .saturating_sub(reserved);
        // Alone, a lease gets what is left, even nothing (it then runs out
        // of fuel, as any lease would).
        if left == 0 && !running.is_empty() {
            return FuelShare::Wait;
        }
        FuelShare::Share(
            plugin
                .granted()
                .limits()
                .fuel
                .map_or(left, |own| own.min(left)),
        )
    }
}
