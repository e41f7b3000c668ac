//! The log of one run as a driver holds it (`Log`: its events, folded
//! state and claim, and the events held for the next write, `Held`):
//! loading it (decoded, its session history resolved, checked against the
//! witness and the agent's digest), and appending to it (each append
//! expects the log's length and carries the driver's claim; which ride
//! with the next write and which are deferred: "Durability" in
//! `runtime.rs`); and [`verify_log`], the full check of a stored log.

use std::sync::Arc;

use bytes::Bytes;

use super::Runtime;
use super::error::RuntimeError;
use super::session::resolve_history;
use crate::agent::Agent;
use crate::channels::Channel;
use crate::events::{Event, decode, encode_readable};
use crate::ids::{AgentDigest, CallId, RunId};
use crate::prompt::PromptCache;
use crate::replay::ReplayError;
use crate::state::{Parked, RunState, fold, owed_count};
use crate::status::RunStatus;
use warden_sandbox::ValidUntil;
use warden_store::{
    ChainBreak, Claim, Durability, EventStore, Finding, Listing, Settlement, SettlingAppend,
    StoreError, StoredEvent, VerifyReport,
};

/// A full check of one run's log: the store's chain check, then, when the
/// chain holds, every event decoded (an event that does not decode is a
/// finding: the run could not be shown, driven or recovered).
pub async fn verify_log(
    store: &dyn EventStore,
    run_id: &RunId,
) -> Result<VerifyReport, StoreError> {
    let mut report = store.verify(run_id).await?;
    if report.is_intact() {
        let stored = store.load(run_id).await?;
        let mut first = None;
        for event in &stored {
            match decode(&event.bytes) {
                Ok(decoded) if event.seq == 1 => first = Some(decoded),
                Ok(_) => {}
                Err(error) => report.findings.push(Finding {
                    seq: event.seq,
                    kind: ChainBreak::Unreadable {
                        detail: format!("the event does not decode: {error}"),
                    },
                }),
            }
        }
        // The session history the first event names is part of what the
        // run recorded: it must come back whole and unaltered.
        if let Some(event) = first {
            match resolve_history(store, &mut [event]).await {
                Ok(()) => {}
                Err(error @ StoreError::HistoryBroken { .. }) => report.findings.push(Finding {
                    seq: 1,
                    kind: ChainBreak::Unreadable {
                        detail: format!("its session history cannot be read back: {error}"),
                    },
                }),
                Err(error) => return Err(error),
            }
        }
    }
    Ok(report)
}

/// A log whose run is another run (its only event is a source's first,
/// copied by a fork that did not finish) is never driven or changed.
pub(super) fn refuse_unfinished_fork(run_id: &RunId, state: &RunState) -> Result<(), RuntimeError> {
    if state.run_id != *run_id {
        return Err(RuntimeError::UnfinishedFork {
            run_id: run_id.clone(),
            source_run: state.run_id.clone(),
        });
    }
    Ok(())
}

/// The bytes to store for `event`, or the typed refusal of an event that
/// could not be read back.
pub(super) fn recordable(run_id: &RunId, event: &Event) -> Result<Bytes, RuntimeError> {
    encode_readable(event)
        .map(Bytes::from)
        .map_err(|error| RuntimeError::Unrecordable {
            run_id: run_id.clone(),
            error,
        })
}

/// The log of one run as a driver holds it: events and folded state.
pub(super) struct Log {
    pub(super) run_id: RunId,
    pub(super) events: Vec<Event>,
    pub(super) state: RunState,
    /// The claim every append of this driver carries (issue 9: a driver
    /// under a claim writes only while its claim is the run's newest). A
    /// child run's driver carries its parent's (issue 36): the claim of the
    /// run at the top of the tree, which the worker holds and renews.
    pub(super) fence: Option<Claim>,
    /// This driver's own view of that claim (issue 15): once it has passed,
    /// the driver makes no further effect (every lease it starts carries
    /// it) and appends nothing.
    pub(super) valid: Option<ValidUntil>,
    /// The agent's channels, when this process knows the agent (a driver,
    /// or a verb on a run whose agent it prepared): every append writes how
    /// many deliveries the run owes into its listing. `None`: only the
    /// delivery in flight is counted.
    pub(super) channels: Option<Arc<[Channel]>>,
    /// The next model request's messages and hash, kept as the state's
    /// conversation grows (so a long run's model call does not rebuild
    /// them whole).
    pub(super) prompt: PromptCache,
    /// Events folded and in `events` but not yet in the store: they ride
    /// with the next write (see "Durability" in the module docs).
    pub(super) held: Held,
    /// What the runtime's witness found wrong with the log as loaded, if
    /// anything: every write refuses it (issue 36).
    pub(super) rolled_back: Option<String>,
}

