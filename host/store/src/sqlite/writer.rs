//! The SQLite store's writer thread and its group commit.
//!
//! One dedicated thread owns the only writing connection. Creates and appends
//! reach it over a channel; it takes everything queued (up to a batch limit),
//! applies each request inside its own savepoint of one `BEGIN IMMEDIATE`
//! transaction, commits once (one WAL fsync under `synchronous=FULL`; none
//! for a batch of deferred appends alone, under `synchronous=NORMAL`), and
//! only then answers each request with its own result. A request that fails
//! (a conflict, an unknown run, a damaged run) is rolled back to its
//! savepoint alone; the others in the batch still commit. If the commit
//! itself fails, every request in the batch gets the error: nothing is
//! acknowledged that was not synced.
//!
//! Claim operations, claims and pruning go through the same thread and the
//! same transactions, so a fenced append's claim check and its write are
//! one transaction, and processes sharing the file serialize on SQLite's
//! write lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};

use super::{backend, blob_hash};
use crate::chain::{self, Chain};
use crate::sealed;
use crate::status::settled_sql;
use crate::{
    Appended, ApprovalRule, ChainBreak, ChainHash, Claim, Holder, KeyClaim, Listing, ListingStatus,
    PruneFilter, QUEUED, RUNNING, Revocation, RunId, RunMeta, Settle, Settlement, StoreError,
    Tombstone, WAITING,
};

/// The answer to one create or append.
pub(super) type Reply = oneshot::Sender<Result<Appended, StoreError>>;

/// The answer to one commitment claim.
pub(super) type CommitmentReply = oneshot::Sender<Result<KeyClaim, StoreError>>;
/// The answer to one claim operation: the claims it issued or renewed.
pub(super) type ClaimReply = oneshot::Sender<Result<Vec<Claim>, StoreError>>;
/// The answer to one prune.
pub(super) type PruneReply = oneshot::Sender<Result<Vec<Tombstone>, StoreError>>;
/// The answer to one rule write: the rule as stored after it.
pub(super) type RuleReply = oneshot::Sender<Result<ApprovalRule, StoreError>>;
/// The answer to one export cursor's advance.
pub(super) type CursorReply = oneshot::Sender<Result<(), StoreError>>;
/// The answer to one pragma read.
pub(super) type PragmaReply = oneshot::Sender<Result<String, StoreError>>;

/// A claim operation (see `store/claim.rs`).
pub(super) enum ClaimOp {
    Acquire {
        run_id: RunId,
        owner: String,
        now_ms: i64,
        ttl_ms: i64,
    },
    Renew {
        claim: Claim,
        now_ms: i64,
        ttl_ms: i64,
    },
    Release {
        claim: Claim,
        status: Option<String>,
    },
    Claim {
        owner: String,
        now_ms: i64,
        ttl_ms: i64,
        limit: usize,
    },
}

/// What one request produced, before the commit decides whether it stands.
enum Outcome {
    Appended(Result<Appended, StoreError>),
    Claims(Result<Vec<Claim>, StoreError>),
    Pruned(Result<Vec<Tombstone>, StoreError>),
    KeyClaimed(Result<KeyClaim, StoreError>),
    Pragma(Result<String, StoreError>),
    Rule(Result<ApprovalRule, StoreError>),
    Cursor(Result<(), StoreError>),
}

impl Outcome {
    fn is_err(&self) -> bool {
        match self {
            Outcome::Appended(r) => r.is_err(),
            Outcome::Claims(r) => r.is_err(),
            Outcome::Pruned(r) => r.is_err(),
            Outcome::KeyClaimed(r) => r.is_err(),
            Outcome::Pragma(r) => r.is_err(),
            Outcome::Rule(r) => r.is_err(),
            Outcome::Cursor(r) => r.is_err(),
        }
    }
}

/// One write for the writer thread.
pub(super) enum Request {
    Create {
        run_id: RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: String,
        reply: Reply,
    },
    Append {
        run_id: RunId,
        /// The claim the append must still hold (a fenced append).
        fence: Option<Claim>,
        expected_len: u64,
        events: Vec<Bytes>,
        status: ListingStatus,
        /// Deliveries the run owes after the append.
        owes_deliveries: u32,
        /// When the run wakes up, if the append leaves it waiting.
        wake_ms: Option<i64>,
        updated_ms: i64,
        /// The idempotency commitment the append settles.
        settle: Option<Settlement>,
        /// Whether the append may wait for the next synced commit
        /// ([`crate::Durability::Deferred`]).
        deferred: bool,
        reply: Reply,
    },
    Commitment {
        key: String,
        holder: Holder,
        reply: CommitmentReply,
    },
    Claim {
        op: ClaimOp,
        reply: ClaimReply,
    },
    Prune {
        filter: PruneFilter,
        now_ms: i64,
        reply: PruneReply,
    },
    /// Reads a pragma on the writer's own connection (what a write runs
    /// under, such as `synchronous`).
    Pragma {
        name: &'static str,
        reply: PragmaReply,
    },
    /// Adds or revokes a standing approval rule.
    Rule {
        op: RuleOp,
        reply: RuleReply,
    },
    /// Moves an export cursor forward.
    Cursor {
        reader: String,
        run_id: RunId,
        through: u64,
        reply: CursorReply,
    },
}

