//! `warden approvals add|list|revoke`: standing approval rules, kept in the
//! store so every worker and host sharing it applies them. A rule approves
//! the calls it matches (a plugin, a tool, argument patterns, optionally
//! one run or session) until it expires or is revoked; each call it
//! approves records the rule's id and who created it.

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::errors::CliError;
use super::runs::{open_store, run_id, runtime, user};
use super::store::Access;
use warden::engine::{Rule, RuleSpec, SessionId};

#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// Create a rule approving matching calls from now on (calls already
    /// waiting for approval keep waiting: approve those with `warden runs
    /// approve`).
    Add {
        /// The tool: its model name (`fs__write_file`), or its name within
        /// `--plugin` (`write_file`).
        #[arg(long)]
        tool: Option<String>,
        /// The plugin key (every tool of it, unless `--tool` narrows it).
        #[arg(long)]
        plugin: Option<String>,
        /// An argument pattern, `NAME=GLOB` (`*` any text, `?` one
        /// character; a string argument as it is, others as JSON); every
        /// one given must match. Repeatable.
        #[arg(long = "arg", value_name = "NAME=GLOB")]
        arguments: Vec<String>,
        /// Only calls of this run.
        #[arg(long)]
        run: Option<String>,
        /// Only calls of runs in this session.
        #[arg(long)]
        session: Option<String>,
        /// Expire after this long (`30m`, `8h`); default: never.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        /// Who creates it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Every rule, oldest first, with its standing: live, expired or
    /// revoked.
    List,
    /// Revoke a rule: it approves nothing from now on, and a call it
    /// approved that has not run yet waits for approval again.
    Revoke {
        /// The rule's id.
        id: String,
        /// Who revokes it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
}

pub(crate) async fn run(cmd: ApprovalsCommand, ctx: &Context) -> anyhow::Result<()> {
    let access = match cmd {
        ApprovalsCommand::List => Access::Read,
        _ => Access::Write,
    };
    let (rt, _) = runtime(ctx, open_store(&ctx.settings, access).await?)?;
    match cmd {
        ApprovalsCommand::Add {
            tool,
            plugin,
            arguments,
            run,
            session,
            expires,
            by,
        } => {
            let mut spec = RuleSpec::for_tool(plugin.as_deref(), tool.as_deref())?;
            for pattern in arguments {
                let Some((name, glob)) = pattern.split_once('=') else {
                    return Err(CliError::new(
                        "usage",
                        format!("--arg `{pattern}`: use NAME=GLOB, for example path='notes/*'"),
                    )
                    .into());
                };
                spec.arguments.insert(name.to_owned(), glob.to_owned());
            }
            spec.run = run.as_deref().map(run_id).transpose()?;
            spec.session = session
                .map(|s| SessionId::new(&s))
                .transpose()
                .map_err(|e| CliError::new("invalid_session_id", e.to_string()))?;
            let expires_ms = match expires {
                None => None,
                Some(text) => {
                    let after = warden::units::parse_duration(&text)
                        .map_err(|e| CliError::new("usage", format!("--expires: {e}")))?;
                    Some(super::runs::now_ms() + after.as_millis() as i64)
                }
            };
            let rule = rt.add_rule(spec, &user(by), expires_ms).await?;
            if ctx.json {
                println!("{}", shown(&rule, super::runs::now_ms()));
            } else {
                println!(
                    "created {}: approves {}; revoke with: warden approvals revoke {}",
                    rule.id,
                    describe(&rule),
                    rule.id
                );
            }
        }
        ApprovalsCommand::List => {
            let rules = rt.rules().await?;
            let now = super::runs::now_ms();
            if ctx.json {
                let rules: Vec<_> = rules.iter().map(|r| shown(r, now)).collect();
                println!("{}", json!({ "rules": rules }));
            } else if rules.is_empty() {
                println!("no approval rules");
            } else {
                println!("RULE                   STANDING  CREATED BY  APPROVES");
                for rule in &rules {
                    println!(
                        "{:<22} {:<9} {:<11} {}",
                        rule.id,
                        shown(rule, now)["standing"].as_str().unwrap_or_default(),
                        rule.created_by,
                        describe(rule)
                    );
                }
            }
        }
        ApprovalsCommand::Revoke { id, by } => {
            let rule = rt.revoke_rule(&id, &user(by)).await?;
            if ctx.json {
                println!("{}", shown(&rule, super::runs::now_ms()));
            } else {
                let revocation = rule.revoked.as_ref().expect("a revoked rule");
                println!(
                    "revoked {} (by {} at {}): it approves nothing from now on",
                    rule.id,
                    revocation.by,
                    warden::units::utc_text(revocation.at_ms)
                );
            }
        }
    }
    Ok(())
}

/// A rule as JSON, with its standing now.
fn shown(rule: &Rule, now_ms: i64) -> serde_json::Value {
    super::contract::rule(rule, now_ms)
}

/// What a rule approves, in one line.
fn describe(rule: &Rule) -> String {
    let spec = &rule.spec;
    let mut text = match (&spec.plugin, &spec.tool) {
        (Some(p), Some(t)) => format!("{p}__{t}"),
        (Some(p), None) => format!("every tool of {p}"),
        (None, Some(t)) => format!("tool {t} of any plugin"),
        (None, None) => "nothing".to_owned(),
    };
    for (name, glob) in &spec.arguments {
        text.push_str(&format!(" {name}={glob}"));
    }
    if let Some(run) = &spec.run {
        text.push_str(&format!(" in run {run}"));
    }
    if let Some(session) = &spec.session {
        text.push_str(&format!(" in session {session}"));
    }
    if let Some(at) = rule.expires_ms {
        text.push_str(&format!(" until {}", warden::units::utc_text(at)));
    }
    text
}
