//! Tests of what only the SQLite store has: group commit, schema versioning
//! and chain-mode checks on open, pragmas and indexes, and damage done to
//! the database file itself. Behaviour shared with every store is in the
//! conformance suite (`testing/suite.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::conformance::SqliteBackend;
use crate::testing::suite::{ev, id, meta, new_run};

fn backend_store() -> (SqliteBackend, Arc<SqliteStore>) {
    let backend = SqliteBackend::new();
    let store = Arc::new(SqliteStore::open(backend.path()).unwrap());
    (backend, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_commits_a_burst_and_a_conflict_fails_alone() {
    let (backend, store) = backend_store();
    const RUNS: u64 = 100;
    for i in 0..RUNS {
        new_run(&*store, &id(&format!("g-{i}")), 1).await;
    }
    let before = store.stats();

    // Hold the database's write lock from outside, so the writer blocks on
    // its first request while every other request queues behind it.
    let mut blocker = backend.raw();
    let lock = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..RUNS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let run = id(&format!("g-{i}"));
            // Every tenth request expects a stale length and must conflict.
            let expected = if i % 10 == 0 { 7 } else { 1 };
            store
                .append(
                    &run,
                    expected,
                    &[ev("step")],
                    ListingStatus::RUNNING.into(),
                    2,
                )
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.commit().unwrap();

    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(appended) => {
                assert_ne!(i % 10, 0);
                assert_eq!(appended.event_count, 2);
            }
            Err(StoreError::Conflict {
                expected, actual, ..
            }) => {
                assert_eq!(i % 10, 0);
                assert_eq!((expected, actual), (7, 1));
            }
            Err(other) => panic!("request {i}: {other:?}"),
        }
    }
    let after = store.stats();
    assert_eq!(after.requests - before.requests, RUNS);
    assert_eq!(after.events - before.events, RUNS);
    // The first request's transaction, then everything queued behind it.
    let transactions = after.transactions - before.transactions;
    assert!(
        transactions <= 3,
        "{RUNS} appends took {transactions} transactions"
    );
    for i in 0..RUNS {
        let log = store.load(&id(&format!("g-{i}"))).await.unwrap();
        assert_eq!(log.len(), if i % 10 == 0 { 1 } else { 2 }, "run g-{i}");
    }
}

/// With a bounded lock wait (the default waits as long as it takes: see
/// `an_append_waits_out_a_write_lock_held_past_the_busy_timeout`).
#[tokio::test]
async fn a_locked_database_fails_the_append_and_writes_nothing() {
    let backend = SqliteBackend::new();
    let store = SqliteStore::builder(backend.path())
        .busy_timeout(Duration::from_millis(100))
        .lock_wait(Some(Duration::ZERO))
        .open()
        .unwrap();
    let run = id("locked");
    new_run(&store, &run, 2).await;
    let mut blocker = backend.raw();
    let lock = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let err = store
        .append(&run, 2, &[ev("x")], ListingStatus::COMPLETED.into(), 9)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("locked") || message.contains("busy"),
        "{message}"
    );
    assert_eq!(store.stats().failed_commits, 1);
    drop(lock);
    assert_eq!(store.load(&run).await.unwrap().len(), 2);
    // The writer keeps serving after a failed transaction.
    store
        .append(&run, 2, &[ev("x")], ListingStatus::COMPLETED.into(), 9)
        .await
        .unwrap();
    assert_eq!(store.summary(&run).await.unwrap().status, "completed");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let backend = SqliteBackend::new();
    drop(SqliteStore::open(backend.path()).unwrap());
    backend
        .raw()
        .pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
        .unwrap();
    let err = SqliteStore::open(backend.path()).unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, supported }
            if found == schema::SCHEMA_VERSION + 1 && supported == schema::SCHEMA_VERSION),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_negative_schema_version_is_damage_not_a_newer_store() {
    let backend = SqliteBackend::new();
    drop(SqliteStore::open(backend.path()).unwrap());
    backend
        .raw()
        .pragma_update(None, "user_version", -3)
        .unwrap();
    for err in [
        SqliteStore::open(backend.path()).unwrap_err(),
        SqliteStore::builder(backend.path())
            .mode(crate::OpenMode::ReadOnly)
            .open()
            .unwrap_err(),
    ] {
        assert!(
            matches!(err, StoreError::SchemaInvalid { found: -3 }),
            "{err:?}"
        );
        assert_eq!(err.code(), "store_damaged");
        assert!(err.to_string().contains("restore a backup"), "{err}");
    }
}

