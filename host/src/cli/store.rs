//! `warden store backup`: an online, consistent copy of the SQLite store.
//!
//! Copying the database file while Warden runs is not a backup: committed
//! transactions may still sit in the write-ahead log (`warden.db-wal`), and
//! a copy taken mid-checkpoint is torn. `backup` asks SQLite for a snapshot
//! instead (`VACUUM INTO` on a read-only connection: one read transaction,
//! so writers go on while it runs), syncs the copy, then opens it as a store
//! and checks every run's hash chain end to end.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::json;

use super::config::StoreLocation;
use super::errors::CliError;
use super::{Context, Exit};
use crate::store::{EventStore, SqliteStore};

#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Write a consistent copy of the store to a new file while runs go on,
    /// then verify every run's hash chain in the copy.
    Backup {
        /// The new file (must not exist).
        dest: PathBuf,
    },
}

pub(crate) async fn run(cmd: StoreCommand, ctx: &Context) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Backup { dest } => backup(ctx, dest).await,
    }
}

async fn backup(ctx: &Context, dest: PathBuf) -> anyhow::Result<()> {
    let StoreLocation::Sqlite(source) = &ctx.settings.store.value;
    if !source.is_file() {
        return Err(CliError::new(
            "store_missing",
            format!("there is no store at `{}`", source.display()),
        )
        .with_details(json!({ "file": source }))
        .into());
    }
    if dest.exists() {
        return Err(CliError::new(
            "usage",
            format!(
                "`{}` already exists: a backup goes to a new file",
                dest.display()
            ),
        )
        .with_details(json!({ "file": dest }))
        .into());
    }
    let (source, dest_path) = (source.clone(), dest.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let conn = rusqlite::Connection::open_with_flags(
            &source,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .with_context(|| format!("cannot open the store `{}`", source.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        conn.execute("VACUUM INTO ?1", [dest_path.to_string_lossy()])
            .with_context(|| {
                format!(
                    "cannot back up `{}` to `{}`",
                    source.display(),
                    dest_path.display()
                )
            })?;
        std::fs::File::open(&dest_path)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("cannot sync `{}`", dest_path.display()))?;
        Ok(())
    })
    .await
    .context("the backup task panicked")??;

    let copy = SqliteStore::open(&dest)
        .with_context(|| format!("cannot open the backup `{}`", dest.display()))?;
    let mut runs = 0;
    let mut events = 0;
    let mut broken = Vec::new();
    for id in copy.run_ids().await? {
        let report = copy.verify(&id).await?;
        runs += 1;
        events += report.events_read;
        if !report.is_intact() {
            broken.push(id.to_string());
        }
    }
    if ctx.json {
        println!(
            "{}",
            json!({ "backup": dest, "runs": runs, "events": events, "broken": broken })
        );
    } else {
        println!(
            "backed up {runs} run(s), {events} event(s) to {}; every chain {}",
            dest.display(),
            if broken.is_empty() {
                "intact".to_owned()
            } else {
                format!("checked, BROKEN: {}", broken.join(", "))
            }
        );
    }
    if !broken.is_empty() {
        return Err(Exit::RunFailed.into());
    }
    Ok(())
}
