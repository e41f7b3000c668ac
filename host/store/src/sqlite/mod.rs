//! The SQLite store: one database file in WAL mode, the embedded default.
//!
//! Writes go through one dedicated writer thread with group commit (see
//! `writer.rs`); reads run on a small pool of query-only connections on
//! `max_readers` threads of the store's own, each inside one read
//! transaction so a load sees the run row and its events at the same
//! instant. No SQLite call runs on the async executor, nor on tokio's
//! blocking pool: plugins' filesystem calls run there, and one stuck on a
//! file whose read never returns can fill it.
//!
//! Durability: `synchronous=FULL` in WAL mode fsyncs the WAL on every
//! commit, and a write is answered only after its transaction committed. A
//! transaction holding only deferred appends ([`Durability::Deferred`])
//! commits under `synchronous=NORMAL`: its WAL frames are written (a killed
//! process loses nothing) but not fsynced; the next commit under FULL
//! fsyncs the WAL file, and with it every frame before its own. WAL
//! recovery stops at the first frame whose cumulative checksum fails, so
//! what a machine crash leaves is a prefix of the commits.
//! Several processes may open the same file: each writer takes SQLite's
//! write lock with `BEGIN IMMEDIATE` (waiting up to the busy timeout), and
//! every check an append makes (length, tail, head) reads the database
//! inside that transaction, never a cache.
//!
//! Schema (version 11, see `schema.rs`): `runs` (one row per run: text id,
//! agent, status, session, created/updated ms, event count, chain head, the
//! claim: owner, fencing token, expiry; the deliveries it owes),
//! `run_labels` (one row per label), `events` (run, seq, bytes, hash; one
//! run's events contiguous), `tombstones` (pruned runs), `commitments`
//! and `approval_rules` (each row sealed, see `store/sealed.rs`),
//! `history_chunks`, `export_cursors`, `store_meta` (the chain mode).
//!
//! Claims (see `store/claim.rs`) hold across processes on one machine: every
//! claim operation and fenced append runs in the writer's `BEGIN IMMEDIATE`
//! transaction, which SQLite's file lock serializes between processes.

mod schema;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, params};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::chain::{self, Chain, RawRow, Recorded};
use super::history::{self, HistoryChunk, HistoryDigest};
use super::sealed;
use super::{
    Appended, ApprovalRule, ChainBreak, ChainHash, ChainKey, Claim, Commitment, CommitmentFilter,
    Durability, EventStore, Holder, KeyClaim, Listing, ListingStatus, OpenMode, PruneFilter,
    Revocation, RowsReport, RunFilter, RunId, RunMeta, RunSummary, SessionHead, SettlingAppend,
    StoreError, StoredEvent, Tombstone, VerifyReport,
};
use crate::status::settled_sql;
use writer::{ClaimOp, Counters, Request, RuleOp};

/// An event store in one SQLite file.
///
/// Opening for writing applies pending schema migrations; opening read-only
/// ([`OpenMode::ReadOnly`]) writes nothing and starts no writer. Dropping
/// the store stops its writer thread after it has answered every queued
/// write.
pub struct SqliteStore {
    path: PathBuf,
    chain: Arc<Chain>,
    queue: Option<mpsc::Sender<Request>>,
    writer: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    readers: Arc<Readers>,
    /// At most this many reads at once (`max_readers`).
    read_turns: Arc<Semaphore>,
    /// The threads reads run on: the store's own, never tokio's blocking
    /// pool, which plugins' filesystem calls share and a call stuck on a
    /// blocking file can fill (issue 37, item 6).
    read_threads: ReadThreads,
}

/// A read to run on one of the store's read threads.
type ReadJob = Box<dyn FnOnce() + Send>;

/// `max_readers` threads that run the store's reads, until the store is
/// dropped (its sender with it).
struct ReadThreads {
    jobs: std::sync::mpsc::Sender<ReadJob>,
}

impl ReadThreads {
    fn start(count: usize, path: &Path) -> Result<ReadThreads, StoreError> {
        let (jobs, inbox) = std::sync::mpsc::channel::<ReadJob>();
        let inbox = Arc::new(Mutex::new(inbox));
        for _ in 0..count.max(1) {
            let inbox = Arc::clone(&inbox);
            std::thread::Builder::new()
                .name("warden-store-reader".to_owned())
                .spawn(move || {
                    loop {
                        let job = inbox.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(job) = job else { return };
                        // A panicking read answers nothing (its caller sees
                        // the reply dropped); the thread serves the next.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|e| StoreError::Backend {
                    context: format!("sqlite: cannot start a reader for {}", path.display()),
                    error: Box::new(e),
                })?;
        }
        Ok(ReadThreads { jobs })
    }
}

/// Configures and opens a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    busy_timeout: Duration,
    lock_wait: Option<Duration>,
    chain_key: Option<ChainKey>,
    max_batch: usize,
    max_readers: usize,
    mode: OpenMode,
}

impl SqliteStoreBuilder {
    /// How long a connection waits for a lock held by another process
    /// before failing. Default: 5 seconds.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How long a write waits, in all, for the write lock another process
    /// holds: each busy timeout that passes is logged and the write tried
    /// again, so a completion is not lost to a lock held a while. `None`
    /// (the default): wait as long as it takes; `Some(d)`: fail the write
    /// with "database is locked" after about `d`.
    pub fn lock_wait(mut self, wait: Option<Duration>) -> Self {
        self.lock_wait = wait;
        self
    }

