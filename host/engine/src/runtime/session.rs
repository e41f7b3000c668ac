//! Sessions: a conversation of many runs. This module owns what a run in a
//! session sees as history and how it is fixed when the run starts; the
//! store owns the rule of one active run per session (`store/session.rs`).
//!
//! - **History is the transcripts of the session's earlier completed
//!   runs**, oldest first: each run's input, the model's turns and the tool
//!   results, exactly as that run's model saw them ([`RunState::transcript`]).
//!   A run that failed, was cancelled or abandoned contributes nothing: its
//!   partial messages are rolled back.
//! - **It is fixed and recorded when the run starts**, in
//!   [`RunStarted::session`](crate::events::RunStarted::session) (the
//!   runs it came from and the messages), so folding a run stays per run and
//!   pure, and replay reads the recorded history and never another run's
//!   log.
//! - **Reading and starting are checked together**: the start carries the
//!   number of runs the session held when its history was read
//!   ([`RunMeta::session_runs`](warden_store::RunMeta::session_runs)); the
//!   store refuses it if that changed, and the runtime reads again.
//!
//! The latest completed run's history plus its own transcript is the whole
//! history of the next run (by induction: its history was every completed
//! run before it). The latest is the completed run with the longest list of
//! history runs, so ties in creation time never reorder a session. A start
//! reads one log in the usual case: the completed run created last, once
//! its recorded history names every other completed run of the session;
//! only when creation times tie or went backwards are all read.

use serde_json::Value;

use super::{RuntimeError, decoded};
use crate::events::SessionStart;
use crate::ids::{RunId, SessionId};
use crate::state::{RunState, Terminal, fold};
use crate::status::RunStatus;
use std::collections::BTreeMap;

use warden_store::{EventStore, RunFilter, RunSummary, SETTLED_STATUSES};

/// One run of a session, as `warden sessions show` lists it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct SessionRun {
    /// The run.
    pub run_id: RunId,
    /// Its agent.
    pub agent: String,
    /// Its status, derived from its log.
    pub status: RunStatus,
    /// When it started, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// Its input.
    pub input: Value,
    /// Its output, once completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Its place in the session, from 0.
    pub position: u64,
    /// How many earlier completed runs it saw as history.
    pub history_runs: usize,
}

/// One session, as `warden sessions list` lists it: derived from the
/// store's run listing, so it costs no log reads.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct SessionSummary {
    /// The session.
    pub session: String,
    /// How many runs it holds.
    pub runs: usize,
    /// Its active run (one not settled), if any: the session is busy.
    pub active_run: Option<RunId>,
    /// That run's listed status.
    pub active_status: Option<String>,
    /// When its first run was recorded, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// When any of its runs last changed.
    pub updated_ms: i64,
}

/// Every session the store's runs belong to, by name.
pub(crate) async fn summaries(store: &dyn EventStore) -> Result<Vec<SessionSummary>, RuntimeError> {
    let mut sessions: BTreeMap<String, Vec<RunSummary>> = BTreeMap::new();
    for run in store.list(&RunFilter::new()).await? {
        if let Some(session) = run.session.clone() {
            sessions.entry(session).or_default().push(run);
        }
    }
    Ok(sessions
        .into_iter()
        .map(|(session, runs)| {
            let active = runs.iter().find(|r| {
                r.status
                    .parse::<RunStatus>()
                    .map_or(true, |s| !s.is_terminal())
            });
            SessionSummary {
                active_run: active.map(|r| r.run_id.clone()),
                active_status: active.map(|r| r.status.clone()),
                created_ms: runs.iter().map(|r| r.created_ms).min().unwrap_or(0),
                updated_ms: runs.iter().map(|r| r.updated_ms).max().unwrap_or(0),
                runs: runs.len(),
                session,
            }
        })
        .collect())
}

/// The history a run starting now at `position` in `session_id` sees,
/// given the folded states of the session's completed runs (in any order).
/// Pure.
pub(crate) fn session_start(
    session_id: &SessionId,
    position: u64,
    completed: &[RunState],
) -> SessionStart {
    let latest = completed
        .iter()
        .filter(|s| s.status() == RunStatus::Completed)
        .max_by_key(|s| s.history_runs.len());
    match latest {
        None => SessionStart {
            session_id: session_id.clone(),
            position,
            runs: Vec::new(),
            history: Vec::new(),
        },
        Some(latest) => SessionStart {
            session_id: session_id.clone(),
            position,
            runs: latest
                .history_runs
                .iter()
                .cloned()
                .chain([latest.run_id.clone()])
                .collect(),
            history: latest
                .history()
                .iter()
                .chain(latest.transcript())
                .cloned()
                .collect(),
        },
    }
}

