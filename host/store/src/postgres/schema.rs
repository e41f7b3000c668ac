//! The PostgreSQL store's schema and its migrations, tracked in
//! `store_meta` (`schema_version`) and applied under an advisory lock, so
//! many hosts starting at once migrate once.

use tokio_postgres::Transaction;

use super::pg_error;
use crate::StoreError;
use crate::chain::Chain;

/// Migrations in order; migration `i` (0-based) takes the schema from
/// version `i` to `i + 1`. Never edit one that has shipped: add another.
///
/// Notes on version 1 (the SQLite schema's ideas, with claims from the
/// start):
/// - `runs.pk` is an internal identity key; events and labels refer to it
///   and go with it (`ON DELETE CASCADE`, used only by retention).
/// - `events` has primary key `(run_pk, seq)`: a load is one index range
///   scan, and a second row at a seq is impossible.
/// - Labels live in `run_labels` (one row per label, indexed by key and
///   value), so a label filter is an index lookup.
/// - The list indexes end in `created_ms, id`, the listing order.
/// - The claim is three columns of `runs` (owner, fencing token, expiry;
///   named `lease_*`, as they shipped, like SQLite's):
///   an append locks the run row (`FOR UPDATE`) and checks the token and
///   the length in the same transaction. `runs_claimable` is a partial
///   index over the runs a claim may take.
/// - `tombstones`: what retention leaves of a pruned run.
///
/// Version 2 adds `commitments`: one row per idempotency key, its holder
/// (run id as text, so it outlives the run's rows) and, once settled, the
/// result later claimants get. Rows are never deleted, by pruning or
/// otherwise.
///
/// Version 3 adds `runs_one_active_per_session`: a unique index over the
/// session of runs not in a terminal status, so two hosts racing to start a
/// run in one session cannot both commit (see `store/session.rs`).
///
/// Version 4 adds `runs.owes_deliveries` (how many deliveries the run owes,
/// written with every append; 0 for every run an older store held) and
/// `runs_owing`, a partial index over the runs that owe any, which a claim
/// takes when their worker died. `IF NOT EXISTS` makes it safe to apply
/// over a schema that already has them.
///
/// Version 5 adds `runs.wake_ms` (when a `waiting` run is due to be driven
/// again, written with every append; null otherwise and for every run an
/// older store held) and `runs_waking`, a partial index over the waiting
/// runs by wake-up time, which a claim takes once due. `IF NOT EXISTS` as
/// above.
///
/// Version 6 adds `approval_rules`: standing approval rules (see
/// `store/rules.rs`), one row each, never deleted; a revocation fills
/// `revoked_by` and `revoked_ms` once (`UPDATE … WHERE revoked_by IS
/// NULL`, so two hosts revoking at once keep the first).
///
/// Version 7 adds `history_chunks`: session history shared by the runs of a
/// session (see `store/history.rs`), one row per chunk keyed by its digest,
/// with the digest of the chunk before it; written with the create of the
/// first run that refers to it (`ON CONFLICT DO NOTHING`: two hosts writing
/// one chunk write the same bytes), never changed, deleted by a prune once
/// no run reaches it; and `runs.history_head`, the chunk a run's history
/// ends with (null for runs without one and every run an older store held).
///
/// Version 8 adds `export_cursors`: how many of each run's events a reader
/// outside the engine (the OpenTelemetry exporter) has taken, one row per
/// reader and run, only ever moved forward (`ON CONFLICT … WHERE` the new
/// value is larger, so two hosts exporting at once never move it back).
///
/// Version 9 adds `sessions`: per session, how many runs were ever created
/// in it, how many completed and which completed last (see
/// `store/session.rs`), filled from the runs an older store holds, then
/// kept by two row triggers on `runs` (a run inserted; a run's status set
/// to `completed`), so every write path keeps it in its own transaction and
/// a start reads one row instead of listing the session. A prune deletes
/// no row of it. The trigger functions name `sessions` unqualified: every
/// connection's `search_path` is the store's schema.
///
/// Version 10 adds `seal` to `approval_rules` and `commitments`: each row's
/// seal (see `store/sealed.rs`), written with the row and checked on every
/// read that acts on it. The rows an older store held are sealed as found,
/// with the store's chain, by [`migrate`] in the migration's transaction
/// ([`SEALED_FROM`]); SQL alone cannot compute a seal.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE runs (
    pk               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               text   NOT NULL UNIQUE,
    agent            text   NOT NULL,
    status           text   NOT NULL,
    session          text,
    created_ms       bigint NOT NULL,
    updated_ms       bigint NOT NULL,
    event_count      bigint NOT NULL,
    head_hash        bytea  NOT NULL,
    lease_owner      text,
    lease_token      bigint NOT NULL DEFAULT 0,
    lease_expires_ms bigint
);
CREATE INDEX runs_by_created ON runs (created_ms, id);
CREATE INDEX runs_by_status  ON runs (status, created_ms, id);
CREATE INDEX runs_by_agent   ON runs (agent, created_ms, id);
CREATE INDEX runs_by_session ON runs (session, created_ms, id) WHERE session IS NOT NULL;
CREATE INDEX runs_claimable  ON runs (created_ms, id) WHERE status IN ('queued', 'running');

