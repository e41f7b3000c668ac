//! The SQLite store's schema, its migrations (tracked in `PRAGMA
//! user_version`), and how its connections are opened and configured.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::backend;
use crate::chain::Chain;
use crate::{OpenMode, StoreError};

/// Migrations in order; migration `i` (0-based) takes the schema from
/// version `i` to `i + 1`. Never edit one that has shipped: add another.
///
/// Notes on version 1:
/// - `STRICT` tables: SQLite enforces the column types, so a stray write
///   cannot put text where a number or a blob belongs.
/// - `runs.pk` is an internal integer key (`AUTOINCREMENT`, so a deleted
///   run's key is never reused); events and labels refer to it rather than
///   repeating the text id in every row.
/// - `events` is `WITHOUT ROWID` with primary key `(run_pk, seq)`: one run's
///   log is stored contiguously, so a load is one range scan.
/// - Labels live in `run_labels` (one row per label, indexed by key and
///   value), so a label filter is an index lookup, not a JSON scan.
/// - The list indexes end in `created_ms, id`, the listing order.
///
/// The claim columns keep the names they shipped with (`lease_owner`,
/// `lease_token`, `lease_expires_ms`, from before "lease" came to mean only
/// a sandbox invocation): renaming them would take a migration, and a
/// database this build wrote would no longer open in the one before it.
///
/// Version 2 adds run claims (owner, fencing token, expiry; see
/// `store/claim.rs`), a partial index over the runs a worker may claim, and
/// `tombstones`, what retention leaves of a pruned run.
///
/// Version 3 adds `commitments`: one row per idempotency key, its holder
/// (run id as text, so a commitment outlives its run's rows, pruned or not)
/// and, once settled, the result every later claimant gets. Rows are never
/// deleted.
///
/// Version 4 adds `runs_one_active_per_session`: a unique index over the
/// session of runs that are not in a terminal status, so a session holds at
/// most one active run (see `store/session.rs`) even if two processes
/// sharing the file race to start one.
///
/// Version 5 adds `runs.owes_deliveries` (how many deliveries the run owes,
/// written with every append; 0 for every run a v4 store held) and
/// `runs_owing`, a partial index over the runs that owe any, so a claim
/// finds a finished or parked run whose deliveries a dead worker left
/// without scanning the finished ones.
///
/// Version 6 adds `runs.wake_ms` (when a `waiting` run is due to be driven
/// again, written with every append; null for every other run and every run
/// a v5 store held) and `runs_waking`, a partial index over the waiting
/// runs by wake-up time, so a claim finds the due ones without a scan.
///
/// Version 7 adds `approval_rules`: standing approval rules (see
/// `store/rules.rs`), one row each, never deleted; a revocation fills
/// `revoked_by` and `revoked_ms` once.
///
/// Version 8 adds `history_chunks`: session history shared by the runs of a
/// session (see `store/history.rs`), one row per chunk keyed by its digest,
/// with the digest of the chunk before it; written with the create of the
/// first run that refers to it, never changed, deleted by a prune once no
/// run reaches it; and `runs.history_head`, the chunk a run's history ends
/// with (null for runs without one and every run a v7 store held).
///
/// Version 9 adds `export_cursors`: how many of each run's events a reader
/// outside the engine (the OpenTelemetry exporter) has taken, one row per
/// reader and run, only ever moved forward; the run by its text id, so a
/// cursor outlives nothing it needs.
///
/// Version 10 adds `sessions`: per session, how many runs were ever created
/// in it, how many completed and which completed last (see
/// `store/session.rs`), filled from the runs a v9 store holds, then kept by
/// two triggers on `runs` (a run inserted; a run's status set to
/// `completed`), so every write path keeps it in its own transaction and a
/// start reads one row instead of listing the session. A prune deletes no
/// row of it.
///
/// Version 11 adds `seal` to `approval_rules` and `commitments`: each row's
/// seal (see `store/sealed.rs`), written with the row and checked on every
/// read that acts on it. The rows a v10 store held are sealed as found, with
/// the store's chain, by [`migrate`] in the migration's transaction
/// ([`SEALED_FROM`]); SQL alone cannot compute a seal.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE runs (
    pk          INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL UNIQUE,
    agent       TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    session     TEXT,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    event_count INTEGER NOT NULL,
    head_hash   BLOB    NOT NULL
) STRICT;
CREATE INDEX runs_by_created ON runs (created_ms, id);
CREATE INDEX runs_by_status  ON runs (status, created_ms, id);
CREATE INDEX runs_by_agent   ON runs (agent, created_ms, id);
CREATE INDEX runs_by_session ON runs (session, created_ms, id) WHERE session IS NOT NULL;

