//! `warden sessions show`: the runs of a session, in the order they were
//! started, with their statuses (derived from their logs), when they
//! started, and what they were asked and answered.

use clap::Subcommand;
use serde_json::json;

use super::errors::CliError;
use super::runs::{open_store, runtime};
use super::{Context, render};
use crate::engine::{SessionId, SessionRun};

#[derive(Debug, Subcommand)]
pub(crate) enum SessionsCommand {
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
    match cmd {
        SessionsCommand::Show { session } => {
            let session = session_id(&session)?;
            let (rt, _) = runtime(
                ctx,
                open_store(&ctx.settings, super::store::Access::Read).await?,
            )?;
            let runs = rt.session_runs(&session).await?;
            show(&session, &runs, ctx.json);
            Ok(())
        }
    }
}

fn show(session: &SessionId, runs: &[SessionRun], json: bool) {
    let active = runs.iter().find(|r| !r.status.is_terminal());
    if json {
        println!(
            "{}",
            json!({
                "session": session,
                "active_run": active.map(|r| &r.run_id),
                "runs": runs,
            })
        );
        return;
    }
    match active {
        Some(r) => println!(
            "session {session}: {} run(s); busy: run {} is {}",
            runs.len(),
            r.run_id,
            r.status
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
    for r in runs {
        let output = r
            .output
            .as_ref()
            .map(|o| format!(" → {}", render::short(o, 60)))
            .unwrap_or_default();
        println!(
            "  {:>3}  {:<id_width$}  {:<20}  {:<24}  {}{output}",
            r.position,
            r.run_id.as_str(),
            r.status.as_str(),
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
