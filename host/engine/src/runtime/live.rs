//! Live runs: what this process knows about a run it drives or watches
//! (`Live`): the subscribers' bounded broadcast ([`RunUpdate`],
//! [`RunUpdates`]; a slow subscriber lags, it never blocks the run), and
//! the driver running here, with what
//! [`Runtime::cancel`](super::Runtime::cancel) asks of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{Inner, Runtime};
use crate::events::Event;
use crate::ids::RunId;

/// What a subscriber receives.
#[derive(Clone, Debug, PartialEq)]
pub enum RunUpdate {
    /// An event was appended at `seq`.
    Event {
        /// Its position, from 1.
        seq: u64,
        /// The event.
        event: Arc<Event>,
    },
    /// Text streamed by the model, not yet recorded (the completion event
    /// records the whole text).
    TextDelta {
        /// The model call's step.
        step: u32,
        /// The text.
        text: String,
    },
    /// The subscriber fell behind and missed this many updates; it can load
    /// the events it missed from the store.
    Lagged {
        /// Updates missed.
        missed: u64,
    },
}

/// Updates buffered per run for slow subscribers before they lag.
const SUBSCRIBER_BUFFER: usize = 256;

/// A run this process knows about: its subscribers, and its driver if one
/// is running here.
pub(super) struct Live {
    pub(super) updates: broadcast::Sender<RunUpdate>,
    pub(super) driver: Option<Driver>,
}

pub(super) struct Driver {
    pub(super) cancel: CancellationToken,
    pub(super) reason: Arc<Mutex<Cancellation>>,
    pub(super) done: watch::Receiver<bool>,
}

impl Runtime {
    /// Every event appended to the run from now on, plus the model's text
    /// deltas as they stream. A slow subscriber never blocks the run: it
    /// gets [`RunUpdate::Lagged`] and can load what it missed.
    pub fn subscribe(&self, run_id: &RunId) -> RunUpdates {
        let receiver = self.live_entry(run_id, |l| l.updates.subscribe());
        RunUpdates {
            receiver,
            runtime: Arc::downgrade(&self.inner),
            run_id: run_id.clone(),
        }
    }

    pub(super) fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Live>> {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live_entry<R>(&self, run_id: &RunId, f: impl FnOnce(&mut Live) -> R) -> R {
        let mut live = self.lock_live();
        let entry = live.entry(run_id.clone()).or_insert_with(|| Live {
            updates: broadcast::channel(SUBSCRIBER_BUFFER).0,
            driver: None,
        });
        f(entry)
    }

    pub(super) fn publish(&self, run_id: &RunId, seq: u64, event: Event) {
        self.send(
            run_id,
            RunUpdate::Event {
                seq,
                event: Arc::new(event),
            },
        );
    }

    pub(super) fn send(&self, run_id: &RunId, update: RunUpdate) {
        let live = self.lock_live();
        if let Some(l) = live.get(run_id) {
            // No receivers is fine: nobody is watching.
            let _ = l.updates.send(update);
        }
    }

    pub(super) fn register_driver(&self, run_id: &RunId) -> DriverHandle {
        let cancel = CancellationToken::new();
        let reason = Arc::new(Mutex::new(Cancellation::default()));
        let (done_tx, done_rx) = watch::channel(false);
        self.live_entry(run_id, |l| {
            l.driver = Some(Driver {
                cancel: cancel.clone(),
                reason: Arc::clone(&reason),
                done: done_rx,
            })
        });
        DriverHandle {
            cancel,
            reason,
            done: done_tx,
        }
    }

    pub(super) fn unregister_driver(&self, run_id: &RunId) {
        let mut live = self.lock_live();
        if let Some(l) = live.get_mut(run_id) {
            l.driver = None;
            if l.updates.receiver_count() == 0 {
                live.remove(run_id);
            }
        }
    }
}

/// What the driver of one run holds.
pub(super) struct DriverHandle {
    pub(super) cancel: CancellationToken,
    pub(super) reason: Arc<Mutex<Cancellation>>,
    pub(super) done: watch::Sender<bool>,
}

/// What a [`Runtime::cancel`] asked of the driver it interrupts, for the
/// event the driver records when it stops.
#[derive(Clone, Debug, Default)]
pub(super) struct Cancellation {
    pub(super) reason: Option<String>,
    pub(super) by: Option<String>,
}

impl Drop for DriverHandle {
    fn drop(&mut self) {
        let _ = self.done.send(true);
    }
}

/// The updates of one run, as a stream. Dropping it unsubscribes.
pub struct RunUpdates {
    receiver: broadcast::Receiver<RunUpdate>,
    runtime: std::sync::Weak<Inner>,
    run_id: RunId,
}

impl std::fmt::Debug for RunUpdates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunUpdates")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl Drop for RunUpdates {
    fn drop(&mut self) {
        // The last subscriber of a run nobody drives here takes the run's
        // channel with it.
        if let Some(inner) = self.runtime.upgrade() {
            let mut live = inner.live.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(l) = live.get(&self.run_id)
                && l.driver.is_none()
                && l.updates.receiver_count() <= 1
            {
                live.remove(&self.run_id);
            }
        }
    }
}

impl RunUpdates {
    /// The next update, or `None` once the runtime is gone.
    pub async fn next(&mut self) -> Option<RunUpdate> {
        match self.receiver.recv().await {
            Ok(update) => Some(update),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(RunUpdate::Lagged { missed }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}
