//! Opening the store for a command ([`open`], by what the command does
//! with it: start runs, write, or only read), and `warden store
//! backup|compact`: an online, consistent copy of the SQLite store, and
//! rewriting it without the pages pruned runs freed.
//!
//! Only commands that start runs (`run`, `submit`, `store migrate`) create
//! a store. Commands that only read (`runs list|show|events|verify`,
//! `sessions show`, `store backup`) open it read-only: no migration, no
//! write, so they work on a full disk, a read-only file or mount, and while
//! another process holds the write lock. The default store is
//! `.warden/warden.db` in the working directory, never one found in a
//! parent directory (a store found silently elsewhere could be another
//! project's); when there is none, the error names the path looked at and
//! any store a parent directory holds.
//!
//! Copying the database file while Warden runs is not a backup: committed
//! transactions may still sit in the write-ahead log (`warden.db-wal`), and
//! a copy taken mid-checkpoint is torn. `backup` asks SQLite for a snapshot
//! instead (`VACUUM INTO` on a read-only connection: one read transaction,
//! so writers go on while it runs), syncs the copy, then opens it as a store
//! and checks every run's hash chain end to end.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::json;

use super::config::{DEFAULT_STORE, Settings, Source, StoreLocation};
use super::errors::CliError;
use super::{Context, Exit};
use warden::engine::RuntimeError;
use warden::store::{EventStore, OpenMode, PostgresStore, SqliteStore, StoreError};

/// What a command does with the store, which decides how it is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// It starts runs: the store is created if there is none.
    Start,
    /// It writes to runs that exist: the store must exist.
    Write,
    /// It only reads: opened read-only.
    Read,
}

/// Opens the store the settings name for `access`, creating a SQLite file
/// (and its directory) only for [`Access::Start`].
pub(crate) async fn open(
    settings: &Settings,
    access: Access,
) -> anyhow::Result<Arc<dyn EventStore>> {
    let mode = match access {
        Access::Start => OpenMode::Create,
        Access::Write => OpenMode::Existing,
        Access::Read => OpenMode::ReadOnly,
    };
    let opened: Result<Arc<dyn EventStore>, StoreError> = match &settings.store.value {
        StoreLocation::Postgres(url) => with_key(PostgresStore::builder(url).mode(mode), settings)
            .open()
            .await
            .map(|s| Arc::new(s) as Arc<dyn EventStore>),
        StoreLocation::Sqlite(path) => {
            if access == Access::Start
                && let Some(dir) = path.parent()
                && !dir.as_os_str().is_empty()
            {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("cannot create the store's directory `{}`", dir.display())
                })?;
            }
            sqlite(path, mode, settings)
                .open()
                .map(|s| Arc::new(s) as Arc<dyn EventStore>)
        }
    };
    opened.map_err(|e| match e {
        StoreError::NoStore { .. } => no_store(settings, e),
        e => {
            anyhow::Error::new(e).context(format!("cannot open the store {}", settings.store.value))
        }
    })
}

/// A SQLite builder for `path` in `mode` with the settings' chain key.
pub(crate) fn sqlite(
    path: &Path,
    mode: OpenMode,
    settings: &Settings,
) -> warden::store::SqliteStoreBuilder {
    let builder = SqliteStore::builder(path).mode(mode);
    match &settings.chain_key {
        Some(key) => builder.chain_key(key.clone()),
        None => builder,
    }
}

fn with_key(
    builder: warden::store::PostgresStoreBuilder,
    settings: &Settings,
) -> warden::store::PostgresStoreBuilder {
    match &settings.chain_key {
        Some(key) => builder.chain_key(key.clone()),
        None => builder,
    }
}

/// The error for a store that is not there, with where it was looked for
/// and, for the default store, where one is.
fn no_store(settings: &Settings, error: StoreError) -> anyhow::Error {
    let mut message = error.to_string();
    let (StoreLocation::Sqlite(path), Source::Default) =
        (&settings.store.value, settings.store.source)
    else {
        return CliError::new("store_missing", message)
            .with_details(json!({ "store": settings.store.value.to_string() }))
            .into();
    };
    message.push_str(
        " (the default store is .warden/warden.db in the working directory; name another with --store or WARDEN_STORE)",
    );
    let found = path
        .parent()
        .and_then(Path::parent)
        .into_iter()
        .flat_map(Path::ancestors)
        .skip(1)
        .map(|dir| dir.join(DEFAULT_STORE))
        .find(|candidate| candidate.is_file());
    if let Some(found) = &found {
        message.push_str(&format!("; a parent directory holds `{}`", found.display()));
    }
    CliError::new("store_missing", message)
        .with_details(
            json!({ "store": settings.store.value.to_string(), "file": path, "found": found }),
        )
        .into()
}

