//! `warden run` and `warden runs …`: start a run and follow it live, and
//! operate runs recorded in the store.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use warden::engine::StartOptions;
use warden::engine::approval_prompt::ApprovalPrompt;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::config::Settings;
use super::contract::{self, NextStep};
use super::errors::CliError;
use super::progress::Spinner;
use super::store::Access;
use super::{Context, Exit, render};
use warden::engine::budget::{BudgetKind, check_input_size, parse_extension};
use warden::engine::events::{Event, UnresolvedWrite, decode};
use warden::engine::{
    Agent, ApprovalScope, BudgetLimits, CallId, FORKED_FROM_LABEL, ForkOptions, ReplayOptions,
    RunId, RunState, RunStatus, RunUpdate, Runtime, RuntimeError, fold,
};
use warden::plugins::PluginHost;
use warden::store::{EventStore, PruneFilter, RunFilter, RunSummary};

/// `warden run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The agent file.
    agent: PathBuf,
    /// The input: JSON, or plain text taken as a string. `@FILE` reads it
    /// from a file.
    input: Option<String>,
    /// The input, as `@FILE`, JSON or text (instead of the positional INPUT).
    #[arg(long = "input", conflicts_with = "input")]
    input_flag: Option<String>,
    /// A label for the run (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// The run's id (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Start the run in this session: it sees the transcripts of the
    /// session's earlier completed runs as history. Refused while another
    /// run of the session is active (running or parked).
    #[arg(long, value_name = "SESSION")]
    session: Option<String>,
    /// Record the run as queued and return without driving it: a worker
    /// takes it, or `warden runs resume RUN` drives it.
    #[arg(long, conflicts_with = "follow")]
    detach: bool,
    /// Drive the run and print its events as they happen (the default).
    #[arg(long)]
    follow: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// List runs, oldest first; runs marked running with no activity for a
    /// while are flagged as stalled.
    List(ListArgs),
    /// A readable timeline of one run: steps, tool calls with receipts,
    /// approvals, errors, budget use, and what to do next.
    Show {
        /// The run.
        run: String,
        /// The agent file, for the budget limits (default: the file the
        /// run was started from, when it can still be read).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Under each model call, the recorded prompt: the quoted context
        /// in full, and what else the request held (prompts are recorded
        /// with `--record-prompts`).
        #[arg(long)]
        prompts: bool,
        /// Then follow the run live: each event as another process (a
        /// worker, `warden serve`, a `runs approve`) records it, until the
        /// run ends. Ctrl-C stops following; the run goes on.
        #[arg(long)]
        follow: bool,
    },
    /// The run's log, one event line (`{"v", "seq", "event"}`, JSON) per
    /// event, with or without --json.
    Events {
        /// The run.
        run: String,
    },
    /// Check runs' hash chains end to end.
    Verify {
        /// The runs (default: every run).
        runs: Vec<String>,
        /// Also check each run against the chain heads `warden store
        /// witness` recorded (a file, or a directory of them): a log with
        /// fewer events than its witness saw, or another head, is broken.
        #[arg(long, value_name = "PATH", env = "WARDEN_WITNESS")]
        witness: Option<PathBuf>,
    },
    /// Replay a run's log against its agent, checking every decision, then
    /// continue it.
    Recover {
        /// The run.
        run: String,
        #[command(flatten)]
        drive: DriveArgs,
        /// Refuse unless the run's log holds everything `warden store
        /// witness` recorded of it (a file, or a directory of them).
        #[arg(long, value_name = "PATH", env = "WARDEN_WITNESS")]
        witness: Option<PathBuf>,
    },
    /// Approve the call awaiting approval, then continue the run.
    Approve {
        /// The run.
        run: String,
        /// The call (as printed when approval was requested).
        call: String,
        /// Refuse (`digest_mismatch`, nothing recorded) unless the call's
        /// digest is this one, as `warden runs show` printed it: approve
        /// exactly the call you saw.
        #[arg(long, value_name = "DIGEST")]
        digest: Option<String>,
        /// How far the approval reaches: `call` (this call only), `run`
        /// (and later calls of the same tool in this run) or `session` (in
        /// any run of its session); a wider scope is a standing rule,
        /// listed and revoked with `warden approvals`.
        #[arg(long, default_value = "call", value_parser = ["call", "run", "session"])]
        scope: String,
        /// With `--scope run|session`: the rule expires after this long
        /// (`30m`, `8h`); default: never.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
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
    /// Continue a run, whatever it waits for: a suspended run takes
    /// `--input`, a run over budget takes an extension as `--input`, a run
    /// marked running that no process drives is recovered; a run awaiting
    /// approval or with a write of unknown outcome is refused with what to
    /// do instead.
    Resume {
        /// The run.
        run: String,
        /// JSON, or text taken as a string; `@FILE` reads a file.
        #[arg(long)]
        input: Option<String>,
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Report the output of an external tool call the run waits for (what
    /// the application would do with `Runtime::complete_external`), then
    /// continue the run.
    Complete {
        /// The run.
        run: String,
        /// The call.
        call: String,
        /// The output as JSON; `@FILE` reads a file.
        #[arg(long)]
        output: String,
        #[command(flatten)]
        drive: DriveArgs,
    },
    /// Record the outcome of a write whose completion is missing.
    Resolve {
        /// The run.
        run: String,
        /// The write's output as JSON; `@FILE` reads a file. Not needed for
        /// a run restored from a backup, which goes on from its log.
        #[arg(long)]
        output: Option<String>,
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
        /// Who abandons it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Cancel a run.
    Cancel {
        /// The run.
        run: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
        /// Who cancels it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Fork a run at a position of its log: a new run that inherits the
    /// events up to there (reused, never executed again) and goes on by
    /// itself, with the same agent or a changed one. A write in flight
    /// there needs reconciliation in the fork; an approval granted there for
    /// a call that had not run is asked again.
    Fork {
        /// The run.
        run: String,
        /// The last position the fork inherits (as `warden runs show` and
        /// `warden runs events` number them; 1 keeps only the start).
        #[arg(long, value_name = "POSITION")]
        at: u64,
        /// The agent file the fork goes on with (default: the run's own):
        /// other instructions, model, tools or budgets.
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Budgets replacing those in force, as JSON with the agent file's
        /// budget settings: '{"max_steps": 20, "max_wall_time": "10m"}'.
        #[arg(long, value_name = "JSON")]
        budgets: Option<String>,
        /// The fork's id (default: random).
        #[arg(long)]
        run_id: Option<String>,
        /// Who forks it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Erase finished runs for good: each run's log (inputs, outputs,
    /// recorded prompts), labels and listing row are deleted, and a
    /// tombstone is kept (id, agent, status, times, event count, chain
    /// head), so the id is never reused and a lookup says it was pruned.
    Prune {
        /// Runs whose last activity is older than this: a duration back
        /// from now (30d, 12h) or a UTC date or time.
        #[arg(long, value_name = "WHEN", alias = "completed-before")]
        older_than: String,
        /// Only runs with this status (repeatable; terminal statuses only;
        /// default: completed, failed, cancelled and abandoned).
        #[arg(long)]
        status: Vec<String>,
        /// List what would be pruned; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `warden runs list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only runs with this status (repeatable): queued, running,
    /// awaiting_approval, suspended, awaiting_external, awaiting_child,
    /// budget_exceeded, waiting, needs_reconciliation, completed, failed, cancelled,
    /// abandoned.
    #[arg(long)]
    status: Vec<String>,
    /// Only runs of this agent.
    #[arg(long)]
    agent: Option<String>,
    /// Only runs of this session.
    #[arg(long)]
    session: Option<String>,
    /// Only runs with this label (repeatable; all must match).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Only runs created since: a duration back from now (30m, 2h, 7d) or a
    /// UTC date or time (2025-01-31, 2025-01-31T12:00:00Z).
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Group runs: waiting for a human or a time, in progress, terminal.
    #[arg(long)]
    group: bool,
    /// Flag a run marked running as stalled after this long without
    /// activity.
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    stalled_after: String,
}

/// How long a run marked running may go without an append before `runs
/// show` calls it stalled (`runs list --stalled-after`'s default).
const DEFAULT_STALLED_AFTER_MS: i64 = 10 * 60_000;

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
    /// Continue even though the agent file changed since the run started:
    /// the log is replayed against the file as it is now (its recorded
    /// decisions must still hold; its prompts may differ). Without it, a
    /// changed agent file is refused before anything is recorded.
    #[arg(long)]
    accept_agent_change: bool,
}

/// Opens the store the settings name for `access` (see `cli/store.rs`).
pub(crate) async fn open_store(
    settings: &Settings,
    access: Access,
) -> anyhow::Result<Arc<dyn EventStore>> {
    super::store::open(settings, access).await
}

/// The runtime over `store`, with the settings' labels, prompt recording
/// and component cache, and the plugin host it loads plugins with.
pub(crate) fn runtime(
    ctx: &Context,
    store: Arc<dyn EventStore>,
) -> anyhow::Result<(Runtime, PluginHost)> {
    let host = super::plugin_host(&ctx.settings)?;
    let mut rt = Runtime::new(store, host.clone())
        .with_record_prompts(ctx.settings.record_prompts.value)
        .with_labels(ctx.settings.labels.value.clone())
        .with_ceilings(ctx.settings.run_ceilings);
    // Every verb that records on a run (and `serve`, `mcp serve`,
    // `worker`, which build their runtimes here) checks it against the
    // witness first, in the engine's one write path.
    if let Some(witness) = super::witness::from_env(&ctx.settings)? {
        rt = rt.with_witness(witness);
    }
    Ok((rt, host))
}

pub(crate) fn run_id(text: &str) -> anyhow::Result<RunId> {
    RunId::new(text).map_err(|e| CliError::new("invalid_run_id", e.to_string()).into())
}

/// Who a verb is recorded as done by: `--by`, else the login name
/// (`$USER`, `$LOGNAME`), else the account of the process's user id as
/// `/etc/passwd` names it, else `uid N`. Never a made-up name.
pub(crate) fn user(by: Option<String>) -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    by.or_else(|| env("USER"))
        .or_else(|| env("LOGNAME"))
        .unwrap_or_else(account)
}

/// The account of the process's real user id, as `/etc/passwd` names it.
#[cfg(unix)]
pub(crate) fn account() -> String {
    use std::os::unix::fs::MetadataExt as _;
    // The owner of /proc/self is the process's real user id.
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return "unknown user".into();
    };
    let named = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                (fields.nth(1)? == uid.to_string()).then(|| name.to_owned())
            })
        });
    named.unwrap_or_else(|| format!("uid {uid}"))
}

