//! The store conformance suite: every behaviour of [`EventStore`] written
//! once as a function over a [`Backend`], and run against a store by
//! [`conformance_suite!`](crate::conformance_suite), which makes one test of
//! each function. The functions are public so the macro can name them from
//! any crate; each one's name states the behaviour it checks (the few whose
//! names cannot say it all have a doc), so they carry no doc of their own.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::{
    ApprovalRule, ChainBreak, ChainKey, Claim, Commitment, CommitmentFilter, EventStore,
    HistoryChunk, HistoryDigest, Holder, KeyClaim, Listing, ListingStatus, MemoryStore,
    PruneFilter, Revocation, RuleStanding, RunFilter, RunId, RunMeta, RunPosition, SessionHead,
    Settle, Settlement, SettlingAppend, StoreError, WAITING,
};

/// A store under test and the back door the tamper tests need: how to
/// open it, and how to damage its storage behind its back.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Opens the store. For durable backends, a second call after the
    /// previous store was dropped reopens the same data.
    async fn open(&self) -> Arc<dyn EventStore>;
    /// Opens a second, empty store that chains under `key`.
    async fn open_keyed(&self, key: ChainKey) -> Arc<dyn EventStore>;
    /// Changes a run's stored data behind the store's back.
    async fn tamper(&self, run_id: &RunId, tamper: Tamper);
    /// Changes the stored row of session history chunk `digest` behind
    /// the store's back.
    async fn tamper_history(&self, digest: &HistoryDigest, tamper: HistoryTamper);
    /// Changes a sealed row behind the store's back: in the data
    /// [`open`](Backend::open) opens, or with `keyed` in the data
    /// [`open_keyed`](Backend::open_keyed) opens. Only the durable suite
    /// calls it (a store in memory has no storage outside itself to
    /// change), so by default it panics.
    async fn tamper_row(&self, keyed: bool, tamper: RowTamper) {
        let _ = (keyed, tamper);
        panic!("this backend cannot change sealed rows behind its store's back");
    }
}

/// Damage done to a sealed row (see `store/sealed.rs`): an approval rule or
/// an idempotency commitment, as someone with write access to the
/// database would do it.
#[derive(Clone, Debug)]
pub enum RowTamper {
    /// Replace rule `id`'s spec (widen it, say).
    RuleSpec {
        /// The rule.
        id: String,
        /// Its new spec.
        spec: String,
    },
    /// Replace the result commitment `key` was settled with.
    CommitmentResult {
        /// The commitment.
        key: String,
        /// Its new result.
        result: Vec<u8>,
    },
    /// Copy the seal of row `from` onto row `to`, both in `table`
    /// ([`RULES`](crate::RULES) or [`COMMITMENTS`](crate::COMMITMENTS)).
    CopySeal {
        /// The table.
        table: &'static str,
        /// The row whose seal is copied.
        from: String,
        /// The row that gets it.
        to: String,
    },
    /// Take the store back to the schema before seals existed: the seal
    /// columns dropped, the schema version set back. The next open for
    /// writing migrates it again.
    Unseal,
}

/// Damage done to a session history chunk's row.
#[derive(Clone, Debug)]
pub enum HistoryTamper {
    /// Replace its body.
    Edit(Vec<u8>),
    /// Point its link at another chunk (or at none).
    Relink(Option<HistoryDigest>),
    /// Delete the row.
    Delete,
}

/// Damage done to a run's storage. Sequence numbers count from 1, as the
/// store numbers events.
#[derive(Clone, Debug)]
pub enum Tamper {
    /// Replace the bytes of event `seq` with `bytes`.
    Edit {
        /// The event.
        seq: u64,
        /// Its new bytes.
        bytes: Vec<u8>,
    },
    /// Delete event `seq`.
    Drop {
        /// The event.
        seq: u64,
    },
    /// Swap the places of events `a` and `b` (each takes the other's seq).
    Swap {
        /// One event.
        a: u64,
        /// The other.
        b: u64,
    },
    /// Delete every event after `keep`.
    Truncate {
        /// The last event kept.
        keep: u64,
    },
    /// Overwrite the stored hash of event `seq` with `hash`.
    Rehash {
        /// The event.
        seq: u64,
        /// Its new stored hash.
        hash: [u8; 32],
    },
    /// Set the run row's count and head back to those of event `to`,
    /// leaving the later events in place.
    RollBackHead {
        /// The event whose count and head the run row gets.
        to: u64,
    },
}

/// The [`MemoryStore`] as a [`Backend`]: every [`open`](Backend::open)
/// returns the same store, and tampering edits its rows in place.
pub struct MemoryBackend(Arc<MemoryStore>);

impl MemoryBackend {
    /// A backend over a new, empty memory store.
    pub fn new() -> Self {
        Self(Arc::new(MemoryStore::new()))
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn open(&self) -> Arc<dyn EventStore> {
        self.0.clone()
    }

    async fn open_keyed(&self, key: ChainKey) -> Arc<dyn EventStore> {
        Arc::new(MemoryStore::with_chain_key(key))
    }

    async fn tamper(&self, run_id: &RunId, tamper: Tamper) {
        self.0.tamper(run_id, |run| match tamper {
            Tamper::Edit { seq, bytes } => {
                run.events[seq as usize - 1].bytes = Bytes::from(bytes);
            }
            Tamper::Drop { seq } => run.events.retain(|e| e.seq != seq),
            Tamper::Swap { a, b } => {
                run.events.swap(a as usize - 1, b as usize - 1);
                run.events[a as usize - 1].seq = a;
                run.events[b as usize - 1].seq = b;
            }
            Tamper::Truncate { keep } => run.events.retain(|e| e.seq <= keep),
            Tamper::Rehash { seq, hash } => {
                run.events[seq as usize - 1].hash = crate::ChainHash::from_bytes(hash);
            }
            Tamper::RollBackHead { to } => {
                run.count = to;
                run.head = run.events[to as usize - 1].hash;
            }
        });
    }

    async fn tamper_history(&self, digest: &HistoryDigest, tamper: HistoryTamper) {
        self.0.tamper_history(digest, |row| {
            let stored = row.as_mut().expect("tampered chunk exists");
            match tamper {
                HistoryTamper::Edit(body) => stored.body = Bytes::from(body),
                HistoryTamper::Relink(previous) => stored.previous = previous,
                HistoryTamper::Delete => *row = None,
            }
        });
    }
}

// ---- helpers -------------------------------------------------------------

/// `s` as a run id; panics if it is not one.
pub fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// An event of bytes `s`.
pub fn ev(s: &str) -> Bytes {
    Bytes::from(s.to_owned())
}

/// A run's metadata: agent `agent`, no labels or session, created at
/// `created_ms`.
pub fn meta(agent: &str, created_ms: i64) -> RunMeta {
    RunMeta {
        agent: agent.to_owned(),
        labels: BTreeMap::new(),
        session: None,
        session_runs: None,
        history: Vec::new(),
        history_head: None,
        created_ms,
    }
}

/// Creates `run` with `n` events (`"<run>:1"` ..), appended one per call.
pub async fn new_run(store: &dyn EventStore, run: &RunId, n: u64) {
    store
        .create(
            run,
            meta("agent", 1),
            ev(&format!("{run}:1")),
            ListingStatus::RUNNING,
        )
        .await
        .unwrap();
    for seq in 2..=n {
        let appended = store
            .append(
                run,
                seq - 1,
                &[ev(&format!("{run}:{seq}"))],
                ListingStatus::RUNNING.into(),
                seq as i64,
            )
            .await
            .unwrap();
        assert_eq!(appended.event_count, seq);
    }
}

fn bytes_of(events: &[crate::StoredEvent]) -> Vec<Vec<u8>> {
    events.iter().map(|e| e.bytes.to_vec()).collect()
}

fn ids(runs: &[crate::RunSummary]) -> Vec<&str> {
    runs.iter().map(|r| r.run_id.as_str()).collect()
}

/// The chain as documented in the module docs, computed independently of
/// the store's code: every store must produce exactly these hashes.
fn documented_chain(run: &RunId, events: &[&[u8]]) -> Vec<[u8; 32]> {
    let mut prev: [u8; 32] =
        Sha256::digest([&b"warden.store.chain.v1\0"[..], run.as_str().as_bytes()].concat()).into();
    let mut out = Vec::new();
    for (i, bytes) in events.iter().enumerate() {
        let mut h = Sha256::new();
        h.update(prev);
        h.update((i as u64 + 1).to_be_bytes());
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
        prev = h.finalize().into();
        out.push(prev);
    }
    out
}

#[track_caller]
fn assert_tampered(err: StoreError, run: &RunId, seq: u64, kind: fn(&ChainBreak) -> bool) {
    match err {
        StoreError::Tampered {
            run_id,
            seq: found,
            reason,
        } => {
            assert_eq!(&run_id, run);
            assert_eq!(found, seq, "reason: {reason}");
            assert!(kind(&reason), "unexpected reason: {reason:?}");
        }
        other => panic!("expected Tampered at seq {seq}, got {other:?}"),
    }
}

// ---- the suite -----------------------------------------------------------

pub async fn create_then_load(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("run-1");
    let mut m = meta("writer", 1_700_000_000_000);
    m.labels.insert("team".into(), "red".into());
    m.session = Some("sess-9".into());
    let appended = store
        .create(
            &run,
            m.clone(),
            ev(r#"{"kind":"run_started"}"#),
            ListingStatus::RUNNING,
        )
        .await
        .unwrap();
    assert_eq!(appended.event_count, 1);

    let log = store.load(&run).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].seq, 1);
    assert_eq!(&log[0].bytes[..], br#"{"kind":"run_started"}"#);
    assert_eq!(log[0].hash, appended.head);

    let s = store.summary(&run).await.unwrap();
    assert_eq!(s.run_id, run);
    assert_eq!(s.agent, "writer");
    assert_eq!(s.status, "running");
    assert_eq!(s.labels, m.labels);
    assert_eq!(s.session.as_deref(), Some("sess-9"));
    assert_eq!(
        (s.created_ms, s.updated_ms),
        (1_700_000_000_000, 1_700_000_000_000)
    );
    assert_eq!(s.event_count, 1);
}

pub async fn create_refuses_an_id_with_history(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("dup");
    new_run(&*store, &run, 3).await;
    let err = store
        .create(
            &run,
            meta("other-agent", 99),
            ev("again"),
            ListingStatus::COMPLETED,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::AlreadyExists { run_id } if *run_id == run),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "run dup already exists");
    // Nothing changed.
    let log = store.load(&run).await.unwrap();
    assert_eq!(
        bytes_of(&log),
        [b"dup:1".to_vec(), b"dup:2".to_vec(), b"dup:3".to_vec()]
    );
    let s = store.summary(&run).await.unwrap();
    assert_eq!(
        (s.agent.as_str(), s.status.as_str(), s.event_count),
        ("agent", "running", 3)
    );
}

