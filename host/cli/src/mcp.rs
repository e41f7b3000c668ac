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
use warden_mcp::{Approvers, HttpOptions, ServeOptions, Served};

/// `warden mcp`.
#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Serve an agent's granted plugin tools over MCP: each session is a
    /// Warden run, each call a recorded tool call (writes need approval).
    Serve(ServeArgs),
    /// List an MCP server's tools (of `[mcp_servers.<server>]` in the
    /// agent file) as the agent sees them, and how they differ from the
    /// pinned list: changed and new tools are not offered until accepted.
    Tools(ServerArgs),
    /// Pin an MCP server's tool list as it is now, after reviewing it with
    /// `warden mcp tools`: its changed and new tools are offered again.
    Accept(ServerArgs),
}

/// `warden mcp tools` and `warden mcp accept`.
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// The server's key in the agent's `[mcp_servers]`.
    server: String,
    /// The agent file (default: `[mcp] agent` of warden.toml).
    #[arg(long, value_name = "FILE")]
    agent: Option<PathBuf>,
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
    /// How often a call still waiting (for approval) sends MCP progress
    /// notifications, to a client that asked for them with a
    /// `progressToken`, so its request timeout does not fire meanwhile.
    #[arg(long, default_value = "10s")]
    progress_interval: String,
    /// Who may approve or deny the served calls besides operators (`warden
    /// runs approve|deny`, the console, the API): `operators` (the client
    /// is never asked) or `client` (by elicitation, recorded under the
    /// identity the transport authenticated). Default: `operators` over
    /// HTTP, `client` over stdio.
    #[arg(long, value_name = "WHO", value_parser = ["operators", "client"])]
    approvals: Option<String>,
}

/// Aborts a background task when dropped (the sweep, when serving ends).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn duration(flag: &str, text: &str) -> anyhow::Result<std::time::Duration> {
    warden::units::parse_duration(text)
        .map_err(|e| CliError::new("usage", format!("--{flag}: {e}")).into())
}

