//! Live turns: a run started and driven for an application that watches it
//! as it happens. [`Runtime::start_turn`] returns a [`TurnHandle`], a
//! [`Stream`] of [`TurnEvent`]s (the model's text deltas as the provider
//! streams them, tool calls started and finished with their receipts,
//! approvals needed, and the end with its [`TurnOutcome`]), plus
//! [`TurnHandle::cancel`] and [`TurnHandle::finish`].
//!
//! Cancellation semantics:
//! - [`TurnHandle::cancel`] is [`Runtime::cancel`]: the driver's
//!   cancellation token interrupts the in-flight model stream (it is
//!   dropped, which closes an HTTP provider's connection) or the in-flight
//!   lease (the sandbox stops it), and the driver records `run_cancelled`
//!   (carrying a write interrupted mid-call as unresolved). Everything
//!   recorded before stays; a cancelled run ends its session's hold, and
//!   its partial messages never become session history.
//! - Dropping a handle whose turn is still being driven cancels it the
//!   same way, with the reason "the turn's handle was dropped". A turn that
//!   ended, or that parked for a human (approval, input, an external tool,
//!   a budget), is not cancelled by a drop: the run waits, as any parked
//!   run does, and [`Runtime::continue_turn`] watches it again once the
//!   human acted. A turn is over at its run's terminal event: deliveries to
//!   channels it still owes go on in the background (a drop does not stop
//!   them) and never change its outcome.
//!
//! The stream is fed from the run's subscription ([`Runtime::subscribe`]);
//! recorded events the feeder missed (a lagging subscription, or events
//! recorded after the driver stopped) are read back from the store, so no
//! recorded tool call or approval is skipped. Text deltas are not recorded
//! (the completion records the whole text) and can only be skipped by a
//! feeder that fell more than 256 updates behind.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::{FutureExt as _, Stream};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::agent::Agent;
use super::events::{Event, Preview, RunError, ToolCallResult};
use super::ids::{CallId, RunId, SessionId};
use super::runtime::{RunUpdate, RunUpdates, Runtime, RuntimeError};
use super::start::StartOptions;
use super::state::{RunState, Terminal};
use super::status::RunStatus;
use warden_plugins::grant::EffectClass;
use warden_sandbox::UsageReceipt;

/// The reason recorded when a handle is dropped while its turn runs.
pub const DROPPED_REASON: &str = "the turn's handle was dropped";

/// What a live turn reports, in order.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TurnEvent {
    /// Text the model streamed, as the provider delivered it (not yet
    /// recorded: the model call's completion records the whole text).
    TextDelta {
        /// The model call's step.
        step: u32,
        /// The text.
        text: String,
    },
    /// A tool call is about to run (its intent was recorded).
    ToolCallStarted {
        /// The call.
        call_id: CallId,
        /// The tool, as the model named it (`<plugin>__<tool>`).
        tool: String,
        /// The arguments, frozen.
        arguments: Value,
        /// The effect class it runs with.
        effect: EffectClass,
    },
    /// A tool call has its result (recorded): it ran (with the lease's
    /// receipt), or was refused, deduplicated, resolved by a human or
    /// reported by the application (no receipt).
    ToolCallFinished {
        /// The call.
        call_id: CallId,
        /// The tool, as the model named it.
        tool: String,
        /// Its output or typed error.
        result: ToolCallResult,
        /// What its lease used, when one ran here (boxed: a receipt is
        /// large, the other events small).
        receipt: Option<Box<UsageReceipt>>,
    },
    /// A tool call waits for a human's approval: the turn parks.
    ApprovalNeeded {
        /// The call.
        call_id: CallId,
        /// The tool, as the model named it.
        tool: String,
        /// The arguments the model gave.
        arguments: Value,
        /// The tool's preview of what the call would do, if its preflight
        /// succeeded.
        preview: Option<Preview>,
    },
    /// The turn is over: its run reached a terminal event, or its driving
    /// stopped where it waits for a human. The last event of the stream.
    /// Deliveries to channels the run still owes go on in the background
    /// and never change the outcome.
    Finished(TurnOutcome),
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TurnOutcome {
    /// The run completed with this output.
    Completed {
        /// The output.
        output: Value,
    },
    /// The run failed.
    Failed {
        /// Why.
        error: RunError,
    },
    /// The run was cancelled.
    Cancelled {
        /// Why, if a reason was given.
        reason: Option<String>,
    },
    /// A human abandoned the run.
    Abandoned {
        /// Why.
        reason: String,
    },
    /// The run waits for a human (approval, input, an external tool, a
    /// budget, a reconciliation); continue it with
    /// [`Runtime::continue_turn`] once they acted.
    Parked {
        /// What it waits for.
        status: RunStatus,
    },
}