CREATE TABLE run_labels (
    run_pk INTEGER NOT NULL REFERENCES runs (pk),
    key    TEXT    NOT NULL,
    value  TEXT    NOT NULL,
    PRIMARY KEY (run_pk, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX run_labels_by_pair ON run_labels (key, value, run_pk);

CREATE TABLE events (
    run_pk INTEGER NOT NULL REFERENCES runs (pk),
    seq    INTEGER NOT NULL,
    bytes  BLOB    NOT NULL,
    hash   BLOB    NOT NULL,
    PRIMARY KEY (run_pk, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE store_meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) STRICT, WITHOUT ROWID;
"#,
    r#"
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lease_expires_ms INTEGER;
CREATE INDEX runs_claimable ON runs (created_ms, id) WHERE status IN ('queued', 'running');

CREATE TABLE tombstones (
    id          TEXT    NOT NULL PRIMARY KEY,
    agent       TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    event_count INTEGER NOT NULL,
    head_hash   BLOB    NOT NULL,
    pruned_ms   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
"#,
    r#"
CREATE TABLE commitments (
    key     TEXT NOT NULL PRIMARY KEY,
    run_id  TEXT NOT NULL,
    call_id TEXT NOT NULL,
    result  BLOB
) STRICT, WITHOUT ROWID;
"#,
    r#"
CREATE UNIQUE INDEX runs_one_active_per_session ON runs (session)
    WHERE session IS NOT NULL
      AND status NOT IN ('completed', 'failed', 'cancelled', 'abandoned');
"#,
    r#"
ALTER TABLE runs ADD COLUMN owes_deliveries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_owing ON runs (created_ms, id) WHERE owes_deliveries > 0;
"#,
    r#"
ALTER TABLE runs ADD COLUMN wake_ms INTEGER;
CREATE INDEX runs_waking ON runs (wake_ms, created_ms, id) WHERE status = 'waiting';
"#,
    r#"
CREATE TABLE approval_rules (
    id         TEXT    NOT NULL PRIMARY KEY,
    spec       TEXT    NOT NULL,
    created_by TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    revoked_by TEXT,
    revoked_ms INTEGER
) STRICT, WITHOUT ROWID;
"#,
    r#"
CREATE TABLE history_chunks (
    digest   BLOB NOT NULL PRIMARY KEY,
    previous BLOB,
    body     BLOB NOT NULL
) STRICT, WITHOUT ROWID;
ALTER TABLE runs ADD COLUMN history_head BLOB;
"#,
    r#"
CREATE TABLE export_cursors (
    reader  TEXT    NOT NULL,
    run_id  TEXT    NOT NULL,
    through INTEGER NOT NULL,
    PRIMARY KEY (reader, run_id)
) STRICT, WITHOUT ROWID;
"#,
    r#"
CREATE TABLE sessions (
    session          TEXT    NOT NULL PRIMARY KEY,
    runs             INTEGER NOT NULL,
    completed        INTEGER NOT NULL,
    latest_completed TEXT
) STRICT, WITHOUT ROWID;
INSERT INTO sessions (session, runs, completed, latest_completed)
SELECT session, count(*), sum(status = 'completed'),
       (SELECT l.id FROM runs l WHERE l.session = r.session AND l.status = 'completed'
        ORDER BY l.created_ms DESC, l.id DESC LIMIT 1)
FROM runs r WHERE session IS NOT NULL GROUP BY session;
CREATE TRIGGER runs_session_created AFTER INSERT ON runs WHEN NEW.session IS NOT NULL
BEGIN
    INSERT INTO sessions (session, runs, completed, latest_completed)
    VALUES (NEW.session, 1, NEW.status = 'completed',
            CASE WHEN NEW.status = 'completed' THEN NEW.id END)
    ON CONFLICT (session) DO UPDATE SET
        runs = runs + 1,
        completed = completed + excluded.completed,
        latest_completed = coalesce(excluded.latest_completed, latest_completed);
END;
CREATE TRIGGER runs_session_completed AFTER UPDATE OF status ON runs
    WHEN NEW.session IS NOT NULL AND NEW.status = 'completed' AND OLD.status <> 'completed'
BEGIN
    UPDATE sessions SET completed = completed + 1, latest_completed = NEW.id
    WHERE session = NEW.session;
END;
"#,
    r#"
ALTER TABLE approval_rules ADD COLUMN seal BLOB;
ALTER TABLE commitments ADD COLUMN seal BLOB;
"#,
];

/// The schema version whose migration adds the seals: a store migrated
/// from below it has its existing rows sealed.
pub(super) const SEALED_FROM: i64 = 11;

/// The schema version this build writes and reads.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens the writer's connection: creates the file if needed, turns on WAL
/// (persistent in the file), `synchronous=FULL` (a commit returns after the
/// WAL is fsynced), foreign keys and the busy timeout.
pub(super) fn open_writer(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let context = || format!("sqlite: cannot open {}", path.display());
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| backend(context(), e))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| backend(context(), e))?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|e| backend(context(), e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        // Still durable with synchronous=FULL, but readers block the writer.
        tracing::warn!(path = %path.display(), %mode, "sqlite store could not switch to WAL");
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
        .map_err(|e| backend(context(), e))?;
    Ok(conn)
}

/// Opens a reader's connection on an existing store: query-only, with the
/// busy timeout.
pub(super) fn open_reader(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let context = || format!("sqlite: cannot open {} for reading", path.display());
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| backend(context(), e))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| backend(context(), e))?;
    conn.execute_batch("PRAGMA query_only = ON;")
        .map_err(|e| backend(context(), e))?;
    Ok(conn)
}

