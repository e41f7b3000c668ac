//! Driving a run: the step loop (`drive_log`, `step_once`). Each step
//! writes what the log holds first when it must (see "Durability" in
//! `runtime.rs`), asks [`decide`](crate::decide()) for the next action and
//! carries it out: one recorded event, a delivery, a policy to consult, an
//! approval to request, context to resolve, a cancellation. Model and tool
//! calls are `calls.rs`'s, batches `batch.rs`'s, child runs
//! `children.rs`'s.

use std::time::Duration;

use super::Runtime;
use super::agents::Prepared;
use super::calls::{fenced, for_run};
use super::error::{RuntimeError, plugin_error};
use super::live::DriverHandle;
use super::log::{Log, still_valid};
use crate::channels::{Delivery, outcome_error, settle};
use crate::decide::{
    Action, ApprovalRequest, ContextResolution, Idle, RequestDetail, decide_with, input_gate,
};
use crate::events::{
    ClockObserved, ContextError, ContextFailed, ContextItem, ContextResolved, DeliveryError,
    DeliveryFailed, Event, RunCancelled, UnresolvedWrite, WaitEnded,
};
use crate::policy_hooks::{PolicyConsult, PolicyVerdict, consult as consult_policy};
use crate::policy_plugin::consult_plugin as consult_policy_plugin;
use crate::state::next_delivery;
use crate::status::RunStatus;
use crate::view::AgentView;
use warden_sandbox::{LeaseFailure, wit};

impl Runtime {
    pub(super) async fn drive_log(
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
    pub(super) async fn flushed<T>(
        &self,
        log: &mut Log,
        result: Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let flushed = self.flush(log).await;
        let value = result?;
        flushed.map(|()| value)
    }

    pub(super) async fn step_once(
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
            action if super::batch::runs_as_batch(log, prepared, &action) => {
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
                        digest: crate::context::digest(&items),
                        items,
                        receipt: leased.receipt,
                    })
                }
            },
        };
        self.append(log, vec![event]).await?;
        Ok(Step::Progressed)
    }

    pub(super) async fn record_cancel(
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
}

/// What [`decide`](crate::decide()) decides for the run in `log`, a model call's request
/// and hash taken from the log's [`PromptCache`] (the messages are lent to
/// the request when the call is made, [`Runtime::call_model`]), so a long
/// run's step does not rebuild and rehash the whole conversation.
pub(super) fn decide_next(log: &mut Log, view: &AgentView) -> Action {
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

/// What one [`Runtime::step`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Something was recorded; there may be more to do.
    Progressed,
    /// Nothing to do: the run is terminal or waits for a human.
    Idle(Idle),
}
