//! Worker throughput: runs per second and step latency (p50/p99) when 1, 2
//! and 4 workers share a queue of scripted runs on PostgreSQL, beside one
//! worker on SQLite. Each worker has its own runtime and its own store
//! connection pool, as separate processes would; each drives up to 4 runs
//! at once; last, 4 workers drive one run each (as many runs in flight as
//! one worker of 4, so that what differs is what more workers add). A
//! step is one logical operation (a model call or a tool call: intent,
//! effect, completion), timed between consecutive completions of a run.
//! Per step it prints the appends (and the deferred ones), and on
//! PostgreSQL the commits (deferred ones: not waiting for the WAL flush),
//! round trips and read snapshots the workers' stores counted.
//!
//! `cargo bench -p warden-tests --bench workers` (`WORKERS_BENCH_RUNS`,
//! default 400; PostgreSQL at `WARDEN_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warden::engine::StartOptions;

use bytes::Bytes;
use serde_json::json;
use sha2::Digest;
use warden::engine::{Agent, RunId, Runtime, decode};
use warden::plugins::PluginHost;
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::{
    Claim, Durability, EventStore, PostgresStats, PostgresStore, RunFilter, SqliteStore,
};
use warden::worker::Worker;
use warden_tests::guests;

use warden::store::testing::{AppendVia, Hooks, Intercepted};

#[path = "table.rs"]
mod table;
use crate::table::Row;

/// A store a worker opened; the PostgreSQL one also as itself, for its
/// counts.
struct Opened {
    store: Arc<dyn EventStore>,
    postgres: Option<PostgresStore>,
}

/// What one configuration measured.
struct Measured {
    runs_per_s: f64,
    p50_ms: f64,
    steps: usize,
    /// Summed over the workers' stores.
    postgres: Option<PostgresStats>,
}

fn main() {
    run();
}

/// Measures and prints; returns the targets for the table.
pub(crate) fn run() -> Vec<Row> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut measured = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let sandbox = Sandbox::new(SandboxConfig {
            cache_dir: Some(std::env::temp_dir().join("warden-bench-components")),
            max_concurrent_leases: 64,
            ..SandboxConfig::default()
        })
        .unwrap();
        let runs: usize = std::env::var("WORKERS_BENCH_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(400);
        let agent = agent(dir.path());
        let url = std::env::var("WARDEN_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        println!(
            "{runs} runs of 5 steps (2 no-op tool calls, 3 model calls), 4 at once per worker unless said"
        );
        let sqlite = dir.path().join("bench.db");
        let opened = SqliteStore::open(&sqlite).unwrap();
        drop(opened);
        bench("sqlite, 1 worker", runs, &agent, &sandbox, (1, 4), || {
            let path = sqlite.clone();
            async move {
                Opened {
                    store: Arc::new(SqliteStore::open(path).unwrap()),
                    postgres: None,
                }
            }
        })
        .await;
        // Last, 4 workers driving one run each: as many runs in flight as
        // 1 worker driving 4, so what differs is what the workers add.
        for (workers, each) in [(1, 4), (2, 4), (4, 4), (4, 1)] {
            let schema = format!("warden_bench_{}_{workers}_{each}", std::process::id());
            let url = format!("{url}?schema={schema}");
            let name = match each {
                4 => format!("postgres, {workers} worker(s)"),
                _ => format!("postgres, {workers} × {each} run"),
            };
            let m = bench(
                &name,
                runs,
                &agent,
                &sandbox,
                (workers, each),
                || {
                    let url = url.clone();
                    async move {
                        let store = PostgresStore::open(&url).await.unwrap();
                        Opened {
                            store: Arc::new(store.clone()),
                            postgres: Some(store),
                        }
                    }
                },
            )
            .await;
            measured.push(((workers, each), m));
            let (client, connection) =
                tokio_postgres::connect(url.split('?').next().unwrap(), tokio_postgres::NoTls)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            client
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await
                .unwrap();
        }
        rows(&measured)
    })
}