#[cfg(not(unix))]
pub(crate) fn account() -> String {
    std::env::var("USERNAME").unwrap_or_else(|_| "unknown user".into())
}

/// JSON, or text taken as a JSON string; `@FILE` reads the file first.
pub(crate) fn json_input(text: &str) -> anyhow::Result<Value> {
    let text = match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| {
            CliError::new(
                "input_unreadable",
                format!("cannot read input file `{path}`: {e}"),
            )
            .with_details(json!({ "file": path }))
        })?,
        None => text.to_owned(),
    };
    Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A new run's input (`--input` or the positional INPUT, else the empty
/// string), refused when over the agent's `max_input_size` before anything
/// (not even the store) is touched.
pub(crate) fn run_input(text: Option<&str>, agent: &Agent) -> anyhow::Result<Value> {
    let input = match text {
        Some(text) => json_input(text)?,
        None => Value::String(String::new()),
    };
    check_input_size(&input, agent.max_input_bytes).map_err(|error| {
        RuntimeError::InputTooLarge {
            run_id: None,
            error,
        }
    })?;
    Ok(input)
}

pub(crate) fn labels(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| {
                    CliError::new("usage", format!("--label `{kv}`: expected KEY=VALUE")).into()
                })
        })
        .collect()
}

pub(crate) async fn run(args: RunArgs, ctx: &Context) -> anyhow::Result<()> {
    let agent = ctx.settings.load_agent(&args.agent)?;
    super::args::text_path("agent file", &agent.path, "the run's log")?;
    let input = run_input(args.input.as_deref().or(args.input_flag.as_deref()), &agent)?;
    let labels = labels(&args.labels)?;
    let session = args
        .session
        .as_deref()
        .map(super::sessions::session_id)
        .transpose()?;
    let run_id = match &args.run_id {
        Some(id) => run_id(id)?,
        None => RunId::from_random(rand::random()),
    };
    let (rt, host) = runtime(ctx, open_store(&ctx.settings, Access::Start).await?)?;
    // Everything the run needs is checked before anything is recorded.
    super::agent::check(&host, &agent).await?;
    if args.detach {
        // Queued: what drives it is a worker, or a later `runs resume`.
        let mut options = StartOptions::new().id(run_id.clone()).labels(labels);
        if let Some(session) = &session {
            options = options.session(session.clone());
        }
        rt.submit(&agent, input, options).await?;
        if ctx.json {
            let next = steps(super::status::next_steps(
                run_id.as_str(),
                warden::store::QUEUED,
                false,
            ));
            println!(
                "{}",
                contract::summary(&run_id, warden::store::QUEUED, &[], None, &next)
            );
        } else {
            println!("{run_id}");
            if !super::quiet() {
                eprintln!(
                    "run {run_id}: queued; {}",
                    super::status::next(run_id.as_str(), warden::store::QUEUED, false)
                        .unwrap_or_default()
                );
            }
        }
        return Ok(());
    }
    // Subscribe before the run exists so the first event is seen too.
    let updates = rt.subscribe(&run_id);
    let mut options = StartOptions::new().id(run_id.clone()).labels(labels);
    if let Some(session) = &session {
        options = options.session(session.clone());
    }
    rt.start(&agent, input, options).await?;
    follow(&rt, &run_id, updates, ctx.json, Drive::Drive(agent), 0).await
}

