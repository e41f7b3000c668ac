//! Sessions: a conversation of many runs. This module owns what a run in a
//! session sees as history, how it is fixed when the run starts and how it
//! is read back; the store owns the rule of one active run per session
//! (`store/session.rs`) and keeps the shared history (`store/history.rs`).
//!
//! - **History is the transcripts of the session's earlier completed
//!   runs**, oldest first: each run's input, the model's turns and the tool
//!   results, exactly as that run's model saw them ([`RunState::transcript`]).
//!   A run that failed, was cancelled or abandoned contributes nothing: its
//!   partial messages are rolled back.
//! - **It is fixed when the run starts, by reference**: the store keeps the
//!   history as a chain of content-addressed chunks, one per completed run
//!   (its id and transcript), each naming the one before it, and the run's
//!   [`RunStarted::session`](crate::events::RunStarted::session) records the
//!   newest chunk's digest and the counts ([`HistoryChain`]). The digest
//!   commits to the whole chain, and the run's own hash chain covers it, so
//!   what the run saw can be neither changed nor lost unnoticed: a chunk
//!   missing or altered is [`StoreError::HistoryBroken`] when the log is
//!   loaded, recovered, replayed or verified. Each chunk is stored once, so
//!   a session's storage grows with its length, not its square.
//! - **Loading a log resolves it** ([`resolve_history`]): one read of the
//!   chain fills the history into the first event in memory, and folding an
//!   unresolved one is refused, so folding stays per run and pure and replay
//!   reads the history the run recorded, never another run's log. Logs
//!   written before chunks carry the history inline and are read as they
//!   are.
//! - **Reading and starting are checked together**: the start carries the
//!   number of runs the session held when it was read
//!   ([`RunMeta::session_runs`](warden_store::RunMeta::session_runs)); the
//!   store refuses it if that changed, and the runtime reads again. The new
//!   chunk is written in the same transaction as the run.
//!
//! The latest completed run's history plus its own transcript is the whole
//! history of the next run (by induction: its history was every completed
//! run before it), so a start reads one log and no history: the latest
//! run's chain and its transcript make the new chunk. The latest is the
//! completed run whose history holds the most runs, so ties in creation
//! time never reorder a session. In the usual case that is the run that
//! completed last, which the store keeps with the session's counts and its
//! active run ([`SessionHead`](warden_store::SessionHead)), so a start
//! reads neither the session's listing nor more than one log, however long
//! the session; only when that run's history does not count every other
//! completed run (it was pruned, say) are all read.

use std::collections::BTreeMap;

use serde_json::Value;
use warden_providers::Message;
use warden_store::{EventStore, HistoryChunk, HistoryDigest, RunFilter, RunSummary, StoreError};

use super::RuntimeError;
use super::log::decoded;
use crate::events::{Event, HistoryChain, RunStarted, SessionStart};
use crate::ids::{RunId, SessionId};
use crate::state::{RunState, Terminal, fold};
use crate::status::RunStatus;

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

/// A completed (or otherwise ended) run of the session as a start reads it:
/// its state folded without its history, and the history it recorded,
/// unresolved. Reading it costs one log, however long the session.
pub(crate) struct Ended {
    /// The run's state; its conversation is its own transcript.
    state: RunState,
    /// Its session part as recorded (a chain, or inline runs and history).
    recorded: SessionStart,
}

/// What a run starting now records of its session, and the history chunks
/// its create writes (the ones its chain ends with and the store may not
/// hold yet).
pub(crate) struct Opening {
    /// Its session part.
    pub(crate) start: SessionStart,
    /// The chunks to write with the create (see
    /// [`RunMeta::history`](warden_store::RunMeta::history)).
    pub(crate) chunks: Vec<HistoryChunk>,
}

/// What a history chunk's body holds, as JSON: the runs it adds to the
/// history and their transcripts, in order (`{"runs": [...], "messages":
/// [...]}`; written by [`chunk`]).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ChunkBody {
    runs: Vec<RunId>,
    messages: Vec<Message>,
}

fn chunk(previous: Option<HistoryDigest>, runs: &[RunId], messages: &[Message]) -> HistoryChunk {
    let body = serde_json::to_vec(&serde_json::json!({ "runs": runs, "messages": messages }))
        .expect("runs and messages always serialize");
    HistoryChunk::new(previous, body)
}

