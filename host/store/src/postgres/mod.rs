//! The PostgreSQL store: the store for many hosts. Runs, events and claims
//! live in one schema of one database that every `warden worker` shares.
//!
//! Connections come from a small pool (`deadpool-postgres`); each has the
//! store's schema as its `search_path`. Every write is one transaction:
//! an append locks its run row (`SELECT … FOR UPDATE`), checks the fencing
//! token, the expected length and the chain's tail, inserts the events and
//! updates the run row, then commits; a concurrent append on the same run
//! waits for the lock and then finds the new length (a conflict). An
//! append's statements are pipelined: `BEGIN` and the checking reads go in
//! one round trip, the writes and `COMMIT` in a second (a statement that
//! fails aborts the transaction and the `COMMIT` rolls it back). A claim,
//! a renewal and a release are one statement each, committed on its own:
//! one round trip. [`PostgresStore::stats`] counts round trips and commits.
//! Loads read the run row and its events in one `REPEATABLE READ` snapshot.
//! Claims pick runs with `FOR UPDATE SKIP LOCKED`, so concurrent workers
//! never wait on or share a run.
//!
//! Durability: every connection sets `synchronous_commit = on` (whatever
//! the server's or the role's default), so a commit returns after the WAL
//! is flushed to disk, and an append is acknowledged only after its commit.
//! A deferred append ([`Durability::Deferred`]) sets it off for its own
//! transaction (`SET LOCAL`): it commits, visible to every session, without
//! waiting for the flush. The WAL is one sequence: the next synchronous
//! commit, of any session, flushes it up to its own commit record, and
//! with it every commit before; the server's WAL writer flushes it within
//! a few hundred milliseconds anyway. A server crash before then loses the
//! deferred commits since the last flush and nothing before them: what
//! survives is a prefix of what was acknowledged, as the store contract
//! asks.
//! A store opened read-only ([`OpenMode::ReadOnly`]) runs no migration and
//! its connections set `default_transaction_read_only = on`.
//!
//! Schema (version 4, see `schema.rs`): `runs` (with the claim columns and
//! the deliveries a run owes),
//! `run_labels`, `events`, `tombstones`, `store_meta` (schema version and
//! chain mode). Opening the store applies pending migrations.
//!
//! The connection has no TLS: reach a remote server through a trusted
//! network or a local TLS proxy.

mod schema;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls, Row};

use super::chain::{self, Chain, RawRow, Recorded};
use super::history::{self, HistoryChunk, HistoryDigest};
use super::sealed;
use super::{
    Appended, ApprovalRule, ChainBreak, ChainHash, ChainKey, Claim, Commitment, CommitmentFilter,
    Durability, EventStore, Finding, Holder, KeyClaim, Listing, ListingStatus, OpenMode,
    PruneFilter, QUEUED, RUNNING, Revocation, RowFinding, RowsReport, RunFilter, RunId, RunMeta,
    RunSummary, SessionHead, Settle, Settlement, SettlingAppend, StoreError, StoredEvent,
    Tombstone, VerifyReport, WAITING,
};
use crate::status::settled_sql;

/// An event store in one schema of a PostgreSQL database.
///
/// Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    chain: Arc<Chain>,
    schema: Arc<str>,
    target: Arc<str>,
    counters: Arc<Counters>,
}

/// What a [`PostgresStore`] (and its clones) asked of the server since it
/// was opened, read through [`PostgresStore::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Times the store waited for the server's answer: a statement, a
    /// `BEGIN` or a `COMMIT`, or a pipelined group of them sent together
    /// (counted once). A statement prepared for the first time on a
    /// connection costs one more, not counted.
    pub round_trips: u64,
    /// Transactions that wrote and committed: each one WAL flush, under
    /// the store's `synchronous_commit = on`, except the deferred ones.
    /// Read-only snapshots are not counted.
    pub commits: u64,
    /// Of those, deferred appends ([`Durability::Deferred`]), committed
    /// without waiting for the WAL flush (`synchronous_commit = off` for
    /// their transaction): the next synchronous commit flushes them too.
    /// `commits - deferred_commits` is the number of commits that waited
    /// for the disk.
    pub deferred_commits: u64,
    /// Read-only snapshots taken (loads, listings, summaries).
    pub snapshots: u64,
}

/// The counters behind [`PostgresStats`].
#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    commits: AtomicU64,
    deferred_commits: AtomicU64,
    snapshots: AtomicU64,
}

impl Counters {
    fn round_trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }
}

/// A transaction of the store's, counting its round trips.
struct Tx<'a> {
    tx: deadpool_postgres::Transaction<'a>,
    counters: &'a Counters,
}

/// Configures and opens a [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    schema: String,
    chain_key: Option<ChainKey>,
    max_connections: usize,
    connect_timeout: Duration,
    mode: OpenMode,
}

impl PostgresStoreBuilder {
    /// The schema the store keeps its tables in (created if missing): ASCII
    /// letters, digits and `_`, not starting with a digit, at most 63 bytes.
    /// Default: `warden`, or the URL's `schema` parameter.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Chain with HMAC-SHA-256 under this operator key. A store keeps the
    /// mode it was first opened with and refuses to open in another.
    /// Default: no key (plain SHA-256).
    pub fn chain_key(mut self, key: ChainKey) -> Self {
        self.chain_key = Some(key);
        self
    }

    /// The most connections the pool opens. Default: 16.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long to wait for a new connection. Default: 10 seconds.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether to create the schema, and whether to write. Default:
    /// [`OpenMode::Create`].
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// Connects, creates the schema if needed (in [`OpenMode::Create`]) and
    /// applies pending migrations; read-only, only checks the schema.
    pub async fn open(self) -> Result<PostgresStore, StoreError> {
        let (store, _) = self.open_and_migrate().await?;
        Ok(store)
    }

    /// [`open`](Self::open), also returning the schema versions the open
    /// applied (empty when the schema was current).
    pub async fn open_and_migrate(self) -> Result<(PostgresStore, Vec<i64>), StoreError> {
        let (url, url_schema) = split_schema(&self.url);
        let schema = url_schema.unwrap_or(self.schema);
        check_schema(&schema)?;
        let invalid = |error: String| StoreError::Backend {
            context: format!("postgres: cannot use the URL {}", redact(&self.url)),
            error: error.into(),
        };
        let mut config =
            tokio_postgres::Config::from_str(&url).map_err(|e| invalid(e.to_string()))?;
        if config.get_options().is_some() {
            return Err(invalid(
                "connection `options` are not supported; name the schema with `schema=`".into(),
            ));
        }
        let mut options = format!("-c search_path={schema} -c synchronous_commit=on");
        if self.mode == OpenMode::ReadOnly {
            options.push_str(" -c default_transaction_read_only=on");
        }
        config
            .options(options)
            .application_name("warden")
            .connect_timeout(self.connect_timeout);
        let target = redact(&self.url);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(self.max_connections)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(self.connect_timeout))
            .wait_timeout(Some(Duration::from_secs(60)))
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        let chain = Arc::new(Chain::new(self.chain_key));
        let store = PostgresStore {
            pool,
            chain,
            schema: schema.into(),
            target: target.into(),
            counters: Arc::default(),
        };
        let mut client = store.client().await?;
        let context = || format!("postgres: cannot migrate schema {}", store.schema);
        if self.mode != OpenMode::Create {
            schema::present(&client, &store.schema, &store.target).await?;
        }
        let applied = match self.mode {
            OpenMode::ReadOnly => {
                schema::check(&client, &store.schema, &store.chain.mode()).await?;
                Vec::new()
            }
            OpenMode::Existing | OpenMode::Create => {
                let tx = client
                    .transaction()
                    .await
                    .map_err(|e| pg_error(context(), e))?;
                let applied = schema::migrate(&tx, &store.schema, &store.chain).await?;
                tx.commit().await.map_err(|e| pg_error(context(), e))?;
                applied
            }
        };
        drop(client);
        tracing::debug!(target = %store.target, schema = %store.schema, mode = %store.chain.mode(), "opened postgres store");
        Ok((store, applied))
    }
}

/// Splits a `schema=NAME` query parameter off a connection URL.
fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("schema=") {
            Some(name) => {
                schema = Some(name.to_owned());
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, schema)
}

/// A URL without its password, for messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

fn check_schema(schema: &str) -> Result<(), StoreError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Backend {
            context: format!("postgres: cannot use schema `{schema}`"),
            error: "a schema name holds 1 to 63 ASCII letters, digits and `_`, not starting with a digit"
                .into(),
        })
    }
}

/// Wraps a PostgreSQL error with what was being done.
pub(super) fn pg_error(context: impl Into<String>, error: tokio_postgres::Error) -> StoreError {
    StoreError::Backend {
        context: context.into(),
        error: Box::new(error),
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .field("schema", &self.schema)
            .field("chain", &self.chain.mode())
            .finish_non_exhaustive()
    }
}

/// The columns [`summary_from`] reads, in its order.
const SUMMARY_COLUMNS: &str = "pk, id, agent, status, session, created_ms, updated_ms, event_count, lease_owner, lease_token, lease_expires_ms, owes_deliveries, wake_ms";

