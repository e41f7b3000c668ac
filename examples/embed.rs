//! Embedding Warden in a Rust program: start a run whose write needs
//! approval and stop; approve it from a second process, which finishes the
//! run. The run lives in the SQLite store between the two processes.
//!
//! ```sh
//! cargo run --example embed -- start
//! cargo run --example embed -- approve <RUN> <CALL>   # as printed by start
//! ```
//!
//! The agent is `examples/agents/notes.toml` (the built-in `fs` plugin over a
//! notes folder, driven by a scripted model so it runs offline), copied into
//! `.warden/embed-demo/` so the example's write lands there.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use warden::engine::StartOptions;

use anyhow::{Context, bail};
use serde_json::json;
use warden::engine::events::Event;
use warden::engine::{Agent, CallId, RunId, RunStatus, Runtime};
use warden::plugins::PluginHost;
use warden::sandbox::{Sandbox, SandboxConfig};
use warden::store::SqliteStore;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let work = PathBuf::from(".warden/embed-demo");
    std::fs::create_dir_all(".warden")?;
    let store = SqliteStore::open(".warden/embed.db").context("cannot open the store")?;
    let sandbox = Sandbox::new(SandboxConfig {
        cache_dir: Some(PathBuf::from(".warden/cache")),
        ..SandboxConfig::default()
    })?;
    let runtime = Runtime::new(Arc::new(store), PluginHost::new(sandbox));

    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["start"] => {
            copy_agent(&work)?;
            let agent = Agent::load(&work.join("notes.toml").canonicalize()?, None)?;
            let run = runtime
                .start(&agent, json!("Summarise my notes"), StartOptions::new())
                .await?;
            let status = runtime.drive(&run, &agent).await?;
            println!("run {run} is {status}");
            if status == RunStatus::AwaitingApproval {
                let call = pending_approval(&runtime, &run).await?;
                println!("approve it with: cargo run --example embed -- approve {run} {call}");
            }
        }
        ["approve", run, call] => {
            let run = RunId::new(*run)?;
            let agent = Agent::load(&work.join("notes.toml").canonicalize()?, None)?;
            runtime
                .approve(&run, &CallId::from_text(*call), "embed-example")
                .await?;
            let status = runtime.drive(&run, &agent).await?;
            println!("run {run} is {status}");
            if let Some(Event::RunCompleted(done)) = runtime.events(&run).await?.last() {
                println!("output: {}", done.output);
            }
        }
        _ => bail!("usage: embed start | embed approve <RUN> <CALL>"),
    }
    Ok(())
}

/// The call a parked run waits on.
async fn pending_approval(runtime: &Runtime, run: &RunId) -> anyhow::Result<CallId> {
    runtime
        .events(run)
        .await?
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::ApprovalRequested(a) => Some(a.call_id.clone()),
            _ => None,
        })
        .context("no approval was requested")
}

/// Copies the demo agent, its transcript and its notes folder to `to`, and
/// makes the `out` folder its channel delivers to.
fn copy_agent(to: &Path) -> anyhow::Result<()> {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    std::fs::create_dir_all(to.join("notes"))?;
    std::fs::create_dir_all(to.join("out"))?;
    for file in ["notes.toml", "notes.transcript.toml"] {
        std::fs::copy(from.join(file), to.join(file))?;
    }
    for entry in std::fs::read_dir(from.join("notes"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join("notes").join(entry.file_name()))?;
    }
    Ok(())
}