    /// Chain with HMAC-SHA-256 under this operator key. A store keeps the
    /// mode it was first opened with and refuses to open in another.
    /// Default: no key (plain SHA-256).
    pub fn chain_key(mut self, key: ChainKey) -> Self {
        self.chain_key = Some(key);
        self
    }

    /// The most writes (creates or appends) committed in one transaction.
    /// Default: 1024.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The most reads (loads, lists, verifies) running at once, each on its
    /// own connection; more wait their turn, so a thousand concurrent loads
    /// reuse a few connections instead of opening a thousand. Default: 4.
    pub fn max_readers(mut self, n: usize) -> Self {
        self.max_readers = n.max(1);
        self
    }

    /// Whether to create the file, and whether to write. Default:
    /// [`OpenMode::Create`]. Whatever the mode, an empty (0-byte) file is
    /// refused ([`StoreError::NoStore`]): Warden never leaves one, so it is a
    /// lost or mistyped store, not a new one.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// Opens the database in the builder's [`mode`](Self::mode): for
    /// writing, creates it if allowed, migrates it and starts the writer
    /// thread; read-only, only checks its schema and chain mode. Blocks
    /// briefly on file I/O.
    pub fn open(self) -> Result<SqliteStore, StoreError> {
        let chain = Arc::new(Chain::new(self.chain_key));
        schema::check_file(&self.path, self.mode)?;
        if self.mode == OpenMode::ReadOnly {
            let (conn, immutable) = schema::open_read_only(&self.path, self.busy_timeout)?;
            schema::check(&conn, &self.path, &chain.mode())?;
            tracing::debug!(path = %self.path.display(), immutable, "opened sqlite store read-only");
            let readers = Readers {
                path: self.path.clone(),
                busy_timeout: self.busy_timeout,
                idle: Mutex::new(vec![conn]),
                max_idle: self.max_readers,
                read_only: Some(immutable),
            };
            return Ok(SqliteStore {
                read_threads: ReadThreads::start(self.max_readers, &self.path)?,
                readers: Arc::new(readers),
                path: self.path,
                chain,
                queue: None,
                writer: None,
                counters: Arc::new(Counters::default()),
                read_turns: Arc::new(Semaphore::new(self.max_readers)),
            });
        }
        let mut conn = schema::open_writer(&self.path, self.busy_timeout)?;
        schema::check_integrity(&conn, &self.path)?;
        schema::migrate(&mut conn, &self.path, &chain, self.mode == OpenMode::Create)?;
        let counters = Arc::new(Counters::default());
        let (queue, inbox) = mpsc::channel(self.max_batch.saturating_mul(4));
        let writer = std::thread::Builder::new()
            .name("warden-store-writer".to_owned())
            .spawn({
                let chain = Arc::clone(&chain);
                let counters = Arc::clone(&counters);
                let limits = writer::Limits {
                    max_batch: self.max_batch,
                    lock_wait: self.lock_wait,
                };
                move || writer::run(conn, chain, inbox, limits, counters)
            })
            .map_err(|e| StoreError::Backend {
                context: format!(
                    "sqlite: cannot start the writer for {}",
                    self.path.display()
                ),
                error: Box::new(e),
            })?;
        tracing::debug!(path = %self.path.display(), mode = %chain.mode(), "opened sqlite store");
        Ok(SqliteStore {
            read_threads: ReadThreads::start(self.max_readers, &self.path)?,
            readers: Arc::new(Readers {
                path: self.path.clone(),
                busy_timeout: self.busy_timeout,
                idle: Mutex::new(Vec::new()),
                max_idle: self.max_readers,
                read_only: None,
            }),
            path: self.path,
            chain,
            queue: Some(queue),
            writer: Some(writer),
            counters,
            read_turns: Arc::new(Semaphore::new(self.max_readers)),
        })
    }
}

/// What the writer has done since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterStats {
    /// Transactions committed: each one WAL fsync, except the deferred
    /// ones.
    pub transactions: u64,
    /// Of those, transactions that held only deferred appends
    /// ([`Durability::Deferred`](crate::Durability::Deferred)), committed
    /// without waiting for the disk (`synchronous=NORMAL`): the next synced
    /// one syncs them too. `transactions - deferred_transactions` is the
    /// number of commits that waited for an fsync (a checkpoint syncs too,
    /// once per thousand pages or so).
    pub deferred_transactions: u64,
    /// Creates and appends answered from committed transactions, including
    /// refused ones (conflicts and the like).
    pub requests: u64,
    /// Events in those requests.
    pub events: u64,
    /// Transactions that failed to commit.
    pub failed_commits: u64,
    /// Times a transaction found the write lock held by another process
    /// for a whole busy timeout, and was tried again.
    pub lock_retries: u64,
}