/// A write to `approval_rules`.
pub(super) enum RuleOp {
    Add(ApprovalRule),
    Revoke { id: String, by: String, at_ms: i64 },
}

impl Request {
    fn events(&self) -> u64 {
        match self {
            Request::Create { .. } => 1,
            Request::Append { events, .. } => events.len() as u64,
            Request::Claim { .. }
            | Request::Prune { .. }
            | Request::Commitment { .. }
            | Request::Rule { .. }
            | Request::Cursor { .. }
            | Request::Pragma { .. } => 0,
        }
    }

    /// Whether the request may commit without an fsync: only a deferred
    /// append. Everything else (claims, commitments, rules, creates, a
    /// pragma read) waits for the disk, and so does every request batched
    /// with it.
    fn deferred(&self) -> bool {
        matches!(self, Request::Append { deferred: true, .. })
    }

    fn answer(self, outcome: Outcome) {
        // The caller may have stopped waiting (its future was dropped).
        match (self, outcome) {
            (
                Request::Create { reply, .. } | Request::Append { reply, .. },
                Outcome::Appended(r),
            ) => {
                let _ = reply.send(r);
            }
            (Request::Claim { reply, .. }, Outcome::Claims(r)) => {
                let _ = reply.send(r);
            }
            (Request::Prune { reply, .. }, Outcome::Pruned(r)) => {
                let _ = reply.send(r);
            }
            (Request::Commitment { reply, .. }, Outcome::KeyClaimed(r)) => {
                let _ = reply.send(r);
            }
            (Request::Pragma { reply, .. }, Outcome::Pragma(r)) => {
                let _ = reply.send(r);
            }
            (Request::Rule { reply, .. }, Outcome::Rule(r)) => {
                let _ = reply.send(r);
            }
            (Request::Cursor { reply, .. }, Outcome::Cursor(r)) => {
                let _ = reply.send(r);
            }
            _ => unreachable!("each request is answered with its own kind of outcome"),
        }
    }

    fn fail(self, error: StoreError) {
        let outcome = match &self {
            Request::Create { .. } | Request::Append { .. } => Outcome::Appended(Err(error)),
            Request::Claim { .. } => Outcome::Claims(Err(error)),
            Request::Prune { .. } => Outcome::Pruned(Err(error)),
            Request::Commitment { .. } => Outcome::KeyClaimed(Err(error)),
            Request::Pragma { .. } => Outcome::Pragma(Err(error)),
            Request::Rule { .. } => Outcome::Rule(Err(error)),
            Request::Cursor { .. } => Outcome::Cursor(Err(error)),
        };
        self.answer(outcome);
    }
}

/// Counters the writer keeps, read through `SqliteStore::stats`.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) transactions: AtomicU64,
    pub(super) deferred_transactions: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) failed_commits: AtomicU64,
    pub(super) lock_retries: AtomicU64,
}

/// How the writer batches, and how long it waits for the write lock.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) max_batch: usize,
    /// In all, per transaction; `None`: as long as it takes.
    pub(super) lock_wait: Option<std::time::Duration>,
}

/// The writer thread's loop: runs until every sender is dropped, then
/// returns (closing the connection) after answering what was queued.
pub(super) fn run(
    mut conn: Connection,
    chain: Arc<Chain>,
    mut queue: mpsc::Receiver<Request>,
    limits: Limits,
    counters: Arc<Counters>,
) {
    let mut batch = Vec::with_capacity(limits.max_batch);
    // The connection opens with synchronous=FULL (`schema.rs`).
    let mut synchronous = Synchronous::Full;
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < limits.max_batch {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        // A batch of deferred appends alone commits without an fsync; any
        // other request in it makes the whole batch wait for the disk.
        let wanted = if batch.iter().all(Request::deferred) {
            Synchronous::Normal
        } else {
            Synchronous::Full
        };
        if wanted != synchronous {
            match conn.execute_batch(wanted.pragma()) {
                Ok(()) => synchronous = wanted,
                // A deferred batch may as well be synced.
                Err(error) if wanted == Synchronous::Normal => {
                    tracing::warn!(%error, "sqlite store: cannot defer a sync; syncing");
                }
                // Never acknowledge a write that needed the disk without it.
                Err(error) => {
                    counters.failed_commits.fetch_add(1, Ordering::Relaxed);
                    let error = Arc::new(error);
                    for request in batch.drain(..) {
                        request.fail(StoreError::Backend {
                            context: "sqlite: cannot set synchronous=FULL".into(),
                            error: Box::new(SharedError(Arc::clone(&error))),
                        });
                    }
                    continue;
                }
            }
        }
        let deferred = synchronous == Synchronous::Normal;
        commit_batch(&mut conn, &chain, &mut batch, &counters, limits, deferred);
    }
    tracing::debug!("sqlite store writer stopped");
}

