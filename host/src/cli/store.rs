//! `warden store backup|compact`: an online, consistent copy of the SQLite
//! store, and rewriting it without the pages pruned runs freed.
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
    /// Rewrite the SQLite file without the pages freed by pruned runs, so
    /// erased data is gone from the disk (checkpoints the write-ahead log,
    /// then VACUUM; waits up to 30 s for other writers).
    Compact,
    /// Apply pending schema migrations (opening the store does too) and
    /// say which.
    Migrate,
}

pub(crate) async fn run(cmd: StoreCommand, ctx: &Context) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Backup { dest } => backup(ctx, dest).await,
        StoreCommand::Migrate => super::worker::migrate(ctx).await,
        StoreCommand::Compact => compact(ctx).await,
    }
}

/// The SQLite file of the settings' store, which must exist.
fn sqlite_file(ctx: &Context, verb: &str) -> anyhow::Result<PathBuf> {
    let source = match &ctx.settings.store.value {
        StoreLocation::Sqlite(path) => path,
        StoreLocation::Postgres(_) => {
            return Err(CliError::new(
                "unsupported",
                format!("`warden store {verb}` works on a SQLite store; for PostgreSQL use its own tools (pg_dump, VACUUM)"),
            )
            .into());
        }
    };
    if !source.is_file() {
        return Err(CliError::new(
            "store_missing",
            format!("there is no store at `{}`", source.display()),
        )
        .with_details(json!({ "file": source }))
        .into());
    }
    Ok(source.clone())
}

async fn compact(ctx: &Context) -> anyhow::Result<()> {
    let path = sqlite_file(ctx, "compact")?;
    let file = path.clone();
    let (before, after) = tokio::task::spawn_blocking(move || -> anyhow::Result<(u64, u64)> {
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let wal = PathBuf::from(format!("{}-wal", file.display()));
        let before = size(&file) + size(&wal);
        let conn = rusqlite::Connection::open(&file)
            .with_context(|| format!("cannot open the store `{}`", file.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        conn.execute_batch(
            "PRAGMA wal_checkpoint(TRUNCATE); VACUUM; PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .with_context(|| format!("cannot compact `{}`", file.display()))?;
        drop(conn);
        Ok((before, size(&file) + size(&wal)))
    })
    .await
    .context("the compaction task panicked")??;
    if ctx.json {
        println!(
            "{}",
            json!({ "store": path, "bytes_before": before, "bytes_after": after })
        );
    } else {
        println!(
            "compacted {}: {before} bytes before, {after} after",
            path.display()
        );
    }
    Ok(())
}

async fn backup(ctx: &Context, dest: PathBuf) -> anyhow::Result<()> {
    let source = sqlite_file(ctx, "backup")?;
    super::args::text_path("backup file", &dest, "SQLite's VACUUM INTO")?;
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
    let dest_path = dest.clone();
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
