//! The SQLite store's writer thread and its group commit.
//!
//! One dedicated thread owns the only writing connection. Creates and appends
//! reach it over a channel; it takes everything queued (up to a batch limit),
//! applies each request inside its own savepoint of one `BEGIN IMMEDIATE`
//! transaction, commits once (one WAL fsync under `synchronous=FULL`), and
//! only then answers each request with its own result. A request that fails
//! (a conflict, an unknown run, a damaged run) is rolled back to its
//! savepoint alone; the others in the batch still commit. If the commit
//! itself fails, every request in the batch gets the error: nothing is
//! acknowledged that was not synced.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};

use super::{backend, blob_hash};
use crate::store::chain::{self, Chain};
use crate::store::{
    Appended, ChainBreak, ChainHash, Claim, Holder, RunId, RunMeta, Settlement, StoreError,
};

/// The answer to one create or append.
pub(super) type Reply = oneshot::Sender<Result<Appended, StoreError>>;

/// The answer to one claim.
pub(super) type ClaimReply = oneshot::Sender<Result<Claim, StoreError>>;

/// What one request produced, before it is sent back.
enum Answer {
    Appended(Result<Appended, StoreError>),
    Claimed(Result<Claim, StoreError>),
}

impl Answer {
    fn is_err(&self) -> bool {
        matches!(self, Answer::Appended(Err(_)) | Answer::Claimed(Err(_)))
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
        expected_len: u64,
        events: Vec<Bytes>,
        status: String,
        updated_ms: i64,
        settle: Option<Settlement>,
        reply: Reply,
    },
    Claim {
        key: String,
        holder: Holder,
        reply: ClaimReply,
    },
}

impl Request {
    fn events(&self) -> u64 {
        match self {
            Request::Create { .. } => 1,
            Request::Append { events, .. } => events.len() as u64,
            Request::Claim { .. } => 0,
        }
    }

    fn answer(self, answer: Answer) {
        // The caller may have stopped waiting (its future was dropped).
        match (self, answer) {
            (
                Request::Create { reply, .. } | Request::Append { reply, .. },
                Answer::Appended(r),
            ) => {
                let _ = reply.send(r);
            }
            (Request::Claim { reply, .. }, Answer::Claimed(r)) => {
                let _ = reply.send(r);
            }
            _ => unreachable!("each request is answered in its own kind"),
        }
    }

