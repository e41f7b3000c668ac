//! Event stores: the [`EventStore`] trait, the [`MemoryStore`], the
//! [`SqliteStore`] and the [`PostgresStore`], with a tamper-evident hash
//! chain per run, run claims with fencing tokens, and the work queue
//! (`claim.rs`).
//!
//! A store keeps, per run, an append-only log of events as **opaque bytes**
//! (the exact serialized JSON the engine hands it) and a few columns for
//! listing (agent, labels, status, session, times). It knows nothing about
//! what an event means: `store` depends on no other Warden module, and the
//! engine depends on it, which is why [`RunId`] lives here.
//!
//! Guarantees every store gives (the conformance suite, `testing::suite`
//! behind the `testing` feature, checks each of them against every store):
//! - **optimistic concurrency**: [`EventStore::append`] names the log length it
//!   expects; all its events and the new listing (status, deliveries owed)
//!   are written in one transaction, or nothing is, and a stale expectation is a typed
//!   [`StoreError::Conflict`];
//! - **durability** (persistent stores): an append has been synced when it
//!   returns `Ok`, unless it was [deferred](Durability::Deferred): then it
//!   is synced with the store's next synced write, and a machine crash
//!   loses at most the deferred writes since the last synced one; an I/O
//!   failure is an error, never an acknowledgement;
//! - **tamper evidence**: a hash chain over the exact stored bytes (see
//!   below), recomputed on every load, so an edited, dropped, reordered or
//!   truncated event is a [`StoreError::Tampered`], and a damaged run never
//!   blocks loading, listing or appending to other runs;
//! - **no wall clock**: every time a store records (created, updated, a
//!   claim's expiry) is supplied by the caller from its injected clock;
//! - **claims with fencing** (see `claim.rs`): a fenced append is refused
//!   once a newer claim was issued on its run, in the append's own
//!   transaction.
//!
//! # The hash chain
//!
//! For a run with id `R` and events `b_1 .. b_n`:
//!
//! ```text
//! h_0 = SHA-256("warden.store.chain.v1" 0x00 || R)
//! h_i = SHA-256(h_{i-1} || be64(i) || be64(len(b_i)) || b_i)
//! ```
//!
//! Each event row stores `h_i`; the run row stores the head `h_n` and the
//! count `n`. [`EventStore::load`] recomputes every `h_i` and compares it
//! with the stored one, checks that sequence numbers run `1..=n` without
//! gaps, and that the last hash equals the head ([`EventStore::load_after`]
//! does the same from the stored hash at its starting point). An append
//! first checks, cheaply, that the event at `n` exists with hash `h_n` and
//! nothing lies beyond it, so it never chains onto a truncated log. All
//! stores compute the same hashes, so a log moved between stores keeps its
//! head.
//!
//! What this proves, honestly: it detects changes made by anyone who does not
//! recompute the chain (a stray `UPDATE`, a restored partial backup, a
//! corrupted page, a bug). Someone with write access to the database can
//! recompute every hash and rewrite the head: the plain chain is not a MAC.
//! A store opened with a [`ChainKey`] uses HMAC-SHA-256 with that operator key
//! in place of SHA-256, so forging needs the key too. Neither mode detects a
//! run rolled back whole to an earlier, self-consistent state (its rows, count
//! and head rewritten together): that needs a head recorded elsewhere (an
//! [`Appended::head`] given to a client, say) compared with
//! [`VerifyReport::recorded_head`]. Listing columns (status,
//! labels, agent, times) are not covered by the chain: the engine derives the
//! truth from the log, and the run's first event carries its metadata.
//!
//! # Sealed rows
//!
//! Two tables outside the run logs decide what the engine does: standing
//! approval rules and idempotency commitments. Each of their rows carries a
//! seal computed with the same function as the chain (keyed when the chain
//! is), checked on every read the engine acts on
//! ([`StoreError::RowTampered`]) and by [`EventStore::verify_rows`]; see
//! `sealed.rs` for what it covers and what it does not.

mod chain;
mod claim;
mod codes;
mod history;
mod location;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod rules;
mod sealed;
mod session;
#[cfg(feature = "sqlite")]
mod sqlite;
mod status;

// The conformance suite run against this crate's stores.
#[cfg(test)]
mod conformance;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use bytes::Bytes;

pub use chain::{ChainHash, ChainKey, InvalidChainKey};
pub use claim::{Claim, PruneFilter, Tombstone};
pub use history::{HistoryChunk, HistoryDigest, InvalidHistoryDigest};
pub use location::{InvalidStoreLocation, StoreLocation};
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStats, PostgresStore, PostgresStoreBuilder};
pub use rules::{ApprovalRule, Revocation, RuleStanding};
pub use sealed::{COMMITMENTS, RULES, RowBreak, RowFinding, RowsReport};
pub use session::{InvalidSessionId, SessionHead, SessionId};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteStoreBuilder, WriterStats};
pub use status::{ListingStatus, QUEUED, RUNNING, SETTLED_STATUSES, StatusClass, WAITING};

/// The id of a run: 1 to 128 ASCII letters, digits, `-`, `_`, `.` or `:`.
///
/// Ids are chosen by the caller (the engine derives them from its injected
/// randomness), so a recovered run keeps its id.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    /// The longest id, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Checks and wraps an id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidRunId> {
        let id = id.into();
        match id_problem(&id, Self::MAX_LEN) {
            Some(reason) => Err(InvalidRunId { id, reason }),
            None => Ok(Self(id)),
        }
    }

    /// A run id made from 128 random bits (from the caller's injected
    /// randomness): `run-` and 32 hex digits.
    pub fn from_random(bits: u128) -> Self {
        Self(format!("run-{bits:032x}"))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({:?})", self.0)
    }
}

