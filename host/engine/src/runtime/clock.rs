//! Where the runtime reads the time and draws random numbers: the [`Clock`]
//! and [`Random`] it is given
//! ([`Runtime::with_hooks`](super::Runtime::with_hooks)), the system's
//! ([`SystemClock`], [`OsRandom`]), and fixed ones for tests and
//! deterministic replays. Injected so that a killed-and-recovered run
//! records the same log as an uninterrupted one.

/// Where the runtime reads the time. Injected so tests and recoveries are
/// deterministic.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Where the runtime draws random numbers (run ids and seeds).
pub trait Random: Send + Sync {
    /// A random 64-bit value.
    fn next_u64(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// The operating system's random source.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsRandom;

impl Random for OsRandom {
    fn next_u64(&self) -> u64 {
        rand::random()
    }
}

/// A clock that always reads the same time: for tests and deterministic
/// replays.
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

/// A random source that always returns the same value: for tests.
#[derive(Clone, Copy, Debug)]
pub struct FixedRandom(pub u64);

impl Random for FixedRandom {
    fn next_u64(&self) -> u64 {
        self.0
    }
}