pub async fn append_extends_the_log_in_order(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("ordered");
    let binary: &[u8] = &[0, 0xff, 0xfe, b'\n', 0];
    store
        .create(&run, meta("a", 5), ev("one"), ListingStatus::RUNNING)
        .await
        .unwrap();
    let a = store
        .append(&run, 1, &[ev("two")], ListingStatus::RUNNING.into(), 6)
        .await
        .unwrap();
    assert_eq!(a.event_count, 2);
    let batch = [ev("three"), Bytes::copy_from_slice(binary), Bytes::new()];
    let a = store
        .append(&run, 2, &batch, ListingStatus::RUNNING.into(), 7)
        .await
        .unwrap();
    assert_eq!(a.event_count, 5);
    let last = store
        .append(&run, 5, &[ev("six")], ListingStatus::RUNNING.into(), 8)
        .await
        .unwrap();
    assert_eq!(last.event_count, 6);

    let log = store.load(&run).await.unwrap();
    let expected: [&[u8]; 6] = [b"one", b"two", b"three", binary, b"", b"six"];
    assert_eq!(
        log.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(bytes_of(&log), expected.map(<[u8]>::to_vec));
    // Hashes follow the documented construction exactly, and end at the head.
    let chain = documented_chain(&run, &expected);
    assert_eq!(
        log.iter().map(|e| *e.hash.as_bytes()).collect::<Vec<_>>(),
        chain
    );
    assert_eq!(last.head.as_bytes(), &chain[5]);
}

pub async fn conflicting_append_writes_nothing(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("conflict");
    new_run(&*store, &run, 3).await;
    let before = store.summary(&run).await.unwrap();
    for expected in [0, 2, 4, 10] {
        let err = store
            .append(
                &run,
                expected,
                &[ev("x"), ev("y")],
                ListingStatus::COMPLETED.into(),
                999,
            )
            .await
            .unwrap_err();
        match &err {
            StoreError::Conflict {
                run_id,
                expected: e,
                actual,
            } => assert_eq!((run_id, *e, *actual), (&run, expected, 3)),
            other => panic!("expected Conflict, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!("append to run conflict expected {expected} events in the log, found 3")
        );
    }
    let log = store.load(&run).await.unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(store.summary(&run).await.unwrap(), before);
    assert!(store.verify(&run).await.unwrap().is_intact());
}

pub async fn unknown_runs_and_empty_appends_are_typed(backend: &dyn Backend) {
    let store = backend.open().await;
    let ghost = id("ghost");
    let is_unknown = |e: &StoreError| matches!(e, StoreError::UnknownRun { run_id } if run_id.as_str() == "ghost");
    assert!(is_unknown(
        &store
            .append(&ghost, 1, &[ev("x")], ListingStatus::RUNNING.into(), 1)
            .await
            .unwrap_err()
    ));
    assert!(is_unknown(&store.load(&ghost).await.unwrap_err()));
    assert!(is_unknown(&store.load_after(&ghost, 0).await.unwrap_err()));
    assert!(is_unknown(&store.summary(&ghost).await.unwrap_err()));
    assert!(is_unknown(&store.verify(&ghost).await.unwrap_err()));
    assert_eq!(
        store
            .append(&ghost, 1, &[ev("x")], ListingStatus::RUNNING.into(), 1)
            .await
            .unwrap_err()
            .to_string(),
        "run ghost does not exist"
    );

    let run = id("real");
    new_run(&*store, &run, 2).await;
    let err = store
        .append(&run, 2, &[], ListingStatus::COMPLETED.into(), 50)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::EmptyAppend { .. }), "{err:?}");
    let s = store.summary(&run).await.unwrap();
    assert_eq!(
        (s.status.as_str(), s.event_count, s.updated_ms),
        ("running", 2, 2)
    );
    assert!(store.run_ids().await.unwrap() == [run]);
}

pub async fn status_and_updated_time_change_with_the_append(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("status");
    store
        .create(&run, meta("a", 10), ev("1"), ListingStatus::RUNNING)
        .await
        .unwrap();
    store
        .append(
            &run,
            1,
            &[ev("2"), ev("3")],
            ListingStatus::parked("awaiting_approval").into(),
            25,
        )
        .await
        .unwrap();
    let s = store.summary(&run).await.unwrap();
    assert_eq!(
        (s.status.as_str(), s.updated_ms, s.created_ms, s.event_count),
        ("awaiting_approval", 25, 10, 3)
    );
    let parked = store
        .list(&RunFilter::new().status("awaiting_approval"))
        .await
        .unwrap();
    assert_eq!(ids(&parked), ["status"]);
    store
        .append(&run, 3, &[ev("4")], ListingStatus::COMPLETED.into(), 40)
        .await
        .unwrap();
    assert!(
        store
            .list(&RunFilter::new().status("awaiting_approval"))
            .await
            .unwrap()
            .is_empty()
    );
    let s = store.summary(&run).await.unwrap();
    assert_eq!(
        (s.status.as_str(), s.updated_ms, s.event_count),
        ("completed", 40, 4)
    );
}

pub async fn load_after_returns_the_tail(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("tail");
    new_run(&*store, &run, 5).await;
    let full = store.load(&run).await.unwrap();
    assert_eq!(store.load_after(&run, 0).await.unwrap(), full);
    assert_eq!(store.load_after(&run, 3).await.unwrap(), full[3..]);
    assert!(store.load_after(&run, 5).await.unwrap().is_empty());
    assert!(store.load_after(&run, 9).await.unwrap().is_empty());
}

pub async fn load_many_reads_each_log_checked_and_skips_the_missing(backend: &dyn Backend) {
    let store = backend.open().await;
    for (run, len) in [("many-a", 3), ("many-b", 1), ("many-c", 4)] {
        new_run(&*store, &id(run), len).await;
    }
    let asked = [id("many-c"), id("never-made"), id("many-a"), id("many-b")];
    let logs = store.load_many(&asked).await.unwrap();
    let names: Vec<&str> = logs.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(names, ["many-c", "many-a", "many-b"]);
    for (run, events) in &logs {
        assert_eq!(*events, store.load(run).await.unwrap(), "{run}");
    }
    assert!(store.load_many(&[]).await.unwrap().is_empty());
    // A pruned run is left out like one never made.
    store
        .append(
            &id("many-b"),
            1,
            &[ev("end")],
            listed("completed").into(),
            10,
        )
        .await
        .unwrap();
    let pruned = store
        .prune(
            &PruneFilter::new().status("completed").updated_before(500),
            5_000,
        )
        .await
        .unwrap();
    assert_eq!(pruned.len(), 1);
    let logs = store.load_many(&asked).await.unwrap();
    assert_eq!(logs.len(), 2);
    // A damaged log fails the call, as `load` does.
    backend
        .tamper(
            &id("many-a"),
            Tamper::Edit {
                seq: 2,
                bytes: b"edited".to_vec(),
            },
        )
        .await;
    let store = backend.open().await;
    let err = store.load_many(&asked).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Tampered { ref run_id, seq: 2, .. } if run_id.as_str() == "many-a"),
        "{err:?}"
    );
}

/// One run of the listing fixture: id, agent, created, final status,
/// labels, session.
type FixtureRun = (
    &'static str,
    &'static str,
    i64,
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

/// The listing fixture: six runs with varied columns (at most one active
/// run per session, as stores enforce).
async fn listing_fixture(store: &dyn EventStore) {
    let runs: [FixtureRun; 6] = [
        (
            "run-a",
            "alpha",
            100,
            "running",
            &[("team", "red"), ("env", "prod")],
            None,
        ),
        (
            "run-b",
            "beta",
            200,
            "completed",
            &[("team", "blue"), ("env", "prod")],
            Some("s1"),
        ),
        ("run-0c", "beta", 200, "running", &[("team", "blue")], None),
        (
            "run-d",
            "alpha",
            300,
            "awaiting_approval",
            &[("team", "red")],
            Some("s1"),
        ),
        (
            "run-e",
            "alpha",
            400,
            "completed",
            &[("team", "red team ü \"q\"")],
            Some("s2"),
        ),
        ("run-f", "gamma", 500, "failed", &[], None),
    ];
    for (run, agent, created, status, labels, session) in runs {
        let m = RunMeta {
            agent: agent.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            session: session.map(Into::into),
            session_runs: None,
            history: Vec::new(),
            history_head: None,
            created_ms: created,
        };
        let run = id(run);
        store
            .create(&run, m, ev("start"), ListingStatus::RUNNING)
            .await
            .unwrap();
        store
            .append(&run, 1, &[ev("next")], listed(status).into(), created + 1)
            .await
            .unwrap();
    }
}

/// A place in the listing order (see [`RunFilter::after`]).
fn at(created_ms: i64, run: &str) -> RunPosition {
    RunPosition {
        created_ms,
        run_id: id(run),
    }
}

pub async fn list_filters_each_and_combined(backend: &dyn Backend) {
    let store = backend.open().await;
    listing_fixture(&*store).await;
    let f = RunFilter::new;
    let cases: Vec<(RunFilter, &[&str])> = vec![
        (
            f(),
            &["run-a", "run-0c", "run-b", "run-d", "run-e", "run-f"],
        ),
        (f().status("completed"), &["run-b", "run-e"]),
        (
            f().status("completed").status("failed"),
            &["run-b", "run-e", "run-f"],
        ),
        (f().status("nope"), &[]),
        (f().label("team", "red"), &["run-a", "run-d"]),
        (f().label("env", "prod"), &["run-a", "run-b"]),
        (f().label("team", "red").label("env", "prod"), &["run-a"]),
        (f().label("team", "red team ü \"q\""), &["run-e"]),
        (f().label("team", "green"), &[]),
        (f().label("missing", "x"), &[]),
        (f().agent("alpha"), &["run-a", "run-d", "run-e"]),
        (f().agent("nobody"), &[]),
        (f().session("s1"), &["run-b", "run-d"]),
        (
            f().created_since(200),
            &["run-0c", "run-b", "run-d", "run-e", "run-f"],
        ),
        (f().created_before(300), &["run-a", "run-0c", "run-b"]),
        (
            f().created_since(200).created_before(400),
            &["run-0c", "run-b", "run-d"],
        ),
        (f().agent("alpha").status("completed"), &["run-e"]),
        (
            f().agent("alpha").label("team", "red").created_since(150),
            &["run-d"],
        ),
        (f().status("running").label("team", "blue"), &["run-0c"]),
        (
            f().agent("beta")
                .status("running")
                .status("completed")
                .label("env", "prod"),
            &["run-b"],
        ),
        (f().limit(2), &["run-a", "run-0c"]),
        (f().limit(0), &[]),
        (
            f().limit(100),
            &["run-a", "run-0c", "run-b", "run-d", "run-e", "run-f"],
        ),
        (f().agent("alpha").limit(2), &["run-a", "run-d"]),
        (f().status("running").limit(1), &["run-a"]),
        (
            f().newest_first(),
            &["run-f", "run-e", "run-d", "run-b", "run-0c", "run-a"],
        ),
        (f().newest_first().limit(2), &["run-f", "run-e"]),
        (f().newest_first().status("running"), &["run-0c", "run-a"]),
        (f().newest_first().label("team", "red"), &["run-d", "run-a"]),
        // Pages: after the last run shown, in either order; a tie on the
        // creation time is broken by the id.
        (
            f().after(at(200, "run-0c")),
            &["run-b", "run-d", "run-e", "run-f"],
        ),
        (
            f().newest_first().after(at(200, "run-b")).limit(2),
            &["run-0c", "run-a"],
        ),
        (f().newest_first().after(at(100, "run-a")), &[]),
        (
            f().newest_first().agent("alpha").after(at(400, "run-e")),
            &["run-d", "run-a"],
        ),
        (
            f().id_prefix("run-"),
            &["run-a", "run-0c", "run-b", "run-d", "run-e", "run-f"],
        ),
        (f().id_prefix("run-0"), &["run-0c"]),
        (f().id_prefix("run-b"), &["run-b"]),
        (f().id_prefix("run-bb"), &[]),
        (f().id_prefix("RUN"), &[]),
        (
            f().id_prefix(""),
            &["run-a", "run-0c", "run-b", "run-d", "run-e", "run-f"],
        ),
    ];
    for (filter, expected) in cases {
        let found = store.list(&filter).await.unwrap();
        assert_eq!(ids(&found), expected, "filter {filter:?}");
    }
}

pub async fn list_summaries_carry_every_column(backend: &dyn Backend) {
    let store = backend.open().await;
    listing_fixture(&*store).await;
    let found = store
        .list(&RunFilter::new().agent("alpha").session("s1"))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    let d = &found[0];
    assert_eq!(d.run_id.as_str(), "run-d");
    assert_eq!(d.agent, "alpha");
    assert_eq!(d.status, "awaiting_approval");
    assert_eq!(
        d.labels,
        BTreeMap::from([("team".to_owned(), "red".to_owned())])
    );
    assert_eq!(d.session.as_deref(), Some("s1"));
    assert_eq!((d.created_ms, d.updated_ms, d.event_count), (300, 301, 2));
    assert_eq!(&store.summary(&d.run_id).await.unwrap(), d);
    let f = &store.list(&RunFilter::new().agent("gamma")).await.unwrap()[0];
    assert!(f.labels.is_empty() && f.session.is_none());
}

pub async fn verify_reports_intact_runs_and_run_ids_lists_all(backend: &dyn Backend) {
    let store = backend.open().await;
    for (run, n) in [("v-2", 4), ("v-1", 1), ("v-3", 7)] {
        new_run(&*store, &id(run), n).await;
    }
    let all = store.run_ids().await.unwrap();
    assert_eq!(all, [id("v-1"), id("v-2"), id("v-3")]);
    for run in &all {
        let report = store.verify(run).await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert_eq!(report.events_read, report.recorded_count);
        let log = store.load(run).await.unwrap();
        assert_eq!(report.recorded_head, Some(log.last().unwrap().hash));
    }
    assert_eq!(store.verify(&id("v-3")).await.unwrap().recorded_count, 7);
}

/// Damages run `victim` (6 events) with `tamper`, then checks that load,
/// verify and load_after report it at `seq`, and that a second run is
/// untouched: it loads, lists, verifies and takes appends.
async fn tamper_case(
    backend: &dyn Backend,
    tamper: Tamper,
    seq: u64,
    kind: fn(&ChainBreak) -> bool,
) {
    let store = backend.open().await;
    let victim = id("victim");
    let bystander = id("bystander");
    new_run(&*store, &bystander, 3).await;
    new_run(&*store, &victim, 6).await;
    backend.tamper(&victim, tamper.clone()).await;

    assert_tampered(store.load(&victim).await.unwrap_err(), &victim, seq, kind);
    let report = store.verify(&victim).await.unwrap();
    assert!(!report.is_intact());
    assert_eq!(report.findings[0].seq, seq, "{report:?}");
    assert!(kind(&report.findings[0].kind), "{report:?}");
    // A subscriber reading from before the damage sees it too.
    assert_tampered(
        store.load_after(&victim, 1).await.unwrap_err(),
        &victim,
        seq,
        kind,
    );
    let message = store.load(&victim).await.unwrap_err().to_string();
    assert!(
        message.starts_with(&format!(
            "run victim fails its integrity check at seq {seq}: "
        )),
        "{message}"
    );

    // The other run is unaffected, and listing still shows both.
    assert_eq!(store.load(&bystander).await.unwrap().len(), 3);
    store
        .append(
            &bystander,
            3,
            &[ev("more")],
            ListingStatus::COMPLETED.into(),
            10,
        )
        .await
        .unwrap();
    assert_eq!(store.load(&bystander).await.unwrap().len(), 4);
    assert!(store.verify(&bystander).await.unwrap().is_intact());
    let listed = store.list(&RunFilter::new()).await.unwrap();
    let mut listed = ids(&listed);
    listed.sort();
    assert_eq!(listed, ["bystander", "victim"]);
}

pub async fn tamper_edited_event_is_detected(backend: &dyn Backend) {
    let edit = Tamper::Edit {
        seq: 3,
        bytes: b"victim:3 (edited)".to_vec(),
    };
    tamper_case(backend, edit, 3, |k| *k == ChainBreak::HashMismatch).await;
}

pub async fn tamper_dropped_event_is_detected(backend: &dyn Backend) {
    let missing = |k: &ChainBreak| matches!(k, ChainBreak::Missing { recorded_count: 6 });
    tamper_case(backend, Tamper::Drop { seq: 3 }, 3, missing).await;
}

pub async fn tamper_reordered_events_are_detected(backend: &dyn Backend) {
    tamper_case(backend, Tamper::Swap { a: 2, b: 4 }, 2, |k| {
        *k == ChainBreak::HashMismatch
    })
    .await;
}

pub async fn tamper_truncated_log_is_detected(backend: &dyn Backend) {
    let missing = |k: &ChainBreak| matches!(k, ChainBreak::Missing { recorded_count: 6 });
    tamper_case(backend, Tamper::Truncate { keep: 4 }, 5, missing).await;
    // Appending after the damage is refused, not chained onto a hole.
    let store = backend.open().await;
    let err = store
        .append(
            &id("victim"),
            6,
            &[ev("x")],
            ListingStatus::RUNNING.into(),
            1,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Tampered { .. }), "{err:?}");
    assert_eq!(store.verify(&id("victim")).await.unwrap().events_read, 4);
}

