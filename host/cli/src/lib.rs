//! The `warden` command line: argument parsing, configuration, logging and
//! dispatch. This is the binary's edge: errors are `anyhow` here, printed as
//! one line (or, with `--json`, as the envelope of `errors.rs` on stdout),
//! and turned into exit codes.
//!
//! Exit codes: 0 success (a run completed); 1 the tool or the run failed
//! (a run failed, was cancelled or abandoned; a chain check found a break;
//! a plugin's test case failed);
//! 2 bad usage or setup (unreadable or invalid file, including an agent
//! file `agent validate` rejects; bad grant; refused component; unknown run;
//! a verb that does not fit the run); 3 the sandbox stopped a call (a limit,
//! a trap, cancelled); 4 the run is parked waiting for a human (approval,
//! input, budget) or for a retry's due time (`waiting`); 5 the run needs reconciliation (a write with no recorded
//! outcome).
//!
//! - `config.rs`: `warden.toml`, flags and `WARDEN_*` variables → settings.
//! - `errors.rs`: stable error codes and the `--json` error envelope.
//! - `runs.rs`: `warden run`, `warden runs …`.
//! - `sessions.rs`: `warden sessions list|show`.
//! - `status.rs`: the one status vocabulary (`queued` and the statuses a
//!   log derives) and what a human can do next about a run in each.
//! - `keys.rs`: `warden keys list|show|release`: idempotency keys.
//! - `plugin.rs`, `scaffold.rs`, `plugin_test.rs`: `warden plugin …`,
//!   including `new` and `build`, and `test` (declarative cases in the
//!   real sandbox).
//! - `agent.rs`: `warden agent validate|hash`.
//! - `store.rs`: `warden store backup|compact`.
//! - `secrets.rs`: `warden secrets keygen|set|list|rotate|remove`: the
//!   encrypted secrets file.
//! - `worker.rs`: `warden submit`, `warden worker`, `warden store migrate`.
//! - `serve.rs`: `warden serve` (the HTTP control plane, `warden-server`)
//!   and its token file.
//! - `mcp.rs`: `warden mcp serve` (an agent's tools over MCP, `warden-mcp`).
//! - `otel.rs`: `warden otel export` (runs' traces over OTLP, `warden-otel`).
//! - `render.rs`: one readable line per event; `progress.rs`: spinners.
//! - `args.rs`: arguments that are not valid UTF-8; `out.rs`: stdout while
//!   a run is driven (a closed pipe does not stop the drive).

mod agent;
mod approvals;
mod args;
pub(crate) mod config;
pub(crate) use warden_server::contract;
pub(crate) mod errors;
mod keys;
mod mcp;
mod otel;
mod out;
mod plugin;
mod plugin_test;
mod progress;
mod publish;
mod render;
mod runs;
mod scaffold;
mod secrets;
mod serve;
mod sessions;
mod status;
mod store;
mod tree;
mod witness;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

use config::{Overrides, Settings};