impl FromStr for RunId {
    type Err = InvalidRunId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for RunId {
    type Error = InvalidRunId;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// What is wrong with `id` as a run or session id, if anything.
fn id_problem(id: &str, max_len: usize) -> Option<&'static str> {
    if id.is_empty() {
        Some("is empty")
    } else if id.len() > max_len {
        Some("is longer than 128 bytes")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        Some("may only hold ASCII letters, digits, '-', '_', '.' and ':'")
    } else {
        None
    }
}

/// A string that is not a valid [`RunId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{id}` is not a valid run id: it {reason}")]
pub struct InvalidRunId {
    id: String,
    reason: &'static str,
}

/// What a store records about a run when it is created, besides its first
/// event. These columns serve listing; the run's first event is the truth.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMeta {
    /// The agent's name.
    pub agent: String,
    /// Labels, for filtering lists.
    pub labels: BTreeMap<String, String>,
    /// The session the run belongs to, if any: a [`SessionId`] as text.
    /// A session holds at most one active run (see `store/session.rs`):
    /// creating a second is [`StoreError::SessionBusy`].
    pub session: Option<String>,
    /// With `session`: how many runs the session held when the caller read
    /// its history. The create is refused with [`StoreError::SessionChanged`]
    /// if the session holds another number of runs now (a run was started
    /// and finished there in between), so a run's recorded history never
    /// misses a run that completed before it started. `None`: no check.
    pub session_runs: Option<u64>,
    /// Chunks of session history the run's first event refers to (see
    /// `store/history.rs`), oldest first, written in the create's
    /// transaction: each one's previous chunk is stored already or comes
    /// earlier in the list, else the create is [`StoreError::HistoryBroken`]
    /// and writes nothing. A chunk stored already is kept as it is (its
    /// digest is its content). Empty: none.
    pub history: Vec<HistoryChunk>,
    /// The chunk the run's first event names as its history's head, if
    /// any: the chunks it reaches are kept while the run is, and
    /// [`EventStore::prune`] deletes those no remaining run reaches.
    pub history_head: Option<HistoryDigest>,
    /// Creation time in milliseconds since the Unix epoch, from the caller's
    /// injected clock.
    pub created_ms: i64,
}

/// One stored event, as loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// Position in the run's log, from 1.
    pub seq: u64,
    /// The exact bytes that were appended.
    pub bytes: Bytes,
    /// The chain hash `h_seq` (checked when loaded).
    pub hash: ChainHash,
}

/// Who holds an idempotency commitment: the run and call that claimed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The run.
    pub run_id: RunId,
    /// Its call.
    pub call_id: String,
}

/// The answer to [`EventStore::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyClaim {
    /// The caller may execute the call: it claimed the key first, or it held
    /// the key already (it crashed before settling and is back).
    Granted,
    /// Another run holds the key and has not settled it: the call may be
    /// running there now, or its outcome may be unknown there.
    Held(Holder),
    /// The call was executed and settled.
    Settled {
        /// Who executed it.
        holder: Holder,
        /// The result it recorded, as the bytes given to
        /// [`EventStore::append_settling`].
        result: Bytes,
    },
}

/// The settlement of a commitment, written with the events that complete the
/// call ([`EventStore::append_settling`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The commitment key.
    pub key: String,
    /// Who holds it (and settles it now).
    pub holder: Holder,
    /// What becomes of the key.
    pub outcome: Settle,
}

/// One [`EventStore::append_settling`] request: an append (fenced or not)
/// and the settlement written in its transaction.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SettlingAppend<'a> {
    /// The run appended to.
    pub run_id: &'a RunId,
    /// The caller's claim, when the append is fenced: on `run_id` or on
    /// the run whose driver drives it (see
    /// [`append_fenced_to`](EventStore::append_fenced_to)). Default: none.
    pub fence: Option<&'a Claim>,
    /// The log length the caller expects before the events.
    pub expected_len: u64,
    /// The encoded events.
    pub events: &'a [Bytes],
    /// What the run's listing says after the append. Default: `running`,
    /// owing nothing.
    pub listing: Listing,
    /// When, in milliseconds since the Unix epoch. Default: 0.
    pub updated_ms: i64,
    /// The commitment the events settle or release.
    pub settlement: &'a Settlement,
}

impl<'a> SettlingAppend<'a> {
    /// Appends `events` to `run_id` at `expected_len`, settling
    /// `settlement`: unfenced, listed `running`, at time 0 until the
    /// builder methods say otherwise.
    pub fn new(
        run_id: &'a RunId,
        expected_len: u64,
        events: &'a [Bytes],
        settlement: &'a Settlement,
    ) -> Self {
        SettlingAppend {
            run_id,
            fence: None,
            expected_len,
            events,
            listing: Listing::new(ListingStatus::RUNNING),
            updated_ms: 0,
            settlement,
        }
    }

    /// Fenced by `fence` (when `Some`), as
    /// [`append_fenced`](EventStore::append_fenced) is.
    pub fn fenced(self, fence: Option<&'a Claim>) -> Self {
        SettlingAppend { fence, ..self }
    }

    /// With `listing` as the run's listing after the append.
    pub fn listing(self, listing: Listing) -> Self {
        SettlingAppend { listing, ..self }
    }

    /// Written at `updated_ms`.
    pub fn at(self, updated_ms: i64) -> Self {
        SettlingAppend { updated_ms, ..self }
    }
}

/// What a [`Settlement`] does to its commitment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The call ran: every later claimant gets this result (the bytes it
    /// is given back as [`KeyClaim::Settled::result`]). Refused unless the
    /// holder holds the key unsettled.
    Result(Bytes),
    /// Nothing to reuse (the call failed, or an operator released the key):
    /// the commitment is deleted, so the next claimant runs the call.
    /// Refused unless the holder holds the key, settled or not.
    Release,
}