/// The writer connection's `synchronous` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Synchronous {
    /// A commit fsyncs the WAL.
    Full,
    /// A commit writes the WAL without an fsync (WAL mode).
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "PRAGMA synchronous = FULL",
            Synchronous::Normal => "PRAGMA synchronous = NORMAL",
        }
    }
}

fn commit_batch(
    conn: &mut Connection,
    chain: &Chain,
    batch: &mut Vec<Request>,
    counters: &Counters,
    limits: Limits,
    deferred: bool,
) {
    let started = Instant::now();
    let requests = batch.len();
    let events: u64 = batch.iter().map(Request::events).sum();
    let outcome = loop {
        match apply_all(conn, chain, batch) {
            // Another process held the write lock for a whole busy
            // timeout, before this transaction wrote anything: wait again
            // rather than fail the writes (a tool's completion among them).
            Err(Failed::Busy(error))
                if limits.lock_wait.is_none_or(|wait| started.elapsed() < wait) =>
            {
                counters.lock_retries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    requests,
                    waited = ?started.elapsed(),
                    %error,
                    "the sqlite store's write lock is held by another process; still waiting"
                );
            }
            Err(Failed::Busy(error) | Failed::Other(error)) => break Err(error),
            Ok(results) => break Ok(results),
        }
    };
    match outcome {
        Ok(results) => {
            counters.transactions.fetch_add(1, Ordering::Relaxed);
            if deferred {
                counters
                    .deferred_transactions
                    .fetch_add(1, Ordering::Relaxed);
            }
            counters
                .requests
                .fetch_add(requests as u64, Ordering::Relaxed);
            counters.events.fetch_add(events, Ordering::Relaxed);
            tracing::trace!(requests, events, elapsed = ?started.elapsed(), "committed batch");
            for (request, result) in batch.drain(..).zip(results) {
                request.answer(result);
            }
        }
        Err(error) => {
            counters.failed_commits.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(requests, %error, "sqlite store batch failed; nothing in it was written");
            let error = Arc::new(error);
            for request in batch.drain(..) {
                request.fail(StoreError::Backend {
                    context: format!("sqlite: transaction of {requests} writes failed"),
                    error: Box::new(SharedError(Arc::clone(&error))),
                });
            }
        }
    }
}

/// Why a transaction did not commit.
enum Failed {
    /// It could not take the write lock (nothing was done).
    Busy(rusqlite::Error),
    Other(rusqlite::Error),
}

impl From<rusqlite::Error> for Failed {
    fn from(error: rusqlite::Error) -> Self {
        Failed::Other(error)
    }
}

/// Applies every request in one transaction, each in its own savepoint, and
/// commits. `Err` means the transaction did not commit.
fn apply_all(
    conn: &mut Connection,
    chain: &Chain,
    batch: &[Request],
) -> Result<Vec<Outcome>, Failed> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Failed::Busy(e)
            }
            _ => Failed::Other(e),
        })?;
    let mut results = Vec::with_capacity(batch.len());
    for request in batch {
        tx.prepare_cached("SAVEPOINT request")?.execute([])?;
        let result = match request {
            Request::Create {
                run_id,
                meta,
                first_event,
                status,
                ..
            } => Outcome::Appended(create(&tx, chain, run_id, meta, first_event, status)),
            Request::Append {
                run_id,
                fence,
                expected_len,
                events,
                status,
                owes_deliveries,
                wake_ms,
                updated_ms,
                settle,
                ..
            } => Outcome::Appended(append_settling(
                &tx,
                chain,
                run_id,
                fence.as_ref(),
                *expected_len,
                events,
                Listing::new(*status)
                    .owing(*owes_deliveries)
                    .waking_at(*wake_ms),
                *updated_ms,
                settle.as_ref(),
            )),
            Request::Commitment { key, holder, .. } => {
                Outcome::KeyClaimed(claim_commitment(&tx, chain, key, holder))
            }
            Request::Claim { op, .. } => Outcome::Claims(claim(&tx, op)),
            Request::Prune { filter, now_ms, .. } => Outcome::Pruned(prune(&tx, filter, *now_ms)),
            Request::Rule { op, .. } => Outcome::Rule(write_rule(&tx, chain, op)),
            Request::Cursor {
                reader,
                run_id,
                through,
                ..
            } => Outcome::Cursor(advance_cursor(&tx, reader, run_id, *through)),
            Request::Pragma { name, .. } => Outcome::Pragma(
                tx.query_row(&format!("PRAGMA {name}"), [], |row| {
                    row.get::<_, rusqlite::types::Value>(0)
                })
                .map(|v| match v {
                    rusqlite::types::Value::Integer(n) => n.to_string(),
                    rusqlite::types::Value::Text(t) => t,
                    other => format!("{other:?}"),
                })
                .map_err(|e| backend(format!("sqlite: cannot read PRAGMA {name}"), e)),
            ),
        };
        if result.is_err() {
            tx.prepare_cached("ROLLBACK TO request")?.execute([])?;
        }
        tx.prepare_cached("RELEASE request")?.execute([])?;
        results.push(result);
    }
    tx.commit()?;
    Ok(results)
}

