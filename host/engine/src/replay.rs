//! Checked replay: folds a recorded log while asking [`decide`](super::decide()) what it
//! would do at every position where the engine made a decision, and refuses
//! a log whose decisions the current agent would not make.
//!
//! Checked positions: model call intents (step, attempt and the request
//! hash, so a changed prompt or tool set is caught without storing the
//! prompt), compaction intents (step, cut and request hash; the summary
//! that came back is a fact, quoted into later requests), tool call intents (tool, frozen arguments, effect class, key),
//! rejections, approval requests, suspensions, budget crossings, waits for a
//! retry's due time, clock reads,
//! context resolutions (which source, for which step), output rejections
//! (typed results) and completions; child runs started (`child_started`:
//! which child, for which call, input and budgets — how a child ended is a
//! fact); delivery intents (the channel, the event
//! reported and the payload), unless the agent change was accepted (its
//! channels may differ). A completion the host supplied
//! ([`Runtime::finish_with`](super::Runtime::finish_with)) is a fact, like a
//! human act: it was validated when it was written. Completions of effects
//! (deliveries' too), human acts (approvals, input, resolutions, extensions,
//! cancellations, abandonments), a wait's end, random draws, what context sources returned
//! and failures are facts, taken as recorded: a recorded context is quoted
//! into the rebuilt request (and its hash) and no source is ever resolved
//! again for a recorded step.
//!
//! A changed agent (its digest differs from the recorded one) is refused
//! unless the caller accepts the change, and so is a run whose MCP servers
//! now offer other tools than `run_started` records (another pinned list,
//! or other tools of it); an accepted change still has to
//! make the same tool decisions, but its model requests may differ.
//!
//! A fork (see `runtime/fork.rs`) is replayed against the agent its latest
//! `run_forked` names. Its inherited events are checked strictly when that
//! agent decided them too; when the fork changed the agent, they are facts
//! (pinned by the source's chain hash in `run_forked`), like completions.

use super::decide::{Action, Park, RequestDetail, decide_with, input_gate};
use super::events::{Event, EventKind, McpToolsOffered, WithdrawReason};
use super::ids::AgentDigest;
use super::prompt::PromptCache;
use super::state::next_delivery;
use super::state::{FoldError, RunState, fold};
use super::view::AgentView;

/// How strict a replay is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Replay even though the agent's definition changed since the run
    /// started; model request hashes are then not compared. Default: false.
    pub accept_agent_change: bool,
}

/// A log the current agent cannot continue.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The log itself is impossible.
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// The agent's definition changed since the run started.
    #[error(
        "agent `{agent}` changed since the run started (digest {recorded}, now {current}): accept the change explicitly to continue (ReplayOptions::accept_agent_change; --accept-agent-change on the command line)"
    )]
    AgentChanged {
        /// The agent.
        agent: String,
        /// The digest recorded when the run started.
        recorded: AgentDigest,
        /// The current digest.
        current: AgentDigest,
    },
    /// At `position`, the engine would now do something other than what
    /// the log records.
    #[error(
        "replay divergence at position {position} ({kind}): the log records {recorded}, the agent now decides {expected}"
    )]
    Divergence {
        /// The position, from 0.
        position: usize,
        /// The recorded event's kind.
        kind: EventKind,
        /// What the engine decides now.
        expected: String,
        /// What the log records.
        recorded: String,
    },
}

