//! Worker throughput: runs per second and step latency (p50/p99) when 1, 2
//! and 4 workers share a queue of scripted runs on PostgreSQL, beside one
//! worker on SQLite. Each worker has its own runtime and its own store
//! connection pool, as separate processes would; each drives up to 4 runs
//! at once. A step is one logical operation (a model call or a tool call:
//! intent, effect, completion), timed between consecutive completions of a
//! run.
//!
//! `cargo bench -p warden-tests --bench workers` (`WORKERS_BENCH_RUNS`,
//! default 400; PostgreSQL at `WARDEN_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warden::engine::StartOptions;

use bytes::Bytes;
use serde_json::json;
use sha2::Digest;
use warden::engine::{Agent, RunId, Runtime, decode};
use warden::plugins::PluginHost;
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::{Claim, EventStore, PostgresStore, RunFilter, SqliteStore};
use warden::worker::Worker;
use warden_tests::guests;

use warden::store::testing::{AppendVia, Hooks, Intercepted};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
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
            "{runs} runs of 5 steps (2 no-op tool calls, 3 model calls), 4 at once per worker"
        );
        let sqlite = dir.path().join("bench.db");
        let opened = SqliteStore::open(&sqlite).unwrap();
        drop(opened);
        bench("sqlite, 1 worker", runs, &agent, &sandbox, 1, || {
            let path = sqlite.clone();
            async move { Arc::new(SqliteStore::open(path).unwrap()) as Arc<dyn EventStore> }
        })
        .await;
        for workers in [1, 2, 4] {
            let schema = format!("warden_bench_{}_{workers}", std::process::id());
            let url = format!("{url}?schema={schema}");
            bench(
                &format!("postgres, {workers} worker(s)"),
                runs,
                &agent,
                &sandbox,
                workers,
                || {
                    let url = url.clone();
                    async move {
                        Arc::new(PostgresStore::open(&url).await.unwrap()) as Arc<dyn EventStore>
                    }
                },
            )
            .await;
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
    });
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
    workers: usize,
    open: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn EventStore>>,
{
    let steps = Arc::new(Steps::default());
    let submitter = Runtime::new(open().await, PluginHost::new(sandbox.clone()));
    let prefix = format!("{}-{workers}", name.split(',').next().unwrap());
    for i in 0..runs {
        let id = RunId::new(format!("{prefix}-{i:05}")).unwrap();
        submitter
            .submit(agent, json!("go"), StartOptions::new().id(id))
            .await
            .unwrap();
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let store: Arc<dyn EventStore> = Arc::new(Intercepted {
            inner: open().await,
            hooks: Timed {
                steps: Arc::clone(&steps),
            },
        });
        let worker = Worker::builder(Runtime::new(store, PluginHost::new(sandbox.clone())))
            .concurrency(4)
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
    let mut latencies = steps.latencies.lock().unwrap().clone();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    println!(
        "{name:>22}: {:>6.1} runs/s, {} steps, step p50 {:>6.2} ms, p99 {:>6.2} ms",
        runs as f64 / elapsed.as_secs_f64(),
        latencies.len(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
}

/// Step timings: per run, when its last step ended.
#[derive(Default)]
struct Steps {
    last: Mutex<HashMap<RunId, Instant>>,
    latencies: Mutex<Vec<Duration>>,
}

/// Times the steps a store's fenced appends finish.
struct Timed {
    steps: Arc<Steps>,
}

impl Hooks for Timed {
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
