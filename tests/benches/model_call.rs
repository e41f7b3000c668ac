//! Benchmark of the engine's overhead per model call: the time from a
//! provider's completion (its stream ended) to the engine's next request,
//! when the model's turn called one no-op tool. In between, the engine
//! records the completion, decides, records the tool call's intent, runs
//! the tool in a fresh lease, records its completion, decides again,
//! builds and hashes the next request and records its intent.
//!
//! The model is the scripted provider, wrapped to timestamp each call, so
//! nothing but the engine is measured. Runs on the in-memory store and on
//! SQLite (WAL, synchronous=FULL: every append waits for the disk).
//!
//! `cargo bench -p warden-tests --bench model_call` prints medians and p99s,
//! with the no-op lease's own wall time (from its receipt) shown apart.
//! Set `MODEL_CALL_BENCH_TURNS` to change the tool-calling turns per run
//! (default 400; one warm-up run of 50 turns comes first).

use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use warden::engine::StartOptions;

use futures::StreamExt;
use serde_json::json;
use sha2::Digest;
use warden::engine::events::Event;
use warden::engine::{Agent, RunStatus, Runtime};
use warden::plugins::PluginHost;
use warden::providers::{ModelProvider, ModelRequest, ModelStream};
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::{EventStore, MemoryStore, SqliteStore};
use warden_tests::guests;

/// When each call started and when its stream ended.
#[derive(Default)]
struct Marks {
    requests: Vec<Instant>,
    completions: Vec<Instant>,
}

/// A provider that timestamps the calls of the one it wraps.
struct Timed {
    inner: Arc<dyn ModelProvider>,
    marks: Arc<Mutex<Marks>>,
}

impl ModelProvider for Timed {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        self.marks.lock().unwrap().requests.push(Instant::now());
        let marks = Arc::clone(&self.marks);
        let end = futures::stream::poll_fn(move |_| {
            marks.lock().unwrap().completions.push(Instant::now());
            Poll::Ready(None)
        });
        Box::pin(self.inner.stream(request).chain(end))
    }
}

fn transcript(turns: usize) -> String {
    let mut t = String::new();
    for _ in 0..turns {
        t.push_str("[[turns]]\ntext = \"Again.\"\n[[turns.tool_calls]]\nname = \"noop__noop\"\n\n");
    }
    t.push_str("[[turns]]\ntext = \"Done.\"\n");
    t
}

fn agent(dir: &std::path::Path, turns: usize) -> Agent {
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
    std::fs::write(dir.join(format!("t{turns}.toml")), transcript(turns)).unwrap();
    std::fs::write(
        dir.join(format!("agent{turns}.toml")),
        format!(
            "name = \"bench\"\ninstructions = \"Call the tool.\"\n[model]\nprovider = \"scripted\"\nname = \"m\"\ntranscript = \"t{turns}.toml\"\n[budgets]\nmax_steps = 100000\n[plugins.noop]\nsource = \"noop.toml\"\napproval = {{ noop = \"never\" }}\n"
        ),
    )
    .unwrap();
    Agent::load(&dir.join(format!("agent{turns}.toml")), None).unwrap()
}

/// Gaps between a completion and the next request, and the lease times.
fn run(
    rt: &tokio::runtime::Runtime,
    sandbox: &Sandbox,
    store: Arc<dyn EventStore>,
    agent: &Agent,
) -> (Vec<Duration>, Vec<Duration>) {
    let marks = Arc::new(Mutex::new(Marks::default()));
    let provider = Timed {
        inner: agent.model.provider().unwrap(),
        marks: Arc::clone(&marks),
    };
    let runtime =
        Runtime::new(store, PluginHost::new(sandbox.clone())).with_provider(Arc::new(provider));
    let events = rt.block_on(async {
        let run = runtime
            .start(agent, json!("go"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(
            runtime.drive(&run, agent).await.unwrap(),
            RunStatus::Completed
        );
        runtime.events(&run).await.unwrap()
    });
    let marks = marks.lock().unwrap();
    let gaps: Vec<Duration> = marks
        .completions
        .iter()
        .zip(marks.requests.iter().skip(1))
        .map(|(done, next)| next.duration_since(*done))
        .collect();
    let leases: Vec<Duration> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallCompleted(c) => Some(Duration::from_micros(c.receipt.wall_time_us)),
            _ => None,
        })
        .collect();
    assert_eq!(gaps.len(), leases.len());
    (gaps, leases)
}

fn stats(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let median = us(samples[samples.len() / 2]);
    let p99 = us(samples[(samples.len() * 99 / 100).min(samples.len() - 1)]);
    (median, p99)
}

fn main() {
    let turns: usize = std::env::var("MODEL_CALL_BENCH_TURNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        cache_dir: Some(dir.path().join("cache")),
        ..SandboxConfig::default()
    })
    .unwrap();
    let warmup = agent(dir.path(), 50);
    let agent = agent(dir.path(), turns);
    println!("engine overhead per model call: provider completion -> next model request,");
    println!("the turn calling one no-op tool ({turns} turns per store):");
    for (name, make) in [
        (
            "memory",
            Box::new(|_: &std::path::Path| Arc::new(MemoryStore::new()) as Arc<dyn EventStore>)
                as Box<dyn Fn(&std::path::Path) -> Arc<dyn EventStore>>,
        ),
        (
            "sqlite",
            Box::new(|p: &std::path::Path| {
                Arc::new(SqliteStore::open(p.join("runs.db")).unwrap()) as Arc<dyn EventStore>
            }),
        ),
    ] {
        let store_dir = tempfile::tempdir().unwrap();
        let store = make(store_dir.path());
        run(&rt, &sandbox, Arc::clone(&store), &warmup);
        let (mut gaps, mut leases) = run(&rt, &sandbox, store, &agent);
        let engine: Vec<Duration> = gaps
            .iter()
            .zip(&leases)
            .map(|(g, l)| g.saturating_sub(*l))
            .collect();
        // The conversation grows with every turn; show the first and the
        // last calls apart.
        let window = (engine.len() / 8).max(1);
        let (fm, _) = stats(&mut engine[..window].to_vec());
        let (lastm, _) = stats(&mut engine[engine.len() - window..].to_vec());
        let (em, ep) = stats(&mut engine.clone());
        let (gm, gp) = stats(&mut gaps);
        let (lm, lp) = stats(&mut leases);
        println!("  {name:<6}  total   median {gm:>8.1} µs  p99 {gp:>8.1} µs");
        println!(
            "          lease   median {lm:>8.1} µs  p99 {lp:>8.1} µs  (the no-op tool's receipt)"
        );
        println!(
            "          engine  median {em:>8.1} µs  p99 {ep:>8.1} µs  (total minus lease: 4 appends, 2 decisions, the request)"
        );
        println!(
            "          engine  median {fm:>8.1} µs over calls 1-{window}, {lastm:.1} µs over the last {window} (a longer conversation)"
        );
    }
}