pub async fn tamper_edited_hash_is_detected(backend: &dyn Backend) {
    let rehash = Tamper::Rehash {
        seq: 4,
        hash: [0; 32],
    };
    tamper_case(backend, rehash, 4, |k| *k == ChainBreak::HashMismatch).await;
}

pub async fn tamper_rolled_back_head_is_detected(backend: &dyn Backend) {
    let beyond = |k: &ChainBreak| matches!(k, ChainBreak::BeyondCount { recorded_count: 4 });
    tamper_case(backend, Tamper::RollBackHead { to: 4 }, 5, beyond).await;
    let store = backend.open().await;
    let err = store
        .append(
            &id("victim"),
            4,
            &[ev("x")],
            ListingStatus::RUNNING.into(),
            1,
        )
        .await
        .unwrap_err();
    assert_tampered(err, &id("victim"), 5, beyond);
}

pub async fn concurrent_appends_on_one_run_have_one_winner(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("race");
    store
        .create(&run, meta("a", 1), ev("start"), ListingStatus::RUNNING)
        .await
        .unwrap();
    const RACERS: usize = 8;
    const ROUNDS: u64 = 12;
    for round in 0..ROUNDS {
        let len = round + 1;
        let tasks: Vec<_> = (0..RACERS)
            .map(|racer| {
                let (store, run) = (store.clone(), run.clone());
                tokio::spawn(async move {
                    let event = ev(&format!("round {round} racer {racer}"));
                    store
                        .append(
                            &run,
                            len,
                            &[event],
                            ListingStatus::RUNNING.into(),
                            len as i64,
                        )
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(appended) => {
                    winners += 1;
                    assert_eq!(appended.event_count, len + 1);
                }
                Err(StoreError::Conflict {
                    expected, actual, ..
                }) => {
                    assert_eq!((expected, actual), (len, len + 1));
                }
                Err(other) => panic!("unexpected error: {other:?}"),
            }
        }
        assert_eq!(winners, 1, "round {round}");
    }
    let log = store.load(&run).await.unwrap();
    assert_eq!(log.len() as u64, ROUNDS + 1);
    for (round, event) in log[1..].iter().enumerate() {
        let text = std::str::from_utf8(&event.bytes).unwrap();
        assert!(text.starts_with(&format!("round {round} racer ")), "{text}");
    }
    assert_eq!(store.summary(&run).await.unwrap().event_count, ROUNDS + 1);
}

pub async fn concurrent_runs_each_keep_their_own_log(backend: &dyn Backend) {
    let store = backend.open().await;
    const RUNS: usize = 40;
    const STEPS: u64 = 8;
    let tasks: Vec<_> = (0..RUNS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let run = id(&format!("many-{i:03}"));
                store
                    .create(&run, meta("a", i as i64), ev("0"), ListingStatus::RUNNING)
                    .await
                    .unwrap();
                for step in 1..=STEPS {
                    let status = if step == STEPS {
                        ListingStatus::COMPLETED
                    } else {
                        ListingStatus::RUNNING
                    };
                    let appended = store
                        .append(
                            &run,
                            step,
                            &[ev(&format!("{i}/{step}"))],
                            status.into(),
                            step as i64,
                        )
                        .await
                        .unwrap();
                    assert_eq!(appended.event_count, step + 1);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    for i in 0..RUNS {
        let run = id(&format!("many-{i:03}"));
        let log = store.load(&run).await.unwrap();
        let expected: Vec<Vec<u8>> = std::iter::once(b"0".to_vec())
            .chain((1..=STEPS).map(|s| format!("{i}/{s}").into_bytes()))
            .collect();
        assert_eq!(bytes_of(&log), expected);
    }
    let done = store
        .list(&RunFilter::new().status("completed"))
        .await
        .unwrap();
    assert_eq!(done.len(), RUNS);
}

pub async fn keyed_chain_differs_and_verifies(backend: &dyn Backend) {
    let key = ChainKey::new(&[42; 32]).unwrap();
    let plain = backend.open().await;
    let keyed = backend.open_keyed(key).await;
    let run = id("keyed");
    new_run(&*plain, &run, 3).await;
    new_run(&*keyed, &run, 3).await;
    let a = plain.load(&run).await.unwrap();
    let b = keyed.load(&run).await.unwrap();
    assert_eq!(bytes_of(&a), bytes_of(&b));
    for (x, y) in a.iter().zip(&b) {
        assert_ne!(x.hash, y.hash);
    }
    // HMAC-SHA-256 keyed over the same input as the plain chain.
    use hmac::Mac;
    let mac = |parts: &[&[u8]]| -> [u8; 32] {
        let mut m = hmac::Hmac::<Sha256>::new_from_slice(&[42; 32]).unwrap();
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    };
    let h0 = mac(&[b"warden.store.chain.v1\0", b"keyed"]);
    let h1 = mac(&[&h0, &1u64.to_be_bytes(), &7u64.to_be_bytes(), b"keyed:1"]);
    assert_eq!(b[0].hash.as_bytes(), &h1);
    assert!(keyed.verify(&run).await.unwrap().is_intact());
}

pub async fn reopened_store_keeps_everything(backend: &dyn Backend) {
    let (runs, logs) = {
        let store = backend.open().await;
        listing_fixture(&*store).await;
        new_run(&*store, &id("long"), 50).await;
        let runs = store.list(&RunFilter::new()).await.unwrap();
        let mut logs = Vec::new();
        for run in &runs {
            logs.push(store.load(&run.run_id).await.unwrap());
        }
        (runs, logs)
        // The store is dropped here: its writer stops and the file closes.
    };
    let store = backend.open().await;
    assert_eq!(store.list(&RunFilter::new()).await.unwrap(), runs);
    for (run, log) in runs.iter().zip(&logs) {
        assert_eq!(&store.load(&run.run_id).await.unwrap(), log);
        assert!(store.verify(&run.run_id).await.unwrap().is_intact());
    }
    // Appends continue where the log ended, from the stored head.
    let long = id("long");
    let appended = store
        .append(
            &long,
            50,
            &[ev("long:51")],
            ListingStatus::COMPLETED.into(),
            51,
        )
        .await
        .unwrap();
    assert_eq!(appended.event_count, 51);
    let log = store.load(&long).await.unwrap();
    assert_eq!(log.len(), 51);
    assert_eq!(log[50].hash, appended.head);
    let err = store
        .create(&long, meta("a", 1), ev("x"), ListingStatus::RUNNING)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }));
}

// ---- claims, fencing, the queue, retention ----------------------------------

#[track_caller]
fn assert_fenced(err: StoreError, run: &RunId, token: u64, current: u64) {
    match err {
        StoreError::Fenced {
            run_id,
            token: t,
            current: c,
        } => assert_eq!((&run_id, t, c), (run, token, current)),
        other => panic!("expected Fenced (token {token}, current {current}), got {other:?}"),
    }
}

pub async fn a_replaced_claim_is_fenced(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("fenced");
    new_run(&*store, &run, 1).await;
    let a = store
        .acquire_claim(&run, "host-a", 1_000, 100)
        .await
        .unwrap();
    assert_eq!(
        (a.token, a.expires_ms, a.owner.as_str()),
        (1, 1_100, "host-a")
    );
    // B cannot take a live claim.
    let err = store
        .acquire_claim(&run, "host-b", 1_050, 100)
        .await
        .unwrap_err();
    match &err {
        StoreError::Claimed {
            run_id,
            owner,
            expires_ms,
        } => assert_eq!(
            (run_id, owner.as_str(), *expires_ms),
            (&run, "host-a", 1_100)
        ),
        other => panic!("expected Claimed, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "run fenced is claimed by host-a until 1100 (ms since the epoch)"
    );
    store
        .append_fenced(&a, 1, &[ev("a:2")], ListingStatus::RUNNING.into(), 1_060)
        .await
        .unwrap();
    // A pauses past its expiry; B takes over with a higher token.
    let b = store
        .acquire_claim(&run, "host-b", 1_100, 100)
        .await
        .unwrap();
    assert_eq!(b.token, 2);
    // A wakes up: its append (even with the right length), renewal and
    // release change nothing.
    let err = store
        .append_fenced(&a, 2, &[ev("a:3")], ListingStatus::COMPLETED.into(), 1_110)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "run fenced: claim 1 is no longer held (the newest claim is 2)"
    );
    assert_fenced(err, &run, 1, 2);
    assert_fenced(
        store.renew_claim(&a, 1_110, 100).await.unwrap_err(),
        &run,
        1,
        2,
    );
    store
        .release_claim(&a, Some(ListingStatus::FAILED))
        .await
        .unwrap();
    let s = store.summary(&run).await.unwrap();
    assert_eq!((s.status.as_str(), s.event_count), ("running", 2));
    assert_eq!(s.claim.as_ref(), Some(&b));
    assert_eq!(s.claim_token, 2);
    // B writes.
    let appended = store
        .append_fenced(&b, 2, &[ev("b:3")], ListingStatus::COMPLETED.into(), 1_120)
        .await
        .unwrap();
    assert_eq!(appended.event_count, 3);
    assert_eq!(
        bytes_of(&store.load(&run).await.unwrap()),
        [b"fenced:1".to_vec(), b"a:2".to_vec(), b"b:3".to_vec()]
    );
}

/// A child run is driven under its parent's claim: its appends are fenced
/// by that claim, plain and settling alike, and refused once the parent
/// was taken over (issue 36).
pub async fn a_child_is_fenced_by_its_parents_claim(backend: &dyn Backend) {
    let store = backend.open().await;
    let (parent, child) = (id("parent"), id("parent.call-1-1"));
    new_run(&*store, &parent, 1).await;
    new_run(&*store, &child, 1).await;
    let a = store
        .acquire_claim(&parent, "host-a", 1_000, 100)
        .await
        .unwrap();
    store
        .append_fenced_to(
            &child,
            &a,
            1,
            &[ev("a:2")],
            ListingStatus::RUNNING.into(),
            1_010,
        )
        .await
        .unwrap();
    // The parent's own claim is not the child's: the child's row holds none.
    assert_eq!(store.summary(&child).await.unwrap().claim, None);
    let b = store
        .acquire_claim(&parent, "host-b", 1_100, 100)
        .await
        .unwrap();
    let err = store
        .append_fenced_to(
            &child,
            &a,
            2,
            &[ev("a:3")],
            ListingStatus::RUNNING.into(),
            1_110,
        )
        .await
        .unwrap_err();
    assert_fenced(err, &parent, 1, 2);
    let holds = holder("parent.call-1-1", "call-1-1");
    store.claim_commitment("key-c", &holds).await.unwrap();
    let err = store
        .append_settling(
            SettlingAppend::new(&child, 2, &[ev("a:3")], &settlement("key-c", &holds, "{}"))
                .fenced(Some(&a)),
        )
        .await
        .unwrap_err();
    assert_fenced(err, &parent, 1, 2);
    // The new holder writes to the child.
    store
        .append_fenced_to(
            &child,
            &b,
            2,
            &[ev("b:3")],
            ListingStatus::RUNNING.into(),
            1_120,
        )
        .await
        .unwrap();
    assert_eq!(
        bytes_of(&store.load(&child).await.unwrap()),
        [
            b"parent.call-1-1:1".to_vec(),
            b"a:2".to_vec(),
            b"b:3".to_vec()
        ]
    );
}

pub async fn an_expired_claim_nobody_replaced_still_writes(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("late");
    new_run(&*store, &run, 1).await;
    let a = store.acquire_claim(&run, "host-a", 0, 10).await.unwrap();
    // Long past the expiry, nobody took over: the token still decides.
    store
        .append_fenced(&a, 1, &[ev("late:2")], ListingStatus::RUNNING.into(), 500)
        .await
        .unwrap();
    let s = store.summary(&run).await.unwrap();
    assert!(s.is_stalled(500), "{s:?}");
    assert!(!s.is_stalled(5), "{s:?}");
    let renewed = store.renew_claim(&a, 500, 10).await.unwrap();
    assert_eq!((renewed.token, renewed.expires_ms), (1, 510));
    assert!(!store.summary(&run).await.unwrap().is_stalled(505));
    // Acquiring again, even by the same owner, issues a new token and
    // fences the old one.
    let again = store.acquire_claim(&run, "host-a", 505, 10).await.unwrap();
    assert_eq!(again.token, 2);
    assert_fenced(
        store
            .append_fenced(&renewed, 2, &[ev("x")], ListingStatus::RUNNING.into(), 506)
            .await
            .unwrap_err(),
        &run,
        1,
        2,
    );
    // A stale length under the current claim is still a conflict.
    let err = store
        .append_fenced(&again, 1, &[ev("x")], ListingStatus::RUNNING.into(), 506)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { actual: 2, .. }),
        "{err:?}"
    );
    assert_eq!(store.load(&run).await.unwrap().len(), 2);
}

