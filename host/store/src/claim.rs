//! Run claims with fencing tokens, the work queue they serve, and the
//! tombstones that retention leaves: the types every store shares.
//!
//! # Claims and fencing
//!
//! A run carries at most one **claim** at a time: an owner (a worker's id),
//! an expiry (milliseconds since the Unix epoch, from the caller's clock) and
//! a **fencing token**. The store keeps, per run, the newest token it ever
//! issued; every new claim (`acquire_claim`, or a queue `claim`) takes that token plus one,
//! so tokens only grow, across releases and expiries too.
//!
//! - [`EventStore::acquire_claim`](super::EventStore::acquire_claim) and
//!   [`EventStore::claim`](super::EventStore::claim) issue a new claim on a
//!   run with no live claim: none was issued, the last one was released, or
//!   it expired (`expires_ms <= now_ms`). A live claim of another owner is a
//!   [`StoreError::Claimed`](super::StoreError::Claimed).
//! - [`EventStore::append_fenced`](super::EventStore::append_fenced) writes
//!   only while the caller's claim is the run's current one (same token, not
//!   released), checked in the append's own transaction; otherwise it is a
//!   [`StoreError::Fenced`](super::StoreError::Fenced) and nothing is
//!   written. An expired claim that nobody replaced still writes: the token,
//!   not the clock, decides, so a paused or partitioned owner can never write
//!   after being replaced, however wrong its clock.
//! - [`EventStore::renew_claim`](super::EventStore::renew_claim) moves the
//!   expiry of the current claim; a replaced or released claim is fenced.
//! - [`EventStore::release_claim`](super::EventStore::release_claim) ends the
//!   current claim (on park, finish or shutdown), optionally writing the
//!   run's listing status; releasing a claim that is no longer current does
//!   nothing.
//!
//! Plain [`append`](super::EventStore::append)s (the verbs a human records:
//! approve, resolve, cancel) are not fenced: the expected log length alone
//! guards them, so a driver that loses such a race gets a conflict.
//!
//! Clocks decide only liveness (when a crashed owner's runs are taken over),
//! never safety: hosts' clocks should agree to well within a claim's time to
//! live, and a skewed clock only makes a takeover early or late.
//!
//! # The queue
//!
//! A run created with the listing status
//! [`ListingStatus::QUEUED`](super::ListingStatus::QUEUED) (`warden submit`) waits
//! for a worker. [`EventStore::claim`](super::EventStore::claim) claims, in
//! creation order, runs that are
//! - `queued`, or
//! - claimed before (token above 0: a worker's run), with no live claim,
//!   and either `running` (its worker died, or a human verb made a parked
//!   run runnable again) or owing deliveries (its worker died after the
//!   run's terminal event or parked notice and before the delivery: the
//!   count the last append wrote, see [`Listing`](super::Listing)), or
//! - `waiting` with no live claim and a wake-up time at or before now (the
//!   [`Listing::wake_ms`](super::Listing::wake_ms) its last append wrote: a
//!   durable timer, whoever parked it, `warden run` included, since nobody
//!   drives a waiting run),
//!
//! skipping rows another claimer holds locked, so concurrent workers never
//! claim the same run. Runs started and driven by `warden run` are never
//! claimed, so workers leave them alone, owing or not (`warden runs resume`
//! makes their deliveries).
//!
//! # Retention
//!
//! [`EventStore::prune`](super::EventStore::prune) deletes finished runs
//! whole (events, labels, run row), never one under a live claim nor one
//! that owes deliveries (whatever the filter says: a result nobody received
//! is not history yet), and keeps a [`Tombstone`]: the id, the
//! chain head and the event count, so the run's id stays taken and its
//! final head can still be compared with one recorded elsewhere. Loading a
//! pruned run is a [`StoreError::Pruned`](super::StoreError::Pruned).

use super::{ChainHash, RunId};

/// A claim on one run, as issued to its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The run.
    pub run_id: RunId,
    /// Who holds it (a worker's id).
    pub owner: String,
    /// The fencing token: higher than every claim issued on the run before.
    pub token: u64,
    /// When it expires unless renewed, in milliseconds since the Unix epoch
    /// (from the caller's clock).
    pub expires_ms: i64,
}

impl Claim {
    /// Whether the claim has expired at `now_ms`.
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_ms <= now_ms
    }
}

/// What is left of a pruned run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tombstone {
    /// The run.
    pub run_id: RunId,
    /// Its agent.
    pub agent: String,
    /// Its last listing status.
    pub status: String,
    /// When it was created, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Its last append.
    pub updated_ms: i64,
    /// How many events its log held.
    pub event_count: u64,
    /// The chain head of its log.
    pub head: ChainHash,
    /// When it was pruned (the caller's clock).
    pub pruned_ms: i64,
}

/// Which finished runs [`EventStore::prune`](super::EventStore::prune)
/// deletes.
///
/// By default it matches nothing: name the statuses that count as finished
/// and a time bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneFilter {
    pub(crate) statuses: Vec<String>,
    pub(crate) updated_before: Option<i64>,
}

impl PruneFilter {
    /// A filter that matches nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs whose listing status is `status` (call again to add more).
    /// Default: none.
    pub fn status(mut self, status: impl Into<String>) -> Self {
        self.statuses.push(status.into());
        self
    }

    /// Runs whose last append was strictly before `ms`. Default: none (no
    /// bound means nothing is pruned).
    pub fn updated_before(mut self, ms: i64) -> Self {
        self.updated_before = Some(ms);
        self
    }

    /// Whether the filter can match anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.statuses.is_empty() || self.updated_before.is_none()
    }

    pub(crate) fn matches(&self, status: &str, updated_ms: i64) -> bool {
        !self.is_empty()
            && self.statuses.iter().any(|s| s == status)
            && self.updated_before.is_some_and(|t| updated_ms < t)
    }
}