/// The targets: per step, PostgreSQL's commits (≤ 2) and round trips (the
/// same for any number of workers); throughput not falling from 2 to 4
/// workers; step latency not quadrupling from 1 to 4 (with 4 runs in
/// flight per worker, 4 workers hold four times the runs in flight, and
/// on cores the throughput cannot grow past that is latency by Little's
/// law; 4 workers of one run each hold as many as 1 of 4).
fn rows(measured: &[((usize, usize), Measured)]) -> Vec<Row> {
    let mut rows = Vec::new();
    let per_step = |m: &Measured| {
        let pg = m.postgres.expect("a postgres measure");
        let steps = m.steps as f64;
        (
            pg.commits as f64 / steps,
            (pg.commits - pg.deferred_commits) as f64 / steps,
            pg.round_trips as f64 / steps,
        )
    };
    let label = |(workers, each): (usize, usize)| match each {
        4 => format!("{workers} worker(s)"),
        _ => format!("{workers} workers × {each} run"),
    };
    for (config, m) in measured {
        let (commits, synced, _) = per_step(m);
        rows.push(Row::new(
            "workers",
            format!(
                "PostgreSQL commits waiting for the WAL flush per step, {}",
                label(*config)
            ),
            format!("{synced:.2}"),
            "≤ 2",
            Some(synced <= 2.0),
        ));
        rows.push(Row::new(
            "workers",
            format!(
                "PostgreSQL commits per step, deferred ones too, {}",
                label(*config)
            ),
            format!("{commits:.2}"),
            "≤ 2",
            Some(commits <= 2.0),
        ));
    }
    let trips: Vec<f64> = measured.iter().map(|(_, m)| per_step(m).2).collect();
    let spread = trips.iter().cloned().fold(f64::MIN, f64::max)
        / trips.iter().cloned().fold(f64::MAX, f64::min);
    rows.push(Row::new(
        "workers",
        format!(
            "PostgreSQL round trips per step, {}",
            measured
                .iter()
                .map(|(c, _)| label(*c))
                .collect::<Vec<_>>()
                .join(" / ")
        ),
        trips
            .iter()
            .map(|t| format!("{t:.2}"))
            .collect::<Vec<_>>()
            .join(" / "),
        format!("independent of the workers (largest / smallest {spread:.2}×; ≤ 1.1×)"),
        Some(spread <= 1.1),
    ));
    let find = |c: (usize, usize)| measured.iter().find(|(n, _)| *n == c).map(|(_, m)| m);
    if let (Some(one), Some(two), Some(four), Some(spread)) =
        (find((1, 4)), find((2, 4)), find((4, 4)), find((4, 1)))
    {
        let ratio = four.runs_per_s / two.runs_per_s;
        rows.push(Row::new(
            "workers",
            "PostgreSQL runs/s, 4 workers / 2 workers",
            format!(
                "{ratio:.2}× ({:.0} / {:.0} runs/s)",
                four.runs_per_s, two.runs_per_s
            ),
            "≥ 1× (not falling)",
            Some(ratio >= 1.0),
        ));
        let ratio = four.p50_ms / one.p50_ms;
        rows.push(Row::new(
            "workers",
            "PostgreSQL step p50, 4 workers / 1 worker (4 runs in flight each)",
            format!("{ratio:.2}× ({:.2} / {:.2} ms)", four.p50_ms, one.p50_ms),
            format!(
                "< 4× (runs/s {:.2}×, with 4× the runs in flight)",
                four.runs_per_s / one.runs_per_s
            ),
            Some(ratio < 4.0),
        ));
        let ratio = spread.p50_ms / one.p50_ms;
        rows.push(Row::new(
            "workers",
            "PostgreSQL step p50, 4 workers × 1 run / 1 worker × 4 (4 runs in flight)",
            format!("{ratio:.2}× ({:.2} / {:.2} ms)", spread.p50_ms, one.p50_ms),
            "< 4×; ≈ 1× if workers add no contention",
            Some(ratio < 4.0),
        ));
    }
    rows
}