/// Warden: a durable agent runtime whose extensions run sandboxed.
#[derive(Debug, Parser)]
// The binary is always `warden` in help and errors, whatever the file is
// called (the integration tests run a copy built under another name).
#[command(name = "warden", bin_name = "warden", version, about)]
pub struct Cli {
    /// More log output on stderr: -v Warden's own debug events, -vv
    /// Warden's trace and its libraries' info, -vvv everything. RUST_LOG
    /// overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Only errors on stderr: no warnings, notes, receipts or progress.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Print JSON on stdout; an error is {"error": {"code", "message", "details"}}.
    #[arg(long, global = true)]
    json: bool,
    /// The configuration file [env: WARDEN_CONFIG] (default: ./warden.toml
    /// when it exists).
    #[arg(long = "config-file", global = true, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// The store: a SQLite file or sqlite:PATH [env: WARDEN_STORE] (default:
    /// the configuration's `store`, else .warden/warden.db).
    #[arg(long, global = true, value_name = "STORE")]
    store: Option<String>,
    /// Record each model request in full; they may hold secrets [env:
    /// WARDEN_RECORD_PROMPTS].
    #[arg(long, global = true)]
    record_prompts: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a run of an agent and follow it live.
    Run(runs::RunArgs),
    /// Operate runs: list, show, events, verify, recover, approve, deny,
    /// resume, complete, resolve, abandon, cancel, prune. A run is queued,
    /// running, awaiting_approval, suspended, awaiting_external,
    /// awaiting_child, budget_exceeded, waiting, needs_reconciliation, completed, failed,
    /// cancelled or abandoned.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Look at sessions: list them, or show the runs of one conversation.
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// See and settle idempotency keys: list, show, release.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Standing approval rules: add, list, revoke. A rule approves the
    /// calls it matches on every worker sharing the store, until it expires
    /// or is revoked.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCommand),
    /// Check agent files.
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Inspect, call, scaffold, build and test plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Show the effective configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The encrypted secrets file grants name as `store = "<name>"`:
    /// keygen, set, list, rotate, remove. Values are read from stdin and
    /// never printed.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// Operate the store: online backup, compaction (SQLite), migrations.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Record a run for workers to drive (listed as queued).
    Submit(worker::SubmitArgs),
    /// Claim queued runs (and runs whose worker died) and drive them, until
    /// SIGTERM or SIGINT.
    Worker(worker::WorkerArgs),
    /// Serve the HTTP control plane over the store: watch runs live, approve
    /// and deny, resume, resolve, cancel (`serve tokens add` makes the
    /// tokens it requires).
    Serve(serve::ServeArgs),
    /// Serve an agent's tools to MCP clients (stdio or streamable HTTP),
    /// each session a run and each call a recorded effect.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// OpenTelemetry: send runs' traces, derived from their logs, to a
    /// collector over OTLP/HTTP.
    #[command(subcommand)]
    Otel(otel::OtelCommand),
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (warden.toml, then WARDEN_*
    /// variables, then flags), each setting with where it came from;
    /// secrets masked.
    Show,
}

/// What every command gets: output mode and the effective settings.
pub(crate) struct Context {
    /// `--json`.
    pub(crate) json: bool,
    /// The effective settings.
    pub(crate) settings: Settings,
}

/// What a command's failure means for the exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Exit {
    /// The tool reported its own error; already printed.
    #[error("the tool reported an error")]
    ToolFailed,
    /// The sandbox stopped the call; already printed.
    #[error("the sandbox stopped the call")]
    LeaseFailed,
    /// The run failed, was cancelled or abandoned; already printed.
    #[error("the run did not complete")]
    RunFailed,
    /// A plugin's test cases failed; already printed.
    #[error("test cases failed")]
    TestsFailed,
    /// The run waits for a human; already printed.
    #[error("the run is parked")]
    Parked,
    /// The run needs reconciliation; already printed.
    #[error("the run needs reconciliation")]
    NeedsReconciliation,
    /// A usage or setup error; already printed.
    #[error("bad input")]
    Usage,
}

/// The hidden first argument that makes this process a component compiler
/// for its parent (`warden::sandbox::run_compile_child`), never a command.
const COMPILE_SUBCOMMAND: &str = "__compile-component";

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    restore_sigpipe();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == COMPILE_SUBCOMMAND) {
        return ExitCode::from(warden::sandbox::run_compile_child(&argv[2..]));
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let json = argv.iter().any(|a| a == "--json");
            // clap's own line does not say which argument was not UTF-8.
            if e.kind() == ErrorKind::InvalidUtf8
                && let Some((name, shown)) = args::first_non_utf8(&argv)
            {
                let report = errors::report(&args::refusal(&name, &shown).into());
                if json {
                    println!("{}", report.envelope());
                } else {
                    eprintln!("error: {}", report.message);
                }
                return ExitCode::from(2);
            }
            if json && !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let message = e.to_string();
                let first = message
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                let report = errors::Report {
                    code: "usage",
                    message: first.to_owned(),
                    details: serde_json::json!({}),
                };
                println!("{}", report.envelope());
                return ExitCode::from(2);
            }
            e.exit();
        }
    };
    QUIET.store(cli.quiet, std::sync::atomic::Ordering::Relaxed);
    init_tracing(cli.verbose, cli.quiet);
    let json = cli.json;
    let result = run(cli);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(Exit::ToolFailed | Exit::RunFailed | Exit::TestsFailed) => ExitCode::from(1),
            Some(Exit::LeaseFailed) => ExitCode::from(3),
            Some(Exit::Parked) => ExitCode::from(4),
            Some(Exit::NeedsReconciliation) => ExitCode::from(5),
            Some(Exit::Usage) => ExitCode::from(2),
            None => {
                let report = errors::report(&e);
                if json {
                    // Through `out`: after a drive, stdout may be closed.
                    out::line(report.envelope());
                } else {
                    eprintln!("error: {}", report.message);
                }
                ExitCode::from(exit_for(report.code))
            }
        },
    }
}

