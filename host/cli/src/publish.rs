//! Publishing and installing plugins: `warden plugin bundle` (the statement
//! a publisher signs with minisign), `warden plugin lock` (pin the bundle of
//! each plugin an agent uses) and `warden plugin upgrade` (verify a new
//! version, show what it asks for against the locked one, and take it:
//! narrowing at once, widening only with the operator's acceptance of that
//! exact diff, recorded in the lock).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use serde_json::{Value, json};

use super::Context;
use super::errors::CliError;
use warden::engine::Agent;
use warden::engine::agent::AgentPlugin;
use warden::grant::Grant;
use warden::plugins::lock::{Acceptance, Lock, LockedPlugin, PermissionDiff};
use warden::plugins::trust::{SIGNATURE_FILE, STATEMENT_FILE, Statement};
use warden::plugins::{LoadedPlugin, Manifest, PluginHost, PluginSource};

#[derive(Debug, Args)]
pub(crate) struct BundleArgs {
    /// The plugin's directory or its plugin.toml.
    #[arg(default_value = ".")]
    plugin: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    /// The agent file; its lock is written next to it as AGENT.lock.
    agent: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct UpgradeArgs {
    /// The plugin's key in the agent (`fs` for `[plugins.fs]`).
    key: String,
    /// The agent file whose lock holds the plugin.
    #[arg(long)]
    agent: PathBuf,
    /// Accept a widening: the diff's digest, as the refusal printed it, so
    /// only the diff shown is accepted.
    #[arg(long, value_name = "DIFF")]
    accept: Option<String>,
    /// Who accepts (default: the login name).
    #[arg(long)]
    by: Option<String>,
}

/// `warden plugin bundle [DIR]`: writes `plugin.bundle`.
pub(crate) fn bundle(args: BundleArgs, ctx: &Context) -> anyhow::Result<()> {
    let manifest_path = if args.plugin.is_dir() {
        args.plugin.join("plugin.toml")
    } else {
        args.plugin.clone()
    };
    let (manifest, bytes) = Manifest::read(&manifest_path)?;
    let Some(component) = &manifest.component else {
        return Err(CliError::new(
            "manifest_invalid",
            format!(
                "plugin manifest `{}` has no `component`: build the plugin first (`warden plugin build`)",
                manifest_path.display()
            ),
        )
        .into());
    };
    let wasm = std::fs::read(component)
        .with_context(|| format!("cannot read component `{}`", component.display()))?;
    let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&wasm));
    if manifest.sha256.as_deref() != Some(sha256.as_str()) {
        return Err(CliError::new(
            "integrity_mismatch",
            format!(
                "plugin `{}`: component `{}` has sha256 {sha256}, but the manifest pins {}: run `warden plugin build` to pin what you ship",
                manifest.name,
                component.display(),
                manifest.sha256.as_deref().unwrap_or("nothing")
            ),
        )
        .into());
    }
    let statement = Statement::of(&manifest.name, &manifest.version, &bytes, &sha256);
    let dir = manifest_path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file = dir.join(STATEMENT_FILE);
    std::fs::write(&file, statement.text())
        .with_context(|| format!("cannot write `{}`", file.display()))?;
    if ctx.json {
        println!(
            "{}",
            json!({ "file": file, "bundle": statement.digest(), "statement": statement.text() })
        );
    } else {
        print!("{}", statement.text());
        eprintln!(
            "wrote {} (bundle {}); sign it: minisign -Sm {} (writes {SIGNATURE_FILE}), and ship the three files with the component",
            file.display(),
            statement.digest(),
            file.display()
        );
    }
    Ok(())
}

/// Loads one plugin of `agent` as its lock entry sees it: verified under
/// the operator's trust, not pinned, under no grant but a granted component
/// file (what it asks for does not depend on what is granted).
async fn load_unpinned(host: &PluginHost, plugin: &AgentPlugin) -> anyhow::Result<LoadedPlugin> {
    let grant = Grant {
        component: plugin.grant.component.clone(),
        ..Grant::default()
    };
    host.load(&plugin.source, &grant, &plugin.grant_base)
        .await
        .with_context(|| format!("plugin `{}`", plugin.key))
}

