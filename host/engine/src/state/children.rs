//! Child runs as the fold sees them: a call to another agent started as a
//! child run (its input the call's arguments), then parked or finished,
//! each reported for the child the call started, in the model's order; a
//! finished child's usage is charged to the parent.

use super::{FoldProblem, RunState, ToolCallProgress};
use crate::events::{ChildFinished, ChildParked, Event};

impl RunState {
    /// Checks a child run event (`check` in `state.rs` dispatches it).
    pub(super) fn check_child(&self, event: &Event) -> Result<(), FoldProblem> {
        match event {
            Event::ChildStarted(c) => {
                let call = self.expect_launchable(&c.call_id)?;
                Self::expect_progress(call, |p| matches!(p, ToolCallProgress::Pending), "pending")?;
                if c.input != call.call.arguments {
                    return Err(FoldProblem::CallMismatch {
                        call_id: c.call_id.clone(),
                        field: "arguments",
                    });
                }
                self.parked_problem()
            }
            Event::ChildParked(ChildParked {
                call_id, child_run, ..
            })
            | Event::ChildFinished(ChildFinished {
                call_id, child_run, ..
            }) => {
                let call = self.expect_reporting(call_id)?;
                Self::expect_progress(
                    call,
                    |p| matches!(p, ToolCallProgress::Child { .. }),
                    "running a child",
                )?;
                if !matches!(&call.progress, ToolCallProgress::Child { child_run: c, .. } if c == child_run)
                {
                    return Err(FoldProblem::CallMismatch {
                        call_id: call_id.clone(),
                        field: "child_run",
                    });
                }
                Ok(())
            }
            _ => unreachable!("`check` dispatches only these events here"),
        }
    }

    /// Applies a checked child run event.
    pub(super) fn update_child(&mut self, event: &Event) {
        match event {
            Event::ChildStarted(c) => {
                self.invalid_calls_in_a_row = 0;
                self.usage.tool_calls += 1;
                self.children_started = self.children_started.saturating_add(1);
                self.call_mut(&c.call_id).progress = ToolCallProgress::Child {
                    child_run: c.child_run.clone(),
                    parked: None,
                    granted: c.budgets,
                };
            }
            Event::ChildParked(p) => {
                if let ToolCallProgress::Child { parked, .. } =
                    &mut self.call_mut(&p.call_id).progress
                {
                    *parked = Some(p.status);
                }
            }
            Event::ChildFinished(f) => {
                let (u, c) = (&mut self.usage, &f.usage);
                u.steps = u.steps.saturating_add(c.steps);
                u.input_tokens = u.input_tokens.saturating_add(c.input_tokens);
                u.output_tokens = u.output_tokens.saturating_add(c.output_tokens);
                u.cost_nanos = u.cost_nanos.saturating_add(c.cost_nanos);
                u.tool_calls = u.tool_calls.saturating_add(c.tool_calls);
                u.fuel = u.fuel.saturating_add(c.fuel);
                self.settle_call(&f.call_id, ToolCallProgress::Completed(f.result.clone()));
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }
}
