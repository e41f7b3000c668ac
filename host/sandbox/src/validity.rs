//! [`ValidUntil`]: a deadline its holder moves forward while its authority
//! lasts, after which a lease makes no further effect. The sandbox does not
//! know whose authority it stands for (a worker's run lease, say); it only
//! checks it, at every place an effect could start:
//! - when a lease starts: an expired one never runs the guest;
//! - on every host call that changes something outside the guest: opening
//!   a file to write, every write to a file stream, resizing, renaming,
//!   removing, linking, creating directories, setting times,
//!   `keep-permissions`, and every outbound HTTP request and request body
//!   frame (`fs.rs`, `lease.rs`, `net.rs`);
//! - at every epoch tick of guest code, so a guest computing without host
//!   calls is trapped too;
//! - while the lease waits in a host call: the lease ends when the deadline
//!   passes, as at its own deadline.
//!
//! An expired check traps the guest (or, where a trap cannot be returned,
//! refuses the request and marks the lease), and the lease ends with
//! [`LeaseFailure::Expired`](super::LeaseFailure::Expired).
//!
//! An effect another process makes (an MCP server's tool call) is held to
//! the same deadline by [`ValidUntil::fence_process`]: a watchdog process
//! of its own ([`watchdog`]) kills that process once the deadline passes.
//! It is a process, not a task, because the holder may be stopped (SIGSTOP,
//! a debugger) while the process it started goes on: nothing inside the
//! holder runs then. Each extension and revocation is passed to every
//! watchdog as it is made.
//!
//! Time is read from a monotonic clock that keeps counting while the system
//! is suspended (`CLOCK_BOOTTIME` on Linux; elsewhere `Instant`, which on
//! some systems stops during a suspend): a process stopped by SIGSTOP, or a
//! machine that slept, finds its validity over when it wakes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod watchdog;

pub use watchdog::ProcessFence;

/// A point on the sandbox's monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moment(Duration);

impl Moment {
    /// Now.
    pub fn now() -> Moment {
        Moment(clock())
    }

    /// `length` after this moment.
    pub fn after(self, length: Duration) -> Moment {
        Moment(self.0.saturating_add(length))
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn clock() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn clock() -> Duration {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(std::time::Instant::now).elapsed()
}

/// A deadline shared between the holder of an authority, who
/// [`extend`](Self::extend)s it while the authority lasts, and the leases it
/// hands it to, which stop making effects once it passes. Cheap to clone;
/// clones share the deadline.
#[derive(Clone)]
pub struct ValidUntil {
    /// Nanoseconds on the clock; only ever moves forward, except to 0
    /// ([`revoke`](Self::revoke)).
    deadline_ns: Arc<AtomicU64>,
    /// The watchdogs of the processes fenced by it ([`Self::fence_process`]),
    /// told each new deadline; one that ended is dropped at the next.
    watchers: Arc<Mutex<Vec<watchdog::Watcher>>>,
}

impl std::fmt::Debug for ValidUntil {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidUntil")
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl PartialEq for ValidUntil {
    /// The same shared deadline.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.deadline_ns, &other.deadline_ns)
    }
}

impl Eq for ValidUntil {}

impl ValidUntil {
    /// Valid until `deadline`.
    pub fn at(deadline: Moment) -> ValidUntil {
        ValidUntil {
            deadline_ns: Arc::new(AtomicU64::new(nanos(deadline))),
            watchers: Arc::default(),
        }
    }

    /// Valid for `length` from now.
    pub fn for_next(length: Duration) -> ValidUntil {
        ValidUntil::at(Moment::now().after(length))
    }

    /// Moves the deadline to `deadline` if that is later; never earlier,
    /// so a renewal that answers late cannot shorten a newer one. Returns
    /// whether it was still valid when extended: once expired it stays
    /// expired (what was stopped stays stopped).
    pub fn extend(&self, deadline: Moment) -> bool {
        let now = nanos(Moment::now());
        let new = nanos(deadline);
        let extended = self
            .deadline_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                (old > now).then_some(old.max(new))
            })
            .is_ok();
        if extended {
            self.tell_watchers();
        }
        extended
    }

    /// Ends it now.
    pub fn revoke(&self) {
        self.deadline_ns.store(0, Ordering::Release);
        self.tell_watchers();
    }

    /// Passes the deadline as it is now to every live watchdog. Read and
    /// sent under the lock, so two extensions racing cannot leave a
    /// watchdog with the earlier one.
    fn tell_watchers(&self) {
        let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        if watchers.is_empty() {
            return;
        }
        let deadline = self.deadline_ns.load(Ordering::Acquire);
        watchers.retain(|w| w.tell(deadline));
    }