impl Log {
    /// The claim this driver holds and its view of it, for a child it
    /// drives (`runtime/children.rs`).
    pub(super) fn claimed(&self) -> Option<(Claim, ValidUntil)> {
        self.fence.clone().zip(self.valid.clone())
    }
}

/// The trailing events of a [`Log`] not yet written, encoded, and how
/// durable the write that carries them must be.
#[derive(Default)]
pub(super) struct Held {
    pub(super) bytes: Vec<Bytes>,
    /// Whether a held event must be on disk before the next effect starts
    /// (a write's completion); otherwise they may be deferred.
    pub(super) synced: bool,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The durability of a write carrying these events and new ones that
    /// ask for `asked`: synced if either is.
    fn durability(&self, asked: Durability) -> Durability {
        if self.synced {
            Durability::Synced
        } else {
            asked
        }
    }
}

impl Runtime {
    /// The run's decoded events, its session history resolved.
    pub(super) async fn load_events(&self, run_id: &RunId) -> Result<Vec<Event>, RuntimeError> {
        Ok(self.load_witnessed(run_id).await?.0)
    }

    /// [`load_events`](Self::load_events), and what the runtime's witness
    /// finds wrong with the stored log, if anything.
    pub(super) async fn load_witnessed(
        &self,
        run_id: &RunId,
    ) -> Result<(Vec<Event>, Option<String>), RuntimeError> {
        let store = self.inner.store.as_ref();
        let stored = store.load(run_id).await?;
        let rolled_back = self.witness_problem(run_id, &stored);
        let mut events = decoded(run_id, &stored)?;
        resolve_history(store, &mut events).await?;
        Ok((events, rolled_back))
    }

    /// What the runtime's witness finds wrong with `run_id`'s stored log.
    pub(super) fn witness_problem(&self, run_id: &RunId, stored: &[StoredEvent]) -> Option<String> {
        self.inner
            .witness
            .as_ref()
            .and_then(|w| w.problem(run_id, stored))
    }

    /// [`RuntimeError::RolledBack`] when the runtime's witness finds
    /// `problem` with `run_id`.
    pub(super) fn refuse_rolled_back(
        &self,
        run_id: &RunId,
        problem: Option<&String>,
    ) -> Result<(), RuntimeError> {
        match (problem, &self.inner.witness) {
            (Some(problem), Some(witness)) => Err(RuntimeError::RolledBack {
                run_id: run_id.clone(),
                witness: witness.source().to_owned(),
                problem: problem.clone(),
            }),
            _ => Ok(()),
        }
    }

    pub(super) async fn load_log(&self, run_id: &RunId) -> Result<Log, RuntimeError> {
        let (events, rolled_back) = self.load_witnessed(run_id).await?;
        let state = fold(&events).map_err(|error| RuntimeError::Fold {
            run_id: run_id.clone(),
            error,
        })?;
        refuse_unfinished_fork(run_id, &state)?;
        let channels = self.known_channels(&state.agent_digest);
        Ok(Log {
            run_id: run_id.clone(),
            events,
            state,
            fence: None,
            valid: None,
            channels,
            prompt: PromptCache::new(),
            held: Held::default(),
            rolled_back,
        })
    }

    /// Appends `new` to the log: folded first (an impossible event is a bug
    /// and is refused before it is written), then written with the length
    /// the log had, then published.
    pub(super) async fn append(&self, log: &mut Log, new: Vec<Event>) -> Result<(), RuntimeError> {
        self.append_with(log, new, None).await
    }