fn create(
    conn: &Connection,
    chain: &Chain,
    run_id: &RunId,
    meta: &RunMeta,
    first_event: &Bytes,
    status: &str,
) -> Result<Appended, StoreError> {
    let context = || format!("sqlite: cannot create run {run_id}");
    let exists = conn
        .prepare_cached(
            "SELECT 1 FROM runs WHERE id = ?1 UNION ALL SELECT 1 FROM tombstones WHERE id = ?1",
        )
        .and_then(|mut s| s.query_row([run_id.as_str()], |_| Ok(())).optional())
        .map_err(|e| backend(context(), e))?;
    if exists.is_some() {
        return Err(StoreError::AlreadyExists {
            run_id: run_id.clone(),
        });
    }
    if let Some(session) = &meta.session {
        // The unique index `runs_one_active_per_session` backs this up; the
        // query names the run that holds the session.
        let active: Option<String> = conn
            .prepare_cached(concat!(
                "SELECT id FROM runs WHERE session = ?1 AND status NOT IN (",
                settled_sql!(),
                ") LIMIT 1"
            ))
            .and_then(|mut s| s.query_row([session], |r| r.get(0)).optional())
            .map_err(|e| backend(context(), e))?;
        if let Some(active) = active {
            return Err(StoreError::SessionBusy {
                session: session.clone(),
                active_run: RunId::new(&active).map_err(|e| StoreError::Backend {
                    context: context(),
                    error: Box::new(e),
                })?,
            });
        }
        if let Some(expected) = meta.session_runs {
            let found: i64 = conn
                .prepare_cached("SELECT runs FROM sessions WHERE session = ?1")
                .and_then(|mut s| s.query_row([session], |r| r.get(0)).optional())
                .map_err(|e| backend(context(), e))?
                .unwrap_or(0);
            if found as u64 != expected {
                return Err(StoreError::SessionChanged {
                    session: session.clone(),
                    expected,
                    found: found as u64,
                });
            }
        }
    }
    crate::history::check_new_chunks(&meta.history, meta.history_head.as_ref(), |digest| {
        conn.prepare_cached("SELECT 1 FROM history_chunks WHERE digest = ?1")
            .and_then(|mut s| {
                s.query_row([digest.as_bytes().as_slice()], |_| Ok(()))
                    .optional()
            })
            .map(|found| found.is_some())
            .map_err(|e| backend(context(), e))
    })?;
    let head = chain.link(&chain.genesis(run_id), 1, first_event);
    let write = || -> rusqlite::Result<()> {
        let mut chunk = conn.prepare_cached(
            "INSERT INTO history_chunks (digest, previous, body) VALUES (?1, ?2, ?3)
             ON CONFLICT (digest) DO NOTHING",
        )?;
        for c in &meta.history {
            chunk.execute(params![
                c.digest().as_bytes().as_slice(),
                c.previous().map(|p| p.as_bytes().to_vec()),
                c.body().as_ref()
            ])?;
        }
        conn.prepare_cached(
            "INSERT INTO runs (id, agent, status, session, created_ms, updated_ms, event_count, head_hash, history_head)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, 1, ?6, ?7)",
        )?
        .execute(params![
            run_id.as_str(),
            meta.agent,
            status,
            meta.session,
            meta.created_ms,
            head.as_bytes().as_slice(),
            meta.history_head.map(|h| h.as_bytes().to_vec())
        ])?;
        let pk = conn.last_insert_rowid();
        let mut label =
            conn.prepare_cached("INSERT INTO run_labels (run_pk, key, value) VALUES (?1, ?2, ?3)")?;
        for (key, value) in &meta.labels {
            label.execute(params![pk, key, value])?;
        }
        conn.prepare_cached(
            "INSERT INTO events (run_pk, seq, bytes, hash) VALUES (?1, 1, ?2, ?3)",
        )?
        .execute(params![
            pk,
            first_event.as_ref(),
            head.as_bytes().as_slice()
        ])?;
        Ok(())
    };
    write().map_err(|e| backend(context(), e))?;
    Ok(Appended {
        event_count: 1,
        head,
    })
}

/// Claims commitment `key` for `holder` (see `EventStore::claim_commitment`):
/// a new row is written sealed; the row found is acted on only if its seal
/// matches.
fn claim_commitment(
    conn: &Connection,
    chain: &Chain,
    key: &str,
    holder: &Holder,
) -> Result<KeyClaim, StoreError> {
    let context = || format!("sqlite: cannot claim idempotency commitment {key}");
    let seal = sealed::commitment(chain, key, holder.run_id.as_str(), &holder.call_id, None);
    conn.prepare_cached(
        "INSERT INTO commitments (key, run_id, call_id, seal) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (key) DO NOTHING",
    )
    .and_then(|mut s| {
        s.execute(params![
            key,
            holder.run_id.as_str(),
            holder.call_id,
            seal.as_bytes().as_slice()
        ])
    })
    .map_err(|e| backend(context(), e))?;
    let (run_id, call_id, result) = commitment(conn, chain, key)?
        .expect("the commitment exists: it was just inserted or found");
    let found = Holder {
        run_id: RunId::new(&run_id).map_err(|e| StoreError::Backend {
            context: context(),
            error: Box::new(e),
        })?,
        call_id,
    };
    Ok(match result {
        Some(result) => KeyClaim::Settled {
            holder: found,
            result: Bytes::from(result),
        },
        None if found == *holder => KeyClaim::Granted,
        None => KeyClaim::Held(found),
    })
}

