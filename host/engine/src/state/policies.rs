//! Policy decisions as the fold sees them: each policy decides once per
//! point (run start, after a response, before a tool call, before the
//! finish), only while that point is current and no earlier policy
//! stopped it; a denial settles the call, feedback continues the turn.

use super::{FoldProblem, ModelCallProgress, RunState, ToolCallProgress};
use crate::events::Event;
use crate::policy_hooks::{
    PolicyHook, PolicyPoint, PolicyVerdict, RecordedDecision, feedback_message,
};
use warden_providers::Message;

impl RunState {
    /// Checks a policy event (`check` in `state.rs` dispatches it).
    pub(super) fn check_policy(&self, event: &Event) -> Result<(), FoldProblem> {
        match event {
            Event::PolicyDecided(d) => {
                self.nothing_in_flight()?;
                self.parked_problem()?;
                let point = d
                    .point()
                    .ok_or(FoldProblem::PolicyPointMalformed { hook: d.hook })?;
                let decided = self.policy_decisions(&point);
                if decided.iter().any(|r| r.policy == d.policy) {
                    return Err(FoldProblem::PolicyAlreadyDecided {
                        policy: d.policy.clone(),
                    });
                }
                if let Some(stop) = decided.iter().find(|r| r.verdict != PolicyVerdict::Allow) {
                    return Err(FoldProblem::PolicyAlreadyDecided {
                        policy: stop.policy.clone(),
                    });
                }
                if d.decision == PolicyVerdict::Feedback && d.hook != PolicyHook::BeforeFinish {
                    return Err(FoldProblem::FeedbackOutsideFinish { hook: d.hook });
                }
                let idle = matches!(self.model_call, ModelCallProgress::Idle);
                let latest = self.turns.last();
                let fits = match &point {
                    PolicyPoint::RunStart => idle && self.turns.is_empty(),
                    PolicyPoint::AfterResponse { step } => {
                        idle && latest.is_some_and(|t| t.step == *step)
                    }
                    PolicyPoint::BeforeToolCall { call_id } => {
                        let call = self.expect_next(call_id)?;
                        return Self::expect_progress(
                            call,
                            |p| matches!(p, ToolCallProgress::Pending),
                            "pending",
                        );
                    }
                    PolicyPoint::BeforeFinish { step } => {
                        idle && latest
                            .is_some_and(|t| t.step == *step && t.calls.is_empty() && !t.continued)
                    }
                };
                if fits {
                    Ok(())
                } else {
                    Err(FoldProblem::PolicyPointPassed { hook: d.hook })
                }
            }
            _ => unreachable!("`check` dispatches only these events here"),
        }
    }

    /// Applies a checked policy event.
    pub(super) fn update_policy(&mut self, event: &Event) {
        match event {
            Event::PolicyDecided(d) => {
                if let Some(receipt) = &d.receipt {
                    self.usage.fuel = self.usage.fuel.saturating_add(receipt.fuel_consumed);
                }
                let point = d.point().expect("checked: the point fits the hook");
                let reason = d.reason.clone().unwrap_or_default();
                match (&point, d.decision) {
                    (PolicyPoint::BeforeToolCall { .. }, PolicyVerdict::Deny) => {
                        // The call was valid: it does not count as the
                        // model's mistake.
                        self.invalid_calls_in_a_row = 0;
                        self.settle(ToolCallProgress::PolicyDenied {
                            policy: d.policy.clone(),
                            reason,
                        });
                    }
                    (PolicyPoint::BeforeFinish { .. }, PolicyVerdict::Feedback) => {
                        if let Some(turn) = self.turns.last_mut() {
                            turn.continued = true;
                        }
                        self.messages.push(Message::User {
                            content: feedback_message(&d.policy, &reason),
                        });
                    }
                    _ => {}
                }
                self.policy_decisions
                    .entry(point)
                    .or_default()
                    .push(RecordedDecision {
                        policy: d.policy.clone(),
                        verdict: d.decision,
                        reason: d.reason.clone(),
                    });
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }
}