impl TurnOutcome {
    /// The outcome a run's state shows, if its driving is over (terminal
    /// or parked).
    pub fn of(state: &RunState) -> Option<TurnOutcome> {
        Some(match &state.terminal {
            Some(Terminal::Completed(c)) => TurnOutcome::Completed {
                output: c.output.clone(),
            },
            Some(Terminal::Failed(f)) => TurnOutcome::Failed {
                error: f.error.clone(),
            },
            Some(Terminal::Cancelled(c)) => TurnOutcome::Cancelled {
                reason: c.reason.clone(),
            },
            Some(Terminal::Abandoned(a)) => TurnOutcome::Abandoned {
                reason: a.reason.clone(),
            },
            None if state.status().is_parked() => TurnOutcome::Parked {
                status: state.status(),
            },
            None => return None,
        })
    }
}

impl Runtime {
    /// Starts a run of `agent` on `input`, in session `session_id` when
    /// given (see [`StartOptions::session`]: a busy
    /// session is refused before anything is recorded), drives it in the
    /// background, and returns its live [`TurnHandle`]. Must be called
    /// within a Tokio runtime.
    pub async fn start_turn(
        &self,
        session_id: Option<&SessionId>,
        agent: &Agent,
        input: Value,
    ) -> Result<TurnHandle, RuntimeError> {
        let run_id = self.random_run_id();
        // Subscribed before the run exists, so nothing is missed.
        let updates = self.subscribe(&run_id);
        match session_id {
            Some(session_id) => {
                self.start(
                    agent,
                    input,
                    StartOptions::new()
                        .session(session_id.clone())
                        .id(run_id.clone()),
                )
                .await?
            }
            None => {
                self.start(agent, input, StartOptions::new().id(run_id.clone()))
                    .await?
            }
        };
        Ok(TurnHandle::drive(
            self.clone(),
            run_id,
            agent.clone(),
            updates,
            Feeder::default(),
        ))
    }

    /// Drives run `run_id` again (after a human acted on a parked turn,
    /// say) and returns its live [`TurnHandle`]. A run that is over yields
    /// only [`TurnEvent::Finished`].
    pub async fn continue_turn(
        &self,
        run_id: &RunId,
        agent: &Agent,
    ) -> Result<TurnHandle, RuntimeError> {
        let updates = self.subscribe(run_id);
        // What is recorded already is not news; the model's calls so far
        // name the tools of approvals to come.
        let state = self.state(run_id).await?;
        let feeder = Feeder {
            last_seq: state.event_count as u64,
            ended: false,
            calls: state
                .turns
                .iter()
                .flat_map(|t| &t.calls)
                .map(|c| {
                    (
                        c.call_id.clone(),
                        (c.call.name.clone(), c.call.arguments.clone()),
                    )
                })
                .collect(),
        };
        Ok(TurnHandle::drive(
            self.clone(),
            run_id.clone(),
            agent.clone(),
            updates,
            feeder,
        ))
    }
}

/// A turn being driven in the background: a [`Stream`] of
/// [`TurnEvent`]s ending with [`TurnEvent::Finished`]. Dropping it while
/// the turn is still driven cancels the turn (see the module docs).
pub struct TurnHandle {
    run_id: RunId,
    runtime: Runtime,
    events: mpsc::UnboundedReceiver<TurnEvent>,
    task: Option<JoinHandle<Result<TurnOutcome, RuntimeError>>>,
    /// Set once the driving ended (terminal, parked or failed).
    settled: Arc<AtomicBool>,
    tokio: tokio::runtime::Handle,
}