#[tokio::test]
async fn reopening_migrates_nothing_twice_and_keeps_the_version() {
    let backend = SqliteBackend::new();
    drop(SqliteStore::open(backend.path()).unwrap());
    drop(SqliteStore::open(backend.path()).unwrap());
    let conn = backend.raw();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    // Every table is STRICT: SQLite itself refuses a wrongly typed value.
    let loose: i64 = conn
        .query_row(
            "SELECT count(*) FROM pragma_table_list WHERE schema = 'main'
             AND name IN ('runs', 'events', 'run_labels', 'store_meta') AND strict = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(loose, 0);
}

/// A version 5 file (before `wake_ms`) is migrated to 6 on open: its runs
/// are kept, intact and waking at no time, and a waiting run written after
/// the migration is claimed once due.
#[tokio::test]
async fn a_version_5_store_migrates_and_its_runs_wake_at_no_time() {
    let backend = SqliteBackend::new();
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        new_run(&store, &id("old"), 3).await;
    }
    backend
        .raw()
        .execute_batch(
            "DROP TRIGGER runs_session_created; DROP TRIGGER runs_session_completed; DROP TABLE sessions;
             ALTER TABLE commitments DROP COLUMN seal;
             DROP TABLE export_cursors; DROP TABLE history_chunks;
             ALTER TABLE runs DROP COLUMN history_head;
             DROP TABLE approval_rules;
             DROP INDEX runs_waking;
             ALTER TABLE runs DROP COLUMN wake_ms;
             PRAGMA user_version = 5;",
        )
        .unwrap();
    let store = SqliteStore::open(backend.path()).unwrap();
    let version: i64 = backend
        .raw()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    let summary = store.summary(&id("old")).await.unwrap();
    assert_eq!((summary.event_count, summary.wake_ms), (3, None));
    assert!(store.verify(&id("old")).await.unwrap().is_intact());
    store
        .append(
            &id("old"),
            3,
            &[ev("park")],
            Listing::new(ListingStatus::WAITING).waking_at(Some(500)),
            9,
        )
        .await
        .unwrap();
    assert_eq!(store.summary(&id("old")).await.unwrap().wake_ms, Some(500));
    assert!(store.claim("w", 499, 1000, 10).await.unwrap().is_empty());
    let claimed = store.claim("w", 500, 1000, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
}

/// A version 9 file (before `sessions`) is migrated on open: the counts of
/// its sessions are filled from the runs it holds (the latest completed run
/// by creation), and kept from there on.
#[tokio::test]
async fn a_version_9_store_migrates_and_counts_its_sessions() {
    let backend = SqliteBackend::new();
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        for (run, created, status) in [
            ("one", 1, ListingStatus::COMPLETED),
            ("two", 2, ListingStatus::FAILED),
            ("three", 3, ListingStatus::COMPLETED),
            ("four", 4, ListingStatus::RUNNING),
        ] {
            let mut m = meta("agent", created);
            m.session = Some("chat".into());
            store
                .create(&id(run), m, ev("start"), ListingStatus::RUNNING)
                .await
                .unwrap();
            if status != ListingStatus::RUNNING {
                store
                    .append(&id(run), 1, &[ev("end")], status.into(), created)
                    .await
                    .unwrap();
            }
        }
    }
    backend
        .raw()
        .execute_batch(
            "DROP TRIGGER runs_session_created; DROP TRIGGER runs_session_completed;
             DROP TABLE sessions; PRAGMA user_version = 9;
             ALTER TABLE commitments DROP COLUMN seal; ALTER TABLE approval_rules DROP COLUMN seal;",
        )
        .unwrap();
    let store = SqliteStore::open(backend.path()).unwrap();
    let head = store.session_head("chat").await.unwrap();
    assert_eq!((head.runs, head.completed), (4, 2));
    assert_eq!(head.latest_completed, Some(id("three")));
    assert_eq!(head.active, Some((id("four"), "running".to_owned())));
    store
        .append(
            &id("four"),
            1,
            &[ev("end")],
            ListingStatus::COMPLETED.into(),
            5,
        )
        .await
        .unwrap();
    let head = store.session_head("chat").await.unwrap();
    assert_eq!(
        (head.completed, head.latest_completed),
        (3, Some(id("four")))
    );
    assert_eq!(head.active, None);
}

