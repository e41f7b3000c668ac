//! `warden agent validate|hash`: check agent files the way `warden run`
//! would before recording anything (the file, its plugins under their
//! grants, its tools, its model provider), and print an agent's digest.
//! `validate` recognises a scripted model's transcript among its files (a
//! table of `[[turns]]` and no agent `name`) and checks it as a transcript,
//! so `warden agent validate examples/agents/*.toml` works.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::errors::report;
use warden::engine::{Agent, AgentView, mcp_servers};
use warden::plugins::PluginHost;

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// Check agent files: syntax and keys, plugins loaded under their
    /// grants, tools, model provider. A scripted model's transcript among
    /// them is checked as a transcript. Every file is reported; exits 2 if
    /// any fails.
    Validate {
        /// The agent files (and transcripts).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the digest of an agent's definition (labels excluded), the
    /// value a run records and recovery compares.
    Hash {
        /// The agent file.
        file: PathBuf,
    },
}

/// What a checked agent offers the model.
pub(crate) struct Checked {
    /// The tools, by the names the model calls them.
    pub(crate) tools: Vec<String>,
    /// The context sources, by name.
    pub(crate) context: Vec<String>,
    /// The delivery channels, by name.
    pub(crate) channels: Vec<String>,
}

/// Loads every plugin of `agent` under its grant, resolves its tools as the
/// runtime would, and makes its model provider; the first problem is an
/// error naming the agent file and the plugin.
pub(crate) async fn check(host: &PluginHost, agent: &Agent) -> anyhow::Result<Checked> {
    let at = || format!("agent `{}`", agent.path.display());
    let mut loaded = Vec::with_capacity(agent.plugins.len());
    for p in &agent.plugins {
        let plugin = host
            .load_pinned(
                &p.source,
                &p.grant,
                &p.grant_base,
                |k| std::env::var(k).ok(),
                p.pin.as_ref(),
            )
            .await
            .with_context(|| format!("{}: key `plugins.{}`", at(), p.key))?;
        for line in plugin.not_granted() {
            tracing::info!(agent = %agent.name, plugin = %p.key, "not granted: {line}");
        }
        // A tool the grant leaves no way to act is not offered to the model
        // (`AgentView`): said here, or the model's plan silently lacks it.
        for t in plugin.tools() {
            if let Some(why) = &t.withheld {
                warn(format_args!(
                    "tool `{}__{}` of plugin `{}` is not offered: {why}",
                    p.key, t.name, p.key
                ));
            }
        }
        loaded.push(plugin);
    }
    // Each MCP server is started in its sandbox and its list checked
    // against the pins (pinned here at its first use), then stopped.
    let mut mcp = Vec::with_capacity(agent.mcp_servers.len());
    for server in &agent.mcp_servers {
        let listing = mcp_servers::list(server)
            .await
            .with_context(|| format!("{}: key `mcp_servers.{}`", at(), server.key))?;
        let tools = mcp_servers::descriptors(server, &listing.listed, &listing.pinned);
        for t in &tools {
            if let Some(why) = &t.withheld {
                warn(format_args!(
                    "MCP tool `{}__{}` is not offered: {why}",
                    server.key, t.name
                ));
            }
        }
        mcp.push(tools);
    }
    let tools: Vec<(&str, &[warden::plugins::ToolDescriptor])> = agent
        .plugins
        .iter()
        .zip(&loaded)
        .map(|(p, l)| (p.key.as_str(), l.tools()))
        .chain(
            agent
                .mcp_servers
                .iter()
                .zip(&mcp)
                .map(|(s, t)| (s.key.as_str(), t.as_slice())),
        )
        .collect();
    agent.check_plugin_kinds(|key| {
        let (_, plugin) = agent
            .plugins
            .iter()
            .zip(&loaded)
            .find(|(p, _)| p.key == key)
            .expect("validated: the agent names its own plugins");
        (plugin.kinds(), plugin.source().to_string())
    })?;
    let view = AgentView::new(agent, &tools).with_context(at)?;
    agent
        .model
        .provider()
        .with_context(|| format!("{}: key `model`", at()))?;
    Ok(Checked {
        tools: view.tools.iter().map(|t| t.name.clone()).collect(),
        context: view.context.iter().map(|c| c.name.clone()).collect(),
        channels: view.channels.iter().map(|c| c.name.clone()).collect(),
    })
}

/// A warning on stderr, unless `-q`.
fn warn(text: std::fmt::Arguments<'_>) {
    if !super::quiet() {
        eprintln!("warden: {text}");
    }
}

