//! `warden serve`: the HTTP control plane (`warden-server`) over the
//! configured store, and `warden serve tokens add|list`, the token file it
//! requires. The server reports errors with this command line's codes
//! (`errors::report_cause`) and loads agents as every command does.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde_json::json;

use super::Context;
use super::errors::CliError;
use super::store::Access;
use warden_otel::metrics::{MeteredStore, Metrics};
use warden_server::{ErrorReport, Role, ServeConfig, Tokens};

/// `warden serve`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ServeArgs {
    #[command(subcommand)]
    command: Option<ServeCommand>,
    /// The token file: each token's name, role and SHA-256 [env:
    /// WARDEN_TOKENS] (default: .warden/tokens.toml). The server refuses to
    /// start without one.
    #[arg(long, global = true, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// The address to listen on; a non-loopback one needs TLS or
    /// --insecure-no-tls.
    #[arg(long, default_value = "127.0.0.1:7300")]
    bind: SocketAddr,
    /// A host name the server also answers as (its `Host` and `Origin`),
    /// as NAME or NAME:PORT (repeatable). Requests naming any other host
    /// are refused (DNS rebinding).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// The TLS certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The TLS private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback address (behind a proxy that
    /// terminates TLS).
    #[arg(long)]
    insecure_no_tls: bool,
    /// How often a live event stream looks for events other processes
    /// appended.
    #[arg(long, default_value = "200ms")]
    poll: String,
    /// Failed logins (no token or an unknown one) an address may make in a
    /// minute; past them it is refused (429) until the minute is over.
    #[arg(long, default_value_t = 10)]
    failed_logins_per_minute: u32,
    /// A proxy whose `X-Forwarded-For` names the client's address
    /// (repeatable; with `[serve] trusted_proxies` of warden.toml). Without
    /// one, the client is the connection's address.
    #[arg(long = "trusted-proxy", value_name = "IP")]
    trusted_proxies: Vec<std::net::IpAddr>,
    /// An agent file the API may start, submit and fork runs of, by its
    /// name (repeatable; with `[serve] agents` of warden.toml). A request
    /// never names a file.
    #[arg(long = "agent", value_name = "FILE")]
    agents: Vec<PathBuf>,
    /// A directory whose agent files (`*.toml`, but `*.transcript.toml`)
    /// the API may start runs of (repeatable).
    #[arg(long = "agents", value_name = "DIR")]
    agent_dirs: Vec<PathBuf>,
}

/// The agent files named by `files`, `dirs` and `[serve] agents` (a file,
/// or a directory of them): each `*.toml` of a directory but its
/// `*.transcript.toml` (scripted models' transcripts), in name order.
fn agent_files(
    files: &[PathBuf],
    dirs: &[PathBuf],
    configured: &[PathBuf],
) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = files.to_vec();
    let mut scan: Vec<&PathBuf> = dirs.iter().collect();
    for path in configured {
        if path.is_dir() {
            scan.push(path);
        } else {
            found.push(path.clone());
        }
    }
    for dir in scan {
        let entries = std::fs::read_dir(dir).map_err(|e| {
            CliError::new(
                "io_failed",
                format!("--agents {}: cannot read the directory: {e}", dir.display()),
            )
            .with_details(json!({ "file": dir }))
        })?;
        let mut in_dir: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                p.is_file() && name.ends_with(".toml") && !name.ends_with(".transcript.toml")
            })
            .collect();
        in_dir.sort();
        found.extend(in_dir);
    }
    Ok(found)
}

#[derive(Debug, Subcommand)]
enum ServeCommand {
    /// Manage the API tokens.
    #[command(subcommand)]
    Tokens(TokensCommand),
}

#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Make a token: prints it once; the file keeps only its SHA-256.
    Add {
        /// Who holds it (recorded as `api:NAME` on its decisions).
        name: String,
        /// viewer (reads), approver (and approves or denies), operator
        /// (and resumes, resolves, cancels, abandons).
        #[arg(long)]
        role: String,
        /// Refuse the token after this long (`8h`, `30m`); default: never.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
    },
    /// List the tokens' names, roles and expiry.
    List,
}

fn tokens_file(args: &ServeArgs) -> PathBuf {
    args.tokens
        .clone()
        .or_else(|| std::env::var_os("WARDEN_TOKENS").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(".warden").join("tokens.toml"))
}