pub async fn a_released_claim_frees_the_run_and_fences_its_holder(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("parked");
    new_run(&*store, &run, 2).await;
    let a = store.acquire_claim(&run, "host-a", 0, 1_000).await.unwrap();
    store
        .release_claim(&a, Some(ListingStatus::parked("needs_reconciliation")))
        .await
        .unwrap();
    let s = store.summary(&run).await.unwrap();
    assert_eq!(s.status, "needs_reconciliation");
    assert_eq!((s.claim.as_ref(), s.claim_token), (None, 1));
    assert_fenced(
        store
            .append_fenced(&a, 2, &[ev("x")], ListingStatus::RUNNING.into(), 1)
            .await
            .unwrap_err(),
        &run,
        1,
        1,
    );
    assert_fenced(store.renew_claim(&a, 1, 10).await.unwrap_err(), &run, 1, 1);
    // Released twice: nothing more happens.
    store
        .release_claim(&a, Some(ListingStatus::RUNNING))
        .await
        .unwrap();
    assert_eq!(
        store.summary(&run).await.unwrap().status,
        "needs_reconciliation"
    );
    // Anyone may claim it now, long before the old expiry.
    let b = store.acquire_claim(&run, "host-b", 1, 1_000).await.unwrap();
    assert_eq!(b.token, 2);
    // Unfenced appends (verbs a human records) go through under a claim;
    // the driver then finds the log moved.
    store
        .append(&run, 2, &[ev("approved")], ListingStatus::RUNNING.into(), 2)
        .await
        .unwrap();
    let err = store
        .append_fenced(&b, 2, &[ev("x")], ListingStatus::RUNNING.into(), 3)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
    // Claims of unknown runs are typed.
    let ghost = id("ghost");
    let unknown =
        |e: &StoreError| matches!(e, StoreError::UnknownRun { run_id } if *run_id == ghost);
    assert!(unknown(
        &store.acquire_claim(&ghost, "h", 0, 1).await.unwrap_err()
    ));
    let fake = Claim {
        run_id: ghost.clone(),
        owner: "h".into(),
        token: 1,
        expires_ms: 1,
    };
    assert!(unknown(&store.renew_claim(&fake, 0, 1).await.unwrap_err()));
    assert!(unknown(
        &store
            .append_fenced(&fake, 1, &[ev("x")], ListingStatus::RUNNING.into(), 1)
            .await
            .unwrap_err()
    ));
}

pub async fn racing_acquirers_have_one_winner(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("contested");
    new_run(&*store, &run, 1).await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (store, run) = (store.clone(), run.clone());
            tokio::spawn(async move {
                store
                    .acquire_claim(&run, &format!("host-{i}"), 100, 1_000)
                    .await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(claim) => winners.push(claim),
            Err(StoreError::Claimed { .. }) => {}
            Err(other) => panic!("unexpected error: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(winners[0].token, 1);
    assert_eq!(
        store.summary(&run).await.unwrap().claim.as_ref(),
        Some(&winners[0])
    );
}

/// The listing status named `name`: one of the store's own, else parked.
fn listed(name: &'static str) -> ListingStatus {
    ListingStatus::OWN
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| ListingStatus::parked(name))
}

/// Creates `run` in `session` with listing status `status`.
async fn create_in_session(
    store: &dyn EventStore,
    run: &str,
    session: &str,
    status: ListingStatus,
) -> Result<crate::Appended, StoreError> {
    let mut m = meta("agent", 1);
    m.session = Some(session.to_owned());
    store.create(&id(run), m, ev("start"), status).await
}

fn assert_busy(result: Result<crate::Appended, StoreError>, session: &str, active: &str) {
    match result {
        Err(StoreError::SessionBusy {
            session: s,
            active_run,
        }) => {
            assert_eq!((s.as_str(), active_run.as_str()), (session, active));
        }
        other => panic!("expected SessionBusy naming {active}, got {other:?}"),
    }
}

pub async fn a_session_holds_one_active_run_until_it_ends(backend: &dyn Backend) {
    let store = backend.open().await;
    create_in_session(&*store, "first", "chat", ListingStatus::RUNNING)
        .await
        .unwrap();
    // A second start is refused, names the active run and writes nothing.
    let refused = create_in_session(&*store, "second", "chat", ListingStatus::RUNNING).await;
    assert_busy(refused, "chat", "first");
    assert!(matches!(
        store.load(&id("second")).await,
        Err(StoreError::UnknownRun { .. })
    ));
    let message = create_in_session(&*store, "second", "chat", ListingStatus::QUEUED)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "session chat is busy: run first is still active in it"
    );
    // Other sessions and runs outside sessions are not affected.
    create_in_session(&*store, "elsewhere", "other-chat", ListingStatus::RUNNING)
        .await
        .unwrap();
    store
        .create(
            &id("loose"),
            meta("agent", 1),
            ev("start"),
            ListingStatus::RUNNING,
        )
        .await
        .unwrap();
    // Every parked status keeps the session; every terminal one releases it.
    let mut len = 1;
    for parked in [
        "awaiting_approval",
        "suspended",
        "awaiting_external",
        "budget_exceeded",
        "needs_reconciliation",
        "running",
    ] {
        store
            .append(&id("first"), len, &[ev(parked)], listed(parked).into(), 2)
            .await
            .unwrap();
        len += 1;
        assert_busy(
            create_in_session(&*store, "second", "chat", ListingStatus::RUNNING).await,
            "chat",
            "first",
        );
    }
    let mut holder = "first".to_owned();
    for (n, settled) in ListingStatus::SETTLED.into_iter().enumerate() {
        store
            .append(&id(&holder), len, &[ev(settled.name())], settled.into(), 3)
            .await
            .unwrap();
        let next = format!("next-{n}");
        create_in_session(&*store, &next, "chat", ListingStatus::RUNNING)
            .await
            .unwrap_or_else(|e| panic!("a {settled} run must release its session: {e}"));
        holder = next;
        len = 1;
    }
    let listed = store.list(&RunFilter::new().session("chat")).await.unwrap();
    assert_eq!(
        ids(&listed),
        ["first", "next-0", "next-1", "next-2", "next-3"]
    );
}

pub async fn a_start_that_read_a_changed_session_is_refused(backend: &dyn Backend) {
    let store = backend.open().await;
    let start = |run: &'static str, seen: u64| {
        let store = store.clone();
        async move {
            let mut m = meta("agent", 1);
            m.session = Some("chat".into());
            m.session_runs = Some(seen);
            store
                .create(&id(run), m, ev("start"), ListingStatus::RUNNING)
                .await
        }
    };
    start("one", 0).await.unwrap();
    store
        .append(
            &id("one"),
            1,
            &[ev("done")],
            ListingStatus::COMPLETED.into(),
            2,
        )
        .await
        .unwrap();
    // A starter that read the session before `one` existed is refused.
    match start("two", 0).await {
        Err(StoreError::SessionChanged {
            session,
            expected: 0,
            found: 1,
        }) => assert_eq!(session, "chat"),
        other => panic!("expected SessionChanged, got {other:?}"),
    }
    assert!(matches!(
        store.load(&id("two")).await,
        Err(StoreError::UnknownRun { .. })
    ));
    start("two", 1).await.unwrap();
}

