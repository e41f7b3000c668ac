//! The model's calls as the fold sees them: a call's intent (the next step
//! and attempt, nothing else in flight, not after a final answer), its
//! completion (a turn, with the tool calls the model asked for) or failure,
//! and the wait before it is tried again; the context resolved before a
//! step's call, and compaction (a model call that summarises the
//! conversation up to a message).

use super::{
    FoldProblem, ModelCallProgress, RetryWait, RunState, ToolCallProgress, ToolCallState, Turn,
};
use crate::compaction::Summary;
use crate::context::ContextState;
use crate::events::Event;
use crate::ids::CallId;
use warden_providers::Message;

impl RunState {
    /// Checks a model call, wait, compaction and context event (`check` in `state.rs` dispatches it).
    pub(super) fn check_model_call(&self, event: &Event) -> Result<(), FoldProblem> {
        match event {
            Event::ModelCallIntent(intent) => {
                self.model_call_may_start()?;
                let (expected_step, expected_attempt) = self.next_model_call();
                if (intent.step, intent.attempt) != (expected_step, expected_attempt) {
                    return Err(FoldProblem::StepMismatch {
                        expected_step,
                        expected_attempt,
                        step: intent.step,
                        attempt: intent.attempt,
                    });
                }
                Ok(())
            }
            Event::ModelCallCompleted(c) => self.expect_model_in_flight(c.step),
            Event::ModelCallFailed(f) => self.expect_model_in_flight(f.step),
            Event::WaitStarted(w) => {
                let ModelCallProgress::Failed { step, .. } = self.model_call else {
                    return Err(FoldProblem::NoFailedModelCall);
                };
                if w.step != step || self.wait.is_some() {
                    return Err(FoldProblem::NoFailedModelCall);
                }
                self.parked_problem()
            }
            Event::WaitEnded(e) => match self.waiting() {
                Some(w) if e.at_ms >= w.until_ms => Ok(()),
                Some(w) => Err(FoldProblem::WokeEarly {
                    at_ms: e.at_ms,
                    until_ms: w.until_ms,
                }),
                None => Err(FoldProblem::NotWaiting),
            },
            Event::CompactionIntent(i) => {
                self.check_context(i.step)?;
                let done = self.compaction.summary.as_ref().map_or(1, |s| s.upto);
                let upto = i.upto as usize;
                if upto <= done || upto >= self.messages.len() {
                    return Err(FoldProblem::CompactionCut {
                        upto: i.upto,
                        done,
                        len: self.messages.len(),
                    });
                }
                Ok(())
            }
            Event::CompactionCompleted(c) => self.expect_compaction_in_flight(c.step, c.upto),
            Event::CompactionFailed(f) => self.expect_compaction_in_flight(f.step, f.upto),
            Event::ContextResolved(r) => self.check_context(r.step),
            Event::ContextFailed(f) => self.check_context(f.step),
            _ => unreachable!("`check` dispatches only these events here"),
        }
    }