/// The history a run starting now at `position` in `session_id` sees,
/// given the session's ended runs (in any order): the latest completed
/// run's history, then that run's transcript, as one new chunk after the
/// chunks of the latest's own history. Pure.
pub(crate) fn opening(session_id: &SessionId, position: u64, ended: &[Ended]) -> Opening {
    let mut start = SessionStart {
        session_id: session_id.clone(),
        position,
        runs: Vec::new(),
        history: Vec::new(),
        chain: None,
    };
    let Some(latest) = ended
        .iter()
        .filter(|e| e.state.status() == RunStatus::Completed)
        .max_by_key(|e| e.recorded.history_run_count())
    else {
        return Opening {
            start,
            chunks: Vec::new(),
        };
    };
    let mut chunks = Vec::new();
    let before = match &latest.recorded.chain {
        Some(chain) => Some(chain.clone()),
        // A log from before history chunks: its inline history becomes the
        // first chunk of the chain.
        None if !latest.recorded.runs.is_empty() => {
            let first = chunk(None, &latest.recorded.runs, &latest.recorded.history);
            let chain = HistoryChain {
                head: *first.digest(),
                runs: latest.recorded.runs.len() as u64,
                messages: latest.recorded.history.len() as u64,
            };
            chunks.push(first);
            Some(chain)
        }
        None => None,
    };
    let transcript = latest.state.transcript();
    let newest = chunk(
        before.as_ref().map(|c| c.head),
        std::slice::from_ref(&latest.state.run_id),
        transcript,
    );
    start.chain = Some(HistoryChain {
        head: *newest.digest(),
        runs: before.as_ref().map_or(0, |c| c.runs) + 1,
        messages: before.as_ref().map_or(0, |c| c.messages) + transcript.len() as u64,
    });
    chunks.push(newest);
    Opening { start, chunks }
}

/// Reads the session as the store has it now: what a run starting now
/// records, and how many runs the session holds (for
/// [`RunMeta::session_runs`](warden_store::RunMeta::session_runs)).
/// A session with an active run is [`RuntimeError::SessionBusy`] at once.
///
/// It costs the same however long the session: the store's
/// [`SessionHead`](warden_store::SessionHead) (one row and an index
/// lookup) and the log of the run that completed last.
pub(crate) async fn read(
    store: &dyn EventStore,
    session_id: &SessionId,
) -> Result<(Opening, u64), RuntimeError> {
    let head = store.session_head(session_id.as_str()).await?;
    if let Some((active_run, _)) = head.active {
        return Err(RuntimeError::SessionBusy {
            session_id: session_id.clone(),
            active_run,
        });
    }
    let held = head.runs;
    let Some(candidate) = head.latest_completed else {
        return Ok((opening(session_id, held, &[]), held));
    };
    // The run that completed last is the latest when its history holds
    // every other completed run (the usual case, a session lived one run
    // at a time: one log read); its history holds only runs of the session
    // that completed, so the count tells. Otherwise (it was pruned, or
    // something unusual reordered the session) read them all.
    match load_ended(store, session_id, &candidate).await {
        Ok(latest) if latest.recorded.history_run_count() + 1 == head.completed => {
            return Ok((opening(session_id, held, &[latest]), held));
        }
        Ok(_) | Err(RuntimeError::UnknownRun { .. }) => {}
        Err(RuntimeError::Store {
            error: StoreError::Pruned { .. },
        }) => {}
        Err(error) => return Err(error),
    }
    let runs = store
        .list(&RunFilter::new().session(session_id.as_str()))
        .await?;
    let mut ended = Vec::new();
    for run in runs
        .iter()
        .filter(|r| r.status == RunStatus::Completed.as_str())
    {
        ended.push(load_ended(store, session_id, &run.run_id).await?);
    }
    Ok((opening(session_id, held, &ended), held))
}

/// The session's runs, oldest first, with statuses derived from their logs.
/// One log read per run; no history is read.
pub(crate) async fn runs(
    store: &dyn EventStore,
    session_id: &SessionId,
) -> Result<Vec<SessionRun>, RuntimeError> {
    let listed = store
        .list(&RunFilter::new().session(session_id.as_str()))
        .await?;
    let mut runs = Vec::with_capacity(listed.len());
    for summary in listed {
        let Ended { state, recorded } = load_ended(store, session_id, &summary.run_id).await?;
        runs.push(SessionRun {
            output: match &state.terminal {
                Some(Terminal::Completed(c)) => Some(c.output.clone()),
                _ => None,
            },
            status: state.status(),
            started_ms: state.clock_seed_ms,
            position: recorded.position,
            history_runs: recorded.history_run_count() as usize,
            input: state.input,
            agent: state.agent,
            run_id: state.run_id,
        });
    }
    // The order the session was lived in (creation times may tie).
    runs.sort_by_key(|r| (r.position, r.started_ms));
    Ok(runs)
}