pub(crate) async fn runs(cmd: RunsCommand, ctx: &Context) -> anyhow::Result<()> {
    let access = match &cmd {
        RunsCommand::List(_)
        | RunsCommand::Show { .. }
        | RunsCommand::Events { .. }
        | RunsCommand::Verify { .. } => Access::Read,
        _ => Access::Write,
    };
    let store = open_store(&ctx.settings, access).await?;
    match cmd {
        RunsCommand::List(args) => list(store, args, ctx.json).await,
        RunsCommand::Show {
            run,
            agent,
            prompts,
            follow,
        } => {
            if follow && ctx.json {
                return Err(CliError::new(
                    "usage",
                    "--follow prints the timeline as text: for JSON, `warden runs events RUN` prints the log's event lines",
                )
                .into());
            }
            show(ctx, store, &run_id(&run)?, agent, prompts, follow).await
        }
        RunsCommand::Events { run } => {
            // The same event lines with or without --json: this command's
            // output is JSON either way.
            let run = run_id(&run)?;
            for e in store.load(&run).await? {
                let line = contract::stored_line(e.seq, &e.bytes).map_err(|error| {
                    CliError::new(
                        "log_unreadable",
                        format!("run {run}: event {} is not JSON: {error}", e.seq),
                    )
                    .with_details(json!({ "run_id": run, "seq": e.seq }))
                })?;
                println!("{line}");
            }
            Ok(())
        }
        RunsCommand::Verify { runs, witness } => {
            let witness = match &witness {
                Some(path) => Some(super::witness::read(path, &ctx.settings)?),
                None => None,
            };
            verify(store, runs, witness, ctx.json).await
        }
        RunsCommand::Recover {
            run,
            drive,
            witness,
        } => {
            let run = run_id(&run)?;
            if let Some(path) = &witness {
                let witness = super::witness::read(path, &ctx.settings)?;
                if let Some(problem) = witness.check(&*store, &run).await? {
                    return Err(CliError::new(
                        "rolled_back",
                        format!(
                            "run {run} is not recovered: {problem} (witness `{}`)",
                            path.display()
                        ),
                    )
                    .with_details(json!({ "run_id": run, "witness": path, "problem": problem }))
                    .into());
                }
            }
            let (rt, host) = runtime(ctx, store)?;
            recover(ctx, &rt, &host, &run, &drive).await
        }
        RunsCommand::Approve {
            run,
            call,
            digest,
            scope,
            expires,
            drive,
        } => {
            let run = run_id(&run)?;
            let (rt, host) = runtime(ctx, store)?;
            let plan = ready_to_drive(ctx, &rt, &host, &run, &drive).await?;
            let scope = match scope.as_str() {
                "run" => ApprovalScope::Run,
                "session" => ApprovalScope::Session,
                _ => ApprovalScope::Call,
            };
            let expires_ms = match expires {
                None => None,
                Some(text) => {
                    let after = warden::units::parse_duration(&text)
                        .map_err(|e| CliError::new("usage", format!("--expires: {e}")))?;
                    Some(now_ms() + after.as_millis() as i64)
                }
            };
            let rule = rt
                .approve_scoped(
                    &run,
                    &CallId::from_text(call),
                    &user(drive.by.clone()),
                    digest.as_deref(),
                    scope,
                    expires_ms,
                )
                .await?;
            if let Some(rule) = rule {
                // On stderr: stdout is the run's, as for every approve.
                eprintln!(
                    "note: rule {} approves later calls of the tool in this {}; revoke with: warden approvals revoke {}",
                    rule.id,
                    if scope == ApprovalScope::Run {
                        "run"
                    } else {
                        "session"
                    },
                    rule.id
                );
            }
            continue_run(ctx, &rt, &run, plan).await
        }
        RunsCommand::Deny {
            run,
            call,
            reason,
            drive,
        } => {
            let run = run_id(&run)?;
            let (rt, host) = runtime(ctx, store)?;
            let plan = ready_to_drive(ctx, &rt, &host, &run, &drive).await?;
            rt.deny(
                &run,
                &CallId::from_text(call),
                &user(drive.by.clone()),
                &reason,
            )
            .await?;
            continue_run(ctx, &rt, &run, plan).await
        }
        RunsCommand::Resume { run, input, drive } => {
            let run = run_id(&run)?;
            let (rt, host) = runtime(ctx, store)?;
            resume(ctx, &rt, &host, &run, input, drive).await
        }
        RunsCommand::Complete {
            run,
            call,
            output,
            drive,
        } => {
            let run = run_id(&run)?;
            let (rt, host) = runtime(ctx, store)?;
            let output = json_input(&output)?;
            let plan = ready_to_drive(ctx, &rt, &host, &run, &drive).await?;
            rt.complete_external(
                &run,
                &CallId::from_text(call),
                output,
                Some(user(drive.by.clone())),
            )
            .await?;
            continue_run(ctx, &rt, &run, plan).await
        }
        RunsCommand::Resolve {
            run,
            output,
            note,
            by,
        } => {
            let run = run_id(&run)?;
            let (rt, _) = runtime(ctx, store)?;
            let output = match output {
                Some(text) => json_input(&text)?,
                None if rt.state(&run).await?.held().is_some() => Value::Null,
                None => {
                    return Err(CliError::new(
                        "usage",
                        format!(
                            "run {run}: resolving a write takes --output '<its output as JSON>'"
                        ),
                    )
                    .into());
                }
            };
            rt.resolve(&run, output, &user(by), note).await?;
            let next = NextStep {
                action: "resume",
                command: format!("warden runs resume {run}"),
            };
            if ctx.json {
                let status = rt.state(&run).await?.status();
                println!(
                    "{}",
                    contract::summary(&run, status.as_str(), &[], None, &[next])
                );
            } else {
                println!("resolved; continue with: {}", next.command);
            }
            Ok(())
        }
        RunsCommand::Abandon { run, reason, by } => {
            let run = run_id(&run)?;
            runtime(ctx, store)?
                .0
                .abandon(&run, &user(by), &reason)
                .await?;
            done(ctx, &run, RunStatus::Abandoned);
            Ok(())
        }
        RunsCommand::Cancel { run, reason, by } => {
            let run = run_id(&run)?;
            runtime(ctx, store)?
                .0
                .cancel(&run, Some(&user(by)), reason)
                .await?;
            done(ctx, &run, RunStatus::Cancelled);
            Ok(())
        }
        RunsCommand::Prune {
            older_than,
            status,
            dry_run,
        } => prune(store, &older_than, status, dry_run, ctx.json).await,
        RunsCommand::Fork {
            run,
            at,
            agent,
            budgets,
            run_id: fork_id,
            by,
        } => {
            let run = run_id(&run)?;
            let fork_id = fork_id.as_deref().map(run_id).transpose()?;
            let budgets = match &budgets {
                Some(text) => parse_extension(&json_input(text)?).map_err(|e| {
                    CliError::new("usage", format!("--budgets: {e}"))
                        .with_details(json!({ "budgets": text }))
                })?,
                None => BudgetLimits::default(),
            };
            let (rt, host) = runtime(ctx, store)?;
            // The source's own agent file, when it can still be read, names
            // what the fork changes; without --agent the fork goes on with it.
            let source_agent = agent_of(&ctx.settings, &rt, &run, None).await;
            let (agent, source_agent) = match &agent {
                Some(path) => (ctx.settings.load_agent(path)?, source_agent.ok()),
                None => {
                    let agent = source_agent?;
                    (agent.clone(), Some(agent))
                }
            };
            super::args::text_path("agent file", &agent.path, "the run's log")?;
            super::agent::check(&host, &agent).await?;
            let fork = rt
                .fork(
                    &run,
                    at,
                    ForkOptions {
                        agent: &agent,
                        source_agent: source_agent.as_ref(),
                        budgets,
                        run_id: fork_id,
                        by: user(by),
                    },
                )
                .await?;
            let events = rt.events(&fork).await?;
            let status = rt.state(&fork).await?.status();
            let mut next =
                steps(render::next_steps(rt.store().as_ref(), &fork, status, &events).await);
            if next.is_empty() && status == RunStatus::Running {
                next.push(NextStep {
                    action: "resume",
                    command: format!("warden runs resume {fork}"),
                });
            }
            if ctx.json {
                println!(
                    "{}",
                    contract::summary(&fork, status.as_str(), &[], None, &next)
                );
            } else {
                println!("{fork}");
                if !super::quiet() {
                    eprintln!(
                        "run {fork}: forked from {run} at position {at}; {status}; next: {}",
                        next.iter()
                            .map(|n| n.command.as_str())
                            .collect::<Vec<_>>()
                            .join(" or ")
                    );
                }
            }
            Ok(())
        }
    }
}

async fn prune(
    store: Arc<dyn EventStore>,
    older_than: &str,
    statuses: Vec<String>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<()> {
    let now = now_ms();
    let cutoff = parse_since(older_than, now)
        .map_err(|m| CliError::new("usage", m.replace("--since", "--older-than")))?;
    let statuses = if statuses.is_empty() {
        RunStatus::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str().to_owned())
            .collect()
    } else {
        statuses
    };
    for s in &statuses {
        if !RunStatus::ALL
            .iter()
            .any(|known| known.as_str() == s && known.is_terminal())
        {
            return Err(CliError::new(
                "usage",
                format!(
                    "--status `{s}`: only finished runs are pruned (completed, failed, cancelled, abandoned); abandon a run first to prune it"
                ),
            )
            .into());
        }
    }
    let pruned: Vec<Value> = if dry_run {
        let mut filter = RunFilter::new();
        for s in &statuses {
            filter = filter.status(s.clone());
        }
        store
            .list(&filter)
            .await?
            .into_iter()
            // What the store's prune keeps: a run that owes deliveries.
            .filter(|r| r.updated_ms < cutoff && r.owes_deliveries == 0)
            .map(|r| json!({ "run_id": r.run_id, "agent": r.agent, "status": r.status, "events": r.event_count }))
            .collect()
    } else {
        let mut filter = PruneFilter::new().updated_before(cutoff);
        for s in &statuses {
            filter = filter.status(s.clone());
        }
        store
            .prune(&filter, now)
            .await?
            .into_iter()
            .map(|t| json!({ "run_id": t.run_id, "agent": t.agent, "status": t.status, "events": t.event_count, "head": t.head.to_string() }))
            .collect()
    };
    if json {
        println!("{}", json!({ "dry_run": dry_run, "runs": pruned }));
    } else {
        let verb = if dry_run { "would prune" } else { "pruned" };
        println!("{verb} {} run(s)", pruned.len());
        for r in &pruned {
            println!(
                "  {} ({} of agent {}, {} events)",
                r["run_id"].as_str().unwrap_or_default(),
                r["status"].as_str().unwrap_or_default(),
                r["agent"].as_str().unwrap_or_default(),
                r["events"]
            );
        }
    }
    Ok(())
}

fn done(ctx: &Context, run: &RunId, status: RunStatus) {
    if ctx.json {
        println!(
            "{}",
            contract::summary(run, status.as_str(), &[], None, &[])
        );
    } else {
        println!("run {run} {status}");
    }
}

/// The steps of `render::next_steps` or `status::next_steps`, without
/// their prose: a run summary's `next`.
fn steps(said: Vec<render::Said>) -> Vec<NextStep> {
    said.into_iter().map(|s| s.step).collect()
}

/// The agent to continue `run` with: `--agent`, else the file it was
/// started from.
async fn agent_of(
    settings: &Settings,
    rt: &Runtime,
    run: &RunId,
    given: Option<&Path>,
) -> anyhow::Result<Agent> {
    if let Some(path) = given {
        return Ok(settings.load_agent(path)?);
    }
    let events = rt.events(run).await?;
    // A fork goes on with the agent its latest `run_forked` names.
    let forked = events.iter().rev().find_map(|e| match e {
        Event::RunForked(f) => Some(f.agent_file.clone()),
        _ => None,
    });
    let file = match (forked, events.first()) {
        (Some(file), _) => file,
        (None, Some(Event::RunStarted(s))) => s.agent_file.clone(),
        (None, _) => {
            return Err(CliError::new(
                "log_invalid",
                format!("run {run} has no run_started event"),
            )
            .with_details(json!({ "run_id": run }))
            .into());
        }
    };
    match file {
        Some(file) => Ok(settings.load_agent(Path::new(&file))?),
        None => Err(CliError::new(
            "agent_unknown",
            format!("run {run} does not record its agent file: pass --agent"),
        )
        .with_details(json!({ "run_id": run }))
        .into()),
    }
}

/// Checks, before a verb records anything, what continuing the run after it
/// needs: the agent file (readable, its plugins loadable) and, unless
/// `--accept-agent-change`, the definition the run started with. Returns
/// how to drive the run, or `None` when the verb only records (`--detach`,
/// or a worker's run, which a worker continues).
async fn ready_to_drive(
    ctx: &Context,
    rt: &Runtime,
    host: &PluginHost,
    run: &RunId,
    drive: &DriveArgs,
) -> anyhow::Result<Option<Drive>> {
    // A finished run is refused by the verb itself, with its status.
    let finished = rt.state(run).await?.status().is_terminal();
    let workers = rt.store().summary(run).await?.claim_token > 0;
    if drive.detach || workers || finished {
        return Ok(None);
    }
    driving(ctx, rt, host, run, drive).await.map(Some)
}