    /// [`append`](Self::append), its sync deferred to the store's next
    /// synced write ([`Durability::Deferred`]): only for events whose loss
    /// in a machine crash the run repairs by doing the same again (see
    /// "Durability" in the module docs).
    pub(super) async fn append_deferred(
        &self,
        log: &mut Log,
        new: Vec<Event>,
    ) -> Result<(), RuntimeError> {
        self.write(log, new, None, Durability::Deferred).await
    }

    /// [`append`](Self::append), settling an idempotency commitment in the
    /// same transaction when `settlement` is given.
    pub(super) async fn append_with(
        &self,
        log: &mut Log,
        new: Vec<Event>,
        settlement: Option<&Settlement>,
    ) -> Result<(), RuntimeError> {
        self.write(log, new, settlement, Durability::Synced).await
    }

    /// Folds `event` into the log and holds it for the log's next write,
    /// which carries it as durable as `needs` says at least. Only for an
    /// event after which the run decides before it starts any effect: the
    /// next step writes first or [flushes](Self::flush) (`step_once`), and
    /// every end of a drive flushes.
    pub(super) fn hold(
        &self,
        log: &mut Log,
        event: Event,
        needs: Durability,
    ) -> Result<(), RuntimeError> {
        still_valid(log)?;
        let bytes = recordable(&log.run_id, &event)?;
        log.state
            .apply(&event)
            .map_err(|error| RuntimeError::Fold {
                run_id: log.run_id.clone(),
                error,
            })?;
        log.events.push(event);
        log.held.bytes.push(bytes);
        log.held.synced |= needs == Durability::Synced;
        Ok(())
    }

    /// Writes what the log holds, if anything, as durable as it needs.
    pub(super) async fn flush(&self, log: &mut Log) -> Result<(), RuntimeError> {
        if log.held.is_empty() {
            return Ok(());
        }
        self.write(log, Vec::new(), None, Durability::Deferred)
            .await
    }

    /// Folds `new` into the log's state and writes it after what the log
    /// holds, as durable as `durability` or the held events say.
    async fn write(
        &self,
        log: &mut Log,
        new: Vec<Event>,
        settlement: Option<&Settlement>,
        durability: Durability,
    ) -> Result<(), RuntimeError> {
        // A driver past its own view of its claim records nothing more:
        // what it would record may come from a lease the sandbox stopped.
        still_valid(log)?;
        // Nor does anyone on a log its witness says was rolled back: this
        // is the one write path, and every effect is preceded by a write
        // (its intent), so no verb of any front end drives such a run.
        self.refuse_rolled_back(&log.run_id, log.rolled_back.as_ref())?;
        // Encode and fold first: an event that could not be read back, or
        // an impossible one, is refused before it is written. One event (the
        // usual case) is folded in place, without copying the state and its
        // conversation; `apply` leaves the state unchanged when it refuses.
        let encoded = new
            .iter()
            .map(|e| recordable(&log.run_id, e))
            .collect::<Result<Vec<Bytes>, _>>()?;
        let fold_error = |error| RuntimeError::Fold {
            run_id: log.run_id.clone(),
            error,
        };
        match new.as_slice() {
            [] => {}
            [event] => log.state.apply(event).map_err(fold_error)?,
            _ => {
                let mut state = log.state.clone();
                for event in &new {
                    state.apply(event).map_err(fold_error)?;
                }
                log.state = state;
            }
        }
        let held = std::mem::take(&mut log.held);
        let durability = held.durability(durability);
        let mut bytes = held.bytes;
        let held = bytes.len();
        bytes.extend(encoded);
        let expected = (log.events.len() - held) as u64;
        let (status, now) = (log.state.status(), self.inner.clock.now_ms() as i64);
        let mut listing = Listing::new(status.listing())
            .owing(Self::owed(log, &new, status))
            .waking_at(log.state.waiting().map(|w| w.until_ms as i64));
        if durability == Durability::Deferred {
            listing = listing.deferred();
        }
        let store = &self.inner.store;
        let written = match (settlement, &log.fence) {
            (None, None) => {
                store
                    .append(&log.run_id, expected, &bytes, listing, now)
                    .await
            }
            (None, Some(claim)) => {
                store
                    .append_fenced_to(&log.run_id, claim, expected, &bytes, listing, now)
                    .await
            }
            (Some(s), fence) => {
                store
                    .append_settling(
                        SettlingAppend::new(&log.run_id, expected, &bytes, s)
                            .fenced(fence.as_ref())
                            .listing(listing)
                            .at(now),
                    )
                    .await
            }
        };
        if let Err(error) = written {
            // The state is ahead of the store: take the store's word again
            // (what was held is gone, as in a crash), so a caller that goes
            // on with this log sees what is recorded.
            if let Ok(fresh) = self.load_log(&log.run_id).await {
                log.events = fresh.events;
                log.state = fresh.state;
                log.prompt = fresh.prompt;
            }
            return Err(error.into());
        }
        let first_held = log.events.len() - held;
        for (i, event) in log.events[first_held..].iter().enumerate() {
            self.publish(&log.run_id, expected + 1 + i as u64, event.clone());
        }
        for (i, event) in new.into_iter().enumerate() {
            let seq = expected + 1 + (held + i) as u64;
            log.events.push(event.clone());
            self.publish(&log.run_id, seq, event);
        }
        Ok(())
    }