/// A version 7 file (before `history_chunks`) is migrated on open: its
/// runs are kept and intact, and a create can write history chunks.
#[tokio::test]
async fn a_version_7_store_migrates_and_takes_history_chunks() {
    let backend = SqliteBackend::new();
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        new_run(&store, &id("old"), 3).await;
    }
    backend
        .raw()
        .execute_batch(
            "DROP TRIGGER runs_session_created; DROP TRIGGER runs_session_completed; DROP TABLE sessions;
             ALTER TABLE commitments DROP COLUMN seal; ALTER TABLE approval_rules DROP COLUMN seal;
             DROP TABLE export_cursors; DROP TABLE history_chunks; ALTER TABLE runs DROP COLUMN history_head; PRAGMA user_version = 7;",
        )
        .unwrap();
    let store = SqliteStore::open(backend.path()).unwrap();
    let version: i64 = backend
        .raw()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    assert!(store.verify(&id("old")).await.unwrap().is_intact());
    let chunk = crate::HistoryChunk::new(None, bytes::Bytes::from_static(b"turn"));
    let mut m = crate::testing::suite::meta("agent", 1);
    m.history = vec![chunk.clone()];
    store
        .create(&id("new"), m, "start".into(), crate::ListingStatus::RUNNING)
        .await
        .unwrap();
    assert_eq!(store.load_history(chunk.digest()).await.unwrap(), [chunk]);
}

/// A version 6 file (before `approval_rules`) is migrated to the current
/// version on open: its runs are kept, it has no rules, and rules can be
/// added.
#[tokio::test]
async fn a_version_6_store_migrates_and_holds_no_rules() {
    let backend = SqliteBackend::new();
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        new_run(&store, &id("old"), 3).await;
    }
    backend
        .raw()
        .execute_batch(
            "DROP TRIGGER runs_session_created; DROP TRIGGER runs_session_completed; DROP TABLE sessions;
             ALTER TABLE commitments DROP COLUMN seal;
             DROP TABLE export_cursors; DROP TABLE history_chunks; ALTER TABLE runs DROP COLUMN history_head;
             DROP TABLE approval_rules; PRAGMA user_version = 6;",
        )
        .unwrap();
    let store = SqliteStore::open(backend.path()).unwrap();
    let version: i64 = backend
        .raw()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    assert!(store.verify(&id("old")).await.unwrap().is_intact());
    assert_eq!(store.rules().await.unwrap(), []);
    let rule = crate::ApprovalRule {
        id: "rule-1".into(),
        spec: "{}".into(),
        created_by: "ops".into(),
        created_ms: 1,
        expires_ms: None,
        revoked: None,
    };
    store.add_rule(&rule).await.unwrap();
    assert_eq!(store.rules().await.unwrap(), [rule]);
}