impl PostgresStore {
    /// Opens the store at `url` (`postgres://user@host:port/db`, optionally
    /// with `?schema=NAME`) with the defaults of [`PostgresStoreBuilder`].
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::builder(url).open().await
    }

    /// A builder for the store at `url`.
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.to_owned(),
            schema: "warden".to_owned(),
            chain_key: None,
            max_connections: 16,
            connect_timeout: Duration::from_secs(10),
            mode: OpenMode::Create,
        }
    }

    /// The schema the store's tables are in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| StoreError::Backend {
            context: format!("postgres: cannot connect to {}", self.target),
            error: Box::new(e),
        })
    }

    /// What the store asked of the server so far.
    pub fn stats(&self) -> PostgresStats {
        PostgresStats {
            round_trips: self.counters.round_trips.load(Ordering::Relaxed),
            commits: self.counters.commits.load(Ordering::Relaxed),
            deferred_commits: self.counters.deferred_commits.load(Ordering::Relaxed),
            snapshots: self.counters.snapshots.load(Ordering::Relaxed),
        }
    }

    /// Runs `what` in a read-only `REPEATABLE READ` transaction: one
    /// snapshot.
    async fn snapshot<T>(
        &self,
        context: &str,
        what: impl AsyncFnOnce(&Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut client = self.client().await?;
        self.counters.round_trip();
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| pg_error(context, e))?;
        let tx = Tx {
            tx,
            counters: &self.counters,
        };
        let result = what(&tx).await?;
        self.counters.round_trip();
        tx.tx.commit().await.map_err(|e| pg_error(context, e))?;
        self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(result)
    }

    /// Runs `what` in a read-write transaction and commits it if it
    /// returned `Ok`.
    async fn write<T>(
        &self,
        context: &str,
        what: impl AsyncFnOnce(&Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut client = self.client().await?;
        self.counters.round_trip();
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error(context, e))?;
        let tx = Tx {
            tx,
            counters: &self.counters,
        };
        let result = what(&tx).await?;
        self.counters.round_trip();
        tx.tx.commit().await.map_err(|e| pg_error(context, e))?;
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        Ok(result)
    }

    /// Runs one statement on its own, outside any transaction the store
    /// begins (the server commits it alone): one round trip. Counted as a
    /// commit if it returned rows (the statements run so write, and say
    /// what they wrote with `RETURNING`).
    async fn alone(
        &self,
        context: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| pg_error(context, e))?;
        self.counters.round_trip();
        let rows = client
            .query(&statement, params)
            .await
            .map_err(|e| pg_error(context, e))?;
        if !rows.is_empty() {
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(rows)
    }
}

/// A query's rows, with the error wrapped.
async fn query(
    tx: &Tx<'_>,
    context: &str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    let statement = tx
        .tx
        .prepare_cached(sql)
        .await
        .map_err(|e| pg_error(context, e))?;
    tx.counters.round_trip();
    tx.tx
        .query(&statement, params)
        .await
        .map_err(|e| pg_error(context, e))
}

/// A statement's changed-row count, with the error wrapped.
async fn execute(
    tx: &Tx<'_>,
    context: &str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = tx
        .tx
        .prepare_cached(sql)
        .await
        .map_err(|e| pg_error(context, e))?;
    tx.counters.round_trip();
    tx.tx
        .execute(&statement, params)
        .await
        .map_err(|e| pg_error(context, e))
}

/// The columns [`rule_of_row`] reads.
const RULE_COLUMNS: &str = "SELECT id, spec, created_by, created_ms, expires_ms, revoked_by, revoked_ms, seal FROM approval_rules";

/// A rule row and its stored seal, not yet checked.
type SealedRule = (ApprovalRule, Option<Vec<u8>>);

fn rule_of_row(row: &Row) -> SealedRule {
    let revoked_by: Option<String> = row.get(5);
    let revoked_ms: Option<i64> = row.get(6);
    let rule = ApprovalRule {
        id: row.get(0),
        spec: row.get(1),
        created_by: row.get(2),
        created_ms: row.get(3),
        expires_ms: row.get(4),
        revoked: revoked_by.map(|by| Revocation {
            by,
            at_ms: revoked_ms.unwrap_or_default(),
        }),
    };
    (rule, row.get(7))
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

/// A commitment row's seal, checked: the columns are key, run id, call
/// id, result and seal from `first`.
fn checked_commitment(chain: &Chain, row: &Row, first: usize) -> Result<(), StoreError> {
    let key: String = row.get(first);
    let run_id: String = row.get(first + 1);
    let call_id: String = row.get(first + 2);
    let result: Option<Vec<u8>> = row.get(first + 3);
    let seal: Option<Vec<u8>> = row.get(first + 4);
    let expected = sealed::commitment(chain, &key, &run_id, &call_id, result.as_deref());
    sealed::check(sealed::COMMITMENTS, &key, seal.as_deref(), &expected)
}

fn valid_id(id: &str) -> Option<RunId> {
    match RunId::new(id) {
        Ok(id) => Some(id),
        Err(error) => {
            tracing::warn!(%error, "postgres store holds a run with an invalid id; skipped");
            None
        }
    }
}

fn hash(bytes: &[u8]) -> Result<ChainHash, ChainBreak> {
    ChainHash::from_stored(bytes)
}

fn count(n: i64) -> Result<u64, ChainBreak> {
    u64::try_from(n).map_err(|_| ChainBreak::Unreadable {
        detail: format!("the run records {n} events"),
    })
}

/// The error for a run with no row: [`StoreError::Pruned`] if it left a
/// tombstone, else [`StoreError::UnknownRun`].
async fn unknown(tx: &Tx<'_>, run_id: &RunId) -> StoreError {
    let context = format!("postgres: cannot read run {run_id}");
    let found = query(
        tx,
        &context,
        "SELECT event_count, head_hash FROM tombstones WHERE id = $1",
        &[&run_id.as_str()],
    )
    .await;
    match found {
        Err(e) => e,
        Ok(rows) => match rows.first().map(|r| (r.get::<_, i64>(0), hash(r.get(1)))) {
            Some((count, Ok(head))) => StoreError::Pruned {
                run_id: run_id.clone(),
                event_count: count as u64,
                head,
            },
            _ => StoreError::UnknownRun {
                run_id: run_id.clone(),
            },
        },
    }
}

/// The run row as the chain checks see it.
struct RunRow {
    pk: i64,
    count: Result<u64, ChainBreak>,
    head: Result<ChainHash, ChainBreak>,
}

async fn run_row(tx: &Tx<'_>, run_id: &RunId) -> Result<RunRow, StoreError> {
    let context = format!("postgres: cannot read run {run_id}");
    let rows = query(
        tx,
        &context,
        "SELECT pk, event_count, head_hash FROM runs WHERE id = $1",
        &[&run_id.as_str()],
    )
    .await?;
    match rows.first() {
        Some(row) => Ok(RunRow {
            pk: row.get(0),
            count: count(row.get(1)),
            head: hash(row.get(2)),
        }),
        None => Err(unknown(tx, run_id).await),
    }
}

async fn event_rows(
    tx: &Tx<'_>,
    context: &str,
    pk: i64,
    after: u64,
) -> Result<Vec<RawRow>, StoreError> {
    let rows = query(
        tx,
        context,
        "SELECT seq, bytes, hash FROM events WHERE run_pk = $1 AND seq > $2 ORDER BY seq",
        &[&pk, &(after as i64)],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|row| RawRow {
            // `seq > after >= 0` in the query: never negative here.
            seq: row.get::<_, i64>(0) as u64,
            bytes: Ok(Bytes::copy_from_slice(row.get::<_, &[u8]>(1))),
            hash: hash(row.get(2)),
        })
        .collect())
}

fn summary_from(row: &Row, labels: BTreeMap<String, String>) -> Option<RunSummary> {
    let run_id = valid_id(row.get(1))?;
    let claim_token = u64::try_from(row.get::<_, i64>(9)).unwrap_or(0);
    let claim = match (
        row.get::<_, Option<String>>(8),
        row.get::<_, Option<i64>>(10),
    ) {
        (Some(owner), Some(expires_ms)) => Some(Claim {
            run_id: run_id.clone(),
            owner,
            token: claim_token,
            expires_ms,
        }),
        _ => None,
    };
    Some(RunSummary {
        run_id,
        agent: row.get(2),
        status: row.get(3),
        labels,
        session: row.get(4),
        created_ms: row.get(5),
        updated_ms: row.get(6),
        event_count: u64::try_from(row.get::<_, i64>(7)).unwrap_or(0),
        claim,
        claim_token,
        owes_deliveries: u32::try_from(row.get::<_, i32>(11)).unwrap_or(0),
        wake_ms: row.get(12),
    })
}