/// Reads the session as the store has it now: the history a run starting
/// now sees, and how many runs the session holds (for
/// [`RunMeta::session_runs`](warden_store::RunMeta::session_runs)).
/// A session with an active run is [`RuntimeError::SessionBusy`] at once.
pub(crate) async fn read(
    store: &dyn EventStore,
    session_id: &SessionId,
) -> Result<(SessionStart, u64), RuntimeError> {
    let runs = store
        .list(&RunFilter::new().session(session_id.as_str()))
        .await?;
    if let Some(active) = runs
        .iter()
        .find(|r| !SETTLED_STATUSES.contains(&r.status.as_str()))
    {
        return Err(RuntimeError::SessionBusy {
            session_id: session_id.clone(),
            active_run: active.run_id.clone(),
        });
    }
    let held = runs.len() as u64;
    let completed: Vec<&RunId> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Completed.as_str())
        .map(|r| &r.run_id)
        .collect();
    // The latest created is the latest completed when every other completed
    // run is in its history (the usual case: one log read). Otherwise
    // (creation times that tie or went backwards) read them all.
    let Some(&candidate) = completed.last() else {
        return Ok((session_start(session_id, held, &[]), held));
    };
    let latest = load_state(store, candidate).await?;
    if completed
        .iter()
        .all(|r| *r == candidate || latest.history_runs.contains(r))
    {
        return Ok((session_start(session_id, held, &[latest]), held));
    }
    let mut states = vec![latest];
    for run in completed.into_iter().filter(|r| *r != candidate) {
        states.push(load_state(store, run).await?);
    }
    Ok((session_start(session_id, held, &states), held))
}

/// The session's runs, oldest first, with statuses derived from their logs.
pub(crate) async fn runs(
    store: &dyn EventStore,
    session_id: &SessionId,
) -> Result<Vec<SessionRun>, RuntimeError> {
    let listed = store
        .list(&RunFilter::new().session(session_id.as_str()))
        .await?;
    let mut runs = Vec::with_capacity(listed.len());
    for summary in listed {
        let state = load_state(store, &summary.run_id).await?;
        runs.push(SessionRun {
            output: match &state.terminal {
                Some(Terminal::Completed(c)) => Some(c.output.clone()),
                _ => None,
            },
            status: state.status(),
            started_ms: state.clock_seed_ms,
            position: state.session_position.unwrap_or_default(),
            history_runs: state.history_runs.len(),
            input: state.input,
            agent: state.agent,
            run_id: state.run_id,
        });
    }
    // The order the session was lived in (creation times may tie).
    runs.sort_by_key(|r| (r.position, r.started_ms));
    Ok(runs)
}

async fn load_state(store: &dyn EventStore, run_id: &RunId) -> Result<RunState, RuntimeError> {
    let events = decoded(run_id, &store.load(run_id).await?)?;
    fold(&events).map_err(|error| RuntimeError::Fold {
        run_id: run_id.clone(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::events::{Event, RunCancelled, RunCompleted, RunStarted};
    use crate::ids::AgentDigest;
    use warden_providers::Message;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.into(),
        }
    }

    fn started(run: &str, input: &str, session: SessionStart) -> RunStarted {
        RunStarted {
            run_id: RunId::new(run).unwrap(),
            agent: "chat".into(),
            agent_digest: AgentDigest::from_hex("d1"),
            input: json!(input),
            labels: BTreeMap::new(),
            clock_seed_ms: 5,
            random_seed: 1,
            agent_file: None,
            session: Some(session),
            limits: None,
            parent: None,
            mcp_tools: Default::default(),
        }
    }

    /// A run that started with `session` and ended with `end`, the model
    /// having said nothing (the input is its whole transcript).
    fn ended(run: &str, input: &str, session: SessionStart, end: Event) -> RunState {
        let mut state = RunState::start(&started(run, input, session));
        state.apply(&end).unwrap();
        state
    }

    #[test]
    fn history_is_the_completed_runs_transcripts_and_skips_the_rest() {
        let chat = SessionId::new("chat").unwrap();
        let first = session_start(&chat, 0, &[]);
        assert!(first.runs.is_empty() && first.history.is_empty());
        let done = |output: &str| {
            Event::RunCompleted(RunCompleted {
                output: json!(output),
                by_host: false,
            })
        };
        let one = ended("one", "hello", first.clone(), done("hi"));
        let after_one = session_start(&chat, 1, std::slice::from_ref(&one));
        assert_eq!(after_one.runs, [RunId::new("one").unwrap()]);
        assert_eq!(after_one.history, [user("hello")]);
        // The second run was cancelled: it adds nothing.
        let two = ended(
            "two",
            "write an essay",
            after_one.clone(),
            Event::RunCancelled(RunCancelled {
                reason: None,
                by: None,
                unresolved_write: None,
            }),
        );
        let after_two = session_start(&chat, 2, &[two.clone(), one.clone()]);
        assert_eq!(
            (&after_two.runs, &after_two.history),
            (&after_one.runs, &after_one.history)
        );
        assert_eq!(after_two.position, 2);
        // The third saw the first only; the fourth sees the first and third,
        // whatever order the states come in.
        let three = ended("three", "and now?", after_two, done("ok"));
        let after_three = session_start(&chat, 3, &[three.clone(), one.clone(), two]);
        assert_eq!(
            after_three.runs,
            [RunId::new("one").unwrap(), RunId::new("three").unwrap()]
        );
        assert_eq!(after_three.history, [user("hello"), user("and now?")]);
        assert_eq!(three.history(), [user("hello")]);
        assert_eq!(three.transcript(), [user("and now?")]);
        assert_eq!(
            three.conversation(),
            [user("hello"), user("and now?")],
            "the model sees the history, then the input"
        );
    }
}