/// How to drive `run` with its agent file as it is now: refused, naming
/// the flag, when the file changed since the run started and the change is
/// not accepted.
async fn driving(
    ctx: &Context,
    rt: &Runtime,
    host: &PluginHost,
    run: &RunId,
    drive: &DriveArgs,
) -> anyhow::Result<Drive> {
    let agent = agent_of(&ctx.settings, rt, run, drive.agent.as_deref()).await?;
    super::agent::check(host, &agent).await?;
    let recorded = rt.state(run).await?.agent_digest;
    if recorded == agent.digest {
        return Ok(Drive::Drive(agent));
    }
    if !drive.accept_agent_change {
        return Err(CliError::new(
            "agent_changed",
            format!(
                "run {run}: agent file `{}` changed since the run started (digest {recorded}, now {}); nothing was recorded: pass --accept-agent-change to go on with the file as it is now",
                agent.path.display(),
                agent.digest
            ),
        )
        .with_details(json!({
            "run_id": run,
            "agent": agent.name,
            "recorded": recorded.as_str(),
            "current": agent.digest.as_str(),
            "flag": "--accept-agent-change",
        }))
        .into());
    }
    Ok(Drive::Recover(
        agent,
        ReplayOptions {
            accept_agent_change: true,
        },
    ))
}

async fn continue_run(
    ctx: &Context,
    rt: &Runtime,
    run: &RunId,
    plan: Option<Drive>,
) -> anyhow::Result<()> {
    // The verb is recorded: from here on, a closed stdout must not stop the
    // drive it started.
    super::out::survive_a_closed_stdout();
    // Subscribed first, so nothing recorded from here on is missed.
    let updates = rt.subscribe(run);
    // The event the verb just recorded, and from there on only what this
    // command causes: the history before it is `runs show`'s.
    let currency = run_currency(rt, run).await;
    let mut printed = 0;
    if let Some(last) = rt.store().load(run).await?.last() {
        print_event(
            rt,
            run,
            last.seq,
            &decode(&last.bytes)?,
            ctx.json,
            currency.as_deref(),
        )
        .await;
        printed = last.seq;
    }
    let Some(plan) = plan else {
        // A worker's run (claimed before): any worker continues it.
        let workers = rt.store().summary(run).await?.claim_token > 0;
        if ctx.json {
            let events = rt.events(run).await?;
            let status = rt.state(run).await?.status();
            let next = steps(render::next_steps(rt.store().as_ref(), run, status, &events).await);
            super::out::line(contract::summary(
                run,
                status.as_str(),
                &events,
                None,
                &next,
            ));
        } else if workers {
            super::out::line(format_args!("run {run}: recorded; a worker continues it"));
        }
        return Ok(());
    };
    follow(rt, run, updates, ctx.json, plan, printed).await
}

async fn recover(
    ctx: &Context,
    rt: &Runtime,
    host: &PluginHost,
    run: &RunId,
    drive: &DriveArgs,
) -> anyhow::Result<()> {
    let agent = driving(ctx, rt, host, run, drive).await?.agent().clone();
    let updates = rt.subscribe(run);
    // What the log held before is not this command's doing: only what the
    // recovery records is printed.
    let before = rt.store().summary(run).await?.event_count;
    follow(
        rt,
        run,
        updates,
        ctx.json,
        Drive::Recover(
            agent,
            ReplayOptions {
                accept_agent_change: drive.accept_agent_change,
            },
        ),
        before,
    )
    .await
}

/// `runs resume`: what the run needs, from its derived state.
async fn resume(
    ctx: &Context,
    rt: &Runtime,
    host: &PluginHost,
    run: &RunId,
    input: Option<String>,
    drive: DriveArgs,
) -> anyhow::Result<()> {
    let state = rt.state(run).await?;
    let status = state.status();
    // A finished run may still owe deliveries (the process died after its
    // last event): recovering it makes them, and nothing else.
    if status.is_terminal()
        && input.is_none()
        && owes_deliveries(ctx, rt, run, &drive, &state).await
    {
        return recover(ctx, rt, host, run, &drive).await;
    }
    match status {
        RunStatus::Suspended | RunStatus::BudgetExceeded => {
            let Some(input) = input else {
                let events = rt.events(run).await?;
                let next = render::next_step(rt.store().as_ref(), run, status, &events)
                    .await
                    .unwrap_or_default();
                return Err(CliError::new(
                    "input_required",
                    format!("run `{run}` is {status}: it needs --input ({next})"),
                )
                .with_details(json!({ "run_id": run, "status": status }))
                .into());
            };
            let input = json_input(&input)?;
            let plan = ready_to_drive(ctx, rt, host, run, &drive).await?;
            let agent = match &plan {
                Some(plan) => plan.agent().clone(),
                None => agent_of(&ctx.settings, rt, run, drive.agent.as_deref()).await?,
            };
            rt.resume(run, &agent, input, Some(user(drive.by.clone())))
                .await?;
            continue_run(ctx, rt, run, plan).await
        }
        // A waiting run is recovered like a running one: its drive ends
        // the wait if it is due, and reports it waiting if not. A run
        // awaiting its child drives the child, and goes on once it ended.
        RunStatus::Running | RunStatus::Waiting | RunStatus::AwaitingChild => {
            let listed = rt.store().summary(run).await?.status;
            let shown = super::status::shown(&listed, status);
            if input.is_some() {
                return Err(CliError::new(
                    "input_not_expected",
                    format!("run `{run}` is {shown}: it takes no input; resume without --input to drive it"),
                )
                .with_details(json!({ "run_id": run, "status": status }))
                .into());
            }
            if drive.detach {
                return Err(CliError::new(
                    "usage",
                    format!("run `{run}` is {shown}: resuming it means driving it, so --detach does not apply"),
                )
                .into());
            }
            recover(ctx, rt, host, run, &drive).await
        }
        RunStatus::AwaitingApproval => {
            let events = rt.events(run).await?;
            let call = state.next_call().map(|c| c.call_id.to_string());
            let next = render::next_step(rt.store().as_ref(), run, status, &events)
                .await
                .unwrap_or_default();
            Err(CliError::new(
                "awaiting_approval",
                format!(
                    "run `{run}` is awaiting approval of {}: {}",
                    call.as_deref().unwrap_or("a call"),
                    next.replace("\n   ", " ")
                ),
            )
            .with_details(json!({ "run_id": run, "status": status, "call_id": call }))
            .into())
        }
        RunStatus::AwaitingExternal => {
            let events = rt.events(run).await?;
            let call = state.next_call().map(|c| c.call_id.to_string());
            let next = render::next_step(rt.store().as_ref(), run, status, &events)
                .await
                .unwrap_or_default();
            Err(CliError::new(
                "awaiting_external",
                format!("run `{run}` waits for an external tool's output: {next}"),
            )
            .with_details(json!({ "run_id": run, "status": status, "call_id": call }))
            .into())
        }
        RunStatus::NeedsReconciliation if state.held().is_some() => {
            let hold = state.held().expect("checked");
            Err(refuse_hold(
                RuntimeError::ReconciliationRequired {
                    run_id: run.clone(),
                    reason: hold.reason.clone(),
                    since_ms: hold.since_ms,
                },
                ctx.json,
            ))
        }
        RunStatus::NeedsReconciliation => match state.dangling_write() {
            Some(write) => {
                Err(refuse_reconciliation(rt, run, &UnresolvedWrite::from(write), ctx.json).await)
            }
            None => Err(RuntimeError::NotReconcilable {
                run_id: run.clone(),
                status,
            }
            .into()),
        },
        terminal => Err(RuntimeError::AlreadyTerminal {
            run_id: run.clone(),
            status: terminal,
        }
        .into()),
    }
}

/// How a listing says when a waiting run wakes up: ` (due in 1m)`,
/// ` (due now)`, or nothing for a run that is not waiting.
fn waking(wake_ms: Option<i64>, now: i64) -> String {
    match wake_ms {
        Some(at) if at > now => format!(" (due in {})", age(at - now)),
        Some(_) => " (due now)".to_owned(),
        None => String::new(),
    }
}

/// How a listing says that a run owes deliveries: ` (owes 1 delivery)`,
/// or nothing when it owes none.
fn owing(n: u32) -> String {
    match n {
        0 => String::new(),
        1 => " (owes 1 delivery)".to_owned(),
        n => format!(" (owes {n} deliveries)"),
    }
}

/// Whether the terminal run in `state` owes a delivery: one in flight, or
/// an event its agent's channels receive and were not given. An agent that
/// cannot be loaded owes nothing here (the verb then refuses as before).
async fn owes_deliveries(
    ctx: &Context,
    rt: &Runtime,
    run: &RunId,
    drive: &DriveArgs,
    state: &warden::engine::RunState,
) -> bool {
    if state.deliveries.in_flight.is_some() {
        return true;
    }
    match agent_of(&ctx.settings, rt, run, drive.agent.as_deref()).await {
        Ok(agent) if !agent.channels.is_empty() => {
            matches!(rt.owed_delivery(run, &agent).await, Ok(Some(_)))
        }
        _ => false,
    }
}