    /// Applies a checked model call, wait, compaction and context event.
    pub(super) fn update_model_call(&mut self, event: &Event) {
        match event {
            Event::ModelCallIntent(i) => {
                self.wait = None;
                self.model_call = ModelCallProgress::InFlight {
                    step: i.step,
                    attempt: i.attempt,
                    request_hash: i.request_hash.clone(),
                };
            }
            Event::ModelCallCompleted(c) => {
                let u = &mut self.usage;
                u.steps += 1;
                u.input_tokens = u.input_tokens.saturating_add(c.usage.input_tokens);
                u.output_tokens = u.output_tokens.saturating_add(c.usage.output_tokens);
                u.cost_nanos = u.cost_nanos.saturating_add(c.cost_nanos.unwrap_or(0));
                self.turns.push(Turn {
                    step: c.step,
                    text: c.text.clone(),
                    stop_reason: c.stop_reason,
                    calls: c
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(i, call)| ToolCallState {
                            call_id: CallId::new(c.step, i + 1),
                            call: call.clone(),
                            progress: ToolCallProgress::Pending,
                            failed_attempts: 0,
                        })
                        .collect(),
                    continued: false,
                });
                self.results_shown = 0;
                self.model_call = ModelCallProgress::Idle;
                self.messages.push(Message::Assistant {
                    text: c.text.clone(),
                    tool_calls: c.tool_calls.clone(),
                    blocks: c.blocks.clone(),
                });
            }
            Event::ModelCallFailed(f) => {
                let attempts = match self.model_call {
                    ModelCallProgress::InFlight { attempt, .. } => attempt,
                    _ => unreachable!("checked: a model call is in flight"),
                };
                self.model_call = ModelCallProgress::Failed {
                    step: f.step,
                    attempts,
                    error: f.error.clone(),
                    at_ms: f.at_ms,
                    retry_at_ms: f.retry_at_ms,
                };
            }
            Event::WaitStarted(w) => {
                self.wait = Some(RetryWait {
                    step: w.step,
                    since_ms: w.since_ms,
                    until_ms: w.until_ms,
                    ended_ms: None,
                });
            }
            Event::WaitEnded(e) => {
                if let Some(w) = &mut self.wait {
                    w.ended_ms = Some(e.at_ms);
                }
            }
            Event::CompactionIntent(i) => {
                self.compaction.in_flight = Some((i.step, i.upto as usize, i.request_hash.clone()));
            }
            Event::CompactionCompleted(c) => {
                let u = &mut self.usage;
                u.input_tokens = u.input_tokens.saturating_add(c.usage.input_tokens);
                u.output_tokens = u.output_tokens.saturating_add(c.usage.output_tokens);
                u.cost_nanos = u.cost_nanos.saturating_add(c.cost_nanos.unwrap_or(0));
                self.compaction.in_flight = None;
                self.compaction.completed += 1;
                self.compaction.summary = Some(Summary {
                    step: c.step,
                    upto: c.upto as usize,
                    text: c.summary.clone(),
                });
            }
            Event::CompactionFailed(f) => {
                self.compaction.in_flight = None;
                self.compaction.failed += 1;
                self.compaction.failed_at_step = Some(f.step);
            }
            Event::ContextResolved(r) => {
                self.usage.fuel = self.usage.fuel.saturating_add(r.receipt.fuel_consumed);
                self.context
                    .insert(r.source.clone(), ContextState::resolved(r));
            }
            Event::ContextFailed(f) => {
                if let Some(receipt) = &f.receipt {
                    self.usage.fuel = self.usage.fuel.saturating_add(receipt.fuel_consumed);
                }
                self.context
                    .insert(f.source.clone(), ContextState::failed(f));
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }

    fn next_model_call(&self) -> (u32, u32) {
        match &self.model_call {
            ModelCallProgress::Failed { step, attempts, .. } => (*step, attempts + 1),
            _ => (self.turns.len() as u32 + 1, 1),
        }
    }

    /// A model call (or what comes right before one: context, compaction)
    /// may start: nothing in flight, every tool call of the last turn
    /// settled, not parked, and not after the model's final answer (unless
    /// the last call failed and is tried again).
    fn model_call_may_start(&self) -> Result<(), FoldProblem> {
        self.nothing_in_flight()?;
        if let Some(call) = self.next_call() {
            return Err(FoldProblem::ToolCallOutstanding {
                call_id: call.call_id.clone(),
            });
        }
        self.parked_problem()?;
        if !matches!(self.model_call, ModelCallProgress::Failed { .. })
            && let Some(turn) = self.turns.last()
            && turn.calls.is_empty()
            && !turn.continued
        {
            return Err(FoldProblem::AfterFinalAnswer { step: turn.step });
        }
        Ok(())
    }

    /// A context source is resolved only where a model call of `step` could
    /// be made next.
    fn check_context(&self, step: u32) -> Result<(), FoldProblem> {
        self.model_call_may_start()?;
        let (expected, _) = self.next_model_call();
        if step != expected {
            return Err(FoldProblem::ContextStepMismatch { expected, step });
        }
        Ok(())
    }

    fn expect_compaction_in_flight(&self, step: u32, upto: u32) -> Result<(), FoldProblem> {
        match self.compaction.in_flight {
            Some((s, u, _)) if s == step && u == upto as usize => Ok(()),
            _ => Err(FoldProblem::NoCompactionInFlight { step, upto }),
        }
    }

    fn expect_model_in_flight(&self, step: u32) -> Result<(), FoldProblem> {
        match self.model_call {
            ModelCallProgress::InFlight { step: s, .. } if s == step => Ok(()),
            _ => Err(FoldProblem::NoModelCallInFlight { step }),
        }
    }
}
