//! `warden sessions list`: every session in the store, with how many runs
//! it holds, its active run and its last activity. `warden sessions show`:
//! the runs of a session, in the order they were started, with their
//! statuses (in the vocabulary of `status.rs`), when they started, and what
//! they were asked and answered. A session exists once a run was started in
//! it: showing one that has none is an error.

use clap::Subcommand;
use serde_json::{Value, json};

use super::errors::CliError;
use super::runs::{open_store, runtime};
use super::{Context, render};
use warden::engine::{SessionId, SessionRun};

#[derive(Debug, Subcommand)]
pub(crate) enum SessionsCommand {
    /// Every session, by name: its runs, its active run (if any) with
    /// its status, and its last activity.
    List,
    /// The runs of a session, oldest first: status, start time, input and
    /// output; and whether the session is busy (a run is active in it).
    Show {
        /// The session.
        session: String,
    },
}

pub(crate) fn session_id(text: &str) -> anyhow::Result<SessionId> {
    SessionId::new(text).map_err(|e| CliError::new("invalid_session_id", e.to_string()).into())
}

pub(crate) async fn run(cmd: SessionsCommand, ctx: &Context) -> anyhow::Result<()> {
    let store = open_store(&ctx.settings, super::store::Access::Read).await?;
    match cmd {
        SessionsCommand::List => {
            let (rt, _) = runtime(ctx, store)?;
            list(&rt, ctx.json).await
        }
        SessionsCommand::Show { session } => {
            let session = session_id(&session)?;
            let (rt, _) = runtime(ctx, store.clone())?;
            let runs = rt.session_runs(&session).await?;
            if runs.is_empty() {
                return Err(CliError::new(
                    "unknown_session",
                    format!(
                        "session `{session}` has no runs in the store {} (`warden sessions list` lists the sessions it holds)",
                        ctx.settings.store.value
                    ),
                )
                .with_details(json!({
                    "session": session,
                    "store": ctx.settings.store.value.to_string(),
                }))
                .into());
            }
            let mut statuses = Vec::with_capacity(runs.len());
            for r in &runs {
                let listed = store.summary(&r.run_id).await?.status;
                statuses.push(super::status::shown(&listed, r.status));
            }
            show(&session, &runs, &statuses, ctx.json);
            Ok(())
        }
    }
}

/// `sessions list`: the sessions the store's runs belong to.
async fn list(rt: &warden::Runtime, json: bool) -> anyhow::Result<()> {
    let sessions = rt.sessions().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&sessions)?);
        return Ok(());
    }
    let width = sessions
        .iter()
        .map(|s| s.session.len())
        .max()
        .unwrap_or(0)
        .max(7);
    println!(
        "{:<width$}  {:>4}  {:<24}  STATE",
        "SESSION", "RUNS", "UPDATED"
    );
    for s in &sessions {
        let state = match (&s.active_run, &s.active_status) {
            (Some(run), Some(status)) => format!("busy: run {run} is {status}"),
            _ => "idle".to_owned(),
        };
        println!(
            "{:<width$}  {:>4}  {:<24}  {state}",
            s.session,
            s.runs,
            utc(s.updated_ms.max(0) as u64),
        );
    }
    Ok(())
}

fn show(session: &SessionId, runs: &[SessionRun], statuses: &[&str], json: bool) {
    let active = runs
        .iter()
        .zip(statuses)
        .find(|(r, _)| !r.status.is_terminal());
    if json {
        let rows: Vec<Value> = runs
            .iter()
            .zip(statuses)
            .map(|(r, status)| {
                let mut row = json!(r);
                row["status"] = json!(status);
                row
            })
            .collect();
        println!(
            "{}",
            json!({
                "session": session,
                "active_run": active.map(|(r, _)| &r.run_id),
                "runs": rows,
            })
        );
        return;
    }
    match active {
        Some((r, status)) => println!(
            "session {session}: {} run(s); busy: run {} is {status}",
            runs.len(),
            r.run_id,
        ),
        None => println!("session {session}: {} run(s); idle", runs.len()),
    }
    if runs.is_empty() {
        return;
    }
    let id_width = runs
        .iter()
        .map(|r| r.run_id.as_str().len())
        .max()
        .unwrap_or(3);
    println!(
        "  {:>3}  {:<id_width$}  {:<20}  {:<24}  INPUT → OUTPUT",
        "#", "RUN", "STATUS", "STARTED"
    );
    for (r, status) in runs.iter().zip(statuses) {
        let output = r
            .output
            .as_ref()
            .map(|o| format!(" → {}", render::short(o, 60)))
            .unwrap_or_default();
        println!(
            "  {:>3}  {:<id_width$}  {:<20}  {:<24}  {}{output}",
            r.position,
            r.run_id.as_str(),
            status,
            utc(r.started_ms),
            render::short(&r.input, 60),
        );
    }
}

/// Milliseconds since the epoch as a UTC time, `2026-01-31T12:00:00Z`.
fn utc(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_utc() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
