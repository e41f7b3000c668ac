//! `warden mcp serve`: an agent's granted tools served to MCP clients
//! (`warden-mcp`), over stdio (the default: a client starts it) or
//! streamable HTTP (`--http ADDR`). Each session is a run in the
//! configured store; stdout belongs to the protocol on stdio, so
//! everything this command says goes to stderr there.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use super::Context;
use super::errors::CliError;
use super::store::Access;
use warden_mcp::{HttpOptions, ServeOptions, Served};

/// `warden mcp`.
#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Serve an agent's granted plugin tools over MCP: each session is a
    /// Warden run, each call a recorded tool call (writes need approval).
    Serve(ServeArgs),
}

/// `warden mcp serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The agent file whose tools are served (default: `[mcp] agent` of
    /// warden.toml).
    agent: Option<PathBuf>,
    /// Serve streamable HTTP at this address (at /mcp) instead of stdio; a
    /// non-loopback address needs a bearer token.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// The environment variable holding the bearer token HTTP requests
    /// must carry (none set: no token, on loopback only).
    #[arg(long, value_name = "NAME", default_value = "WARDEN_MCP_TOKEN")]
    token_env: String,
    /// A host name the HTTP server also answers as (its `Host` and
    /// `Origin`), as NAME or NAME:PORT (repeatable). Requests naming any
    /// other host are refused (DNS rebinding).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// How long a call that needs approval waits for it (by elicitation,
    /// or `warden runs approve` elsewhere) before it is denied as timed out.
    #[arg(long, default_value = "5m")]
    approval_timeout: String,
    /// How long a session's claim on its run lasts unless renewed; after a
    /// crash the run is recovered once it ran out.
    #[arg(long, default_value = "15s")]
    claim_ttl: String,
}

fn duration(flag: &str, text: &str) -> anyhow::Result<std::time::Duration> {
    warden::units::parse_duration(text)
        .map_err(|e| CliError::new("usage", format!("--{flag}: {e}")).into())
}

/// Runs `warden mcp …`.
pub(crate) async fn run(command: McpCommand, ctx: &Context) -> anyhow::Result<()> {
    let McpCommand::Serve(args) = command;
    let Some(file) = args
        .agent
        .clone()
        .or_else(|| ctx.settings.mcp_agent.clone())
    else {
        return Err(CliError::new(
            "usage",
            "no agent to serve: give its file (`warden mcp serve AGENT.toml`) or set `[mcp] agent` in warden.toml",
        )
        .into());
    };
    let options = ServeOptions::default()
        .approval_timeout(duration("approval-timeout", &args.approval_timeout)?)
        .claim_ttl(duration("claim-ttl", &args.claim_ttl)?);
    let token = std::env::var(&args.token_env)
        .ok()
        .filter(|t| !t.trim().is_empty());
    // Fail closed before anything is opened.
    if let Some(addr) = args.http {
        warden_mcp::check_bind(addr, token.is_some(), &args.token_env)?;
    }
    let agent = ctx.settings.load_agent(&file)?;
    super::args::text_path("agent file", &agent.path, "every run's log")?;
    // It starts runs: the store is created when there is none.
    let store = super::store::open(&ctx.settings, Access::Start).await?;
    let (runtime, _) = super::runs::runtime(ctx, store)?;
    let served = Served::new(runtime, agent, options).await?;
    for (run, status) in served.recover_orphans().await? {
        eprintln!("warden mcp serve: recovered run {run} of an earlier session: {status}");
    }
    let tools = served.tool_names().join(", ");
    let Some(bind) = args.http else {
        eprintln!(
            "warden mcp serve: serving {tools} over stdio into {}",
            ctx.settings.store.value
        );
        served.serve_stdio().await?;
        return Ok(());
    };
    let stop = super::worker::shutdown_signal()?;
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| CliError::new("io_failed", format!("cannot listen on {bind}: {e}")))?;
    let local = listener.local_addr()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let router = warden_mcp::router(
        served.clone(),
        local,
        HttpOptions {
            token,
            allowed_hosts: args.allow_hosts.clone(),
            shutdown: shutdown.clone(),
        },
    );
    let url = format!("http://{local}/mcp");
    if ctx.json {
        println!(
            "{}",
            json!({ "v": 1, "listening": url, "store": ctx.settings.store.value.to_string() })
        );
    }
    eprintln!(
        "warden mcp serve: serving {tools} at {url} into {}",
        ctx.settings.store.value
    );
    let stopping = shutdown.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            stop.await;
            stopping.cancel();
        })
        .await?;
    served.closed().await;
    Ok(())
}