/// Runs `warden serve` or its token commands.
pub(crate) async fn run(args: ServeArgs, ctx: &Context) -> anyhow::Result<()> {
    let file = tokens_file(&args);
    match &args.command {
        Some(ServeCommand::Tokens(TokensCommand::Add {
            name,
            role,
            expires,
        })) => {
            let role = Role::parse(role)?;
            let expires_ms = match expires {
                None => None,
                Some(text) => {
                    let after = warden::units::parse_duration(text)
                        .map_err(|e| CliError::new("usage", format!("--expires: {e}")))?;
                    Some(super::runs::now_ms() + after.as_millis() as i64)
                }
            };
            let token = warden_server::tokens::add(&file, name, role, expires_ms)?;
            if ctx.json {
                println!(
                    "{}",
                    json!({ "name": name, "role": role, "token": token, "file": file, "expires_ms": expires_ms })
                );
            } else {
                eprintln!(
                    "token `{name}` ({}) added to {}; it is shown once:",
                    role.as_str(),
                    file.display()
                );
                println!("{token}");
            }
            return Ok(());
        }
        Some(ServeCommand::Tokens(TokensCommand::List)) => {
            let tokens = Tokens::read(&file)?;
            if ctx.json {
                let rows: Vec<_> = tokens
                    .entries()
                    .iter()
                    .map(|t| json!({ "name": t.name, "role": t.role, "expires_ms": t.expires_ms }))
                    .collect();
                println!("{}", json!({ "tokens": rows }));
            } else {
                for t in tokens.entries() {
                    match t.expires_ms {
                        Some(at) => println!(
                            "{}  {}  expires {}",
                            t.name,
                            t.role.as_str(),
                            warden::units::utc_text(at)
                        ),
                        None => println!("{}  {}", t.name, t.role.as_str()),
                    }
                }
            }
            return Ok(());
        }
        None => {}
    }
    // Fail closed, before anything is opened: credentials, then the bind.
    let tokens = Tokens::read(&file)?;
    let token_count = tokens.entries().len();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(warden_server::tls::load(cert, key)?),
        _ => None,
    };
    warden_server::check_bind(args.bind, tls.is_some(), args.insecure_no_tls)?;
    let poll = warden::units::parse_duration(&args.poll)
        .map_err(|e| CliError::new("usage", format!("--poll: {e}")))?;
    let stop = super::worker::shutdown_signal()?;
    let store = super::store::open(&ctx.settings, Access::Write).await?;
    // Appends go through the metered store, so `/metrics` has their latency.
    let metered = MeteredStore::new(store);
    let metrics = Arc::new(Metrics::new(Arc::new(metered.clone())).with_appends(&metered));
    let (runtime, host) = super::runs::runtime(ctx, Arc::new(metered))?;
    // The agents it serves, loaded and checked (their plugins under their
    // grants) before it listens: an agent that cannot run is an error now,
    // not on the first request.
    let mut agents = Vec::new();
    for file in agent_files(&args.agents, &args.agent_dirs, &ctx.settings.serve_agents)? {
        let agent = ctx.settings.load_agent(&file)?;
        super::args::text_path("agent file", &agent.path, "the run's log")?;
        super::agent::check(&host, &agent).await?;
        agents.push(agent);
    }
    let agents = warden_server::agents::Agents::new(agents).map_err(|e| {
        CliError::new("config_invalid", e.to_string())
            .with_details(json!({ "agent": e.name, "files": [e.first, e.second] }))
    })?;
    let agent_names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let settings = ctx.settings.clone();
    let config = ServeConfig {
        tokens,
        allowed_hosts: args.allow_hosts.clone(),
        classify: Arc::new(|error| {
            let report = super::errors::report_cause(error);
            ErrorReport {
                code: report.code,
                message: report.message,
                details: report.details,
            }
        }),
        load_agent: Arc::new(move |path: &Path| {
            settings.load_agent(path).map_err(|e| e.to_string())
        }),
        poll,
        failed_logins_per_minute: args.failed_logins_per_minute,
        tls: tls.is_some(),
        trusted_proxies: args
            .trusted_proxies
            .iter()
            .chain(&ctx.settings.serve_trusted_proxies)
            .copied()
            .collect(),
        agents,
        metrics,
    };
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|e| CliError::new("io_failed", format!("cannot listen on {}: {e}", args.bind)))?;
    let local = listener.local_addr()?;
    let router = warden_server::router(runtime, config, local);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{local}");
    if ctx.json {
        println!(
            "{}",
            json!({ "v": 1, "listening": url, "store": ctx.settings.store.value.to_string() })
        );
    }
    eprintln!(
        "warden serve: listening on {url} over {} ({} token(s) from {}); console at {url}/console/",
        ctx.settings.store.value,
        token_count,
        file.display()
    );
    if !agent_names.is_empty() {
        eprintln!(
            "warden serve: runs of {} may be started through the API",
            agent_names.join(", ")
        );
    }
    let limits = ctx.settings.serve_connections;
    match tls {
        Some(tls) => warden_server::serve_tls(listener, tls, router, limits, stop).await?,
        None => warden_server::serve(listener, router, limits, stop).await?,
    }
    Ok(())
}