pub async fn a_session_head_is_kept_as_runs_start_and_settle(backend: &dyn Backend) {
    let store = backend.open().await;
    let head = |session: &'static str| {
        let store = store.clone();
        async move { store.session_head(session).await.unwrap() }
    };
    assert_eq!(head("chat").await, SessionHead::default());
    create_in_session(&*store, "one", "chat", ListingStatus::RUNNING)
        .await
        .unwrap();
    let now = head("chat").await;
    assert_eq!((now.runs, now.completed), (1, 0));
    assert_eq!(now.active, Some((id("one"), "running".to_owned())));
    assert_eq!(now.latest_completed, None);
    store
        .append(
            &id("one"),
            1,
            &[ev("parked")],
            listed("awaiting_approval").into(),
            2,
        )
        .await
        .unwrap();
    assert_eq!(
        head("chat").await.active,
        Some((id("one"), "awaiting_approval".to_owned()))
    );
    // Completing releases the session and makes the run the latest
    // completed; a failure after it leaves that as it is.
    for (run, status) in [
        ("one", ListingStatus::COMPLETED),
        ("two", ListingStatus::FAILED),
        ("three", ListingStatus::COMPLETED),
    ] {
        let len = if run == "one" {
            2
        } else {
            create_in_session(&*store, run, "chat", ListingStatus::RUNNING)
                .await
                .unwrap();
            1
        };
        store
            .append(&id(run), len, &[ev("end")], status.into(), 3)
            .await
            .unwrap();
    }
    let now = head("chat").await;
    assert_eq!((now.runs, now.completed, &now.active), (3, 2, &None));
    assert_eq!(now.latest_completed, Some(id("three")));
    // Other sessions are their own; a run outside any session counts in none.
    create_in_session(&*store, "elsewhere", "other", ListingStatus::QUEUED)
        .await
        .unwrap();
    store
        .create(
            &id("loose"),
            meta("agent", 1),
            ev("start"),
            ListingStatus::RUNNING,
        )
        .await
        .unwrap();
    let other = head("other").await;
    assert_eq!(other.runs, 1);
    assert_eq!(other.active, Some((id("elsewhere"), "queued".to_owned())));
    assert_eq!(head("chat").await, now);
    // A pruned run was still lived in the session: the count keeps it, so
    // the next start's position is never reused; a pruned active run holds
    // the session no more.
    let pruned = store
        .prune(
            &PruneFilter::new()
                .status("completed")
                .status("queued")
                .updated_before(i64::MAX),
            10,
        )
        .await
        .unwrap();
    assert_eq!(pruned.len(), 3, "{pruned:?}");
    assert_eq!(head("chat").await, now);
    assert_eq!(head("other").await.active, None);
    let mut m = meta("agent", 1);
    m.session = Some("chat".into());
    m.session_runs = Some(3);
    store
        .create(&id("four"), m, ev("start"), ListingStatus::RUNNING)
        .await
        .unwrap();
    let now = head("chat").await;
    assert_eq!((now.runs, now.completed), (4, 2));
    assert_eq!(now.active, Some((id("four"), "running".to_owned())));
}

pub async fn racing_starts_in_one_session_have_one_winner(backend: &dyn Backend) {
    // Two store handles (two hosts for the persistent stores), eight
    // starters each.
    let stores = [backend.open().await, backend.open().await];
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move {
                let run = format!("racer-{i}");
                (
                    run.clone(),
                    create_in_session(&*store, &run, "contested", ListingStatus::RUNNING).await,
                )
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut refusals = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (run, Ok(_)) => winners.push(run),
            (_, Err(StoreError::SessionBusy { active_run, .. })) => refusals.push(active_run),
            (_, Err(other)) => panic!("unexpected error: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(refusals.len(), 15);
    assert!(refusals.iter().all(|r| r.as_str() == winners[0]));
    let listed = stores[0]
        .list(&RunFilter::new().session("contested"))
        .await
        .unwrap();
    assert_eq!(ids(&listed), [winners[0].as_str()]);
}

/// Creates `run` created at `created_ms` with listing status `status`.
async fn run_with_status(
    store: &dyn EventStore,
    run: &str,
    created_ms: i64,
    status: ListingStatus,
) {
    store
        .create(&id(run), meta("agent", created_ms), ev("start"), status)
        .await
        .unwrap();
}

fn claimed(claims: &[Claim]) -> Vec<(&str, u64)> {
    claims
        .iter()
        .map(|l| (l.run_id.as_str(), l.token))
        .collect()
}

pub async fn claims_take_queued_runs_and_runs_whose_driver_died(backend: &dyn Backend) {
    let store = backend.open().await;
    run_with_status(&*store, "q-1", 1, ListingStatus::QUEUED).await;
    run_with_status(&*store, "cli", 2, ListingStatus::RUNNING).await;
    run_with_status(&*store, "q-2", 3, ListingStatus::QUEUED).await;
    run_with_status(&*store, "q-3", 4, ListingStatus::QUEUED).await;
    run_with_status(&*store, "done", 5, ListingStatus::COMPLETED).await;

    // Oldest first, never a run nobody queued (`warden run` drives it).
    let first = store.claim("w1", 0, 100, 1).await.unwrap();
    assert_eq!(claimed(&first), [("q-1", 1)]);
    assert_eq!(first[0].expires_ms, 100);
    assert_eq!(first[0].owner, "w1");
    let rest = store.claim("w2", 0, 100, 10).await.unwrap();
    assert_eq!(claimed(&rest), [("q-2", 1), ("q-3", 1)]);
    assert!(store.claim("w3", 50, 100, 10).await.unwrap().is_empty());
    assert!(store.claim("w3", 50, 100, 0).await.unwrap().is_empty());

    // w1 drives q-1 and parks it; w2 drives q-2 and dies; q-3 finishes.
    store
        .append_fenced(
            &first[0],
            1,
            &[ev("asked")],
            ListingStatus::parked("awaiting_approval").into(),
            10,
        )
        .await
        .unwrap();
    store.release_claim(&first[0], None).await.unwrap();
    store
        .append_fenced(
            &rest[0],
            1,
            &[ev("step")],
            ListingStatus::RUNNING.into(),
            10,
        )
        .await
        .unwrap();
    store
        .append_fenced(
            &rest[1],
            1,
            &[ev("end")],
            ListingStatus::COMPLETED.into(),
            10,
        )
        .await
        .unwrap();
    store.release_claim(&rest[1], None).await.unwrap();

    // Before the dead worker's claim expires nothing is claimable; after, its
    // run is, with the next token.
    assert!(store.claim("w3", 99, 100, 10).await.unwrap().is_empty());
    let taken = store.claim("w3", 100, 100, 10).await.unwrap();
    assert_eq!(claimed(&taken), [("q-2", 2)]);
    assert_fenced(
        store
            .append_fenced(
                &rest[0],
                2,
                &[ev("zombie")],
                ListingStatus::RUNNING.into(),
                101,
            )
            .await
            .unwrap_err(),
        &id("q-2"),
        1,
        2,
    );
    // A human approves the parked run: it is runnable, and any worker
    // continues it.
    store
        .append(
            &id("q-1"),
            2,
            &[ev("approved")],
            ListingStatus::RUNNING.into(),
            120,
        )
        .await
        .unwrap();
    let continued = store.claim("w4", 120, 100, 10).await.unwrap();
    assert_eq!(claimed(&continued), [("q-1", 2)]);
    assert_eq!(store.summary(&id("cli")).await.unwrap().claim_token, 0);
}

/// A worker's run that owes deliveries is claimable once its claim is gone,
/// finished or parked; one that owes none, a run no worker claimed, and one
/// under a live claim are not. The count round-trips through every kind of
/// append, the old holder is fenced, and retention keeps an owing run.
pub async fn claims_take_runs_that_owe_deliveries_and_nothing_else(backend: &dyn Backend) {
    let store = backend.open().await;
    for (run, created) in [("owing", 1), ("settled", 2), ("parked", 3)] {
        run_with_status(&*store, run, created, ListingStatus::QUEUED).await;
    }
    // Driven by `warden run`: never claimed, so never claimed, owing or not.
    run_with_status(&*store, "cli", 4, ListingStatus::RUNNING).await;
    store
        .append(
            &id("cli"),
            1,
            &[ev("end")],
            Listing::new(ListingStatus::COMPLETED).owing(1),
            5,
        )
        .await
        .unwrap();
    let claims = store.claim("w1", 0, 100, 10).await.unwrap();
    assert_eq!(
        claimed(&claims),
        [("owing", 1), ("settled", 1), ("parked", 1)]
    );
    // w1 finishes `owing` and dies before its delivery; finishes `settled`
    // with nothing owed; parks `parked` owing its notice, and dies too.
    let owing = Listing::new(ListingStatus::COMPLETED).owing(2);
    let appended = store
        .append_fenced(&claims[0], 1, &[ev("end")], owing, 10)
        .await
        .unwrap();
    assert_eq!(appended.event_count, 2);
    let summary = store.summary(&id("owing")).await.unwrap();
    assert_eq!(
        (summary.status.as_str(), summary.owes_deliveries),
        ("completed", 2)
    );
    store
        .append_fenced(
            &claims[1],
            1,
            &[ev("end")],
            ListingStatus::COMPLETED.into(),
            10,
        )
        .await
        .unwrap();
    store.release_claim(&claims[1], None).await.unwrap();
    store
        .append_fenced(
            &claims[2],
            1,
            &[ev("asked")],
            Listing::new(ListingStatus::parked("awaiting_approval")).owing(1),
            10,
        )
        .await
        .unwrap();
    let listed: Vec<(String, u32)> = store
        .list(&RunFilter::new())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.run_id.to_string(), r.owes_deliveries))
        .collect();
    assert_eq!(
        listed,
        [
            ("owing".to_owned(), 2),
            ("settled".to_owned(), 0),
            ("parked".to_owned(), 1),
            ("cli".to_owned(), 1)
        ]
    );

    // Nothing is claimable while w1's claims live; then the two runs that
    // owe deliveries are, oldest first, with the next token.
    assert!(store.claim("w2", 99, 100, 10).await.unwrap().is_empty());
    let taken = store.claim("w2", 100, 100, 10).await.unwrap();
    assert_eq!(claimed(&taken), [("owing", 2), ("parked", 2)]);
    assert!(store.claim("w3", 150, 100, 10).await.unwrap().is_empty());
    assert_fenced(
        store
            .append_fenced(
                &claims[0],
                2,
                &[ev("zombie")],
                ListingStatus::COMPLETED.into(),
                101,
            )
            .await
            .unwrap_err(),
        &id("owing"),
        1,
        2,
    );
    assert_eq!(store.load(&id("owing")).await.unwrap().len(), 2);

    // Retention keeps a run that owes deliveries, whatever the filter says.
    let filter = PruneFilter::new()
        .status("completed")
        .status("awaiting_approval")
        .updated_before(1_000);
    let pruned = store.prune(&filter, 500).await.unwrap();
    assert_eq!(
        pruned.iter().map(|t| t.run_id.as_str()).collect::<Vec<_>>(),
        ["settled"]
    );

    // w2 makes one delivery (still owing one), then the last: owing
    // nothing, the released run is claimed no more and may be pruned.
    store
        .append_fenced(
            &taken[0],
            2,
            &[ev("intent")],
            Listing::new(ListingStatus::COMPLETED).owing(1),
            110,
        )
        .await
        .unwrap();
    store
        .append_fenced(
            &taken[0],
            3,
            &[ev("delivered")],
            ListingStatus::COMPLETED.into(),
            120,
        )
        .await
        .unwrap();
    assert_eq!(
        store.summary(&id("owing")).await.unwrap().owes_deliveries,
        0
    );
    store.release_claim(&taken[0], None).await.unwrap();
    let pruned = store.prune(&filter, 500).await.unwrap();
    assert_eq!(
        pruned.iter().map(|t| t.run_id.as_str()).collect::<Vec<_>>(),
        ["owing"]
    );
    // w2's claim on the parked run expired, still owing its notice: it is
    // claimed again; the run that owes nothing is not.
    let again = store.claim("w3", 500, 100, 10).await.unwrap();
    assert_eq!(claimed(&again), [("parked", 3)]);
}

