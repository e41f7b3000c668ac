//! The `warden` command line: argument parsing, logging setup and dispatch.
//! This is the binary's edge: errors are `anyhow` here, printed as one line,
//! and turned into exit codes.
//!
//! Exit codes: 0 success (a run completed); 1 the tool or the run failed
//! (a run failed, was cancelled or abandoned; a chain check found a break);
//! 2 bad usage or setup (unreadable file, bad grant, refused component,
//! unknown run, a verb that does not fit the run); 3 the sandbox stopped a
//! call (a limit, a trap, cancelled); 4 the run is parked waiting for a
//! human (approval, input, budget); 5 the run needs reconciliation (a write
//! with no recorded outcome).

mod plugin;
mod render;
mod runs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Warden: a durable agent runtime whose extensions run sandboxed.
#[derive(Debug, Parser)]
#[command(name = "warden", version, about)]
pub struct Cli {
    /// More log output on stderr (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a run of an agent and follow it live.
    Run(runs::RunArgs),
    /// Operate runs: list, show, events, verify, recover, approve, deny,
    /// resume, resolve, abandon, cancel.
    Runs {
        #[command(subcommand)]
        command: runs::RunsCommand,
        #[command(flatten)]
        store: runs::StoreArgs,
    },
    /// Inspect, call and test plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
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
    /// The run waits for a human; already printed.
    #[error("the run is parked")]
    Parked,
    /// The run needs reconciliation; already printed.
    #[error("the run needs reconciliation")]
    NeedsReconciliation,
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => runs::run(args).await,
            Command::Runs { command, store } => runs::runs(command, &store).await,
            Command::Plugin(cmd) => plugin::run(cmd).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(Exit::ToolFailed | Exit::RunFailed) => ExitCode::from(1),
            Some(Exit::LeaseFailed) => ExitCode::from(3),
            Some(Exit::Parked) => ExitCode::from(4),
            Some(Exit::NeedsReconciliation) => ExitCode::from(5),
            None => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The process's sandbox, with the per-user component cache:
/// `$WARDEN_CACHE_DIR`, else `$XDG_CACHE_HOME/warden/components`, else
/// `~/.cache/warden/components`.
pub(crate) fn sandbox() -> anyhow::Result<crate::sandbox::Sandbox> {
    let cache_dir = std::env::var_os("WARDEN_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("warden/components"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/warden/components"))
        });
    Ok(crate::sandbox::Sandbox::new(
        crate::sandbox::SandboxConfig {
            cache_dir,
            ..crate::sandbox::SandboxConfig::default()
        },
    )?)
}