/// Prints the evidence of a write with no recorded outcome and what to do,
/// and returns the exit for it. A write under another driver's live claim
/// (on the run, or on its parent for a child run) may merely be in
/// progress: then the advice is to wait for that driver (named, with when
/// its claim runs out), not to check and resolve.
async fn refuse_reconciliation(
    rt: &Runtime,
    run: &RunId,
    write: &UnresolvedWrite,
    json: bool,
) -> anyhow::Error {
    let resolve = format!("warden runs resolve {run} --output '<its output as JSON>'");
    let abandon = format!("warden runs abandon {run} --reason '…'");
    let summary = rt.store().summary(run).await.ok();
    let now = now_ms();
    // The run's own claim, its parent's (a child is driven under it) or a
    // child's in flight: the engine's one lookup, as `runs resolve` uses.
    let held = rt.driving_claim(run).await.ok().flatten();
    // Runs `warden run` drives hold no claim: whether one still drives it
    // is not recorded anywhere the store can tell.
    let never_claimed = summary.as_ref().is_some_and(|s| s.claim_token == 0);
    let wait = held.as_ref().map(|claim| {
        format!(
            "wait for worker {} to finish it; if that worker is gone, its claim runs out in {}: then check whether the write happened, and resolve with: warden runs resolve {run} --output '<its output as JSON>'",
            claim.owner,
            age(claim.expires_ms - now)
        )
    });
    if json {
        let error = RuntimeError::NeedsReconciliation {
            run_id: run.clone(),
            write: Box::new(write.clone()),
        };
        let mut report = super::errors::report(&error.into());
        match (&held, &wait) {
            (Some(claim), Some(wait)) => {
                report.details["held_by"] = json!({
                    "owner": claim.owner,
                    "token": claim.token,
                    "expires_ms": claim.expires_ms,
                });
                report.details["next"] = json!([wait]);
            }
            _ => report.details["next"] = json!([resolve, abandon]),
        }
        println!("{}", report.envelope());
    } else {
        let what = format!(
            "write {} to {} with {}",
            write.call_id,
            write.tool.model_name(),
            write.arguments
        );
        match (&held, wait) {
            (Some(_), Some(wait)) => {
                eprintln!(
                    "run {run} is held by another driver: {what} has no recorded outcome yet and may still be in progress; nothing was done"
                );
                eprintln!("   {wait}");
            }
            _ => {
                eprintln!("run {run} needs reconciliation: {what} has no recorded outcome");
                if never_claimed {
                    eprintln!(
                        "   if the `warden run` driving it is still running, the write may be in progress: let it end first"
                    );
                }
                eprintln!("   check whether the write happened, then: {resolve}");
                eprintln!("   or give up with: {abandon}");
            }
        }
    }
    Exit::NeedsReconciliation.into()
}

