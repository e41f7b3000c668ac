//! Benchmark of sessions, printing figures: how long a start in a session
//! takes (reading the session, fixing the history, the checked create) as
//! the session grows to 800 completed turns, on the in-memory, SQLite and
//! PostgreSQL stores, and how big the recorded `run_started` gets. The
//! target (issue 46): the median start around turn 800 at most 1.2× the
//! median start around turn 100, printed as a ratio.
//!
//! `cargo bench -p warden-tests --bench sessions`. `SESSION_BENCH_TURNS`
//! changes the number of turns (default 800); PostgreSQL is the server at
//! `WARDEN_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`,
//! a fresh schema dropped afterwards).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::{Event, RunStarted, SessionStart};
use warden::engine::{Agent, RunStatus, Runtime, SessionId};
use warden::plugins::PluginHost;
use warden::providers::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderEvent, StopReason, Usage,
};
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::{EventStore, MemoryStore, PostgresStore, SqliteStore};

#[path = "table.rs"]
mod table;
use crate::table::Row;

/// Answers every request with a 200-byte echo of its last user message.
struct Echo;

impl ModelProvider for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        let last = match request.messages.last() {
            Some(Message::User { content }) => content.clone(),
            _ => String::new(),
        };
        let text = format!("{last:-<200}");
        Box::pin(futures::stream::iter(
            [
                ProviderEvent::TextDelta(text),
                ProviderEvent::Usage(Usage {
                    input_tokens: 10,
                    output_tokens: 50,
                }),
                ProviderEvent::Stop(StopReason::EndTurn),
            ]
            .map(Ok),
        ))
    }
}

fn agent(dir: &Path) -> Agent {
    std::fs::write(
        dir.join("transcript.toml"),
        "[[turns]]\ntext = \"(replaced by the echo model)\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("agent.toml"),
        "name = \"chat\"\ninstructions = \"Chat.\"\n[model]\nprovider = \"scripted\"\nname = \"s\"\ntranscript = \"transcript.toml\"\n",
    )
    .unwrap();
    Agent::load(&dir.join("agent.toml"), None).unwrap()
}

fn main() {
    run();
}

/// Measures and prints; returns the figures for the table.
pub(crate) fn run() -> Vec<Row> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let turns: usize = std::env::var("SESSION_BENCH_TURNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(800)
        .max(2);
    rt.block_on(async {
        let mut rows = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let agent = agent(dir.path());
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let mut stores: Vec<(&str, Arc<dyn EventStore>)> = vec![
            ("memory", Arc::new(MemoryStore::new())),
            (
                "sqlite",
                Arc::new(SqliteStore::open(dir.path().join("sessions.db")).unwrap()),
            ),
        ];
        let base = std::env::var("WARDEN_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let schema = format!("warden_bench_sessions_{}", std::process::id());
        let sep = if base.contains('?') { '&' } else { '?' };
        match PostgresStore::open(&format!("{base}{sep}schema={schema}")).await {
            Ok(store) => stores.push(("postgres", Arc::new(store))),
            Err(error) => rows.push(Row::new(
                "sessions",
                "start in a session (postgres)",
                "not run",
                format!("PostgreSQL at {base}: {error}"),
                Some(false),
            )),
        }
        for (name, store) in stores {
            let runtime = Runtime::new(store, PluginHost::new(sandbox.clone()))
                .with_provider(Arc::new(Echo));
            let session = SessionId::new("bench").unwrap();
            let mut starts = Vec::with_capacity(turns);
            let mut history_bytes = 0;
            // Every run's `run_started`, summed: with the history copied
            // into each, it grows with the square of the session's length.
            let mut started_bytes = 0;
            let mut last_run = None;
            for turn in 0..turns {
                let began = Instant::now();
                let run = runtime
                    .start(&agent, json!(format!("turn {turn}")), StartOptions::new().session(session.clone()))
                    .await
                    .unwrap();
                starts.push(began.elapsed());
                let status = runtime.drive(&run, &agent).await.unwrap();
                assert_eq!(status, RunStatus::Completed);
                started_bytes += runtime.store().load(&run).await.unwrap()[0].bytes.len();
                last_run = Some(run.clone());
                if turn + 1 == turns {
                    let bytes = runtime.store().load(&run).await.unwrap()[0].bytes.len();
                    history_bytes = bytes;
                    println!(
                        "{name}: run_started of turn {turns} holds {} history messages, {bytes} bytes",
                        2 * (turns - 1)
                    );
                }
            }
            // The shared chunks the last run's history names.
            let chunk_bytes: usize = match runtime.events(&last_run.unwrap()).await.unwrap().remove(0) {
                Event::RunStarted(RunStarted {
                    session: Some(SessionStart { chain: Some(chain), .. }),
                    ..
                }) => runtime
                    .store()
                    .load_history(&chain.head)
                    .await
                    .unwrap()
                    .iter()
                    .map(|c| c.body().len())
                    .sum(),
                _ => 0,
            };
            println!(
                "{name}: history stored over {turns} turns: {} bytes (run_started of every run {started_bytes}, shared chunks {chunk_bytes})",
                started_bytes + chunk_bytes
            );
            let at = |n: usize| starts[n.min(turns) - 1];
            let window = |from: usize| {
                let slice = &starts[from.min(turns) - 1..];
                slice.iter().sum::<Duration>() / slice.len() as u32
            };
            println!(
                "{name}: start_in_session at turn 1 {:?}, 10 {:?}, 50 {:?}, 100 {:?}, {turns} {:?}; mean over the last half {:?}",
                at(1),
                at(10),
                at(50),
                at(100),
                at(turns),
                window(turns / 2 + 1),
            );
            // Medians of 21 starts around turn 100 and ending at the last
            // turn: one start is too noisy to compare.
            let early = 100.min(turns / 2).max(1);
            let median = |around: usize| {
                let from = around.saturating_sub(11).min(turns - 1);
                let mut window: Vec<Duration> =
                    starts[from..(from + 21).min(turns)].to_vec();
                window.sort();
                window[window.len() / 2]
            };
            let (at_early, at_last) = (median(early), median(turns - 10));
            let ratio = at_last.as_secs_f64() / at_early.as_secs_f64();
            println!(
                "{name}: median start around turn {early} {at_early:?}, around turn {turns} {at_last:?}: {ratio:.2}× (target ≤ 1.2×)"
            );
            rows.push(Row::new(
                "sessions",
                format!("start in a session at turn {turns} ({name})"),
                format!("{:.2} ms", at_last.as_secs_f64() * 1e3),
                format!("{ratio:.2}× turn {early}'s (≤ 1.2×: flat in the session's length)"),
                Some(ratio <= 1.2),
            ));
            rows.push(Row::new(
                "sessions",
                format!("session storage over {turns} turns ({name})"),
                format!("{} KiB", (started_bytes + chunk_bytes) / 1024),
                format!(
                    "run_started {} KiB + shared chunks {} KiB: O(n), each turn stored once",
                    started_bytes / 1024,
                    chunk_bytes / 1024
                ),
                None,
            ));
            rows.push(Row::new(
                "sessions",
                format!("run_started of turn {turns} ({name})"),
                format!("{history_bytes} bytes"),
                "a reference to the shared history: O(1) per run",
                None,
            ));
        }
        if let Ok((client, connection)) =
            tokio_postgres::connect(base.split('?').next().unwrap(), tokio_postgres::NoTls).await
        {
            tokio::spawn(connection);
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await;
        }
        rows
    })
}
