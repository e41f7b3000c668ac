//! What a run owes its channels, from its log and its folded state: the
//! next delivery to make ([`next_delivery`]) and how many are owed
//! ([`owed_count`], written into the run's listing so workers find a
//! finished run whose deliveries a dead worker left); and the fold's
//! delivery lane (`check_delivery`, `update_delivery`): one delivery in
//! flight at a time, each channel's intents in log order. The channels' own
//! rules (what each receives, the backoff) are `channels.rs`'s.

use serde_json::json;

use super::{FoldProblem, RunState};
use crate::channels::{Channel, Delivery, InFlightDelivery, Receives};
use crate::events::{DeliveryIntent, Event};

/// The delivery the run owes next, from its log `events` (folded into
/// `state`) and the agent's `channels`: the one in flight, else (unless a
/// model or tool call is in flight) the earliest event some channel
/// receives and has no intent for yet (ties in channel name order).
/// `agent` is the agent's name, put in payloads.
pub fn next_delivery(
    events: &[Event],
    state: &RunState,
    agent: &str,
    channels: &[Channel],
) -> Option<Delivery> {
    if let Some(d) = &state.deliveries.in_flight {
        return Some(Delivery {
            intent: d.intent.clone(),
            attempt: d.failed_attempts + 1,
            recorded: true,
            not_before_ms: d.retry_at_ms,
        });
    }
    if state.terminal.is_none() && state.effect_in_flight() {
        // A model or tool call is settled first.
        return None;
    }
    let mut best: Option<(u64, &Channel, &'static str)> = None;
    for channel in channels {
        let from = state
            .deliveries
            .cursors
            .get(&channel.name)
            .map_or(0, |c| c + 1);
        let until = best.map_or(events.len() as u64, |(p, ..)| p);
        let next = if channel.receives.contains(&Receives::Events) {
            // Almost every event is received: the scan stops at once.
            (from..until).find(|&p| channel.kind_for(&events[p as usize]).is_some())
        } else {
            // Only notable events are received: look them up, so a step
            // costs no scan of the log.
            let notable = &state.deliveries.notable;
            let start = notable.partition_point(|&(p, _)| p < from);
            notable[start..]
                .iter()
                .take_while(|&&(p, _)| p < until)
                .find(|(_, group)| channel.receives.contains(group))
                .map(|&(p, _)| p)
        };
        if let Some(position) = next {
            let kind = channel
                .kind_for(&events[position as usize])
                .expect("the position was found by the channel's own rule");
            best = Some((position, channel, kind));
        }
    }
    let (position, channel, kind) = best?;
    let event = &events[position as usize];
    let payload = json!({
        "agent": agent,
        "position": position,
        "event": event,
    });
    Some(Delivery {
        intent: DeliveryIntent {
            delivery_id: format!("{}/{}/{position}", state.run_id, channel.name),
            channel: channel.name.clone(),
            source: position,
            kind: kind.to_owned(),
            payload,
        },
        attempt: 1,
        recorded: false,
        not_before_ms: None,
    })
}

/// How many deliveries the run owes now, from the same inputs as
/// [`next_delivery`]: its delivery in flight, plus (unless a model or tool
/// call is in flight) every event some channel receives after the last one
/// it was given an intent for. 0 exactly when [`next_delivery`] is `None`,
/// so a run listed as owing deliveries is one a driver has work for.
pub fn owed_count<'a, I>(events: I, state: &RunState, channels: &[Channel]) -> u32
where
    I: IntoIterator<Item = &'a Event>,
    I::IntoIter: Clone,
{
    let events = events.into_iter();
    let in_flight = u32::from(state.deliveries.in_flight.is_some());
    if state.terminal.is_none() && state.effect_in_flight() {
        return in_flight;
    }
    let pending: usize = channels
        .iter()
        .map(|channel| {
            let from = state
                .deliveries
                .cursors
                .get(&channel.name)
                .map_or(0, |c| c + 1);
            if channel.receives.contains(&Receives::Events) {
                events
                    .clone()
                    .skip(from as usize)
                    .filter(|e| channel.kind_for(e).is_some())
                    .count()
            } else {
                // Only notable events are received: count them from the
                // fold's index, without a scan of the log.
                let notable = &state.deliveries.notable;
                let start = notable.partition_point(|&(p, _)| p < from);
                notable[start..]
                    .iter()
                    .filter(|(_, group)| channel.receives.contains(group))
                    .count()
            }
        })
        .sum();
    in_flight.saturating_add(u32::try_from(pending).unwrap_or(u32::MAX))
}

impl RunState {
    /// Applies a checked delivery event.
    pub(super) fn update_delivery(&mut self, event: &Event) {
        match event {
            Event::DeliveryIntent(intent) => {
                self.deliveries
                    .cursors
                    .insert(intent.channel.clone(), intent.source);
                self.deliveries.in_flight = Some(InFlightDelivery {
                    intent: intent.clone(),
                    failed_attempts: 0,
                    retry_at_ms: None,
                });
            }
            Event::DeliveryAttemptFailed(f) => {
                if let Some(d) = &mut self.deliveries.in_flight {
                    d.failed_attempts += 1;
                    d.retry_at_ms = Some(f.retry_at_ms);
                }
            }
            Event::DeliveryCompleted(_) => {
                self.deliveries.in_flight = None;
                self.deliveries.completed += 1;
            }
            Event::DeliveryFailed(_) => {
                self.deliveries.in_flight = None;
                self.deliveries.failed += 1;
            }
            _ => unreachable!("`update` dispatches only these events here"),
        }
    }

    /// Delivery events: allowed after a terminal event and while parked;
    /// one delivery in flight at a time, never beside a model call or a
    /// tool call that may still complete (a dangling write may: it waits
    /// for a human); each channel's intents in log order, each reporting an
    /// earlier event, with the id derived from run, channel and position;
    /// attempts counted from 1.
    pub(super) fn check_delivery(&self, event: &Event) -> Result<(), FoldProblem> {
        let mismatch = |delivery_id: &str, reason: String| FoldProblem::DeliveryMismatch {
            delivery_id: delivery_id.to_owned(),
            reason,
        };
        let (delivery_id, attempt) = match event {
            Event::DeliveryIntent(intent) => {
                if let Some(d) = &self.deliveries.in_flight {
                    return Err(FoldProblem::DeliveryInFlight {
                        delivery_id: d.intent.delivery_id.clone(),
                    });
                }
                if self.terminal.is_none() && self.effect_in_flight() {
                    self.nothing_in_flight()?;
                }
                let id = &intent.delivery_id;
                if intent.source >= self.event_count as u64 {
                    return Err(mismatch(
                        id,
                        format!(
                            "it reports position {}, which is not before it",
                            intent.source
                        ),
                    ));
                }
                if let Some(&last) = self.deliveries.cursors.get(&intent.channel)
                    && intent.source <= last
                {
                    return Err(mismatch(
                        id,
                        format!(
                            "channel `{}` was already given position {last}",
                            intent.channel
                        ),
                    ));
                }
                let expected = format!("{}/{}/{}", self.run_id, intent.channel, intent.source);
                if *id != expected {
                    return Err(mismatch(id, format!("the id must be `{expected}`")));
                }
                if !intent.payload.is_object() {
                    return Err(mismatch(id, "the payload must be a JSON object".into()));
                }
                return Ok(());
            }
            Event::DeliveryAttemptFailed(f) => (&f.delivery_id, f.attempt),
            Event::DeliveryCompleted(c) => (&c.delivery_id, c.attempt),
            Event::DeliveryFailed(f) => (&f.delivery_id, f.attempts),
            _ => unreachable!("check_delivery sees delivery events"),
        };
        match &self.deliveries.in_flight {
            Some(d) if d.intent.delivery_id == *delivery_id => {
                if attempt != d.failed_attempts + 1 {
                    return Err(mismatch(
                        delivery_id,
                        format!(
                            "expected attempt {}, found {attempt}",
                            d.failed_attempts + 1
                        ),
                    ));
                }
                Ok(())
            }
            _ => Err(mismatch(
                delivery_id,
                "no such delivery is in flight".into(),
            )),
        }
    }
}