/// Prints why a run whose log may be missing what it did is not continued,
/// and what to do, and returns the exit for it.
fn refuse_hold(error: RuntimeError, json: bool) -> anyhow::Error {
    let RuntimeError::ReconciliationRequired { run_id, .. } = &error else {
        return error.into();
    };
    let resolve = format!("warden runs resolve {run_id} --note '<what you found>'");
    let abandon = format!("warden runs abandon {run_id} --reason '…'");
    if json {
        let mut report = super::errors::report(&anyhow::Error::new(error));
        report.details["next"] = json!([resolve, abandon]);
        println!("{}", report.envelope());
    } else {
        eprintln!("{error}");
        eprintln!("   when it is settled, go on from the log with: {resolve}");
        eprintln!("   or give up with: {abandon}");
    }
    Exit::NeedsReconciliation.into()
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
/// next. Events up to `printed` (the log before this command, or what it
/// already printed) are not printed again. On a terminal, a call awaiting
/// approval is put to the user, and the run goes on with their answer.
async fn follow(
    rt: &Runtime,
    run: &RunId,
    mut updates: warden::engine::RunUpdates,
    json: bool,
    how: Drive,
    printed: u64,
) -> anyhow::Result<()> {
    super::out::survive_a_closed_stdout();
    let interactive = !json && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let mut how = how;
    let mut last_seq = printed;
    let currency = run_currency(rt, run).await;
    let status = loop {
        let result = drive_and_print(
            rt,
            run,
            &mut updates,
            json,
            how.clone(),
            &mut last_seq,
            currency.as_deref(),
        )
        .await?;
        let status = match result {
            Ok(status) => status,
            Err(RuntimeError::NeedsReconciliation { run_id, write }) => {
                return Err(refuse_reconciliation(rt, &run_id, &write, json).await);
            }
            Err(e @ RuntimeError::ReconciliationRequired { .. }) => {
                return Err(refuse_hold(e, json));
            }
            // A worker holds the run or its tree: a write with no outcome
            // gets the advice for one (wait for that worker); anything else
            // is the refusal as it is (nothing was recorded).
            Err(e @ RuntimeError::DrivenByWorker { .. }) => {
                return Err(match rt.state(run).await?.dangling_write() {
                    Some(write) => {
                        refuse_reconciliation(rt, run, &UnresolvedWrite::from(write), json).await
                    }
                    None => e.into(),
                });
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
                // The log was replayed once; an accepted agent change is
                // still a change, and only a replay accepts it.
                if let Drive::Recover(agent, options) = &how
                    && !options.accept_agent_change
                {
                    how = Drive::Drive(agent.clone());
                }
                continue;
            }
        }
        break status;
    };
    let events = rt.events(run).await?;
    let output = rt.state(run).await?.output().cloned();
    if json {
        let next = steps(render::next_steps(rt.store().as_ref(), run, status, &events).await);
        super::out::line(contract::summary(
            run,
            status.as_str(),
            &events,
            output.as_ref(),
            &next,
        ));
    } else if super::quiet() {
        // `-q`: the result and errors only. How a run that did not finish
        // stands is its exit code (and `runs show`); a failure is an error.
        if let Some(output) = &output {
            super::out::line(render::output(output));
        }
        if let Some(error) = events.iter().rev().find_map(|e| match e {
            Event::RunFailed(f) => Some(&f.error),
            _ => None,
        }) {
            eprintln!(
                "warden: run {run} failed: {}",
                render::quoted(&error.to_string())
            );
        }
    } else {
        if let Some(output) = output.as_ref().filter(|o| !o.is_string()) {
            super::out::line(format_args!("output:\n{}", render::output(output)));
        }
        super::out::line(format_args!("run {run}: {status}"));
        if let Some(next) = render::next_step(rt.store().as_ref(), run, status, &events).await {
            super::out::line(format_args!("   {next}"));
        }
    }
    super::out::report_closed(run, status);
    match status {
        RunStatus::Completed => Ok(()),
        RunStatus::AwaitingApproval
        | RunStatus::Suspended
        | RunStatus::AwaitingExternal
        | RunStatus::AwaitingChild
        | RunStatus::BudgetExceeded
        | RunStatus::Waiting => Err(Exit::Parked.into()),
        RunStatus::NeedsReconciliation => Err(Exit::NeedsReconciliation.into()),
        _ => Err(Exit::RunFailed.into()),
    }
}

/// Asks the user at the terminal to approve `call`: `y` approves, anything
/// else denies with that text as the reason.
async fn ask_approval(rt: &Runtime, run: &RunId, call: &CallId) -> anyhow::Result<()> {
    use std::io::Write as _;
    let events = rt.events(run).await?;
    let state = rt.state(run).await?;
    match ApprovalPrompt::find(&events, &state, call) {
        Some(prompt) => print!("{}", prompt.question()),
        None => print!("approve {call}? [y = approve, anything else = deny with that reason] "),
    }
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
/// drive ended. While the model is being waited on, a spinner says so on a
/// terminal's stderr.
async fn drive_and_print(
    rt: &Runtime,
    run: &RunId,
    updates: &mut warden::engine::RunUpdates,
    json: bool,
    how: Drive,
    last_seq: &mut u64,
    currency: Option<&str>,
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
    let mut waiting: Option<Spinner> = None;
    let result = loop {
        tokio::select! {
            biased;
            update = updates.next() => match update {
                Some(RunUpdate::Event { seq, event }) => {
                    waiting = None;
                    if in_text {
                        super::out::line("");
                        in_text = false;
                    }
                    if seq > *last_seq {
                        print_event(rt, run, seq, &event, json, currency).await;
                        *last_seq = seq;
                    }
                    if !json && let Event::ModelCallIntent(i) = &*event {
                        waiting = Spinner::start(format!("step {}: waiting for the model…", i.step));
                    }
                }
                Some(RunUpdate::TextDelta { text, .. }) if !json && !super::quiet() => {
                    waiting = None;
                    if !in_text {
                        super::out::text("  ");
                        in_text = true;
                    }
                    super::out::text(warden::untrusted::fragment(&text));
                }
                Some(_) | None => {}
            },
            result = &mut driving => break result.context("the driver panicked")?,
        }
    };
    drop(waiting);
    if in_text {
        super::out::line("");
    }
    // Whatever was recorded after the last update seen.
    for stored in rt.store().load_after(run, *last_seq).await? {
        if let Ok(event) = decode(&stored.bytes) {
            print_event(rt, run, stored.seq, &event, json, currency).await;
            *last_seq = stored.seq;
        }
    }
    Ok(result)
}

/// The currency the run's log counts cost in, if it records one.
async fn run_currency(rt: &Runtime, run: &RunId) -> Option<String> {
    let state = rt.state(run).await.ok()?;
    state.currency().map(str::to_owned)
}

/// Prints one event as it is recorded. An approval's prompt shows the
/// call's frozen arguments, read from the log as it stands.
async fn print_event(
    rt: &Runtime,
    run: &RunId,
    seq: u64,
    event: &Event,
    json: bool,
    currency: Option<&str>,
) {
    if json {
        super::out::line(contract::event_line(seq, event));
        return;
    }
    // `-q`: no timeline (nor the receipts in it), only errors.
    if super::quiet() {
        return;
    }
    let log = match event {
        Event::ApprovalRequested(_) => rt.state(run).await.ok(),
        _ => None,
    };
    if let Some(line) = render::event(event, currency, log.as_ref()) {
        super::out::line(line);
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where a run stands, for grouping.
fn group_of(status: &str) -> &'static str {
    match status.parse::<RunStatus>() {
        Ok(s) if s.is_terminal() => "terminal",
        Ok(s) if s.is_parked() => "waiting",
        // Running, or queued for a worker.
        _ => "in_progress",
    }
}

/// The milliseconds since the Unix epoch `text` names: a duration back from
/// `now` (`30m`, `2h`, `7d`, `1w`), a UTC date (`2025-01-31`) or a UTC time
/// (`2025-01-31T12:00:00Z`).
pub(crate) fn parse_since(text: &str, now: i64) -> Result<i64, String> {
    let text = text.trim();
    let bad = || {
        format!(
            "--since `{text}`: expected a duration back from now (30m, 2h, 7d) or a UTC date or time (2025-01-31, 2025-01-31T12:00:00Z)"
        )
    };
    if text.len() >= 10 && text.as_bytes()[4] == b'-' {
        let (date, time) = match text.split_once('T') {
            Some((d, t)) => (d, Some(t.trim_end_matches('Z'))),
            None => (text, None),
        };
        let parts: Vec<i64> = date
            .split('-')
            .map(|p| p.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let [y, m, d] = parts[..] else {
            return Err(bad());
        };
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return Err(bad());
        }
        let mut seconds = days_from_civil(y, m, d) * 86_400;
        if let Some(time) = time {
            let hms: Vec<i64> = time
                .split(':')
                .map(|p| p.parse().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            let (h, mi, s) = match hms[..] {
                [h, mi] => (h, mi, 0),
                [h, mi, s] => (h, mi, s),
                _ => return Err(bad()),
            };
            if !(0..24).contains(&h) || !(0..60).contains(&mi) || !(0..61).contains(&s) {
                return Err(bad());
            }
            seconds += h * 3600 + mi * 60 + s;
        }
        return Ok(seconds * 1000);
    }
    let (number, unit_ms) = if let Some(n) = text.strip_suffix('w') {
        (n, 7 * 86_400_000)
    } else if let Some(n) = text.strip_suffix('d') {
        (n, 86_400_000)
    } else {
        let d = warden::units::parse_duration(text).map_err(|_| bad())?;
        return Ok(now - d.as_millis() as i64);
    };
    let n: u32 = number.trim().parse().map_err(|_| bad())?;
    Ok(now - i64::from(n) * unit_ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A duration in a few characters: `45s`, `12m`, `3h`, `2d`.
fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

async fn list(store: Arc<dyn EventStore>, args: ListArgs, json: bool) -> anyhow::Result<()> {
    let now = now_ms();
    let mut filter = RunFilter::new();
    for s in &args.status {
        let status = super::status::parse(s).map_err(|m| CliError::new("usage", m))?;
        filter = filter.status(status);
    }
    if let Some(a) = &args.agent {
        filter = filter.agent(a.clone());
    }
    if let Some(session) = &args.session {
        filter = filter.session(super::sessions::session_id(session)?);
    }
    for (k, v) in labels(&args.labels)? {
        filter = filter.label(k, v);
    }
    if let Some(since) = &args.since {
        filter =
            filter.created_since(parse_since(since, now).map_err(|m| CliError::new("usage", m))?);
    }
    let stalled_after = warden::units::parse_duration(&args.stalled_after)
        .map_err(|e| CliError::new("usage", format!("--stalled-after: {e}")))?
        .as_millis() as i64;
    let runs = store.list(&filter).await?;
    // A run whose stored id was damaged cannot be listed as a run: say so
    // rather than let it vanish.
    for id in store.invalid_run_ids().await? {
        eprintln!(
            "warning: the store holds a run whose id `{}` is not a valid run id (a damaged or tampered row); `warden runs verify` reports it",
            id.escape_debug()
        );
    }
    // A worker's run is stalled once its claim expired; another is after
    // `--stalled-after` without an append.
    let stalled = |r: &RunSummary| super::status::stalled(r, now, stalled_after);
    let row = |r: &RunSummary| {
        json!({
            "run_id": r.run_id,
            "agent": r.agent,
            "status": r.status,
            "labels": r.labels,
            "session": r.session,
            "created_ms": r.created_ms,
            "updated_ms": r.updated_ms,
            "events": r.event_count,
            "stalled": stalled(r),
            "owes_deliveries": r.owes_deliveries,
            "wake_ms": r.wake_ms,
        })
    };
    if json {
        let out = if args.group {
            let mut groups = json!({ "waiting": [], "in_progress": [], "terminal": [] });
            for r in &runs {
                groups[group_of(&r.status)]
                    .as_array_mut()
                    .expect("an array")
                    .push(row(r));
            }
            groups
        } else {
            Value::Array(runs.iter().map(row).collect())
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let id_width = runs
        .iter()
        .map(|r| r.run_id.as_str().len())
        .max()
        .unwrap_or(0)
        .max(3);
    let agent_width = runs.iter().map(|r| r.agent.len()).max().unwrap_or(0).max(5);
    let header = format!(
        "{:<id_width$}  {:<agent_width$}  {:<30}  {:>6}  {:>7}  LABELS",
        "RUN", "AGENT", "STATUS", "EVENTS", "UPDATED"
    );
    let line = |r: &RunSummary| {
        let labels: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let status = if stalled(r) {
            format!("running (stalled {})", age(now - r.updated_ms))
        } else {
            format!(
                "{}{}{}",
                r.status,
                waking(r.wake_ms, now),
                owing(r.owes_deliveries)
            )
        };
        format!(
            "{:<id_width$}  {:<agent_width$}  {:<30}  {:>6}  {:>7}  {}",
            r.run_id.as_str(),
            r.agent,
            status,
            r.event_count,
            format!("{} ago", age(now - r.updated_ms)),
            labels.join(",")
        )
    };
    if args.group {
        for (group, title) in [
            ("waiting", "waiting for a human or a time"),
            ("in_progress", "in progress"),
            ("terminal", "terminal"),
        ] {
            let members: Vec<&RunSummary> = runs
                .iter()
                .filter(|r| group_of(&r.status) == group)
                .collect();
            println!("{title} ({})", members.len());
            if !members.is_empty() {
                println!("  {header}");
                for r in members {
                    println!("  {}", line(r));
                }
            }
        }
    } else {
        println!("{header}");
        for r in &runs {
            println!("{}", line(r));
        }
    }
    let stalled: Vec<&RunSummary> = runs.iter().filter(|r| stalled(r)).collect();
    if !stalled.is_empty() {
        println!(
            "{} run(s) marked running have had no activity for {} or more: if no process drives them, continue with `warden runs resume RUN`",
            stalled.len(),
            age(stalled_after)
        );
    }
    Ok(())
}

async fn show(
    ctx: &Context,
    store: Arc<dyn EventStore>,
    run: &RunId,
    agent_file: Option<PathBuf>,
    prompts: bool,
    follow: bool,
) -> anyhow::Result<()> {
    let stored = store.load(run).await?;
    let summary = store.summary(run).await?;
    let mut events = Vec::with_capacity(stored.len());
    for s in &stored {
        let event = decode(&s.bytes).map_err(|error| RuntimeError::Log {
            run_id: run.clone(),
            seq: s.seq,
            error,
        })?;
        events.push(event);
    }
    warden::engine::resolve_history(&*store, &mut events).await?;
    let state: RunState = fold(&events).map_err(|error| RuntimeError::Fold {
        run_id: run.clone(),
        error,
    })?;
    let derived = state.status();
    let status = super::status::shown(&summary.status, derived);
    let stalled = super::status::stalled(&summary, now_ms(), DEFAULT_STALLED_AFTER_MS);
    let lineage = lineage(&*store, run, &state, &stored).await?;
    let children = super::tree::children(&*store, &events, 0).await;
    // The limits: what the log records was in force when the run started,
    // with the recorded extensions. Only a log written before limits were
    // recorded falls back to the agent file as it is now.
    let limits_from = if state.limits.is_some() {
        LimitsFrom::Log
    } else {
        let agent_path = agent_file.or_else(|| match events.first() {
            Some(Event::RunStarted(s)) => s.agent_file.clone().map(PathBuf::from),
            _ => None,
        });
        match agent_path
            .as_deref()
            .and_then(|p| ctx.settings.load_agent(p).ok())
        {
            Some(agent) => LimitsFrom::AgentFile(agent.budgets),
            None => LimitsFrom::Unknown,
        }
    };
    let agent_limits = match &limits_from {
        LimitsFrom::AgentFile(budgets) => *budgets,
        LimitsFrom::Log | LimitsFrom::Unknown => BudgetLimits::default(),
    };
    let limits = state.effective_limits(&agent_limits);
    let next = render::next_step(&*store, run, derived, &events)
        .await
        .or_else(|| super::status::next(run.as_str(), status, stalled));
    if ctx.json {
        let mut todo = steps(render::next_steps(&*store, run, derived, &events).await);
        if todo.is_empty() {
            todo = steps(super::status::next_steps(run.as_str(), status, stalled));
        }
        let budget: serde_json::Map<String, Value> = BudgetKind::ORDER
            .iter()
            .map(|k| {
                (
                    k.as_str().to_owned(),
                    json!({ "used": state.usage.get(*k), "limit": limits.get(*k) }),
                )
            })
            .collect();
        // A run summary, with what only `runs show` tells.
        let mut body = contract::summary(run, status, &events, state.output(), &todo);
        let more = json!({
            "agent": state.agent,
            "stalled": stalled,
            "labels": state.labels,
            "input": state.input,
            "created_ms": summary.created_ms,
            "updated_ms": summary.updated_ms,
            "events": stored.iter().zip(&events).map(|(s, e)| contract::event_line(s.seq, e)).collect::<Vec<_>>(),
            "budget": budget,
            "compaction": {
                "completed": state.compaction.completed,
                "failed": state.compaction.failed,
            },
            "owes_deliveries": summary.owes_deliveries,
            "wake_ms": state.waiting().map(|w| w.until_ms),
            "limits_known": !matches!(limits_from, LimitsFrom::Unknown),
            "limits_from": match limits_from {
                LimitsFrom::Log => "log",
                LimitsFrom::AgentFile(_) => "agent_file",
                LimitsFrom::Unknown => "unknown",
            },
            "max_input_bytes": state.limits.as_ref().map(|l| l.max_input_bytes),
            "forked_from": lineage.from.as_ref().map(|(f, prefix)| json!({
                "run_id": f.source_run,
                "position": f.position,
                "changed": f.changed,
                "withdrawn_approval": f.withdrawn_approval,
                "prefix": prefix.as_str(),
            })),
            "forks": lineage.forks.iter().map(|(id, at)| json!({ "run_id": id, "position": at })).collect::<Vec<_>>(),
            "parent": super::tree::parent(&events),
            "children": super::tree::json(&children),
        });
        for (key, value) in more.as_object().expect("an object") {
            body[key] = value.clone();
        }
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let labels: Vec<String> = state
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let owes = owing(summary.owes_deliveries);
    let status = if stalled {
        format!("{status} (stalled {})", age(now_ms() - summary.updated_ms))
    } else {
        status.to_owned()
    };
    let wakes = match state.waiting() {
        Some(w) => format!(" until {}", warden::units::utc_text(w.until_ms as i64)),
        None => String::new(),
    };
    println!(
        "run {run} · agent {} · {status}{wakes}{owes}{}",
        state.agent,
        if labels.is_empty() {
            String::new()
        } else {
            format!(" · {}", labels.join(","))
        }
    );
    if let Some(parent) = super::tree::parent(&events) {
        println!(
            "child of run {} (its call {})",
            parent.run_id, parent.call_id
        );
    }
    if !children.is_empty() {
        let mut lines = Vec::new();
        super::tree::lines(&children, 0, &mut lines);
        println!("children:\n{}", lines.join("\n"));
    }
    if let Some((f, prefix)) = &lineage.from {
        println!(
            "forked from run {} at position {}{} · inherited events {}",
            f.source_run,
            f.position,
            if f.changed.is_empty() {
                String::new()
            } else {
                format!(" (changed: {})", f.changed.join(", "))
            },
            prefix.as_str().replace('_', " ")
        );
    }
    let start = state.clock_seed_ms;
    let mut clock = Timeline::new(start);
    for (s, event) in stored.iter().zip(&events) {
        clock.print(s.seq, event, state.currency(), Some(&state));
        if prompts && let Event::ModelCallIntent(i) = event {
            for line in render::prompt(i.request.as_ref()).lines() {
                println!("               {line}");
            }
        }
    }
    if let Some(output) = state.output() {
        println!("output:\n{}", render::output(output));
    }
    println!(
        "budget: {}",
        render::budget(&state.usage, &limits, state.currency())
    );
    let c = &state.compaction;
    if c.completed + c.failed > 0 {
        println!(
            "compaction: {} done, {} failed{}",
            c.completed,
            c.failed,
            if c.failed > 0 {
                " (a failed one leaves its step's prompt uncompacted)"
            } else {
                ""
            }
        );
    }
    match limits_from {
        LimitsFrom::Log => {}
        LimitsFrom::AgentFile(_) => println!(
            "   (limits from the agent file as it is now: this run's log does not record the limits it started with)"
        ),
        LimitsFrom::Unknown => println!(
            "   (limits unknown: the log does not record them and the agent file cannot be read; pass --agent)"
        ),
    }
    if !lineage.forks.is_empty() {
        let forks: Vec<String> = lineage
            .forks
            .iter()
            .map(|(id, at)| format!("{id} (at {at})"))
            .collect();
        println!("forks: {}", forks.join(", "));
    }
    println!("status: {status}{owes}");
    if let Some(next) = next {
        println!("   {next}");
    }
    if follow && !derived.is_terminal() {
        let after = stored.last().map_or(0, |s| s.seq);
        follow_log(&*store, run, clock, after, state.currency()).await?;
    }
    Ok(())
}

/// How often `runs show --follow` reads the log for what another process
/// appended: the store is shared between processes, so there is nothing
/// to subscribe to, only a cheap read of the events after the last one.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// `runs show --follow`: prints each event appended after `after` as the
/// timeline does, until the run ends, then its status and what to do next.
async fn follow_log(
    store: &dyn EventStore,
    run: &RunId,
    mut clock: Timeline,
    mut after: u64,
    currency: Option<&str>,
) -> anyhow::Result<()> {
    super::out::line(format_args!(
        "following run {run} until it ends (Ctrl-C stops following; the run goes on)"
    ));
    loop {
        for stored in store.load_after(run, after).await? {
            let event = decode(&stored.bytes).map_err(|error| RuntimeError::Log {
                run_id: run.clone(),
                seq: stored.seq,
                error,
            })?;
            clock.print(stored.seq, &event, currency, None);
            after = stored.seq;
        }
        let summary = store.summary(run).await?;
        if let Ok(status) = summary.status.parse::<RunStatus>()
            && status.is_terminal()
            // The listing moves with the append: nothing is left to read.
            && summary.event_count <= after
        {
            super::out::line(format_args!("status: {status}"));
            return Ok(());
        }
        if super::out::closed() {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}

/// A run's lineage, both ways: the run it was forked from (with how its
/// inherited events compare with that run's log now), and the runs forked
/// from it with their positions.
struct Lineage {
    from: Option<(warden::engine::events::RunForked, Prefix)>,
    forks: Vec<(RunId, u64)>,
}

/// How a fork's inherited events compare with its source's log.
enum Prefix {
    /// Byte for byte the source's, ending at the chain hash recorded.
    Matches,
    /// Not the source's: one of the two logs was changed.
    Differs,
    /// The source is gone (pruned) or unreadable.
    SourceUnavailable,
}

impl Prefix {
    fn as_str(&self) -> &'static str {
        match self {
            Prefix::Matches => "match_the_source",
            Prefix::Differs => "differ_from_the_source",
            Prefix::SourceUnavailable => "source_unavailable",
        }
    }
}

async fn lineage(
    store: &dyn EventStore,
    run: &RunId,
    state: &RunState,
    stored: &[warden::store::StoredEvent],
) -> anyhow::Result<Lineage> {
    let from = match &state.fork {
        Some(f) => {
            let prefix = match store.load(&f.source_run).await {
                Ok(source) => {
                    let at = f.position as usize;
                    let same = source.len() >= at
                        && stored.len() > at
                        && source[..at]
                            .iter()
                            .zip(&stored[..at])
                            .all(|(a, b)| a.bytes == b.bytes)
                        && source[at - 1].hash.to_hex() == f.source_head;
                    if same {
                        Prefix::Matches
                    } else {
                        Prefix::Differs
                    }
                }
                Err(_) => Prefix::SourceUnavailable,
            };
            Some((f.clone(), prefix))
        }
        None => None,
    };
    // The label finds candidates; each one's own log says whether it is a
    // fork of this run (a label is anyone's to set).
    let mut forks = Vec::new();
    let candidates = store
        .list(&RunFilter::new().label(FORKED_FROM_LABEL, run.as_str()))
        .await?;
    for candidate in candidates {
        let Ok(log) = store.load(&candidate.run_id).await else {
            continue;
        };
        let recorded = log.iter().find_map(|e| match decode(&e.bytes) {
            Ok(Event::RunForked(f)) if f.run_id == candidate.run_id => Some(f),
            _ => None,
        });
        if let Some(f) = recorded.filter(|f| f.source_run == *run) {
            forks.push((candidate.run_id, f.position));
        }
    }
    Ok(Lineage { from, forks })
}

/// The time column of `runs show`: when each event happened on the run's
/// clock, as far as the log says. An event that carries a clock reading is
/// at that reading; one that ends a lease (a tool call, a delivery attempt)
/// is the lease's recorded wall time after the moment before it, or after
/// the retry time a failed attempt named; anything else is at the moment
/// before it.
struct Timeline {
    /// The run's first clock reading: offsets are from here.
    start: u64,
    clock: u64,
    /// When a failed attempt said the next one is due.
    retry_at: Option<u64>,
}

impl Timeline {
    fn new(start: u64) -> Timeline {
        Timeline {
            start,
            clock: start,
            retry_at: None,
        }
    }

    fn moment(&mut self, event: &Event) -> u64 {
        let lease = match event {
            Event::ToolCallCompleted(c) => Some(&c.receipt),
            Event::ToolCallAttemptFailed(f) => Some(&f.receipt),
            Event::DeliveryAttemptFailed(f) => Some(&f.receipt),
            Event::DeliveryCompleted(c) => Some(&c.receipt),
            Event::DeliveryFailed(f) => f.receipt.as_ref(),
            _ => None,
        };
        if let Some(at) = event.clock_reading() {
            self.retry_at = None;
            self.clock = self.clock.max(at);
        } else if let Some(receipt) = lease {
            let began = self.clock.max(self.retry_at.take().unwrap_or(0));
            self.clock = began + receipt.wall_time_us / 1000;
        }
        if let Event::DeliveryAttemptFailed(f) = event {
            self.retry_at = Some(f.retry_at_ms);
        }
        self.clock
    }

    /// Prints event `seq` as a timeline row (`seq`, the time since the
    /// start, its line), if it is worth one.
    fn print(&mut self, seq: u64, event: &Event, currency: Option<&str>, log: Option<&RunState>) {
        let at = self.moment(event);
        if let Some(line) = render::event(event, currency, log) {
            let offset = at.saturating_sub(self.start) as f64 / 1000.0;
            let mut lines = line.lines();
            super::out::line(format_args!(
                "{:>4} {:>8}  {}",
                seq,
                format!("+{offset:.2}s"),
                lines.next().unwrap_or_default()
            ));
            for rest in lines {
                super::out::line(format_args!("               {rest}"));
            }
        }
    }
}

/// Where `runs show` took a run's limits from.
enum LimitsFrom {
    /// The log's `run_started` (with the recorded extensions).
    Log,
    /// The agent file as it is now: the log predates recorded limits.
    AgentFile(BudgetLimits),
    /// Neither.
    Unknown,
}

async fn verify(
    store: Arc<dyn EventStore>,
    runs: Vec<String>,
    witness: Option<super::witness::Witness>,
    json: bool,
) -> anyhow::Result<()> {
    let all = runs.is_empty();
    let ids = if all {
        store.run_ids().await?
    } else {
        runs.iter()
            .map(|r| run_id(r))
            .collect::<anyhow::Result<_>>()?
    };
    let mut broken = 0;
    let mut rows = Vec::new();
    // Runs that cannot be checked at all are reported as broken, each, and
    // the check goes on with the others.
    let unreadable = |id: &str, problem: String, rows: &mut Vec<Value>| {
        if json {
            rows.push(json!({
                "run_id": id,
                "intact": false,
                "events": 0,
                "findings": [{ "seq": 0, "problem": problem }],
            }));
        } else {
            println!("{}: BROKEN", id.escape_debug());
            println!("   {problem}");
        }
    };
    if let Some(witness) = &witness {
        // Runs the witness saw that the store no longer has at all.
        for id in witness.runs().filter(|id| all && !ids.contains(id)) {
            if let Some(problem) = witness.check(&*store, id).await? {
                broken += 1;
                unreadable(id.as_str(), problem, &mut rows);
            }
        }
    }
    if all {
        for id in store.invalid_run_ids().await? {
            broken += 1;
            unreadable(
                &id,
                "the stored run id is not a valid run id (a damaged or tampered row)".into(),
                &mut rows,
            );
        }
    }
    for id in ids {
        let report = match warden::engine::runtime::verify_log(store.as_ref(), &id).await {
            Ok(report) => report,
            Err(e) => {
                broken += 1;
                unreadable(id.as_str(), format!("cannot be read: {e}"), &mut rows);
                continue;
            }
        };
        if report.is_intact()
            && let Some(witness) = &witness
            && let Some(problem) = witness.check(&*store, &id).await?
        {
            broken += 1;
            unreadable(id.as_str(), problem, &mut rows);
            continue;
        }
        if !report.is_intact() {
            broken += 1;
        }
        if json {
            rows.push(json!({
                "run_id": id,
                "intact": report.is_intact(),
                "events": report.events_read,
                "findings": report.findings.iter().map(|f| json!({ "seq": f.seq, "problem": f.kind.to_string() })).collect::<Vec<_>>(),
            }));
        } else if report.is_intact() {
            println!("{id}: intact ({} events)", report.events_read);
        } else {
            println!("{id}: BROKEN");
            for finding in &report.findings {
                println!("   at event {}: {}", finding.seq, finding.kind);
            }
        }
    }
    if all {
        broken += verify_rows(&*store, json, &mut rows).await?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    if broken > 0 {
        return Err(Exit::RunFailed.into());
    }
    Ok(())
}

/// The store-wide half of `runs verify`: the seals of the rows outside the
/// run logs that decide what the engine does (standing approval rules,
/// idempotency commitments), one entry per table. Returns how many rows
/// fail.
async fn verify_rows(
    store: &dyn EventStore,
    json: bool,
    rows: &mut Vec<Value>,
) -> anyhow::Result<usize> {
    let report = match store.verify_rows().await {
        Ok(report) => report,
        // A store kept elsewhere that cannot check its rows says so; it is
        // not reported intact.
        Err(e @ warden::store::StoreError::Unsupported { .. }) => {
            if json {
                rows.push(json!({ "table": null, "intact": false, "rows": 0,
                    "findings": [{ "row": null, "problem": e.to_string() }] }));
            } else {
                println!("sealed rows: NOT CHECKED");
                println!("   {e}");
            }
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    for (table, count) in &report.tables {
        let findings: Vec<_> = report
            .findings
            .iter()
            .filter(|f| f.table == *table)
            .collect();
        if json {
            rows.push(json!({
                "table": table,
                "intact": findings.is_empty(),
                "rows": count,
                "findings": findings.iter().map(|f| json!({ "row": f.row, "problem": f.reason.to_string() })).collect::<Vec<_>>(),
            }));
        } else if findings.is_empty() {
            println!("{table}: intact ({count} rows)");
        } else {
            println!("{table}: BROKEN");
            for finding in &findings {
                println!(
                    "   row `{}`: {} (changed outside Warden; restore a backup)",
                    finding.row.escape_debug(),
                    finding.reason
                );
            }
        }
    }
    Ok(report.findings.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_dates_and_times() {
        let now = 1_700_000_000_000;
        assert_eq!(parse_since("30m", now), Ok(now - 30 * 60_000));
        assert_eq!(parse_since("2h", now), Ok(now - 2 * 3_600_000));
        assert_eq!(parse_since("7d", now), Ok(now - 7 * 86_400_000));
        assert_eq!(parse_since("1w", now), Ok(now - 7 * 86_400_000));
        assert_eq!(parse_since("1970-01-02", now), Ok(86_400_000));
        assert_eq!(parse_since("2023-11-14", now), Ok(1_699_920_000_000));
        assert_eq!(
            parse_since("2023-11-14T22:13:20Z", now),
            Ok(1_700_000_000_000)
        );
        for bad in ["yesterday", "7", "2023-13-01", "2023-11-14T25:00", "-3d"] {
            let err = parse_since(bad, now).unwrap_err();
            assert!(err.starts_with(&format!("--since `{bad}`")), "{err}");
        }
    }

    #[test]
    fn statuses_fall_into_three_groups() {
        for status in RunStatus::ALL {
            let group = group_of(status.as_str());
            let expected = if status.is_terminal() {
                "terminal"
            } else if status == RunStatus::Running {
                "in_progress"
            } else {
                "waiting"
            };
            assert_eq!(group, expected, "{status}");
        }
    }
}