/// A waiting run is a durable timer: claimable once its wake-up time has
/// come and no live claim holds it, whoever parked it (a worker, or
/// `warden run`, which never claims); not before. The wake-up time
/// round-trips through every kind of append and the summary, the next
/// append clears it, and a released or expired claim does not change it.
pub async fn claims_take_waiting_runs_once_they_are_due(backend: &dyn Backend) {
    let store = backend.open().await;
    run_with_status(&*store, "worker", 1, ListingStatus::QUEUED).await;
    run_with_status(&*store, "cli", 2, ListingStatus::RUNNING).await;
    run_with_status(&*store, "later", 3, ListingStatus::RUNNING).await;
    let claims = store.claim("w1", 0, 100, 10).await.unwrap();
    assert_eq!(claimed(&claims), [("worker", 1)]);
    // The worker parks its run until 1000 and releases it; `warden run`
    // parks two runs, until 500 and 5000, and exits.
    store
        .append_fenced(
            &claims[0],
            1,
            &[ev("wait")],
            Listing::new(ListingStatus::WAITING).waking_at(Some(1_000)),
            10,
        )
        .await
        .unwrap();
    store.release_claim(&claims[0], None).await.unwrap();
    for (run, wake) in [("cli", 500), ("later", 5_000)] {
        store
            .append(
                &id(run),
                1,
                &[ev("wait")],
                Listing::new(ListingStatus::WAITING).waking_at(Some(wake)),
                10,
            )
            .await
            .unwrap();
    }
    let summary = store.summary(&id("worker")).await.unwrap();
    assert_eq!(
        (summary.status.as_str(), summary.wake_ms),
        (WAITING, Some(1_000))
    );
    let listed: Vec<(String, Option<i64>)> = store
        .list(&RunFilter::new().status(WAITING))
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.run_id.to_string(), r.wake_ms))
        .collect();
    assert_eq!(
        listed,
        [
            ("worker".to_owned(), Some(1_000)),
            ("cli".to_owned(), Some(500)),
            ("later".to_owned(), Some(5_000))
        ]
    );

    // Nothing is due before 500; then `cli`; at 1000 `worker` too (oldest
    // first among the due), never `later`.
    assert!(store.claim("w2", 499, 100, 10).await.unwrap().is_empty());
    let due = store.claim("w2", 500, 100, 10).await.unwrap();
    assert_eq!(claimed(&due), [("cli", 1)]);
    assert!(
        store.claim("w3", 599, 100, 10).await.unwrap().is_empty(),
        "a live claim holds a due run"
    );
    let due = store.claim("w3", 1_000, 100, 1).await.unwrap();
    assert_eq!(claimed(&due), [("worker", 2)]);
    // The driver ends the wait: the wake-up time goes with the status.
    store
        .append_fenced(
            &due[0],
            2,
            &[ev("woke")],
            ListingStatus::RUNNING.into(),
            1_001,
        )
        .await
        .unwrap();
    assert_eq!(store.summary(&id("worker")).await.unwrap().wake_ms, None);
    store
        .append_fenced(
            &due[0],
            3,
            &[ev("end")],
            ListingStatus::COMPLETED.into(),
            1_002,
        )
        .await
        .unwrap();
    store.release_claim(&due[0], None).await.unwrap();
    // Its claim expires with the run still waiting (the driver died before
    // ending the wait): due, it is claimed again.
    let cli = store.summary(&id("cli")).await.unwrap();
    assert_eq!((cli.status.as_str(), cli.wake_ms), (WAITING, Some(500)));
    let again = store.claim("w4", 1_100, 100, 10).await.unwrap();
    assert_eq!(claimed(&again), [("cli", 2)]);
    assert_eq!(
        store.summary(&id("later")).await.unwrap().claim_token,
        0,
        "not due, never claimed"
    );
}