/// A version 4 file (before `owes_deliveries`) is migrated to the current
/// version on open: its runs are kept, intact and owing nothing, and take
/// the new columns.
#[tokio::test]
async fn a_version_4_store_migrates_and_its_runs_owe_nothing() {
    let backend = SqliteBackend::new();
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        new_run(&store, &id("old"), 3).await;
    }
    // What version 4 looked like.
    backend
        .raw()
        .execute_batch(
            "DROP TRIGGER runs_session_created; DROP TRIGGER runs_session_completed; DROP TABLE sessions;
             ALTER TABLE commitments DROP COLUMN seal;
             DROP TABLE export_cursors; DROP TABLE history_chunks;
             ALTER TABLE runs DROP COLUMN history_head;
             DROP TABLE approval_rules;
             DROP INDEX runs_waking;
             ALTER TABLE runs DROP COLUMN wake_ms;
             DROP INDEX runs_owing;
             ALTER TABLE runs DROP COLUMN owes_deliveries;
             PRAGMA user_version = 4;",
        )
        .unwrap();
    let store = SqliteStore::open(backend.path()).unwrap();
    let version: i64 = backend
        .raw()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    assert_eq!(schema::SCHEMA_VERSION, 11);
    let summary = store.summary(&id("old")).await.unwrap();
    assert_eq!((summary.event_count, summary.owes_deliveries), (3, 0));
    assert!(store.verify(&id("old")).await.unwrap().is_intact());
    store
        .append(
            &id("old"),
            3,
            &[ev("end")],
            Listing::new(ListingStatus::COMPLETED).owing(1),
            9,
        )
        .await
        .unwrap();
    assert_eq!(store.summary(&id("old")).await.unwrap().owes_deliveries, 1);
    let indexed: i64 = backend
        .raw()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'runs_owing'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexed, 1);
}

#[tokio::test]
async fn another_chain_mode_is_refused() {
    let backend = SqliteBackend::new();
    let key = ChainKey::new(&[7; 32]).unwrap();
    drop(SqliteStore::open(backend.path()).unwrap());
    let err = SqliteStore::builder(backend.path())
        .chain_key(key.clone())
        .open()
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::ChainModeMismatch { found, configured }
            if found == "sha256" && *configured == format!("hmac-sha256:{}", key.id())),
        "{err:?}"
    );

    let keyed = SqliteBackend::new();
    drop(
        SqliteStore::builder(keyed.path())
            .chain_key(key.clone())
            .open()
            .unwrap(),
    );
    let other = ChainKey::new(&[8; 32]).unwrap();
    let err = SqliteStore::builder(keyed.path())
        .chain_key(other)
        .open()
        .unwrap_err();
    assert!(
        matches!(err, StoreError::ChainModeMismatch { .. }),
        "{err:?}"
    );
    assert!(SqliteStore::open(keyed.path()).is_err());
    SqliteStore::builder(keyed.path())
        .chain_key(key)
        .open()
        .unwrap();
}

#[tokio::test]
async fn files_that_are_not_stores_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let err = SqliteStore::open(&garbage).unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("garbage.db"), "{err}");

    let nowhere = dir.path().join("no/such/dir/runs.db");
    let err = SqliteStore::open(&nowhere).unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
}

#[tokio::test]
async fn a_hash_of_the_wrong_length_is_reported_unreadable() {
    let (backend, store) = backend_store();
    let run = id("short-hash");
    new_run(&*store, &run, 3).await;
    let conn = backend.raw();
    let pk = SqliteBackend::pk(&conn, &run);
    conn.execute(
        "UPDATE events SET hash = x'010203' WHERE run_pk = ?1 AND seq = 2",
        [pk],
    )
    .unwrap();
    match store.load(&run).await.unwrap_err() {
        StoreError::Tampered {
            seq: 2,
            reason: ChainBreak::Unreadable { detail },
            ..
        } => assert_eq!(detail, "hash is 3 bytes, expected 32"),
        other => panic!("{other:?}"),
    }
    let report = store.verify(&run).await.unwrap();
    assert_eq!(report.findings[0].seq, 2);
}