/// Refuses, before SQLite opens (and so creates) anything, a path that
/// cannot be a store in `mode`: an empty (0-byte) file always (Warden never
/// leaves one: it is a truncated or mistyped store, and SQLite would take it
/// for a new empty database), and unless the mode creates, a path with no
/// file.
pub(super) fn check_file(path: &Path, mode: OpenMode) -> Result<(), StoreError> {
    let no_store = |reason: String| StoreError::NoStore {
        location: format!("`{}`", path.display()),
        reason,
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(no_store("it is a directory".into())),
        // A fresh database's first commit can sit in the WAL alone.
        Ok(meta) if meta.len() == 0 && wal_len(path) == 0 => Err(no_store(
            "the file is empty (0 bytes); remove it to start a new store there".into(),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match mode {
            OpenMode::Create => Ok(()),
            OpenMode::Existing | OpenMode::ReadOnly => {
                Err(no_store("no such file; nothing was created".into()))
            }
        },
        Err(e) => Err(no_store(format!("cannot read it: {e}"))),
    }
}

/// The size of the store's write-ahead log, 0 when it has none.
fn wal_len(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

/// Refuses to write into a file SQLite reports as damaged: `PRAGMA
/// quick_check` reads every page once (it skips the slower index-content
/// checks of `integrity_check`), so opening for writing costs a scan of
/// the file.
pub(super) fn check_integrity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let findings: Vec<String> = conn
        .prepare("PRAGMA quick_check(5)")
        .and_then(|mut s| {
            s.query_map([], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .unwrap_or_else(|e| vec![e.to_string()]);
    if findings.len() == 1 && findings[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::Damaged {
        location: format!("`{}`", path.display()),
        detail: findings.join("; "),
    })
}

/// Opens a connection for a store opened read-only, and says whether it is
/// immutable. It never writes the database, so it works while another
/// process holds the write lock. Reading a WAL database needs its shared
/// index (`-shm`), which SQLite creates if missing: on a full disk or a
/// read-only mount it cannot, and then, provided no write-ahead log holds
/// transactions (no writer has the file open), the file is opened as
/// immutable, read as it is on disk with no locks.
pub(super) fn open_read_only(
    path: &Path,
    busy_timeout: Duration,
) -> Result<(Connection, bool), StoreError> {
    let plain = open_read_only_as(path, busy_timeout, false).and_then(|conn| {
        // The first read maps the index: this is where a full disk fails.
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
            .map_err(|e| backend(format!("sqlite: cannot read {}", path.display()), e))?;
        Ok(conn)
    });
    match plain {
        Ok(conn) => Ok((conn, false)),
        Err(error) if wal_len(path) == 0 => {
            tracing::debug!(path = %path.display(), %error, "reading the sqlite store as immutable");
            Ok((open_read_only_as(path, busy_timeout, true)?, true))
        }
        Err(error) => Err(error),
    }
}

/// Opens one read-only connection (see [`open_read_only`]).
pub(super) fn open_read_only_as(
    path: &Path,
    busy_timeout: Duration,
    immutable: bool,
) -> Result<Connection, StoreError> {
    let context = || format!("sqlite: cannot open {} read-only", path.display());
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = if immutable {
        Connection::open_with_flags(
            format!("file:{}?immutable=1", uri_path(path)),
            flags | OpenFlags::SQLITE_OPEN_URI,
        )
    } else {
        Connection::open_with_flags(path, flags)
    }
    .map_err(|e| backend(context(), e))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| backend(context(), e))?;
    Ok(conn)
}

/// `path` as the path of a `file:` URI: bytes outside the unreserved set
/// and `/` percent-encoded.
fn uri_path(path: &Path) -> String {
    use std::fmt::Write as _;
    let mut uri = String::new();
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            uri.push(b as char);
        } else {
            let _ = write!(uri, "%{b:02X}");
        }
    }
    uri
}

/// Checks, without writing, that the database holds this build's schema
/// and was chained in `chain_mode`: for a store opened read-only.
pub(super) fn check(conn: &Connection, path: &Path, chain_mode: &str) -> Result<(), StoreError> {
    let context = || format!("sqlite: cannot read the schema of {}", path.display());
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| backend(context(), e))?;
    let found = crate::recorded_schema_version(found)?;
    match found {
        0 => {
            return Err(StoreError::NoStore {
                location: format!("`{}`", path.display()),
                reason: "the file is a SQLite database without Warden's tables".into(),
            });
        }
        v if v < SCHEMA_VERSION => {
            return Err(StoreError::SchemaTooOld {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        v if v > SCHEMA_VERSION => {
            return Err(StoreError::SchemaTooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        _ => {}
    }
    let recorded: Option<String> = conn
        .query_row(
            "SELECT value FROM store_meta WHERE key = 'chain_mode'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| backend(context(), e))?;
    match recorded {
        Some(found) if found != chain_mode => Err(StoreError::ChainModeMismatch {
            found,
            configured: chain_mode.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Brings the schema up to [`SCHEMA_VERSION`] in one transaction, and records
/// the chain mode on first use (or checks it against the recorded one).
/// Refuses a database written by a newer schema, and unless `create`, one
/// without Warden's schema. A current store is only read: no write
/// transaction, so opening it does not wait for another process's writes.
pub(super) fn migrate(
    conn: &mut Connection,
    path: &Path,
    chain: &Chain,
    create: bool,
) -> Result<(), StoreError> {
    let chain_mode = chain.mode();
    let chain_mode = chain_mode.as_str();
    let context = || format!("sqlite: cannot migrate {}", path.display());
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| backend(context(), e))?;
    let found = crate::recorded_schema_version(found)?;
    if found == 0 && !create {
        return Err(StoreError::NoStore {
            location: format!("`{}`", path.display()),
            reason: "the file is a SQLite database without Warden's tables".into(),
        });
    }
    if found == SCHEMA_VERSION {
        let recorded: Option<String> = conn
            .query_row(
                "SELECT value FROM store_meta WHERE key = 'chain_mode'",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| backend(context(), e))?;
        if recorded.as_deref() == Some(chain_mode) {
            return Ok(());
        }
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| backend(context(), e))?;
    let found: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| backend(context(), e))?;
    let found = crate::recorded_schema_version(found)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql).map_err(|e| backend(context(), e))?;
        tracing::info!(path = %path.display(), version = from + 1, "applied store migration");
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(|e| backend(context(), e))?;
    let recorded: Option<String> = tx
        .query_row(
            "SELECT value FROM store_meta WHERE key = 'chain_mode'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| backend(context(), e))?;
    match recorded {
        None => {
            tx.execute(
                "INSERT INTO store_meta (key, value) VALUES ('chain_mode', ?1)",
                [chain_mode],
            )
            .map_err(|e| backend(context(), e))?;
        }
        Some(found) if found == chain_mode => {}
        Some(found) => {
            return Err(StoreError::ChainModeMismatch {
                found,
                configured: chain_mode.to_owned(),
            });
        }
    }
    // After the chain mode is known to be the store's: the seals are
    // computed with its chain.
    if found < SEALED_FROM {
        seal_existing(&tx, chain).map_err(|e| backend(context(), e))?;
    }
    tx.commit().map_err(|e| backend(context(), e))
}

/// Seals every rule and commitment as found, for a store migrated from
/// before seals existed (see `store/sealed.rs`): an edit made before the
/// upgrade is sealed with the rest, which docs/security.md states.
fn seal_existing(tx: &Connection, chain: &Chain) -> rusqlite::Result<()> {
    let rules = tx
        .prepare(
            "SELECT id, spec, created_by, created_ms, expires_ms, revoked_by, revoked_ms
             FROM approval_rules",
        )?
        .query_map([], |row| {
            let revoked_by: Option<String> = row.get(5)?;
            let revoked_ms: Option<i64> = row.get(6)?;
            Ok(crate::ApprovalRule {
                id: row.get(0)?,
                spec: row.get(1)?,
                created_by: row.get(2)?,
                created_ms: row.get(3)?,
                expires_ms: row.get(4)?,
                revoked: revoked_by.map(|by| crate::Revocation {
                    by,
                    at_ms: revoked_ms.unwrap_or_default(),
                }),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for rule in &rules {
        let seal = crate::sealed::rule(chain, rule);
        tx.execute(
            "UPDATE approval_rules SET seal = ?2 WHERE id = ?1",
            rusqlite::params![rule.id, seal.as_bytes().as_slice()],
        )?;
    }
    let commitments = tx
        .prepare("SELECT key, run_id, call_id, result FROM commitments")?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<Vec<u8>>>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (key, run_id, call_id, result) in &commitments {
        let seal = crate::sealed::commitment(chain, key, run_id, call_id, result.as_deref());
        tx.execute(
            "UPDATE commitments SET seal = ?2 WHERE key = ?1",
            rusqlite::params![key, seal.as_bytes().as_slice()],
        )?;
    }
    if !rules.is_empty() || !commitments.is_empty() {
        tracing::info!(
            rules = rules.len(),
            commitments = commitments.len(),
            "sealed the rules and commitments a store held before seals existed"
        );
    }
    Ok(())
}
