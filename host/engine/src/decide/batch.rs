//! Parallel batches, the pure half: which calls of a turn may start while
//! earlier calls of the same turn are still in flight ([`launch`]), under
//! the agent's [`Parallelism`](crate::batch::Parallelism).
//!
//! A call joins the batch in flight only when [`decide`](super::decide())
//! would start it anyway and nothing about it needs the run to stop first:
//! a `read` or `idempotent` plugin call (a `write` only with
//! `parallel_writes`) without an operator-named key, or a call to another
//! agent (a child run). Anything else (an approval to ask, a policy to
//! consult, a rejection, a budget used up, a human or external tool, a
//! keyed call whose claim may find another run's result) waits until every
//! call in flight has its outcome recorded, then happens as it would one
//! call at a time. So policies and approvals see each call as they do
//! without batches, and a write that needs approval always runs alone.
//!
//! The log stays one order whatever finishes first: intents are recorded
//! as calls start, in the model's order, and outcomes in the model's order
//! too (the fold refuses any other, `state.rs`), so a batch's log and its
//! replay are the same however the calls interleave.
//!
//! Budgets hold exactly: a tool call counts when its intent is recorded,
//! before it starts; a child's granted budgets are reserved from the
//! parent's until it ends ([`RunState::committed_usage`]); fuel, charged
//! when a lease ends, is split by the executor, each lease bounded by what
//! the others in flight have not reserved. A child does not start beside
//! a plugin call while the run has a fuel budget (the plugin call's share
//! is the executor's, not the log's).

use super::Action;
use crate::state::{RunState, ToolCallProgress, ToolCallState};
use crate::view::AgentView;

/// The action that starts the next call of the latest turn beside the
/// calls already in flight, when one may: `None` when nothing is in flight
/// (the call starts as it would alone), when the bound is reached, when a
/// call in flight must run alone, or when the next call is not one that
/// joins a batch. Recording a clock reading the next call's wall-time
/// check needs is part of starting it.
pub(crate) fn launch(
    state: &RunState,
    view: &AgentView,
    decide_call: impl FnOnce(&ToolCallState) -> Action,
) -> Option<Action> {
    let parallel = view.parallel;
    if parallel.max_calls <= 1 {
        return None;
    }
    let calls = &state.last_turn()?.calls;
    let mut in_flight = 0u32;
    let mut plugin_in_flight = false;
    let mut next = None;
    for call in calls {
        match &call.progress {
            p if p.is_settled() => {}
            ToolCallProgress::InFlight(intent) if parallel.admits(intent) => {
                in_flight += 1;
                plugin_in_flight = true;
            }
            ToolCallProgress::Child { parked: None, .. } => in_flight += 1,
            // An approved call starts alone, once the rule that approved
            // it is checked again (`runtime/rules.rs`).
            ToolCallProgress::Pending => {
                next = Some(call);
                break;
            }
            // A call that must run alone, a child found waiting, a call
            // parked for a human: nothing more starts.
            _ => return None,
        }
    }
    let next = next?;
    if in_flight == 0 || in_flight >= parallel.max_calls {
        return None;
    }
    match decide_call(next) {
        action @ Action::ObserveClock => Some(action),
        Action::CallTool(call) if !call.recorded && parallel.admits(&call.intent) => {
            Some(Action::CallTool(call))
        }
        Action::StartChild(start) => {
            let limits = state.effective_limits(&view.budgets);
            (!(plugin_in_flight && limits.fuel.is_some())).then_some(Action::StartChild(start))
        }
        _ => None,
    }
}