/// Finds `marker` in the database file and flips one byte of it.
fn flip_byte_in_file(path: &std::path::Path, marker: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("marker is in the database file");
    bytes[at + marker.len() - 1] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn bytes_corrupted_in_the_file_are_caught_by_the_chain() {
    let backend = SqliteBackend::new();
    let victim = id("victim");
    let bystander = id("bystander");
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        new_run(&store, &bystander, 3).await;
        store
            .create(&victim, meta("a", 1), ev("start"), ListingStatus::RUNNING)
            .await
            .unwrap();
        store
            .append(
                &victim,
                1,
                &[ev("MARKER-0123456789-payload")],
                ListingStatus::RUNNING.into(),
                2,
            )
            .await
            .unwrap();
    }
    // Move everything from the WAL into the main file, then corrupt it there.
    backend
        .raw()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    flip_byte_in_file(&backend.path(), b"MARKER-0123456789-payload");

    let store = SqliteStore::open(backend.path()).unwrap();
    match store.load(&victim).await.unwrap_err() {
        StoreError::Tampered {
            seq: 2,
            reason: ChainBreak::HashMismatch,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(store.load(&bystander).await.unwrap().len(), 3);
    assert_eq!(store.list(&RunFilter::new()).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_corrupt_page_is_an_error_not_a_panic() {
    let backend = SqliteBackend::new();
    let runs: Vec<RunId> = (0..20).map(|i| id(&format!("p-{i}"))).collect();
    {
        let store = SqliteStore::open(backend.path()).unwrap();
        for run in &runs {
            new_run(&store, run, 30).await;
        }
    }
    backend
        .raw()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    // Overwrite the whole page holding run p-5's events with garbage.
    let mut bytes = std::fs::read(backend.path()).unwrap();
    let page = 4096;
    let at = bytes
        .windows(6)
        .position(|w| w == b"p-5:20")
        .expect("event bytes are in the file");
    let first = at / page * page;
    assert!(first > 0, "the events are not on the header page");
    bytes[first..first + page].fill(0xa5);
    std::fs::write(backend.path(), bytes).unwrap();

    // Not opened for writing: nothing is written into a damaged file.
    for mode in [OpenMode::Create, OpenMode::Existing] {
        match SqliteStore::builder(backend.path()).mode(mode).open() {
            Err(StoreError::Damaged { location, .. }) => {
                assert!(location.contains("runs.db"), "{location}")
            }
            other => panic!("{mode:?}: expected Damaged, got {other:?}"),
        }
    }
    // Read-only, what is left is read and verified, run by run.
    let store = SqliteStore::builder(backend.path())
        .mode(OpenMode::ReadOnly)
        .open()
        .unwrap();
    let err = store.load(&runs[5]).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains("p-5"), "{err}");
    // Every other operation answers (the damage may reach neighbours on the
    // same page, but never as a panic or as silently wrong events).
    for run in &runs {
        match store.load(run).await {
            Ok(log) => assert_eq!(log.len(), 30),
            Err(StoreError::Backend { .. } | StoreError::Tampered { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(store.list(&RunFilter::new()).await.unwrap().len(), 20);
}

#[test]
fn list_filters_are_backed_by_indexes() {
    let backend = SqliteBackend::new();
    drop(SqliteStore::open(backend.path()).unwrap());
    let conn = backend.raw();
    let plan = |filter: RunFilter| {
        let (sql, values) = list_query(&filter);
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values), |r| {
                r.get::<_, String>(3)
            })
            .unwrap();
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .unwrap()
            .join("; ")
    };
    let cases = [
        (RunFilter::new().status("running"), "runs_by_status"),
        (RunFilter::new().agent("a"), "runs_by_agent"),
        (RunFilter::new().session("s"), "runs_by_session"),
        (RunFilter::new().created_since(5), "runs_by_created"),
        (RunFilter::new().label("team", "red"), "run_labels_by_pair"),
    ];
    for (filter, index) in cases {
        let plan = plan(filter.clone());
        assert!(plan.contains(index), "{filter:?}: {plan}");
        assert!(!plan.contains("SCAN runs"), "{filter:?} scans runs: {plan}");
    }
    // A page newest first, from the start or after a run, is the creation
    // index read backwards from a point: no scan of the table, no sort.
    let page = RunFilter::new().newest_first().limit(50);
    let after = crate::RunPosition {
        created_ms: 5,
        run_id: id("r-5"),
    };
    for (filter, read) in [
        (page.clone(), "SCAN runs USING INDEX runs_by_created"),
        (
            page.clone().after(after),
            "SEARCH runs USING INDEX runs_by_created ((created_ms,id)<(?,?))",
        ),
    ] {
        let plan = plan(filter.clone());
        assert!(plan.contains(read), "{filter:?}: {plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{filter:?} sorts: {plan}");
    }
    let plan = plan(RunFilter::new().id_prefix("r-12"));
    assert!(plan.contains("SEARCH runs USING INDEX"), "{plan}");
    assert!(plan.contains("(id>? AND id<?)"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_share_a_bounded_set_of_connections() {
    let backend = SqliteBackend::new();
    let store = Arc::new(
        SqliteStore::builder(backend.path())
            .max_readers(2)
            .open()
            .unwrap(),
    );
    let run = id("read-me");
    new_run(&*store, &run, 20).await;
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (store, run) = (Arc::clone(&store), run.clone());
            tokio::spawn(async move { store.load(&run).await.unwrap().len() })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), 20);
    }
    assert_eq!(store.read_turns.available_permits(), 2);
    let idle = store.readers.idle.lock().unwrap().len();
    assert!((1..=2).contains(&idle), "{idle} idle reader connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_failing_midway_is_undone_alone_within_its_batch() {
    let (backend, store) = backend_store();
    let (good, bad) = (id("good"), id("bad"));
    new_run(&*store, &good, 1).await;
    new_run(&*store, &bad, 1).await;
    // A trigger refuses one particular event, after the request's first
    // event was already inserted: only its savepoint can undo that insert.
    let mut blocker = backend.raw();
    blocker
        .execute_batch(
            "CREATE TRIGGER refuse_boom BEFORE INSERT ON events
             WHEN NEW.bytes = CAST('boom' AS BLOB)
             BEGIN SELECT RAISE(ABORT, 'boom refused'); END;",
        )
        .unwrap();
    let lock = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let first = {
        let store = Arc::clone(&store);
        let run = good.clone();
        tokio::spawn(async move {
            store
                .append(&run, 1, &[ev("g2")], ListingStatus::RUNNING.into(), 2)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let doomed = {
        let store = Arc::clone(&store);
        let run = bad.clone();
        tokio::spawn(async move {
            let events = [ev("fine"), ev("boom")];
            store
                .append(&run, 1, &events, ListingStatus::COMPLETED.into(), 2)
                .await
        })
    };
    let second = {
        let store = Arc::clone(&store);
        let run = good.clone();
        tokio::spawn(async move {
            store
                .append(&run, 2, &[ev("g3")], ListingStatus::COMPLETED.into(), 3)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = store.stats();
    lock.commit().unwrap();

    first.await.unwrap().unwrap();
    let err = doomed.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("boom refused"), "{err}");
    assert_eq!(second.await.unwrap().unwrap().event_count, 3);
    // Both writes after the blocked one went through one transaction.
    assert_eq!(store.stats().transactions - before.transactions, 2);

    assert_eq!(store.load(&good).await.unwrap().len(), 3);
    let log = store.load(&bad).await.unwrap();
    assert_eq!(log.len(), 1, "the request's first event was not undone");
    let summary = store.summary(&bad).await.unwrap();
    assert_eq!(
        (summary.status.as_str(), summary.event_count),
        ("running", 1)
    );
    assert!(store.verify(&bad).await.unwrap().is_intact());
    // And the run takes its next append normally.
    store
        .append(&bad, 1, &[ev("fine")], ListingStatus::RUNNING.into(), 4)
        .await
        .unwrap();
}

/// Every write commits on the writer's connection with `synchronous=FULL`
/// in WAL mode: read back from that connection itself, since a kill test
/// cannot tell FULL from NORMAL (a killed process leaves the page cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_commits_with_synchronous_full_in_wal_mode() {
    let (_backend, store) = backend_store();
    new_run(&*store, &id("r"), 1).await;
    assert_eq!(store.writer_pragma("synchronous").await.unwrap(), "2");
    assert_eq!(store.writer_pragma("journal_mode").await.unwrap(), "wal");
    assert!(store.writer_pragma("cache_size").await.is_err());
}

/// A deferred append commits without an fsync (`synchronous=NORMAL`, one
/// deferred transaction each) and is visible at once; the writer is back
/// on FULL for every other write (the pragma read is one), a synced append
/// is counted as synced, and a reopened store (a new process) has every
/// event, the deferred ones included: a killed process loses none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_append_commits_without_a_sync_and_the_next_write_syncs() {
    let (backend, store) = backend_store();
    let run = id("lazy");
    new_run(&*store, &run, 1).await;
    let before = store.stats();
    for n in 1..=3 {
        store
            .append(
                &run,
                n,
                &[ev(&format!("deferred-{n}"))],
                Listing::new(ListingStatus::RUNNING).deferred(),
                2,
            )
            .await
            .unwrap();
        assert_eq!(store.load(&run).await.unwrap().len() as u64, n + 1);
    }
    let after = store.stats();
    assert_eq!(after.transactions - before.transactions, 3);
    assert_eq!(
        after.deferred_transactions - before.deferred_transactions,
        3
    );
    assert_eq!(store.writer_pragma("synchronous").await.unwrap(), "2");
    store
        .append(&run, 4, &[ev("synced")], ListingStatus::RUNNING.into(), 3)
        .await
        .unwrap();
    let synced = store.stats();
    assert_eq!(synced.deferred_transactions, after.deferred_transactions);
    assert!(synced.transactions > after.transactions);
    drop(store);
    let reopened = SqliteStore::open(backend.path()).unwrap();
    assert_eq!(reopened.load(&run).await.unwrap().len(), 5);
}

/// The bytes of the database, and whether its WAL holds any, to show
/// nothing was written (a reader may leave an empty WAL file behind).
fn files(path: &std::path::Path) -> (Vec<u8>, bool) {
    let wal = std::fs::metadata(format!("{}-wal", path.display())).map_or(0, |m| m.len());
    (std::fs::read(path).unwrap(), wal > 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_open_writes_nothing_and_refuses_writes() {
    let (backend, store) = backend_store();
    new_run(&*store, &id("r"), 3).await;
    drop(store);
    // Everything committed is in the database file itself from here on.
    backend
        .raw()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let before = files(&backend.path());
    assert!(!before.1);

    let read_only = SqliteStore::builder(backend.path())
        .mode(OpenMode::ReadOnly)
        .open()
        .unwrap();
    assert_eq!(read_only.load(&id("r")).await.unwrap().len(), 3);
    assert!(read_only.verify(&id("r")).await.unwrap().is_intact());
    assert_eq!(read_only.list(&RunFilter::new()).await.unwrap().len(), 1);
    match read_only
        .append(&id("r"), 3, &[ev("x")], ListingStatus::RUNNING.into(), 9)
        .await
    {
        Err(StoreError::ReadOnly { location, .. }) => {
            assert_eq!(location, backend.path().display().to_string())
        }
        other => panic!("expected ReadOnly, got {other:?}"),
    }
    assert!(matches!(
        read_only.acquire_claim(&id("r"), "w", 0, 10).await,
        Err(StoreError::ReadOnly { .. })
    ));
    drop(read_only);
    assert_eq!(files(&backend.path()), before, "a read-only open wrote");

    // An older schema is not migrated by a read-only open: refused.
    backend
        .raw()
        .pragma_update(None, "user_version", 4)
        .unwrap();
    let before = files(&backend.path());
    match SqliteStore::builder(backend.path())
        .mode(OpenMode::ReadOnly)
        .open()
    {
        Err(StoreError::SchemaTooOld { found, supported }) => {
            assert_eq!((found, supported), (4, schema::SCHEMA_VERSION))
        }
        other => panic!("expected SchemaTooOld, got {other:?}"),
    }
    assert_eq!(files(&backend.path()), before);
}

#[test]
fn only_a_creating_open_creates_and_none_takes_an_empty_file_for_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo.db");
    for mode in [OpenMode::ReadOnly, OpenMode::Existing] {
        match SqliteStore::builder(&missing).mode(mode).open() {
            Err(StoreError::NoStore { location, reason }) => {
                assert!(location.contains("typo.db"), "{location}");
                assert!(reason.contains("no such file"), "{reason}");
            }
            other => panic!("{mode:?}: expected NoStore, got {other:?}"),
        }
        assert!(!missing.exists(), "{mode:?} created the file");
    }
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    for mode in [OpenMode::ReadOnly, OpenMode::Existing, OpenMode::Create] {
        match SqliteStore::builder(&empty).mode(mode).open() {
            Err(StoreError::NoStore { reason, .. }) => {
                assert!(reason.contains("empty (0 bytes)"), "{reason}")
            }
            other => panic!("{mode:?}: expected NoStore, got {other:?}"),
        }
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
    }
    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    for mode in [OpenMode::ReadOnly, OpenMode::Existing] {
        assert!(
            matches!(
                SqliteStore::builder(&other).mode(mode).open(),
                Err(StoreError::NoStore { .. })
            ),
            "{mode:?}"
        );
    }
    let created = SqliteStore::builder(&missing).open().unwrap();
    drop(created);
    SqliteStore::builder(&missing)
        .mode(OpenMode::ReadOnly)
        .open()
        .unwrap();
}

/// Another process holds the write lock past the busy timeout: the append
/// (a completion, say) waits it out and commits instead of failing with
/// "database is locked"; with a bounded `lock_wait` it fails, nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_waits_out_a_write_lock_held_past_the_busy_timeout() {
    let backend = SqliteBackend::new();
    let store = Arc::new(
        SqliteStore::builder(backend.path())
            .busy_timeout(Duration::from_millis(20))
            .open()
            .unwrap(),
    );
    new_run(&*store, &id("r"), 1).await;
    let mut blocker = backend.raw();
    let lock = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let append = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            store
                .append(
                    &id("r"),
                    1,
                    &[ev("done")],
                    ListingStatus::COMPLETED.into(),
                    2,
                )
                .await
        }
    });
    // Released only once the writer has found it held for three whole busy
    // timeouts (counted, not timed).
    while store.stats().lock_retries < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!append.is_finished());
    lock.commit().unwrap();
    assert_eq!(append.await.unwrap().unwrap().event_count, 2);

    let bounded = SqliteStore::builder(backend.path())
        .busy_timeout(Duration::from_millis(20))
        .lock_wait(Some(Duration::ZERO))
        .open()
        .unwrap();
    let lock = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let error = bounded
        .append(
            &id("r"),
            2,
            &[ev("more")],
            ListingStatus::COMPLETED.into(),
            3,
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("locked"), "{error}");
    lock.rollback().unwrap();
    assert_eq!(store.load(&id("r")).await.unwrap().len(), 2);
}

/// Issue 37, item 6: the store reads on threads of its own. A plugin's
/// filesystem call stuck on tokio's blocking pool (a read of a file that
/// never returns) can fill that pool; the store's reads must not queue
/// behind it, or every run in the process stalls with it.
#[test]
fn reads_do_not_wait_on_a_full_blocking_pool() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (_backend, store) = backend_store();
    let (release, stuck) = std::sync::mpsc::channel::<()>();
    let (started, running) = std::sync::mpsc::channel::<()>();
    rt.block_on(async {
        // The pool's one thread, stuck as a plugin's read of a blocking
        // file would leave it.
        let hog = tokio::task::spawn_blocking(move || {
            started.send(()).unwrap();
            let _ = stuck.recv();
        });
        running.recv().unwrap();
        new_run(&*store, &id("beside"), 2).await;
        let read = tokio::time::timeout(Duration::from_secs(10), store.load(&id("beside"))).await;
        release.send(()).unwrap();
        hog.await.unwrap();
        let events = read.expect("the read waited on the full blocking pool");
        assert_eq!(events.unwrap().len(), 2);
    });
}