/// Run `run_id` of `session_id`, folded without its history.
async fn load_ended(
    store: &dyn EventStore,
    session_id: &SessionId,
    run_id: &RunId,
) -> Result<Ended, RuntimeError> {
    let mut events = decoded(run_id, &store.load(run_id).await?)?;
    // Moved out of the first event, so the fold below sees a run without
    // history (a listing that names the session of a run whose log does
    // not is read as a run with none).
    let recorded = match events.first_mut() {
        Some(Event::RunStarted(RunStarted {
            session: Some(session),
            ..
        })) => SessionStart {
            session_id: session.session_id.clone(),
            position: session.position,
            runs: std::mem::take(&mut session.runs),
            history: std::mem::take(&mut session.history),
            chain: session.chain.take(),
        },
        _ => SessionStart {
            session_id: session_id.clone(),
            position: 0,
            runs: Vec::new(),
            history: Vec::new(),
            chain: None,
        },
    };
    let state = fold(&events).map_err(|error| RuntimeError::Fold {
        run_id: run_id.clone(),
        error,
    })?;
    Ok(Ended { state, recorded })
}

/// Fills in the session history of a log whose first event names it by its
/// chain (see [`SessionStart`]): reads the chunks from `store`, checked
/// against their digests, and puts their runs and messages in
/// `runs` and `history`. A log without a chain, or resolved already, is
/// left as it is. Every load of a log the runtime folds goes through here;
/// a caller folding a log it loaded from the store itself calls it first.
pub async fn resolve_history(
    store: &dyn EventStore,
    events: &mut [Event],
) -> Result<(), StoreError> {
    let Some(Event::RunStarted(RunStarted {
        session: Some(session),
        ..
    })) = events.first_mut()
    else {
        return Ok(());
    };
    if session.is_resolved() {
        return Ok(());
    }
    let Some(chain) = session.chain.clone() else {
        return Ok(());
    };
    let (runs, history) = history_of(&chain, &store.load_history(&chain.head).await?)?;
    session.runs = runs;
    session.history = history;
    Ok(())
}

