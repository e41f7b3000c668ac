//! Tool calls as the fold sees them: each call of a turn started in the
//! model's order (its intent matching the model's call: tool, arguments,
//! the derived idempotency key), its attempts and outcome recorded in that
//! order, whatever finished first; a call rejected, deduplicated against
//! another run's, made outside (an external call), or resolved by a
//! human after its outcome was lost.

use super::{FoldProblem, RunState, ToolCallProgress, key_argument};
use crate::events::{Event, ToolCallResult};
use crate::ids::{commitment_key, idempotency_key};
use warden_plugins::grant::EffectClass;

impl RunState {
    /// Checks a tool call event (`check` in `state.rs` dispatches it).
    pub(super) fn check_tool_call(&self, event: &Event) -> Result<(), FoldProblem> {
        match event {
            Event::ToolCallRejected(r) => {
                // An approved call is rejected when its tool disappeared
                // from the agent in between.
                let call = self.expect_next(&r.call_id)?;
                Self::expect_pending_or_approved(call)
            }
            Event::ToolCallIntent(intent) => {
                let call = self.expect_launchable(&intent.call_id)?;
                Self::expect_pending_or_approved(call)?;
                self.parked_problem()?;
                let mismatch = |field| FoldProblem::CallMismatch {
                    call_id: intent.call_id.clone(),
                    field,
                };
                if intent.tool.model_name() != call.call.name {
                    return Err(mismatch("tool"));
                }
                if intent.arguments != call.call.arguments {
                    return Err(mismatch("arguments"));
                }
                let expected_key = match &intent.keyed_by {
                    None => idempotency_key(&self.run_id, &intent.call_id),
                    Some(k) => match key_argument(&intent.arguments, &k.field) {
                        Some(value) => commitment_key(&k.scope, value),
                        None => return Err(mismatch("idempotency key argument")),
                    },
                };
                if intent.idempotency_key != expected_key {
                    return Err(mismatch("idempotency key"));
                }
                Ok(())
            }
            Event::ToolCallAttemptFailed(f) => {
                let call = self.expect_reporting(&f.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::InFlight(_)),
                    "in flight",
                )
            }
            Event::ExternalCallRequested(r) => {
                let call = self.expect_next(&r.call_id)?;
                Self::expect_progress(call, |p| matches!(p, ToolCallProgress::Pending), "pending")?;
                if r.tool != call.call.name {
                    return Err(FoldProblem::CallMismatch {
                        call_id: r.call_id.clone(),
                        field: "tool",
                    });
                }
                if r.arguments != call.call.arguments {
                    return Err(FoldProblem::CallMismatch {
                        call_id: r.call_id.clone(),
                        field: "arguments",
                    });
                }
                self.parked_problem()
            }
            Event::ExternalCallCompleted(c) => {
                let call = self.expect_next(&c.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::AwaitingExternal(_)),
                    "awaiting external",
                )
            }
            Event::ToolCallDeduplicated(d) => {
                let call = self.expect_next(&d.call_id)?;
                Self::expect_pending_or_approved(call)?;
                self.parked_problem()
            }
            Event::ToolCallCompleted(c) => {
                let call = self.expect_reporting(&c.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::InFlight(_)),
                    "in flight",
                )
            }
            Event::ToolCallResolved(r) => {
                let call = self.expect_next(&r.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::InFlight(i) if i.effect == EffectClass::Write),
                    "a write in flight",
                )
            }
            _ => unreachable!("`check` dispatches only these events here"),
        }
    }

    /// Applies a checked tool call event.
    pub(super) fn update_tool_call(&mut self, event: &Event) {
        match event {
            Event::ToolCallRejected(r) => {
                if r.error.is_invalid_call() {
                    self.invalid_calls_in_a_row += 1;
                    self.last_invalid_call = Some(r.error.to_string());
                }
                self.settle(ToolCallProgress::Rejected(r.error.clone()));
            }
            Event::ToolCallIntent(i) => {
                self.invalid_calls_in_a_row = 0;
                self.usage.tool_calls += 1;
                self.call_mut(&i.call_id).progress = ToolCallProgress::InFlight(i.clone());
            }
            Event::ToolCallCompleted(c) => {
                self.usage.fuel = self.usage.fuel.saturating_add(c.receipt.fuel_consumed);
                self.settle_call(&c.call_id, ToolCallProgress::Completed(c.result.clone()));
            }
            Event::ToolCallAttemptFailed(f) => {
                self.usage.fuel = self.usage.fuel.saturating_add(f.receipt.fuel_consumed);
                self.call_mut(&f.call_id).failed_attempts += 1;
            }
            Event::ExternalCallRequested(r) => {
                self.invalid_calls_in_a_row = 0;
                self.next_call_mut().progress = ToolCallProgress::AwaitingExternal(r.clone());
            }
            Event::ExternalCallCompleted(c) => {
                self.settle(ToolCallProgress::Completed(ToolCallResult::Output(
                    c.output.clone(),
                )));
            }
            Event::ToolCallDeduplicated(d) => {
                self.invalid_calls_in_a_row = 0;
                self.settle(ToolCallProgress::Deduplicated {
                    result: d.result.clone(),
                    origin_run: d.origin_run.clone(),
                    origin_call: d.origin_call.clone(),
                });
            }
            Event::ToolCallResolved(r) => {
                self.settle(ToolCallProgress::Resolved {
                    by: r.by.clone(),
                    output: r.output.clone(),
                });
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }
}