/// A commitment as listed ([`EventStore::commitments`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commitment {
    /// The commitment key.
    pub key: String,
    /// The run and call that claimed it.
    pub holder: Holder,
    /// The settled result, `None` while it is held unsettled.
    pub result: Option<Bytes>,
}

/// Which commitments [`EventStore::commitments`] lists. By default, all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitmentFilter {
    /// Only this key.
    pub key: Option<String>,
    /// Only keys claimed by this run.
    pub run_id: Option<RunId>,
}

impl CommitmentFilter {
    /// Every commitment.
    pub fn new() -> Self {
        CommitmentFilter::default()
    }

    /// Only the commitment `key`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only the commitments run `run_id` claimed.
    pub fn run(mut self, run_id: RunId) -> Self {
        self.run_id = Some(run_id);
        self
    }

    /// Whether `c` passes the filter.
    pub fn matches(&self, c: &Commitment) -> bool {
        self.key.as_ref().is_none_or(|k| *k == c.key)
            && self.run_id.as_ref().is_none_or(|r| *r == c.holder.run_id)
    }
}

/// What a successful create or append leaves behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The log's length now: the `expected_len` of the next append.
    pub event_count: u64,
    /// The chain head now.
    pub head: ChainHash,
}

/// A run as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunSummary {
    /// The run.
    pub run_id: RunId,
    /// The agent's name.
    pub agent: String,
    /// The status written by the last append (for listing only).
    pub status: String,
    /// The run's labels.
    pub labels: BTreeMap<String, String>,
    /// The run's session, if any.
    pub session: Option<String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Time of the last append (or the creation), as supplied by the caller.
    pub updated_ms: i64,
    /// The number of events the run row records.
    pub event_count: u64,
    /// The run's claim, if one is held (live or expired, not released).
    pub claim: Option<Claim>,
    /// The newest fencing token issued on the run; 0 if it was never
    /// claimed (a run driven by `warden run`, not by workers).
    pub claim_token: u64,
    /// How many deliveries the run owes, as written by its last append
    /// (see [`Listing::owes_deliveries`]); 0 when it owes none.
    pub owes_deliveries: u32,
    /// When the run wakes up, if its last append parked it `waiting` (see
    /// [`Listing::wake_ms`]).
    pub wake_ms: Option<i64>,
}

impl RunSummary {
    /// Whether the run is stalled at `now_ms`: listed as running, but the
    /// claim its driver took has expired (the driver died or lost the
    /// store). A worker takes it over.
    pub fn is_stalled(&self, now_ms: i64) -> bool {
        self.status == RUNNING && self.claim.as_ref().is_some_and(|l| l.is_expired(now_ms))
    }
}

/// What an append writes into a run's listing columns besides its events,
/// in the same transaction: the run's status, how many deliveries it owes,
/// and when a waiting run wakes up. All are derived by the engine from the
/// folded log; the store only keeps them, for listing and for the work
/// queue ([`EventStore::claim`] takes a worker's run that owes deliveries
/// and has no live claim, even when it is finished or parked, and a
/// waiting run once its wake-up time has come).
///
/// `ListingStatus::RUNNING.into()` is a listing that owes nothing.
///
/// It also says how durable the append must be when it returns
/// ([`Durability`]): synced, unless the caller asks for
/// [`deferred`](Listing::deferred).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listing {
    /// The status (for listing, and for what the store does with the run:
    /// see [`StatusClass`]; the log is the truth).
    pub status: ListingStatus,
    /// How many deliveries the run owes: its delivery in flight, and every
    /// event a channel receives and was not given yet, counted while the
    /// runtime would make one (see `engine::state::owed_count`). 0 when
    /// it owes none.
    pub owes_deliveries: u32,
    /// When a `waiting` run is due to be driven again, in milliseconds
    /// since the Unix epoch (the engine's clock): a durable timer that
    /// [`EventStore::claim`] honours. `None` for a run that is not waiting.
    pub wake_ms: Option<i64>,
    /// How durable the append is when it returns. Default:
    /// [`Durability::Synced`].
    pub durability: Durability,
}

impl Listing {
    /// A listing with `status` that owes no delivery and waits for no
    /// time, for a synced append.
    pub fn new(status: ListingStatus) -> Self {
        Listing {
            status,
            owes_deliveries: 0,
            wake_ms: None,
            durability: Durability::Synced,
        }
    }

    /// The same listing, for an append whose sync may wait for the store's
    /// next synced write ([`Durability::Deferred`]).
    pub fn deferred(self) -> Self {
        Listing {
            durability: Durability::Deferred,
            ..self
        }
    }

    /// The same listing, due to be driven again at `wake_ms` (when `Some`).
    pub fn waking_at(self, wake_ms: Option<i64>) -> Self {
        Listing { wake_ms, ..self }
    }

    /// The same listing, owing `n` deliveries.
    pub fn owing(self, n: u32) -> Self {
        Listing {
            owes_deliveries: n,
            ..self
        }
    }
}

impl From<ListingStatus> for Listing {
    fn from(status: ListingStatus) -> Self {
        Listing::new(status)
    }
}

/// How durable an append is when it returns (see [`Listing::durability`]).
///
/// Either way the append is committed and visible to every reader when it
/// returns, and a crash of the process keeps it. They differ on a crash of
/// the machine (power loss, a kernel panic) before the disk has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// On disk when the append returns (the default).
    #[default]
    Synced,
    /// On disk by the store's next synced write (any synced append, create,
    /// claim or rule, by any run), or sooner: a machine crash before then
    /// may take it back, together with every deferred write after the
    /// store's last synced one, and never a write before that. What
    /// survives a machine crash is always a prefix of what the store
    /// acknowledged. For events the engine can lose and make again without
    /// harm (a model call's completion, a read's intent and completion;
    /// see the engine's runtime). A store without a cheaper way to commit
    /// syncs it.
    Deferred,
}

