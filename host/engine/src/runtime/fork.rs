//! Forks: [`Runtime::fork`] makes a new run whose log begins with another
//! run's events up to a position, copied byte for byte, then a
//! `run_forked` event naming the source, its chain hash there, the agent
//! and limits the fork goes on with and what the operator changed
//! ([`RunForked`]).
//!
//! What a fork inherits is reused, never executed again: every completion
//! in the prefix is a fact the fork reads back. What the prefix had not
//! finished is the fork's own business, under the fork's rules:
//! - a write in flight at the fork point (intent, no completion) stays
//!   in flight: the fork derives to `needs_reconciliation`, like any run
//!   whose write has no recorded outcome. The source may have made that
//!   write (or be making it), so neither "done" nor "not done" is known;
//!   dropping the intent would erase the only record that it may have
//!   reached the world and invite a second write after a fresh approval.
//!   A human resolves it in the fork (with what they found, the source's
//!   completion for example) or abandons the fork;
//! - an approval granted before the fork point for a call that had not
//!   run is withdrawn (`withdrawn_approval`): that human approved a call
//!   in the source's circumstances, not under the fork's agent, budgets
//!   and timeline, so the fork asks again;
//! - a read or idempotent call, or a model call, in flight is made again
//!   by the fork when it is driven (it never completed in the prefix);
//! - a keyed write in flight keeps its idempotency commitment with the
//!   source, which holds it: resolving it in the fork records the outcome
//!   in the fork's log and leaves the commitment alone.
//!
//! A crash between the fork's two writes (the store creates a run with its
//! first event, then the rest is appended) leaves a log of one event that
//! names the source as its run: every verb refuses such a run
//! ([`RuntimeError::UnfinishedFork`]), no worker claims it (it was never
//! queued nor claimed), and the same fork made again with the same id
//! finishes it.

use std::collections::BTreeMap;

use bytes::Bytes;
use warden_store::{EventStore, Listing, ListingStatus, RunMeta, StoreError};

use super::log::{decoded, recordable};
use super::{Runtime, RuntimeError};
use crate::agent::Agent;
use crate::budget::{BudgetLimits, RecordedLimits};
use crate::ceilings::RunCeilings;
use crate::events::{Event, RunForked};
use crate::ids::{CallId, RunId};
use crate::state::owed_count;
use crate::state::{RunState, ToolCallProgress, fold};

/// The listing label a fork carries, naming its source: how `runs show`
/// finds a run's forks without reading every log (each one found is
/// checked against its own `run_forked`).
pub const FORKED_FROM_LABEL: &str = "warden.forked_from";

/// How to fork a run: the agent the fork goes on with and what else
/// changes.
#[derive(Clone, Debug)]
pub struct ForkOptions<'a> {
    /// The agent the fork continues with: the source's, or a changed one
    /// (instructions, model, tools, budgets). Its name must be the
    /// source's.
    pub agent: &'a Agent,
    /// The agent the source ran with (its digest is checked), to name what
    /// changed; without it a changed definition is recorded as `agent`.
    pub source_agent: Option<&'a Agent>,
    /// Budgets that replace those in force, limit by limit.
    pub budgets: BudgetLimits,
    /// The fork's id (default: random). Giving the id of a fork a crash
    /// left unfinished finishes it.
    pub run_id: Option<RunId>,
    /// Who forks it.
    pub by: String,
}

/// A fork that cannot be made; nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForkRefusal {
    /// The position is outside the log.
    #[error("position {at} is outside the log (positions 1 to {events}; 1 keeps only run_started)")]
    OutOfRange {
        /// The position asked for.
        at: u64,
        /// The source's events.
        events: u64,
    },
    /// The source had ended at or before the position.
    #[error(
        "the run had ended ({status}) by position {at}: fork at a position before its end (it ended at {ended})"
    )]
    AfterEnd {
        /// The position asked for.
        at: u64,
        /// How it ended.
        status: &'static str,
        /// The position of its terminal event.
        ended: u64,
    },
    /// The fork's agent is another agent.
    #[error(
        "the run is agent `{source_agent}`'s; a fork goes on with the same agent, not `{given}`"
    )]
    OtherAgent {
        /// The source's agent.
        source_agent: String,
        /// The agent given.
        given: String,
    },
}

