//! What a run owes its channels, from its log and its folded state: the
//! next delivery to make ([`next_delivery`]) and how many are owed
//! ([`owed_count`], written into the run's listing so workers find a
//! finished run whose deliveries a dead worker left). The channels' own
//! rules (what each receives, the backoff) are `channels.rs`'s.

use serde_json::json;

use super::RunState;
use crate::channels::{Channel, Delivery, Receives};
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