pub async fn concurrent_claims_never_share_a_run(backend: &dyn Backend) {
    let store = backend.open().await;
    const RUNS: usize = 30;
    for i in 0..RUNS {
        run_with_status(
            &*store,
            &format!("job-{i:02}"),
            i as i64,
            ListingStatus::QUEUED,
        )
        .await;
    }
    let tasks: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = store.claim(&format!("w{w}"), 0, 1_000, 3).await.unwrap();
                    if got.is_empty() {
                        break mine;
                    }
                    mine.extend(got.into_iter().map(|l| l.run_id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    let expected: Vec<RunId> = (0..RUNS).map(|i| id(&format!("job-{i:02}"))).collect();
    assert_eq!(all, expected, "every run claimed exactly once");
}

pub async fn prune_leaves_tombstones_and_keeps_the_id(backend: &dyn Backend) {
    let store = backend.open().await;
    let mut m = meta("agent", 1);
    m.labels.insert("team".into(), "red".into());
    for (run, status, updated) in [
        ("old-done", "completed", 10),
        ("old-failed", "failed", 20),
        ("new-done", "completed", 1_000),
        ("old-parked", "awaiting_approval", 10),
    ] {
        store
            .create(&id(run), m.clone(), ev("start"), ListingStatus::RUNNING)
            .await
            .unwrap();
        store
            .append(&id(run), 1, &[ev("end")], listed(status).into(), updated)
            .await
            .unwrap();
    }
    let before = store.summary(&id("old-done")).await.unwrap();
    let head = store.load(&id("old-done")).await.unwrap()[1].hash;
    // An empty filter prunes nothing.
    assert!(
        store
            .prune(&PruneFilter::new(), 5_000)
            .await
            .unwrap()
            .is_empty()
    );
    let filter = PruneFilter::new()
        .status("completed")
        .status("failed")
        .updated_before(500);
    let pruned = store.prune(&filter, 5_000).await.unwrap();
    let names: Vec<&str> = pruned.iter().map(|t| t.run_id.as_str()).collect();
    assert_eq!(names, ["old-done", "old-failed"]);
    let t = &pruned[0];
    assert_eq!(
        (
            t.agent.as_str(),
            t.status.as_str(),
            t.created_ms,
            t.updated_ms
        ),
        ("agent", "completed", 1, 10)
    );
    assert_eq!((t.event_count, t.head, t.pruned_ms), (2, head, 5_000));
    assert_eq!(before.event_count, 2);

    let run = id("old-done");
    for err in [
        store.load(&run).await.unwrap_err(),
        store.summary(&run).await.unwrap_err(),
        store.verify(&run).await.unwrap_err(),
    ] {
        match &err {
            StoreError::Pruned {
                run_id,
                event_count,
                head: h,
            } => assert_eq!((run_id, *event_count, *h), (&run, 2, head)),
            other => panic!("expected Pruned, got {other:?}"),
        }
    }
    assert_eq!(
        store.load(&run).await.unwrap_err().to_string(),
        format!("run old-done was pruned; its log held 2 events with head {head}")
    );
    // The id stays taken; the rest is gone from listings and untouched.
    let err = store
        .create(&run, meta("a", 1), ev("again"), ListingStatus::RUNNING)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err:?}");
    assert_eq!(
        store.run_ids().await.unwrap(),
        [id("new-done"), id("old-parked")]
    );
    let listed = store
        .list(&RunFilter::new().label("team", "red"))
        .await
        .unwrap();
    assert_eq!(ids(&listed), ["new-done", "old-parked"]);
    assert!(store.verify(&id("new-done")).await.unwrap().is_intact());
    assert!(store.prune(&filter, 6_000).await.unwrap().is_empty());
}

// ---- idempotency commitments ----------------------------------------------

fn holder(run: &str, call: &str) -> Holder {
    Holder {
        run_id: id(run),
        call_id: call.to_owned(),
    }
}

fn settlement(key: &str, h: &Holder, result: &str) -> Settlement {
    Settlement {
        key: key.to_owned(),
        holder: h.clone(),
        outcome: Settle::Result(ev(result)),
    }
}

fn release(key: &str, h: &Holder) -> Settlement {
    Settlement {
        key: key.to_owned(),
        holder: h.clone(),
        outcome: Settle::Release,
    }
}

pub async fn key_claims_grant_the_first_holder_and_name_it_to_others(backend: &dyn Backend) {
    let store = backend.open().await;
    let (a, b) = (holder("a", "call-1-1"), holder("b", "call-2-1"));
    assert_eq!(
        store.claim_commitment("k1", &a).await.unwrap(),
        KeyClaim::Granted
    );
    // The holder again (after its own crash) is granted again.
    assert_eq!(
        store.claim_commitment("k1", &a).await.unwrap(),
        KeyClaim::Granted
    );
    assert_eq!(
        store.claim_commitment("k1", &b).await.unwrap(),
        KeyClaim::Held(a.clone())
    );
    // Keys are independent.
    assert_eq!(
        store.claim_commitment("k2", &b).await.unwrap(),
        KeyClaim::Granted
    );
}

pub async fn settling_appends_and_records_the_result_for_everyone_after(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("payer");
    new_run(&*store, &run, 2).await;
    let a = holder("payer", "call-1-1");
    store.claim_commitment("claim-7", &a).await.unwrap();
    let appended = store
        .append_settling(
            SettlingAppend::new(
                &run,
                2,
                &[ev("payer:3")],
                &settlement("claim-7", &a, "{\"paid\":true}"),
            )
            .listing(ListingStatus::RUNNING.into())
            .at(3),
        )
        .await
        .unwrap();
    assert_eq!(appended.event_count, 3);
    let settled = KeyClaim::Settled {
        holder: a.clone(),
        result: ev("{\"paid\":true}"),
    };
    assert_eq!(
        store
            .claim_commitment("claim-7", &holder("other", "call-1-1"))
            .await
            .unwrap(),
        settled
    );
    assert_eq!(
        store.claim_commitment("claim-7", &a).await.unwrap(),
        settled
    );
}

pub async fn settling_needs_the_unsettled_key_and_writes_nothing_otherwise(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("r");
    new_run(&*store, &run, 1).await;
    let (a, b) = (holder("r", "call-1-1"), holder("s", "call-1-1"));
    let not_held = |err: StoreError| matches!(err, StoreError::CommitmentNotHeld { .. });
    // Never claimed.
    let err = store
        .append_settling(
            SettlingAppend::new(&run, 1, &[ev("r:2")], &settlement("k", &a, "x"))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap_err();
    assert!(not_held(err));
    // Claimed by someone else.
    store.claim_commitment("k", &b).await.unwrap();
    let err = store
        .append_settling(
            SettlingAppend::new(&run, 1, &[ev("r:2")], &settlement("k", &a, "x"))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap_err();
    assert!(not_held(err));
    assert_eq!(store.load(&run).await.unwrap().len(), 1, "nothing written");
    // A conflicting append settles nothing.
    store.claim_commitment("mine", &a).await.unwrap();
    let err = store
        .append_settling(
            SettlingAppend::new(&run, 5, &[ev("r:2")], &settlement("mine", &a, "x"))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert_eq!(
        store.claim_commitment("mine", &a).await.unwrap(),
        KeyClaim::Granted,
        "still unsettled"
    );
    // Settled once; a second settlement is refused.
    store
        .append_settling(
            SettlingAppend::new(&run, 1, &[ev("r:2")], &settlement("mine", &a, "x"))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap();
    let err = store
        .append_settling(
            SettlingAppend::new(&run, 2, &[ev("r:3")], &settlement("mine", &a, "y"))
                .listing(ListingStatus::RUNNING.into())
                .at(3),
        )
        .await
        .unwrap_err();
    assert!(not_held(err));
    assert_eq!(store.load(&run).await.unwrap().len(), 2);
}

pub async fn commitments_are_listed_by_key_and_by_run(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("lister");
    new_run(&*store, &run, 1).await;
    let (a, b) = (holder("lister", "call-1-1"), holder("other", "call-2-1"));
    assert_eq!(
        store.commitments(&CommitmentFilter::new()).await.unwrap(),
        []
    );
    store.claim_commitment("k-b", &a).await.unwrap();
    store.claim_commitment("k-a", &b).await.unwrap();
    store.claim_commitment("k-c", &a).await.unwrap();
    store
        .append_settling(
            SettlingAppend::new(
                &run,
                1,
                &[ev("lister:2")],
                &settlement("k-c", &a, "{\"ok\":1}"),
            )
            .listing(ListingStatus::RUNNING.into())
            .at(2),
        )
        .await
        .unwrap();
    let listed = |key: &str, h: &Holder, result: Option<&str>| Commitment {
        key: key.to_owned(),
        holder: h.clone(),
        result: result.map(ev),
    };
    assert_eq!(
        store.commitments(&CommitmentFilter::new()).await.unwrap(),
        [
            listed("k-a", &b, None),
            listed("k-b", &a, None),
            listed("k-c", &a, Some("{\"ok\":1}")),
        ]
    );
    assert_eq!(
        store
            .commitments(&CommitmentFilter::new().run(id("lister")))
            .await
            .unwrap(),
        [
            listed("k-b", &a, None),
            listed("k-c", &a, Some("{\"ok\":1}"))
        ]
    );
    assert_eq!(
        store
            .commitments(&CommitmentFilter::new().key("k-a"))
            .await
            .unwrap(),
        [listed("k-a", &b, None)]
    );
    assert_eq!(
        store
            .commitments(&CommitmentFilter::new().key("k-a").run(id("lister")))
            .await
            .unwrap(),
        []
    );
}

pub async fn a_release_frees_the_key_for_the_next_claimant(backend: &dyn Backend) {
    let store = backend.open().await;
    let run = id("freer");
    new_run(&*store, &run, 1).await;
    let (a, b) = (holder("freer", "call-1-1"), holder("next", "call-1-1"));
    let not_held = |err: StoreError| matches!(err, StoreError::CommitmentNotHeld { .. });
    // Only the holder may release: nothing is written otherwise.
    store.claim_commitment("failed", &a).await.unwrap();
    let err = store
        .append_settling(
            SettlingAppend::new(&run, 1, &[ev("freer:2")], &release("failed", &b))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap_err();
    assert!(not_held(err));
    assert_eq!(store.load(&run).await.unwrap().len(), 1, "nothing written");
    // An unsettled key (a call that failed) is released with its events.
    store
        .append_settling(
            SettlingAppend::new(&run, 1, &[ev("freer:2")], &release("failed", &a))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap();
    assert_eq!(store.load(&run).await.unwrap().len(), 2);
    assert_eq!(
        store.claim_commitment("failed", &b).await.unwrap(),
        KeyClaim::Granted,
        "the next claimant runs the call"
    );
    // A settled key may be released too (an operator's choice).
    store.claim_commitment("done", &a).await.unwrap();
    store
        .append_settling(
            SettlingAppend::new(&run, 2, &[ev("freer:3")], &settlement("done", &a, "r"))
                .listing(ListingStatus::RUNNING.into())
                .at(3),
        )
        .await
        .unwrap();
    store
        .append_settling(
            SettlingAppend::new(&run, 3, &[ev("freer:4")], &release("done", &a))
                .listing(ListingStatus::COMPLETED.into())
                .at(4),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .commitments(&CommitmentFilter::new().run(id("freer")))
            .await
            .unwrap(),
        []
    );
    // A release that conflicts releases nothing.
    store.claim_commitment("kept", &a).await.unwrap();
    let err = store
        .append_settling(
            SettlingAppend::new(&run, 9, &[ev("freer:5")], &release("kept", &a))
                .listing(ListingStatus::COMPLETED.into())
                .at(5),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert_eq!(
        store.claim_commitment("kept", &b).await.unwrap(),
        KeyClaim::Held(a)
    );
}

pub async fn racing_key_claims_grant_exactly_one(backend: &dyn Backend) {
    let store = backend.open().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .claim_commitment("contested", &holder(&format!("run-{i}"), "call-1-1"))
                .await
                .unwrap()
        }));
    }
    let mut granted = 0;
    for task in tasks {
        if task.await.unwrap() == KeyClaim::Granted {
            granted += 1;
        }
    }
    assert_eq!(granted, 1);
}

pub async fn commitments_survive_reopening(backend: &dyn Backend) {
    let a = holder("kept", "call-1-1");
    {
        let store = backend.open().await;
        let run = id("kept");
        new_run(&*store, &run, 1).await;
        store.claim_commitment("durable", &a).await.unwrap();
        store
            .append_settling(
                SettlingAppend::new(&run, 1, &[ev("kept:2")], &settlement("durable", &a, "r"))
                    .listing(ListingStatus::RUNNING.into())
                    .at(2),
            )
            .await
            .unwrap();
        store.claim_commitment("pending", &a).await.unwrap();
    }
    let store = backend.open().await;
    assert_eq!(
        store
            .claim_commitment("durable", &holder("x", "y"))
            .await
            .unwrap(),
        KeyClaim::Settled {
            holder: a.clone(),
            result: ev("r")
        }
    );
    assert_eq!(
        store
            .claim_commitment("pending", &holder("x", "y"))
            .await
            .unwrap(),
        KeyClaim::Held(a)
    );
}

fn rule(id: &str, created_ms: i64, expires_ms: Option<i64>) -> ApprovalRule {
    ApprovalRule {
        id: id.to_owned(),
        spec: format!(r#"{{"tool":"fs__write_file","n":"{id}"}}"#),
        created_by: "api:ops".to_owned(),
        created_ms,
        expires_ms,
        revoked: None,
    }
}

pub async fn rules_are_added_listed_and_revoked_once(backend: &dyn Backend) {
    let store = backend.open().await;
    assert_eq!(store.rules().await.unwrap(), []);
    let (b, a) = (rule("rule-b", 10, None), rule("rule-a", 20, Some(1_000)));
    store.add_rule(&b).await.unwrap();
    store.add_rule(&a).await.unwrap();
    // A taken id writes nothing.
    let mut other = rule("rule-b", 30, None);
    other.spec = "{}".into();
    assert!(matches!(
        store.add_rule(&other).await,
        Err(StoreError::RuleExists { id }) if id == "rule-b"
    ));
    // Oldest first, every column kept.
    assert_eq!(store.rules().await.unwrap(), [b.clone(), a.clone()]);
    assert_eq!(store.rule("rule-a").await.unwrap(), Some(a.clone()));
    assert_eq!(store.rule("rule-z").await.unwrap(), None);
    assert_eq!(a.standing(999), RuleStanding::Live);
    assert_eq!(a.standing(1_000), RuleStanding::Expired);

    let revoked = store.revoke_rule("rule-a", "api:alice", 500).await.unwrap();
    let first = Revocation {
        by: "api:alice".into(),
        at_ms: 500,
    };
    assert_eq!(revoked.revoked, Some(first.clone()));
    assert_eq!(revoked.standing(600), RuleStanding::Revoked);
    // Revoking again keeps the first revocation.
    let again = store.revoke_rule("rule-a", "api:bob", 700).await.unwrap();
    assert_eq!(again.revoked, Some(first.clone()));
    assert_eq!(
        store.rule("rule-a").await.unwrap().unwrap().revoked,
        Some(first)
    );
    assert!(matches!(
        store.revoke_rule("rule-z", "api:alice", 1).await,
        Err(StoreError::UnknownRule { id }) if id == "rule-z"
    ));
    // A revoked rule stays listed, for the audit trail that names it.
    assert_eq!(store.rules().await.unwrap().len(), 2);
    assert_eq!(store.rule("rule-b").await.unwrap().unwrap().revoked, None);
}

pub async fn rules_are_shared_by_every_store_on_the_data(backend: &dyn Backend) {
    // Two store values over the same data, as two hosts: what one writes,
    // the other reads at once.
    let first = backend.open().await;
    let second = backend.open().await;
    first.add_rule(&rule("rule-1", 1, None)).await.unwrap();
    assert_eq!(
        second.rule("rule-1").await.unwrap(),
        Some(rule("rule-1", 1, None))
    );
    second.revoke_rule("rule-1", "api:ops", 2).await.unwrap();
    assert_eq!(
        first.rule("rule-1").await.unwrap().unwrap().standing(3),
        RuleStanding::Revoked
    );
    drop((first, second));
    let reopened = backend.open().await;
    assert_eq!(
        reopened.rule("rule-1").await.unwrap().unwrap().revoked,
        Some(Revocation {
            by: "api:ops".into(),
            at_ms: 2
        })
    );
}

// ---- sealed rows (see `store/sealed.rs`) ----

/// The key the sealed-row tests open the keyed store with.
fn seal_key() -> ChainKey {
    ChainKey::new(&[0x5e; 32]).unwrap()
}

/// The store under test, keyed or not.
async fn open_as(backend: &dyn Backend, keyed: bool) -> Arc<dyn EventStore> {
    if keyed {
        backend.open_keyed(seal_key()).await
    } else {
        backend.open().await
    }
}

/// Asserts `result` is a [`StoreError::RowTampered`] naming `table` and `row`.
fn assert_row_tampered<T: std::fmt::Debug>(result: Result<T, StoreError>, table: &str, row: &str) {
    match result {
        Err(StoreError::RowTampered {
            table: t, row: r, ..
        }) if t == table && r == row => {}
        other => panic!("expected {table} row {row} to be refused as tampered, got {other:?}"),
    }
}

/// The findings of a store's check of its sealed rows, as (table, row).
async fn row_findings(store: &dyn EventStore) -> Vec<(String, String)> {
    store
        .verify_rows()
        .await
        .unwrap()
        .findings
        .into_iter()
        .map(|f| (f.table.to_owned(), f.row))
        .collect()
}

/// A rule widened in the database approves nothing: every read that would
/// act on it (list, read, revoke) is refused naming it, the other rules
/// still read, and the store's check reports exactly it. With a key and
/// without (the plain seal catches whoever does not recompute it).
pub async fn a_widened_rule_is_refused_and_reported(backend: &dyn Backend) {
    for keyed in [true, false] {
        let store = open_as(backend, keyed).await;
        let (narrow, other) = (rule("rule-narrow", 1, None), rule("rule-other", 2, None));
        store.add_rule(&narrow).await.unwrap();
        store.add_rule(&other).await.unwrap();
        let report = store.verify_rows().await.unwrap();
        assert!(report.is_intact(), "{report:?}");
        assert!(report.tables.contains(&(crate::RULES, 2)), "{report:?}");
        backend
            .tamper_row(
                keyed,
                RowTamper::RuleSpec {
                    id: "rule-narrow".into(),
                    spec: r#"{"tool":"*"}"#.into(),
                },
            )
            .await;
        assert_row_tampered(store.rules().await, "approval_rules", "rule-narrow");
        assert_row_tampered(
            store.rule("rule-narrow").await,
            "approval_rules",
            "rule-narrow",
        );
        assert_row_tampered(
            store.revoke_rule("rule-narrow", "api:ops", 3).await,
            "approval_rules",
            "rule-narrow",
        );
        assert_eq!(store.rule("rule-other").await.unwrap(), Some(other));
        assert_eq!(
            row_findings(&*store).await,
            [("approval_rules".to_owned(), "rule-narrow".to_owned())]
        );
        // The refused revocation resealed nothing.
        assert_row_tampered(
            store.rule("rule-narrow").await,
            "approval_rules",
            "rule-narrow",
        );
    }
}

/// A settled result rewritten in the database is given to nobody: a later
/// claimant of the key, the holder itself and the listing are refused
/// naming the key, and the store's check reports exactly it.
pub async fn a_rewritten_commitment_result_is_refused_and_reported(backend: &dyn Backend) {
    let store = open_as(backend, true).await;
    let run = id("payer");
    new_run(&*store, &run, 1).await;
    let a = holder("payer", "call-1-1");
    store.claim_commitment("pay-1", &a).await.unwrap();
    store
        .append_settling(
            SettlingAppend::new(&run, 1, &[ev("payer:2")], &settlement("pay-1", &a, "paid"))
                .listing(ListingStatus::RUNNING.into())
                .at(2),
        )
        .await
        .unwrap();
    store.claim_commitment("pay-2", &a).await.unwrap();
    assert!(store.verify_rows().await.unwrap().is_intact());
    backend
        .tamper_row(
            true,
            RowTamper::CommitmentResult {
                key: "pay-1".into(),
                result: b"forged".to_vec(),
            },
        )
        .await;
    assert_row_tampered(
        store
            .claim_commitment("pay-1", &holder("later", "call-1-1"))
            .await,
        "commitments",
        "pay-1",
    );
    assert_row_tampered(
        store.claim_commitment("pay-1", &a).await,
        "commitments",
        "pay-1",
    );
    assert_row_tampered(
        store.commitments(&CommitmentFilter::new()).await,
        "commitments",
        "pay-1",
    );
    // The untouched key still works.
    assert_eq!(
        store.claim_commitment("pay-2", &a).await.unwrap(),
        KeyClaim::Granted
    );
    assert_eq!(
        row_findings(&*store).await,
        [("commitments".to_owned(), "pay-1".to_owned())]
    );
}

/// A seal is bound to its row: copied onto another row of the same table
/// (from another rule, from another commitment with the same holder), it
/// does not match, and neither does a row settled with another row's seal.
pub async fn a_seal_copied_from_another_row_is_caught(backend: &dyn Backend) {
    let store = open_as(backend, true).await;
    store.add_rule(&rule("rule-a", 1, None)).await.unwrap();
    store.add_rule(&rule("rule-b", 2, None)).await.unwrap();
    let a = holder("payer", "call-1-1");
    store.claim_commitment("key-a", &a).await.unwrap();
    store.claim_commitment("key-b", &a).await.unwrap();
    backend
        .tamper_row(
            true,
            RowTamper::CopySeal {
                table: crate::RULES,
                from: "rule-a".into(),
                to: "rule-b".into(),
            },
        )
        .await;
    backend
        .tamper_row(
            true,
            RowTamper::CopySeal {
                table: crate::COMMITMENTS,
                from: "key-a".into(),
                to: "key-b".into(),
            },
        )
        .await;
    assert!(store.rule("rule-a").await.unwrap().is_some());
    assert_row_tampered(store.rule("rule-b").await, "approval_rules", "rule-b");
    assert_eq!(
        store.claim_commitment("key-a", &a).await.unwrap(),
        KeyClaim::Granted
    );
    assert_row_tampered(
        store.claim_commitment("key-b", &a).await,
        "commitments",
        "key-b",
    );
    assert_eq!(
        row_findings(&*store).await,
        [
            ("approval_rules".to_owned(), "rule-b".to_owned()),
            ("commitments".to_owned(), "key-b".to_owned())
        ]
    );
}

/// A store written before seals existed has its rules and commitments
/// sealed, as found, by the migration that adds them (with the store's key):
/// they read back and check out, and an edit after it is caught.
pub async fn rows_written_before_seals_are_sealed_when_migrated(backend: &dyn Backend) {
    let a = holder("payer", "call-1-1");
    {
        let store = open_as(backend, true).await;
        store.add_rule(&rule("rule-old", 1, None)).await.unwrap();
        let run = id("payer");
        new_run(&*store, &run, 1).await;
        store.claim_commitment("old-key", &a).await.unwrap();
        store
            .append_settling(
                SettlingAppend::new(&run, 1, &[ev("payer:2")], &settlement("old-key", &a, "r"))
                    .listing(ListingStatus::RUNNING.into())
                    .at(2),
            )
            .await
            .unwrap();
    }
    backend.tamper_row(true, RowTamper::Unseal).await;
    let store = open_as(backend, true).await;
    assert_eq!(
        store.rule("rule-old").await.unwrap(),
        Some(rule("rule-old", 1, None))
    );
    assert_eq!(
        store
            .claim_commitment("old-key", &holder("later", "c"))
            .await
            .unwrap(),
        KeyClaim::Settled {
            holder: a,
            result: ev("r")
        }
    );
    let report = store.verify_rows().await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.tables, [(crate::RULES, 1), (crate::COMMITMENTS, 1)]);
    backend
        .tamper_row(
            true,
            RowTamper::RuleSpec {
                id: "rule-old".into(),
                spec: "{}".into(),
            },
        )
        .await;
    assert_row_tampered(store.rule("rule-old").await, "approval_rules", "rule-old");
}

// ---- session history chunks (see `store/history.rs`) ----

/// A chain `a ← b ← c` of chunks, their bodies tagged with `tag`.
fn chain_of(tag: &str) -> [HistoryChunk; 3] {
    let a = HistoryChunk::new(None, ev(&format!("{tag}: first turn")));
    let b = HistoryChunk::new(Some(*a.digest()), ev(&format!("{tag}: second turn")));
    let c = HistoryChunk::new(Some(*b.digest()), ev(&format!("{tag}: third turn")));
    [a, b, c]
}

fn three_chunks() -> [HistoryChunk; 3] {
    chain_of("chat")
}

/// Creates `run` carrying `chunks`.
async fn create_with_history(
    store: &dyn EventStore,
    run: &str,
    chunks: &[HistoryChunk],
) -> Result<crate::Appended, StoreError> {
    let mut m = meta("agent", 1);
    m.history = chunks.to_vec();
    store
        .create(&id(run), m, ev("start"), ListingStatus::RUNNING)
        .await
}

fn assert_history_broken(
    result: Result<impl std::fmt::Debug, StoreError>,
    head: &HistoryChunk,
    at: &HistoryChunk,
) {
    match result {
        Err(StoreError::HistoryBroken { head: h, at: a, .. }) => {
            assert_eq!((h, a), (*head.digest(), *at.digest()));
        }
        other => panic!("expected HistoryBroken at {:?}, got {other:?}", at.digest()),
    }
}

pub async fn history_written_with_creates_loads_back_as_one_chain(backend: &dyn Backend) {
    let store = backend.open().await;
    let [a, b, c] = three_chunks();
    create_with_history(&*store, "one", std::slice::from_ref(&a))
        .await
        .unwrap();
    // A later create brings the chunks after the stored ones, and may
    // repeat a stored one: it is kept as it is.
    create_with_history(&*store, "two", &[a.clone(), b.clone(), c.clone()])
        .await
        .unwrap();
    assert_eq!(
        store.load_history(c.digest()).await.unwrap(),
        [a.clone(), b.clone(), c.clone()]
    );
    assert_eq!(
        store.load_history(a.digest()).await.unwrap(),
        std::slice::from_ref(&a)
    );
    assert_eq!(
        store.load_history(b.digest()).await.unwrap(),
        [a.clone(), b.clone()]
    );
    // A head the store never held.
    let stray = HistoryChunk::new(None, ev("never written"));
    assert_history_broken(store.load_history(stray.digest()).await, &stray, &stray);
}

pub async fn a_create_whose_history_does_not_link_writes_nothing(backend: &dyn Backend) {
    let store = backend.open().await;
    let [a, b, c] = three_chunks();
    // `b` links to `a`, which is neither stored nor given.
    assert_history_broken(
        create_with_history(&*store, "orphan", &[b.clone(), c.clone()]).await,
        &c,
        &a,
    );
    assert!(matches!(
        store.load(&id("orphan")).await,
        Err(StoreError::UnknownRun { .. })
    ));
    assert_history_broken(store.load_history(b.digest()).await, &b, &b);
    // A create refused for another reason writes none of its chunks either.
    create_with_history(&*store, "taken", &[]).await.unwrap();
    assert!(matches!(
        create_with_history(&*store, "taken", std::slice::from_ref(&a)).await,
        Err(StoreError::AlreadyExists { .. })
    ));
    assert_history_broken(store.load_history(a.digest()).await, &a, &a);
}

pub async fn tampered_history_is_detected(backend: &dyn Backend) {
    let store = backend.open().await;
    // Which chunk is damaged and how (0 is `a`, the oldest), and the chunk
    // the store names.
    let cases = [
        (1, HistoryTamper::Edit(b"edited".to_vec()), 1),
        (1, HistoryTamper::Relink(None), 1),
        (
            1,
            HistoryTamper::Relink(Some(HistoryDigest::from_stored(&[7; 32]).unwrap())),
            1,
        ),
        (0, HistoryTamper::Delete, 0),
    ];
    for (i, (damaged, tamper, at)) in cases.into_iter().enumerate() {
        // Each case has a chain of its own, so one's damage is not another's.
        let run = format!("damaged-{i}");
        let chain = chain_of(&run);
        create_with_history(&*store, &run, &chain).await.unwrap();
        backend
            .tamper_history(chain[damaged].digest(), tamper.clone())
            .await;
        assert_history_broken(
            store.load_history(chain[2].digest()).await,
            &chain[2],
            &chain[at],
        );
        // The run's own log is untouched and still loads.
        store.load(&id(&run)).await.unwrap();
        if damaged > 0 {
            assert_eq!(
                store.load_history(chain[0].digest()).await.unwrap(),
                [chain[0].clone()]
            );
        }
    }
}

pub async fn history_survives_reopening(backend: &dyn Backend) {
    let [a, b, c] = three_chunks();
    let store = backend.open().await;
    create_with_history(&*store, "kept", &[a.clone(), b.clone(), c.clone()])
        .await
        .unwrap();
    drop(store);
    let reopened = backend.open().await;
    assert_eq!(reopened.load_history(c.digest()).await.unwrap(), [a, b, c]);
}

pub async fn pruning_deletes_the_history_no_remaining_run_reaches(backend: &dyn Backend) {
    let store = backend.open().await;
    let [a, b, c] = chain_of("pruned");
    let x = HistoryChunk::new(None, ev("another session's turn"));
    // (run, chunks it brings, the head it names, when it ended)
    let runs: [(&str, Vec<HistoryChunk>, &HistoryChunk, i64); 5] = [
        ("one", vec![a.clone()], &a, 10),
        ("two", vec![b.clone()], &b, 10),
        ("three", vec![c.clone()], &c, 1_000),
        ("lone", vec![x.clone()], &x, 10),
        // A fork: it names a stored head and brings nothing.
        ("fork", vec![], &b, 1_000),
    ];
    for (run, chunks, head, ended) in runs {
        let mut m = meta("agent", 1);
        m.history = chunks;
        m.history_head = Some(*head.digest());
        store
            .create(&id(run), m, ev("start"), ListingStatus::RUNNING)
            .await
            .unwrap();
        store
            .append(&id(run), 1, &[ev("end")], listed("completed").into(), ended)
            .await
            .unwrap();
    }
    let early = PruneFilter::new().status("completed").updated_before(500);
    let pruned = store.prune(&early, 5_000).await.unwrap();
    assert_eq!(pruned.len(), 3);
    // What the remaining runs reach stays; the lone session's turn is gone.
    assert_eq!(
        store.load_history(c.digest()).await.unwrap(),
        [a.clone(), b.clone(), c.clone()]
    );
    assert_history_broken(store.load_history(x.digest()).await, &x, &x);
    // A run naming a head the store no longer holds is refused whole.
    let mut late = meta("agent", 1);
    late.history_head = Some(*x.digest());
    assert_history_broken(
        store
            .create(&id("late"), late, ev("start"), ListingStatus::RUNNING)
            .await,
        &x,
        &x,
    );
    assert!(matches!(
        store.load(&id("late")).await,
        Err(StoreError::UnknownRun { .. })
    ));
    // Once no run is left, no chunk is.
    let all = PruneFilter::new().status("completed").updated_before(5_000);
    assert_eq!(store.prune(&all, 5_000).await.unwrap().len(), 2);
    for chunk in [&a, &b, &c] {
        assert_history_broken(store.load_history(chunk.digest()).await, chunk, chunk);
    }
}

pub async fn export_cursors_move_forward_per_reader_and_run(backend: &dyn Backend) {
    let store = backend.open().await;
    assert!(store.export_cursors("otel").await.unwrap().is_empty());
    store
        .advance_export_cursor("otel", &id("run-a"), 3)
        .await
        .unwrap();
    store
        .advance_export_cursor("otel", &id("run-b"), 1)
        .await
        .unwrap();
    // A slower reader's advance never moves a cursor back.
    store
        .advance_export_cursor("otel", &id("run-a"), 2)
        .await
        .unwrap();
    store
        .advance_export_cursor("other", &id("run-a"), 7)
        .await
        .unwrap();
    assert_eq!(
        store.export_cursors("otel").await.unwrap(),
        BTreeMap::from([(id("run-a"), 3), (id("run-b"), 1)])
    );
    assert_eq!(
        store.export_cursors("other").await.unwrap(),
        BTreeMap::from([(id("run-a"), 7)])
    );
}

pub async fn export_cursors_survive_reopening(backend: &dyn Backend) {
    let first = backend.open().await;
    first
        .advance_export_cursor("otel", &id("run-a"), 5)
        .await
        .unwrap();
    drop(first);
    let reopened = backend.open().await;
    assert_eq!(
        reopened.export_cursors("otel").await.unwrap(),
        BTreeMap::from([(id("run-a"), 5)])
    );
}