pub(crate) async fn run(cmd: AgentCommand, ctx: &Context) -> anyhow::Result<()> {
    match cmd {
        AgentCommand::Validate { files } => validate(files, ctx).await,
        AgentCommand::Hash { file } => {
            let agent = ctx.settings.load_agent(&file)?;
            if ctx.json {
                println!(
                    "{}",
                    json!({ "file": super::args::escaped(file.as_os_str()), "agent": agent.name, "digest": agent.digest.as_str() })
                );
            } else {
                println!("{}  {}", agent.digest.as_str(), file.display());
            }
            Ok(())
        }
    }
}

async fn validate(files: Vec<PathBuf>, ctx: &Context) -> anyhow::Result<()> {
    let host = super::plugin_host(&ctx.settings)?;
    let mut rows = Vec::new();
    let mut failed = 0;
    for file in &files {
        if is_transcript(file) {
            match warden::providers::ScriptedProvider::load(file) {
                Ok(script) => {
                    let turns = script.turns().len();
                    if ctx.json {
                        rows.push(json!({
                            "file": super::args::escaped(file.as_os_str()),
                            "ok": true,
                            "kind": "transcript",
                            "turns": turns,
                        }));
                    } else {
                        println!(
                            "ok     {}: a scripted model's transcript, {turns} turn(s)",
                            file.display()
                        );
                    }
                }
                Err(e) => {
                    failed += 1;
                    let r = report(&e.into());
                    if ctx.json {
                        rows.push(json!({
                            "file": super::args::escaped(file.as_os_str()),
                            "ok": false,
                            "kind": "transcript",
                            "error": r.envelope()["error"],
                        }));
                    } else {
                        println!("error  {}: {}", file.display(), r.message);
                    }
                }
            }
            continue;
        }
        let result = async {
            let agent = ctx.settings.load_agent(file)?;
            let checked = check(&host, &agent).await?;
            anyhow::Ok((agent, checked))
        }
        .await;
        match result {
            Ok((agent, checked)) => {
                if ctx.json {
                    rows.push(json!({
                        "file": super::args::escaped(file.as_os_str()),
                        "ok": true,
                        "kind": "agent",
                        "agent": agent.name,
                        "digest": agent.digest.as_str(),
                        "tools": checked.tools,
                        "context": checked.context,
                        "channels": checked.channels,
                        "policies": agent.policies.iter().map(|p| json!({
                            "name": p.name,
                            "plugin": p.plugin,
                            "hooks": p.hooks,
                        })).collect::<Vec<_>>(),
                    }));
                } else {
                    let mut line = format!(
                        "ok     {}: agent `{}`, {} tool(s): {}",
                        file.display(),
                        agent.name,
                        checked.tools.len(),
                        checked.tools.join(", ")
                    );
                    if !checked.context.is_empty() {
                        line.push_str(&format!(
                            "; {} context source(s): {}",
                            checked.context.len(),
                            checked.context.join(", ")
                        ));
                    }
                    if !checked.channels.is_empty() {
                        line.push_str(&format!(
                            "; {} channel(s): {}",
                            checked.channels.len(),
                            checked.channels.join(", ")
                        ));
                    }
                    if !agent.policies.is_empty() {
                        let policies: Vec<String> = agent
                            .policies
                            .iter()
                            .map(|p| match &p.plugin {
                                Some(plugin) => format!("{} (plugin `{plugin}`)", p.name),
                                None => format!("{} (registered by the application)", p.name),
                            })
                            .collect();
                        line.push_str(&format!(
                            "; {} policy(ies): {}",
                            policies.len(),
                            policies.join(", ")
                        ));
                    }
                    println!("{line}");
                }
            }
            Err(e) => {
                failed += 1;
                let r = report(&e);
                if ctx.json {
                    rows.push(json!({
                        "file": super::args::escaped(file.as_os_str()),
                        "ok": false,
                        "kind": "agent",
                        "error": r.envelope()["error"],
                    }));
                } else {
                    println!("error  {}: {}", file.display(), r.message);
                }
            }
        }
    }
    if ctx.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    if failed > 0 {
        if !ctx.json {
            eprintln!(
                "{failed} of {} agent file(s) failed validation",
                files.len()
            );
        }
        return Err(super::Exit::Usage.into());
    }
    Ok(())
}

/// Whether `file` is a scripted model's transcript rather than an agent: a
/// JSON file, or a TOML table with `turns` and no agent `name`. A file that
/// does not parse is taken as an agent, whose loader then names the problem.
fn is_transcript(file: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    if file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        return serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|v| v.get("turns").is_some());
    }
    toml::from_str::<toml::Table>(&text)
        .is_ok_and(|t| t.contains_key("turns") && !t.contains_key("name"))
}