/// An agent over the no-op guest: two tool calls, then an answer.
fn agent(dir: &Path) -> Agent {
    let wasm = std::fs::read(guests::NOOP).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    // Next to its manifest: a component elsewhere would need a grant.
    std::fs::write(dir.join("noop.wasm"), &wasm).unwrap();
    std::fs::write(
        dir.join("noop.toml"),
        format!(
            "name = \"noop\"\nversion = \"0.1.0\"\nkind = \"tool\"\ncomponent = \"noop.wasm\"\nsha256 = \"{sha}\"\n",
        ),
    )
    .unwrap();
    let turn = "[[turns]]\ntext = \"again\"\n[[turns.tool_calls]]\nname = \"noop__noop\"\n";
    std::fs::write(
        dir.join("job.transcript.toml"),
        format!("{turn}{turn}[[turns]]\ntext = \"done\"\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"job\"\ninstructions = \"bench\"\n[model]\nprovider = \"scripted\"\nname = \"s\"\ntranscript = \"job.transcript.toml\"\n[plugins.noop]\nsource = \"noop.toml\"\napproval = { noop = \"never\" }\n",
    )
    .unwrap();
    Agent::load(&dir.join("job.toml").canonicalize().unwrap(), None).unwrap()
}

async fn bench<F, Fut>(
    name: &str,
    runs: usize,
    agent: &Agent,
    sandbox: &Sandbox,
    (workers, each): (usize, usize),
    open: F,
) -> Measured
where
    F: Fn() -> Fut,
    Fut: Future<Output = Opened>,
{
    let steps = Arc::new(Steps::default());
    let submitter = Runtime::new(open().await.store, PluginHost::new(sandbox.clone()));
    let prefix = format!("{}-{workers}-{each}", name.split(',').next().unwrap());
    for i in 0..runs {
        let id = RunId::new(format!("{prefix}-{i:05}")).unwrap();
        submitter
            .submit(agent, json!("go"), StartOptions::new().id(id))
            .await
            .unwrap();
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut opened = Vec::new();
    for _ in 0..workers {
        opened.push(open().await);
    }
    // Counted from here: opening the stores (migrations) is no step.
    let postgres: Vec<PostgresStore> = opened.iter().filter_map(|o| o.postgres.clone()).collect();
    let before: Vec<PostgresStats> = postgres.iter().map(PostgresStore::stats).collect();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for opened in opened {
        let store: Arc<dyn EventStore> = Arc::new(Intercepted {
            inner: opened.store,
            hooks: Timed {
                steps: Arc::clone(&steps),
            },
        });
        let worker = Worker::builder(Runtime::new(store, PluginHost::new(sandbox.clone())))
            .concurrency(each)
            .poll(Duration::from_millis(20))
            .build()
            .unwrap();
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let store = submitter.store().clone();
    loop {
        let done = store
            .list(&RunFilter::new().status("completed"))
            .await
            .unwrap()
            .iter()
            .filter(|r| r.run_id.as_str().starts_with(&prefix))
            .count();
        if done == runs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    stop.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    // The workers' stores only: the submitter and the polling above are
    // not the workers' cost.
    let counted = (!postgres.is_empty()).then(|| {
        postgres
            .iter()
            .zip(&before)
            .fold(PostgresStats::default(), |mut sum, (store, before)| {
                let after = store.stats();
                sum.round_trips += after.round_trips - before.round_trips;
                sum.commits += after.commits - before.commits;
                sum.deferred_commits += after.deferred_commits - before.deferred_commits;
                sum.snapshots += after.snapshots - before.snapshots;
                sum
            })
    });
    let mut latencies = steps.latencies.lock().unwrap().clone();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    let runs_per_s = runs as f64 / elapsed.as_secs_f64();
    let per_step = |n: u64| n as f64 / latencies.len() as f64;
    let appends = format!(
        "; per step {:.2} appends ({:.2} deferred)",
        per_step(steps.appends.load(Ordering::Relaxed)),
        per_step(steps.deferred.load(Ordering::Relaxed)),
    );
    let counts = counted.map_or(String::new(), |c| {
        format!(
            ", {:.2} commits ({:.2} deferred), {:.2} round trips ({:.2} read snapshots)",
            per_step(c.commits),
            per_step(c.deferred_commits),
            per_step(c.round_trips),
            per_step(c.snapshots),
        )
    });
    println!(
        "{name:>22}: {runs_per_s:>6.1} runs/s, {} steps, step p50 {:>6.2} ms, p99 {:>6.2} ms{appends}{counts}",
        latencies.len(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
    Measured {
        runs_per_s,
        p50_ms: pct(0.50).as_secs_f64() * 1e3,
        steps: latencies.len(),
        postgres: counted,
    }
}

/// Step timings: per run, when its last step ended.
#[derive(Default)]
struct Steps {
    last: Mutex<HashMap<RunId, Instant>>,
    latencies: Mutex<Vec<Duration>>,
    /// Appends, and of those the deferred ones.
    appends: AtomicU64,
    deferred: AtomicU64,
}

/// Times the steps a store's fenced appends finish.
struct Timed {
    steps: Arc<Steps>,
}

impl Hooks for Timed {
    fn durability(&self, _: &RunId, _: &[Bytes], durability: Durability) {
        self.steps.appends.fetch_add(1, Ordering::Relaxed);
        if durability == Durability::Deferred {
            self.steps.deferred.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn after_append(&self, via: AppendVia, run_id: &RunId, events: &[Bytes]) {
        if via != AppendVia::Fenced {
            return;
        }
        let now = Instant::now();
        let ends_step = events
            .iter()
            .any(|e| decode(e).is_ok_and(|e| e.kind().as_str().ends_with("call_completed")));
        let mut last = self.steps.last.lock().unwrap();
        if ends_step && let Some(prev) = last.get(run_id) {
            self.steps.latencies.lock().unwrap().push(now - *prev);
        }
        if ends_step || !last.contains_key(run_id) {
            last.insert(run_id.clone(), now);
        }
    }

    fn after_claim(&self, claims: &[Claim]) {
        let now = Instant::now();
        let mut last = self.steps.last.lock().unwrap();
        for claim in claims {
            last.insert(claim.run_id.clone(), now);
        }
    }
}
