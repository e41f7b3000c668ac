//! Model and tool calls as the driver makes them: the intent appended, the
//! effect made, the completion appended. A model's response is streamed
//! and assembled (a compaction is a model call too); a tool's lease runs
//! within what is left of the run's budgets and stops with the driver's
//! claim (an MCP server's call is made the same way); a failed attempt is
//! tried again by effect class (`disposition`), and a keyed call claims its
//! commitment first (`claim`).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::Runtime;
use super::agents::Prepared;
use super::driving::Step;
use super::error::RuntimeError;
use super::live::{DriverHandle, RunUpdate};
use super::log::{Log, still_valid};
use crate::decide::{CompactionCall, MAX_TOOL_ATTEMPTS, ModelCall, ToolInvocation};
use crate::events::{Event, InvocationOutcome, ToolCallResult};
use crate::ids::{CallId, RunId};
use crate::state::ModelCallProgress;
use warden_plugins::LoadedPlugin;
use warden_plugins::grant::EffectClass;
use warden_providers::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ProviderEvent, ResponseAssembler,
};
use warden_sandbox::{LeaseFailure, Leased, RunBound, wit};
use warden_store::{
    Durability, Holder, KeyClaim, SETTLED_STATUSES, Settle, Settlement, StoreError,
};

impl Runtime {
    pub(super) async fn call_model(
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

    pub(super) async fn call_tool(
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
    pub(super) fn tool_lease(
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
            // process instead of a WASM lease, within the run's budgets and
            // held to the same view of the claim as a lease ([`fenced`]).
            Some(server) => Err((server.clone(), bound.wall_time, log.valid.clone())),
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
                Err((server, wall_time, valid)) => Ok(tracing::Instrument::instrument(
                    server.invoke(&call, wall_time, Some(&cancel), valid.as_ref()),
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
    pub(super) async fn record_tool_outcome(
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

    /// Makes a compaction call: intent, the summarising request, then the
    /// summary or the failure (never retried within the step: the step
    /// goes on uncompacted).
    pub(super) async fn compact(
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
pub(super) fn for_run(plugin: &LoadedPlugin, log: &Log, prepared: &Prepared) -> LoadedPlugin {
    fenced(&plugin.bounded(&lease_bound(log, prepared)), log)
}

/// `plugin` whose leases stop making effects once the driver's view of its
/// claim has passed; unchanged for a driver without a claim (`warden run`).
/// An MCP server's call is handed the same view (`tool_lease`).
pub(super) fn fenced(plugin: &LoadedPlugin, log: &Log) -> LoadedPlugin {
    match &log.valid {
        Some(valid) => plugin.valid_until(valid.clone()),
        None => plugin.clone(),
    }
}

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
pub(super) type ToolReturn = Result<wit::ToolOutput, wit::ToolError>;

/// What [`Runtime::record_tool_outcome`] recorded.
pub(super) enum ToolOutcome {
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