/// Runs a query selecting [`SUMMARY_COLUMNS`] and adds each run's labels.
async fn summaries(
    tx: &Tx<'_>,
    context: &str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<RunSummary>, StoreError> {
    let rows = query(tx, context, sql, params).await?;
    let pks: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let mut labels: BTreeMap<i64, BTreeMap<String, String>> = BTreeMap::new();
    if !pks.is_empty() {
        for row in query(
            tx,
            context,
            "SELECT run_pk, key, value FROM run_labels WHERE run_pk = ANY($1)",
            &[&pks],
        )
        .await?
        {
            labels
                .entry(row.get(0))
                .or_default()
                .insert(row.get(1), row.get(2));
        }
    }
    Ok(rows
        .iter()
        .filter_map(|row| summary_from(row, labels.remove(&row.get(0)).unwrap_or_default()))
        .collect())
}

/// The listing query for `filter`, and its parameters.
fn list_query(filter: &RunFilter) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut sql = format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE true");
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    let mut param = |sql: &mut String, value: Box<dyn ToSql + Sync + Send>| {
        params.push(value);
        sql.push_str(&format!("${}", params.len()));
    };
    if !filter.statuses.is_empty() {
        sql.push_str(" AND status = ANY(");
        param(&mut sql, Box::new(filter.statuses.clone()));
        sql.push(')');
    }
    if let Some(agent) = &filter.agent {
        sql.push_str(" AND agent = ");
        param(&mut sql, Box::new(agent.clone()));
    }
    if let Some(session) = &filter.session {
        sql.push_str(" AND session = ");
        param(&mut sql, Box::new(session.clone()));
    }
    if let Some(since) = filter.created_since {
        sql.push_str(" AND created_ms >= ");
        param(&mut sql, Box::new(since));
    }
    if let Some(before) = filter.created_before {
        sql.push_str(" AND created_ms < ");
        param(&mut sql, Box::new(before));
    }
    if let Some(prefix) = &filter.id_prefix {
        // Byte order whatever the database's collation, so the range holds
        // exactly the ids that start with the prefix.
        sql.push_str(" AND id COLLATE \"C\" >= ");
        param(&mut sql, Box::new(prefix.clone()));
        sql.push_str(" AND id COLLATE \"C\" < ");
        param(&mut sql, Box::new(crate::id_prefix_end(prefix)));
    }
    if let Some(after) = &filter.after {
        // A row comparison: a range of the `(created_ms, id)` indexes.
        sql.push_str(if filter.newest_first {
            " AND (created_ms, id) < ("
        } else {
            " AND (created_ms, id) > ("
        });
        param(&mut sql, Box::new(after.created_ms));
        sql.push_str(", ");
        param(&mut sql, Box::new(after.run_id.to_string()));
        sql.push(')');
    }
    for (key, value) in &filter.labels {
        sql.push_str(" AND pk IN (SELECT run_pk FROM run_labels WHERE key = ");
        param(&mut sql, Box::new(key.clone()));
        sql.push_str(" AND value = ");
        param(&mut sql, Box::new(value.clone()));
        sql.push(')');
    }
    sql.push_str(if filter.newest_first {
        " ORDER BY created_ms DESC, id DESC"
    } else {
        " ORDER BY created_ms, id"
    });
    if let Some(limit) = filter.limit {
        sql.push_str(" LIMIT ");
        param(&mut sql, Box::new(i64::try_from(limit).unwrap_or(i64::MAX)));
    }
    (sql, params)
}

/// The claim columns of a run, read inside a write transaction.
struct ClaimRow {
    owner: Option<String>,
    token: u64,
}

impl ClaimRow {
    fn holds(&self, claim: &Claim) -> bool {
        self.token == claim.token && self.owner.as_deref() == Some(claim.owner.as_str())
    }
}

async fn claim_row(tx: &Tx<'_>, run_id: &RunId) -> Result<ClaimRow, StoreError> {
    let context = format!("postgres: cannot read the claim of run {run_id}");
    let rows = query(
        tx,
        &context,
        "SELECT lease_owner, lease_token FROM runs WHERE id = $1",
        &[&run_id.as_str()],
    )
    .await?;
    match rows.first() {
        Some(row) => Ok(ClaimRow {
            owner: row.get(0),
            token: row.get::<_, i64>(1) as u64,
        }),
        None => Err(unknown(tx, run_id).await),
    }
}

#[async_trait]
impl EventStore for PostgresStore {
    async fn create(
        &self,
        run_id: &RunId,
        meta: RunMeta,
        first_event: Bytes,
        status: ListingStatus,
    ) -> Result<Appended, StoreError> {
        let status = status.name();
        let context = format!("postgres: cannot create run {run_id}");
        let head = self
            .chain
            .link(&self.chain.genesis(run_id), 1, &first_event);
        self.write(&context, async |tx| {
            let gone = query(
                tx,
                &context,
                "SELECT 1 FROM tombstones WHERE id = $1",
                &[&run_id.as_str()],
            )
            .await?;
            if let Some(session) = &meta.session {
                // Starts in one session queue here until the first commits,
                // so the check below sees its run; the unique index
                // `runs_one_active_per_session` backs it up.
                execute(
                    tx,
                    &context,
                    "SELECT pg_advisory_xact_lock(hashtext('warden.session.' || $1))",
                    &[session],
                )
                .await?;
                let active = query(
                    tx,
                    &context,
                    concat!(
                        "SELECT id FROM runs WHERE session = $1 AND status NOT IN (",
                        settled_sql!(),
                        ") LIMIT 1"
                    ),
                    &[session],
                )
                .await?;
                if let Some(row) = active.first() {
                    let active_run: String = row.get(0);
                    return Err(StoreError::SessionBusy {
                        session: session.clone(),
                        active_run: RunId::new(&active_run).map_err(|e| StoreError::Backend {
                            context: context.clone(),
                            error: Box::new(e),
                        })?,
                    });
                }
                if let Some(expected) = meta.session_runs {
                    let rows = query(
                        tx,
                        &context,
                        "SELECT runs FROM sessions WHERE session = $1",
                        &[session],
                    )
                    .await?;
                    let found = rows.first().map_or(0, |r| r.get::<_, i64>(0)) as u64;
                    if found != expected {
                        return Err(StoreError::SessionChanged {
                            session: session.clone(),
                            expected,
                            found,
                        });
                    }
                }
            }
            if !meta.history.is_empty() || meta.history_head.is_some() {
                // Shared with other starts, exclusive with a prune: the
                // chunks this run links to cannot be deleted before it
                // commits.
                execute(
                    tx,
                    &context,
                    "SELECT pg_advisory_xact_lock_shared(hashtext('warden.history'))",
                    &[],
                )
                .await?;
                let links: Vec<&[u8]> = meta
                    .history
                    .iter()
                    .filter_map(|c| c.previous())
                    .chain(meta.history_head.as_ref())
                    .map(|d| d.as_bytes().as_slice())
                    .collect();
                let stored: Vec<Vec<u8>> = query(
                    tx,
                    &context,
                    "SELECT digest FROM history_chunks WHERE digest = ANY($1)",
                    &[&links],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
                history::check_new_chunks(&meta.history, meta.history_head.as_ref(), |d| {
                    Ok(stored.iter().any(|s| s.as_slice() == d.as_bytes()))
                })?;
                let digests: Vec<&[u8]> = meta
                    .history
                    .iter()
                    .map(|c| c.digest().as_bytes().as_slice())
                    .collect();
                let previous: Vec<Option<&[u8]>> = meta
                    .history
                    .iter()
                    .map(|c| c.previous().map(|p| p.as_bytes().as_slice()))
                    .collect();
                let bodies: Vec<&[u8]> = meta.history.iter().map(|c| c.body().as_ref()).collect();
                execute(
                    tx,
                    &context,
                    "INSERT INTO history_chunks (digest, previous, body)
                     SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[])
                     ON CONFLICT (digest) DO NOTHING",
                    &[&digests, &previous, &bodies],
                )
                .await?;
            }
            let history_head = meta.history_head.map(|h| h.as_bytes().to_vec());
            let created = query(
                tx,
                &context,
                "INSERT INTO runs (id, agent, status, session, created_ms, updated_ms, event_count, head_hash, history_head)
                 SELECT $1, $2, $3, $4, $5, $5, 1, $6, $8 WHERE NOT $7
                 ON CONFLICT (id) DO NOTHING RETURNING pk",
                &[
                    &run_id.as_str(),
                    &meta.agent,
                    &status,
                    &meta.session,
                    &meta.created_ms,
                    &head.as_bytes().as_slice(),
                    &!gone.is_empty(),
                    &history_head,
                ],
            )
            .await?;
            let Some(row) = created.first() else {
                return Err(StoreError::AlreadyExists {
                    run_id: run_id.clone(),
                });
            };
            let pk: i64 = row.get(0);
            if !meta.labels.is_empty() {
                let keys: Vec<&str> = meta.labels.keys().map(String::as_str).collect();
                let values: Vec<&str> = meta.labels.values().map(String::as_str).collect();
                execute(
                    tx,
                    &context,
                    "INSERT INTO run_labels (run_pk, key, value) SELECT $1, * FROM unnest($2::text[], $3::text[])",
                    &[&pk, &keys, &values],
                )
                .await?;
            }
            execute(
                tx,
                &context,
                "INSERT INTO events (run_pk, seq, bytes, hash) VALUES ($1, 1, $2, $3)",
                &[&pk, &first_event.as_ref(), &head.as_bytes().as_slice()],
            )
            .await?;
            Ok(())
        })
        .await?;
        Ok(Appended {
            event_count: 1,
            head,
        })
    }