CREATE TABLE run_labels (
    run_pk bigint NOT NULL REFERENCES runs (pk) ON DELETE CASCADE,
    key    text   NOT NULL,
    value  text   NOT NULL,
    PRIMARY KEY (run_pk, key)
);
CREATE INDEX run_labels_by_pair ON run_labels (key, value, run_pk);

CREATE TABLE events (
    run_pk bigint NOT NULL REFERENCES runs (pk) ON DELETE CASCADE,
    seq    bigint NOT NULL,
    bytes  bytea  NOT NULL,
    hash   bytea  NOT NULL,
    PRIMARY KEY (run_pk, seq)
);

CREATE TABLE tombstones (
    id          text   NOT NULL PRIMARY KEY,
    agent       text   NOT NULL,
    status      text   NOT NULL,
    created_ms  bigint NOT NULL,
    updated_ms  bigint NOT NULL,
    event_count bigint NOT NULL,
    head_hash   bytea  NOT NULL,
    pruned_ms   bigint NOT NULL
);
"#,
    r#"
CREATE TABLE commitments (
    key     text  NOT NULL PRIMARY KEY,
    run_id  text  NOT NULL,
    call_id text  NOT NULL,
    result  bytea
);
"#,
    r#"
CREATE UNIQUE INDEX runs_one_active_per_session ON runs (session)
    WHERE session IS NOT NULL
      AND status NOT IN ('completed', 'failed', 'cancelled', 'abandoned');
"#,
    r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS owes_deliveries integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS runs_owing ON runs (created_ms, id) WHERE owes_deliveries > 0;
"#,
    r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS wake_ms bigint;
CREATE INDEX IF NOT EXISTS runs_waking ON runs (wake_ms, created_ms, id) WHERE status = 'waiting';
"#,
    r#"
CREATE TABLE IF NOT EXISTS approval_rules (
    id         text   NOT NULL PRIMARY KEY,
    spec       text   NOT NULL,
    created_by text   NOT NULL,
    created_ms bigint NOT NULL,
    expires_ms bigint,
    revoked_by text,
    revoked_ms bigint
);
"#,
    r#"
CREATE TABLE IF NOT EXISTS history_chunks (
    digest   bytea NOT NULL PRIMARY KEY,
    previous bytea,
    body     bytea NOT NULL
);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS history_head bytea;
"#,
    r#"
CREATE TABLE IF NOT EXISTS export_cursors (
    reader  text   NOT NULL,
    run_id  text   NOT NULL,
    through bigint NOT NULL,
    PRIMARY KEY (reader, run_id)
);
"#,
    r#"
CREATE TABLE IF NOT EXISTS sessions (
    session          text   NOT NULL PRIMARY KEY,
    runs             bigint NOT NULL,
    completed        bigint NOT NULL,
    latest_completed text
);
INSERT INTO sessions (session, runs, completed, latest_completed)
SELECT r.session, count(*), count(*) FILTER (WHERE r.status = 'completed'),
       (SELECT l.id FROM runs l WHERE l.session = r.session AND l.status = 'completed'
        ORDER BY l.created_ms DESC, l.id DESC LIMIT 1)
