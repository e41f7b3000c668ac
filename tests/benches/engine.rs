//! Benchmarks of the run engine, printing figures:
//! - replay (load + decode + checked fold) of a 10,000-event run, on the
//!   in-memory and SQLite stores, and in memory of the same run delivering
//!   its output through a channel (finding the next delivery must not scan
//!   the log at every event);
//! - steps per second for 1,000 concurrent runs with the scripted provider
//!   and a no-op tool plugin, on both stores, with the fsyncs per second
//!   SQLite's group commit made and the CPU time per step (the process's,
//!   and SQLite's one writer thread's);
//! - memory per parked run (resident set growth over 1,000 runs parked for
//!   approval).
//!
//! `cargo bench -p warden-tests --bench engine`. `ENGINE_BENCH_RUNS` changes
//! the number of concurrent runs (default 1,000).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use warden::engine::StartOptions;

use serde_json::json;
use sha2::Digest;
use warden::engine::{Agent, ReplayOptions, RunId, RunStatus, Runtime, decode, replay};
use warden::plugins::PluginHost;
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::{EventStore, MemoryStore, SqliteStore};
use warden_tests::guests;

#[path = "table.rs"]
mod table;
use crate::table::Row;

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
        let dir = tempfile::tempdir().unwrap();
        let sandbox = Sandbox::new(SandboxConfig {
            cache_dir: Some(std::env::temp_dir().join("warden-bench-components")),
            max_concurrent_leases: 256,
            ..SandboxConfig::default()
        })
        .unwrap();
        let mut rows = replay_bench(dir.path(), &sandbox).await;
        let runs: usize = std::env::var("ENGINE_BENCH_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000);
        rows.extend(concurrency_bench(dir.path(), &sandbox, runs).await);
        rows.push(parked_memory_bench(dir.path(), &sandbox, runs).await);
        rows
    })
}

/// An agent over the no-op guest whose scripted model calls `noop` once per
/// turn for `turns` turns, then answers; its `noop` needs approval when
/// `approval` is set.
fn agent(dir: &Path, name: &str, turns: usize, approval: bool) -> Agent {
    agent_with(dir, name, turns, approval, "")
}

/// [`agent`] with `extra` appended to its file.
fn agent_with(dir: &Path, name: &str, turns: usize, approval: bool, extra: &str) -> Agent {
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
    let mut transcript = String::new();
    for _ in 0..turns {
        transcript
            .push_str("[[turns]]\ntext = \"again\"\n[[turns.tool_calls]]\nname = \"noop__noop\"\n");
    }
    transcript.push_str("[[turns]]\ntext = \"done\"\n");
    std::fs::write(dir.join(format!("{name}.transcript.toml")), transcript).unwrap();
    let rule = if approval { "always" } else { "never" };
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            "name = \"{name}\"\ninstructions = \"bench\"\n[model]\nprovider = \"scripted\"\nname = \"s\"\ntranscript = \"{name}.transcript.toml\"\n[plugins.noop]\nsource = \"noop.toml\"\napproval = {{ noop = \"{rule}\" }}\n{extra}"
        ),
    )
    .unwrap();
    Agent::load(&dir.join(format!("{name}.toml")), None).unwrap()
}