/// Folds `events`, checking every recorded decision against what `view`
/// decides now. Returns the state at the end of the log.
pub fn replay(
    events: &[Event],
    view: &AgentView,
    options: ReplayOptions,
) -> Result<RunState, ReplayError> {
    let (first, rest) = events.split_first().ok_or(FoldError::Empty)?;
    let mut state = fold(std::slice::from_ref(first))?;
    // A fork goes on with the agent its latest `run_forked` names; what it
    // inherited before that was decided by the source's agent.
    let last_fork = events
        .iter()
        .rposition(|e| matches!(e, Event::RunForked(_)));
    let recorded = match last_fork.map(|i| &events[i]) {
        Some(Event::RunForked(f)) => f.agent_digest.clone(),
        _ => state.agent_digest.clone(),
    };
    if recorded != view.digest && !options.accept_agent_change {
        return Err(ReplayError::AgentChanged {
            agent: view.name.clone(),
            recorded,
            current: view.digest.clone(),
        });
    }
    // Which pinned MCP tool lists the run was offered is a recorded
    // decision like its agent's digest: tools changed and accepted since
    // would show the model other descriptions. A log from before it was
    // recorded (none recorded) is not held to it.
    if let Event::RunStarted(started) = first
        && !started.mcp_tools.is_empty()
        && started.mcp_tools != view.mcp_tools
        && !options.accept_agent_change
    {
        let describe = |tools: &std::collections::BTreeMap<String, McpToolsOffered>| {
            tools
                .iter()
                .map(|(key, t)| format!("`{key}`: {} ({})", t.pins, t.offered.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        };
        return Err(ReplayError::Divergence {
            position: 0,
            kind: first.kind(),
            expected: format!("MCP tools {}", describe(&view.mcp_tools)),
            recorded: format!("MCP tools {}", describe(&started.mcp_tools)),
        });
    }
    // The request's messages are hashed as the conversation grows; a new
    // summary (compaction) starts the hash over from the input, the summary
    // and the messages after its cut.
    let mut prompt = PromptCache::hashing_only();
    for (i, event) in rest.iter().enumerate() {
        // An inherited event (before the latest fork) is checked only when
        // the agent that decided it is this one: a fork's changed agent
        // would decide otherwise, and the source's own replay checked it.
        let inherited = last_fork.is_some_and(|f| i + 1 < f);
        if inherited && state.agent_digest != view.digest {
            state.apply(event)?;
            continue;
        }
        let options = if inherited {
            ReplayOptions::default()
        } else {
            options
        };
        if let Event::DeliveryIntent(recorded) = event
            && !options.accept_agent_change
        {
            let owed = next_delivery(
                &events[..state.event_count],
                &state,
                &view.name,
                &view.channels,
            );
            if !owed
                .as_ref()
                .is_some_and(|d| !d.recorded && d.intent == *recorded)
            {
                return Err(ReplayError::Divergence {
                    position: state.event_count,
                    kind: event.kind(),
                    expected: owed.map_or("no delivery".into(), |d| {
                        format!("delivery `{}`", d.intent.delivery_id)
                    }),
                    recorded: format!("delivery `{}`", recorded.delivery_id),
                });
            }
        }
        if is_decision(event) {
            let mut action = decide_with(&state, view, RequestDetail::Frame);
            let mut input_refused = None;
            if let Action::CallModel(call) = &mut action {
                (call.request_hash, call.request_size) = prompt.hash(&state, &call.request);
                // The input check `decide` leaves to whoever knows the
                // request's size.
                if !call.recorded
                    && let Some(park) = input_gate(&state, view, call.request_size)
                {
                    input_refused = Some(park);
                }
            }
            if let Some(park) = input_refused {
                action = park;
            }
            if !agrees(&action, event, options) {
                return Err(ReplayError::Divergence {
                    position: state.event_count,
                    kind: event.kind(),
                    expected: describe_action(&action),
                    recorded: describe_event(event),
                });
            }
        }
        state.apply(event)?;
    }
    Ok(state)
}

fn is_decision(event: &Event) -> bool {
    matches!(
        event,
        Event::ModelCallIntent(_)
            | Event::ToolCallIntent(_)
            | Event::ToolCallDeduplicated(_)
            | Event::ToolCallRejected(_)
            | Event::ApprovalRequested(_)
            | Event::Suspended(_)
            | Event::ExternalCallRequested(_)
            | Event::BudgetExceeded(_)
            | Event::WaitStarted(_)
            | Event::ClockObserved(_)
            | Event::OutputRejected(_)
            | Event::ContextResolved(_)
            | Event::ContextFailed(_)
            | Event::CompactionIntent(_)
            | Event::PolicyDecided(_)
            | Event::ChildStarted(_)
    ) || matches!(event, Event::RunCompleted(c) if !c.by_host)
        // A mismatched digest is the log's own business; a lapsed rule is
        // the store's, a fact replay reads back.
        || matches!(event, Event::ApprovalWithdrawn(w) if w.reason == WithdrawReason::DigestMismatch)
}

fn agrees(action: &Action, event: &Event, options: ReplayOptions) -> bool {
    match (action, event) {
        (Action::CallModel(call), Event::ModelCallIntent(intent)) => {
            !call.recorded
                && call.step == intent.step
                && call.attempt == intent.attempt
                && (options.accept_agent_change || call.request_hash == intent.request_hash)
        }
        (Action::CallTool(call), Event::ToolCallIntent(intent)) => {
            !call.recorded && call.intent == *intent
        }
        // Replay does not consult commitments: the recorded deduplication
        // stands if the agent would make the same keyed call now.
        (Action::CallTool(call), Event::ToolCallDeduplicated(d)) => {
            !call.recorded
                && call.intent.call_id == d.call_id
                && call.intent.idempotency_key == d.idempotency_key
        }
        (Action::RejectToolCall(a), Event::ToolCallRejected(b)) => a == b,
        (Action::WithdrawApproval(a), Event::ApprovalWithdrawn(b)) => {
            a.call_id == b.call_id && a.approved == b.approved && a.call == b.call
        }
        (Action::RequestApproval(a), Event::ApprovalRequested(b)) => {
            a.call_id == b.call_id && a.tool == b.tool
        }
        (Action::Park(Park::Suspend(a)), Event::Suspended(b)) => a == b,
        (Action::Park(Park::External(a)), Event::ExternalCallRequested(b)) => a == b,
        (Action::Park(Park::BudgetExceeded(a)), Event::BudgetExceeded(b)) => a == b,
        (Action::Park(Park::Wait(a)), Event::WaitStarted(b)) => a == b,
        (Action::ObserveClock, Event::ClockObserved(_)) => true,
        (Action::Compact(call), Event::CompactionIntent(intent)) => {
            !call.recorded
                && call.step == intent.step
                && call.upto == intent.upto as usize
                && (options.accept_agent_change || call.request_hash == intent.request_hash)
        }
        // Which source was resolved for which step is checked; what it
        // returned is a fact, read back and never resolved again.
        (Action::ResolveContext(r), Event::ContextResolved(e)) => {
            r.source == e.source && r.step == e.step
        }
        (Action::ResolveContext(r), Event::ContextFailed(e)) => {
            r.source == e.source && r.step == e.step
        }
        // An accepted agent change may have changed its sources, like its
        // prompts: the recorded resolutions stand.
        (_, Event::ContextResolved(_) | Event::ContextFailed(_)) => options.accept_agent_change,
        (Action::Finish(a), Event::RunCompleted(b)) => a == b,
        // Which child, for which call, with what input and budgets; how it
        // ended (`child_finished`) is a fact.
        (Action::StartChild(a), Event::ChildStarted(b)) => a == b,
        (Action::RejectOutput(a), Event::OutputRejected(b)) => a == b,
        // The decision itself is a recorded fact: replay never asks again;
        // that this policy was due at this point is the decision checked.
        (Action::ConsultPolicy(a), Event::PolicyDecided(b)) => {
            a.policy == b.policy && b.point().as_ref() == Some(&a.point)
        }
        _ => false,
    }
}

fn describe_action(action: &Action) -> String {
    match action {
        Action::CallModel(c) => format!(
            "a model call (step {}, attempt {}, request {})",
            c.step, c.attempt, c.request_hash
        ),
        Action::CallTool(t) => format!(
            "tool call `{}` to {} ({}) with {}",
            t.intent.call_id, t.intent.tool, t.intent.effect, t.intent.arguments
        ),
        Action::RequestApproval(a) => {
            format!("an approval request for `{}` to {}", a.call_id, a.tool)
        }
        Action::RejectToolCall(r) => format!("rejecting `{}`: {}", r.call_id, r.error),
        Action::WithdrawApproval(w) => format!(
            "withdrawing the approval of `{}` ({})",
            w.call_id,
            w.reason.as_str()
        ),
        Action::RejectOutput(r) => format!(
            "sending the final answer of step {} back: {}",
            r.step, r.violation
        ),
        Action::ObserveClock => "a clock reading".into(),
        Action::Compact(c) => format!(
            "a compaction (step {}, messages up to {}, request {})",
            c.step, c.upto, c.request_hash
        ),
        Action::ResolveContext(r) => {
            format!(
                "resolving context source `{}` for step {}",
                r.source, r.step
            )
        }
        Action::ConsultPolicy(c) => format!("asking policy `{}` at {:?}", c.policy, c.point),
        Action::Finish(c) => format!("finishing with {}", c.output),
        Action::Park(Park::BudgetExceeded(o)) => format!("parking: {o}"),
        Action::Park(Park::Suspend(s)) => format!("suspending at `{}`", s.call_id),
        Action::Park(Park::External(r)) => {
            format!("waiting for external tool `{}` at `{}`", r.tool, r.call_id)
        }
        Action::Park(Park::Wait(w)) => format!("waiting until {} (step {})", w.until_ms, w.step),
        Action::Fail(e) => format!("failing: {e}"),
        Action::StartChild(c) => format!(
            "starting child run `{}` of agent `{}` for `{}` with budgets {:?}",
            c.child_run, c.agent, c.call_id, c.budgets
        ),
        Action::DriveChild(c) => format!("driving child run `{}` of `{}`", c.child_run, c.call_id),
        Action::Idle(idle) => format!("nothing ({idle:?})"),
    }
}

fn describe_event(event: &Event) -> String {
    match event {
        Event::ModelCallIntent(i) => format!(
            "a model call (step {}, attempt {}, request {})",
            i.step, i.attempt, i.request_hash
        ),
        Event::ToolCallIntent(i) => format!(
            "tool call `{}` to {} ({}) with {}",
            i.call_id, i.tool, i.effect, i.arguments
        ),
        Event::ApprovalRequested(a) => {
            format!("an approval request for `{}` to {}", a.call_id, a.tool)
        }
        Event::ToolCallRejected(r) => format!("rejecting `{}`: {}", r.call_id, r.error),
        Event::ApprovalWithdrawn(w) => format!(
            "withdrawing the approval of `{}` ({})",
            w.call_id,
            w.reason.as_str()
        ),
        Event::ClockObserved(_) => "a clock reading".into(),
        Event::CompactionIntent(i) => format!(
            "a compaction (step {}, messages up to {}, request {})",
            i.step, i.upto, i.request_hash
        ),
        Event::ContextResolved(c) => {
            format!(
                "resolving context source `{}` for step {}",
                c.source, c.step
            )
        }
        Event::ContextFailed(c) => {
            format!(
                "resolving context source `{}` for step {}",
                c.source, c.step
            )
        }
        Event::PolicyDecided(d) => format!("asking policy `{}` at {:?}", d.policy, d.point()),
        Event::RunCompleted(c) => format!("finishing with {}", c.output),
        Event::OutputRejected(r) => format!(
            "sending the final answer of step {} back: {}",
            r.step, r.violation
        ),
        Event::BudgetExceeded(o) => format!("parking: {o}"),
        Event::Suspended(s) => format!("suspending at `{}`", s.call_id),
        Event::WaitStarted(w) => format!("waiting until {} (step {})", w.until_ms, w.step),
        Event::ChildStarted(c) => format!(
            "starting child run `{}` of agent `{}` for `{}` with budgets {:?}",
            c.child_run, c.agent, c.call_id, c.budgets
        ),
        other => other.kind().to_string(),
    }
}
