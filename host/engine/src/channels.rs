//! Delivery channels: an agent's `[channels.<name>]` as the engine sees them
//! ([`Channel`]), which recorded events each channel receives
//! ([`Receives`]), what a run's log says of its deliveries ([`Deliveries`],
//! folded by the state), what to record after an attempt ([`settle`]) and
//! the backoff between attempts ([`Channel::backoff_ms`]). The delivery
//! events' payloads are in [`super::events`]; the next delivery a run owes
//! and how many it owes are [`super::state::next_delivery`] and
//! [`super::state::owed_count`], which read the folded state.
//!
//! A delivery is an effect like a tool call: its intent is recorded (with a
//! stable id, the channel, the event it reports and the frozen payload)
//! before the channel's lease runs, and each attempt's outcome is recorded
//! with the lease's receipt. Deliveries are a lane of their own beside the
//! run: they never change the run's status or result, they go on after a
//! terminal event, and the run's next model or tool call waits until the
//! delivery in hand is settled.
//!
//! Which deliveries a run owes is derived from the log and the agent alone:
//! for each channel (in name order), every event after the last one it was
//! given an intent for that it receives; the earliest such event comes
//! first. The id is `<run>/<channel>/<position>`, so a retried or recovered
//! delivery carries the same id and a channel can drop duplicates: delivery
//! is at least once, with a stable id.

use std::collections::BTreeMap;

use super::events::{
    DeliveryAttemptFailed, DeliveryCompleted, DeliveryError, DeliveryFailed, DeliveryIntent, Event,
};
use serde::{Deserialize, Serialize};
use warden_sandbox::{LeaseError, UsageReceipt, wit};

/// Attempts at one delivery when the agent does not say.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Most attempts an agent may ask for.
pub const MAX_ATTEMPTS_LIMIT: u32 = 20;
/// The wait before the first retry when the agent does not say.
pub const DEFAULT_BACKOFF_MS: u64 = 1_000;
/// The longest wait between two attempts when the agent does not say.
pub const DEFAULT_BACKOFF_CAP_MS: u64 = 60_000;
/// The longest `backoff_cap` an agent may set.
pub const BACKOFF_CAP_LIMIT_MS: u64 = 3_600_000;

/// What a channel receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Receives {
    /// The final output: `run_completed`.
    Output,
    /// The end of a run without output: `run_failed`, `run_cancelled`,
    /// `run_abandoned`.
    Failures,
    /// Notices that a run waits for someone: `approval_requested`,
    /// `suspended`, `external_call_requested`, `budget_exceeded`, and a
    /// write whose lease died mid-call (`tool_call_attempt_failed` with an
    /// unknown outcome).
    Parked,
    /// Every event of the run except clock and random readings and the
    /// delivery events themselves.
    Events,
}

impl Receives {
    /// Every value, in the order the documentation lists them.
    pub const ALL: [Receives; 4] = [
        Receives::Output,
        Receives::Failures,
        Receives::Parked,
        Receives::Events,
    ];

    /// The snake_case name, as written in an agent file.
    pub fn as_str(self) -> &'static str {
        match self {
            Receives::Output => "output",
            Receives::Failures => "failures",
            Receives::Parked => "parked",
            Receives::Events => "events",
        }
    }
}

/// One of an agent's delivery channels, as the engine uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channel {
    /// The channel's name (the key of `[channels.<name>]`).
    pub name: String,
    /// The key of the channel plugin in the agent's `[plugins]`.
    pub plugin: String,
    /// What it receives (not empty, no duplicates).
    pub receives: Vec<Receives>,
    /// Attempts per delivery, from 1.
    pub max_attempts: u32,
    /// The wait before the first retry, in milliseconds; doubled for each
    /// further one.
    pub backoff_ms: u64,
    /// The longest wait between two attempts, in milliseconds.
    pub backoff_cap_ms: u64,
}

