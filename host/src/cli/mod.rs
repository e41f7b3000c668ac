//! The `warden` command line: argument parsing, logging setup and dispatch.
//! This is the binary's edge: errors are `anyhow` here, printed as one line,
//! and turned into exit codes.
//!
//! Exit codes: 0 success; 1 the tool (or run) failed in a way it reported
//! itself; 2 bad usage or setup (unreadable manifest, bad grant, refused
//! component); 3 the sandbox stopped the call (a limit, a trap, cancelled).

mod plugin;

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
            Command::Plugin(cmd) => plugin::run(cmd).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(Exit::ToolFailed) => ExitCode::from(1),
            Some(Exit::LeaseFailed) => ExitCode::from(3),
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