impl SqliteStore {
    /// Opens the store at `path` with the defaults of [`SqliteStoreBuilder`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder(path).open()
    }

    /// A builder for the store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_owned(),
            busy_timeout: Duration::from_secs(5),
            lock_wait: None,
            chain_key: None,
            max_batch: 1024,
            max_readers: 4,
            mode: OpenMode::Create,
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The writer's counters: `requests / transactions` is the group-commit
    /// factor.
    pub fn stats(&self) -> WriterStats {
        let c = &self.counters;
        WriterStats {
            transactions: c.transactions.load(Ordering::Relaxed),
            deferred_transactions: c.deferred_transactions.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            events: c.events.load(Ordering::Relaxed),
            failed_commits: c.failed_commits.load(Ordering::Relaxed),
            lock_retries: c.lock_retries.load(Ordering::Relaxed),
        }
    }

    async fn write<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Request,
    ) -> Result<T, StoreError> {
        let queue = self.queue.as_ref().ok_or_else(|| self.read_only())?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(request(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Writes a consistent copy of the database to the new file `dest`
    /// (`VACUUM INTO`, one read transaction: writers go on meanwhile),
    /// records in the copy when it was taken (`taken_ms`, from the caller's
    /// clock; see [`backup_taken_ms`](Self::backup_taken_ms)), and syncs
    /// it and its directory. Works on a store opened read-only.
    pub async fn backup_into(&self, dest: &Path, taken_ms: i64) -> Result<(), StoreError> {
        let dest = dest.to_owned();
        self.read(move |conn, _| {
            let context = || format!("sqlite: cannot back up to {}", dest.display());
            conn.execute("VACUUM INTO ?1", [dest.to_string_lossy()])
                .map_err(|e| backend(context(), e))?;
            let copy = Connection::open_with_flags(
                &dest,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| backend(context(), e))?;
            copy.execute(
                "INSERT OR REPLACE INTO store_meta (key, value) VALUES ('backup_taken_ms', ?1)",
                [taken_ms.to_string()],
            )
            .map_err(|e| backend(context(), e))?;
            drop(copy);
            let sync = |p: &Path| std::fs::File::open(p).and_then(|f| f.sync_all());
            sync(&dest)
                .and_then(|()| match dest.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => sync(dir),
                    _ => Ok(()),
                })
                .map_err(|e| StoreError::Backend {
                    context: context(),
                    error: Box::new(e),
                })
        })
        .await
    }

    /// When the store was taken as a backup by [`backup_into`](Self::backup_into)
    /// (milliseconds since the epoch), if it is such a copy.
    pub async fn backup_taken_ms(&self) -> Result<Option<i64>, StoreError> {
        self.read(|conn, _| {
            let value: Option<String> = conn
                .query_row(
                    "SELECT value FROM store_meta WHERE key = 'backup_taken_ms'",
                    [],
                    |row| row.get(0),
                )
                .optional()
                .map_err(|e| backend("sqlite: cannot read store_meta", e))?;
            Ok(value.and_then(|v| v.parse().ok()))
        })
        .await
    }

    /// The value of `PRAGMA name` on the writer's own connection, the one
    /// every write commits on (`synchronous` is `2`, FULL; `journal_mode`
    /// is `wal`). Only `synchronous`, `journal_mode`, `busy_timeout` and
    /// `foreign_keys` are read.
    pub async fn writer_pragma(&self, name: &'static str) -> Result<String, StoreError> {
        if !matches!(
            name,
            "synchronous" | "journal_mode" | "busy_timeout" | "foreign_keys"
        ) {
            return Err(StoreError::Unsupported {
                store: "SqliteStore",
                operation: "reading that pragma",
            });
        }
        self.write(|reply| Request::Pragma { name, reply }).await
    }

    /// The error for a write on a store opened read-only (the only store
    /// without a writer queue).
    fn read_only(&self) -> StoreError {
        StoreError::ReadOnly {
            location: self.path.display().to_string(),
            operation: "writing",
        }
    }

    /// A rule write, through the writer like every other write.
    async fn write_rule(&self, op: RuleOp) -> Result<ApprovalRule, StoreError> {
        let queue = self.queue.as_ref().ok_or_else(|| self.read_only())?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Request::Rule { op, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn read<T: Send + 'static>(
        &self,
        what: impl FnOnce(&mut Connection, &Chain) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = Arc::clone(&self.readers);
        let chain = Arc::clone(&self.chain);
        let permit = Arc::clone(&self.read_turns)
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let job: ReadJob = Box::new(move || {
            let result = readers.take().and_then(|mut conn| {
                let result = what(&mut conn, &chain);
                readers.give(conn);
                result
            });
            drop(permit);
            let _ = reply.send(result);
        });
        self.read_threads
            .jobs
            .send(job)
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Backend {
            context: "sqlite: a reader failed".to_owned(),
            error: "the read panicked".into(),
        })?
    }
}

/// The columns [`rule_of_row`] reads.
const RULE_COLUMNS: &str = "SELECT id, spec, created_by, created_ms, expires_ms, revoked_by, revoked_ms, seal FROM approval_rules";

/// A rule row and its stored seal, not yet checked.
type SealedRule = (ApprovalRule, Option<Vec<u8>>);

fn rule_of_row(row: &Row<'_>) -> rusqlite::Result<SealedRule> {
    let revoked_by: Option<String> = row.get(5)?;
    let revoked_ms: Option<i64> = row.get(6)?;
    let rule = ApprovalRule {
        id: row.get(0)?,
        spec: row.get(1)?,
        created_by: row.get(2)?,
        created_ms: row.get(3)?,
        expires_ms: row.get(4)?,
        revoked: revoked_by.map(|by| Revocation {
            by,
            at_ms: revoked_ms.unwrap_or_default(),
        }),
    };
    Ok((rule, row.get(7)?))
}

/// A rule row whose seal matches, for a read that acts on it.
fn checked_rule(chain: &Chain, (rule, seal): SealedRule) -> Result<ApprovalRule, StoreError> {
    sealed::check(
        sealed::RULES,
        &rule.id,
        seal.as_deref(),
        &sealed::rule(chain, &rule),
    )?;
    Ok(rule)
}

/// Rule `id`, read on `conn` (a reader, or the writer inside its
/// transaction), its seal checked.
fn rule(conn: &Connection, chain: &Chain, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
    conn.prepare_cached(&format!("{RULE_COLUMNS} WHERE id = ?1"))
        .and_then(|mut s| s.query_row([id], rule_of_row).optional())
        .map_err(|e| backend(format!("sqlite: cannot read approval rule {id}"), e))?
        .map(|row| checked_rule(chain, row))
        .transpose()
}

/// The seal of every rule and commitment, checked (`verify_rows`).
fn verify_rows(conn: &Connection, chain: &Chain) -> Result<RowsReport, StoreError> {
    let context = "sqlite: cannot read the sealed tables";
    let rules = conn
        .prepare(&format!("{RULE_COLUMNS} ORDER BY id"))
        .and_then(|mut s| {
            s.query_map([], rule_of_row)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(|e| backend(context, e))?;
    let commitments = conn
        .prepare("SELECT key, run_id, call_id, result, seal FROM commitments ORDER BY key")
        .and_then(|mut s| {
            s.query_map([], |row| {
                Ok((
                    text(row, 0)?,
                    text(row, 1)?,
                    text(row, 2)?,
                    row.get::<_, Option<Vec<u8>>>(3)?,
                    row.get::<_, Option<Vec<u8>>>(4)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(|e| backend(context, e))?;
    let mut findings = Vec::new();
    for (rule, seal) in &rules {
        let expected = sealed::rule(chain, rule);
        sealed::collect(
            &mut findings,
            sealed::RULES,
            &rule.id,
            seal.as_deref(),
            &expected,
        );
    }
    for (key, run_id, call_id, result, seal) in &commitments {
        let expected = sealed::commitment(chain, key, run_id, call_id, result.as_deref());
        sealed::collect(
            &mut findings,
            sealed::COMMITMENTS,
            key,
            seal.as_deref(),
            &expected,
        );
    }
    Ok(RowsReport::new(
        vec![
            (sealed::RULES, rules.len() as u64),
            (sealed::COMMITMENTS, commitments.len() as u64),
        ],
        findings,
    ))
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("chain", &self.chain.mode())
            .finish_non_exhaustive()
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Closing the queue lets the writer answer what is queued and stop.
        self.queue.take();
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "sqlite store writer panicked");
        }
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: ListingStatus,
    ) -> Result<Appended, StoreError> {
        self.write(|reply| Request::Create {
            run_id: run_id.clone(),
            meta,
            first_event,
            status: status.name().to_owned(),
            reply,
        })
        .await
    }

    async fn append(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        self.write(|reply| Request::Append {
            run_id: run_id.clone(),
            fence: None,
            expected_len,
            events: events.to_vec(),
            status: listing.status,
            owes_deliveries: listing.owes_deliveries,
            wake_ms: listing.wake_ms,
            deferred: listing.durability == Durability::Deferred,
            updated_ms,
            settle: None,
            reply,
        })
        .await
    }

    async fn add_rule(&self, rule: &ApprovalRule) -> Result<(), StoreError> {
        self.write_rule(RuleOp::Add(rule.clone())).await.map(|_| ())
    }

    async fn load_history(&self, head: &HistoryDigest) -> Result<Vec<HistoryChunk>, StoreError> {
        let head = *head;
        self.read(move |conn, _| {
            let context = || format!("sqlite: cannot read the session history {head}");
            // The walk follows stored links only; each chunk is checked
            // against its digest in `chain_from` (UNION ends a loop in
            // tampered links).
            let rows = conn
                .prepare_cached(
                    "WITH RECURSIVE chain (digest) AS (
                         SELECT ?1
                         UNION
                         SELECT h.previous FROM history_chunks h JOIN chain c ON h.digest = c.digest
                         WHERE h.previous IS NOT NULL
                     )
                     SELECT h.digest, h.previous, h.body FROM chain JOIN history_chunks h USING (digest)",
                )
                .and_then(|mut s| {
                    s.query_map([head.as_bytes().as_slice()], |row| {
                        Ok((
                            row.get::<_, Vec<u8>>(0)?,
                            row.get::<_, Option<Vec<u8>>>(1)?,
                            row.get::<_, Vec<u8>>(2)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| backend(context(), e))?;
            Ok(history::chain_from(&head, history::checked_rows(rows)))
        })
        .await?
    }

    async fn rules(&self) -> Result<Vec<ApprovalRule>, StoreError> {
        self.read(|conn, chain| {
            let context = "sqlite: cannot list approval rules";
            conn.prepare_cached(&format!("{RULE_COLUMNS} ORDER BY created_ms, id"))
                .and_then(|mut s| {
                    s.query_map([], rule_of_row)?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| backend(context, e))?
                .into_iter()
                .map(|row| checked_rule(chain, row))
                .collect()
        })
        .await
    }

    async fn rule(&self, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
        let id = id.to_owned();
        self.read(move |conn, chain| rule(conn, chain, &id)).await
    }

    async fn verify_rows(&self) -> Result<RowsReport, StoreError> {
        self.read(|conn, chain| verify_rows(conn, chain)).await
    }

    async fn revoke_rule(
        &self,
        id: &str,
        by: &str,
        at_ms: i64,
    ) -> Result<ApprovalRule, StoreError> {
        self.write_rule(RuleOp::Revoke {
            id: id.to_owned(),
            by: by.to_owned(),
            at_ms,
        })
        .await
    }

    async fn export_cursors(&self, reader: &str) -> Result<BTreeMap<RunId, u64>, StoreError> {
        let reader = reader.to_owned();
        self.read(move |conn, _| {
            let context = || format!("sqlite: cannot read export cursors of {reader}");
            let rows = conn
                .prepare_cached("SELECT run_id, through FROM export_cursors WHERE reader = ?1")
                .and_then(|mut s| {
                    s.query_map([&reader], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| backend(context(), e))?;
            // A row whose id is not a run id was not written by this
            // store: skipped, as listing skips such runs.
            Ok(rows
                .into_iter()
                .filter_map(|(id, through)| Some((RunId::new(id).ok()?, through.max(0) as u64)))
                .collect())
        })
        .await
    }

    async fn advance_export_cursor(
        &self,
        reader: &str,
        run_id: &RunId,
        through: u64,
    ) -> Result<(), StoreError> {
        let queue = self.queue.as_ref().ok_or_else(|| self.read_only())?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Request::Cursor {
                reader: reader.to_owned(),
                run_id: run_id.clone(),
                through,
                reply,
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn claim_commitment(&self, key: &str, holder: &Holder) -> Result<KeyClaim, StoreError> {
        let queue = self.queue.as_ref().ok_or_else(|| self.read_only())?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Request::Commitment {
                key: key.to_owned(),
                holder: holder.clone(),
                reply,
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn commitments(&self, filter: &CommitmentFilter) -> Result<Vec<Commitment>, StoreError> {
        let filter = filter.clone();
        self.read(move |conn, chain| {
            let context = "sqlite: cannot list idempotency commitments";
            let mut stmt = conn
                .prepare_cached(
                    "SELECT key, run_id, call_id, result, seal FROM commitments
                     WHERE (?1 IS NULL OR key = ?1) AND (?2 IS NULL OR run_id = ?2)
                     ORDER BY key",
                )
                .map_err(|e| backend(context, e))?;
            let rows = stmt
                .query_map(
                    rusqlite::params![filter.key, filter.run_id.as_ref().map(RunId::as_str)],
                    |row| {
                        Ok((
                            text(row, 0)?,
                            text(row, 1)?,
                            text(row, 2)?,
                            row.get::<_, Option<Vec<u8>>>(3)?,
                            row.get::<_, Option<Vec<u8>>>(4)?,
                        ))
                    },
                )
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(|e| backend(context, e))?;
            let mut listed = Vec::with_capacity(rows.len());
            for (key, run_id, call_id, result, seal) in rows {
                let expected =
                    sealed::commitment(chain, &key, &run_id, &call_id, result.as_deref());
                sealed::check(sealed::COMMITMENTS, &key, seal.as_deref(), &expected)?;
                // A holder that is not a valid run id is skipped, as its
                // run is.
                let Some(run_id) = valid_id(&run_id) else {
                    continue;
                };
                listed.push(Commitment {
                    key,
                    holder: Holder { run_id, call_id },
                    result: result.map(Bytes::from),
                });
            }
            Ok(listed)
        })
        .await
    }

    async fn append_settling(&self, request: SettlingAppend<'_>) -> Result<Appended, StoreError> {
        let SettlingAppend {
            run_id,
            fence,
            expected_len,
            events,
            listing,
            updated_ms,
            settlement,
        } = request;
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        self.write(|reply| Request::Append {
            run_id: run_id.clone(),
            fence: fence.cloned(),
            expected_len,
            events: events.to_vec(),
            status: listing.status,
            owes_deliveries: listing.owes_deliveries,
            wake_ms: listing.wake_ms,
            deferred: listing.durability == Durability::Deferred,
            updated_ms,
            settle: Some(settlement.clone()),
            reply,
        })
        .await
    }

    async fn load(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        self.load_after(run_id, 0).await
    }

    async fn load_after(
        &self,
        run_id: &RunId,
        after_seq: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let run_id = run_id.clone();
        self.read(move |conn, chain| load_after(conn, chain, &run_id, after_seq))
            .await
    }

    async fn load_many(
        &self,
        run_ids: &[RunId],
    ) -> Result<Vec<(RunId, Vec<StoredEvent>)>, StoreError> {
        let run_ids = run_ids.to_vec();
        // One reader, one blocking task: the many loads share a connection
        // and a turn instead of queueing for one each.
        self.read(move |conn, chain| {
            let mut logs = Vec::with_capacity(run_ids.len());
            for run_id in run_ids {
                match load_after(conn, chain, &run_id, 0) {
                    Ok(events) => logs.push((run_id, events)),
                    Err(StoreError::UnknownRun { .. } | StoreError::Pruned { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(logs)
        })
        .await
    }

    async fn summary(&self, run_id: &RunId) -> Result<RunSummary, StoreError> {
        let run_id = run_id.clone();
        self.read(move |conn, _| {
            let context = || format!("sqlite: cannot read run {run_id}");
            let mut found = query_summaries(
                conn,
                &format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = ?1"),
                vec![Value::Text(run_id.to_string())],
            )
            .map_err(|e| backend(context(), e))?;
            match found.pop() {
                Some(summary) => Ok(summary),
                None => Err(unknown(conn, &run_id)),
            }
        })
        .await
    }

    async fn list(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        let filter = filter.clone();
        self.read(move |conn, _| {
            let (sql, values) = list_query(&filter);
            query_summaries(conn, &sql, values).map_err(|e| backend("sqlite: cannot list runs", e))
        })
        .await
    }

    async fn session_head(&self, session: &str) -> Result<SessionHead, StoreError> {
        let session = session.to_owned();
        self.read(move |conn, _| {
            let context = || format!("sqlite: cannot read session {session}");
            // One row of `sessions`, and the active run through the unique
            // partial index `runs_one_active_per_session`: neither reads
            // the session's other runs.
            let counts = conn
                .prepare_cached(
                    "SELECT runs, completed, latest_completed FROM sessions WHERE session = ?1",
                )
                .and_then(|mut s| {
                    s.query_row([&session], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Option<String>>(2)?,
                        ))
                    })
                    .optional()
                })
                .map_err(|e| backend(context(), e))?;
            let active = conn
                .prepare_cached(concat!(
                    "SELECT id, status FROM runs WHERE session = ?1 AND status NOT IN (",
                    settled_sql!(),
                    ") LIMIT 1"
                ))
                .and_then(|mut s| {
                    s.query_row([&session], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                    })
                    .optional()
                })
                .map_err(|e| backend(context(), e))?;
            crate::session::head_of_rows(counts, active, context)
        })
        .await
    }

    async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, StoreError> {
        let run_id = run_id.clone();
        self.read(move |conn, chain| verify(conn, chain, &run_id))
            .await
    }

    async fn run_ids(&self) -> Result<Vec<RunId>, StoreError> {
        self.read(|conn, _| {
            let context = "sqlite: cannot list run ids";
            let mut stmt = conn
                .prepare_cached("SELECT id FROM runs ORDER BY id")
                .map_err(|e| backend(context, e))?;
            let ids = stmt
                .query_map([], |row| text(row, 0))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(|e| backend(context, e))?;
            Ok(ids.into_iter().filter_map(|id| valid_id(&id)).collect())
        })
        .await
    }

    async fn invalid_run_ids(&self) -> Result<Vec<String>, StoreError> {
        self.read(|conn, _| {
            let context = "sqlite: cannot list run ids";
            let mut stmt = conn
                .prepare_cached("SELECT id FROM runs ORDER BY id")
                .map_err(|e| backend(context, e))?;
            let ids = stmt
                .query_map([], |row| text(row, 0))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(|e| backend(context, e))?;
            Ok(ids
                .into_iter()
                .filter(|id| RunId::new(id.as_str()).is_err())
                .collect())
        })
        .await
    }

    async fn acquire_claim(
        &self,
        run_id: &RunId,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let op = ClaimOp::Acquire {
            run_id: run_id.clone(),
            owner: owner.to_owned(),
            now_ms,
            ttl_ms,
        };
        let mut claims = self.write(|reply| Request::Claim { op, reply }).await?;
        Ok(claims.pop().expect("an acquire answers one claim"))
    }

    async fn renew_claim(
        &self,
        claim: &Claim,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let op = ClaimOp::Renew {
            claim: claim.clone(),
            now_ms,
            ttl_ms,
        };
        let mut claims = self.write(|reply| Request::Claim { op, reply }).await?;
        Ok(claims.pop().expect("a renewal answers one claim"))
    }

    async fn release_claim(
        &self,
        claim: &Claim,
        status: Option<ListingStatus>,
    ) -> Result<(), StoreError> {
        let op = ClaimOp::Release {
            claim: claim.clone(),
            status: status.map(|s| s.name().to_owned()),
        };
        self.write(|reply| Request::Claim { op, reply }).await?;
        Ok(())
    }

    async fn append_fenced_to(
        &self,
        run_id: &RunId,
        claim: &Claim,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        self.write(|reply| Request::Append {
            run_id: run_id.clone(),
            fence: Some(claim.clone()),
            expected_len,
            events: events.to_vec(),
            status: listing.status,
            owes_deliveries: listing.owes_deliveries,
            wake_ms: listing.wake_ms,
            deferred: listing.durability == Durability::Deferred,
            updated_ms,
            settle: None,
            reply,
        })
        .await
    }

    async fn claim(
        &self,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let op = ClaimOp::Claim {
            owner: owner.to_owned(),
            now_ms,
            ttl_ms,
            limit,
        };
        self.write(|reply| Request::Claim { op, reply }).await
    }

    async fn prune(&self, filter: &PruneFilter, now_ms: i64) -> Result<Vec<Tombstone>, StoreError> {
        let filter = filter.clone();
        self.write(|reply| Request::Prune {
            filter,
            now_ms,
            reply,
        })
        .await
    }
}

/// The columns `query_summaries` reads, in its order.
const SUMMARY_COLUMNS: &str = "pk, id, agent, status, session, created_ms, updated_ms, event_count, lease_owner, lease_token, lease_expires_ms, owes_deliveries, wake_ms";

/// The error for a run with no row: [`StoreError::Pruned`] if it left a
/// tombstone, else [`StoreError::UnknownRun`].
pub(super) fn unknown(conn: &Connection, run_id: &RunId) -> StoreError {
    let tombstone = conn
        .prepare_cached("SELECT event_count, head_hash FROM tombstones WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row([run_id.as_str()], |row| {
                Ok((row.get::<_, i64>(0)?, blob_hash(row, 1)?))
            })
            .optional()
        });
    match tombstone {
        Ok(Some((count, Ok(head)))) => StoreError::Pruned {
            run_id: run_id.clone(),
            event_count: count as u64,
            head,
        },
        Ok(_) => StoreError::UnknownRun {
            run_id: run_id.clone(),
        },
        Err(e) => backend(format!("sqlite: cannot read run {run_id}"), e),
    }
}

/// Reader connections, opened on demand and kept while idle.
struct Readers {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
    /// For a store opened read-only: whether its connections open the file
    /// as immutable (see `schema::open_read_only`).
    read_only: Option<bool>,
}

impl Readers {
    fn take(&self) -> Result<Connection, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match (idle, self.read_only) {
            (Some(conn), _) => Ok(conn),
            (None, None) => schema::open_reader(&self.path, self.busy_timeout),
            (None, Some(immutable)) => {
                schema::open_read_only_as(&self.path, self.busy_timeout, immutable)
            }
        }
    }

    fn give(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }
}

/// Wraps a storage error with what was being done.
pub(super) fn backend(context: impl Into<String>, error: rusqlite::Error) -> StoreError {
    StoreError::Backend {
        context: context.into(),
        error: Box::new(error),
    }
}

/// Reads a stored hash column without trusting its type or length.
pub(super) fn blob_hash(
    row: &Row<'_>,
    idx: usize,
) -> rusqlite::Result<Result<ChainHash, ChainBreak>> {
    Ok(match row.get_ref(idx)? {
        ValueRef::Blob(bytes) => ChainHash::from_stored(bytes),
        other => Err(ChainBreak::Unreadable {
            detail: format!("hash is stored as {:?}, not a blob", other.data_type()),
        }),
    })
}

/// Reads an event's bytes column without trusting its type.
fn blob_bytes(row: &Row<'_>, idx: usize) -> rusqlite::Result<Result<Bytes, ChainBreak>> {
    Ok(match row.get_ref(idx)? {
        ValueRef::Blob(bytes) => Ok(Bytes::copy_from_slice(bytes)),
        other => Err(ChainBreak::Unreadable {
            detail: format!(
                "event bytes are stored as {:?}, not a blob",
                other.data_type()
            ),
        }),
    })
}

/// Reads a text column, replacing invalid UTF-8 rather than failing, so one
/// damaged row cannot break a listing of all runs.
fn text(row: &Row<'_>, idx: usize) -> rusqlite::Result<String> {
    Ok(match row.get_ref(idx)? {
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
            String::from_utf8_lossy(bytes).into_owned()
        }
        ValueRef::Null => String::new(),
        ValueRef::Integer(n) => n.to_string(),
        ValueRef::Real(x) => x.to_string(),
    })
}

fn valid_id(id: &str) -> Option<RunId> {
    match RunId::new(id) {
        Ok(id) => Some(id),
        Err(error) => {
            tracing::warn!(%error, "sqlite store holds a run with an invalid id; skipped");
            None
        }
    }
}

/// The run row as the chain checks see it: its key, count and head, the
/// last two not yet trusted.
struct RunRow {
    pk: i64,
    count: Result<u64, ChainBreak>,
    head: Result<ChainHash, ChainBreak>,
}

fn run_row(conn: &Connection, run_id: &RunId) -> Result<RunRow, StoreError> {
    conn.prepare_cached("SELECT pk, event_count, head_hash FROM runs WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row([run_id.as_str()], |row| {
                let count: i64 = row.get(1)?;
                let count = u64::try_from(count).map_err(|_| ChainBreak::Unreadable {
                    detail: format!("the run records {count} events"),
                });
                Ok(RunRow {
                    pk: row.get(0)?,
                    count,
                    head: blob_hash(row, 2)?,
                })
            })
            .optional()
        })
        .map_err(|e| backend(format!("sqlite: cannot read run {run_id}"), e))?
        .ok_or_else(|| unknown(conn, run_id))
}

/// The event rows of run `pk` after `after`, in seq order.
fn event_rows(conn: &Connection, pk: i64, after: u64) -> rusqlite::Result<Vec<RawRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, bytes, hash FROM events WHERE run_pk = ?1 AND seq > ?2 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![pk, after as i64], |row| {
        Ok(RawRow {
            // `seq > after >= 0` in the query: never negative here.
            seq: row.get::<_, i64>(0)? as u64,
            bytes: blob_bytes(row, 1)?,
            hash: blob_hash(row, 2)?,
        })
    })?;
    rows.collect()
}

fn load_after(
    conn: &mut Connection,
    chain: &Chain,
    run_id: &RunId,
    after: u64,
) -> Result<Vec<StoredEvent>, StoreError> {
    let context = || format!("sqlite: cannot load run {run_id}");
    let tampered = |seq, reason| StoreError::Tampered {
        run_id: run_id.clone(),
        seq,
        reason,
    };
    // One read transaction: the run row and its events from one snapshot.
    let tx = conn.transaction().map_err(|e| backend(context(), e))?;
    let RunRow { pk, count, head } = run_row(&tx, run_id)?;
    let count = count.map_err(|reason| tampered(0, reason))?;
    if after >= count {
        return Ok(Vec::new());
    }
    let start = if after == 0 {
        chain.genesis(run_id)
    } else {
        let stored = tx
            .prepare_cached("SELECT hash FROM events WHERE run_pk = ?1 AND seq = ?2")
            .and_then(|mut s| {
                s.query_row(params![pk, after as i64], |row| blob_hash(row, 0))
                    .optional()
            })
            .map_err(|e| backend(context(), e))?;
        match stored {
            None => {
                return Err(tampered(
                    after,
                    ChainBreak::Missing {
                        recorded_count: count,
                    },
                ));
            }
            Some(hash) => hash.map_err(|reason| tampered(after, reason))?,
        }
    };
    let rows = event_rows(&tx, pk, after).map_err(|e| backend(context(), e))?;
    drop(tx);
    let recorded = Recorded { count, head };
    chain::walk(chain, after, start, rows, &recorded, true).into_events(run_id)
}

fn verify(
    conn: &mut Connection,
    chain: &Chain,
    run_id: &RunId,
) -> Result<VerifyReport, StoreError> {
    let context = || format!("sqlite: cannot verify run {run_id}");
    let tx = conn.transaction().map_err(|e| backend(context(), e))?;
    let RunRow { pk, count, head } = run_row(&tx, run_id)?;
    let rows = event_rows(&tx, pk, 0).map_err(|e| backend(context(), e))?;
    drop(tx);
    let mut findings = Vec::new();
    let count = count.unwrap_or_else(|kind| {
        findings.push(super::Finding { seq: 0, kind });
        0
    });
    let recorded = Recorded { count, head };
    let walk = chain::walk(chain, 0, chain.genesis(run_id), rows, &recorded, false);
    findings.extend(walk.findings);
    Ok(VerifyReport {
        run_id: run_id.clone(),
        recorded_count: count,
        events_read: walk.rows_read,
        recorded_head: recorded.head.ok(),
        findings,
    })
}

/// The listing query for `filter`, and its parameters.
fn list_query(filter: &RunFilter) -> (String, Vec<Value>) {
    let mut sql = format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE 1 = 1");
    let mut values = Vec::new();
    let mut param = |sql: &mut String, value: Value| {
        values.push(value);
        sql.push_str(&format!("?{}", values.len()));
    };
    if !filter.statuses.is_empty() {
        sql.push_str(" AND status IN (");
        for (i, status) in filter.statuses.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            param(&mut sql, Value::Text(status.clone()));
        }
        sql.push(')');
    }
    if let Some(agent) = &filter.agent {
        sql.push_str(" AND agent = ");
        param(&mut sql, Value::Text(agent.clone()));
    }
    if let Some(session) = &filter.session {
        sql.push_str(" AND session = ");
        param(&mut sql, Value::Text(session.clone()));
    }
    if let Some(since) = filter.created_since {
        sql.push_str(" AND created_ms >= ");
        param(&mut sql, Value::Integer(since));
    }
    if let Some(before) = filter.created_before {
        sql.push_str(" AND created_ms < ");
        param(&mut sql, Value::Integer(before));
    }
    if let Some(prefix) = &filter.id_prefix {
        // A range of the id's index (binary collation: byte order).
        sql.push_str(" AND id >= ");
        param(&mut sql, Value::Text(prefix.clone()));
        sql.push_str(" AND id < ");
        param(&mut sql, Value::Text(crate::id_prefix_end(prefix)));
    }
    if let Some(after) = &filter.after {
        // A row value: a range of the `(created_ms, id)` indexes.
        sql.push_str(if filter.newest_first {
            " AND (created_ms, id) < ("
        } else {
            " AND (created_ms, id) > ("
        });
        param(&mut sql, Value::Integer(after.created_ms));
        sql.push_str(", ");
        param(&mut sql, Value::Text(after.run_id.to_string()));
        sql.push(')');
    }
    for (key, value) in &filter.labels {
        sql.push_str(" AND pk IN (SELECT run_pk FROM run_labels WHERE key = ");
        param(&mut sql, Value::Text(key.clone()));
        sql.push_str(" AND value = ");
        param(&mut sql, Value::Text(value.clone()));
        sql.push(')');
    }
    sql.push_str(if filter.newest_first {
        " ORDER BY created_ms DESC, id DESC"
    } else {
        " ORDER BY created_ms, id"
    });
    if let Some(limit) = filter.limit {
        sql.push_str(" LIMIT ");
        param(
            &mut sql,
            Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)),
        );
    }
    (sql, values)
}

/// Runs a query selecting [`SUMMARY_COLUMNS`] and adds each run's labels.
fn query_summaries(
    conn: &mut Connection,
    sql: &str,
    values: Vec<Value>,
) -> rusqlite::Result<Vec<RunSummary>> {
    let tx = conn.transaction()?;
    let mut summaries = Vec::new();
    {
        let mut stmt = tx.prepare_cached(sql)?;
        let mut labels =
            tx.prepare_cached("SELECT key, value FROM run_labels WHERE run_pk = ?1 ORDER BY key")?;
        let mut rows = stmt.query(rusqlite::params_from_iter(values))?;
        while let Some(row) = rows.next()? {
            let Some(run_id) = valid_id(&text(row, 1)?) else {
                continue;
            };
            let pk: i64 = row.get(0)?;
            let session = match row.get_ref(4)? {
                ValueRef::Null => None,
                _ => Some(text(row, 4)?),
            };
            let event_count: i64 = row.get(7)?;
            let claim_token = u64::try_from(row.get::<_, i64>(9)?).unwrap_or(0);
            let claim = match (
                row.get::<_, Option<String>>(8)?,
                row.get::<_, Option<i64>>(10)?,
            ) {
                (Some(owner), Some(expires_ms)) => Some(Claim {
                    run_id: run_id.clone(),
                    owner,
                    token: claim_token,
                    expires_ms,
                }),
                _ => None,
            };
            let run_labels = labels
                .query_map([pk], |l| Ok((text(l, 0)?, text(l, 1)?)))?
                .collect::<rusqlite::Result<BTreeMap<_, _>>>()?;
            summaries.push(RunSummary {
                run_id,
                agent: text(row, 2)?,
                status: text(row, 3)?,
                labels: run_labels,
                session,
                created_ms: row.get(5)?,
                updated_ms: row.get(6)?,
                event_count: u64::try_from(event_count).unwrap_or(0),
                claim,
                claim_token,
                owes_deliveries: u32::try_from(row.get::<_, i64>(11)?).unwrap_or(0),
                wake_ms: row.get(12)?,
            });
        }
    }
    tx.commit()?;
    Ok(summaries)
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests;