FROM runs r WHERE r.session IS NOT NULL GROUP BY r.session
ON CONFLICT (session) DO NOTHING;
CREATE OR REPLACE FUNCTION warden_session_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sessions AS s (session, runs, completed, latest_completed)
    VALUES (NEW.session, 1, CASE WHEN NEW.status = 'completed' THEN 1 ELSE 0 END,
            CASE WHEN NEW.status = 'completed' THEN NEW.id END)
    ON CONFLICT (session) DO UPDATE SET
        runs = s.runs + 1,
        completed = s.completed + EXCLUDED.completed,
        latest_completed = coalesce(EXCLUDED.latest_completed, s.latest_completed);
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION warden_session_completed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sessions SET completed = completed + 1, latest_completed = NEW.id
    WHERE session = NEW.session;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS runs_session_created ON runs;
CREATE TRIGGER runs_session_created AFTER INSERT ON runs FOR EACH ROW
    WHEN (NEW.session IS NOT NULL) EXECUTE FUNCTION warden_session_created();
DROP TRIGGER IF EXISTS runs_session_completed ON runs;
CREATE TRIGGER runs_session_completed AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.session IS NOT NULL AND NEW.status = 'completed' AND OLD.status <> 'completed')
    EXECUTE FUNCTION warden_session_completed();
"#,
    r#"
ALTER TABLE approval_rules ADD COLUMN IF NOT EXISTS seal bytea;
ALTER TABLE commitments ADD COLUMN IF NOT EXISTS seal bytea;
"#,
];

/// The schema version whose migration adds the seals: a store migrated
/// from below it has its existing rows sealed.
pub(super) const SEALED_FROM: i64 = 10;

/// The schema version this build writes and reads.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Refuses a schema that holds no Warden store (no `store_meta` table), so
/// a mistyped schema is never created by a command that does not start runs.
pub(super) async fn present(
    client: &deadpool_postgres::Object,
    schema: &str,
    target: &str,
) -> Result<(), StoreError> {
    let row = client
        .query_one(
            "SELECT to_regclass(format('%I.store_meta', $1::text)) IS NOT NULL",
            &[&schema],
        )
        .await
        .map_err(|e| pg_error(format!("postgres: cannot read schema {schema}"), e))?;
    if row.get::<_, bool>(0) {
        Ok(())
    } else {
        Err(StoreError::NoStore {
            location: format!("{target} (schema `{schema}`)"),
            reason: "the schema holds no Warden tables; nothing was created".into(),
        })
    }
}

