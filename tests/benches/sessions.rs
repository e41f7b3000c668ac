//! Benchmark of sessions, printing figures: how long a start in a session
//! takes (reading the session, fixing the history, the checked create) as
//! the session grows to 200 completed turns, on the in-memory and SQLite
//! stores, and how big the recorded `run_started` gets.
//!
//! `cargo bench -p warden-tests --bench sessions`. `SESSION_BENCH_TURNS`
//! changes the number of turns (default 200).

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
use warden::store::{EventStore, MemoryStore, SqliteStore};

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
        .unwrap_or(200);
    rt.block_on(async {
        let mut rows = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let agent = agent(dir.path());
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let stores: [(&str, Arc<dyn EventStore>); 2] = [
            ("memory", Arc::new(MemoryStore::new())),
            (
                "sqlite",
                Arc::new(SqliteStore::open(dir.path().join("sessions.db")).unwrap()),
            ),
        ];
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
            let half = (turns / 2).max(1);
            rows.push(Row::new(
                "sessions",
                format!("start in a session at turn {turns} ({name})"),
                format!("{:.2} ms", at(turns).as_secs_f64() * 1e3),
                format!(
                    "{:.2}× turn {half}'s (flat in the session's length: 1×)",
                    at(turns).as_secs_f64() / at(half).as_secs_f64()
                ),
                None,
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
        rows
    })
}