/// The source as the lock records it: relative to the agent's directory
/// when it is beneath it.
fn source_text(agent: &Agent, source: &PluginSource) -> String {
    match source {
        PluginSource::Manifest(path) => agent
            .path
            .parent()
            .and_then(|dir| path.strip_prefix(dir).ok())
            .unwrap_or(path)
            .display()
            .to_string(),
        PluginSource::Builtin(_) => source.to_string(),
    }
}

fn entry_of(agent: &Agent, plugin: &AgentPlugin, loaded: &LoadedPlugin) -> LockedPlugin {
    LockedPlugin::of(&source_text(agent, &plugin.source), loaded)
        .expect("a plugin loaded from its source has a verified bundle")
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

/// `warden plugin lock AGENT`: pins every plugin not yet pinned; one whose
/// bundle changed is left to `upgrade`, and nothing is written.
pub(crate) async fn lock(args: LockArgs, ctx: &Context) -> anyhow::Result<()> {
    let agent = ctx.settings.load_agent(&args.agent)?;
    let file = Lock::path_for(&agent.path);
    let old = Lock::read(&file)?.unwrap_or_else(Lock::new);
    let host = super::plugin_host(&ctx.settings)?;
    let mut lock = Lock::new();
    let mut changed = Vec::new();
    for plugin in &agent.plugins {
        let loaded = load_unpinned(&host, plugin).await?;
        let entry = entry_of(&agent, plugin, &loaded);
        match old.plugins.get(&plugin.key) {
            Some(locked) if locked.bundle != entry.bundle || locked.signer != entry.signer => {
                changed.push(format!(
                    "`{}` (locked {} {}, found {} {})",
                    plugin.key,
                    short(&locked.bundle),
                    locked.signer,
                    short(&entry.bundle),
                    entry.signer
                ));
                lock.plugins.insert(plugin.key.clone(), locked.clone());
            }
            Some(locked) => {
                lock.plugins.insert(plugin.key.clone(), locked.clone());
            }
            None => {
                lock.plugins.insert(plugin.key.clone(), entry);
            }
        }
    }
    if !changed.is_empty() {
        return Err(CliError::new(
            "plugin_lock_mismatch",
            format!(
                "`{}`: {} changed since locked; nothing written: review each with `warden plugin upgrade KEY --agent {}`",
                file.display(),
                changed.join(", "),
                args.agent.display()
            ),
        )
        .with_details(json!({ "file": file }))
        .into());
    }
    lock.write(&file)?;
    if ctx.json {
        println!("{}", json!({ "file": file, "plugins": lock.plugins }));
    } else {
        for (key, p) in &lock.plugins {
            println!(
                "{key}  {}  {} {}  bundle {}  {}{}",
                p.source,
                p.name,
                p.version,
                short(&p.bundle),
                p.signer,
                p.publisher
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            );
        }
        eprintln!("wrote {}", file.display());
    }
    Ok(())
}

/// `warden plugin upgrade KEY --agent AGENT [--accept DIFF]`.
pub(crate) async fn upgrade(args: UpgradeArgs, ctx: &Context) -> anyhow::Result<()> {
    let agent = ctx.settings.load_agent(&args.agent)?;
    let Some(plugin) = agent.plugins.iter().find(|p| p.key == args.key) else {
        return Err(CliError::new(
            "unknown_plugin",
            format!(
                "agent `{}` has no plugin `{}` (it has: {})",
                args.agent.display(),
                args.key,
                agent
                    .plugins
                    .iter()
                    .map(|p| p.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .into());
    };
    let file = Lock::path_for(&agent.path);
    let mut lock = Lock::read(&file)?.ok_or_else(|| {
        CliError::new(
            "plugin_lock_mismatch",
            format!(
                "agent `{}` has no lock file `{}`: pin its plugins first with `warden plugin lock {}`",
                args.agent.display(),
                file.display(),
                args.agent.display()
            ),
        )
    })?;
    let host = super::plugin_host(&ctx.settings)?;
    let loaded = load_unpinned(&host, plugin).await?;
    let mut entry = entry_of(&agent, plugin, &loaded);
    let Some(old) = lock.plugins.get(&args.key).cloned() else {
        lock.plugins.insert(args.key.clone(), entry);
        lock.write(&file)?;
        return report(
            ctx,
            &args.key,
            None,
            None,
            "locked (it was not in the lock)",
        );
    };
    if old.bundle == entry.bundle && old.signer == entry.signer {
        return report(ctx, &args.key, Some(&old), None, "up to date");
    }
    let diff = PermissionDiff::between(&old.permissions, &entry.permissions);
    let digest = diff.digest(&old.bundle, &entry.bundle);
    let view = DiffView {
        old: &old,
        new: &entry,
        diff: &diff,
        digest: &digest,
    };
    let mut accepted = None;
    if diff.widens() {
        match &args.accept {
            Some(accepted) if *accepted == digest => {}
            Some(other) => {
                view.print(ctx);
                return Err(CliError::new(
                    "upgrade_diff_changed",
                    format!(
                        "plugin `{}`: --accept {other} is not this diff ({digest}); nothing changed: review the diff above and accept its digest",
                        args.key
                    ),
                )
                .with_details(view.json())
                .into());
            }
            None => {
                view.print(ctx);
                return Err(CliError::new(
                    "upgrade_needs_acceptance",
                    format!(
                        "plugin `{}`: the new version asks for more than the locked one (the lines marked +); nothing changed: to accept exactly this diff, run `warden plugin upgrade {} --agent {} --accept {digest}`",
                        args.key,
                        args.key,
                        args.agent.display()
                    ),
                )
                .with_details(view.json())
                .into());
            }
        }
        accepted = Some(Acceptance {
            by: super::runs::user(args.by.clone()),
            at_ms: super::runs::now_ms(),
            diff: digest.clone(),
            from: old.bundle.clone(),
        });
    }
    view.print(ctx);
    entry.accepted = accepted;
    let how = if diff.widens() {
        format!(
            "upgraded: widening accepted by {}",
            entry.accepted.as_ref().map_or("", |a| a.by.as_str())
        )
    } else {
        "upgraded: it asks for nothing more, accepted without asking".to_owned()
    };
    lock.plugins.insert(args.key.clone(), entry.clone());
    lock.write(&file)?;
    report(ctx, &args.key, Some(&old), Some(&entry), &how)
}

/// A diff as shown before an upgrade is taken or refused.
struct DiffView<'a> {
    old: &'a LockedPlugin,
    new: &'a LockedPlugin,
    diff: &'a PermissionDiff,
    digest: &'a str,
}

impl DiffView<'_> {
    fn json(&self) -> Value {
        json!({
            "from": { "version": self.old.version, "bundle": self.old.bundle, "signer": self.old.signer },
            "to": { "version": self.new.version, "bundle": self.new.bundle, "signer": self.new.signer },
            "changes": self.diff.changes,
            "widens": self.diff.widens(),
            "diff": self.digest,
        })
    }

    /// The diff on stderr (stdout in `--json` mode carries the outcome).
    fn print(&self, ctx: &Context) {
        if ctx.json {
            return;
        }
        eprintln!(
            "plugin {} {} (bundle {}, {}) → {} (bundle {}, {})",
            self.new.name,
            self.old.version,
            short(&self.old.bundle),
            self.old.signer,
            self.new.version,
            short(&self.new.bundle),
            self.new.signer
        );
        if self.diff.changes.is_empty() {
            eprintln!("  asks for exactly what the locked version asked for");
        }
        for line in self.diff.lines() {
            eprintln!("  {line}");
        }
        eprintln!("  diff {}", self.digest);
    }
}

fn report(
    ctx: &Context,
    key: &str,
    old: Option<&LockedPlugin>,
    new: Option<&LockedPlugin>,
    how: &str,
) -> anyhow::Result<()> {
    if ctx.json {
        println!(
            "{}",
            json!({ "key": key, "outcome": how, "from": old, "to": new })
        );
    } else {
        println!("{key}: {how}");
    }
    Ok(())
}