/// The exit code of a failure reported with `code` (docs/running-agents.md,
/// "Exit codes"): 2 says nothing was recorded, so a failure after which the
/// run is recorded and waits takes the code of a run waiting for a human.
fn exit_for(code: &str) -> u8 {
    match code {
        // A chain check that failed is a failure of the run's record, not
        // bad usage: exit 1, as for `runs verify`.
        "tampered" => 1,
        // A keyed call stopped at a key another run holds unsettled: the
        // run is recorded and left waiting until an operator settles or
        // releases the key (`keys release`, `keys settle`) and resumes it.
        "commitment_orphaned" | "commitment_held" => 4,
        // An upgrade that widens what a plugin asks for waits for an
        // operator's acceptance of the diff it printed.
        "upgrade_needs_acceptance" => 4,
        _ => 2,
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Completions { shell } = cli.command {
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "warden", &mut std::io::stdout());
        return Ok(());
    }
    let cwd = std::env::current_dir()
        .map_err(|e| anyhow::anyhow!("cannot read the working directory: {e}"))?;
    let overrides = Overrides {
        config: cli.config_file,
        store: cli.store,
        record_prompts: cli.record_prompts,
    };
    let settings = Settings::load(&overrides, &|k| std::env::var(k).ok(), &cwd)?;
    let ctx = Context {
        json: cli.json,
        settings,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => runs::run(args, &ctx).await,
            Command::Runs(command) => runs::runs(command, &ctx).await,
            Command::Sessions(command) => sessions::run(command, &ctx).await,
            Command::Keys(command) => keys::run(command, &ctx).await,
            Command::Approvals(command) => approvals::run(command, &ctx).await,
            Command::Agent(command) => agent::run(command, &ctx).await,
            Command::Plugin(command) => plugin::run(command, &ctx).await,
            Command::Config(ConfigCommand::Show) => {
                if ctx.json {
                    println!("{}", serde_json::to_string_pretty(&ctx.settings.to_json())?);
                } else {
                    print!("{}", ctx.settings.to_toml());
                }
                Ok(())
            }
            Command::Store(command) => store::run(command, &ctx).await,
            Command::Secrets(command) => secrets::run(command, &ctx).await,
            Command::Submit(args) => worker::submit(args, &ctx).await,
            Command::Worker(args) => worker::worker(args, &ctx).await,
            Command::Serve(args) => serve::run(args, &ctx).await,
            Command::Mcp(command) => mcp::run(command, &ctx).await,
            Command::Otel(command) => otel::run(command, &ctx).await,
            Command::Completions { .. } => unreachable!("handled before the runtime starts"),
        }
    });
    // The command is done and everything it recorded is written. A plugin's
    // filesystem call stuck on the blocking pool (its lease long abandoned)
    // must not hold up the exit, as dropping the runtime would.
    runtime.shutdown_background();
    result.map_err(|e| store::name_store(e, &ctx.settings))
}