/// Adds or revokes a rule, sealed; answers with the rule as it then
/// stands. A revocation acts only on a rule whose seal matches: resealing
/// an edited row would make the edit pass.
fn write_rule(conn: &Connection, chain: &Chain, op: &RuleOp) -> Result<ApprovalRule, StoreError> {
    match op {
        RuleOp::Add(rule) => {
            let context = || format!("sqlite: cannot add approval rule {}", rule.id);
            let seal = sealed::rule(chain, rule);
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO approval_rules (id, spec, created_by, created_ms, expires_ms, seal)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO NOTHING",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        rule.id,
                        rule.spec,
                        rule.created_by,
                        rule.created_ms,
                        rule.expires_ms,
                        seal.as_bytes().as_slice()
                    ])
                })
                .map_err(|e| backend(context(), e))?;
            if inserted == 0 {
                return Err(StoreError::RuleExists {
                    id: rule.id.clone(),
                });
            }
            Ok(rule.clone())
        }
        RuleOp::Revoke { id, by, at_ms } => {
            let context = || format!("sqlite: cannot revoke approval rule {id}");
            let mut rule = super::rule(conn, chain, id)?
                .ok_or_else(|| StoreError::UnknownRule { id: id.clone() })?;
            if rule.revoked.is_some() {
                return Ok(rule);
            }
            rule.revoked = Some(Revocation {
                by: by.clone(),
                at_ms: *at_ms,
            });
            let seal = sealed::rule(chain, &rule);
            conn.prepare_cached(
                "UPDATE approval_rules SET revoked_by = ?2, revoked_ms = ?3, seal = ?4
                 WHERE id = ?1 AND revoked_by IS NULL",
            )
            .and_then(|mut s| s.execute(params![id, by, at_ms, seal.as_bytes().as_slice()]))
            .map_err(|e| backend(context(), e))?;
            Ok(rule)
        }
    }
}

/// Moves `reader`'s cursor on `run_id` to `through`, never back.
fn advance_cursor(
    conn: &Connection,
    reader: &str,
    run_id: &RunId,
    through: u64,
) -> Result<(), StoreError> {
    let through = i64::try_from(through).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "INSERT INTO export_cursors (reader, run_id, through) VALUES (?1, ?2, ?3)
         ON CONFLICT (reader, run_id) DO UPDATE SET through = excluded.through
         WHERE excluded.through > export_cursors.through",
    )
    .and_then(|mut s| s.execute(params![reader, run_id.as_str(), through]))
    .map_err(|e| {
        backend(
            format!("sqlite: cannot advance export cursor {reader} on run {run_id}"),
            e,
        )
    })?;
    Ok(())
}

/// A commitment row: holder run, holder call, result once settled.
type CommitmentRow = (String, String, Option<Vec<u8>>);

/// A commitment row as stored: [`CommitmentRow`] and its seal.
type SealedCommitmentRow = (String, String, Option<Vec<u8>>, Option<Vec<u8>>);