impl std::fmt::Debug for TurnHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnHandle")
            .field("run_id", &self.run_id)
            .field("settled", &self.settled.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl TurnHandle {
    fn drive(
        runtime: Runtime,
        run_id: RunId,
        agent: Agent,
        updates: RunUpdates,
        feeder: Feeder,
    ) -> TurnHandle {
        let (sender, events) = mpsc::unbounded_channel();
        let settled = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(feed(
            runtime.clone(),
            run_id.clone(),
            agent,
            updates,
            feeder,
            sender,
            Arc::clone(&settled),
        ));
        TurnHandle {
            run_id,
            runtime,
            events,
            task: Some(task),
            settled,
            tokio: tokio::runtime::Handle::current(),
        }
    }

    /// The turn's run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Cancels the turn: interrupts the model stream or tool lease in
    /// flight and records the cancellation (see [`Runtime::cancel`]). A turn
    /// that already ended is left as it is; [`finish`](Self::finish) says
    /// how it ended.
    pub async fn cancel(&self, reason: Option<String>) -> Result<(), RuntimeError> {
        match self.runtime.cancel(&self.run_id, None, reason).await {
            Ok(()) | Err(RuntimeError::AlreadyTerminal { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits for the turn's driving to end and returns how it ended.
    /// Events not yet taken from the stream are dropped.
    pub async fn finish(mut self) -> Result<TurnOutcome, RuntimeError> {
        let task = self.task.take().expect("the task is taken only here");
        let result = match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => unreachable!("the feeding task is never aborted"),
        };
        self.settled.store(true, Ordering::SeqCst);
        result
    }
}

impl Stream for TurnHandle {
    type Item = TurnEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TurnEvent>> {
        self.events.poll_recv(cx)
    }
}

impl Drop for TurnHandle {
    fn drop(&mut self) {
        if self.settled.load(Ordering::SeqCst) {
            return;
        }
        let (runtime, run_id) = (self.runtime.clone(), self.run_id.clone());
        tracing::info!(run_id = %run_id, "a live turn's handle was dropped: cancelling the turn");
        self.tokio.spawn(async move {
            match runtime
                .cancel(&run_id, None, Some(DROPPED_REASON.to_owned()))
                .await
            {
                Ok(()) | Err(RuntimeError::AlreadyTerminal { .. }) => {}
                Err(error) => {
                    tracing::warn!(run_id = %run_id, %error, "cancelling a dropped turn failed");
                }
            }
        });
    }
}

/// Drives the run and feeds its updates, as turn events, to the handle.
async fn feed(
    runtime: Runtime,
    run_id: RunId,
    agent: Agent,
    mut updates: RunUpdates,
    mut feeder: Feeder,
    sender: mpsc::UnboundedSender<TurnEvent>,
    settled: Arc<AtomicBool>,
) -> Result<TurnOutcome, RuntimeError> {
    let driving = {
        let (runtime, run_id) = (runtime.clone(), run_id.clone());
        tokio::spawn(async move { runtime.drive(&run_id, &agent).await })
    };
    tokio::pin!(driving);
    let join =
        |joined: Result<Result<RunStatus, RuntimeError>, tokio::task::JoinError>| match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => unreachable!("the driving task is never aborted"),
        };
    // `None`: the run reached its terminal event while the driver goes on
    // with deliveries to channels, which never change the outcome: the
    // turn is over, and the driver finishes them in the background.
    let driven = loop {
        tokio::select! {
            biased;
            update = updates.next() => match update {
                Some(update) => {
                    feeder.update(&runtime, &run_id, update, &sender).await;
                    if feeder.ended {
                        break None;
                    }
                }
                None => break Some(join((&mut driving).await)),
            },
            result = &mut driving => break Some(join(result)),
        }
    };
    if driven.is_some() {
        // Updates already queued, then whatever the store has beyond them.
        while let Some(Some(update)) = updates.next().now_or_never() {
            feeder.update(&runtime, &run_id, update, &sender).await;
        }
    }
    let caught_up = feeder.catch_up(&runtime, &run_id, &sender).await;
    settled.store(true, Ordering::SeqCst);
    caught_up?;
    // The log says how it ended. A drive that failed on a run that ended
    // anyway (cancelled between its load and its first append) ended.
    let state = runtime.state(&run_id).await?;
    let outcome = match (TurnOutcome::of(&state), driven) {
        (Some(outcome), _) => outcome,
        (None, Some(Err(error))) => return Err(error),
        (None, Some(Ok(status))) => {
            unreachable!("a drive ends terminal or parked, not {status}")
        }
        (None, None) => unreachable!("a terminal event was fed"),
    };
    let _ = sender.send(TurnEvent::Finished(outcome.clone()));
    Ok(outcome)
}

/// Turns recorded events into turn events, once each.
#[derive(Default)]
struct Feeder {
    /// The last recorded event fed.
    last_seq: u64,
    /// Whether a terminal event was fed.
    ended: bool,
    /// The model's tool calls, by call id: its name for the tool and the
    /// arguments.
    calls: HashMap<CallId, (String, Value)>,
}

impl Feeder {
    async fn update(
        &mut self,
        runtime: &Runtime,
        run_id: &RunId,
        update: RunUpdate,
        sender: &mpsc::UnboundedSender<TurnEvent>,
    ) {
        match update {
            RunUpdate::Event { seq, event } => self.event(seq, &event, sender),
            RunUpdate::TextDelta { step, text } => {
                let _ = sender.send(TurnEvent::TextDelta { step, text });
            }
            RunUpdate::Lagged { missed } => {
                tracing::debug!(run_id = %run_id, missed, "a live turn's feed lagged; reading the store");
                if let Err(error) = self.catch_up(runtime, run_id, sender).await {
                    tracing::warn!(run_id = %run_id, %error, "a live turn cannot read the events it missed");
                }
            }
        }
    }

    /// Feeds the recorded events after the last one fed.
    async fn catch_up(
        &mut self,
        runtime: &Runtime,
        run_id: &RunId,
        sender: &mpsc::UnboundedSender<TurnEvent>,
    ) -> Result<(), RuntimeError> {
        for stored in runtime.store().load_after(run_id, self.last_seq).await? {
            let event =
                super::events::decode(&stored.bytes).map_err(|error| RuntimeError::Log {
                    run_id: run_id.clone(),
                    seq: stored.seq,
                    error,
                })?;
            self.event(stored.seq, &event, sender);
        }
        Ok(())
    }

    fn event(&mut self, seq: u64, event: &Event, sender: &mpsc::UnboundedSender<TurnEvent>) {
        if seq <= self.last_seq {
            return;
        }
        self.last_seq = seq;
        self.ended |= event.kind().is_terminal();
        if let Some(turn_event) = self.map(event) {
            let _ = sender.send(turn_event);
        }
    }

    fn tool(&self, call_id: &CallId) -> String {
        self.calls
            .get(call_id)
            .map(|(name, _)| name.clone())
            .unwrap_or_default()
    }

    fn map(&mut self, event: &Event) -> Option<TurnEvent> {
        let finished = |call_id: &CallId, result: ToolCallResult, receipt| {
            Some(TurnEvent::ToolCallFinished {
                call_id: call_id.clone(),
                tool: self.tool(call_id),
                result,
                receipt,
            })
        };
        match event {
            Event::ModelCallCompleted(c) => {
                for (i, call) in c.tool_calls.iter().enumerate() {
                    self.calls.insert(
                        CallId::new(c.step, i + 1),
                        (call.name.clone(), call.arguments.clone()),
                    );
                }
                None
            }
            Event::ToolCallIntent(i) => Some(TurnEvent::ToolCallStarted {
                call_id: i.call_id.clone(),
                tool: i.tool.model_name(),
                arguments: i.arguments.clone(),
                effect: i.effect,
            }),
            Event::ToolCallCompleted(c) => finished(
                &c.call_id,
                c.result.clone(),
                Some(Box::new(c.receipt.clone())),
            ),
            Event::ToolCallRejected(r) => {
                finished(&r.call_id, ToolCallResult::Error(r.error.clone()), None)
            }
            Event::ToolCallDeduplicated(d) => finished(&d.call_id, d.result.clone(), None),
            Event::ToolCallResolved(r) => {
                finished(&r.call_id, ToolCallResult::Output(r.output.clone()), None)
            }
            Event::ExternalCallCompleted(e) => {
                finished(&e.call_id, ToolCallResult::Output(e.output.clone()), None)
            }
            Event::ApprovalRequested(a) => Some(TurnEvent::ApprovalNeeded {
                call_id: a.call_id.clone(),
                tool: a.tool.model_name(),
                arguments: self
                    .calls
                    .get(&a.call_id)
                    .map(|(_, arguments)| arguments.clone())
                    .unwrap_or(Value::Null),
                preview: a.preview.clone(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::events::{
        ApprovalRequested, ModelCallCompleted, ToolCallError, ToolCallIntent, ToolCallRejected,
        ToolRef,
    };
    use warden_providers::{StopReason, ToolCall, Usage};

    fn feed(feeder: &mut Feeder, seq: u64, event: Event) -> Vec<TurnEvent> {
        let (sender, mut receiver) = mpsc::unbounded_channel();
        feeder.event(seq, &event, &sender);
        drop(sender);
        let mut out = Vec::new();
        while let Ok(e) = receiver.try_recv() {
            out.push(e);
        }
        out
    }

    #[test]
    fn recorded_events_become_turn_events_once_each() {
        let mut feeder = Feeder::default();
        let model_turn = Event::ModelCallCompleted(ModelCallCompleted {
            step: 1,
            text: String::new(),
            tool_calls: vec![
                ToolCall {
                    id: "p1".into(),
                    name: "fs__write_file".into(),
                    arguments: json!({ "path": "a" }),
                },
                ToolCall {
                    id: "p2".into(),
                    name: "fs__nope".into(),
                    arguments: json!({}),
                },
            ],
            blocks: vec![],
            usage: Usage::default(),
            cost_nanos: None,
            pricing: None,
            stop_reason: StopReason::ToolUse,
            at_ms: None,
        });
        assert!(feed(&mut feeder, 2, model_turn).is_empty());
        let tool = ToolRef {
            plugin: "fs".into(),
            tool: "write_file".into(),
        };
        let approval = Event::ApprovalRequested(ApprovalRequested {
            call_id: CallId::new(1, 1),
            tool: tool.clone(),
            effect: None,
            preview: None,
            preflight_error: None,
            receipt: None,
            digest: None,
            at_ms: None,
        });
        let expected = TurnEvent::ApprovalNeeded {
            call_id: CallId::new(1, 1),
            tool: "fs__write_file".into(),
            arguments: json!({ "path": "a" }),
            preview: None,
        };
        assert_eq!(feed(&mut feeder, 3, approval.clone()), [expected]);
        // The same position again (a lagging feed read back) is not news.
        assert!(feed(&mut feeder, 3, approval).is_empty());
        let intent = Event::ToolCallIntent(ToolCallIntent {
            call_id: CallId::new(1, 1),
            tool,
            arguments: json!({ "path": "a" }),
            effect: EffectClass::Write,
            idempotency_key: "k".into(),
            keyed_by: None,
        });
        assert_eq!(
            feed(&mut feeder, 4, intent),
            [TurnEvent::ToolCallStarted {
                call_id: CallId::new(1, 1),
                tool: "fs__write_file".into(),
                arguments: json!({ "path": "a" }),
                effect: EffectClass::Write,
            }]
        );
        let error = ToolCallError::UnknownTool {
            name: "fs__nope".into(),
        };
        let rejected = Event::ToolCallRejected(ToolCallRejected {
            call_id: CallId::new(1, 2),
            error: error.clone(),
        });
        assert_eq!(
            feed(&mut feeder, 5, rejected),
            [TurnEvent::ToolCallFinished {
                call_id: CallId::new(1, 2),
                tool: "fs__nope".into(),
                result: ToolCallResult::Error(error),
                receipt: None,
            }]
        );
    }
}
