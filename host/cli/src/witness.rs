//! Witnesses of chain heads: `warden store witness` writes, for every
//! intact run, its event count and chain head to a file the operator keeps
//! outside the database; `runs verify --witness` then reports a log that
//! holds fewer events than its witness saw, or another event at that
//! position, and every runtime the command line builds with
//! `WARDEN_WITNESS` set (or `runs recover --witness`) refuses to record
//! anything on such a run (the check is the engine's,
//! `engine/witness.rs`, at the runtime's one write path).
//!
//! Why: someone with write access to the database can cut a run's tail and
//! rewind its run row to an earlier count and stored head. The result is
//! self-consistent, so the chain (keyed or not) cannot tell; only a head
//! recorded elsewhere can. With `WARDEN_CHAIN_KEY` set, each entry carries
//! an HMAC under the key, so a witness cannot be forged without it either.
//! The format and its reader are the engine's (`engine/witness.rs`).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::json;

use super::Context;
use super::config::Settings;
use super::errors::CliError;
use super::store::{Access, open};
use warden::engine::witness::WitnessFile;

pub(crate) use warden::engine::witness::Witness;

/// `warden store witness DEST`.
pub(crate) async fn write(ctx: &Context, dest: PathBuf) -> anyhow::Result<()> {
    let store = open(&ctx.settings, Access::Read).await?;
    let key = ctx.settings.chain_key.as_ref();
    let taken_ms = super::runs::now_ms();
    let mut file = WitnessFile::new(ctx.settings.store.value.to_string(), taken_ms, key);
    let mut skipped = Vec::new();
    for id in store.run_ids().await? {
        let report = store.verify(&id).await?;
        match (report.is_intact(), report.recorded_head) {
            (true, Some(head)) => file.add(key, id, report.recorded_count, &head),
            _ => skipped.push(id.to_string()),
        }
    }
    let path = if dest.is_dir() {
        dest.join(format!("witness-{taken_ms}.json"))
    } else {
        dest
    };
    let bytes = serde_json::to_vec_pretty(&file)?;
    {
        use std::io::Write as _;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                CliError::new(
                    "usage",
                    format!("cannot create the witness `{}`: {e}", path.display()),
                )
            })?;
        out.write_all(&bytes)
            .and_then(|()| out.sync_all())
            .with_context(|| format!("cannot write the witness `{}`", path.display()))?;
    }
    if ctx.json {
        println!(
            "{}",
            json!({ "witness": path, "runs": file.runs.len(), "keyed": file.key_id.is_some(), "skipped": skipped })
        );
    } else {
        println!(
            "witnessed {} run(s) in {}{}",
            file.runs.len(),
            path.display(),
            if file.key_id.is_some() {
                " (keyed)"
            } else {
                " (not keyed: set WARDEN_CHAIN_KEY to key it)"
            }
        );
        if !skipped.is_empty() {
            println!(
                "   not witnessed, their chains are broken: {}",
                skipped.join(", ")
            );
        }
    }
    Ok(())
}

/// Reads the witness at `path` with the settings' chain key.
pub(crate) fn read(path: &Path, settings: &Settings) -> anyhow::Result<Witness> {
    Ok(Witness::read(path, settings.chain_key.as_ref())?)
}

/// The witness `WARDEN_WITNESS` names, if set: every runtime the command
/// line builds checks each run it records on against it (issue 36).
pub(crate) fn from_env(settings: &Settings) -> anyhow::Result<Option<Witness>> {
    match std::env::var_os("WARDEN_WITNESS").filter(|v| !v.is_empty()) {
        Some(path) => read(Path::new(&path), settings).map(Some),
        None => Ok(None),
    }
}