/// Checks, without writing, that the schema is this build's and was chained
/// in `chain_mode`: for a store opened read-only.
pub(super) async fn check(
    client: &deadpool_postgres::Object,
    schema: &str,
    chain_mode: &str,
) -> Result<(), StoreError> {
    let context = || format!("postgres: cannot read schema {schema}");
    let rows = client
        .query(
            &format!("SELECT key, value FROM {schema}.store_meta WHERE key IN ('schema_version', 'chain_mode')"),
            &[],
        )
        .await
        .map_err(|e| pg_error(context(), e))?;
    let value = |key: &str| {
        rows.iter()
            .find(|r| r.get::<_, &str>(0) == key)
            .map(|r| r.get::<_, String>(1))
    };
    let found: i64 = match value("schema_version") {
        Some(v) => v.parse().map_err(|_| StoreError::Backend {
            context: context(),
            error: format!("schema_version is `{v}`, not a number").into(),
        })?,
        None => 0,
    };
    let found = crate::recorded_schema_version(found)?;
    if found < SCHEMA_VERSION {
        return Err(StoreError::SchemaTooOld {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    match value("chain_mode") {
        Some(found) if found != chain_mode => Err(StoreError::ChainModeMismatch {
            found,
            configured: chain_mode.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Creates the schema if needed, brings it up to [`SCHEMA_VERSION`] in the
/// caller's transaction, and records the chain mode on first use (or checks
/// it against the recorded one). Refuses a database written by a newer
/// schema. Returns the migrations applied.
pub(super) async fn migrate(
    tx: &Transaction<'_>,
    schema: &str,
    chain: &Chain,
) -> Result<Vec<i64>, StoreError> {
    let chain_mode = chain.mode();
    let chain_mode = chain_mode.as_str();
    let context = || format!("postgres: cannot migrate schema {schema}");
    // One migrator per schema at a time, across hosts.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('warden.migrate.' || $1))",
        &[&schema],
    )
    .await
    .map_err(|e| pg_error(context(), e))?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.store_meta (key text PRIMARY KEY, value text NOT NULL);"
    ))
    .await
    .map_err(|e| pg_error(context(), e))?;
    let meta = |key: &'static str| async move {
        tx.query_opt(
            &format!("SELECT value FROM {schema}.store_meta WHERE key = $1"),
            &[&key],
        )
        .await
        .map(|row| row.map(|r| r.get::<_, String>(0)))
    };
    let found: i64 = match meta("schema_version").await {
        Ok(Some(v)) => v.parse().map_err(|_| StoreError::Backend {
            context: context(),
            error: format!("schema_version is `{v}`, not a number").into(),
        })?,
        Ok(None) => 0,
        Err(e) => return Err(pg_error(context(), e)),
    };
    let found = crate::recorded_schema_version(found)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let mut applied = Vec::new();
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(&format!("SET LOCAL search_path TO {schema}; {sql}"))
            .await
            .map_err(|e| pg_error(context(), e))?;
        applied.push(from as i64 + 1);
        tracing::info!(schema, version = from + 1, "applied store migration");
    }
    let set = format!(
        "INSERT INTO {schema}.store_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
    );
    tx.execute(&set, &[&"schema_version", &SCHEMA_VERSION.to_string()])
        .await
        .map_err(|e| pg_error(context(), e))?;
    match meta("chain_mode")
        .await
        .map_err(|e| pg_error(context(), e))?
    {
        None => {
            tx.execute(&set, &[&"chain_mode", &chain_mode])
                .await
                .map_err(|e| pg_error(context(), e))?;
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
        seal_existing(tx, schema, chain)
            .await
            .map_err(|e| pg_error(context(), e))?;
    }
    Ok(applied)
}

/// Seals every rule and commitment as found, for a store migrated from
/// before seals existed (see `store/sealed.rs`): an edit made before the
/// upgrade is sealed with the rest, which docs/security.md states.
async fn seal_existing(
    tx: &Transaction<'_>,
    schema: &str,
    chain: &Chain,
) -> Result<(), tokio_postgres::Error> {
    let rules = tx
        .query(
            &format!(
                "SELECT id, spec, created_by, created_ms, expires_ms, revoked_by, revoked_ms
                 FROM {schema}.approval_rules"
            ),
            &[],
        )
        .await?;
    for row in &rules {
        let revoked_by: Option<String> = row.get(5);
        let revoked_ms: Option<i64> = row.get(6);
        let rule = crate::ApprovalRule {
            id: row.get(0),
            spec: row.get(1),
            created_by: row.get(2),
            created_ms: row.get(3),
            expires_ms: row.get(4),
            revoked: revoked_by.map(|by| crate::Revocation {
                by,
                at_ms: revoked_ms.unwrap_or_default(),
            }),
        };
        let seal = crate::sealed::rule(chain, &rule);
        tx.execute(
            &format!("UPDATE {schema}.approval_rules SET seal = $2 WHERE id = $1"),
            &[&rule.id, &seal.as_bytes().as_slice()],
        )
        .await?;
    }
    let commitments = tx
        .query(
            &format!("SELECT key, run_id, call_id, result FROM {schema}.commitments"),
            &[],
        )
        .await?;
    for row in &commitments {
        let (key, run_id, call_id): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        let result: Option<Vec<u8>> = row.get(3);
        let seal = crate::sealed::commitment(chain, &key, &run_id, &call_id, result.as_deref());
        tx.execute(
            &format!("UPDATE {schema}.commitments SET seal = $2 WHERE key = $1"),
            &[&key, &seal.as_bytes().as_slice()],
        )
        .await?;
    }
    if !rules.is_empty() || !commitments.is_empty() {
        tracing::info!(
            schema,
            rules = rules.len(),
            commitments = commitments.len(),
            "sealed the rules and commitments a store held before seals existed"
        );
    }
    Ok(())
}
