//! A call waiting for a person: an approval requested (for the pending
//! call, its digest matching), granted, denied or withdrawn again; a call
//! suspended for input, and resumed with the answer.

use super::{FoldProblem, RunState, ToolCallProgress};
use crate::events::Event;

impl RunState {
    /// Checks a approval and suspension event (`check` in `state.rs` dispatches it).
    pub(super) fn check_approval(&self, event: &Event) -> Result<(), FoldProblem> {
        match event {
            Event::ApprovalRequested(a) => {
                let call = self.expect_next(&a.call_id)?;
                Self::expect_progress(call, |p| matches!(p, ToolCallProgress::Pending), "pending")?;
                self.parked_problem()?;
                if a.tool.model_name() != call.call.name {
                    return Err(FoldProblem::CallMismatch {
                        call_id: a.call_id.clone(),
                        field: "tool",
                    });
                }
                if a.digest.as_ref().is_some_and(|d| *d != call.digest()) {
                    return Err(FoldProblem::CallMismatch {
                        call_id: a.call_id.clone(),
                        field: "digest",
                    });
                }
                Ok(())
            }
            Event::ApprovalGranted(g) => {
                let call = self.expect_next(&g.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::AwaitingApproval),
                    "awaiting approval",
                )
            }
            Event::ApprovalDenied(d) => {
                let call = self.expect_next(&d.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::AwaitingApproval),
                    "awaiting approval",
                )
            }
            Event::ApprovalWithdrawn(w) => {
                let call = self.expect_next(&w.call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::Approved { .. }),
                    "approved",
                )
            }
            Event::Suspended(s) => {
                let call = self.expect_next(&s.call_id)?;
                Self::expect_progress(call, |p| matches!(p, ToolCallProgress::Pending), "pending")?;
                self.parked_problem()
            }
            Event::Resumed(_) => match self.next_call() {
                Some(call) if matches!(call.progress, ToolCallProgress::Suspended { .. }) => Ok(()),
                _ => Err(FoldProblem::NotSuspended),
            },
            _ => unreachable!("`check` dispatches only these events here"),
        }
    }

    /// Applies a checked approval and suspension event.
    pub(super) fn update_approval(&mut self, event: &Event) {
        match event {
            Event::ApprovalRequested(a) => {
                self.invalid_calls_in_a_row = 0;
                if let Some(receipt) = &a.receipt {
                    self.usage.fuel = self.usage.fuel.saturating_add(receipt.fuel_consumed);
                }
                self.next_call_mut().progress = ToolCallProgress::AwaitingApproval;
            }
            Event::ApprovalGranted(g) => {
                self.next_call_mut().progress = ToolCallProgress::Approved {
                    by: g.by.clone(),
                    digest: g.digest.clone(),
                    rule: g.rule.clone(),
                };
            }
            Event::ApprovalWithdrawn(_) => {
                self.next_call_mut().progress = ToolCallProgress::AwaitingApproval;
            }
            Event::ApprovalDenied(d) => {
                self.settle(ToolCallProgress::Denied {
                    by: d.by.clone(),
                    reason: d.reason.clone(),
                });
            }
            Event::Suspended(s) => {
                self.invalid_calls_in_a_row = 0;
                self.next_call_mut().progress = ToolCallProgress::Suspended {
                    reason: s.reason.clone(),
                    schema: s.schema.clone(),
                };
            }
            Event::Resumed(r) => {
                self.settle(ToolCallProgress::Answered {
                    input: r.input.clone(),
                });
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }
}
