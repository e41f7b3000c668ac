//! The run tree `warden runs show` prints: a run's parent (from its
//! `run_started`) and its child runs (from its `child_started` events),
//! each child's own children below it, with each run's status as its
//! store lists it.

use std::future::Future;
use std::pin::Pin;

use serde_json::{Value, json};
use warden::engine::events::Event;
use warden::engine::events::ParentLink;
use warden::engine::{CallId, RunId, decode};
use warden::store::EventStore;

/// How deep the tree is followed: [`warden::engine::agent::child_agents::MAX_AGENT_DEPTH`]
/// levels below a root, and one more to show a log that claims more.
const MAX_DEPTH: usize = warden::engine::agent::child_agents::MAX_AGENT_DEPTH + 1;

/// A child run, with its own children.
pub(crate) struct Child {
    call_id: CallId,
    run_id: RunId,
    agent: String,
    /// Its listed status; `None` when the store no longer has the run.
    status: Option<String>,
    children: Vec<Child>,
}

/// The run's parent, if it is a child run.
pub(crate) fn parent(events: &[Event]) -> Option<&ParentLink> {
    match events.first() {
        Some(Event::RunStarted(s)) => s.parent.as_ref(),
        _ => None,
    }
}

/// The run's children, in the order they were started, each with its
/// own.
pub(crate) fn children<'a>(
    store: &'a dyn EventStore,
    events: &'a [Event],
    depth: usize,
) -> Pin<Box<dyn Future<Output = Vec<Child>> + Send + 'a>> {
    Box::pin(async move {
        let mut out = Vec::new();
        for event in events {
            let Event::ChildStarted(c) = event else {
                continue;
            };
            let status = store.summary(&c.child_run).await.ok().map(|s| s.status);
            let mut below = Vec::new();
            if depth < MAX_DEPTH
                && let Ok(stored) = store.load(&c.child_run).await
            {
                let child_events: Vec<Event> = stored
                    .iter()
                    .filter_map(|s| decode(&s.bytes).ok())
                    .collect();
                below = children(store, &child_events, depth + 1).await;
            }
            out.push(Child {
                call_id: c.call_id.clone(),
                run_id: c.child_run.clone(),
                agent: c.agent.clone(),
                status,
                children: below,
            });
        }
        out
    })
}

/// The children as the JSON `runs show --json` carries.
pub(crate) fn json(children: &[Child]) -> Value {
    Value::Array(
        children
            .iter()
            .map(|c| {
                json!({
                    "call_id": c.call_id,
                    "run_id": c.run_id,
                    "agent": c.agent,
                    "status": c.status,
                    "children": json(&c.children),
                })
            })
            .collect(),
    )
}

/// The children as indented lines, `  ↳ call-1-1 → run … (agent) status`.
pub(crate) fn lines(children: &[Child], depth: usize, out: &mut Vec<String>) {
    for c in children {
        out.push(format!(
            "{}↳ {} → run {} (agent {}) {}",
            "  ".repeat(depth + 1),
            c.call_id,
            c.run_id,
            c.agent,
            c.status.as_deref().unwrap_or("gone from the store")
        ));
        lines(&c.children, depth + 1, out);
    }
}