    async fn append(
        &self,
        run_id: &RunId,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
    ) -> Result<Appended, StoreError> {
        self.append_inner(
            run_id,
            None,
            expected_len,
            events,
            listing,
            updated_ms,
            None,
        )
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
        let context = format!("postgres: cannot load run {run_id}");
        let tampered = |seq, reason| StoreError::Tampered {
            run_id: run_id.clone(),
            seq,
            reason,
        };
        let read = self
            .snapshot(&context, async |tx| {
                let RunRow { pk, count, head } = run_row(tx, run_id).await?;
                let count = count.map_err(|reason| tampered(0, reason))?;
                if after_seq >= count {
                    return Ok(None);
                }
                let start = if after_seq == 0 {
                    self.chain.genesis(run_id)
                } else {
                    let rows = query(
                        tx,
                        &context,
                        "SELECT hash FROM events WHERE run_pk = $1 AND seq = $2",
                        &[&pk, &(after_seq as i64)],
                    )
                    .await?;
                    match rows.first() {
                        None => {
                            return Err(tampered(
                                after_seq,
                                ChainBreak::Missing {
                                    recorded_count: count,
                                },
                            ));
                        }
                        Some(row) => {
                            hash(row.get(0)).map_err(|reason| tampered(after_seq, reason))?
                        }
                    }
                };
                let rows = event_rows(tx, &context, pk, after_seq).await?;
                Ok(Some((start, rows, Recorded { count, head })))
            })
            .await?;
        let Some((start, rows, recorded)) = read else {
            return Ok(Vec::new());
        };
        chain::walk(&self.chain, after_seq, start, rows, &recorded, true).into_events(run_id)
    }

    async fn load_many(
        &self,
        run_ids: &[RunId],
    ) -> Result<Vec<(RunId, Vec<StoredEvent>)>, StoreError> {
        let context = "postgres: cannot load runs";
        let ids: Vec<&str> = run_ids.iter().map(RunId::as_str).collect();
        // One snapshot, two queries: the runs' rows, then all their events;
        // each log's chain is then checked as `load` checks it.
        let (runs, mut events) = self
            .snapshot(context, async |tx| {
                let runs = query(
                    tx,
                    context,
                    "SELECT id, pk, event_count, head_hash FROM runs WHERE id = ANY($1)",
                    &[&ids],
                )
                .await?;
                let runs: BTreeMap<String, RunRow> = runs
                    .iter()
                    .map(|row| {
                        (
                            row.get::<_, String>(0),
                            RunRow {
                                pk: row.get(1),
                                count: count(row.get(2)),
                                head: hash(row.get(3)),
                            },
                        )
                    })
                    .collect();
                let pks: Vec<i64> = runs.values().map(|r| r.pk).collect();
                let rows = query(
                    tx,
                    context,
                    "SELECT run_pk, seq, bytes, hash FROM events WHERE run_pk = ANY($1) ORDER BY run_pk, seq",
                    &[&pks],
                )
                .await?;
                let mut events: BTreeMap<i64, Vec<RawRow>> = BTreeMap::new();
                for row in &rows {
                    events.entry(row.get(0)).or_default().push(RawRow {
                        // Stored from 1: never negative.
                        seq: row.get::<_, i64>(1) as u64,
                        bytes: Ok(Bytes::copy_from_slice(row.get::<_, &[u8]>(2))),
                        hash: hash(row.get(3)),
                    });
                }
                Ok((runs, events))
            })
            .await?;
        let mut logs = Vec::with_capacity(run_ids.len());
        for run_id in run_ids {
            // A run without a row never existed or was pruned: left out.
            let Some(RunRow { pk, count, head }) = runs.get(run_id.as_str()) else {
                continue;
            };
            let count = count.clone().map_err(|reason| StoreError::Tampered {
                run_id: run_id.clone(),
                seq: 0,
                reason,
            })?;
            let rows = events.remove(pk).unwrap_or_default();
            let recorded = Recorded {
                count,
                head: head.clone(),
            };
            let loaded = chain::walk(
                &self.chain,
                0,
                self.chain.genesis(run_id),
                rows,
                &recorded,
                true,
            )
            .into_events(run_id)?;
            logs.push((run_id.clone(), loaded));
        }
        Ok(logs)
    }

    async fn summary(&self, run_id: &RunId) -> Result<RunSummary, StoreError> {
        let context = format!("postgres: cannot read run {run_id}");
        self.snapshot(&context, async |tx| {
            let sql = format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = $1");
            let mut found = summaries(tx, &context, &sql, &[&run_id.as_str()]).await?;
            match found.pop() {
                Some(summary) => Ok(summary),
                None => Err(unknown(tx, run_id).await),
            }
        })
        .await
    }

    async fn list(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        let context = "postgres: cannot list runs";
        let (sql, params) = list_query(filter);
        let params: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        self.snapshot(context, async |tx| {
            summaries(tx, context, &sql, &params).await
        })
        .await
    }

