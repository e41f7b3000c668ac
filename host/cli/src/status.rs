//! The one status vocabulary the command line shows, in text and JSON: the
//! status a run's log derives ([`RunStatus`]), and `queued` for a run
//! recorded for a driver (`warden submit`, `warden run --detach`) that none
//! has started. `runs list`, `runs show`, `sessions`, `--status` and the
//! table in docs/operating-runs.md all use these words; [`next`] says what a human can do
//! about a run in each.

use warden::engine::RunStatus;
use warden::store::{QUEUED, RunSummary};

use super::contract::NextStep;
use super::render::Said;

/// Every status, in the order of docs/operating-runs.md's table.
pub(crate) const ALL: [&str; 13] = [
    QUEUED,
    "running",
    "awaiting_approval",
    "suspended",
    "awaiting_external",
    "awaiting_child",
    "budget_exceeded",
    "waiting",
    "needs_reconciliation",
    "completed",
    "failed",
    "cancelled",
    "abandoned",
];

/// The status shown for a run whose listing says `listed` and whose log
/// derives `derived`: queued while no driver has started it, else what the
/// log says.
pub(crate) fn shown(listed: &str, derived: RunStatus) -> &'static str {
    if listed == QUEUED && derived == RunStatus::Running {
        QUEUED
    } else {
        derived.as_str()
    }
}

/// `text` as a status, or a usage error naming every status.
pub(crate) fn parse(text: &str) -> Result<&'static str, String> {
    ALL.into_iter().find(|s| *s == text).ok_or_else(|| {
        format!(
            "--status `{text}`: not a status (use one of {})",
            ALL.join(", ")
        )
    })
}

/// Whether a run listed as running has shown no sign of a driver: its
/// worker's claim expired, or (driven by no worker) nothing was appended
/// for `stalled_after_ms`.
pub(crate) fn stalled(run: &RunSummary, now_ms: i64, stalled_after_ms: i64) -> bool {
    run.is_stalled(now_ms)
        || (run.status == "running"
            && run.claim.is_none()
            && now_ms - run.updated_ms >= stalled_after_ms)
}

/// What a human can do about a run in `status` that waits for no human
/// (those are in `render::next_steps`), as one line.
pub(crate) fn next(run_id: &str, status: &str, stalled: bool) -> Option<String> {
    if is_over(status) {
        return Some("nothing: the run is over".to_owned());
    }
    let steps = next_steps(run_id, status, stalled);
    (!steps.is_empty()).then(|| super::render::said(&steps))
}

fn is_over(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled" | "abandoned")
}

/// [`next`] as steps, each with the prose that introduces it.
pub(crate) fn next_steps(run_id: &str, status: &str, stalled: bool) -> Vec<Said> {
    let prose = match status {
        QUEUED => {
            "nothing drives it yet: a worker (`warden worker`) takes it, or drive it here with"
        }
        "running" if stalled => {
            "no process has recorded anything for a while: if none drives it, continue with"
        }
        "running" => "a process is driving it; if none is (it was killed), continue with",
        _ => return Vec::new(),
    };
    vec![Said {
        prose: prose.to_owned(),
        then: false,
        step: NextStep {
            action: "resume",
            command: format!("warden runs resume {run_id}"),
        },
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_is_queued_then_every_derived_status() {
        assert_eq!(ALL[0], QUEUED);
        assert_eq!(&ALL[1..], RunStatus::ALL.map(RunStatus::as_str).as_slice());
        for status in ALL {
            assert_eq!(parse(status), Ok(status));
        }
        assert!(parse("sleeping").unwrap_err().contains("queued, running"));
        assert_eq!(shown(QUEUED, RunStatus::Running), QUEUED);
        // Once its log moved on, the log's word is shown.
        assert_eq!(shown(QUEUED, RunStatus::Cancelled), "cancelled");
        assert_eq!(shown("running", RunStatus::Running), "running");
    }

    #[test]
    fn the_help_names_every_status() {
        use clap::CommandFactory as _;
        let mut cli = crate::Cli::command();
        let runs = cli.find_subcommand_mut("runs").unwrap();
        let list = runs.find_subcommand_mut("list").unwrap();
        let help = list.render_long_help().to_string();
        let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains(&ALL.join(", ")), "{help}");
    }
}
