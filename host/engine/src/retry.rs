//! The one retry layer for model calls. A provider makes exactly one
//! request per attempt; the engine records each attempt's failure
//! ([`ModelCallFailed`](super::events::ModelCallFailed): status,
//! `Retry-After`, transient or not, when it failed and when the next
//! attempt is due) and decides from the record whether and when to try
//! again.
//!
//! - [`RetryPolicy`]: the agent's `[model] max_attempts` (attempts per
//!   model call in total, the first included) and `max_retry_wait` (the
//!   longest wait the driver sleeps through).
//! - [`backoff`]: the wait before the next attempt: what `Retry-After`
//!   asked for when the server said, else exponential backoff with jitter.
//! - [`RetryPolicy::next_attempt_at`]: when the next attempt is due, or
//!   `None` when there is none (a permanent error, attempts used up).
//!
//! A wait up to `max_retry_wait` is slept through by the driver (from the
//! recorded due time, so a driver that crashed mid-wait and recovers waits
//! only what is left). A longer wait parks the run (`wait_started`, status
//! `waiting`) with its wake-up time in the store's listing: a durable
//! timer, so the process may exit and a worker (or `runs resume`) drives
//! the run again once the time has come (`wait_ended`).

use std::time::Duration;

use futures::future::BoxFuture;

use super::events::ModelCallError;

/// How a driver waits out a model call's backoff. Injected
/// ([`Runtime::with_sleep`](super::Runtime::with_sleep)) so tests can see
/// the waits, or move an injected clock, without waiting them out.
pub trait RetrySleep: Send + Sync {
    /// Waits `delay`.
    fn sleep(&self, delay: Duration) -> BoxFuture<'static, ()>;
}

/// Waits on the tokio timer: the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSleep;

impl RetrySleep for TokioSleep {
    fn sleep(&self, delay: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(delay))
    }
}

/// The first backoff delay; it doubles with each attempt.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// The longest backoff delay when the server gave no `Retry-After`.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// `[model] max_attempts` when the agent does not say.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// `[model] max_retry_wait` when the agent does not say.
pub const DEFAULT_MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// How a run retries a model call that failed transiently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per model call in total, the first included. Default:
    /// [`DEFAULT_MAX_ATTEMPTS`].
    pub max_attempts: u32,
    /// The longest wait before an attempt that the driver sleeps through,
    /// in milliseconds; a longer one parks the run until it is due.
    /// Default: [`DEFAULT_MAX_RETRY_WAIT`].
    pub max_wait_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_wait_ms: DEFAULT_MAX_RETRY_WAIT.as_millis() as u64,
        }
    }
}

impl RetryPolicy {
    /// When the attempt after `failed_attempt` (counting from 1), which
    /// failed with `error` at `now_ms`, is due; `None` when there is no
    /// next attempt: the error is permanent, or the attempts are used up.
    /// `jitter` spreads the backoff of calls that failed together.
    pub fn next_attempt_at(
        &self,
        failed_attempt: u32,
        error: &ModelCallError,
        now_ms: u64,
        jitter: u64,
    ) -> Option<u64> {
        if !error.transient || failed_attempt >= self.max_attempts {
            return None;
        }
        let wait = backoff(failed_attempt, error.retry_after_ms, jitter);
        Some(now_ms.saturating_add(wait.as_millis() as u64))
    }

    /// Whether a wait from `since_ms` to `until_ms` is longer than the
    /// driver sleeps through, so the run parks instead.
    pub fn parks(&self, since_ms: u64, until_ms: u64) -> bool {
        until_ms.saturating_sub(since_ms) > self.max_wait_ms
    }
}

/// The delay before the attempt after `failed_attempt` (counting from 1):
/// what `Retry-After` asked for when it did, exactly; otherwise exponential
/// backoff from [`BACKOFF_BASE`] up to [`BACKOFF_MAX`], half of it jittered
/// by `jitter`.
pub fn backoff(failed_attempt: u32, retry_after_ms: Option<u64>, jitter: u64) -> Duration {
    if let Some(ms) = retry_after_ms {
        return Duration::from_millis(ms);
    }
    let exp = BACKOFF_BASE
        .saturating_mul(1u32 << failed_attempt.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    let half = exp.as_millis() as u64 / 2;
    Duration::from_millis(half + jitter % (half + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(transient: bool, retry_after_ms: Option<u64>) -> ModelCallError {
        ModelCallError {
            transient,
            message: "x".into(),
            status: Some(429),
            retry_after_ms,
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_honours_retry_after() {
        // Half fixed, half jittered: 250..=500 ms, then 500..=1000 ms, …
        for (attempt, low, high) in [(1, 250, 500), (2, 500, 1000), (3, 1000, 2000)] {
            assert_eq!(backoff(attempt, None, 0), Duration::from_millis(low));
            assert_eq!(
                backoff(attempt, None, high - low),
                Duration::from_millis(high)
            );
            assert_eq!(
                backoff(attempt, None, high - low + 1),
                Duration::from_millis(low)
            );
        }
        assert!(backoff(30, None, u64::MAX) <= BACKOFF_MAX);
        // Retry-After wins, exactly, however long.
        assert_eq!(backoff(1, Some(7_000), 12345), Duration::from_secs(7));
        assert_eq!(backoff(1, Some(120_000), 1), Duration::from_secs(120));
        assert_eq!(backoff(1, Some(0), 12345), Duration::ZERO);
    }

    #[test]
    fn the_next_attempt_is_due_after_the_backoff_until_attempts_run_out() {
        let policy = RetryPolicy {
            max_attempts: 3,
            max_wait_ms: 60_000,
        };
        let now = 1_000_000;
        assert_eq!(
            policy.next_attempt_at(1, &error(true, Some(2_000)), now, 0),
            Some(now + 2_000)
        );
        assert_eq!(
            policy.next_attempt_at(2, &error(true, None), now, 0),
            Some(now + 500)
        );
        // The third attempt was the last; a permanent error has no next.
        assert_eq!(policy.next_attempt_at(3, &error(true, None), now, 0), None);
        assert_eq!(
            policy.next_attempt_at(1, &error(false, Some(1)), now, 0),
            None
        );
        // Up to the cap the driver waits; beyond it the run parks.
        assert!(!policy.parks(now, now + 60_000));
        assert!(policy.parks(now, now + 60_001));
    }
}