    async fn session_head(&self, session: &str) -> Result<SessionHead, StoreError> {
        let context = format!("postgres: cannot read session {session}");
        self.snapshot(&context, async |tx| {
            // One row of `sessions`, and the active run through the unique
            // partial index `runs_one_active_per_session`: neither reads
            // the session's other runs.
            let counts = query(
                tx,
                &context,
                "SELECT runs, completed, latest_completed FROM sessions WHERE session = $1",
                &[&session],
            )
            .await?
            .first()
            .map(|r| {
                (
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1),
                    r.get::<_, Option<String>>(2),
                )
            });
            let active = query(
                tx,
                &context,
                concat!(
                    "SELECT id, status FROM runs WHERE session = $1 AND status NOT IN (",
                    settled_sql!(),
                    ") LIMIT 1"
                ),
                &[&session],
            )
            .await?
            .first()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)));
            crate::session::head_of_rows(counts, active, || context.clone())
        })
        .await
    }

    async fn verify(&self, run_id: &RunId) -> Result<VerifyReport, StoreError> {
        let context = format!("postgres: cannot verify run {run_id}");
        let (count, head, rows) = self
            .snapshot(&context, async |tx| {
                let RunRow { pk, count, head } = run_row(tx, run_id).await?;
                let rows = event_rows(tx, &context, pk, 0).await?;
                Ok((count, head, rows))
            })
            .await?;
        let mut findings = Vec::new();
        let count = count.unwrap_or_else(|kind| {
            findings.push(Finding { seq: 0, kind });
            0
        });
        let recorded = Recorded { count, head };
        let walk = chain::walk(
            &self.chain,
            0,
            self.chain.genesis(run_id),
            rows,
            &recorded,
            false,
        );
        findings.extend(walk.findings);
        Ok(VerifyReport {
            run_id: run_id.clone(),
            recorded_count: count,
            events_read: walk.rows_read,
            recorded_head: recorded.head.ok(),
            findings,
        })
    }

    async fn run_ids(&self) -> Result<Vec<RunId>, StoreError> {
        let context = "postgres: cannot list run ids";
        let rows = self
            .snapshot(context, async |tx| {
                query(tx, context, "SELECT id FROM runs ORDER BY id", &[]).await
            })
            .await?;
        Ok(rows.iter().filter_map(|r| valid_id(r.get(0))).collect())
    }

    async fn invalid_run_ids(&self) -> Result<Vec<String>, StoreError> {
        let context = "postgres: cannot list run ids";
        let rows = self
            .snapshot(context, async |tx| {
                query(tx, context, "SELECT id FROM runs ORDER BY id", &[]).await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|id| RunId::new(id.as_str()).is_err())
            .collect())
    }

    async fn acquire_claim(
        &self,
        run_id: &RunId,
        owner: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let context = format!("postgres: cannot claim run {run_id}");
        let expires_ms = now_ms.saturating_add(ttl_ms);
        self.write(&context, async |tx| {
            let rows = query(
                tx,
                &context,
                "SELECT lease_owner, lease_expires_ms FROM runs WHERE id = $1 FOR UPDATE",
                &[&run_id.as_str()],
            )
            .await?;
            let Some(row) = rows.first() else {
                return Err(unknown(tx, run_id).await);
            };
            let holder: Option<String> = row.get(0);
            let expiry: Option<i64> = row.get(1);
            if let (Some(holder), Some(expiry)) = (holder, expiry)
                && expiry > now_ms
                && holder != owner
            {
                return Err(StoreError::Claimed {
                    run_id: run_id.clone(),
                    owner: holder,
                    expires_ms: expiry,
                });
            }
            let rows = query(
                tx,
                &context,
                "UPDATE runs SET lease_owner = $2, lease_token = lease_token + 1, lease_expires_ms = $3
                 WHERE id = $1 RETURNING lease_token",
                &[&run_id.as_str(), &owner, &expires_ms],
            )
            .await?;
            Ok(Claim {
                run_id: run_id.clone(),
                owner: owner.to_owned(),
                token: rows[0].get::<_, i64>(0) as u64,
                expires_ms,
            })
        })
        .await
    }

    async fn renew_claim(
        &self,
        claim: &Claim,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let context = format!("postgres: cannot renew the claim of run {}", claim.run_id);
        let expires_ms = now_ms.saturating_add(ttl_ms);
        let renewed = self
            .alone(
                &context,
                "UPDATE runs SET lease_expires_ms = $4
                 WHERE id = $1 AND lease_token = $2 AND lease_owner = $3
                 RETURNING 1",
                &[
                    &claim.run_id.as_str(),
                    &(claim.token as i64),
                    &claim.owner,
                    &expires_ms,
                ],
            )
            .await?;
        if renewed.is_empty() {
            // Fenced (or not there): read which, for the error.
            let row = self
                .snapshot(&context, async |tx| claim_row(tx, &claim.run_id).await)
                .await?;
            return Err(StoreError::Fenced {
                run_id: claim.run_id.clone(),
                token: claim.token,
                current: row.token,
            });
        }
        Ok(Claim {
            expires_ms,
            ..claim.clone()
        })
    }

    async fn release_claim(
        &self,
        claim: &Claim,
        status: Option<ListingStatus>,
    ) -> Result<(), StoreError> {
        let status = status.map(|s| s.name());
        let context = format!("postgres: cannot release the claim of run {}", claim.run_id);
        let released = self
            .alone(
                &context,
                "UPDATE runs SET lease_owner = NULL, lease_expires_ms = NULL,
                     status = coalesce($4, status)
                 WHERE id = $1 AND lease_token = $2 AND lease_owner = $3
                 RETURNING 1",
                &[
                    &claim.run_id.as_str(),
                    &(claim.token as i64),
                    &claim.owner,
                    &status,
                ],
            )
            .await?;
        if released.is_empty() {
            // Not current (fine) or not there (an error).
            self.snapshot(&context, async |tx| claim_row(tx, &claim.run_id).await)
                .await?;
        }
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
        self.append_inner(
            run_id,
            Some(claim),
            expected_len,
            events,
            listing,
            updated_ms,
            None,
        )
        .await
    }

    async fn commitments(&self, filter: &CommitmentFilter) -> Result<Vec<Commitment>, StoreError> {
        let context = "postgres: cannot list idempotency commitments";
        let key = filter.key.clone();
        let run_id = filter.run_id.as_ref().map(|r| r.as_str().to_owned());
        let rows = self
            .snapshot(context, async |tx| {
                query(
                    tx,
                    context,
                    r#"SELECT key, run_id, call_id, result, seal FROM commitments
                     WHERE ($1::text IS NULL OR key = $1) AND ($2::text IS NULL OR run_id = $2)
                     ORDER BY key COLLATE "C""#,
                    &[&key, &run_id],
                )
                .await
            })
            .await?;
        for row in &rows {
            checked_commitment(&self.chain, row, 0)?;
        }
        // A holder that is not a valid run id is skipped, as its run is.
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some(Commitment {
                    key: r.get(0),
                    holder: Holder {
                        run_id: valid_id(r.get(1))?,
                        call_id: r.get(2),
                    },
                    result: r.get::<_, Option<Vec<u8>>>(3).map(Bytes::from),
                })
            })
            .collect())
    }

    async fn add_rule(&self, rule: &ApprovalRule) -> Result<(), StoreError> {
        let context = format!("postgres: cannot add approval rule {}", rule.id);
        let seal = sealed::rule(&self.chain, rule);
        let inserted = self
            .write(&context, async |tx| {
                execute(
                    tx,
                    &context,
                    "INSERT INTO approval_rules (id, spec, created_by, created_ms, expires_ms, seal)
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                    &[
                        &rule.id,
                        &rule.spec,
                        &rule.created_by,
                        &rule.created_ms,
                        &rule.expires_ms,
                        &seal.as_bytes().as_slice(),
                    ],
                )
                .await
            })
            .await?;
        if inserted == 0 {
            return Err(StoreError::RuleExists {
                id: rule.id.clone(),
            });
        }
        Ok(())
    }

    async fn load_history(&self, head: &HistoryDigest) -> Result<Vec<HistoryChunk>, StoreError> {
        let context = format!("postgres: cannot read the session history {head}");
        let rows = self
            .snapshot(&context, async |tx| {
                // The walk follows stored links only; each chunk is checked
                // against its digest in `chain_from` (UNION ends a loop in
                // tampered links).
                query(
                    tx,
                    &context,
                    "WITH RECURSIVE chain (digest) AS (
                         SELECT $1::bytea
                         UNION
                         SELECT h.previous FROM history_chunks h JOIN chain c ON h.digest = c.digest
                         WHERE h.previous IS NOT NULL
                     )
                     SELECT h.digest, h.previous, h.body FROM chain JOIN history_chunks h USING (digest)",
                    &[&head.as_bytes().as_slice()],
                )
                .await
            })
            .await?;
        let rows = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        history::chain_from(head, history::checked_rows(rows))
    }

    async fn rules(&self) -> Result<Vec<ApprovalRule>, StoreError> {
        let context = "postgres: cannot list approval rules";
        let rows = self
            .snapshot(context, async |tx| {
                query(
                    tx,
                    context,
                    &format!(r#"{RULE_COLUMNS} ORDER BY created_ms, id COLLATE "C""#),
                    &[],
                )
                .await
            })
            .await?;
        rows.iter()
            .map(|row| checked_rule(&self.chain, rule_of_row(row)))
            .collect()
    }

    async fn verify_rows(&self) -> Result<RowsReport, StoreError> {
        let context = "postgres: cannot read the sealed tables";
        let (rules, commitments) = self
            .snapshot(context, async |tx| {
                let rules = query(
                    tx,
                    context,
                    &format!(r#"{RULE_COLUMNS} ORDER BY id COLLATE "C""#),
                    &[],
                )
                .await?;
                let commitments = query(
                    tx,
                    context,
                    r#"SELECT key, run_id, call_id, result, seal FROM commitments ORDER BY key COLLATE "C""#,
                    &[],
                )
                .await?;
                Ok((rules, commitments))
            })
            .await?;
        let mut findings = Vec::new();
        for row in &rules {
            let (rule, seal) = rule_of_row(row);
            let expected = sealed::rule(&self.chain, &rule);
            sealed::collect(
                &mut findings,
                sealed::RULES,
                &rule.id,
                seal.as_deref(),
                &expected,
            );
        }
        for row in &commitments {
            if let Err(StoreError::RowTampered { table, row, reason }) =
                checked_commitment(&self.chain, row, 0)
            {
                findings.push(RowFinding { table, row, reason });
            }
        }
        Ok(RowsReport::new(
            vec![
                (sealed::RULES, rules.len() as u64),
                (sealed::COMMITMENTS, commitments.len() as u64),
            ],
            findings,
        ))
    }

    async fn rule(&self, id: &str) -> Result<Option<ApprovalRule>, StoreError> {
        let context = format!("postgres: cannot read approval rule {id}");
        let rows = self
            .snapshot(&context, async |tx| {
                query(
                    tx,
                    &context,
                    &format!("{RULE_COLUMNS} WHERE id = $1"),
                    &[&id],
                )
                .await
            })
            .await?;
        rows.first()
            .map(|row| checked_rule(&self.chain, rule_of_row(row)))
            .transpose()
    }

    async fn revoke_rule(
        &self,
        id: &str,
        by: &str,
        at_ms: i64,
    ) -> Result<ApprovalRule, StoreError> {
        let context = format!("postgres: cannot revoke approval rule {id}");
        // The row is locked, its seal checked (resealing an edited row
        // would make the edit pass), then revoked and resealed.
        self.write(&context, async |tx| {
            let rows = query(
                tx,
                &context,
                &format!("{RULE_COLUMNS} WHERE id = $1 FOR UPDATE"),
                &[&id],
            )
            .await?;
            let mut rule = match rows.first() {
                Some(row) => checked_rule(&self.chain, rule_of_row(row))?,
                None => return Err(StoreError::UnknownRule { id: id.to_owned() }),
            };
            if rule.revoked.is_some() {
                return Ok(rule);
            }
            rule.revoked = Some(Revocation {
                by: by.to_owned(),
                at_ms,
            });
            let seal = sealed::rule(&self.chain, &rule);
            execute(
                tx,
                &context,
                "UPDATE approval_rules SET revoked_by = $2, revoked_ms = $3, seal = $4
                 WHERE id = $1 AND revoked_by IS NULL",
                &[&id, &by, &at_ms, &seal.as_bytes().as_slice()],
            )
            .await?;
            Ok(rule)
        })
        .await
    }

    async fn export_cursors(&self, reader: &str) -> Result<BTreeMap<RunId, u64>, StoreError> {
        let context = format!("postgres: cannot read export cursors of {reader}");
        let rows = self
            .snapshot(&context, async |tx| {
                query(
                    tx,
                    &context,
                    "SELECT run_id, through FROM export_cursors WHERE reader = $1",
                    &[&reader],
                )
                .await
            })
            .await?;
        // A row whose id is not a run id was not written by this store:
        // skipped, as listing skips such runs.
        Ok(rows
            .iter()
            .filter_map(|r| {
                let through: i64 = r.get(1);
                Some((
                    RunId::new(r.get::<_, String>(0)).ok()?,
                    through.max(0) as u64,
                ))
            })
            .collect())
    }

    async fn advance_export_cursor(
        &self,
        reader: &str,
        run_id: &RunId,
        through: u64,
    ) -> Result<(), StoreError> {
        let context = format!("postgres: cannot advance export cursor {reader} on run {run_id}");
        let through = i64::try_from(through).unwrap_or(i64::MAX);
        self.write(&context, async |tx| {
            execute(
                tx,
                &context,
                "INSERT INTO export_cursors (reader, run_id, through) VALUES ($1, $2, $3)
                 ON CONFLICT (reader, run_id) DO UPDATE SET through = excluded.through
                 WHERE excluded.through > export_cursors.through",
                &[&reader, &run_id.as_str(), &through],
            )
            .await
        })
        .await?;
        Ok(())
    }

    async fn claim_commitment(&self, key: &str, holder: &Holder) -> Result<KeyClaim, StoreError> {
        let context = format!("postgres: cannot claim idempotency commitment {key}");
        let seal = sealed::commitment(
            &self.chain,
            key,
            holder.run_id.as_str(),
            &holder.call_id,
            None,
        );
        self.write(&context, async |tx| {
            execute(
                tx,
                &context,
                "INSERT INTO commitments (key, run_id, call_id, seal) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING",
                &[&key, &holder.run_id.as_str(), &holder.call_id, &seal.as_bytes().as_slice()],
            )
            .await?;
            let rows = query(
                tx,
                &context,
                "SELECT key, run_id, call_id, result, seal FROM commitments WHERE key = $1",
                &[&key],
            )
            .await?;
            let row = rows.first().ok_or_else(|| StoreError::Backend {
                context: context.clone(),
                error: "the commitment vanished after its insert".into(),
            })?;
            checked_commitment(&self.chain, row, 0)?;
            let found = Holder {
                run_id: RunId::new(row.get::<_, String>(1)).map_err(|e| StoreError::Backend {
                    context: context.clone(),
                    error: Box::new(e),
                })?,
                call_id: row.get(2),
            };
            let result: Option<Vec<u8>> = row.get(3);
            Ok(match result {
                Some(result) => KeyClaim::Settled {
                    holder: found,
                    result: Bytes::from(result),
                },
                None if found == *holder => KeyClaim::Granted,
                None => KeyClaim::Held(found),
            })
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
        self.append_inner(
            run_id,
            fence,
            expected_len,
            events,
            listing,
            updated_ms,
            Some(settlement),
        )
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
        let context = format!("postgres: cannot claim runs for {owner}");
        let expires_ms = now_ms.saturating_add(ttl_ms);
        let rows = self
            .alone(
                &context,
                "UPDATE runs SET lease_owner = $1, lease_token = lease_token + 1, lease_expires_ms = $3
                     WHERE pk IN (
                         SELECT pk FROM runs
                         WHERE (((status IN ($4, $7) OR owes_deliveries > 0)
                                 AND (status = $4 OR lease_token > 0))
                                OR (status = $6 AND wake_ms <= $2))
                           AND (lease_owner IS NULL OR lease_expires_ms <= $2)
                         ORDER BY created_ms, id
                         LIMIT $5
                         FOR UPDATE SKIP LOCKED)
                     RETURNING id, lease_token, created_ms",
                    &[
                        &owner,
                        &now_ms,
                        &expires_ms,
                        &QUEUED,
                        &i64::try_from(limit).unwrap_or(i64::MAX),
                        &WAITING,
                        &RUNNING,
                    ],
            )
            .await?;
        let mut claims: Vec<(i64, Claim)> = rows
            .iter()
            .filter_map(|row| {
                Some((
                    row.get::<_, i64>(2),
                    Claim {
                        run_id: valid_id(row.get(0))?,
                        owner: owner.to_owned(),
                        token: row.get::<_, i64>(1) as u64,
                        expires_ms,
                    },
                ))
            })
            .collect();
        claims.sort_by(|a, b| (a.0, &a.1.run_id).cmp(&(b.0, &b.1.run_id)));
        Ok(claims.into_iter().map(|(_, claim)| claim).collect())
    }

    async fn prune(&self, filter: &PruneFilter, now_ms: i64) -> Result<Vec<Tombstone>, StoreError> {
        let Some(before) = filter.updated_before.filter(|_| !filter.is_empty()) else {
            return Ok(Vec::new());
        };
        let context = "postgres: cannot prune runs";
        let rows = self
            .write(context, async |tx| {
                let rows = query(
                    tx,
                    context,
                    "SELECT pk, id, agent, status, created_ms, updated_ms, event_count, head_hash
                     FROM runs
                     WHERE status = ANY($1) AND updated_ms < $2
                       AND (lease_owner IS NULL OR lease_expires_ms <= $3)
                       AND owes_deliveries = 0
                     ORDER BY id
                     FOR UPDATE SKIP LOCKED",
                    &[&filter.statuses, &before, &now_ms],
                )
                .await?;
                // A run whose id or head is unreadable is damaged: it stays for
                // a human.
                let rows: Vec<Row> = rows
                    .into_iter()
                    .filter(|r| valid_id(r.get(1)).is_some() && hash(r.get(7)).is_ok())
                    .collect();
                let pks: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                execute(
                    tx,
                    context,
                    "INSERT INTO tombstones (id, agent, status, created_ms, updated_ms, event_count, head_hash, pruned_ms)
                     SELECT id, agent, status, created_ms, updated_ms, event_count, head_hash, $2
                     FROM runs WHERE pk = ANY($1)",
                    &[&pks, &now_ms],
                )
                .await?;
                execute(tx, context, "DELETE FROM runs WHERE pk = ANY($1)", &[&pks]).await?;
                if !pks.is_empty() {
                    // The history chunks no remaining run reaches go with the
                    // runs; exclusive with starts linking to chunks, so the
                    // runs they create are seen here or find their chunks
                    // gone and write nothing.
                    execute(
                        tx,
                        context,
                        "SELECT pg_advisory_xact_lock(hashtext('warden.history'))",
                        &[],
                    )
                    .await?;
                    execute(tx, context, history::DELETE_UNREACHED_SQL, &[]).await?;
                }
                Ok(rows)
            })
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some(Tombstone {
                    run_id: valid_id(r.get(1))?,
                    agent: r.get(2),
                    status: r.get(3),
                    created_ms: r.get(4),
                    updated_ms: r.get(5),
                    event_count: u64::try_from(r.get::<_, i64>(6)).unwrap_or(0),
                    head: hash(r.get(7)).ok()?,
                    pruned_ms: now_ms,
                })
            })
            .collect())
    }
}