/// `error`, naming the store when it says a run does not exist, so a
/// command run from the wrong directory says which store it looked in.
pub(crate) fn name_store(error: anyhow::Error, settings: &Settings) -> anyhow::Error {
    let found = error.chain().find_map(|cause| {
        match (
            cause.downcast_ref::<StoreError>(),
            cause.downcast_ref::<RuntimeError>(),
        ) {
            (Some(StoreError::UnknownRun { run_id }), _)
            | (_, Some(RuntimeError::UnknownRun { run_id })) => {
                Some((run_id.clone(), cause.to_string()))
            }
            _ => None,
        }
    });
    match found {
        Some((run_id, message)) => CliError::new(
            "unknown_run",
            format!("{message} in the store {}", settings.store.value),
        )
        .with_details(json!({ "run_id": run_id, "store": settings.store.value.to_string() }))
        .into(),
        None => error,
    }
}

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
    /// Write every run's chain head (its event count and head hash, keyed
    /// with WARDEN_CHAIN_KEY when set) to a file kept outside the database,
    /// so that `runs verify --witness` and `runs recover --witness` detect a
    /// log later rolled back to fewer events.
    Witness {
        /// A new file, or a directory to write `witness-<ms>.json` into.
        dest: PathBuf,
    },
    /// Put a backup in place of the store (stop every Warden process using
    /// it first). Every run that was not finished in the backup is marked
    /// as needing reconciliation for what it may have done after the
    /// backup was taken; the replaced store is kept beside it.
    Restore {
        /// The backup (made by `warden store backup`, or any SQLite copy
        /// with `--taken-at`).
        backup: PathBuf,
        /// When the backup was taken, for a copy that does not record it: a
        /// UTC date or time (2025-01-31T12:00:00Z) or a duration back (2h).
        #[arg(long, value_name = "WHEN")]
        taken_at: Option<String>,
        /// Do not mark unfinished runs: you know nothing ran after the
        /// backup was taken.
        #[arg(long)]
        no_reconcile: bool,
        /// Who restores (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
}

pub(crate) async fn run(cmd: StoreCommand, ctx: &Context) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Backup { dest } => backup(ctx, dest).await,
        StoreCommand::Migrate => super::worker::migrate(ctx).await,
        StoreCommand::Compact => compact(ctx).await,
        StoreCommand::Witness { dest } => super::witness::write(ctx, dest).await,
        StoreCommand::Restore {
            backup,
            taken_at,
            no_reconcile,
            by,
        } => restore(ctx, backup, taken_at, no_reconcile, by).await,
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
        let error = StoreError::NoStore {
            location: format!("`{}`", source.display()),
            reason: "no such file; nothing was created".into(),
        };
        return Err(no_store(&ctx.settings, error));
    }
    Ok(source.clone())
}