impl Channel {
    /// The wait after failed attempt `attempt` (from 1) before the next:
    /// `backoff_ms · 2^(attempt-1)`, at most `backoff_cap_ms`. No jitter: a
    /// run's channel is retried by one driver, and the time of the next
    /// attempt is recorded with the failure.
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        let doubled = self
            .backoff_ms
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(32));
        doubled.min(self.backoff_cap_ms)
    }

    /// The delivery kind this channel gives `event`, when it receives it.
    pub fn kind_for(&self, event: &Event) -> Option<&'static str> {
        let notable = notable_kind(event);
        let received = match notable {
            Some((group, _)) => self.receives.contains(&group),
            None => false,
        };
        if received {
            return notable.map(|(_, kind)| kind);
        }
        if self.receives.contains(&Receives::Events) && !is_excluded_from_events(event) {
            return Some(notable.map_or(event.kind().as_str(), |(_, kind)| kind));
        }
        None
    }
}

/// The group and delivery kind of the events named by [`Receives`] other
/// than `events`.
fn notable_kind(event: &Event) -> Option<(Receives, &'static str)> {
    Some(match event {
        Event::RunCompleted(_) => (Receives::Output, "completed"),
        Event::RunFailed(_) => (Receives::Failures, "failed"),
        Event::RunCancelled(_) => (Receives::Failures, "cancelled"),
        Event::RunAbandoned(_) => (Receives::Failures, "abandoned"),
        Event::ApprovalRequested(_) => (Receives::Parked, "approval-requested"),
        Event::Suspended(_) => (Receives::Parked, "suspended"),
        Event::ExternalCallRequested(_) => (Receives::Parked, "awaiting-external"),
        Event::BudgetExceeded(_) => (Receives::Parked, "budget-exceeded"),
        Event::ToolCallAttemptFailed(f) if f.outcome_unknown => {
            (Receives::Parked, "needs-reconciliation")
        }
        _ => return None,
    })
}

/// Events an `events` channel is not given: readings of the injected clock
/// and random source (a wall-time check reads the clock right before the
/// effect it gates; a delivery in between would make the reading stale),
/// and deliveries themselves.
fn is_excluded_from_events(event: &Event) -> bool {
    matches!(event, Event::ClockObserved(_) | Event::RandomObserved(_)) || event.is_delivery()
}

/// What a channel's lease returned, as a delivery error (`None`: delivered).
pub fn outcome_error(
    result: &Result<Result<(), wit::DeliveryError>, LeaseError>,
) -> Option<DeliveryError> {
    match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(DeliveryError::from_wit(e)),
        Err(e) => Some(DeliveryError::from_lease(e)),
    }
}

/// The deliveries of a run as its log has them: folded by
/// [`super::state::RunState`], separately from the run's own
/// progress.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Deliveries {
    /// Per channel, the position of the last event it was given an intent
    /// for.
    pub cursors: BTreeMap<String, u64>,
    /// The delivery whose intent has no final outcome yet.
    pub in_flight: Option<InFlightDelivery>,
    /// Deliveries the channels took.
    pub completed: u32,
    /// Deliveries given up.
    pub failed: u32,
    /// The positions of the events the `output`, `failures` and `parked`
    /// receivers take, in log order, with their group: a channel that does
    /// not receive `events` finds its next delivery here instead of
    /// scanning the log.
    pub notable: Vec<(u64, Receives)>,
}

impl Deliveries {
    /// Notes `event`, folded at `position`.
    pub(crate) fn note(&mut self, position: u64, event: &Event) {
        if let Some((group, _)) = notable_kind(event) {
            self.notable.push((position, group));
        }
    }
}

/// A delivery whose intent is recorded and which is neither completed nor
/// given up.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlightDelivery {
    /// Its intent.
    pub intent: DeliveryIntent,
    /// Attempts that failed.
    pub failed_attempts: u32,
    /// When the next attempt is due, after a failed one.
    pub retry_at_ms: Option<u64>,
}