impl PostgresStore {
    /// Appends `events` in one transaction whose statements travel in two
    /// pipelined round trips: `BEGIN` with the reads that lock and check
    /// the run (and the commitment it settles), then the writes with the
    /// `COMMIT`. A pipeline stops at the first statement that fails: the
    /// server aborts the transaction, every later statement in it fails,
    /// and the `COMMIT` rolls back; so the writes either all commit or
    /// none, as in a transaction run one statement at a time.
    #[allow(clippy::too_many_arguments)]
    async fn append_inner(
        &self,
        run_id: &RunId,
        fence: Option<&Claim>,
        expected_len: u64,
        events: &[Bytes],
        listing: Listing,
        updated_ms: i64,
        settle: Option<&Settlement>,
    ) -> Result<Appended, StoreError> {
        if events.is_empty() {
            return Err(StoreError::EmptyAppend {
                run_id: run_id.clone(),
            });
        }
        let context = format!("postgres: cannot append to run {run_id}");
        let pg = |e: tokio_postgres::Error| pg_error(&context, e);
        let tampered = |seq, reason| StoreError::Tampered {
            run_id: run_id.clone(),
            seq,
            reason,
        };
        let client = self.client().await?;
        // Prepared before anything is sent (a hit in the connection's cache
        // costs nothing), so that each statement below goes out when it is
        // first polled, in the order written.
        let lock_commitment = client
            .prepare_cached(
                "SELECT key, run_id, call_id, result, seal FROM commitments WHERE key = $1 FOR UPDATE",
            )
            .await
            .map_err(pg)?;
        let lock_run = client
            .prepare_cached(
                "SELECT pk, event_count, head_hash, lease_owner, lease_token
                 FROM runs WHERE id = $1 FOR UPDATE",
            )
            .await
            .map_err(pg)?;
        // A child run is fenced by the claim of the run driving it: that
        // run's row, locked shared, so a takeover of it waits for this
        // append or fences it.
        let lock_fence = client
            .prepare_cached("SELECT lease_owner, lease_token FROM runs WHERE id = $1 FOR SHARE")
            .await
            .map_err(pg)?;
        let fence_run = fence
            .filter(|claim| claim.run_id != *run_id)
            .map(|claim| claim.run_id.as_str());
        // The tail past the length the caller expects: if the run has
        // another length the append is a conflict whatever the tail. Run
        // after the lock above, it sees every event committed before it.
        let read_tail = client
            .prepare_cached(
                "SELECT seq, hash FROM events
                 WHERE run_pk = (SELECT pk FROM runs WHERE id = $1) AND seq >= $2
                 ORDER BY seq LIMIT 2",
            )
            .await
            .map_err(pg)?;
        let insert = client
            .prepare_cached(
                "INSERT INTO events (run_pk, seq, bytes, hash)
                 SELECT $1, * FROM unnest($2::bigint[], $3::bytea[], $4::bytea[])",
            )
            .await
            .map_err(pg)?;
        let update = client
            .prepare_cached(
                "UPDATE runs SET status = $1, updated_ms = $2, event_count = $3, head_hash = $4,
                     owes_deliveries = $5, wake_ms = $6
                 WHERE pk = $7",
            )
            .await
            .map_err(pg)?;
        let settle_write = match settle.map(|s| &s.outcome) {
            Some(Settle::Result(_)) => Some(
                client
                    .prepare_cached("UPDATE commitments SET result = $2, seal = $3 WHERE key = $1")
                    .await
                    .map_err(pg)?,
            ),
            Some(Settle::Release) => Some(
                client
                    .prepare_cached("DELETE FROM commitments WHERE key = $1")
                    .await
                    .map_err(pg)?,
            ),
            None => None,
        };

        let mut open = Open::new(client);
        let c = open.client();
        let id = run_id.as_str();
        let expected = expected_len as i64;
        let run_params: [&(dyn ToSql + Sync); 1] = [&id];
        let tail_params: [&(dyn ToSql + Sync); 2] = [&id, &expected];
        self.counters.round_trip();
        let deferred = listing.durability == Durability::Deferred;
        let (begun, deferring, commitment, run, fencing, tail) = tokio::join!(
            c.batch_execute("BEGIN"),
            // A deferred append commits without waiting for the WAL flush
            // (this transaction only); see the module docs.
            async {
                if deferred {
                    c.batch_execute("SET LOCAL synchronous_commit = off").await
                } else {
                    Ok(())
                }
            },
            async {
                match settle {
                    Some(s) => c.query(&lock_commitment, &[&s.key]).await.map(Some),
                    None => Ok(None),
                }
            },
            c.query(&lock_run, &run_params),
            async {
                match &fence_run {
                    Some(id) => {
                        let params: [&(dyn ToSql + Sync); 1] = [id];
                        c.query(&lock_fence, &params).await.map(Some)
                    }
                    None => Ok(None),
                }
            },
            c.query(&read_tail, &tail_params),
        );
        // A `BEGIN` that failed leaves the connection in doubt: `open`
        // discards it.
        begun.map_err(pg)?;
        let checked = (|| {
            deferring.map_err(pg)?;
            let (commitment, rows, fencing, tail) = (
                commitment.map_err(pg)?,
                run.map_err(pg)?,
                fencing.map_err(pg)?,
                tail.map_err(pg)?,
            );
            if let (Some(settle), Some(rows)) = (settle, commitment) {
                let release = settle.outcome == Settle::Release;
                if let Some(row) = rows.first() {
                    checked_commitment(&self.chain, row, 0)?;
                }
                let held = rows.first().is_some_and(|r| {
                    r.get::<_, String>(1) == settle.holder.run_id.as_str()
                        && r.get::<_, String>(2) == settle.holder.call_id
                        && (r.get::<_, Option<Vec<u8>>>(3).is_none() || release)
                });
                if !held {
                    return Err(StoreError::CommitmentNotHeld {
                        key: settle.key.clone(),
                        run_id: settle.holder.run_id.clone(),
                        call_id: settle.holder.call_id.clone(),
                    });
                }
            }
            // No row: told apart (pruned or unknown) after the rollback.
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let pk: i64 = row.get(0);
            if let Some(claim) = fence {
                let held = match &fencing {
                    // The driving run's row (a child's append).
                    Some(rows) => match rows.first() {
                        Some(r) => ClaimRow {
                            owner: r.get(0),
                            token: r.get::<_, i64>(1) as u64,
                        },
                        None => {
                            return Err(StoreError::UnknownRun {
                                run_id: claim.run_id.clone(),
                            });
                        }
                    },
                    None => ClaimRow {
                        owner: row.get(3),
                        token: row.get::<_, i64>(4) as u64,
                    },
                };
                if !held.holds(claim) {
                    return Err(StoreError::Fenced {
                        run_id: claim.run_id.clone(),
                        token: claim.token,
                        current: held.token,
                    });
                }
            }
            let count = count(row.get(1)).map_err(|reason| tampered(0, reason))?;
            if count != expected_len {
                return Err(StoreError::Conflict {
                    run_id: run_id.clone(),
                    expected: expected_len,
                    actual: count,
                });
            }
            let head = hash(row.get(2)).map_err(|reason| tampered(count, reason))?;
            let tail: Vec<(u64, Result<ChainHash, ChainBreak>)> = tail
                .iter()
                .map(|r| {
                    (
                        u64::try_from(r.get::<_, i64>(0)).unwrap_or(0),
                        hash(r.get(1)),
                    )
                })
                .collect();
            chain::check_tail(count, &head, &tail).map_err(|f| tampered(f.seq, f.kind))?;
            Ok(Some((pk, count, head)))
        })();
        let (pk, count, head) = match checked {
            Ok(Some(found)) => found,
            Ok(None) => {
                open.rollback(&self.counters).await;
                return Err(self
                    .snapshot(&context, async |tx| Ok(unknown(tx, run_id).await))
                    .await?);
            }
            Err(error) => {
                open.rollback(&self.counters).await;
                return Err(error);
            }
        };

        let hashes = self.chain.extend(head, count, events);
        let seqs: Vec<i64> = (count + 1..=count + events.len() as u64)
            .map(|s| s as i64)
            .collect();
        let bytes: Vec<&[u8]> = events.iter().map(|b| b.as_ref()).collect();
        let links: Vec<&[u8]> = hashes.iter().map(|h| h.as_bytes().as_slice()).collect();
        let new_head = *hashes.last().expect("events is not empty");
        let new_count = count + events.len() as u64;
        let c = open.client();
        let status = listing.status.name();
        let event_count = new_count as i64;
        let head_bytes = new_head.as_bytes().as_slice();
        let owes = i32::try_from(listing.owes_deliveries).unwrap_or(i32::MAX);
        let insert_params: [&(dyn ToSql + Sync); 4] = [&pk, &seqs, &bytes, &links];
        let update_params: [&(dyn ToSql + Sync); 7] = [
            &status,
            &updated_ms,
            &event_count,
            &head_bytes,
            &owes,
            &listing.wake_ms,
            &pk,
        ];
        self.counters.round_trip();
        let (inserted, updated, settled, committed) = tokio::join!(
            c.execute(&insert, &insert_params),
            c.execute(&update, &update_params),
            async {
                match (settle, &settle_write) {
                    (Some(s), Some(statement)) => match &s.outcome {
                        Settle::Result(result) => {
                            let seal = sealed::commitment(
                                &self.chain,
                                &s.key,
                                s.holder.run_id.as_str(),
                                &s.holder.call_id,
                                Some(result),
                            );
                            c.execute(
                                statement,
                                &[&s.key, &result.as_ref(), &seal.as_bytes().as_slice()],
                            )
                            .await
                            .map(Some)
                        }
                        Settle::Release => c.execute(statement, &[&s.key]).await.map(Some),
                    },
                    _ => Ok(None),
                }
            },
            c.batch_execute("COMMIT"),
        );
        // A write that failed aborted the transaction, and the `COMMIT`
        // rolled it back; a `COMMIT` that failed leaves the connection in
        // doubt (`open` discards it). Either way nothing is acknowledged.
        let wrote = inserted.and(updated).and(settled);
        committed.map_err(pg)?;
        open.ended();
        wrote.map_err(pg)?;
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        if deferred {
            self.counters
                .deferred_commits
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(Appended {
            event_count: new_count,
            head: new_head,
        })
    }
}

/// A pooled connection in a transaction the store began by hand (to send
/// `BEGIN` and `COMMIT` along with other statements). Dropped before the
/// transaction ended (a caller that stopped waiting, a connection in
/// doubt), it is taken out of the pool and closed, which makes the server
/// roll the transaction back; it never returns to the pool mid-transaction.
struct Open {
    client: Option<Object>,
}

impl Open {
    fn new(client: Object) -> Self {
        Open {
            client: Some(client),
        }
    }

