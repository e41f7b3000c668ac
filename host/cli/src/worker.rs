//! Many hosts: `warden submit` (record a run for workers), `warden worker`
//! (claim and drive runs until SIGTERM or SIGINT) and `warden store
//! migrate`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use warden::engine::StartOptions;

use anyhow::Context as _;
use clap::Args;
use serde_json::json;

use super::Context;
use super::config::StoreLocation;
use super::errors::CliError;
use super::store::Access;
use warden::engine::{RunId, Runtime};
use warden::store::{EventStore, PostgresStore, QUEUED};
use warden::worker::Worker;
use warden_otel::metrics::{MeteredStore, Metrics};

/// `warden submit`.
#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// The agent file (workers load it from the same path).
    agent: PathBuf,
    /// The input: JSON, or plain text taken as a string. `@FILE` reads it
    /// from a file.
    input: Option<String>,
    /// A label for the run (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// The run's id (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Queue the run in this session: it sees the transcripts of the
    /// session's earlier completed runs as history. Refused while another
    /// run of the session is queued or active.
    #[arg(long)]
    session: Option<String>,
}

/// `warden worker`.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The most runs driven at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// How long a claim lasts unless renewed (renewed every third of it); a
    /// dead worker's runs are taken over after it.
    /// (`--lease-ttl`, its name before run leases became claims, still works.)
    #[arg(long, alias = "lease-ttl", default_value = "15s")]
    claim_ttl: String,
    /// How long an idle worker waits before looking for work again.
    #[arg(long, default_value = "250ms")]
    poll: String,
    /// On SIGTERM or SIGINT: how long runs in progress may go on before
    /// their drives are abandoned and their claims released.
    #[arg(long, default_value = "10s")]
    grace: String,
    /// The worker's id in its claims (default: HOST:PID:RANDOM).
    #[arg(long)]
    id: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (a loopback
    /// address, such as 127.0.0.1:9464; port 0 picks one): the store's run,
    /// tool-call, token and park counts, and this worker's append latency.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    warden::units::parse_duration(text)
        .map_err(|e| CliError::new("usage", format!("{flag}: {e}")).into())
}

/// Opens the store the settings name for `access` (see `cli/store.rs`).
async fn open(ctx: &Context, access: Access) -> anyhow::Result<Arc<dyn EventStore>> {
    super::store::open(&ctx.settings, access).await
}

/// The command line's runtime (`runs::runtime`: settings, the witness).
fn runtime(ctx: &Context, store: Arc<dyn EventStore>) -> anyhow::Result<Runtime> {
    Ok(super::runs::runtime(ctx, store)?.0)
}

/// `warden submit`: records the run as queued and prints its id.
pub(crate) async fn submit(args: SubmitArgs, ctx: &Context) -> anyhow::Result<()> {
    let agent = ctx.settings.load_agent(&args.agent)?;
    super::args::text_path("agent file", &agent.path, "the run's log")?;
    let input = super::runs::run_input(args.input.as_deref(), &agent)?;
    let labels = super::runs::labels(&args.labels)?;
    let run_id = match &args.run_id {
        Some(id) => {
            RunId::new(id.as_str()).map_err(|e| CliError::new("invalid_run_id", e.to_string()))?
        }
        None => RunId::from_random(rand::random()),
    };
    let session = args
        .session
        .as_deref()
        .map(super::sessions::session_id)
        .transpose()?;
    let rt = runtime(ctx, open(ctx, Access::Start).await?)?;
    let mut options = StartOptions::new().id(run_id.clone()).labels(labels);
    if let Some(session) = &session {
        options = options.session(session.clone());
    }
    rt.submit(&agent, input, options).await?;
    if ctx.json {
        let next: Vec<_> = super::status::next_steps(run_id.as_str(), QUEUED, false)
            .into_iter()
            .map(|s| s.step)
            .collect();
        let mut body = super::contract::summary(&run_id, QUEUED, &[], None, &next);
        if let Some(session) = &session {
            body["session"] = json!(session);
        }
        println!("{body}");
    } else {
        println!("{run_id}");
    }
    Ok(())
}

/// `warden worker`: claims and drives runs until SIGTERM or SIGINT.
pub(crate) async fn worker(args: WorkerArgs, ctx: &Context) -> anyhow::Result<()> {
    // Signals first: a worker stopped while it starts still stops cleanly.
    let stop = shutdown_signal()?;
    let store = open(ctx, Access::Write).await?;
    // Appends go through the metered store, so the metrics have their latency.
    let metered = MeteredStore::new(store);
    let metrics_at = match args.metrics {
        Some(addr) => {
            let metrics = Arc::new(Metrics::new(Arc::new(metered.clone())).with_appends(&metered));
            Some(super::otel::serve_metrics(addr, metrics, ctx.settings.serve_connections).await?)
        }
        None => None,
    };
    let rt = runtime(ctx, Arc::new(metered))?;
    let settings = ctx.settings.clone();
    let mut builder = Worker::builder(rt)
        .concurrency(args.concurrency)
        .claim_ttl(duration("--claim-ttl", &args.claim_ttl)?)
        .poll(duration("--poll", &args.poll)?)
        .grace(duration("--grace", &args.grace)?)
        .agent_loader(Arc::new(move |path: &Path| {
            settings.load_agent(path).map_err(|e| e.to_string())
        }));
    if let Some(id) = args.id {
        builder = builder.owner(id);
    }
    let worker = builder.build()?;
    if let Some(addr) = metrics_at {
        eprintln!("worker metrics at http://{addr}/metrics");
    }
    // The line that says the worker is ready.
    eprintln!(
        "worker {} on {}: up to {} runs at once",
        worker.owner(),
        ctx.settings.store.value,
        args.concurrency
    );
    let report = worker.run(stop).await;
    let summary = json!({
        "worker": worker.owner(),
        "claimed": report.claimed,
        "settled": report.settled,
        "lost": report.lost,
        "failed": report.failed,
        "released": report.released,
    });
    if ctx.json {
        println!("{summary}");
    } else {
        eprintln!(
            "worker {} stopped: {} claimed, {} settled, {} lost to another driver, {} failed, {} released",
            worker.owner(),
            report.claimed,
            report.settled,
            report.lost,
            report.failed,
            report.released
        );
    }
    Ok(())
}

/// Completes on SIGTERM or SIGINT (Ctrl-C). The handlers are installed
/// when this returns, before the future is first polled.
pub(crate) fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// `warden store migrate`: applies pending migrations (opening does too)
/// and says which.
pub(crate) async fn migrate(ctx: &Context) -> anyhow::Result<()> {
    let applied = match &ctx.settings.store.value {
        StoreLocation::Postgres(url) => {
            let (store, applied) = PostgresStore::builder(url)
                .open_and_migrate()
                .await
                .context("cannot migrate the PostgreSQL store")?;
            drop(store);
            applied
        }
        StoreLocation::Sqlite(_) => {
            // Opening a SQLite store migrates it.
            open(ctx, Access::Start).await?;
            Vec::new()
        }
    };
    if ctx.json {
        println!(
            "{}",
            json!({ "store": ctx.settings.store.value.to_string(), "applied": applied })
        );
    } else if applied.is_empty() {
        println!("{}: the schema is current", ctx.settings.store.value);
    } else {
        println!(
            "{}: applied migrations {applied:?}",
            ctx.settings.store.value
        );
    }
    Ok(())
}