/// Which runs [`EventStore::list`] returns: every condition set must hold.
///
/// By default every run matches, and there is no limit. Runs come ordered by
/// creation time, then id: oldest first, or [newest
/// first](RunFilter::newest_first). Each order is an index's order (or
/// the same index read backwards) on the persistent stores, so a page of
/// it ([`limit`](RunFilter::limit), then [`after`](RunFilter::after) the
/// last run shown) costs what the page holds, not what the store holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub(crate) statuses: Vec<String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) agent: Option<String>,
    pub(crate) session: Option<String>,
    pub(crate) id_prefix: Option<String>,
    pub(crate) created_since: Option<i64>,
    pub(crate) created_before: Option<i64>,
    pub(crate) after: Option<RunPosition>,
    pub(crate) newest_first: bool,
    pub(crate) limit: Option<usize>,
}

/// A run's place in the listing order: its creation time, then its id.
/// What a page of [`EventStore::list`] ends at, and the next page starts
/// after ([`RunFilter::after`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPosition {
    /// The run's creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// The run.
    pub run_id: RunId,
}

impl RunPosition {
    /// Where `run` stands in the listing order.
    pub fn of(run: &RunSummary) -> Self {
        RunPosition {
            created_ms: run.created_ms,
            run_id: run.run_id.clone(),
        }
    }
}

/// The exclusive upper bound of the ids that start with `prefix`, in
/// byte order: every character a [`RunId`] may hold sorts below `~`, so
/// an id starting with `prefix` sorts at or above `prefix` and below
/// `prefix~`. How the SQL stores turn a prefix into an index range.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn id_prefix_end(prefix: &str) -> String {
    format!("{prefix}~")
}

impl RunFilter {
    /// A filter that matches every run.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs whose status is `status`; call it again to accept any of several.
    /// Default: any status.
    pub fn status(mut self, status: impl Into<String>) -> Self {
        self.statuses.push(status.into());
        self
    }

    /// Runs carrying label `key` with value `value`; every label given must
    /// match (giving a key twice keeps the last value). Default: no label
    /// condition.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Runs of this agent. Default: any agent.
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// Runs in this session. Default: any session, or none.
    pub fn session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// Runs whose id starts with `prefix`. Default: any id.
    pub fn id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.id_prefix = Some(prefix.into());
        self
    }

    /// Runs created at or after `ms` (inclusive). Default: no lower bound.
    pub fn created_since(mut self, ms: i64) -> Self {
        self.created_since = Some(ms);
        self
    }

    /// Runs created strictly before `ms`. Default: no upper bound.
    pub fn created_before(mut self, ms: i64) -> Self {
        self.created_before = Some(ms);
        self
    }

    /// Newest first: by creation time, then id, both descending. Default:
    /// oldest first.
    pub fn newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }

    /// Only the runs that come after `position` in the filter's order
    /// (older ones when [newest first](Self::newest_first)): the next page
    /// after a page that ended at `position`. Default: from the start.
    pub fn after(mut self, position: RunPosition) -> Self {
        self.after = Some(position);
        self
    }

    /// At most `n` runs (the first in the filter's order). Default: no
    /// limit.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// Whether `run` comes after `position` in this filter's order.
    fn is_after(&self, run: &RunSummary, position: &RunPosition) -> bool {
        let key = (run.created_ms, run.run_id.as_str());
        let at = (position.created_ms, position.run_id.as_str());
        if self.newest_first {
            key < at
        } else {
            key > at
        }
    }

    /// Whether a run's listing columns match (used by stores that filter in
    /// memory).
    pub(crate) fn matches(&self, run: &RunSummary) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&run.status))
            && self.agent.as_ref().is_none_or(|a| *a == run.agent)
            && self
                .session
                .as_ref()
                .is_none_or(|s| run.session.as_ref() == Some(s))
            && self.created_since.is_none_or(|t| run.created_ms >= t)
            && self.created_before.is_none_or(|t| run.created_ms < t)
            && self
                .id_prefix
                .as_ref()
                .is_none_or(|p| run.run_id.as_str().starts_with(p.as_str()))
            && self.after.as_ref().is_none_or(|p| self.is_after(run, p))
            && self
                .labels
                .iter()
                .all(|(k, v)| run.labels.get(k) == Some(v))
    }
}

/// How a run's stored log fails its chain check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainBreak {
    /// The event's bytes, or its stored hash, are not what the chain says:
    /// the event (or its hash) was edited, or events were reordered.
    #[error("stored hash does not match the bytes and the chain")]
    HashMismatch,
    /// An event the run's count promises is absent: dropped, or the log was
    /// truncated.
    #[error("event is missing (the run records {recorded_count} events)")]
    Missing {
        /// The count stored on the run row.
        recorded_count: u64,
    },
    /// An event exists beyond the count stored on the run row.
    #[error("event lies beyond the run's recorded count of {recorded_count}")]
    BeyondCount {
        /// The count stored on the run row.
        recorded_count: u64,
    },
    /// Sequence numbers repeat or go backwards.
    #[error("sequence number out of order")]
    OutOfOrder,
    /// The head stored on the run row is not the last event's hash.
    #[error("the run's recorded chain head does not match its last event")]
    HeadMismatch,
    /// A stored value cannot be read as what it should be.
    #[error("stored value is unreadable: {detail}")]
    Unreadable {
        /// What was wrong, for example "hash is 5 bytes, expected 32".
        detail: String,
    },
}

/// One place where a run's log fails its chain check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The sequence number concerned.
    pub seq: u64,
    /// What is wrong there.
    pub kind: ChainBreak,
}

