//! `warden keys list|show|release|settle`: the idempotency keys keyed calls
//! claim, the state their holder runs leave them in (held, settled,
//! orphaned), releasing one so that the next run with it makes the call
//! (recorded as `key_released` in the holder run's log, with who released
//! it), and settling an orphaned one with the outcome its call had, so that
//! later runs get it (recorded as `key_settled`).

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::errors::CliError;
use super::runs::{open_store, run_id, runtime, user};
use super::store::Access;
use warden::engine::{KeyInfo, KeyState};
use warden::store::CommitmentFilter;

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// The keys, in key order: state, holder run and call.
    List {
        /// Only the keys this run claimed.
        #[arg(long)]
        run: Option<String>,
        /// Only keys in this state: held, settled or orphaned.
        #[arg(long, value_parser = ["held", "settled", "orphaned"])]
        state: Option<String>,
    },
    /// One key: its state, holder, the holder run's status, the settled
    /// result, and what to do next. A key is a 64-hex digest of the tool
    /// and its key argument's value, not the value itself: `warden keys
    /// list --run RUN` prints the keys a run's calls claimed, with each
    /// call's id.
    Show {
        /// The key: the 64-hex digest `warden keys list` prints.
        key: String,
    },
    /// Release a key so that the next run with it makes the call again:
    /// after a failure, or once you checked that the effect of an orphaned
    /// key's call did not happen. Refused while the holder run has not
    /// ended: resolve or abandon it first.
    Release {
        /// The key.
        key: String,
        /// Who releases it (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// What you found, for the audit trail.
        #[arg(long)]
        note: Option<String>,
    },
    /// Settle an orphaned key with its call's outcome, once you checked that
    /// the effect did happen: later runs with the key get this output and
    /// make no call. Refused while the holder run has not ended (`warden
    /// runs resolve` settles it there) and for a key already settled.
    Settle {
        /// The key.
        key: String,
        /// The call's output as JSON; `@FILE` reads a file.
        #[arg(long)]
        output: String,
        /// Who settles it (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// What you found, for the audit trail.
        #[arg(long)]
        note: Option<String>,
    },
}

pub(crate) async fn run(cmd: KeysCommand, ctx: &Context) -> anyhow::Result<()> {
    let access = match cmd {
        KeysCommand::Release { .. } | KeysCommand::Settle { .. } => Access::Write,
        _ => Access::Read,
    };
    let (rt, _) = runtime(ctx, open_store(&ctx.settings, access).await?)?;
    match cmd {
        KeysCommand::List { run, state } => {
            let mut filter = CommitmentFilter::new();
            if let Some(run) = run {
                filter = filter.run(run_id(&run)?);
            }
            let keys: Vec<KeyInfo> = rt
                .keys(&filter)
                .await?
                .into_iter()
                .filter(|k| state.as_deref().is_none_or(|s| k.state.as_str() == s))
                .collect();
            list(&keys, ctx.json);
        }
        KeysCommand::Show { key } => {
            digest(&key)?;
            let info = rt.key(&key).await?;
            show(&info, ctx.json);
        }
        KeysCommand::Release { key, by, note } => {
            let by = user(by);
            let info = rt.release_key(&key, &by, note).await?;
            if ctx.json {
                println!(
                    "{}",
                    json!({ "released": info.key, "run_id": info.run_id, "call_id": info.call_id, "was": info.state, "by": by })
                );
            } else {
                println!(
                    "released {} (was {}, held by run {} call {}); the next run with this key makes the call",
                    info.key,
                    info.state.as_str(),
                    info.run_id,
                    info.call_id
                );
            }
        }
        KeysCommand::Settle {
            key,
            output,
            by,
            note,
        } => {
            let output = super::runs::json_input(&output)?;
            let by = user(by);
            let info = rt.settle_key(&key, output, &by, note).await?;
            if ctx.json {
                println!(
                    "{}",
                    json!({ "settled": info.key, "run_id": info.run_id, "call_id": info.call_id, "by": by })
                );
            } else {
                println!(
                    "settled {} (held by run {} call {}); later runs with this key get that output and make no call",
                    info.key, info.run_id, info.call_id
                );
            }
        }
    }
    Ok(())
}

/// Refuses text that cannot be a key (a 64-hex digest), saying how to
/// find the key: what an operator knows is the run, the call or the key
/// argument's value (an order id), never the digest.
fn digest(key: &str) -> anyhow::Result<()> {
    if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    Err(CliError::new(
        "unknown_key",
        format!(
            "`{}` is not a key: a key is the 64-hex digest of the tool and its key argument's value; `warden keys list --run RUN` prints the keys a run's calls claimed, with each call's id (`warden keys list` every key)",
            warden::untrusted::line(key, 80)
        ),
    )
    .with_details(json!({ "key": key }))
    .into())
}

fn list(keys: &[KeyInfo], json: bool) {
    if json {
        println!("{}", json!({ "keys": keys }));
        return;
    }
    if keys.is_empty() {
        println!("no idempotency keys");
        return;
    }
    let width = keys.iter().map(|k| k.key.len()).max().unwrap_or(3).max(3);
    println!("{:<width$}  {:<8}  RUN (STATUS)  CALL", "KEY", "STATE");
    for k in keys {
        println!(
            "{:<width$}  {:<8}  {} ({})  {}",
            k.key,
            k.state.as_str(),
            k.run_id,
            k.run_status.as_deref().unwrap_or("gone"),
            k.call_id
        );
    }
}

fn show(info: &KeyInfo, json: bool) {
    let next = match info.state {
        KeyState::Held => format!(
            "run {} has not ended: its call may be running, or waits for `warden runs resolve` or `warden runs abandon`",
            info.run_id
        ),
        KeyState::Settled => {
            "later runs get this result; `warden keys release` makes the next run call again"
                .to_owned()
        }
        KeyState::Orphaned => format!(
            "nothing will settle it: check whether call {} of run {} had its effect; if not, `warden keys release {}`; if it did, `warden keys settle {} --output '<its output as JSON>'`",
            info.call_id, info.run_id, info.key, info.key
        ),
        // A state this binary does not know yet: its name says enough.
        _ => format!("key state `{}`", info.state.as_str()),
    };
    if json {
        let mut value = serde_json::to_value(info).expect("a key serializes");
        value["next"] = json!(next);
        println!("{value}");
        return;
    }
    println!("key:    {}", info.key);
    println!("state:  {}", info.state.as_str());
    println!(
        "holder: run {} ({}), call {}",
        info.run_id,
        info.run_status.as_deref().unwrap_or("gone"),
        info.call_id
    );
    if let Some(result) = &info.result {
        println!("result: {result}");
    }
    println!("next:   {next}");
}
