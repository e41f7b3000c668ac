//! The run's own course, beside its calls: budgets crossed and extended,
//! clock and random readings, output rejected, the end (completed, failed,
//! cancelled, abandoned: each carrying exactly the dangling write, if any),
//! a fork's first event, and reconciliation required and done.

use super::{FoldProblem, RunState, Terminal, ToolCallProgress};
use crate::budget::BudgetLimits;
use crate::events::{Event, UnresolvedWrite};
use crate::output::{MAX_OUTPUT_REJECTIONS, rejection_feedback};
use warden_providers::Message;

impl RunState {
    /// Checks a run lifecycle event (`check` in `state.rs` dispatches it).
    pub(super) fn check_lifecycle(&self, event: &Event) -> Result<(), FoldProblem> {
        match event {
            Event::BudgetExceeded(_) => {
                self.nothing_in_flight()?;
                self.parked_problem()
            }
            Event::BudgetExtended(_) => {
                if self.budget_exceeded.is_none() {
                    return Err(FoldProblem::NoBudgetExceeded);
                }
                Ok(())
            }
            Event::ClockObserved(_) | Event::RandomObserved(_) => Ok(()),
            Event::RunCompleted(_) => {
                self.nothing_in_flight()?;
                self.parked_problem()?;
                if let Some(call) = self.next_call() {
                    return Err(FoldProblem::ToolCallOutstanding {
                        call_id: call.call_id.clone(),
                    });
                }
                Ok(())
            }
            Event::OutputRejected(r) => {
                self.nothing_in_flight()?;
                self.parked_problem()?;
                match self.turns.last() {
                    Some(turn)
                        if turn.step == r.step && turn.calls.is_empty() && !turn.continued => {}
                    _ => return Err(FoldProblem::NotAFinalAnswer { step: r.step }),
                }
                if self.output_rejections >= MAX_OUTPUT_REJECTIONS {
                    return Err(FoldProblem::OutputRejectedTooOften {
                        limit: MAX_OUTPUT_REJECTIONS,
                    });
                }
                Ok(())
            }
            Event::RunFailed(_) => self.check_unresolved(&None),
            Event::RunCancelled(c) => self.check_unresolved(&c.unresolved_write),
            Event::RunAbandoned(a) => self.check_unresolved(&a.unresolved_write),
            // Right after the inherited prefix, naming the run it was
            // copied from (whose id the prefix derives its keys from).
            Event::RunForked(f) => {
                if f.source_run != self.run_id {
                    return Err(FoldProblem::ForkSourceMismatch {
                        recorded: f.source_run.clone(),
                        inherited: self.run_id.clone(),
                    });
                }
                if f.position != self.event_count as u64 {
                    return Err(FoldProblem::ForkPositionMismatch {
                        recorded: f.position,
                        inherited: self.event_count as u64,
                    });
                }
                let approved = self
                    .next_call()
                    .filter(|c| matches!(c.progress, ToolCallProgress::Approved { .. }))
                    .map(|c| &c.call_id);
                if approved != f.withdrawn_approval.as_ref() {
                    return Err(FoldProblem::ForkApprovalMismatch {
                        approved: approved.cloned(),
                    });
                }
                Ok(())
            }
            // Any time before the end: a restore may catch a run anywhere.
            Event::ReconciliationRequired(_) => Ok(()),
            Event::Reconciled(_) if self.hold.is_none() => Err(FoldProblem::NothingToReconcile),
            Event::Reconciled(_) => Ok(()),
            _ => unreachable!("`check` dispatches only these events here"),
        }
    }

    /// Applies a checked run lifecycle event.
    pub(super) fn update_lifecycle(&mut self, event: &Event) {
        match event {
            Event::BudgetExceeded(o) => self.budget_exceeded = Some(*o),
            Event::BudgetExtended(e) => {
                self.extensions = self.extensions.overridden_by(&e.limits);
                self.budget_exceeded = None;
            }
            // Readings are counted in `apply`.
            Event::ClockObserved(_) => {}
            Event::RandomObserved(r) => self.random_values.push(r.value),
            Event::OutputRejected(r) => {
                self.output_rejections += 1;
                if let Some(turn) = self.turns.last_mut() {
                    turn.continued = true;
                }
                self.messages.push(Message::User {
                    content: rejection_feedback(&r.violation),
                });
            }
            Event::RunCompleted(c) => self.terminal = Some(Terminal::Completed(c.clone())),
            Event::RunFailed(f) => self.terminal = Some(Terminal::Failed(f.clone())),
            Event::RunCancelled(c) => self.terminal = Some(Terminal::Cancelled(c.clone())),
            Event::RunAbandoned(a) => self.terminal = Some(Terminal::Abandoned(a.clone())),
            Event::ReconciliationRequired(r) => self.hold = Some(r.clone()),
            Event::Reconciled(_) => self.hold = None,
            Event::RunForked(f) => {
                self.run_id = f.run_id.clone();
                self.agent_digest = f.agent_digest.clone();
                self.limits = Some(f.limits.clone());
                // The limits recorded here already hold the source's
                // extensions (or replace them): none carries over twice.
                self.extensions = BudgetLimits::default();
                // Decided again against the fork's limits: parked again if
                // they are still crossed.
                self.budget_exceeded = None;
                if f.withdrawn_approval.is_some() {
                    self.next_call_mut().progress = ToolCallProgress::AwaitingApproval;
                }
                // The time between the source's last event and the fork is
                // nobody's active time.
                self.last_clock_ms = Some(self.last_clock_ms.map_or(f.at_ms, |l| l.max(f.at_ms)));
                self.fork = Some(f.clone());
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }

    fn check_unresolved(&self, given: &Option<UnresolvedWrite>) -> Result<(), FoldProblem> {
        let dangling = self.dangling_write();
        let matches = match (dangling, given) {
            (None, None) => true,
            (Some(intent), Some(write)) => UnresolvedWrite::from(intent) == *write,
            _ => false,
        };
        if matches {
            Ok(())
        } else {
            Err(FoldProblem::UnresolvedWriteMismatch {
                expected: dangling.map(|i| i.call_id.clone()),
            })
        }
    }
}