async fn replay_bench(dir: &Path, sandbox: &Sandbox) -> Vec<Row> {
    let mut rows = Vec::new();
    // Four events per turn (model intent and completion, tool intent and
    // completion): 2,500 turns make a 10,000-event run.
    let plain = agent(dir, "long", 2_499, false);
    std::fs::create_dir_all(dir.join("out")).unwrap();
    let delivered = agent_with(
        dir,
        "long-delivered",
        2_499,
        false,
        "[plugins.outbox]\nsource = \"builtin:jsonl-channel\"\n[plugins.outbox.grant.mounts.outbox]\ndir = \"out\"\n[channels.results]\nplugin = \"outbox\"\nreceives = [\"output\"]\n",
    );
    for (name, store, agent) in [
        (
            "memory",
            Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
            &plain,
        ),
        (
            "sqlite",
            Arc::new(SqliteStore::open(dir.join("replay.db")).unwrap()) as Arc<dyn EventStore>,
            &plain,
        ),
        (
            "memory, output delivered through a channel",
            Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
            &delivered,
        ),
    ] {
        let agent = agent.clone();
        let runtime = Runtime::new(store.clone(), PluginHost::new(sandbox.clone()));
        let run = RunId::new("long").unwrap();
        runtime
            .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
            .await
            .unwrap();
        let t = Instant::now();
        assert_eq!(
            runtime.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed
        );
        let recorded = t.elapsed();
        let mut load = Vec::new();
        let mut decode_fold = Vec::new();
        let mut count = 0;
        let view = view_of(sandbox, &agent).await;
        for _ in 0..10 {
            let t = Instant::now();
            let stored = store.load(&run).await.unwrap();
            load.push(t.elapsed());
            let t = Instant::now();
            let events: Vec<_> = stored.iter().map(|s| decode(&s.bytes).unwrap()).collect();
            replay(&events, &view, ReplayOptions::default()).unwrap();
            decode_fold.push(t.elapsed());
            count = events.len();
        }
        let (l, d) = (median(&mut load), median(&mut decode_fold));
        println!(
            "replay of a {count}-event run ({name}): load + chain check {:.1} ms, decode + checked replay {:.1} ms, total {:.1} ms (recording it took {:.1} s)",
            ms(l),
            ms(d),
            ms(l + d),
            recorded.as_secs_f64()
        );
        rows.push(Row::new(
            "engine",
            format!("replay of a {count}-event run ({name})"),
            format!("{:.1} ms", ms(l + d)),
            "< 30 ms",
            Some(ms(l + d) < 30.0),
        ));
    }
    rows
}

/// The agent's view as the runtime builds it (plugins loaded; components
/// come from the sandbox's cache).
async fn view_of(sandbox: &Sandbox, agent: &Agent) -> warden::engine::AgentView {
    let host = PluginHost::new(sandbox.clone());
    let mut loaded = Vec::new();
    for p in &agent.plugins {
        loaded.push((
            p.key.clone(),
            host.load(&p.source, &p.grant, &p.grant_base).await.unwrap(),
        ));
    }
    let tools: Vec<(&str, &[warden::plugins::ToolDescriptor])> = loaded
        .iter()
        .map(|(k, p)| (k.as_str(), p.tools()))
        .collect();
    warden::engine::AgentView::new(agent, &tools).unwrap()
}