/// The result of a full check of one run's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The run.
    pub run_id: RunId,
    /// The event count stored on the run row.
    pub recorded_count: u64,
    /// The number of event rows found.
    pub events_read: u64,
    /// The chain head stored on the run row, if readable.
    pub recorded_head: Option<ChainHash>,
    /// Every break found, in sequence order; empty when the run is intact.
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    /// Whether the chain checked out completely.
    pub fn is_intact(&self) -> bool {
        self.findings.is_empty()
    }
}

/// How a persistent store is opened.
///
/// Only commands that start runs create a store; every other command opens
/// an existing one, and commands that only read open it read-only, so they
/// work on a full disk, a read-only file or mount, and while another process
/// holds the write lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the store if there is none, and migrate it.
    #[default]
    Create,
    /// Open an existing store for reading and writing, migrating it; where
    /// there is none, [`StoreError::NoStore`] and nothing is created.
    Existing,
    /// Open an existing store for reading only: no migration, no write
    /// (every write is [`StoreError::ReadOnly`]); a schema older than this
    /// build's is [`StoreError::SchemaTooOld`].
    ReadOnly,
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A run with this id already has history.
    #[error("run {run_id} already exists")]
    AlreadyExists {
        /// The run.
        run_id: RunId,
    },
    /// No approval rule has this id.
    #[error("there is no approval rule `{id}`")]
    UnknownRule {
        /// The id asked for.
        id: String,
    },
    /// An approval rule with this id exists already; nothing was written.
    #[error("approval rule `{id}` already exists")]
    RuleExists {
        /// The id.
        id: String,
    },
    /// No run has this id.
    #[error("run {run_id} does not exist")]
    UnknownRun {
        /// The run.
        run_id: RunId,
    },
    /// The log's length is not the one the append expected; nothing was
    /// written.
    #[error("append to run {run_id} expected {expected} events in the log, found {actual}")]
    Conflict {
        /// The run.
        run_id: RunId,
        /// The length the caller expected.
        expected: u64,
        /// The length found.
        actual: u64,
    },
    /// An append carried no events; nothing was written.
    #[error("append to run {run_id} carries no events")]
    EmptyAppend {
        /// The run.
        run_id: RunId,
    },
    /// The run's stored log fails its chain check.
    #[error("run {run_id} fails its integrity check at seq {seq}: {reason}")]
    Tampered {
        /// The run.
        run_id: RunId,
        /// The first sequence number concerned.
        seq: u64,
        /// What is wrong.
        reason: ChainBreak,
    },
    /// There is no store where one was looked for: no file, an empty
    /// (0-byte) file, a database without Warden's schema. Only a store
    /// opened with [`OpenMode::Create`] is ever created; nothing was written.
    #[error("there is no Warden store at {location}: {reason}")]
    NoStore {
        /// Where the store was looked for: a file, or a PostgreSQL schema.
        location: String,
        /// What was found there instead.
        reason: String,
    },
    /// SQLite reports the database file as damaged (`PRAGMA quick_check`):
    /// it is not opened for writing, so nothing is written into a damaged
    /// file; open it read-only to read and verify what is left.
    #[error("the store at {location} is damaged, so it is not opened for writing: {detail}")]
    Damaged {
        /// The store.
        location: String,
        /// SQLite's first findings.
        detail: String,
    },
    /// A write on a store opened with [`OpenMode::ReadOnly`].
    #[error("the store at {location} is open read-only: {operation} is refused")]
    ReadOnly {
        /// The store.
        location: String,
        /// What was refused.
        operation: &'static str,
    },
    /// The database's schema is older than this build's, and the store was
    /// opened read-only (migrating it would write).
    #[error(
        "store schema version {found} is older than this build's ({supported}): open it for writing once to migrate it (`warden store migrate`)"
    )]
    SchemaTooOld {
        /// The version found in the database.
        found: i64,
        /// The version this build reads.
        supported: i64,
    },
    /// The database's schema version is one no Warden writes (below zero):
    /// the file or table was damaged or written by another program.
    #[error(
        "store schema version {found} is not one any Warden writes: the store is damaged or another program's; restore a backup (`warden store restore`) or point WARDEN_STORE at the right store"
    )]
    SchemaInvalid {
        /// The version found in the database.
        found: i64,
    },
    /// The database was written by a newer Warden, with a schema this build
    /// does not know.
    #[error("store schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// The version found in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database's chain was written in another mode (keyed or not, or
    /// with another key) than the store was opened with.
    #[error("store chain mode is {found}, but the store was opened with {configured}")]
    ChainModeMismatch {
        /// The mode recorded in the database.
        found: String,
        /// The mode this store was opened with.
        configured: String,
    },
    /// The storage itself failed: I/O, a locked or corrupt database, a
    /// failed commit. Nothing is acknowledged that was not synced.
    #[error("{context}: {error}")]
    Backend {
        /// What was being done, with its values.
        context: String,
        /// The cause (written into the message, not chained as a source).
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store's writer has stopped (the store is shutting down).
    #[error("the store's writer has stopped")]
    Closed,
    /// Another owner holds a live claim on the run.
    #[error("run {run_id} is claimed by {owner} until {expires_ms} (ms since the epoch)")]
    Claimed {
        /// The run.
        run_id: RunId,
        /// The claim's owner.
        owner: String,
        /// When the claim expires unless renewed.
        expires_ms: i64,
    },
    /// The caller's claim is no longer the run's current one (a newer claim
    /// was issued, or it was released); nothing was written.
    #[error("run {run_id}: claim {token} is no longer held (the newest claim is {current})")]
    Fenced {
        /// The run.
        run_id: RunId,
        /// The caller's token.
        token: u64,
        /// The newest token issued on the run.
        current: u64,
    },
    /// The run was pruned by retention: only its tombstone is left.
    #[error("run {run_id} was pruned; its log held {event_count} events with head {head}")]
    Pruned {
        /// The run.
        run_id: RunId,
        /// The count its log had.
        event_count: u64,
        /// The chain head its log had.
        head: ChainHash,
    },
    /// The run would be a second active run in its session: another run
    /// there has not ended (running, queued or parked); nothing was written.
    #[error("session {session} is busy: run {active_run} is still active in it")]
    SessionBusy {
        /// The session.
        session: String,
        /// The run that holds it.
        active_run: RunId,
    },
    /// The session's runs changed since the caller read them (see
    /// [`RunMeta::session_runs`]); nothing was written. Read the session
    /// again and retry.
    #[error("session {session} changed: it holds {found} runs, the start expected {expected}")]
    SessionChanged {
        /// The session.
        session: String,
        /// The number of runs the caller saw.
        expected: u64,
        /// The number of runs it holds now.
        found: u64,
    },
    /// A chain of session history chunks does not hold (see
    /// `store/history.rs`): a chunk is missing, or its content is not what
    /// its digest says. Nothing was written.
    #[error("the session history with head {head} is broken at chunk {at}: {reason}")]
    HistoryBroken {
        /// The newest chunk of the chain asked for (or being written).
        head: HistoryDigest,
        /// The chunk concerned.
        at: HistoryDigest,
        /// What is wrong.
        reason: String,
    },
    /// The store does not implement this operation.
    #[error("{store} does not support {operation}")]
    Unsupported {
        /// The store's type.
        store: &'static str,
        /// The operation.
        operation: &'static str,
    },
    /// A row kept outside the run logs whose content decides what the
    /// engine does (a standing approval rule, an idempotency commitment)
    /// fails its seal (see `store/sealed.rs`): it was changed, inserted or
    /// had its seal copied behind the store's back. Nothing acts on it.
    #[error(
        "the {table} row `{row}` fails its integrity check ({reason}): it was changed outside Warden, so nothing acts on it; restore the store from a backup taken before the change (`warden store restore`), and run `warden runs verify` to list every row and run that fails"
    )]
    RowTampered {
        /// The table.
        table: &'static str,
        /// The row: a rule's id, a commitment's key.
        row: String,
        /// What is wrong.
        reason: RowBreak,
    },
    /// A settlement named a commitment its holder does not hold (never
    /// claimed, claimed by another run, or, to record a result, already
    /// settled); nothing was written.
    #[error("idempotency commitment {key} is not held unsettled by run {run_id} call {call_id}")]
    CommitmentNotHeld {
        /// The commitment key.
        key: String,
        /// The run that tried to settle it.
        run_id: RunId,
        /// Its call.
        call_id: String,
    },
}