impl Runtime {
    /// Forks run `source` at `at`: a new run whose log is the source's
    /// events `1..=at` (byte for byte; positions count from 1, so 1 keeps
    /// only `run_started`) and a `run_forked` event. Recorded, not
    /// driven: drive (or recover) the fork with `options.agent`. Refused
    /// ([`RuntimeError::ForkRefused`]) at a position outside the log or
    /// at or after the source's end, and for another agent; nothing is
    /// written then.
    pub async fn fork(
        &self,
        source: &RunId,
        at: u64,
        options: ForkOptions<'_>,
    ) -> Result<RunId, RuntimeError> {
        let refused = |reason| RuntimeError::ForkRefused {
            run_id: source.clone(),
            reason,
        };
        let stored = self.inner.store.load(source).await?;
        // A fork of a rolled-back log would drive what was cut again.
        self.refuse_rolled_back(source, self.witness_problem(source, &stored).as_ref())?;
        let events_len = stored.len() as u64;
        if at == 0 || at > events_len {
            return Err(refused(ForkRefusal::OutOfRange {
                at,
                events: events_len,
            }));
        }
        let mut events = decoded(source, &stored)?;
        super::resolve_history(&*self.inner.store, &mut events).await?;
        let prefix = &events[..at as usize];
        if let Some(end) = prefix.iter().position(|e| e.kind().is_terminal()) {
            let state = fold(&events[..=end]).map_err(|error| RuntimeError::Fold {
                run_id: source.clone(),
                error,
            })?;
            return Err(refused(ForkRefusal::AfterEnd {
                at,
                status: state.status().as_str(),
                ended: end as u64 + 1,
            }));
        }
        let state = fold(prefix).map_err(|error| RuntimeError::Fold {
            run_id: source.clone(),
            error,
        })?;
        let agent = options.agent;
        if agent.name != state.agent {
            return Err(refused(ForkRefusal::OtherAgent {
                source_agent: state.agent.clone(),
                given: agent.name.clone(),
            }));
        }
        // The fork's agent must be able to run before anything is written.
        let prepared = self.prepare(agent).await?;
        let source_agent = options
            .source_agent
            .filter(|a| a.digest == state.agent_digest);
        let limits = fork_limits(&state, agent, &options.budgets, &self.inner.ceilings);
        let mut changed = changes(source_agent, &state, agent);
        if limits.budgets != state.effective_limits(&agent.budgets) {
            changed.push("budgets".into());
        }
        let withdrawn_approval = state
            .next_call()
            .filter(|c| matches!(c.progress, ToolCallProgress::Approved { .. }))
            .map(|c| c.call_id.clone());
        let run_id = match options.run_id {
            Some(id) => id,
            None => self.random_run_id(),
        };
        let now = self.inner.clock.now_ms();
        let forked = Event::RunForked(RunForked {
            run_id: run_id.clone(),
            source_run: source.clone(),
            position: at,
            source_head: stored[at as usize - 1].hash.to_hex(),
            agent_digest: agent.digest.clone(),
            agent_file: agent
                .path
                .to_str()
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
            limits,
            changed,
            withdrawn_approval,
            by: options.by,
            at_ms: now,
        });
        // Folded before anything is written: an impossible fork is a bug.
        let mut state = state;
        state.apply(&forked).map_err(|error| RuntimeError::Fold {
            run_id: run_id.clone(),
            error,
        })?;
        let mut rest: Vec<Bytes> = stored[1..at as usize]
            .iter()
            .map(|s| s.bytes.clone())
            .collect();
        rest.push(recordable(&run_id, &forked)?);
        let status = state.status();
        let all: Vec<&Event> = prefix.iter().chain([&forked]).collect();
        let owed = if status == crate::status::RunStatus::Running {
            0
        } else {
            owed_count(all.iter().copied(), &state, &prepared.view.channels)
        };
        let listing = Listing::new(status.listing())
            .owing(owed)
            .waking_at(state.waiting().map(|w| w.until_ms as i64));
        let mut labels: BTreeMap<String, String> = state.labels.clone();
        labels.insert(FORKED_FROM_LABEL.into(), source.to_string());
        let meta = RunMeta {
            agent: agent.name.clone(),
            labels,
            session: None,
            session_runs: None,
            history: Vec::new(),
            // The fork's first event is the source's: it names the same
            // history, which must outlive the source.
            history_head: match &events[0] {
                Event::RunStarted(started) => started
                    .session
                    .as_ref()
                    .and_then(|s| s.chain.as_ref())
                    .map(|c| c.head),
                _ => None,
            },
            created_ms: now as i64,
        };
        let store: &dyn EventStore = &*self.inner.store;
        // Listed as running but never queued nor claimed: no worker takes
        // the one-event log a crash here would leave.
        let created = store
            .create(
                &run_id,
                meta,
                stored[0].bytes.clone(),
                ListingStatus::RUNNING,
            )
            .await;
        match created {
            Ok(_) => {}
            Err(StoreError::AlreadyExists { .. }) => {
                if !unfinished_fork_of(store, &run_id, &stored[0].bytes).await? {
                    return Err(RuntimeError::AlreadyStarted { run_id });
                }
            }
            Err(error) => return Err(error.into()),
        }
        store.append(&run_id, 1, &rest, listing, now as i64).await?;
        Ok(run_id)
    }
}