async fn compact(ctx: &Context) -> anyhow::Result<()> {
    let path = sqlite_file(ctx, "compact")?;
    // Refuses what is not a store (an empty file, another database).
    drop(open(&ctx.settings, Access::Write).await?);
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
    let store = sqlite(&source, OpenMode::ReadOnly, &ctx.settings)
        .open()
        .map_err(|e| match e {
            StoreError::NoStore { .. } => no_store(&ctx.settings, e),
            e => anyhow::Error::new(e)
                .context(format!("cannot open the store `{}`", source.display())),
        })?;
    store
        .backup_into(&dest, super::runs::now_ms())
        .await
        .with_context(|| {
            format!(
                "cannot back up `{}` to `{}`",
                source.display(),
                dest.display()
            )
        })?;
    drop(store);
    let copy = sqlite(&dest, OpenMode::ReadOnly, &ctx.settings)
        .open()
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
    broken.extend(broken_rows(&copy).await?);
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

/// The sealed rows (standing rules, commitments) of `store` that fail
/// their check, each as `table:row`.
async fn broken_rows(store: &dyn EventStore) -> anyhow::Result<Vec<String>> {
    Ok(store
        .verify_rows()
        .await?
        .findings
        .into_iter()
        .map(|f| format!("{}:{}", f.table, f.row))
        .collect())
}

/// `warden store restore`: the backup, checked, copied next to the store,
/// its unfinished runs marked, then moved into place; the store it replaces
/// is kept as `<store>.before-restore-<ms>`, since it may hold the evidence
/// of what happened after the backup.
async fn restore(
    ctx: &Context,
    backup: PathBuf,
    taken_at: Option<String>,
    no_reconcile: bool,
    by: Option<String>,
) -> anyhow::Result<()> {
    let StoreLocation::Sqlite(target) = &ctx.settings.store.value else {
        return Err(CliError::new(
            "unsupported",
            "`warden store restore` works on a SQLite store; for PostgreSQL use its own tools (pg_restore)",
        )
        .into());
    };
    let now = super::runs::now_ms();
    let copy = sqlite(&backup, OpenMode::ReadOnly, &ctx.settings)
        .open()
        .with_context(|| format!("cannot open the backup `{}`", backup.display()))?;
    let mut broken = Vec::new();
    for id in copy.run_ids().await? {
        if !copy.verify(&id).await?.is_intact() {
            broken.push(id.to_string());
        }
    }
    broken.extend(broken_rows(&copy).await?);
    if !broken.is_empty() {
        return Err(CliError::new(
            "tampered",
            format!(
                "the backup `{}` holds broken runs or rows ({}): not restored",
                backup.display(),
                broken.join(", ")
            ),
        )
        .into());
    }
    let taken_ms = match (&taken_at, copy.backup_taken_ms().await?) {
        (Some(text), _) => super::runs::parse_since(text, now)
            .map_err(|m| CliError::new("usage", m.replace("--since", "--taken-at")))?,
        (None, Some(ms)) => ms,
        (None, None) => {
            return Err(CliError::new(
                "usage",
                format!(
                    "`{}` does not record when it was taken (it was not made by `warden store backup`): pass --taken-at",
                    backup.display()
                ),
            )
            .into());
        }
    };
    drop(copy);

    // The copy is prepared beside the store, then renamed over it.
    if let Some(dir) = target.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the store's directory `{}`", dir.display()))?;
    }
    let staged = sibling(target, ".restoring");
    for stale in [
        staged.clone(),
        sibling(&staged, "-wal"),
        sibling(&staged, "-shm"),
    ] {
        let _ = std::fs::remove_file(stale);
    }
    std::fs::copy(&backup, &staged).with_context(|| {
        format!(
            "cannot copy `{}` to `{}`",
            backup.display(),
            staged.display()
        )
    })?;
    let mut marked = Vec::new();
    {
        let store: Arc<dyn EventStore> = Arc::new(
            sqlite(&staged, OpenMode::Existing, &ctx.settings)
                .open()
                .with_context(|| format!("cannot open `{}`", staged.display()))?,
        );
        let (rt, _) = super::runs::runtime(ctx, Arc::clone(&store))?;
        let by = by
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "cli".into());
        let reason = format!(
            "restored from a backup taken at {}: what the run did after then is not in its log",
            warden::units::utc_text(taken_ms)
        );
        for id in store.run_ids().await? {
            if rt.state(&id).await?.status().is_terminal() {
                continue;
            }
            if !no_reconcile {
                rt.require_reconciliation(&id, &reason, Some(taken_ms), &by)
                    .await?;
            }
            marked.push(id.to_string());
        }
    }
    std::fs::File::open(&staged)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("cannot sync `{}`", staged.display()))?;

    // The replaced store, whole (its WAL checkpointed into it first).
    let kept = if target.exists() {
        let conn = rusqlite::Connection::open(target)
            .with_context(|| format!("cannot open the store `{}`", target.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .with_context(|| format!("cannot checkpoint `{}`", target.display()))?;
        drop(conn);
        let kept = sibling(target, &format!(".before-restore-{now}"));
        std::fs::rename(target, &kept)
            .with_context(|| format!("cannot move `{}` aside", target.display()))?;
        Some(kept)
    } else {
        None
    };
    for stale in [sibling(target, "-wal"), sibling(target, "-shm")] {
        let _ = std::fs::remove_file(stale);
    }
    std::fs::rename(&staged, target)
        .with_context(|| format!("cannot move `{}` into place", staged.display()))?;
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync `{}`", dir.display()))?;
    }

    let taken = warden::units::utc_text(taken_ms);
    if ctx.json {
        println!(
            "{}",
            json!({
                "store": target,
                "backup": backup,
                "taken_ms": taken_ms,
                "marked": if no_reconcile { Vec::new() } else { marked.clone() },
                "unfinished": marked,
                "replaced_store_kept_at": kept,
            })
        );
    } else {
        println!(
            "restored {} from {} (taken at {taken})",
            target.display(),
            backup.display()
        );
        if no_reconcile {
            println!(
                "   {} unfinished run(s) left as they were (--no-reconcile)",
                marked.len()
            );
        } else {
            println!(
                "   {} unfinished run(s) marked needs_reconciliation for what they may have done after {taken}: {}",
                marked.len(),
                marked.join(", ")
            );
        }
        if let Some(kept) = &kept {
            println!("   the store it replaced is kept at {}", kept.display());
        }
    }
    Ok(())
}

/// `path` with `suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}