    /// Holds the process `pid` (a child of this process, not yet waited
    /// for, so the id is still its) to this deadline until the returned
    /// fence is dropped: a watchdog process kills it (SIGKILL) once the
    /// deadline passes or is revoked, whether or not this process is
    /// running then. Dropping the fence ends the watchdog and leaves the
    /// process alone. Linux only (elsewhere an `Unsupported` error).
    pub fn fence_process(&self, pid: u32) -> std::io::Result<ProcessFence> {
        let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        // The deadline is read under the lock: an extension made after it
        // is sent through the pipe, which the watchdog reads first.
        let (fence, watcher) = watchdog::start(pid, self.deadline_ns.load(Ordering::Acquire))?;
        watchers.push(watcher);
        Ok(fence)
    }

    /// Whether the deadline is still ahead.
    pub fn is_valid(&self) -> bool {
        self.deadline_ns.load(Ordering::Acquire) > nanos(Moment::now())
    }

    /// What is left of it; zero once it passed.
    pub fn remaining(&self) -> Duration {
        let deadline = self.deadline_ns.load(Ordering::Acquire);
        Duration::from_nanos(deadline.saturating_sub(nanos(Moment::now())))
    }

    /// Resolves once the deadline has passed (extensions meanwhile are
    /// waited out).
    pub async fn expired(&self) {
        loop {
            let left = self.remaining();
            if left.is_zero() {
                return;
            }
            // Slept on tokio's clock, checked on ours: after a suspend
            // the check below sees the time that passed.
            tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        }
    }
}

fn nanos(moment: Moment) -> u64 {
    u64::try_from(moment.0.as_nanos()).unwrap_or(u64::MAX)
}

/// What a host call traps with once the lease's [`ValidUntil`] has passed;
/// the lease is then attributed
/// [`LeaseFailure::Expired`](super::LeaseFailure::Expired).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the lease's validity has ended: no further effect is allowed")]
pub(crate) struct Expired;

/// One lease's view of its [`ValidUntil`] (none: nothing to check): the
/// check every effecting host call makes, and whether one failed, which
/// decides how the lease is attributed even if the guest swallowed the
/// refusal.
#[derive(Clone, Default)]
pub(crate) struct LeaseFence {
    valid: Option<ValidUntil>,
    tripped: Arc<AtomicBool>,
}

impl LeaseFence {
    pub(crate) fn new(valid: Option<ValidUntil>) -> LeaseFence {
        LeaseFence {
            valid,
            tripped: Arc::default(),
        }
    }

    /// `Ok` while valid (or unchecked); else [`Expired`], remembered.
    pub(crate) fn check(&self) -> Result<(), Expired> {
        match &self.valid {
            Some(valid) if !valid.is_valid() => {
                self.tripped.store(true, Ordering::Release);
                Err(Expired)
            }
            _ => Ok(()),
        }
    }

    /// [`check`](Self::check) as the trap a host call returns.
    pub(crate) fn trap(&self) -> wasmtime::Result<()> {
        self.check().map_err(wasmtime::Error::new)
    }

    /// Whether a check failed.
    pub(crate) fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Resolves once the deadline has passed; never without one.
    pub(crate) async fn expired(&self) {
        match &self.valid {
            Some(valid) => {
                valid.expired().await;
                self.tripped.store(true, Ordering::Release);
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_moves_only_forward_and_not_once_passed() {
        let valid = ValidUntil::for_next(Duration::from_secs(60));
        assert!(valid.is_valid());
        // An earlier renewal that answers late does not shorten it.
        assert!(valid.extend(Moment::now().after(Duration::from_secs(1))));
        assert!(valid.remaining() > Duration::from_secs(50));
        let clone = valid.clone();
        assert_eq!(clone, valid);
        clone.revoke();
        assert!(!valid.is_valid());
        assert_eq!(valid.remaining(), Duration::ZERO);
        // Once over, it stays over.
        assert!(!valid.extend(Moment::now().after(Duration::from_secs(60))));
        assert!(!valid.is_valid());
    }

    #[test]
    fn a_deadline_passes_with_the_clock() {
        let valid = ValidUntil::for_next(Duration::from_millis(30));
        assert!(valid.is_valid());
        std::thread::sleep(Duration::from_millis(40));
        assert!(!valid.is_valid());
        let fence = LeaseFence::new(Some(valid));
        assert!(!fence.tripped());
        assert!(fence.check().is_err());
        assert!(fence.tripped());
        let unchecked = LeaseFence::new(None);
        assert!(unchecked.check().is_ok());
        assert!(!unchecked.tripped());
    }

    #[tokio::test]
    async fn expired_waits_out_extensions() {
        let valid = ValidUntil::for_next(Duration::from_millis(20));
        let start = Moment::now();
        valid.extend(start.after(Duration::from_millis(80)));
        valid.expired().await;
        assert!(Moment::now() >= start.after(Duration::from_millis(80)));
        assert!(!valid.is_valid());
    }
}