/// Whether the call `call_id` in flight was inherited in flight: the run
/// is a fork whose inherited events hold the call's intent, and nothing
/// after the fork point started it.
pub(super) fn inherited_in_flight(events: &[Event], state: &RunState, call_id: &CallId) -> bool {
    let Some(fork) = &state.fork else {
        return false;
    };
    let at = (fork.position as usize).min(events.len());
    let started = |e: &Event| matches!(e, Event::ToolCallIntent(i) if i.call_id == *call_id);
    events[..at].iter().any(started) && !events[at..].iter().any(started)
}

/// Whether `run_id` holds only the first event of a fork a crash left
/// unfinished: exactly `first`.
async fn unfinished_fork_of(
    store: &dyn EventStore,
    run_id: &RunId,
    first: &Bytes,
) -> Result<bool, RuntimeError> {
    let events = store.load(run_id).await?;
    Ok(matches!(events.as_slice(), [only] if only.bytes == *first))
}

/// The limits the fork goes on with: those in force at the fork point (the
/// source's extensions included), or the fork's agent's own when its file
/// sets other budgets than the source started with, then `budgets` over
/// them; the input-size cap and currency are the fork's agent's.
fn fork_limits(
    state: &RunState,
    agent: &Agent,
    budgets: &BudgetLimits,
    ceilings: &RunCeilings,
) -> RecordedLimits {
    let fresh = agent.recorded_limits(ceilings);
    let started = state.limits.as_ref().map(|l| l.budgets);
    let base = if started.is_some_and(|b| b != fresh.budgets) {
        fresh.budgets
    } else {
        state.effective_limits(&fresh.budgets)
    };
    RecordedLimits {
        budgets: base.overridden_by(budgets),
        ..fresh
    }
}

/// What the fork's agent changes against the source's, by name.
fn changes(source: Option<&Agent>, state: &RunState, agent: &Agent) -> Vec<String> {
    if agent.digest == state.agent_digest {
        return Vec::new();
    }
    let Some(source) = source else {
        return vec!["agent".into()];
    };
    let mut changed = Vec::new();
    let mut note = |name: &str, differs: bool| {
        if differs {
            changed.push(name.to_owned());
        }
    };
    note("instructions", source.instructions != agent.instructions);
    note("model", source.model != agent.model);
    note(
        "tools",
        source.plugins != agent.plugins
            || source.human_tools != agent.human_tools
            || source.external_tools != agent.external_tools,
    );
    note("policies", source.policies != agent.policies);
    note("channels", source.channels != agent.channels);
    note("context", source.context != agent.context);
    note("output_schema", source.output_schema != agent.output_schema);
    note(
        "max_input_size",
        source.max_input_bytes != agent.max_input_bytes,
    );
    // Budgets are named by the caller, from the limits themselves.
    if changed.is_empty() && source.budgets == agent.budgets {
        changed.push("agent".into());
    }
    changed
}
