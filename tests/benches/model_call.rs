//! Benchmark of the engine's overhead per model call: the time from a
//! provider's completion (its stream ended) to the engine's next request,
//! when the model's turn called one no-op tool. In between, the engine
//! records the completion, decides, records the tool call's intent, runs
//! the tool in a fresh lease, records its completion, decides again,
//! builds and hashes the next request and records its intent.
//!
//! The model is the scripted provider, wrapped to timestamp each call, so
//! nothing but the engine is measured. Runs on the in-memory store and on
//! SQLite (WAL; a synced append waits for the disk, a deferred one does
//! not), with the tool a read and then a write (the operator's setting).
//! First it measures the machine's fdatasync of a small write next to the
//! database, the floor of a synced append.
//!
//! Printed, each next to its target: fsyncs per turn on SQLite, counted
//! by the store (≤ 1 for a read turn, ≤ 2 for a write); the engine's
//! median over the last 50 calls of a 400-call run against the first 50
//! (≤ 1.2×); the memory store's median (≤ 150 µs); SQLite's median
//! against fsyncs per turn × the fdatasync measured here plus the memory
//! store's median (≤ 1.3×). The no-op lease's own wall time (from its
//! receipt) is taken out.
//!
//! `cargo bench -p warden-tests --bench model_call`. Set
//! `MODEL_CALL_BENCH_TURNS` to change the tool-calling turns per run
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

#[path = "table.rs"]
mod table;
use crate::table::{Row, fdatasync_us};

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

/// The scripted model's turns, each with its usage given: without it the
/// scripted provider estimates the input tokens by serializing the whole
/// request, work that grows with the conversation and runs right before
/// the gap measured. It is outside the gap, yet on these machines work
/// right after a long busy stretch runs slower (a constant busy wait of
/// 5 ms in the provider doubles the engine's figure, flat in the turns),
/// so an estimate made per call would show as the engine growing.
fn transcript(turns: usize) -> String {
    let mut t = String::new();
    for _ in 0..turns {
        t.push_str("[[turns]]\ntext = \"Again.\"\nusage = { input_tokens = 100, output_tokens = 5 }\n[[turns.tool_calls]]\nname = \"noop__noop\"\n\n");
    }
    t.push_str("[[turns]]\ntext = \"Done.\"\nusage = { input_tokens = 100, output_tokens = 1 }\n");
    t
}

/// An agent calling the no-op tool for `turns` turns, the tool of `effect`
/// class (`read` or `write`, the operator's setting).
fn agent(dir: &std::path::Path, turns: usize, effect: &str) -> Agent {
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
    let file = dir.join(format!("agent{turns}-{effect}.toml"));
    std::fs::write(
        &file,
        format!(
            "name = \"bench\"\ninstructions = \"Call the tool.\"\n[model]\nprovider = \"scripted\"\nname = \"m\"\ntranscript = \"t{turns}.toml\"\n[budgets]\nmax_steps = 100000\n[plugins.noop]\nsource = \"noop.toml\"\napproval = {{ noop = \"never\" }}\n[plugins.noop.grant.tools.noop]\neffect = \"{effect}\"\n"
        ),
    )
    .unwrap();
    Agent::load(&file, None).unwrap()
}

/// Gaps between a completion and the next request, and the lease times.
fn run_once(
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

/// Synced commits of a run outside its tool-calling turns: the create, the
/// final model call's intent, the end.
const FIXED_SYNCED: u64 = 3;
/// All its commits outside them: those and the final call's completion.
const FIXED_COMMITS: u64 = 4;

/// One store and tool class, measured.
struct Measured {
    /// Medians in µs: all calls, the first window, the last window.
    median: f64,
    p99: f64,
    first: f64,
    last: f64,
    window: usize,
    lease: f64,
    /// Per tool-calling turn, counted by the store (SQLite only): synced
    /// commits (fsyncs) and all commits.
    fsyncs_per_turn: Option<f64>,
    commits_per_turn: Option<f64>,
}

fn measure(
    rt: &tokio::runtime::Runtime,
    sandbox: &Sandbox,
    dir: &std::path::Path,
    sqlite: bool,
    warmup: &Agent,
    agent: &Agent,
) -> Measured {
    let sqlite_store = sqlite.then(|| Arc::new(SqliteStore::open(dir.join("runs.db")).unwrap()));
    let store: Arc<dyn EventStore> = match &sqlite_store {
        Some(s) => s.clone(),
        None => Arc::new(MemoryStore::new()),
    };
    run_once(rt, sandbox, Arc::clone(&store), warmup);
    let before = sqlite_store.as_ref().map(|s| s.stats());
    let (mut gaps, mut leases) = run_once(rt, sandbox, store, agent);
    let turns = gaps.len() as f64;
    let (fsyncs_per_turn, commits_per_turn) = match (&sqlite_store, before) {
        (Some(s), Some(before)) => {
            let after = s.stats();
            let commits = after.transactions - before.transactions;
            let deferred = after.deferred_transactions - before.deferred_transactions;
            // Outside its tool-calling turns a run commits its create, the
            // final answer's model call (intent, synced; completion) and its
            // end (synced): not counted in the turns.
            let synced = commits - deferred;
            (
                Some(synced.saturating_sub(FIXED_SYNCED) as f64 / turns),
                Some(commits.saturating_sub(FIXED_COMMITS) as f64 / turns),
            )
        }
        _ => (None, None),
    };
    let engine: Vec<Duration> = gaps
        .iter()
        .zip(&leases)
        .map(|(g, l)| g.saturating_sub(*l))
        .collect();
    // The conversation grows with every turn; show the first and the last
    // calls apart.
    let window = (engine.len() / 8).max(1);
    let (first, _) = stats(&mut engine[..window].to_vec());
    let (last, _) = stats(&mut engine[engine.len() - window..].to_vec());
    let (median, p99) = stats(&mut engine.clone());
    let _ = stats(&mut gaps);
    let (lease, _) = stats(&mut leases);
    Measured {
        median,
        p99,
        first,
        last,
        window,
        lease,
        fsyncs_per_turn,
        commits_per_turn,
    }
}

fn verdict(ok: bool) -> &'static str {
    table::verdict(Some(ok))
}