/// A delivery to make now.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// Its intent.
    pub intent: DeliveryIntent,
    /// The attempt, from 1.
    pub attempt: u32,
    /// Whether the intent is already in the log (an earlier attempt failed,
    /// or a crash came before its outcome): then no new intent is recorded.
    pub recorded: bool,
    /// When the attempt is due, if it must wait.
    pub not_before_ms: Option<u64>,
}

/// What to record after an attempt: its completion, a failed attempt to
/// retry at `now_ms` plus the backoff, or the delivery given up.
pub fn settle(
    delivery: &Delivery,
    channel: &Channel,
    error: Option<DeliveryError>,
    receipt: UsageReceipt,
    now_ms: u64,
) -> Event {
    let delivery_id = delivery.intent.delivery_id.clone();
    match error {
        None => Event::DeliveryCompleted(DeliveryCompleted {
            delivery_id,
            attempt: delivery.attempt,
            receipt,
        }),
        Some(error) if error.is_retryable() && delivery.attempt < channel.max_attempts => {
            Event::DeliveryAttemptFailed(DeliveryAttemptFailed {
                delivery_id,
                attempt: delivery.attempt,
                error,
                receipt,
                retry_at_ms: now_ms.saturating_add(channel.backoff_ms(delivery.attempt)),
            })
        }
        Some(error) => Event::DeliveryFailed(DeliveryFailed {
            delivery_id,
            attempts: delivery.attempt,
            error,
            receipt: Some(receipt),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{
        ModelCallError, ModelCallFailed, ModelCallIntent, RunError, RunFailed, RunStarted,
        tests::receipt,
    };
    use crate::ids::{AgentDigest, RequestHash, RunId};
    use crate::state::{FoldError, FoldProblem, fold, next_delivery, owed_count};
    use crate::status::RunStatus;
    use serde_json::json;
    use warden_sandbox::Outcome;

    fn started() -> Event {
        Event::RunStarted(RunStarted {
            run_id: RunId::new("r1").unwrap(),
            agent: "demo".into(),
            agent_digest: AgentDigest::from_hex("ab"),
            input: json!("go"),
            labels: BTreeMap::new(),
            clock_seed_ms: 1,
            random_seed: 2,
            agent_file: None,
            session: None,
            limits: None,
            parent: None,
            mcp_tools: Default::default(),
        })
    }

    fn failed() -> Event {
        Event::RunFailed(RunFailed {
            error: RunError::Host {
                message: "no model".into(),
            },
        })
    }

    fn owed(events: &[Event], channels: &[Channel]) -> Option<Delivery> {
        next_delivery(events, &fold(events).unwrap(), "demo", channels)
    }

    fn problem(events: &[Event]) -> FoldProblem {
        match fold(events) {
            Err(FoldError::Impossible { problem, .. }) => problem,
            other => panic!("expected an impossible event, got {other:?}"),
        }
    }

    #[test]
    fn deliveries_follow_a_terminal_event_and_never_change_the_status() {
        let failures = channel(&[Receives::Failures]);
        let mut log = vec![started(), failed()];
        assert_eq!(owed(&log, &[channel(&[Receives::Output])]), None);
        let first = owed(&log, std::slice::from_ref(&failures)).unwrap();
        assert_eq!(
            (first.attempt, first.recorded, first.not_before_ms),
            (1, false, None)
        );
        assert_eq!(first.intent.delivery_id, "r1/out/1");
        assert_eq!(first.intent.kind, "failed");
        assert_eq!(first.intent.source, 1);
        assert_eq!(first.intent.payload["event"]["type"], "run_failed");
        assert_eq!(first.intent.payload["agent"], "demo");
        log.push(Event::DeliveryIntent(first.intent.clone()));
        log.push(settle(
            &first,
            &failures,
            Some(DeliveryError::Failed {
                message: "disk".into(),
                retryable: true,
            }),
            receipt(5),
            1_000,
        ));
        let again = owed(&log, std::slice::from_ref(&failures)).unwrap();
        assert_eq!(
            (again.attempt, again.recorded, again.not_before_ms),
            (2, true, Some(1_100))
        );
        assert_eq!(again.intent, first.intent);
        log.push(settle(&again, &failures, None, receipt(5), 1_200));
        let state = fold(&log).unwrap();
        assert_eq!(state.status(), RunStatus::Failed);
        assert_eq!(
            (state.deliveries.completed, state.deliveries.failed),
            (1, 0)
        );
        assert_eq!(owed(&log, std::slice::from_ref(&failures)), None);

        // Nothing but deliveries after the terminal event; no outcome
        // without its delivery in flight; each event given once per
        // channel, with the derived id.
        let with = |e: Event| [log.clone(), vec![e]].concat();
        assert!(matches!(
            problem(&with(Event::ModelCallIntent(ModelCallIntent {
                step: 1,
                attempt: 1,
                request_hash: RequestHash::from_hex("aa"),
                request: None,
                provider: None,
                model: None,
            }))),
            FoldProblem::AfterTerminal { .. }
        ));
        assert!(matches!(
            problem(&with(settle(&again, &failures, None, receipt(5), 0))),
            FoldProblem::DeliveryMismatch { reason, .. } if reason.contains("no such delivery")
        ));
        assert!(matches!(
            problem(&with(Event::DeliveryIntent(first.intent.clone()))),
            FoldProblem::DeliveryMismatch { reason, .. } if reason.contains("already given position 1")
        ));
        let mut renamed = first.intent.clone();
        renamed.channel = "other".into();
        assert!(matches!(
            problem(&with(Event::DeliveryIntent(renamed))),
            FoldProblem::DeliveryMismatch { reason, .. } if reason.contains("must be `r1/other/1`")
        ));
        let mut ahead = first.intent.clone();
        ahead.channel = "other".into();
        ahead.source = log.len() as u64;
        ahead.delivery_id = format!("r1/other/{}", log.len());
        assert!(matches!(
            problem(&with(Event::DeliveryIntent(ahead))),
            FoldProblem::DeliveryMismatch { reason, .. } if reason.contains("not before it")
        ));
    }

    #[test]
    fn a_delivery_in_flight_holds_the_runs_next_effect_and_skips_clock_readings() {
        let events = channel(&[Receives::Events]);
        let mut log = vec![started()];
        let first = owed(&log, std::slice::from_ref(&events)).unwrap();
        assert_eq!(first.intent.kind, "run_started");
        log.push(Event::DeliveryIntent(first.intent.clone()));
        let model = Event::ModelCallIntent(ModelCallIntent {
            step: 1,
            attempt: 1,
            request_hash: RequestHash::from_hex("aa"),
            request: None,
            provider: None,
            model: None,
        });
        assert!(matches!(
            problem(&[log.clone(), vec![model.clone()]].concat()),
            FoldProblem::DeliveryInFlight { delivery_id } if delivery_id == "r1/out/0"
        ));
        // Two attempts at most: the second failure gives up.
        log.push(settle(
            &first,
            &events,
            Some(DeliveryError::Rejected {
                status: 503,
                message: "busy".into(),
            }),
            receipt(1),
            0,
        ));
        let mut short = events.clone();
        short.max_attempts = 2;
        let second = owed(&log, std::slice::from_ref(&short)).unwrap();
        let gave_up = settle(
            &second,
            &short,
            Some(DeliveryError::Rejected {
                status: 503,
                message: "busy".into(),
            }),
            receipt(1),
            0,
        );
        assert!(matches!(&gave_up, Event::DeliveryFailed(f) if f.attempts == 2));
        log.push(gave_up);
        log.push(Event::ClockObserved(crate::events::ClockObserved {
            at_ms: 9,
        }));
        log.push(model);
        // Nothing is delivered while the model call is in flight.
        assert_eq!(owed(&log, std::slice::from_ref(&events)), None);
        log.push(Event::ModelCallFailed(ModelCallFailed {
            step: 1,
            error: ModelCallError {
                transient: true,
                message: "busy".into(),
                status: Some(503),
                retry_after_ms: None,
            },
            at_ms: None,
            retry_at_ms: None,
        }));
        // Then: the clock reading is not delivered; the model intent is,
        // and no delivery event ever is.
        let next = owed(&log, std::slice::from_ref(&events)).unwrap();
        assert_eq!(next.intent.kind, "model_call_intent");
        assert_eq!(next.intent.source, log.len() as u64 - 2);
    }

    fn channel(receives: &[Receives]) -> Channel {
        Channel {
            name: "out".into(),
            plugin: "jsonl".into(),
            receives: receives.to_vec(),
            max_attempts: 3,
            backoff_ms: 100,
            backoff_cap_ms: 250,
        }
    }

    #[test]
    fn the_owed_count_is_zero_exactly_when_nothing_is_owed() {
        let failures = channel(&[Receives::Failures]);
        let mut events = channel(&[Receives::Events]);
        events.name = "all".into();
        let both = [events.clone(), failures.clone()];
        let count = |log: &[Event], channels: &[Channel]| {
            let state = fold(log).unwrap();
            let n = owed_count(log, &state, channels);
            assert_eq!(
                n > 0,
                next_delivery(log, &state, "demo", channels).is_some(),
                "{n} owed for {log:?}"
            );
            n
        };
        let mut log = vec![started(), failed()];
        assert_eq!(count(&log, &[]), 0);
        assert_eq!(count(&log, &[channel(&[Receives::Output])]), 0);
        assert_eq!(count(&log, std::slice::from_ref(&failures)), 1);
        // `all` is owed both events, `out` the failure.
        assert_eq!(count(&log, &both), 3);
        // Deliveries are made one at a time; each intent is owed until its
        // outcome, and a delivery given up is owed no more.
        while let Some(next) = owed(&log, &both) {
            let before = count(&log, &both);
            log.push(Event::DeliveryIntent(next.intent.clone()));
            assert_eq!(count(&log, &both), before, "an intent is still owed");
            let channel = both.iter().find(|c| c.name == next.intent.channel).unwrap();
            let error = (next.intent.channel == "out").then(|| DeliveryError::Denied {
                message: "no".into(),
            });
            log.push(settle(&next, channel, error, receipt(1), 0));
            assert_eq!(count(&log, &both), before - 1);
        }
        assert_eq!(count(&log, &both), 0);
        let state = fold(&log).unwrap();
        assert_eq!(
            (state.deliveries.completed, state.deliveries.failed),
            (2, 1)
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = channel(&[Receives::Output]);
        assert_eq!(
            (1..=5).map(|a| c.backoff_ms(a)).collect::<Vec<_>>(),
            vec![100, 200, 250, 250, 250]
        );
        assert_eq!(c.backoff_ms(u32::MAX), 250);
    }

    #[test]
    fn retryable_errors_are_the_transient_ones() {
        let rejected = |status| DeliveryError::Rejected {
            status,
            message: "no".into(),
        };
        assert!(rejected(503).is_retryable());
        assert!(rejected(429).is_retryable());
        assert!(!rejected(400).is_retryable());
        assert!(
            DeliveryError::Failed {
                message: "disk".into(),
                retryable: true
            }
            .is_retryable()
        );
        assert!(
            !DeliveryError::Failed {
                message: "bad".into(),
                retryable: false
            }
            .is_retryable()
        );
        assert!(
            !DeliveryError::Denied {
                message: "no".into()
            }
            .is_retryable()
        );
        assert!(
            DeliveryError::LeaseFailed {
                outcome: Outcome::Trap,
                message: "boom".into()
            }
            .is_retryable()
        );
        assert!(
            !DeliveryError::LeaseFailed {
                outcome: Outcome::Refused,
                message: "mount".into()
            }
            .is_retryable()
        );
    }
}