    fn client(&self) -> &tokio_postgres::Client {
        self.client.as_ref().expect("open until ended")
    }

    /// The transaction ended: the connection may go back to the pool.
    fn ended(&mut self) {
        drop(self.client.take());
    }

    /// Rolls back; a connection that cannot is discarded on drop.
    async fn rollback(&mut self, counters: &Counters) {
        counters.round_trip();
        if self.client().batch_execute("ROLLBACK").await.is_ok() {
            self.ended();
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests {
    use super::*;
    use crate::conformance::PostgresBackend;
    use crate::testing::suite::{id, new_run};

    /// A schema at version 3 (before `owes_deliveries`) is migrated to 4
    /// once, keeps its runs (owing nothing), and takes the new column; the
    /// migration's SQL may run again harmlessly; a newer schema is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_version_3_schema_migrates_once_and_a_newer_one_is_refused() {
        let Some(backend) = PostgresBackend::connect().await else {
            return;
        };
        let (store, applied) = backend.builder().open_and_migrate().await.unwrap();
        assert_eq!(applied, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        new_run(&store, &id("old"), 3).await;
        drop(store);
        // What version 3 looked like.
        let raw = backend.raw().await;
        raw.batch_execute(
            "DROP INDEX runs_owing;
             ALTER TABLE runs DROP COLUMN owes_deliveries;
             UPDATE store_meta SET value = '3' WHERE key = 'schema_version';",
        )
        .await
        .unwrap();

        let (store, applied) = backend.builder().open_and_migrate().await.unwrap();
        assert_eq!(applied, [4, 5, 6, 7, 8, 9, 10]);
        let summary = store.summary(&id("old")).await.unwrap();
        assert_eq!((summary.event_count, summary.owes_deliveries), (3, 0));
        assert!(store.verify(&id("old")).await.unwrap().is_intact());
        store
            .append(
                &id("old"),
                3,
                &[crate::testing::suite::ev("end")],
                Listing::new(ListingStatus::COMPLETED).owing(1),
                9,
            )
            .await
            .unwrap();
        assert_eq!(store.summary(&id("old")).await.unwrap().owes_deliveries, 1);
        drop(store);
        let (_, applied) = backend.builder().open_and_migrate().await.unwrap();
        assert!(applied.is_empty(), "{applied:?}");
        raw.batch_execute(schema::MIGRATIONS[3]).await.unwrap();
        raw.batch_execute(schema::MIGRATIONS[4]).await.unwrap();
        raw.batch_execute(schema::MIGRATIONS[5]).await.unwrap();

        raw.batch_execute(&format!(
            "UPDATE store_meta SET value = '{}' WHERE key = 'schema_version'",
            schema::SCHEMA_VERSION + 1
        ))
        .await
        .unwrap();
        match backend.builder().open_and_migrate().await {
            Err(StoreError::SchemaTooNew { found, supported }) => {
                assert_eq!(
                    (found, supported),
                    (schema::SCHEMA_VERSION + 1, schema::SCHEMA_VERSION)
                )
            }
            other => panic!("expected SchemaTooNew, got {:?}", other.map(|(_, a)| a)),
        }
    }

    /// The store's own connections run with `synchronous_commit = on`, even
    /// where the role's default is off; a read-only open creates nothing,
    /// writes nothing and refuses a schema that holds no store.
    /// `synchronous_commit` as one of the store's pooled connections has it.
    async fn synchronous_commit(store: &PostgresStore) -> String {
        store
            .client()
            .await
            .unwrap()
            .query_one("SHOW synchronous_commit", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// A deferred append commits without waiting for the flush for its own
    /// transaction only: the one pooled connection is back to
    /// `synchronous_commit = on` after it (and after a deferred append that
    /// was refused), the next synced append is not deferred, and each
    /// append costs two round trips, a claim, a renewal and a release one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deferred_append_commits_asynchronously_alone_in_two_round_trips() {
        let Some(backend) = PostgresBackend::connect().await else {
            return;
        };
        let store = backend.builder().max_connections(1).open().await.unwrap();
        let run = id("deferred");
        new_run(&store, &run, 1).await;
        let shown = async || synchronous_commit(&store).await;
        let before = store.stats();
        let deferred = Listing::new(ListingStatus::RUNNING).deferred();
        store
            .append(&run, 1, &[crate::testing::suite::ev("two")], deferred, 2)
            .await
            .unwrap();
        let after = store.stats();
        assert_eq!(
            (
                after.commits - before.commits,
                after.deferred_commits - before.deferred_commits,
                after.round_trips - before.round_trips
            ),
            (1, 1, 2)
        );
        assert_eq!(shown().await, "on");
        // Refused (a stale length): rolled back, the connection still on.
        let refused = store
            .append(&run, 1, &[crate::testing::suite::ev("again")], deferred, 3)
            .await;
        assert!(
            matches!(refused, Err(StoreError::Conflict { .. })),
            "{refused:?}"
        );
        assert_eq!(shown().await, "on");
        let before = store.stats();
        store
            .append(
                &run,
                2,
                &[crate::testing::suite::ev("three")],
                Listing::new(ListingStatus::RUNNING),
                4,
            )
            .await
            .unwrap();
        let after = store.stats();
        assert_eq!(
            (
                after.commits - before.commits,
                after.deferred_commits - before.deferred_commits
            ),
            (1, 0)
        );
        assert_eq!(store.load(&run).await.unwrap().len(), 3);

        let queued = id("queued");
        store
            .create(
                &queued,
                crate::testing::suite::meta("agent", 1),
                crate::testing::suite::ev("one"),
                ListingStatus::QUEUED,
            )
            .await
            .unwrap();
        let before = store.stats();
        let claims = store.claim("w", 10, 1_000, 4).await.unwrap();
        assert_eq!(claims.len(), 1);
        let claim = store.renew_claim(&claims[0], 20, 1_000).await.unwrap();
        store.release_claim(&claim, None).await.unwrap();
        let after = store.stats();
        assert_eq!(
            (
                after.commits - before.commits,
                after.round_trips - before.round_trips
            ),
            (3, 3)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_commit_synchronously_and_read_only_opens_write_nothing() {
        let Some(backend) = PostgresBackend::connect().await else {
            return;
        };
        // Nothing there yet: neither a read-only nor an existing-store open
        // creates the schema.
        for mode in [OpenMode::ReadOnly, OpenMode::Existing] {
            match backend.builder().mode(mode).open().await {
                Err(StoreError::NoStore { location, .. }) => {
                    assert!(location.contains(&backend_schema(&backend)), "{location}")
                }
                other => panic!("{mode:?}: expected NoStore, got {other:?}"),
            }
        }
        let raw = backend.raw().await;
        let schemas = raw
            .query(
                "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1",
                &[&backend_schema(&backend)],
            )
            .await
            .unwrap();
        assert!(schemas.is_empty(), "a read-only open created the schema");

        // A role whose default is off: the store's sessions still set on.
        let role = format!("{}_async", backend_schema(&backend));
        let database: String = raw
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap()
            .get(0);
        raw.batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             ALTER ROLE {role} SET synchronous_commit = off;
             GRANT CREATE ON DATABASE {database} TO {role};"
        ))
        .await
        .unwrap();
        let url = PostgresBackend::url();
        let (scheme, rest) = url.split_once("://").unwrap();
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        let as_role = format!("{scheme}://{role}@{host}");
        let (client, connection) = tokio_postgres::connect(&as_role, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let shown: String = client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            shown, "off",
            "the role's own sessions commit asynchronously"
        );
        let store = PostgresStore::builder(&as_role)
            .schema(backend_schema(&backend))
            .open()
            .await
            .unwrap();
        new_run(&store, &id("r"), 2).await;
        assert_eq!(synchronous_commit(&store).await, "on");
        drop(store);

        let version = || async {
            raw.query_one(
                "SELECT xmin::text::bigint FROM store_meta WHERE key = 'schema_version'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        };
        let before = version().await;
        let read_only = backend
            .builder()
            .mode(OpenMode::ReadOnly)
            .open()
            .await
            .unwrap();
        assert_eq!(read_only.load(&id("r")).await.unwrap().len(), 2);
        assert_eq!(
            version().await,
            before,
            "a read-only open rewrote the schema version"
        );
        let client = read_only.client().await.unwrap();
        let shown: String = client
            .query_one("SHOW default_transaction_read_only", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(shown, "on");
        assert!(
            read_only
                .append(
                    &id("r"),
                    2,
                    &[crate::testing::suite::ev("x")],
                    ListingStatus::RUNNING.into(),
                    3
                )
                .await
                .is_err()
        );
        assert_eq!(read_only.load(&id("r")).await.unwrap().len(), 2);
        drop(read_only);
        raw.batch_execute(&format!(
            "DROP SCHEMA {} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};",
            backend_schema(&backend)
        ))
        .await
        .unwrap();
    }

    fn backend_schema(backend: &PostgresBackend) -> String {
        backend.builder().schema
    }

    #[test]
    fn urls_lose_their_schema_and_their_password() {
        assert_eq!(
            split_schema("postgres://u@h/db?schema=s1&sslmode=disable"),
            (
                "postgres://u@h/db?sslmode=disable".to_owned(),
                Some("s1".to_owned())
            )
        );
        assert_eq!(
            split_schema("postgres://u@h/db?schema=s1"),
            ("postgres://u@h/db".to_owned(), Some("s1".to_owned()))
        );
        assert_eq!(
            split_schema("postgres://u@h/db"),
            ("postgres://u@h/db".to_owned(), None)
        );
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn schema_names_are_identifiers() {
        for good in ["warden", "w_1", "_x", &"a".repeat(63)] {
            assert!(check_schema(good).is_ok(), "{good}");
        }
        for bad in ["", "1x", "a-b", "a;drop", "a b", &"a".repeat(64), "é"] {
            let message = check_schema(bad).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("postgres: cannot use schema `{bad}`")),
                "{message}"
            );
        }
    }
}