fn main() {
    run();
}

/// Measures and prints; returns the targets for the table.
pub(crate) fn run() -> Vec<Row> {
    let mut rows = Vec::new();
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
    let fsync = fdatasync_us(dir.path(), 200);
    println!(
        "fdatasync of a 100-byte write on this disk: median {fsync:.1} µs (200 samples, measured first)"
    );
    println!("engine overhead per model call: provider completion -> next model request,");
    println!("the turn calling one no-op tool ({turns} turns per run), lease time taken out:");
    for effect in ["read", "write"] {
        let warmup = agent(dir.path(), 50, effect);
        let agent = agent(dir.path(), turns, effect);
        let memory = measure(&rt, &sandbox, dir.path(), false, &warmup, &agent);
        let store_dir = tempfile::tempdir_in(dir.path()).unwrap();
        let sqlite = measure(&rt, &sandbox, store_dir.path(), true, &warmup, &agent);
        for (name, m) in [("memory", &memory), ("sqlite", &sqlite)] {
            println!(
                "  {effect:<5} {name:<6} engine median {:>8.1} µs  p99 {:>8.1} µs  calls 1-{w}: {:>8.1} µs  last {w}: {:>8.1} µs  (lease {:.1} µs)",
                m.median,
                m.p99,
                m.first,
                m.last,
                m.lease,
                w = m.window,
            );
        }
        let fsyncs = sqlite.fsyncs_per_turn.unwrap();
        let limit = if effect == "read" { 1.0 } else { 2.0 };
        println!(
            "        fsyncs per turn on sqlite (counted by the store): {fsyncs:.2}, {:.2} commits  [target ≤ {limit}: {}]",
            sqlite.commits_per_turn.unwrap(),
            verdict(fsyncs <= limit + 1e-9)
        );
        for (name, m) in [("memory", &memory), ("sqlite", &sqlite)] {
            let ratio = m.last / m.first;
            println!(
                "        {name}: last {} / first {} calls = {ratio:.2}×  [target ≤ 1.2×: {}]",
                m.window,
                m.window,
                verdict(ratio <= 1.2)
            );
        }
        println!(
            "        memory median {:.1} µs  [target ≤ 150 µs: {}]",
            memory.median,
            verdict(memory.median <= 150.0)
        );
        let floor = fsyncs * fsync + memory.median;
        let ratio = sqlite.median / floor;
        println!(
            "        sqlite median {:.1} µs = {ratio:.2}× ({fsyncs:.2} fsyncs × {fsync:.1} µs + memory {:.1} µs = {floor:.1} µs)  [target ≤ 1.3×: {}]",
            sqlite.median,
            memory.median,
            verdict(ratio <= 1.3)
        );
        rows.push(Row::new(
            "model_call",
            format!("fsyncs per {effect} turn, SQLite (counted by the store)"),
            format!("{fsyncs:.2}"),
            format!("≤ {limit}"),
            Some(fsyncs <= limit + 1e-9),
        ));
        for (name, m) in [("memory", &memory), ("sqlite", &sqlite)] {
            let ratio = m.last / m.first;
            rows.push(Row::new(
                "model_call",
                format!(
                    "engine overhead, last {w} / first {w} calls, {effect} turns, {name}",
                    w = m.window
                ),
                format!("{ratio:.2}×"),
                format!("≤ 1.2× (first {}: {:.0} µs)", m.window, m.first),
                Some(ratio <= 1.2),
            ));
        }
        rows.push(Row::new(
            "model_call",
            format!("engine overhead per call, {effect} turns, memory, median"),
            format!("{:.0} µs", memory.median),
            "≤ 150 µs",
            Some(memory.median <= 150.0),
        ));
        rows.push(Row::new(
            "model_call",
            format!("engine overhead per call, {effect} turns, SQLite, median"),
            format!("{:.0} µs = {ratio:.2}×", sqlite.median),
            format!(
                "≤ 1.3× of {fsyncs:.2} fsyncs × {fsync:.0} µs + memory's {:.0} µs",
                memory.median
            ),
            Some(ratio <= 1.3),
        ));
    }
    rows
}