async fn concurrency_bench(dir: &Path, sandbox: &Sandbox, runs: usize) -> Vec<Row> {
    let agent = agent(dir, "short", 4, false);
    let sqlite = Arc::new(SqliteStore::open(dir.join("concurrent.db")).unwrap());
    let mut rates = Vec::new();
    for (name, store) in [
        (
            "memory",
            Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
        ),
        ("sqlite", sqlite.clone() as Arc<dyn EventStore>),
    ] {
        let runtime = Runtime::new(store.clone(), PluginHost::new(sandbox.clone()));
        // Load the plugins once before timing.
        let warm = RunId::new(format!("warm-{name}")).unwrap();
        runtime
            .start(&agent, json!("go"), StartOptions::new().id(warm.clone()))
            .await
            .unwrap();
        runtime.drive(&warm, &agent).await.unwrap();

        let synced = || {
            let stats = sqlite.stats();
            stats.transactions - stats.deferred_transactions
        };
        let synced_before = synced();
        let cpu_before = (thread_cpu_ms(None), thread_cpu_ms(Some(WRITER_THREAD)));
        let t = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..runs {
            let (runtime, agent) = (runtime.clone(), agent.clone());
            tasks.push(tokio::spawn(async move {
                let run = RunId::new(format!("run-{i}")).unwrap();
                runtime
                    .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
                    .await
                    .unwrap();
                runtime.drive(&run, &agent).await
            }));
        }
        let mut failures = 0;
        for task in tasks {
            if !matches!(task.await.unwrap(), Ok(RunStatus::Completed)) {
                failures += 1;
            }
        }
        let elapsed = t.elapsed();
        // Steps: 5 model calls + 4 tool calls per run.
        let steps = runs * 9;
        let events = store
            .summary(&RunId::new("run-0").unwrap())
            .await
            .unwrap()
            .event_count;
        // Only the SQLite store syncs; the memory store's count stays put.
        let fsyncs = synced() - synced_before;
        let cpu = |now: u64, before: u64| (now - before) as f64 * 1e3 / steps as f64;
        let (process_us, writer_us) = (
            cpu(thread_cpu_ms(None), cpu_before.0),
            cpu(thread_cpu_ms(Some(WRITER_THREAD)), cpu_before.1),
        );
        let steps_per_s = steps as f64 / elapsed.as_secs_f64();
        let fsyncs_per_s = fsyncs as f64 / elapsed.as_secs_f64();
        println!(
            "{runs} concurrent runs ({name}): {:.2} s, {steps_per_s:.0} steps/s, {:.0} events/s, {fsyncs_per_s:.0} fsyncs/s ({:.2} steps per fsync), {failures} failures; CPU per step {process_us:.0} µs, {writer_us:.0} µs of it on the store's writer thread",
            elapsed.as_secs_f64(),
            (events as usize * runs) as f64 / elapsed.as_secs_f64(),
            steps as f64 / fsyncs.max(1) as f64,
        );
        rates.push((steps_per_s, fsyncs_per_s, process_us, writer_us));
    }
    let [
        (memory, _, memory_cpu, _),
        (sqlite, fsyncs, sqlite_cpu, writer_cpu),
    ] = rates[..]
    else {
        unreachable!("two stores")
    };
    let ratio = sqlite / memory;
    vec![
        Row::new(
            "engine",
            format!("{runs} concurrent scripted runs, memory"),
            format!("{memory:.0} steps/s"),
            "",
            None,
        ),
        Row::new(
            "engine",
            format!("{runs} concurrent scripted runs, SQLite / memory steps/s"),
            format!("{ratio:.2}× ({sqlite:.0} steps/s, {fsyncs:.0} fsyncs/s)"),
            format!(
                "≥ 0.5× (CPU per step: memory {memory_cpu:.0} µs, SQLite {sqlite_cpu:.0} µs, {writer_cpu:.0} µs of it on the one writer thread)"
            ),
            Some(ratio >= 0.5),
        ),
    ]
}

/// The name SQLite's writer thread runs under (`store/sqlite`).
const WRITER_THREAD: &str = "warden-store-wr";

/// CPU time (user and system) of this process's threads named `name`, or
/// of the whole process, in ms, from `/proc` (clock ticks of 10 ms; 0
/// where there is no `/proc`).
fn thread_cpu_ms(name: Option<&str>) -> u64 {
    let ticks = |stat: &str| -> u64 {
        // The fields after the command, whose name may hold spaces.
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        field(11) + field(12)
    };
    let Some(name) = name else {
        return ticks(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default()) * 10;
    };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .map(|t| ticks(&std::fs::read_to_string(t.path().join("stat")).unwrap_or_default()) * 10)
        .sum()
}

async fn parked_memory_bench(dir: &Path, sandbox: &Sandbox, runs: usize) -> Row {
    let agent = agent(dir, "parked", 1, true);
    let store: Arc<dyn EventStore> = Arc::new(SqliteStore::open(dir.join("parked.db")).unwrap());
    let runtime = Runtime::new(store, PluginHost::new(sandbox.clone()));
    let warm = RunId::new("warm").unwrap();
    runtime
        .start(&agent, json!("go"), StartOptions::new().id(warm.clone()))
        .await
        .unwrap();
    runtime.drive(&warm, &agent).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = rss_bytes();
    for i in 0..runs {
        let run = RunId::new(format!("parked-{i}")).unwrap();
        runtime
            .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
            .await
            .unwrap();
        assert_eq!(
            runtime.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingApproval
        );
    }
    let after = rss_bytes();
    let per_run = (after.saturating_sub(before)) as f64 / runs as f64 / 1024.0;
    println!(
        "memory per parked run: {per_run:.1} KiB of resident memory over {runs} runs parked for approval (the runtime keeps no per-run state; what grows is the store's cache)",
    );
    Row::new(
        "engine",
        "resident memory per parked run",
        format!("{per_run:.1} KiB"),
        "",
        None,
    )
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