/// `-q`: only errors on stderr.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `-q` was given: notes, receipts and progress stay off stderr.
pub(crate) fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether stderr gets colour: on a terminal, unless `NO_COLOR` is set
/// (non-empty), as <https://no-color.org> and cargo have it.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The log filter for `-v`s and `-q`: Warden's own events first, its
/// libraries' (wasmtime, cranelift, hyper …) only at `-vv` and beyond.
fn log_filter(verbose: u8, quiet: bool) -> &'static str {
    match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "warn,warden=debug",
        (false, 2) => "info,warden=trace",
        // wasmtime-wasi's generated bindings trace every WASI call with its
        // arguments (paths, strings) as the guest passed them, unredacted:
        // they stay at debug even here.
        (false, _) => TRACE_FILTER,
    }
}

/// The filter of `-vvv`: everything at trace but the WASI bindings'
/// call-by-call traces, which carry guest strings unredacted.
pub const TRACE_FILTER: &str = "trace,wasmtime_wasi=debug,wasmtime_wasi_http=debug";

fn init_tracing(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(log_filter(verbose, quiet)));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .with_filter(filter);
    let progress = progress::ProgressLayer.with_filter(progress_filter(quiet));
    // `try_init` hands the subscriber's maximum level to `log` as well, so
    // every filter here must state its level: a filter without a hint makes
    // that level TRACE, and then every `log::trace!` of Cranelift and
    // regalloc2 is formatted into a record and passed through both layers'
    // filters only to be dropped (most of a cold compile's time, once).
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(progress)
        .try_init();
}

/// The progress layer's filter: only [`progress::TARGET`]'s spans (info),
/// none under `-q`; a filter with a level, so it bounds the maximum level.
fn progress_filter(quiet: bool) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    let level = if quiet {
        LevelFilter::OFF
    } else {
        LevelFilter::INFO
    };
    tracing_subscriber::filter::Targets::new().with_target(progress::TARGET, level)
}

/// The process's sandbox, caching compiled components where the settings
/// say (`WARDEN_CACHE_DIR`, `cache_dir`, else `$XDG_CACHE_HOME/warden/components`,
/// else `~/.cache/warden/components`).
pub(crate) fn sandbox(settings: &Settings) -> anyhow::Result<warden::sandbox::Sandbox> {
    Ok(warden::sandbox::Sandbox::new(
        warden::sandbox::SandboxConfig {
            cache_dir: settings.cache_dir.value.clone(),
            ceilings: settings.ceilings.clone(),
            compile_limits: settings.compile,
            // This binary compiles components in a child of itself, where
            // the compile's time and memory are bounded (`compile.rs`).
            compile_command: std::env::current_exe().ok().map(|program| {
                warden::sandbox::CompileCommand {
                    program,
                    args: vec![COMPILE_SUBCOMMAND.into()],
                }
            }),
            ..warden::sandbox::SandboxConfig::default()
        },
    )?)
}

/// The process's plugin host: [`sandbox`], checking every plugin it loads
/// against the settings' `[trust]` before compiling it.
pub(crate) fn plugin_host(settings: &Settings) -> anyhow::Result<warden::plugins::PluginHost> {
    Ok(warden::plugins::PluginHost::new(sandbox(settings)?).with_trust(settings.trust.clone()))
}

/// Rust ignores SIGPIPE, so `warden runs events … | head` would panic on the
/// closed pipe; a command-line tool should just stop, as `cat` does.
#[cfg(unix)]
#[allow(unsafe_code)]
fn restore_sigpipe() {
    // SAFETY: called first thing in `main`, before the runtime or any other
    // thread exists; setting a signal's disposition to its default has no
    // other effect.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_sigpipe() {}

#[cfg(test)]
mod tests {
    /// Library records below the level asked for are refused at `log`'s
    /// and `tracing`'s own level check, never dispatched to the layers.
    #[test]
    fn the_maximum_level_is_what_the_filters_ask_for() {
        use tracing::level_filters::LevelFilter;
        // The only test that installs the global subscriber; `RUST_LOG`
        // would change what it asks for.
        assert!(
            std::env::var_os("RUST_LOG").is_none(),
            "unset RUST_LOG to run this test"
        );
        super::init_tracing(0, false);
        assert_eq!(LevelFilter::current(), LevelFilter::INFO);
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        super::Cli::command().debug_assert();
    }
}
