//! Lease threads: where a lease that holds filesystem handles runs, and
//! the account of those stuck in a call that never returns.
//!
//! A filesystem call can block for as long as the file decides: a FUSE or
//! network file whose server never answers, a `/proc` file that waits for
//! data. Handed to a shared pool (tokio's blocking pool, as wasmtime-wasi
//! does by default), each such call holds a pool thread past its lease, and
//! a plugin that makes them again and again fills the pool that everything
//! else in the process waits on. Handing every small call to another thread
//! and waiting for it is also most of what a short filesystem lease costs.
//!
//! So a lease with mounts runs whole on a thread of its own, taken from
//! here: its filesystem calls run on that thread, inline (wasmtime-wasi's
//! `allow_blocking_current_thread` on each of its descriptors, and the
//! host's own calls in `fs.rs`), and the lease's future is polled there
//! with the caller's runtime handle (timers and network are the runtime's).
//! What that bounds:
//!
//! - **Per lease**: one thread, the lease's own; a lease cannot have two
//!   filesystem calls in flight.
//! - **Per process**: the lease slots (`SandboxConfig::max_concurrent_leases`),
//!   taken before a lease is handed over and held by its thread until the
//!   lease has ended, stuck or not: never more lease threads than slots.
//! - **Per plugin**: a plugin (its component with its mounts: the same
//!   code granted another directory is another plugin here) holds at most
//!   [`THREADS_PER_PLUGIN`] lease threads, running or stuck; its next lease
//!   waits for one until its own deadline. A lease whose thread has not
//!   come back by its deadline (or its cancellation, or its validity's end)
//!   plus [`GRACE`] is abandoned: the caller gets the failure at once, and
//!   the thread, counted as stuck, keeps its place until it returns. Once
//!   every place of a plugin is held by a stuck thread, its leases with
//!   mounts are refused at once, naming why. So one plugin whose files
//!   never answer cannot take the slots every other plugin needs.
//!
//! Threads are made on demand and kept for [`IDLE`] once they have nothing
//! to do. A stuck thread never blocks the process's exit: these are plain
//! threads that no one joins.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// How long the caller waits for a lease's thread past the moment the lease
/// should have stopped (its deadline, its cancellation, its validity's end)
/// before it gives up on it: room for the lease to notice at its next
/// epoch tick or await, drop its store and clear what it left.
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// Most lease threads one plugin may hold at once, running or stuck
/// (abandoned and not yet returned).
pub(crate) const THREADS_PER_PLUGIN: usize = 8;

/// How long an idle lease thread is kept for the next lease.
const IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// The lease threads of one sandbox and its account of stuck ones.
#[derive(Default)]
pub(crate) struct LeaseThreads {
    /// Threads waiting for a job: each one's id and the sending end of its
    /// own queue. A job is sent to exactly one thread, taken from here.
    idle: Mutex<Vec<(u64, mpsc::Sender<Job>)>>,
    next_id: AtomicU64,
    /// Each plugin's places and stuck threads.
    plugins: Mutex<HashMap<Owner, Share>>,
}

/// Whose lease runs on a thread: the plugin's name and the identity
/// (device, inode) of each directory it mounts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    pub(crate) plugin: Arc<str>,
    pub(crate) mounts: Vec<(u64, u64)>,
}

/// One plugin's share of the lease threads.
struct Share {
    /// [`THREADS_PER_PLUGIN`] places; a job holds one until it returns.
    places: Arc<tokio::sync::Semaphore>,
    /// Threads abandoned by their lease and not yet returned.
    stuck: usize,
}

impl Default for Share {
    fn default() -> Self {
        Share {
            places: Arc::new(tokio::sync::Semaphore::new(THREADS_PER_PLUGIN)),
            stuck: 0,
        }
    }
}

/// Why a lease's thread was abandoned, or never started: what stopped the
/// lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Deadline,
    Cancelled,
    Expired,
}

/// A lease that did not run to its end on a lease thread.
#[derive(Debug)]
pub(crate) enum Abandoned {
    /// Its thread did not come back in time.
    Stopped(Stop),
    /// It stopped while waiting for a place among its plugin's threads, or
    /// for a lease slot.
    NoPlace(Stop),
    /// Every place of its plugin is held by a stuck thread.
    Refused { stuck: usize },
}

/// What the caller and the lease's thread share about one job.
#[derive(Default)]
struct Flight {
    done: bool,
    abandoned: bool,
}