    /// How many deliveries the run owes once `new` is appended to `log`
    /// (whose state already folded `new`), for its listing: counted only
    /// when the run waits or is finished (a running run is claimable
    /// anyway, and counting would scan its log on every step); with the
    /// agent's channels unknown, only the delivery in flight.
    fn owed(log: &Log, new: &[Event], status: RunStatus) -> u32 {
        if status == RunStatus::Running {
            return 0;
        }
        match &log.channels {
            Some(channels) => owed_count(log.events.iter().chain(new), &log.state, channels),
            None => u32::from(log.state.deliveries.in_flight.is_some()),
        }
    }

    /// The channels of the agent with `digest`, if this runtime prepared it.
    fn known_channels(&self, digest: &AgentDigest) -> Option<Arc<[Channel]>> {
        self.inner
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .map(|p| p.view.channels.clone().into())
    }

    pub(super) fn check_digest(
        &self,
        log: &Log,
        agent: &Agent,
        accept: bool,
    ) -> Result<(), RuntimeError> {
        if !accept && log.state.agent_digest != agent.digest {
            return Err(RuntimeError::Replay {
                run_id: log.run_id.clone(),
                error: ReplayError::AgentChanged {
                    agent: agent.name.clone(),
                    recorded: log.state.agent_digest.clone(),
                    current: agent.digest.clone(),
                },
            });
        }
        Ok(())
    }

    pub(super) fn refuse_terminal(&self, log: &Log) -> Result<(), RuntimeError> {
        let status = log.state.status();
        if status.is_terminal() {
            return Err(RuntimeError::AlreadyTerminal {
                run_id: log.run_id.clone(),
                status,
            });
        }
        Ok(())
    }

    pub(super) async fn awaiting_approval(
        &self,
        run_id: &RunId,
        call_id: &CallId,
    ) -> Result<Log, RuntimeError> {
        let log = self.load_log(run_id).await?;
        self.refuse_terminal(&log)?;
        match log.state.parked() {
            Some(Parked::Approval { call }) if &call.call_id == call_id => Ok(log),
            Some(Parked::Approval { call }) => Err(RuntimeError::NotAwaitingApproval {
                run_id: run_id.clone(),
                call_id: call_id.clone(),
                awaiting: call.call_id.to_string(),
            }),
            _ => Err(RuntimeError::NotParked {
                run_id: run_id.clone(),
                status: log.state.status(),
                needed: "awaiting_approval",
            }),
        }
    }
}

/// The events of `run_id`'s stored log, decoded; an event that does not
/// decode is [`RuntimeError::Log`] naming its position.
pub(super) fn decoded(run_id: &RunId, stored: &[StoredEvent]) -> Result<Vec<Event>, RuntimeError> {
    stored
        .iter()
        .map(|s| {
            decode(&s.bytes).map_err(|error| RuntimeError::Log {
                run_id: run_id.clone(),
                seq: s.seq,
                error,
            })
        })
        .collect()
}

/// [`RuntimeError::ClaimExpired`] once the driver's view of its claim has
/// passed.
pub(super) fn still_valid(log: &Log) -> Result<(), RuntimeError> {
    match &log.valid {
        Some(valid) if !valid.is_valid() => Err(RuntimeError::ClaimExpired {
            run_id: log.run_id.clone(),
        }),
        _ => Ok(()),
    }
}