/// The runs and messages `chunks` (a chain, oldest first, as the store
/// gives it) hold, checked against what `chain` recorded of them.
fn history_of(
    chain: &HistoryChain,
    chunks: &[HistoryChunk],
) -> Result<(Vec<RunId>, Vec<Message>), StoreError> {
    let broken = |at: &HistoryDigest, reason: String| StoreError::HistoryBroken {
        head: chain.head,
        at: *at,
        reason,
    };
    let mut runs = Vec::new();
    let mut messages = Vec::new();
    for chunk in chunks {
        let body: ChunkBody = serde_json::from_slice(chunk.body())
            .map_err(|e| broken(chunk.digest(), format!("its content does not decode: {e}")))?;
        runs.extend(body.runs);
        messages.extend(body.messages);
    }
    if (runs.len() as u64, messages.len() as u64) != (chain.runs, chain.messages) {
        return Err(broken(
            &chain.head,
            format!(
                "the chain holds {} runs and {} messages; the run recorded {} and {}",
                runs.len(),
                messages.len(),
                chain.runs,
                chain.messages
            ),
        ));
    }
    Ok((runs, messages))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use serde_json::json;

    use super::*;
    use crate::events::{RunCancelled, RunCompleted};
    use crate::ids::AgentDigest;

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
    /// having said nothing (the input is its whole transcript), as a start
    /// reads it.
    fn ended(run: &str, input: &str, session: SessionStart, end: &Event) -> Ended {
        let mut bare = session.clone();
        (bare.runs, bare.history, bare.chain) = (Vec::new(), Vec::new(), None);
        let mut state = RunState::start(&started(run, input, bare));
        state.apply(end).unwrap();
        Ended {
            state,
            recorded: session,
        }
    }

    fn done() -> Event {
        Event::RunCompleted(RunCompleted {
            output: json!("ok"),
            by_host: false,
        })
    }

    fn id(run: &str) -> RunId {
        RunId::new(run).unwrap()
    }

    /// The chunks the starts wrote, as a store keeps them.
    #[derive(Default)]
    struct Pool(HashMap<HistoryDigest, HistoryChunk>);

    impl Pool {
        fn open(&mut self, session: &SessionId, position: u64, ended: &[Ended]) -> SessionStart {
            let opening = opening(session, position, ended);
            for chunk in opening.chunks {
                self.0.insert(*chunk.digest(), chunk);
            }
            opening.start
        }

        /// The history `start` names: its runs and messages.
        fn resolve(&self, start: &SessionStart) -> (Vec<RunId>, Vec<Message>) {
            let Some(chain) = &start.chain else {
                return (start.runs.clone(), start.history.clone());
            };
            let mut chunks = Vec::new();
            let mut next = Some(chain.head);
            while let Some(digest) = next {
                let chunk = self.0[&digest].clone();
                next = chunk.previous().copied();
                chunks.push(chunk);
            }
            chunks.reverse();
            history_of(chain, &chunks).unwrap()
        }
    }

    #[test]
    fn history_is_the_completed_runs_transcripts_and_skips_the_rest() {
        let chat = SessionId::new("chat").unwrap();
        let mut pool = Pool::default();
        let first = pool.open(&chat, 0, &[]);
        assert_eq!(
            (&first.chain, first.runs.len(), first.history.len()),
            (&None, 0, 0)
        );
        let one = || ended("one", "hello", first.clone(), &done());
        let after_one = pool.open(&chat, 1, &[one()]);
        assert_eq!(
            pool.resolve(&after_one),
            (vec![id("one")], vec![user("hello")])
        );
        assert!(
            after_one.runs.is_empty() && after_one.history.is_empty(),
            "by reference only"
        );
        // The second run was cancelled: it adds nothing.
        let cancelled = Event::RunCancelled(RunCancelled {
            reason: None,
            by: None,
            unresolved_write: None,
        });
        let two = || ended("two", "write an essay", after_one.clone(), &cancelled);
        let after_two = pool.open(&chat, 2, &[two(), one()]);
        assert_eq!(after_two.chain, after_one.chain);
        assert_eq!(after_two.position, 2);
        // The third saw the first only; the fourth sees the first and third,
        // whatever order the runs come in.
        let three = || ended("three", "and now?", after_two.clone(), &done());
        let after_three = pool.open(&chat, 3, &[three(), one(), two()]);
        assert_eq!(pool.open(&chat, 3, &[one(), two(), three()]), after_three);
        assert_eq!(
            pool.resolve(&after_three),
            (
                vec![id("one"), id("three")],
                vec![user("hello"), user("and now?")]
            )
        );
        let chain = after_three.chain.as_ref().unwrap();
        assert_eq!((chain.runs, chain.messages), (2, 2));
        assert_eq!(pool.0.len(), 2, "one chunk per completed run, shared");
    }

    #[test]
    fn a_run_that_recorded_its_history_inline_starts_the_chain() {
        let chat = SessionId::new("chat").unwrap();
        let mut pool = Pool::default();
        // As logs written before history chunks record it.
        let inline = SessionStart {
            session_id: chat.clone(),
            position: 1,
            runs: vec![id("old")],
            history: vec![user("from before")],
            chain: None,
        };
        let next = pool.open(&chat, 2, &[ended("later", "and now?", inline, &done())]);
        assert_eq!(
            pool.0.len(),
            2,
            "the inline history becomes the first chunk"
        );
        assert_eq!(
            pool.resolve(&next),
            (
                vec![id("old"), id("later")],
                vec![user("from before"), user("and now?")]
            )
        );
    }

    #[test]
    fn a_chain_that_does_not_hold_what_the_run_recorded_is_refused() {
        let chat = SessionId::new("chat").unwrap();
        let mut pool = Pool::default();
        let first = pool.open(&chat, 0, &[]);
        let start = pool.open(&chat, 1, &[ended("one", "hello", first, &done())]);
        let chain = start.chain.clone().unwrap();
        let chunks: Vec<HistoryChunk> = pool.0.values().cloned().collect();
        let counted = HistoryChain {
            messages: 5,
            ..chain.clone()
        };
        let error = history_of(&counted, &chunks).unwrap_err();
        assert!(
            error.to_string().contains("1 runs and 1 messages"),
            "{error}"
        );
        let unreadable = HistoryChunk::new(None, &b"{not json"[..]);
        match history_of(&chain, std::slice::from_ref(&unreadable)) {
            Err(StoreError::HistoryBroken { at, reason, .. }) => {
                assert_eq!(at, *unreadable.digest());
                assert!(reason.contains("does not decode"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