impl LeaseThreads {
    /// Runs `work` on a lease thread, once `owner` has a place for it and
    /// then one of `slots` is free (so that leases waiting for their
    /// plugin's places hold no slot another plugin needs), and waits for it until `stop` says the lease should be over, then
    /// [`GRACE`] more; past that the thread is abandoned and counted as
    /// stuck against `owner` until it returns. A panic in `work` is resumed
    /// here. If this future is dropped before `work` returns, the thread is
    /// accounted the same way.
    pub(crate) async fn run<R: Send + 'static>(
        self: &Arc<Self>,
        owner: Owner,
        slots: Arc<tokio::sync::Semaphore>,
        work: impl FnOnce() -> R + Send + 'static,
        stop: impl Future<Output = Stop>,
    ) -> Result<R, Abandoned> {
        let places = {
            let mut plugins = self.plugins.lock().expect("never poisoned");
            let share = plugins.entry(owner.clone()).or_default();
            if share.stuck >= THREADS_PER_PLUGIN {
                return Err(Abandoned::Refused { stuck: share.stuck });
            }
            Arc::clone(&share.places)
        };
        let mut stop = std::pin::pin!(stop);
        let held = async {
            let place = places.acquire_owned().await;
            let slot = slots.acquire_owned().await;
            (place, slot)
        };
        let (place, slot) = tokio::select! {
            biased;
            (place, slot) = held => (
                place.expect("a plugin's places are never closed"),
                slot.expect("the lease semaphore is never closed"),
            ),
            stop = &mut stop => return Err(Abandoned::NoPlace(stop)),
        };
        let plugin = owner;
        let flight = Arc::new(Mutex::new(Flight::default()));
        let (sent, mut answer) = tokio::sync::oneshot::channel();
        let job: Job = {
            let flight = Arc::clone(&flight);
            let threads = Arc::clone(self);
            let plugin = plugin.clone();
            let handed = Instant::now();
            Box::new(move || {
                let _held = (place, slot);
                let result = std::panic::catch_unwind(AssertUnwindSafe(work));
                let abandoned = {
                    let mut flight = flight.lock().expect("never poisoned");
                    flight.done = true;
                    flight.abandoned
                };
                if abandoned {
                    let left = threads.unstick(&plugin);
                    tracing::info!(
                        plugin = &*plugin.plugin,
                        after_ms = handed.elapsed().as_millis() as u64,
                        still_stuck = left,
                        "an abandoned lease's thread returned"
                    );
                }
                let _ = sent.send(result);
            })
        };
        self.dispatch(job);
        let mut waiting = Waiting {
            threads: Arc::clone(self),
            plugin,
            flight,
            received: false,
        };
        let stopped = tokio::select! {
            biased;
            result = &mut answer => Ok(result),
            stop = &mut stop => Err(stop),
        };
        let result = match stopped {
            Ok(result) => result,
            Err(stop) => match tokio::time::timeout(GRACE, &mut answer).await {
                Ok(result) => result,
                Err(_) => return Err(Abandoned::Stopped(stop)),
            },
        };
        waiting.received = true;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            // The job always sends before its sender is dropped, unless the
            // thread itself died: a bug.
            Err(_) => panic!("a lease thread ended without answering"),
        }
    }

    /// Hands `job` to an idle thread, or to a new one.
    fn dispatch(self: &Arc<Self>, mut job: Job) {
        loop {
            let idle = self.idle.lock().expect("never poisoned").pop();
            let Some((_, thread)) = idle else { break };
            match thread.send(job) {
                Ok(()) => return,
                // That thread has exited: try the next.
                Err(mpsc::SendError(returned)) => job = returned,
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let threads = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("warden-lease".to_owned())
            .spawn(move || serve(id, job, threads))
            .expect("the system can start a thread");
    }

    /// Counts one of `owner`'s threads as stuck; returns how many it has.
    fn abandon(&self, owner: &Owner) -> usize {
        let mut plugins = self.plugins.lock().expect("never poisoned");
        let share = plugins.entry(owner.clone()).or_default();
        share.stuck += 1;
        share.stuck
    }

    /// One of `owner`'s stuck threads returned; returns how many are left.
    fn unstick(&self, owner: &Owner) -> usize {
        let mut plugins = self.plugins.lock().expect("never poisoned");
        let Some(share) = plugins.get_mut(owner) else {
            return 0;
        };
        share.stuck = share.stuck.saturating_sub(1);
        share.stuck
    }
}

/// The caller's side of one job: abandons it if dropped before the answer.
struct Waiting {
    threads: Arc<LeaseThreads>,
    plugin: Owner,
    flight: Arc<Mutex<Flight>>,
    received: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.received {
            return;
        }
        let mut flight = self.flight.lock().expect("never poisoned");
        if flight.done || flight.abandoned {
            return;
        }
        flight.abandoned = true;
        let stuck = self.threads.abandon(&self.plugin);
        tracing::warn!(
            plugin = &*self.plugin.plugin,
            stuck,
            most = THREADS_PER_PLUGIN,
            "a lease's thread did not return by its deadline: it is abandoned, and counted \
             as stuck until it returns (with every place stuck, the plugin's leases with \
             mounts are refused)"
        );
    }
}

/// A lease thread: runs `job`, then waits for the next one on a queue of
/// its own, offered in `idle`, and exits after [`IDLE`] without one.
fn serve(id: u64, job: Job, threads: std::sync::Weak<LeaseThreads>) {
    let (offer, queue) = mpsc::channel::<Job>();
    let mut job = Some(job);
    loop {
        if let Some(job) = job.take() {
            job();
        }
        let Some(pool) = threads.upgrade() else {
            return;
        };
        pool.idle
            .lock()
            .expect("never poisoned")
            .push((id, offer.clone()));
        drop(pool);
        match queue.recv_timeout(IDLE) {
            Ok(next) => job = Some(next),
            Err(_) => {
                let Some(pool) = threads.upgrade() else {
                    return;
                };
                let mut idle = pool.idle.lock().expect("never poisoned");
                match idle.iter().position(|(other, _)| *other == id) {
                    // Still offered: withdrawn, and nothing can reach us.
                    Some(at) => {
                        idle.swap_remove(at);
                        return;
                    }
                    // Taken by a dispatcher whose job is on its way.
                    None => {
                        drop(idle);
                        match queue.recv() {
                            Ok(next) => job = Some(next),
                            Err(_) => return,
                        }
                    }
                }
            }
        }
    }
}
