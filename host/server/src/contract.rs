//! The one JSON contract (docs/json-output.md) of the command line's
//! `--json` and of the HTTP API, shared so that both say the same thing. Every
//! line a command prints on stdout with `--json` is one of a few documented
//! shapes, each an object carrying the contract's version `v`:
//!
//! - an **event line**, `{"v", "seq", "event"}`: one event of a run's log
//!   and its position (`run`, the verbs that drive a run, `runs events`,
//!   and inside `runs show`);
//! - a **run summary**, `{"v", "run_id", "status", "output"?, "error"?,
//!   "next"}`: how a run stands after a command (the last line of `run`
//!   and of every verb on a run; `runs show` is one with more fields);
//! - an **error envelope**, `{"v", "error": {"code", "message",
//!   "details"}}` (`errors.rs`).
//!
//! A failed run's `error` has the envelope's inner shape, its `code` the
//! run error's kind. `next` is what a human can do, as `{"action",
//! "command"}` objects. Fields may be added within a version; a change
//! that could mislead a reader bumps [`VERSION`].

use serde::Serialize;
use serde_json::{Value, json};

use warden::engine::events::{Event, RunError};
use warden::engine::{RunId, RunStatus};

/// The contract's version, the `v` of every line.
pub const VERSION: u32 = 1;

/// An event line.
pub fn event_line(seq: u64, event: &Event) -> Value {
    json!({ "v": VERSION, "seq": seq, "event": event })
}

/// An event line from the stored bytes of event `seq` (`{"v", "event"}`),
/// its event object as stored.
pub fn stored_line(seq: u64, bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut stored: Value = serde_json::from_slice(bytes)?;
    Ok(json!({ "v": VERSION, "seq": seq, "event": stored["event"].take() }))
}

/// One thing a human can do about a run, and the command that does it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NextStep {
    /// `approve`, `deny`, `answer`, `extend`, `resume`, `complete`,
    /// `resolve` or `abandon`.
    pub action: &'static str,
    /// The command line.
    pub command: String,
}

/// A run summary: `run_id`'s `status`, its output when it completed, its
/// error when it failed (from `events`), and `next`.
pub fn summary(
    run_id: &RunId,
    status: &str,
    events: &[Event],
    output: Option<&Value>,
    next: &[NextStep],
) -> Value {
    let mut body = json!({ "v": VERSION, "run_id": run_id, "status": status, "next": next });
    if let Some(output) = output {
        body["output"] = output.clone();
    }
    if status == RunStatus::Failed.as_str()
        && let Some(error) = events.iter().rev().find_map(|e| match e {
            Event::RunFailed(f) => Some(&f.error),
            _ => None,
        })
    {
        body["error"] = run_error(error);
    }
    body
}

/// A run's error in the envelope's inner shape: its kind as `code`.
pub fn run_error(error: &RunError) -> Value {
    let mut details = serde_json::to_value(error).unwrap_or_else(|_| json!({}));
    let code = details
        .as_object_mut()
        .and_then(|d| d.remove("kind"))
        .unwrap_or_else(|| json!("run_failed"));
    json!({ "code": code, "message": error.to_string(), "details": details })
}

/// A standing approval rule, with its standing at `now_ms` (`live`,
/// `expired`, `revoked`): what `warden approvals list --json` and the API
/// print for each rule.
pub fn rule(rule: &warden::engine::Rule, now_ms: i64) -> Value {
    let mut value = serde_json::to_value(rule).expect("a rule serializes");
    value["standing"] = Value::from(match rule.standing(now_ms) {
        warden::store::RuleStanding::Live => "live",
        warden::store::RuleStanding::Expired => "expired",
        warden::store::RuleStanding::Revoked => "revoked",
    });
    value
}