/// Runs `warden mcp …`.
pub(crate) async fn run(command: McpCommand, ctx: &Context) -> anyhow::Result<()> {
    let args = match command {
        McpCommand::Serve(args) => args,
        McpCommand::Tools(args) => return tools(args, false, ctx).await,
        McpCommand::Accept(args) => return tools(args, true, ctx).await,
    };
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
    let mut options = ServeOptions::default()
        .approval_timeout(duration("approval-timeout", &args.approval_timeout)?)
        .claim_ttl(duration("claim-ttl", &args.claim_ttl)?)
        .progress_interval(duration("progress-interval", &args.progress_interval)?);
    if let Some(who) = args.approvals.as_deref().and_then(Approvers::parse) {
        options = options.approvers(who);
    }
    let token = std::env::var(&args.token_env)
        .ok()
        .filter(|t| !t.trim().is_empty());
    // Fail closed before anything is opened.
    if let Some(addr) = args.http {
        warden_mcp::check_bind(addr, token.is_some(), &args.token_env, &options)?;
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
    // Tasks decided while no client polls, and sessions of a server that
    // died meanwhile, are driven to their end from here on too.
    let sweeping = served.sweep();
    let _sweeping = AbortOnDrop(sweeping);
    let tools = served.tool_names().join(", ");
    let Some(bind) = args.http else {
        eprintln!(
            "warden mcp serve: serving {tools} over stdio into {}",
            ctx.settings.store.value
        );
        served.serve_stdio(super::runs::account()).await?;
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
            token_env: args.token_env.clone(),
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
    // The connection layer of `warden serve`: header and idle timeouts, a
    // connection cap, unauthenticated connections bounded first.
    warden_server::serve(
        listener,
        router,
        ctx.settings.serve_connections,
        async move {
            stop.await;
            stopping.cancel();
        },
    )
    .await?;
    served.closed().await;
    Ok(())
}

/// `warden mcp tools` (`accept` false) and `warden mcp accept`: starts the
/// server as a run would, lists its tools, and shows them against the pins
/// (pinning them when nothing was pinned, or when accepting).
async fn tools(args: ServerArgs, accept: bool, ctx: &Context) -> anyhow::Result<()> {
    use warden::engine::mcp_servers::{self, McpServerError, pins};
    let Some(file) = args.agent.or_else(|| ctx.settings.mcp_agent.clone()) else {
        return Err(CliError::new(
            "usage",
            "no agent: give its file with `--agent AGENT.toml` or set `[mcp] agent` in warden.toml",
        )
        .into());
    };
    let agent = ctx.settings.load_agent(&file)?;
    let Some(server) = agent.mcp_servers.iter().find(|s| s.key == args.server) else {
        let known: Vec<&str> = agent.mcp_servers.iter().map(|s| s.key.as_str()).collect();
        return Err(McpServerError::UnknownServer {
            agent: agent.name.clone(),
            server: args.server.clone(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        }
        .into());
    };
    let listing = if accept {
        mcp_servers::accept(server).await?
    } else {
        mcp_servers::list(server).await?
    };
    // The diff is against what was pinned before this command: for
    // `accept`, what it replaced.
    let before = listing.pinned_before.clone().unwrap_or_default();
    let diff = pins::diff(&before, &listing.listed);
    let first_use = listing.pinned_before.is_none();
    let descriptors = mcp_servers::descriptors(server, &listing.listed, &listing.pinned);
    let status = |name: &str| {
        if first_use {
            "pinned now"
        } else if diff.added.iter().any(|a| a == name) {
            "new"
        } else if diff.changed.iter().any(|c| c.tool == name) {
            "changed"
        } else {
            "pinned"
        }
    };
    let pins_file = server.pins.display().to_string();
    if ctx.json {
        let tools: Vec<_> = descriptors
            .iter()
            .map(|d| {
                json!({
                    "name": d.name,
                    "model_name": mcp_servers::names::model_name(server, &d.name),
                    "status": status(&d.name),
                    "effect": d.effect,
                    "claimed_effect": d.claimed_effect,
                    "needs_approval": match server.needs_approval(&d.name) {
                        warden::engine::approvals::NeedsApproval::Never => false,
                        warden::engine::approvals::NeedsApproval::Always => true,
                        warden::engine::approvals::NeedsApproval::Writes => d.effect == warden::plugins::grant::EffectClass::Write,
                    },
                    "offered": d.withheld.is_none(),
                    "withheld": d.withheld,
                    "description": d.description,
                    "input_schema": d.input_schema,
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "v": 1,
                "agent": agent.name,
                "server": server.key,
                "pins": pins_file,
                "accepted": accept,
                "first_use": first_use,
                "pinned_digest": listing.pinned.digest,
                "matches_pins": diff.is_empty() || first_use,
                "tools": tools,
                "added": diff.added,
                "removed": diff.removed,
                "changed": diff.changed,
            })
        );
        return Ok(());
    }
    let verb = match (accept, first_use) {
        (true, _) => "accepted and pinned",
        (false, true) => "pinned at its first use",
        (false, false) if diff.is_empty() => "as pinned",
        (false, false) => "DIFFERS from the pinned list",
    };
    println!(
        "MCP server `{}` of agent `{}`: {} tool(s), {verb} ({pins_file})",
        server.key,
        agent.name,
        descriptors.len()
    );
    for d in &descriptors {
        let approval = match server.needs_approval(&d.name) {
            warden::engine::approvals::NeedsApproval::Never => "no approval",
            warden::engine::approvals::NeedsApproval::Always => "approval",
            warden::engine::approvals::NeedsApproval::Writes
                if d.effect == warden::plugins::grant::EffectClass::Write =>
            {
                "approval"
            }
            warden::engine::approvals::NeedsApproval::Writes => "no approval",
        };
        let offered = match &d.withheld {
            None => "offered".to_owned(),
            Some(why) => format!("NOT OFFERED: {why}"),
        };
        // The model's name, and the server's where they differ.
        let model_name = mcp_servers::names::model_name(server, &d.name);
        let own = if model_name == format!("{}__{}", server.key, d.name) {
            String::new()
        } else {
            format!(
                " (the server's `{}`)",
                warden::untrusted::line(&d.name, warden::untrusted::LINE_BYTES)
            )
        };
        println!(
            "  {model_name}{own}  {}  {approval}  {}  {offered}",
            d.effect,
            status(&d.name)
        );
    }
    if !first_use {
        for c in &diff.changed {
            println!("changed `{}`:", c.tool);
            for f in &c.fields {
                println!("  {}: - {}", f.field, f.pinned);
                println!("  {}: + {}", f.field, f.listed);
            }
        }
        for r in &diff.removed {
            println!("removed `{r}` (pinned, no longer listed)");
        }
        if !accept && !diff.is_empty() {
            println!(
                "review the changes, then `warden mcp accept {}` to offer them",
                server.key
            );
        }
    }
    Ok(())
}