/// The row of commitment `key`, its seal checked.
fn commitment(
    conn: &Connection,
    chain: &Chain,
    key: &str,
) -> Result<Option<CommitmentRow>, StoreError> {
    let row: Option<SealedCommitmentRow> = conn
        .prepare_cached("SELECT run_id, call_id, result, seal FROM commitments WHERE key = ?1")
        .and_then(|mut s| {
            s.query_row([key], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
        })
        .map_err(|e| {
            backend(
                format!("sqlite: cannot read idempotency commitment {key}"),
                e,
            )
        })?;
    let Some((run_id, call_id, result, seal)) = row else {
        return Ok(None);
    };
    let expected = sealed::commitment(chain, key, &run_id, &call_id, result.as_deref());
    sealed::check(sealed::COMMITMENTS, key, seal.as_deref(), &expected)?;
    Ok(Some((run_id, call_id, result)))
}

/// Appends, and settles `settle`'s commitment in the same savepoint.
#[allow(clippy::too_many_arguments)]
fn append_settling(
    conn: &Connection,
    chain: &Chain,
    run_id: &RunId,
    fence: Option<&Claim>,
    expected_len: u64,
    events: &[Bytes],
    listing: Listing,
    updated_ms: i64,
    settle: Option<&Settlement>,
) -> Result<Appended, StoreError> {
    let Some(settle) = settle else {
        return append(
            conn,
            chain,
            run_id,
            fence,
            expected_len,
            events,
            listing,
            updated_ms,
        );
    };
    let context = || {
        format!(
            "sqlite: cannot settle idempotency commitment {}",
            settle.key
        )
    };
    let row = commitment(conn, chain, &settle.key)?;
    let release = settle.outcome == Settle::Release;
    let held = matches!(
        &row,
        Some((run, call, result))
            if run == settle.holder.run_id.as_str()
                && *call == settle.holder.call_id
                && (result.is_none() || release)
    );
    if !held {
        return Err(StoreError::CommitmentNotHeld {
            key: settle.key.clone(),
            run_id: settle.holder.run_id.clone(),
            call_id: settle.holder.call_id.clone(),
        });
    }
    let appended = append(
        conn,
        chain,
        run_id,
        fence,
        expected_len,
        events,
        listing,
        updated_ms,
    )?;
    match &settle.outcome {
        Settle::Result(result) => {
            let seal = sealed::commitment(
                chain,
                &settle.key,
                settle.holder.run_id.as_str(),
                &settle.holder.call_id,
                Some(result),
            );
            conn.prepare_cached("UPDATE commitments SET result = ?2, seal = ?3 WHERE key = ?1")
                .and_then(|mut s| {
                    s.execute(params![
                        settle.key,
                        result.as_ref(),
                        seal.as_bytes().as_slice()
                    ])
                })
        }
        Settle::Release => conn
            .prepare_cached("DELETE FROM commitments WHERE key = ?1")
            .and_then(|mut s| s.execute(params![settle.key])),
    }
    .map_err(|e| backend(context(), e))?;
    Ok(appended)
}

#[allow(clippy::too_many_arguments)]
fn append(
    conn: &Connection,
    chain: &Chain,
    run_id: &RunId,
    fence: Option<&Claim>,
    expected_len: u64,
    events: &[Bytes],
    listing: Listing,
    updated_ms: i64,
) -> Result<Appended, StoreError> {
    let context = || format!("sqlite: cannot append to run {run_id}");
    let tampered = |finding: (u64, ChainBreak)| StoreError::Tampered {
        run_id: run_id.clone(),
        seq: finding.0,
        reason: finding.1,
    };
    let row = conn
        .prepare_cached(
            "SELECT pk, event_count, head_hash, lease_owner, lease_token, status, owes_deliveries, wake_ms
             FROM runs WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([run_id.as_str()], |row| {
                Ok((
                    (
                        row.get::<_, i64>(0)?,
                        row.get::<_, i64>(1)?,
                        blob_hash(row, 2)?,
                        row.get::<_, Option<String>>(3)?,
                        row.get::<_, i64>(4)?,
                    ),
                    (
                        row.get::<_, String>(5)?,
                        row.get::<_, i64>(6)?,
                        row.get::<_, Option<i64>>(7)?,
                    ),
                ))
            })
            .optional()
        })
        .map_err(|e| backend(context(), e))?;
    let Some(((pk, count, head, owner, token), listed)) = row else {
        return Err(super::unknown(conn, run_id));
    };
    // Most appends leave the listing as it was: then the columns the
    // indexes cover are not written, so the commit rewrites no index page
    // (a third fewer WAL pages per append).
    let listing_unchanged = listed.0 == listing.status.name()
        && listed.1 == i64::from(listing.owes_deliveries)
        && listed.2 == listing.wake_ms;
    if let Some(claim) = fence {
        // A child run is fenced by the claim of the run driving it, read in
        // this same transaction (the writer's `BEGIN IMMEDIATE`).
        let (owner, token) = if claim.run_id == *run_id {
            (owner, token)
        } else {
            conn.prepare_cached("SELECT lease_owner, lease_token FROM runs WHERE id = ?1")
                .and_then(|mut s| {
                    s.query_row([claim.run_id.as_str()], |row| {
                        Ok((row.get::<_, Option<String>>(0)?, row.get::<_, i64>(1)?))
                    })
                    .optional()
                })
                .map_err(|e| backend(context(), e))?
                .ok_or_else(|| super::unknown(conn, &claim.run_id))?
        };
        if token as u64 != claim.token || owner.as_deref() != Some(claim.owner.as_str()) {
            return Err(StoreError::Fenced {
                run_id: claim.run_id.clone(),
                token: claim.token,
                current: token as u64,
            });
        }
    }
    let count = u64::try_from(count).map_err(|_| {
        let detail = format!("the run records {count} events");
        tampered((0, ChainBreak::Unreadable { detail }))
    })?;
    if count != expected_len {
        return Err(StoreError::Conflict {
            run_id: run_id.clone(),
            expected: expected_len,
            actual: count,
        });
    }
    let head: ChainHash = head.map_err(|kind| tampered((count, kind)))?;
    let tail = conn
        .prepare_cached(
            "SELECT seq, hash FROM events WHERE run_pk = ?1 AND seq >= ?2 ORDER BY seq LIMIT 2",
        )
        .and_then(|mut s| {
            s.query_map(params![pk, count as i64], |row| {
                Ok((
                    u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0),
                    blob_hash(row, 1)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(|e| backend(context(), e))?;
    chain::check_tail(count, &head, &tail).map_err(|f| tampered((f.seq, f.kind)))?;

    let hashes = chain.extend(head, count, events);
    let write = || -> rusqlite::Result<()> {
        let mut insert = conn.prepare_cached(
            "INSERT INTO events (run_pk, seq, bytes, hash) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (seq, (bytes, hash)) in (count + 1..).zip(events.iter().zip(&hashes)) {
            insert.execute(params![
                pk,
                seq as i64,
                bytes.as_ref(),
                hash.as_bytes().as_slice()
            ])?;
        }
        let new_head = hashes.last().expect("events is not empty");
        let new_count = (count + events.len() as u64) as i64;
        if listing_unchanged {
            conn.prepare_cached(
                "UPDATE runs SET updated_ms = ?1, event_count = ?2, head_hash = ?3 WHERE pk = ?4",
            )?
            .execute(params![
                updated_ms,
                new_count,
                new_head.as_bytes().as_slice(),
                pk
            ])?;
            return Ok(());
        }
        conn.prepare_cached(
            "UPDATE runs SET status = ?1, updated_ms = ?2, event_count = ?3, head_hash = ?4,
                 owes_deliveries = ?5, wake_ms = ?6
             WHERE pk = ?7",
        )?
        .execute(params![
            listing.status.name(),
            updated_ms,
            new_count,
            new_head.as_bytes().as_slice(),
            listing.owes_deliveries,
            listing.wake_ms,
            pk
        ])?;
        Ok(())
    };
    write().map_err(|e| backend(context(), e))?;
    Ok(Appended {
        event_count: count + events.len() as u64,
        head: *hashes.last().expect("events is not empty"),
    })
}

/// The claim columns of a run, read inside the writer's transaction.
struct ClaimRow {
    owner: Option<String>,
    token: u64,
    expires_ms: Option<i64>,
}

impl ClaimRow {
    fn read(conn: &Connection, run_id: &RunId) -> Result<ClaimRow, StoreError> {
        conn.prepare_cached(
            "SELECT lease_owner, lease_token, lease_expires_ms FROM runs WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([run_id.as_str()], |row| {
                Ok(ClaimRow {
                    owner: row.get(0)?,
                    token: row.get::<_, i64>(1)? as u64,
                    expires_ms: row.get(2)?,
                })
            })
            .optional()
        })
        .map_err(|e| backend(format!("sqlite: cannot read the claim of run {run_id}"), e))?
        .ok_or_else(|| super::unknown(conn, run_id))
    }

    /// The live claim's owner and expiry at `now_ms`, if any.
    fn live(&self, now_ms: i64) -> Option<(&str, i64)> {
        match (&self.owner, self.expires_ms) {
            (Some(owner), Some(expires)) if expires > now_ms => Some((owner, expires)),
            _ => None,
        }
    }

    fn holds(&self, claim: &Claim) -> bool {
        self.token == claim.token && self.owner.as_deref() == Some(claim.owner.as_str())
    }
}

/// Issues the next claim on run `run_id` (its checks already done).
fn issue(
    conn: &Connection,
    run_id: &RunId,
    owner: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> rusqlite::Result<Claim> {
    let expires_ms = now_ms.saturating_add(ttl_ms);
    let token: i64 = conn
        .prepare_cached(
            "UPDATE runs SET lease_owner = ?2, lease_token = lease_token + 1, lease_expires_ms = ?3
             WHERE id = ?1 RETURNING lease_token",
        )?
        .query_row(params![run_id.as_str(), owner, expires_ms], |row| {
            row.get(0)
        })?;
    Ok(Claim {
        run_id: run_id.clone(),
        owner: owner.to_owned(),
        token: token as u64,
        expires_ms,
    })
}

fn claim(conn: &Connection, op: &ClaimOp) -> Result<Vec<Claim>, StoreError> {
    match op {
        ClaimOp::Acquire {
            run_id,
            owner,
            now_ms,
            ttl_ms,
        } => {
            let row = ClaimRow::read(conn, run_id)?;
            if let Some((holder, expires_ms)) = row.live(*now_ms)
                && holder != owner
            {
                return Err(StoreError::Claimed {
                    run_id: run_id.clone(),
                    owner: holder.to_owned(),
                    expires_ms,
                });
            }
            let claim = issue(conn, run_id, owner, *now_ms, *ttl_ms)
                .map_err(|e| backend(format!("sqlite: cannot claim run {run_id}"), e))?;
            Ok(vec![claim])
        }
        ClaimOp::Renew {
            claim,
            now_ms,
            ttl_ms,
        } => {
            let row = ClaimRow::read(conn, &claim.run_id)?;
            if !row.holds(claim) {
                return Err(StoreError::Fenced {
                    run_id: claim.run_id.clone(),
                    token: claim.token,
                    current: row.token,
                });
            }
            let expires_ms = now_ms.saturating_add(*ttl_ms);
            conn.prepare_cached("UPDATE runs SET lease_expires_ms = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute(params![claim.run_id.as_str(), expires_ms]))
                .map_err(|e| {
                    backend(
                        format!("sqlite: cannot renew the claim of run {}", claim.run_id),
                        e,
                    )
                })?;
            Ok(vec![Claim {
                expires_ms,
                ..claim.clone()
            }])
        }
        ClaimOp::Release { claim, status } => {
            let row = ClaimRow::read(conn, &claim.run_id)?;
            if row.holds(claim) {
                conn.prepare_cached(
                    "UPDATE runs SET lease_owner = NULL, lease_expires_ms = NULL,
                         status = coalesce(?2, status)
                     WHERE id = ?1",
                )
                .and_then(|mut s| s.execute(params![claim.run_id.as_str(), status]))
                .map_err(|e| {
                    backend(
                        format!("sqlite: cannot release the claim of run {}", claim.run_id),
                        e,
                    )
                })?;
            }
            Ok(Vec::new())
        }
        ClaimOp::Claim {
            owner,
            now_ms,
            ttl_ms,
            limit,
        } => {
            let context = || format!("sqlite: cannot claim runs for {owner}");
            let ids: Vec<String> = conn
                .prepare_cached(
                    "SELECT id FROM runs
                     WHERE (((status IN (?1, ?5) OR owes_deliveries > 0)
                             AND (status = ?1 OR lease_token > 0))
                            OR (status = ?4 AND wake_ms <= ?2))
                       AND (lease_owner IS NULL OR lease_expires_ms <= ?2)
                     ORDER BY created_ms, id LIMIT ?3",
                )
                .and_then(|mut s| {
                    s.query_map(
                        params![
                            QUEUED,
                            now_ms,
                            i64::try_from(*limit).unwrap_or(i64::MAX),
                            WAITING,
                            RUNNING
                        ],
                        |row| row.get(0),
                    )?
                    .collect()
                })
                .map_err(|e| backend(context(), e))?;
            ids.into_iter()
                .filter_map(|id| RunId::new(id).ok())
                .map(|id| {
                    issue(conn, &id, owner, *now_ms, *ttl_ms).map_err(|e| backend(context(), e))
                })
                .collect()
        }
    }
}

fn prune(
    conn: &Connection,
    filter: &PruneFilter,
    now_ms: i64,
) -> Result<Vec<Tombstone>, StoreError> {
    let context = || "sqlite: cannot prune runs".to_owned();
    let Some(before) = filter.updated_before.filter(|_| !filter.is_empty()) else {
        return Ok(Vec::new());
    };
    let mut doomed = Vec::new();
    {
        let mut select = conn
            .prepare_cached(
                "SELECT pk, id, agent, status, created_ms, updated_ms, event_count, head_hash
                 FROM runs
                 WHERE status = ?1 AND updated_ms < ?2
                   AND (lease_owner IS NULL OR lease_expires_ms <= ?3)
                   AND owes_deliveries = 0
                 ORDER BY id",
            )
            .map_err(|e| backend(context(), e))?;
        for status in &filter.statuses {
            let rows = select
                .query_map(params![status, before, now_ms], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, i64>(4)?,
                        row.get::<_, i64>(5)?,
                        row.get::<_, i64>(6)?,
                        blob_hash(row, 7)?,
                    ))
                })
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(|e| backend(context(), e))?;
            doomed.extend(rows);
        }
    }
    let mut tombstones = Vec::new();
    for (pk, id, agent, status, created_ms, updated_ms, count, head) in doomed {
        let Ok(run_id) = RunId::new(id) else { continue };
        // A run whose head is unreadable is damaged: keep it for a human.
        let Ok(head) = head else { continue };
        let write = || -> rusqlite::Result<()> {
            conn.prepare_cached("DELETE FROM events WHERE run_pk = ?1")?
                .execute([pk])?;
            conn.prepare_cached("DELETE FROM run_labels WHERE run_pk = ?1")?
                .execute([pk])?;
            conn.prepare_cached("DELETE FROM runs WHERE pk = ?1")?
                .execute([pk])?;
            conn.prepare_cached(
                "INSERT INTO tombstones (id, agent, status, created_ms, updated_ms, event_count, head_hash, pruned_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                run_id.as_str(),
                agent,
                status,
                created_ms,
                updated_ms,
                count,
                head.as_bytes().as_slice(),
                now_ms
            ])?;
            Ok(())
        };
        write().map_err(|e| backend(context(), e))?;
        tombstones.push(Tombstone {
            run_id,
            agent,
            status,
            created_ms,
            updated_ms,
            event_count: count as u64,
            head,
            pruned_ms: now_ms,
        });
    }
    tombstones.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    if !tombstones.is_empty() {
        // The history chunks no remaining run's history reaches go with
        // the runs (the writer holds the only write transaction, so no
        // start links to one in between).
        conn.prepare_cached(crate::history::DELETE_UNREACHED_SQL)
            .and_then(|mut s| s.execute([]))
            .map_err(|e| backend(context(), e))?;
    }
    Ok(tombstones)
}

/// One commit failure shared by every request of the batch.
#[derive(Debug)]
struct SharedError(Arc<rusqlite::Error>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {}
