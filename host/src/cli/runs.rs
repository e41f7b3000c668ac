//! `warden run` and `warden runs …`: start a run and follow it live, and
//! operate runs recorded in the store.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Exit, render};
use crate::engine::events::{Event, decode};
use crate::engine::{
    Agent, CallId, ReplayOptions, RunId, RunStatus, RunUpdate, Runtime, RuntimeError,
};
use crate::plugins::PluginHost;
use crate::store::{EventStore, RunFilter, SqliteStore};

/// Where runs are stored.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The SQLite store file (created if missing).
    #[arg(
        long,
        env = "WARDEN_STORE",
        default_value = ".warden/warden.db",
        global = true
    )]
    store: PathBuf,
}

impl StoreArgs {
    fn open(&self) -> anyhow::Result<Arc<dyn EventStore>> {
        if let Some(dir) = self.store.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("cannot create the store's directory `{}`", dir.display())
            })?;
        }
        let store = SqliteStore::open(&self.store)
            .with_context(|| format!("cannot open the store `{}`", self.store.display()))?;
        Ok(Arc::new(store))
    }
}

/// `warden run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The agent file.
    agent: PathBuf,
    /// The input: JSON, or plain text taken as a string. `@FILE` reads it
    /// from a file.
    input: Option<String>,
    /// The input, as `@FILE` or text (instead of the positional INPUT).
    #[arg(long = "input", conflicts_with = "input")]
    input_flag: Option<String>,
    /// A label for the run (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// The run's id (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Record the run and return without driving it.
    #[arg(long)]
    detach: bool,
    /// Record each model request in full (they may hold secrets).
    #[arg(long)]
    record_prompts: bool,
    /// Print events as JSON lines instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// List runs, newest last.
    List {
        /// Only runs with this status (repeatable).
        #[arg(long)]
        status: Vec<String>,
        /// Only runs of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only runs with this label (repeatable; all must match).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A readable timeline of one run.
    Show {
        /// The run.
        run: String,
    },
    /// The run's raw log, one stored event (JSON) per line.
    Events {
        /// The run.
        run: String,
    },
    /// Check runs' hash chains end to end.
    Verify {
        /// The runs (default: every run).
        runs: Vec<String>,
    },
    /// Replay a run's log against its agent, checking every decision, then
    /// continue it.
    Recover {
        /// The run.
        run: String,
        #[command(flatten)]
        drive: DriveArgs,
        /// Continue even though the agent file changed since the run started.
        #[arg(long)]
        accept_agent_change: bool,
    },
    /// Approve the call awaiting approval, then continue the run.
    Approve {
        /// The run.
        run: String,
        /// The call (as printed when approval was requested).
        call: String,
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Deny the call awaiting approval (the model sees the reason), then
    /// continue the run.
    Deny {
        /// The run.
        run: String,
        /// The call.
        call: String,
        /// Why; the model sees it.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Give a suspended run its input, or a run over budget an extension,
    /// then continue it.
    Resume {
        /// The run.
        run: String,
        /// JSON, or text taken as a string; `@FILE` reads a file.
        #[arg(long)]
        input: String,
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Record the outcome of a write whose completion is missing.
    Resolve {
        /// The run.
        run: String,
        /// The write's output as JSON; `@FILE` reads a file.
        #[arg(long)]
        output: String,
        /// What you checked.
        #[arg(long)]
        note: Option<String>,
        /// Who resolved it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// End a run for good.
    Abandon {
        /// The run.
        run: String,
        /// Why.
        #[arg(long)]
        reason: String,
    },
    /// Cancel a run.
    Cancel {
        /// The run.
        run: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// How a verb that continues a run drives it.
#[derive(Debug, Args)]
pub(crate) struct DriveArgs {
    /// The agent file (default: the file the run was started from).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Who acts (default: $USER).
    #[arg(long)]
    by: Option<String>,
    /// Record the verb and return without continuing the run.
    #[arg(long)]
    detach: bool,
    /// Print events as JSON lines instead of text.
    #[arg(long)]
    json: bool,
}

fn runtime(store: Arc<dyn EventStore>, record_prompts: bool) -> anyhow::Result<Runtime> {
    Ok(Runtime::new(store, PluginHost::new(super::sandbox()?)).with_record_prompts(record_prompts))
}

fn load_agent(path: &Path) -> anyhow::Result<Agent> {
    let path = path
        .canonicalize()
        .with_context(|| format!("cannot read agent `{}`", path.display()))?;
    Ok(Agent::load(&path, None)?)
}

fn run_id(text: &str) -> anyhow::Result<RunId> {
    RunId::new(text).map_err(|e| anyhow::anyhow!("{e}"))
}

fn user(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cli".into())
}

/// JSON, or text taken as a JSON string; `@FILE` reads the file first.
fn json_input(text: &str) -> anyhow::Result<Value> {
    let text = match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read input file `{path}`"))?,
        None => text.to_owned(),
    };
    Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn labels(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--label `{kv}`: expected KEY=VALUE"))
        })
        .collect()
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<()> {
    let agent = load_agent(&args.agent)?;
    let input = match (&args.input, &args.input_flag) {
        (Some(text), _) | (None, Some(text)) => json_input(text)?,
        (None, None) => Value::String(String::new()),
    };
    let labels = labels(&args.labels)?;
    let rt = runtime(args.store.open()?, args.record_prompts)?;
    let run_id = match &args.run_id {
        Some(id) => run_id(id)?,
        None => RunId::from_random(rand::random()),
    };
    // Subscribe before the run exists so the first event is seen too.
    let updates = rt.subscribe(&run_id);
    rt.start_with_labels(&agent, run_id.clone(), input, labels)
        .await?;
    if args.detach {
        println!("{run_id}");
        return Ok(());
    }
    follow(&rt, &run_id, updates, args.json, Drive::Drive(agent)).await
}

pub(crate) async fn runs(cmd: RunsCommand, store: &StoreArgs) -> anyhow::Result<()> {
    let store = store.open()?;
    match cmd {
        RunsCommand::List {
            status,
            agent,
            labels: pairs,
            json,
        } => list(store, status, agent, labels(&pairs)?, json).await,
        RunsCommand::Show { run } => show(store, &run_id(&run)?).await,
        RunsCommand::Events { run } => {
            for e in store.load(&run_id(&run)?).await? {
                println!("{}", String::from_utf8_lossy(&e.bytes));
            }
            Ok(())
        }
        RunsCommand::Verify { runs } => verify(store, runs).await,
        RunsCommand::Recover {
            run,
            drive,
            accept_agent_change,
        } => {
            let run = run_id(&run)?;
            let rt = runtime(store, false)?;
            let agent = agent_of(&rt, &run, drive.agent.as_deref()).await?;
            let updates = rt.subscribe(&run);
            follow(
                &rt,
                &run,
                updates,
                drive.json,
                Drive::Recover(
                    agent,
                    ReplayOptions {
                        accept_agent_change,
                    },
                ),
            )
            .await
        }
        RunsCommand::Approve { run, call, drive } => {
            let run = run_id(&run)?;
            let rt = runtime(store, false)?;
            rt.approve(&run, &CallId::from_text(call), &user(drive.by.clone()))
                .await?;
            continue_run(&rt, &run, drive).await
        }
        RunsCommand::Deny {
            run,
            call,
            reason,
            drive,
        } => {
            let run = run_id(&run)?;
            let rt = runtime(store, false)?;
            rt.deny(
                &run,
                &CallId::from_text(call),
                &user(drive.by.clone()),
                &reason,
            )
            .await?;
            continue_run(&rt, &run, drive).await
        }
        RunsCommand::Resume { run, input, drive } => {
            let run = run_id(&run)?;
            let rt = runtime(store, false)?;
            let agent = agent_of(&rt, &run, drive.agent.as_deref()).await?;
            rt.resume(
                &run,
                &agent,
                json_input(&input)?,
                Some(user(drive.by.clone())),
            )
            .await?;
            continue_run(&rt, &run, drive).await
        }
        RunsCommand::Resolve {
            run,
            output,
            note,
            by,
        } => {
            let run = run_id(&run)?;
            let rt = runtime(store, false)?;
            rt.resolve(&run, json_input(&output)?, &user(by), note)
                .await?;
            println!("resolved; continue with: warden runs recover {run}");
            Ok(())
        }
        RunsCommand::Abandon { run, reason } => {
            let run = run_id(&run)?;
            runtime(store, false)?.abandon(&run, &reason).await?;
            println!("run {run} abandoned");
            Ok(())
        }
        RunsCommand::Cancel { run, reason } => {
            let run = run_id(&run)?;
            runtime(store, false)?.cancel(&run, reason).await?;
            println!("run {run} cancelled");
            Ok(())
        }
    }
}

/// The agent to continue `run` with: `--agent`, else the file it was
/// started from.
async fn agent_of(rt: &Runtime, run: &RunId, given: Option<&Path>) -> anyhow::Result<Agent> {
    if let Some(path) = given {
        return load_agent(path);
    }
    let events = rt.events(run).await?;
    match events.first() {
        Some(Event::RunStarted(s)) => match &s.agent_file {
            Some(file) => load_agent(Path::new(file)),
            None => bail!("run {run} does not record its agent file: pass --agent"),
        },
        _ => bail!("run {run} has no run_started event"),
    }
}

async fn continue_run(rt: &Runtime, run: &RunId, drive: DriveArgs) -> anyhow::Result<()> {
    if drive.detach {
        return Ok(());
    }
    let agent = agent_of(rt, run, drive.agent.as_deref()).await?;
    let updates = rt.subscribe(run);
    follow(rt, run, updates, drive.json, Drive::Drive(agent)).await
}

/// How to continue a run while following it.
#[derive(Clone)]
enum Drive {
    Drive(Agent),
    Recover(Agent, ReplayOptions),
}

impl Drive {
    fn agent(&self) -> &Agent {
        match self {
            Drive::Drive(agent) | Drive::Recover(agent, _) => agent,
        }
    }
}

/// Drives the run while printing its events as they are recorded (and the
/// model's text as it streams), then says how the run stands and what to do
/// next. On a terminal, a call awaiting approval is put to the user, and the
/// run goes on with their answer.
async fn follow(
    rt: &Runtime,
    run: &RunId,
    mut updates: crate::engine::RunUpdates,
    json: bool,
    how: Drive,
) -> anyhow::Result<()> {
    let interactive = !json && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let mut how = how;
    let mut last_seq = 0;
    let status = loop {
        let result =
            drive_and_print(rt, run, &mut updates, json, how.clone(), &mut last_seq).await?;
        let status = match result {
            Ok(status) => status,
            Err(RuntimeError::NeedsReconciliation { run_id, write }) => {
                if json {
                    println!(
                        "{}",
                        json!({ "run_id": run_id.to_string(), "status": "needs_reconciliation", "write": *write })
                    );
                } else {
                    eprintln!(
                        "run {run_id} needs reconciliation: write {} to {} with {} has no recorded outcome",
                        write.call_id,
                        write.tool.model_name(),
                        write.arguments
                    );
                    if let Some(next) =
                        render::next_step(&run_id, RunStatus::NeedsReconciliation, &[])
                    {
                        eprintln!("   {next}");
                    }
                }
                return Err(Exit::NeedsReconciliation.into());
            }
            Err(e) => return Err(e.into()),
        };
        if status == RunStatus::AwaitingApproval && interactive {
            let events = rt.events(run).await?;
            if let Some(call) = events.iter().rev().find_map(|e| match e {
                Event::ApprovalRequested(a) => Some(a.call_id.clone()),
                _ => None,
            }) {
                ask_approval(rt, run, &call).await?;
                how = Drive::Drive(how.agent().clone());
                continue;
            }
        }
        break status;
    };
    let events = rt.events(run).await?;
    if json {
        println!("{}", json!({ "run_id": run.to_string(), "status": status }));
    } else {
        println!("run {run}: {status}");
        if let Some(next) = render::next_step(run, status, &events) {
            println!("   {next}");
        }
    }
    match status {
        RunStatus::Completed => Ok(()),
        RunStatus::AwaitingApproval | RunStatus::Suspended | RunStatus::BudgetExceeded => {
            Err(Exit::Parked.into())
        }
        RunStatus::NeedsReconciliation => Err(Exit::NeedsReconciliation.into()),
        _ => Err(Exit::RunFailed.into()),
    }
}

/// Asks the user at the terminal to approve `call`: `y` approves, anything
/// else denies with that text as the reason.
async fn ask_approval(rt: &Runtime, run: &RunId, call: &CallId) -> anyhow::Result<()> {
    use std::io::Write as _;
    print!("approve {call}? [y = approve, anything else = deny with that reason] ");
    std::io::stdout().flush()?;
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    let answer = answer.trim();
    let by = user(None);
    if answer.eq_ignore_ascii_case("y") || answer.eq_ignore_ascii_case("yes") {
        rt.approve(run, call, &by).await?;
    } else {
        let reason = if answer.is_empty() {
            "denied at the terminal"
        } else {
            answer
        };
        rt.deny(run, call, &by, reason).await?;
    }
    Ok(())
}

/// One drive of the run, printing updates as they come; returns how the
/// drive ended.
async fn drive_and_print(
    rt: &Runtime,
    run: &RunId,
    updates: &mut crate::engine::RunUpdates,
    json: bool,
    how: Drive,
    last_seq: &mut u64,
) -> anyhow::Result<Result<RunStatus, RuntimeError>> {
    let driving = {
        let (rt, run) = (rt.clone(), run.clone());
        tokio::spawn(async move {
            match how {
                Drive::Drive(agent) => rt.drive(&run, &agent).await,
                Drive::Recover(agent, options) => rt.recover(&run, &agent, options).await,
            }
        })
    };
    tokio::pin!(driving);
    let mut in_text = false;
    let result = loop {
        tokio::select! {
            biased;
            update = updates.next() => match update {
                Some(RunUpdate::Event { seq, event }) => {
                    if in_text {
                        println!();
                        in_text = false;
                    }
                    if seq > *last_seq {
                        print_event(seq, &event, json);
                        *last_seq = seq;
                    }
                }
                Some(RunUpdate::TextDelta { text, .. }) if !json => {
                    if !in_text {
                        print!("  ");
                        in_text = true;
                    }
                    print!("{text}");
                }
                Some(_) | None => {}
            },
            result = &mut driving => break result.context("the driver panicked")?,
        }
    };
    if in_text {
        println!();
    }
    // Whatever was recorded after the last update seen.
    for stored in rt.store().load_after(run, *last_seq).await? {
        if let Ok(event) = decode(&stored.bytes) {
            print_event(stored.seq, &event, json);
            *last_seq = stored.seq;
        }
    }
    Ok(result)
}

fn print_event(seq: u64, event: &Event, json: bool) {
    if json {
        println!("{}", json!({ "seq": seq, "event": event }));
    } else if let Some(line) = render::event(event) {
        println!("{line}");
    }
}

async fn list(
    store: Arc<dyn EventStore>,
    status: Vec<String>,
    agent: Option<String>,
    labels: BTreeMap<String, String>,
    json: bool,
) -> anyhow::Result<()> {
    let mut filter = RunFilter::new();
    for s in status {
        filter = filter.status(s);
    }
    if let Some(a) = agent {
        filter = filter.agent(a);
    }
    for (k, v) in labels {
        filter = filter.label(k, v);
    }
    let runs = store.list(&filter).await?;
    if json {
        let rows: Vec<Value> = runs
            .iter()
            .map(|r| {
                json!({
                    "run_id": r.run_id.to_string(),
                    "agent": r.agent,
                    "status": r.status,
                    "labels": r.labels,
                    "created_ms": r.created_ms,
                    "updated_ms": r.updated_ms,
                    "events": r.event_count,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let id_width = runs
        .iter()
        .map(|r| r.run_id.as_str().len())
        .max()
        .unwrap_or(0)
        .max(3);
    let agent_width = runs.iter().map(|r| r.agent.len()).max().unwrap_or(0).max(5);
    println!(
        "{:<id_width$}  {:<agent_width$}  {:<20}  {:>6}  LABELS",
        "RUN", "AGENT", "STATUS", "EVENTS"
    );
    for r in runs {
        let labels: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<id_width$}  {:<agent_width$}  {:<20}  {:>6}  {}",
            r.run_id.as_str(),
            r.agent,
            r.status,
            r.event_count,
            labels.join(",")
        );
    }
    Ok(())
}

async fn show(store: Arc<dyn EventStore>, run: &RunId) -> anyhow::Result<()> {
    for stored in store.load(run).await? {
        let event = decode(&stored.bytes)
            .with_context(|| format!("run {run}: event {} cannot be read", stored.seq))?;
        if let Some(line) = render::event(&event) {
            println!("{:>4}  {line}", stored.seq);
        }
    }
    let summary = store.summary(run).await?;
    println!("status: {}", summary.status);
    Ok(())
}

async fn verify(store: Arc<dyn EventStore>, runs: Vec<String>) -> anyhow::Result<()> {
    let ids = if runs.is_empty() {
        store.run_ids().await?
    } else {
        runs.iter()
            .map(|r| run_id(r))
            .collect::<anyhow::Result<_>>()?
    };
    let mut broken = 0;
    for id in ids {
        let report = store.verify(&id).await?;
        if report.is_intact() {
            println!("{id}: intact ({} events)", report.events_read);
        } else {
            broken += 1;
            println!("{id}: BROKEN");
            for finding in &report.findings {
                println!("   at event {}: {:?}", finding.seq, finding.kind);
            }
        }
    }
    if broken > 0 {
        return Err(Exit::RunFailed.into());
    }
    Ok(())
}