    fn fail(self, error: StoreError) {
        match self {
            Request::Create { reply, .. } | Request::Append { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Request::Claim { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// Counters the writer keeps, read through `SqliteStore::stats`.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) transactions: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) failed_commits: AtomicU64,
}

/// The writer thread's loop: runs until every sender is dropped, then
/// returns (closing the connection) after answering what was queued.
pub(super) fn run(
    mut conn: Connection,
    chain: Arc<Chain>,
    mut queue: mpsc::Receiver<Request>,
    max_batch: usize,
    counters: Arc<Counters>,
) {
    let mut batch = Vec::with_capacity(max_batch);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        commit_batch(&mut conn, &chain, &mut batch, &counters);
    }
    tracing::debug!("sqlite store writer stopped");
}

fn commit_batch(
    conn: &mut Connection,
    chain: &Chain,
    batch: &mut Vec<Request>,
    counters: &Counters,
) {
    let started = Instant::now();
    let requests = batch.len();
    let events: u64 = batch.iter().map(Request::events).sum();
    let outcome = apply_all(conn, chain, batch);
    match outcome {
        Ok(results) => {
            counters.transactions.fetch_add(1, Ordering::Relaxed);
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

/// Applies every request in one transaction, each in its own savepoint, and
/// commits. `Err` means the transaction did not commit.
fn apply_all(
    conn: &mut Connection,
    chain: &Chain,
    batch: &[Request],
) -> Result<Vec<Answer>, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
            } => Answer::Appended(create(&tx, chain, run_id, meta, first_event, status)),
            Request::Append {
                run_id,
                expected_len,
                events,
                status,
                updated_ms,
                settle,
                ..
            } => Answer::Appended(append_settling(
                &tx,
                chain,
                run_id,
                *expected_len,
                events,
                status,
                *updated_ms,
                settle.as_ref(),
            )),
            Request::Claim { key, holder, .. } => Answer::Claimed(claim(&tx, key, holder)),
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
        .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")
        .and_then(|mut s| s.query_row([run_id.as_str()], |_| Ok(())).optional())
        .map_err(|e| backend(context(), e))?;
    if exists.is_some() {
        return Err(StoreError::AlreadyExists {
            run_id: run_id.clone(),
        });
    }
    let head = chain.link(&chain.genesis(run_id), 1, first_event);
    let write = || -> rusqlite::Result<()> {
        conn.prepare_cached(
            "INSERT INTO runs (id, agent, status, session, created_ms, updated_ms, event_count, head_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, 1, ?6)",
        )?
        .execute(params![
            run_id.as_str(),
            meta.agent,
            status,
            meta.session,
            meta.created_ms,
            head.as_bytes().as_slice()
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

/// Claims commitment `key` for `holder` (see `EventStore::claim`).
fn claim(conn: &Connection, key: &str, holder: &Holder) -> Result<Claim, StoreError> {
    let context = || format!("sqlite: cannot claim idempotency commitment {key}");
    conn.prepare_cached(
        "INSERT INTO commitments (key, run_id, call_id) VALUES (?1, ?2, ?3) ON CONFLICT (key) DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![key, holder.run_id.as_str(), holder.call_id]))
    .map_err(|e| backend(context(), e))?;
    let (run_id, call_id, result) = commitment(conn, key)
        .map_err(|e| backend(context(), e))?
        .expect("the commitment exists: it was just inserted or found");
    let found = Holder {
        run_id: RunId::new(&run_id).map_err(|e| StoreError::Backend {
            context: context(),
            error: Box::new(e),
        })?,
        call_id,
    };
    Ok(match result {
        Some(result) => Claim::Settled {
            holder: found,
            result: Bytes::from(result),
        },
        None if found == *holder => Claim::Granted,
        None => Claim::Held(found),
    })
}

/// A commitment row: holder run, holder call, result once settled.
type CommitmentRow = (String, String, Option<Vec<u8>>);

/// The row of commitment `key`.
fn commitment(conn: &Connection, key: &str) -> rusqlite::Result<Option<CommitmentRow>> {
    conn.prepare_cached("SELECT run_id, call_id, result FROM commitments WHERE key = ?1")?
        .query_row([key], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()
}

/// Appends, and settles `settle`'s commitment in the same savepoint.
#[allow(clippy::too_many_arguments)]
fn append_settling(
    conn: &Connection,
    chain: &Chain,
    run_id: &RunId,
    expected_len: u64,
    events: &[Bytes],
    status: &str,
    updated_ms: i64,
    settle: Option<&Settlement>,
) -> Result<Appended, StoreError> {
    let Some(settle) = settle else {
        return append(
            conn,
            chain,
            run_id,
            expected_len,
            events,
            status,
            updated_ms,
        );
    };
    let context = || {
        format!(
            "sqlite: cannot settle idempotency commitment {}",
            settle.key
        )
    };
    let row = commitment(conn, &settle.key).map_err(|e| backend(context(), e))?;
    let held = matches!(
        &row,
        Some((run, call, None)) if run == settle.holder.run_id.as_str() && *call == settle.holder.call_id
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
        expected_len,
        events,
        status,
        updated_ms,
    )?;
    conn.prepare_cached("UPDATE commitments SET result = ?2 WHERE key = ?1")
        .and_then(|mut s| s.execute(params![settle.key, settle.result.as_ref()]))
        .map_err(|e| backend(context(), e))?;
    Ok(appended)
}

fn append(
    conn: &Connection,
    chain: &Chain,
    run_id: &RunId,
    expected_len: u64,
    events: &[Bytes],
    status: &str,
    updated_ms: i64,
) -> Result<Appended, StoreError> {
    let context = || format!("sqlite: cannot append to run {run_id}");
    let tampered = |finding: (u64, ChainBreak)| StoreError::Tampered {
        run_id: run_id.clone(),
        seq: finding.0,
        reason: finding.1,
    };
    let row = conn
        .prepare_cached("SELECT pk, event_count, head_hash FROM runs WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row([run_id.as_str()], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    blob_hash(row, 2)?,
                ))
            })
            .optional()
        })
        .map_err(|e| backend(context(), e))?;
    let Some((pk, count, head)) = row else {
        return Err(StoreError::UnknownRun {
            run_id: run_id.clone(),
        });
    };
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
        conn.prepare_cached(
            "UPDATE runs SET status = ?1, updated_ms = ?2, event_count = ?3, head_hash = ?4 WHERE pk = ?5",
        )?
        .execute(params![
            status,
            updated_ms,
            (count + events.len() as u64) as i64,
            new_head.as_bytes().as_slice(),
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

/// One commit failure shared by every request of the batch.
#[derive(Debug)]
struct SharedError(Arc<rusqlite::Error>);

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {}