/// Where runs' event logs are kept. Object-safe: the runtime holds an
/// `Arc<dyn EventStore>`.
///
/// Every load checks the run's hash chain; see the [module docs](self).
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Creates run `run_id` with its metadata, its first event (seq 1) and
    /// its initial status. Refused with [`StoreError::AlreadyExists`] if the
    /// id has any history, and with [`StoreError::SessionBusy`] if
    /// `meta.session` names a session with an active run (checked in the
    /// same transaction as the insert).
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: ListingStatus,
    ) -> Result<Appended, StoreError>;

    /// Appends `events` to run `run_id` if its log holds exactly
    /// `expected_len` events, and sets its listing (status, deliveries
    /// owed) and updated time, all in one transaction. On [`StoreError::Conflict`] (or any error) nothing is
    /// written. If the returned future is dropped before it completes, the
    /// append may or may not have happened: load to find out.
    async fn append(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError>;

    /// The run's whole log, in order, after checking its chain.
    async fn load(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError>;

    /// The events after `after_seq` (all of them for 0), for subscribers.
    /// Checks the chain from the stored hash at `after_seq` to the head, and
    /// the count; events up to `after_seq` are not re-hashed (a full
    /// [`load`](Self::load) or [`verify`](Self::verify) does that).
    async fn load_after(
        &self,
        run_id: &RunId,
        after_seq: u64,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    /// The whole logs of `run_ids`, each checked as [`load`](Self::load)
    /// checks it, in one call (one snapshot where the backend has them):
    /// what a view over many runs (the console's inbox, the audit) reads
    /// instead of one load per run. In the order asked; a run that does not
    /// exist (never made, or pruned since it was listed) is left out, any
    /// other failure fails the call.
    async fn load_many(
        &self,
        run_ids: &[RunId],
    ) -> Result<Vec<(RunId, Vec<StoredEvent>)>, StoreError> {
        let mut logs = Vec::with_capacity(run_ids.len());
        for run_id in run_ids {
            match self.load(run_id).await {
                Ok(events) => logs.push((run_id.clone(), events)),
                Err(StoreError::UnknownRun { .. } | StoreError::Pruned { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(logs)
    }

    /// The run's listing columns.
    async fn summary(&self, run_id: &RunId) -> Result<RunSummary, StoreError>;

    /// The runs matching `filter`, ordered by creation time then id (see
    /// [`RunFilter`]).
    async fn list(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError>;

    /// What a start in session `session` reads (see [`SessionHead`]): the
    /// stores of this crate keep it as runs are created and settle, so it
    /// costs the same however many runs the session holds. The default
    /// reads it from the listing of the session's runs (O(runs)).
    async fn session_head(&self, session: &str) -> Result<SessionHead, StoreError> {
        let runs = self.list(&RunFilter::new().session(session)).await?;
        Ok(SessionHead::from_listing(&runs))
    }

    /// A full check of the run's chain, listing every break found rather
    /// than stopping at the first. A damaged run is an `Ok` report with
    /// findings; `Err` means the check itself could not run.
    async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, StoreError>;

    /// Every run id in the store, in id order (to verify them all).
    async fn run_ids(&self) -> Result<Vec<RunId>, StoreError>;

    /// The ids stored for runs that are not valid [`RunId`]s, in id order:
    /// a damaged or tampered run row. Such a run can be neither loaded nor
    /// listed as a [`RunSummary`], so callers report these instead of
    /// letting the run vanish. A store that only ever holds valid ids (the
    /// [`MemoryStore`]) returns none.
    async fn invalid_run_ids(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    /// The chain of session history chunks ending at `head`, oldest first,
    /// each checked against its digest and linked to the one before it
    /// ([`StoreError::HistoryBroken`] naming the first chunk that is missing
    /// or does not match). One snapshot where the backend has them.
    async fn load_history(&self, head: &HistoryDigest) -> Result<Vec<HistoryChunk>, StoreError> {
        let _ = head;
        Err(unsupported::<Self>("session history"))
    }

    // ---- claims, the queue and retention (see `claim.rs`) ----
    //
    // Every store of this crate implements them; the defaults refuse with
    // `StoreError::Unsupported` so that a store written elsewhere keeps
    // compiling and fails loudly, never silently unfenced.

    /// Issues a new claim on run `run_id` to `owner`, expiring at `now_ms +
    /// ttl_ms`, with the next fencing token, unless another owner holds a
    /// live claim ([`StoreError::Claimed`]). A live claim of the same owner
    /// is replaced by the new one.
    async fn acquire_claim(
        &self,
        run_id: &RunId,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let _ = (run_id, owner, now_ms, ttl_ms);
        Err(unsupported::<Self>("claims"))
    }

    /// Moves the expiry of `claim` to `now_ms + ttl_ms` if it is still the
    /// run's current claim, else [`StoreError::Fenced`].
    async fn renew_claim(
        &self,
        claim: &Claim,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let _ = (claim, now_ms, ttl_ms);
        Err(unsupported::<Self>("claims"))
    }

    /// Ends `claim` if it is still the run's current one, and then sets the
    /// run's listing status to `status` if given (a run parked as
    /// `needs_reconciliation` without a new event, say). Releasing a claim
    /// that is no longer current changes nothing.
    async fn release_claim(
        &self,
        claim: &Claim,
        status: Option<ListingStatus>,
    ) -> Result<(), StoreError> {
        let _ = (claim, status);
        Err(unsupported::<Self>("claims"))
    }

    /// [`append`](Self::append), in one transaction with the check that
    /// `claim` is the run's current claim ([`StoreError::Fenced`] if not;
    /// checked before the length): [`append_fenced_to`](Self::append_fenced_to)
    /// the claimed run itself.
    async fn append_fenced(
        &self,
        claim: &Claim,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.append_fenced_to(
            &claim.run_id,
            claim,
            expected_len,
            events,
            listing,
            updated_ms,
        )
        .await
    }

    /// [`append`](Self::append) to `run_id`, in one transaction with the
    /// check that `claim` is the current claim of the run it names
    /// ([`StoreError::Fenced`] if not; checked before the length). That run
    /// is `run_id` itself, or the run whose driver drives `run_id`: a child
    /// run is driven under its parent's claim (the root of its tree's), so
    /// once the parent is taken over, the old driver writes to none of its
    /// children either. The claimed run's row is locked (shared) for the
    /// transaction, so a takeover waits for the append or fences it.
    async fn append_fenced_to(
        &self,
        run_id: &RunId,
        claim: &Claim,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        let _ = (run_id, claim, expected_len, events, listing, updated_ms);
        Err(unsupported::<Self>("claims"))
    }

    /// Claims up to `limit` claimable runs to `owner` (queued runs;
    /// workers' runs with no live claim that are running or owe
    /// deliveries; and waiting runs with no live claim whose wake-up time
    /// is at or before `now_ms`), oldest first, each with its next fencing
    /// token; concurrent claimers never get the same run.
    async fn claim(
        &self,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let _ = (owner, now_ms, ttl_ms, limit);
        Err(unsupported::<Self>("the work queue"))
    }

    /// Deletes the runs `filter` matches, whole, leaving a [`Tombstone`]
    /// each (stamped `now_ms`), and returns the tombstones. A run with a
    /// live claim at `now_ms` is kept, and so is a run that owes
    /// deliveries (whatever the filter says). The session history chunks
    /// that no remaining run's [`RunMeta::history_head`] reaches are
    /// deleted with them, so pruning a session's runs deletes what they
    /// said.
    async fn prune(&self, filter: &PruneFilter, now_ms: i64) -> Result<Vec<Tombstone>, StoreError> {
        let _ = (filter, now_ms);
        Err(unsupported::<Self>("pruning"))
    }

    // ---- idempotency commitments ----
    //
    // Every store of this crate implements them; the defaults refuse with
    // `StoreError::Unsupported`, so a keyed call never runs unguarded.

    /// Claims the idempotency commitment `key` for `holder`: the first
    /// claimant (or the holder again) is [`KeyClaim::Granted`]; anyone else
    /// learns who holds it, or the result it was settled with. Commitments
    /// outlive their runs (pruning included); only a [`Settle::Release`]
    /// deletes one.
    async fn claim_commitment(&self, key: &str, holder: &Holder) -> Result<KeyClaim, StoreError> {
        let _ = (key, holder);
        Err(unsupported::<Self>("idempotency commitments"))
    }

    /// The commitments `filter` matches, in key order.
    async fn commitments(&self, filter: &CommitmentFilter) -> Result<Vec<Commitment>, StoreError> {
        let _ = filter;
        Err(unsupported::<Self>("idempotency commitments"))
    }

    /// [`append`](Self::append) (or [`append_fenced`](Self::append_fenced)
    /// when the request is [fenced](SettlingAppend::fenced)), and in the same
    /// transaction settles the commitment the appended events complete, or
    /// releases it (see [`Settle`]). Refused with
    /// [`StoreError::CommitmentNotHeld`] (nothing written) unless the
    /// settlement's holder holds the key (and, to record a result, it is not
    /// settled yet).
    async fn append_settling(&self, request: SettlingAppend<'_>) -> Result<Appended, StoreError> {
        let _ = request;
        Err(unsupported::<Self>("idempotency commitments"))
    }

    // ---- standing approval rules (see `rules.rs`) ----
    //
    // Every store of this crate implements them; the defaults refuse with
    // `StoreError::Unsupported`, so no call is approved by a rule a store
    // cannot keep (the engine then asks a human).

    /// Records a new rule ([`StoreError::RuleExists`] if its id is taken;
    /// nothing written).
    async fn add_rule(&self, rule: &ApprovalRule) -> Result<(), StoreError> {
        let _ = rule;
        Err(unsupported::<Self>("approval rules"))
    }

    /// Every rule, revoked and expired ones included, oldest first (then
    /// by id).
    async fn rules(&self) -> Result<Vec<ApprovalRule>, StoreError> {
        Err(unsupported::<Self>("approval rules"))
    }

    /// The rule `id`, if there is one.
    async fn rule(&self, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
        let _ = id;
        Err(unsupported::<Self>("approval rules"))
    }

    /// Revokes rule `id` as `by` at `at_ms` and returns it; a rule revoked
    /// already keeps its first revocation. [`StoreError::UnknownRule`] if
    /// there is none.
    async fn revoke_rule(
        &self,
        id: &str,
        by: &str,
        at_ms: i64,
    ) -> Result<ApprovalRule, StoreError> {
        let _ = (id, by, at_ms);
        Err(unsupported::<Self>("approval rules"))
    }

    // ---- sealed rows (see `sealed.rs`) ----

    /// Checks the seal of every row of the tables kept outside the run logs
    /// whose content decides what the engine does (`approval_rules`,
    /// `commitments`), listing every row that fails rather than stopping
    /// at the first. `Err` means the check itself could not run. The
    /// default refuses with [`StoreError::Unsupported`], so a store written
    /// elsewhere is never reported intact unchecked.
    async fn verify_rows(&self) -> Result<RowsReport, StoreError> {
        Err(unsupported::<Self>("sealed rows"))
    }

    // ---- export cursors ----
    //
    // How far a reader outside the engine (the OpenTelemetry exporter, say)
    // got in each run's log, kept in the store so that a restarted reader,
    // or another host's, resumes where the last one stopped. Nothing of the
    // engine reads them. The defaults refuse with `StoreError::Unsupported`.

    /// How many of each run's events reader `reader` has taken, by run.
    /// Runs it never took anything from are absent.
    async fn export_cursors(&self, reader: &str) -> Result<BTreeMap<RunId, u64>, StoreError> {
        let _ = reader;
        Err(unsupported::<Self>("export cursors"))
    }

    /// Records that reader `reader` has taken run `run_id`'s first
    /// `through` events. A cursor never moves back: a lower `through` than
    /// the one recorded (a slower reader racing a faster one) leaves it.
    async fn advance_export_cursor(
        &self,
        reader: &str,
        run_id: &RunId,
        through: u64,
    ) -> Result<(), StoreError> {
        let _ = (reader, run_id, through);
        Err(unsupported::<Self>("export cursors"))
    }
}

fn unsupported<S: ?Sized>(operation: &'static str) -> StoreError {
    StoreError::Unsupported {
        store: std::any::type_name::<S>(),
        operation,
    }
}

/// The schema version a store recorded, checked before it is compared with
/// this build's: a negative one is no Warden's ([`StoreError::SchemaInvalid`]),
/// so it is never taken for newer or older. Both backends read it here.
pub(crate) fn recorded_schema_version(found: i64) -> Result<i64, StoreError> {
    if found < 0 {
        return Err(StoreError::SchemaInvalid { found });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked() {
        for good in ["r1", "run-0123", "a.b:c_d", &"x".repeat(128)] {
            assert_eq!(RunId::new(good).unwrap().as_str(), good);
        }
        let cases = [
            ("", "it is empty"),
            ("a b", "it may only hold"),
            ("a/b", "it may only hold"),
            ("é", "it may only hold"),
            (&"x".repeat(129), "it is longer than 128 bytes"),
        ];
        for (bad, reason) in cases {
            let message = RunId::new(bad).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("`{bad}` is not a valid run id: {reason}")),
                "{message}"
            );
        }
    }

    #[test]
    fn run_ids_serialize_as_strings_and_are_checked_when_read() {
        let id = RunId::from_random(0xab);
        assert_eq!(id.as_str(), "run-000000000000000000000000000000ab");
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"run-000000000000000000000000000000ab\"");
        assert_eq!(serde_json::from_str::<RunId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<RunId>("\"a/b\"").is_err());
        assert_eq!("r-1".parse::<RunId>().unwrap(), RunId::new("r-1").unwrap());
        assert_eq!(format!("{:?}", RunId::new("r").unwrap()), "RunId(\"r\")");
    }

    #[test]
    fn filters_match_listing_columns() {
        let run = RunSummary {
            run_id: RunId::new("r").unwrap(),
            agent: "a".into(),
            status: RUNNING.into(),
            labels: BTreeMap::from([("k".to_owned(), "v".to_owned())]),
            session: None,
            created_ms: 10,
            updated_ms: 10,
            event_count: 1,
            claim: None,
            claim_token: 0,
            owes_deliveries: 0,
            wake_ms: None,
        };
        assert!(RunFilter::new().matches(&run));
        assert!(RunFilter::new().status("x").status("running").matches(&run));
        assert!(!RunFilter::new().session("s").matches(&run));
        assert!(
            RunFilter::new()
                .created_since(10)
                .created_before(11)
                .matches(&run)
        );
        assert!(!RunFilter::new().created_before(10).matches(&run));
        assert!(
            !RunFilter::new()
                .label("k", "v")
                .label("k2", "v")
                .matches(&run)
        );
    }
}
