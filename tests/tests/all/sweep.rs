//! The every-boundary crash sweep the recovery tests of child runs
//! (`children`), batches (`batches`) and plans (`plans`) share: a run (and
//! the children it starts) crashed at each of its appends in turn, at both
//! crash points, on a fresh store of one kind, then handed to the test's
//! own check in a new runtime, as a new process would find it. Each test
//! keeps its assertions; the set-up (the store, the crash, the normalised
//! logs to compare with an uninterrupted run) is written here once.
//!
//! A boundary is named by its run and the append's place in that run's
//! log, never by its place among all appends: children run at once, so
//! the order of appends across runs differs from one drive to the next,
//! and a count over all of them would visit some boundaries twice and
//! others never.

use std::sync::Arc;

use serde_json::Value;
use warden::engine::events::Event;
use warden::engine::{Agent, RunId, RunStatus, Runtime, StartOptions};
use warden::store::{EventStore, MemoryStore, SqliteStore};

use super::engine::{CrashPoint, Fixture, counting, crashing_in, normalized, runtime};
use super::workers::PgSchema;

/// A run to crash at every boundary.
pub(crate) struct Sweep<'a> {
    /// Its directory holds the SQLite files; its effects log
    /// (`work/effects.log`) is removed before each case.
    pub(crate) fx: &'a Fixture,
    /// The agent started and recovered.
    pub(crate) agent: &'a Agent,
    /// The runs whose logs are compared: the one started first, then the
    /// children it starts.
    pub(crate) runs: Vec<RunId>,
    /// The run's input.
    pub(crate) input: Value,
    /// `memory`, `sqlite` or `postgres`: each case gets a fresh store of
    /// this kind.
    pub(crate) store: &'a str,
    /// Names each case's SQLite file and PostgreSQL schema.
    pub(crate) name: &'a str,
}

/// One case of a sweep, after its crash.
pub(crate) struct Crashed {
    /// Names the store and the crash, for assertion messages.
    pub(crate) case: String,
    /// The store the crashed driver wrote to.
    pub(crate) store: Arc<dyn EventStore>,
    /// A new runtime over that store: the next process.
    pub(crate) rt: Runtime,
}

/// The normalised logs of `runs` in `store`, in that order.
pub(crate) async fn logs(store: &Arc<dyn EventStore>, runs: &[RunId]) -> Vec<Vec<Event>> {
    let rt = runtime(store.clone());
    let mut all = Vec::new();
    for run in runs {
        all.push(normalized(&rt.events(run).await.unwrap()));
    }
    all
}

impl Sweep<'_> {
    /// The run started and driven to its end without a crash, on a memory
    /// store: that store, and the normalised logs every recovered case is
    /// compared with.
    pub(crate) async fn uninterrupted(&self) -> (Arc<dyn EventStore>, Vec<Vec<Event>>) {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
        self.complete(store.clone()).await;
        let logs = self.logs(&store).await;
        (store, logs)
    }

    /// The run started and driven to its end on `store`, without a crash.
    async fn complete(&self, store: Arc<dyn EventStore>) {
        let rt = runtime(store);
        rt.start(self.agent, self.input.clone(), self.started())
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&self.runs[0], self.agent).await.unwrap(),
            RunStatus::Completed
        );
    }

    /// The normalised logs of the swept runs in `store`.
    pub(crate) async fn logs(&self, store: &Arc<dyn EventStore>) -> Vec<Vec<Event>> {
        logs(store, &self.runs).await
    }

    /// How many appends each run makes uninterrupted: `create` writes each
    /// log's first event, and an append may carry more than one. A run
    /// that appends without being swept fails here, so a sweep cannot leave
    /// a run's boundaries out unnoticed.
    async fn appends(&self) -> Vec<(RunId, u64)> {
        let store = counting();
        self.complete(store.clone()).await;
        let mut counts = store.hooks.per_run();
        let per_run = self
            .runs
            .iter()
            .map(|run| (run.clone(), counts.remove(run).unwrap_or(0)))
            .collect();
        assert!(
            counts.is_empty(),
            "{}: runs append that the sweep does not name: {counts:?}",
            self.name
        );
        per_run
    }

    /// For each run, each append it makes uninterrupted and each crash
    /// point: a fresh store, the first run started and driven until the
    /// driver dies at that append of that run, then `check` with a new
    /// runtime over the store. Returns the number of cases visited, which
    /// the caller asserts, so a sweep cannot come to visit fewer boundaries
    /// unnoticed.
    pub(crate) async fn crash_at_every_boundary(&self, mut check: impl AsyncFnMut(Crashed)) -> u64 {
        let mut visited = 0;
        for (n, (run, appends)) in self.appends().await.into_iter().enumerate() {
            for at in 0..appends {
                for point in [CrashPoint::BeforeWrite, CrashPoint::AfterWrite] {
                    visited += 1;
                    let case = format!("{}: crash at append {at} of {run} {point:?}", self.store);
                    let _ = std::fs::remove_file(self.fx.path("work/effects.log"));
                    // Dropped (its schema with it) at the end of the case.
                    let pg;
                    let inner: Arc<dyn EventStore> = match self.store {
                        "memory" => Arc::new(MemoryStore::new()),
                        "sqlite" => Arc::new(
                            SqliteStore::open(
                                self.fx
                                    .path(&format!("{}-{n}-{at}-{point:?}.db", self.name)),
                            )
                            .unwrap(),
                        ),
                        "postgres" => {
                            pg = PgSchema::new(self.name).await.unwrap();
                            Arc::new(pg.store().await)
                        }
                        other => panic!("no store `{other}`"),
                    };
                    let crashing =
                        runtime(crashing_in(inner.clone(), Some(run.clone()), at, point));
                    crashing
                        .start(self.agent, self.input.clone(), self.started())
                        .await
                        .unwrap();
                    match crashing.drive(&self.runs[0], self.agent).await {
                        Err(err) => {
                            assert!(err.to_string().contains("injected crash"), "{case}: {err}")
                        }
                        Ok(status) => {
                            panic!("{case}: the drive ended {status:?} without making that append")
                        }
                    }
                    drop(crashing);

                    check(Crashed {
                        case,
                        store: inner.clone(),
                        rt: runtime(inner),
                    })
                    .await;
                }
            }
        }
        eprintln!("{} on {}: {visited} crash cases", self.name, self.store);
        visited
    }

    fn started(&self) -> StartOptions {
        StartOptions::new().id(self.runs[0].clone())
    }
}
