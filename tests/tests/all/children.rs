//! Agents as tools, as child runs, on every store (in memory, SQLite,
//! PostgreSQL): a planner calling a worker agent twice, each worker making
//! one write (counted by the hostile guest's counter outside the sandbox,
//! never by reading the log), killed at every event boundary of the
//! parent and both children, recovers to the same final logs with each
//! write made once; a child waiting for approval parks its parent, and
//! approving the child then driving the parent continues both; budgets
//! nest (a child gets at most what its parent has left, and what it uses
//! is charged to the parent); a fork never drives its source's child.

use std::sync::Arc;

use serde_json::json;
use warden::engine::events::{Event, ToolCallResult};
use warden::engine::{
    Agent, BudgetKind, BudgetLimits, ChildRefusal, ForkOptions, ReplayOptions, RunId, RunStatus,
    RuntimeError, StartOptions,
};
use warden::store::{EventStore, MemoryStore, RunFilter, SqliteStore};

use super::engine::{Fixture, id, runtime};
use super::sweep::{Crashed, Sweep};
use super::workers::PgSchema;

/// The worker's turns: one write (an appended line), then a typed result.
const WORKER_TURNS: &str = r#"
[[turns]]
text = "Working."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "effect\n" }

[[turns]]
text = '{"done": true}'
"#;

/// The planner's turns: two calls to the worker at once, then the end.
const PLANNER_TURNS: &str = r#"
[[turns]]
text = "Delegating."
[[turns.tool_calls]]
name = "worker"
arguments = { task = "first" }
[[turns.tool_calls]]
name = "worker"
arguments = { task = "second" }

[[turns]]
text = "All done."
"#;

/// Writes the worker (its write approved by nobody unless `approval`) and
/// the planner calling it (with `budgets` and the call's `budget`);
/// returns the planner.
fn planner(fx: &Fixture, approval: bool, budgets: &str, budget: &str) -> Agent {
    std::fs::write(fx.path("worker.transcript.toml"), WORKER_TURNS).unwrap();
    std::fs::write(fx.path("planner.transcript.toml"), PLANNER_TURNS).unwrap();
    let rule = if approval {
        ""
    } else {
        "approval = { fs = \"never\" }\n"
    };
    std::fs::write(
        fx.path("worker.toml"),
        format!(
            r#"
name = "worker"
instructions = "Do the task."
output_schema = '{{"type": "object", "required": ["done"]}}'

[model]
provider = "scripted"
name = "script"
transcript = "worker.transcript.toml"

[plugins.hostile]
source = "hostile.toml"
{rule}[plugins.hostile.grant.mounts.workspace]
dir = "work"
"#
        ),
    )
    .unwrap();
    std::fs::write(
        fx.path("planner.toml"),
        format!(
            r#"
name = "planner"
instructions = "Plan, then hand the parts to workers."

[model]
provider = "scripted"
name = "script"
transcript = "planner.transcript.toml"

[agents.worker]
agent = "worker.toml"
description = "Does one part of the plan"
{budget}

[budgets]
{budgets}
"#
        ),
    )
    .unwrap();
    Agent::load(&fx.path("planner.toml"), None).unwrap()
}

fn child(parent: &RunId, n: usize) -> RunId {
    id(&format!("{parent}.call-1-{n}"))
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

/// A planner with two workers runs to the end: the logs link parent and
/// children both ways, the parent's results are the children's typed
/// outputs, each write ran once and the children's use is charged.
async fn two_children_complete(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let agent = planner(&fx, false, "", "");
    let rt = runtime(store.clone());
    let run = rt
        .start(&agent, json!("plan"), StartOptions::new().id(id("plan")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 2, "each child wrote once");
    let events = rt.events(&run).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "model_call_intent",
            "model_call_completed",
            "child_started",
            "child_finished",
            "child_started",
            "child_finished",
            "model_call_intent",
            "model_call_completed",
            "run_completed",
        ]
    );
    for n in [1, 2] {
        let started = events
            .iter()
            .find_map(|e| match e {
                Event::ChildStarted(c) if c.child_run == child(&run, n) => Some(c),
                _ => None,
            })
            .unwrap();
        assert_eq!(started.agent, "worker");
        assert_eq!(
            started.input,
            json!({ "task": if n == 1 { "first" } else { "second" } })
        );
        let finished = events
            .iter()
            .find_map(|e| match e {
                Event::ChildFinished(c) if c.child_run == child(&run, n) => Some(c),
                _ => None,
            })
            .unwrap();
        assert_eq!(finished.status, RunStatus::Completed);
        assert_eq!(
            finished.result,
            ToolCallResult::Output(json!({"done": true}))
        );
        assert_eq!(finished.usage.steps, 2);
        assert_eq!(finished.usage.tool_calls, 1);
        let child_events = rt.events(&child(&run, n)).await.unwrap();
        match &child_events[0] {
            Event::RunStarted(s) => {
                let parent = s.parent.as_ref().expect("a child names its parent");
                assert_eq!(parent.run_id, run);
                assert_eq!(parent.call_id.as_str(), format!("call-1-{n}"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            rt.state(&child(&run, n)).await.unwrap().output(),
            Some(&json!({"done": true}))
        );
    }
    let state = rt.state(&run).await.unwrap();
    // Its own two steps and two calls, and each child's two steps and one
    // tool call.
    assert_eq!(state.usage.steps, 2 + 2 * 2);
    assert_eq!(state.usage.tool_calls, 2 + 2);
    // The parent's log replays against its agent; so do the children's.
    rt.recover(&run, &agent, ReplayOptions::default())
        .await
        .unwrap();
    assert_eq!(fx.effects(), 2, "replay wrote nothing");
}

#[tokio::test]
async fn a_planner_with_two_workers_completes_on_memory_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    two_children_complete(Arc::new(MemoryStore::new())).await;
    two_children_complete(Arc::new(
        SqliteStore::open(dir.path().join("runs.db")).unwrap(),
    ))
    .await;
}

#[tokio::test]
async fn a_planner_with_two_workers_completes_on_postgres() {
    let Some(pg) = PgSchema::new("children_done").await else {
        return;
    };
    two_children_complete(Arc::new(pg.store().await)).await;
}

/// Crashes at every append of the parent and both children, at both crash
/// points, then recovers the parent in a new runtime: the same final logs
/// as a run never interrupted, each write made once; a crash at a child's
/// write boundary leaves the child needing a human and the parent waiting
/// for it, and resolving the child then recovering the parent finishes
/// both without writing again.
async fn a_crash_at_every_boundary(kind: &str) {
    let fx = Fixture::new();
    let agent = planner(&fx, false, "", "");
    let run = id("plan");
    let sweep = Sweep {
        fx: &fx,
        agent: &agent,
        runs: vec![run.clone(), child(&run, 1), child(&run, 2)],
        input: json!("plan"),
        store: kind,
        name: "children_crash",
    };
    let (_, control) = sweep.uninterrupted().await;
    let appends: u64 = control.iter().map(|l| l.len() as u64 - 1).sum();
    assert_eq!(appends, 9 + 2 * 7, "the parent's appends and each child's");

    let mut reconciled = 0;
    let visited = sweep
        .crash_at_every_boundary(async |Crashed { case, store, rt }| {
            // A new process: recover the parent, which drives its children.
            let status = rt
                .recover(&run, &agent, ReplayOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            if status == RunStatus::Completed {
                assert_eq!(sweep.logs(&store).await, control, "{case}");
                assert_eq!(fx.effects(), 2, "{case}: each write ran exactly once");
                return;
            }
            // A child's write has no recorded outcome: the child needs a
            // human, and the parent waits for the child.
            assert_eq!(status, RunStatus::AwaitingChild, "{case}");
            reconciled += 1;
            let ran = fx.effects();
            let waiting = rt.state(&run).await.unwrap();
            let (_, child_run) = waiting.child_in_flight().expect("a child in flight");
            let child_run = child_run.clone();
            let first = child_run == child(&run, 1);
            // The first child's write at most; or the first's and, at most,
            // the second's.
            assert!(ran <= if first { 1 } else { 2 }, "{case}: {ran} writes");
            assert_eq!(
                rt.state(&child_run).await.unwrap().status(),
                RunStatus::NeedsReconciliation,
                "{case}"
            );
            // The parent's drive refuses nothing and writes nothing more.
            assert_eq!(
                rt.drive(&run, &agent).await.unwrap(),
                RunStatus::AwaitingChild,
                "{case}"
            );
            let before = rt.events(&run).await.unwrap().len();
            assert_eq!(
                rt.drive(&run, &agent).await.unwrap(),
                RunStatus::AwaitingChild
            );
            assert_eq!(rt.events(&run).await.unwrap().len(), before, "{case}");
            // A human checks the counter and records what happened.
            rt.resolve(&child_run, json!({ "appended": 7 }), "tester", None)
                .await
                .unwrap();
            assert_eq!(
                rt.recover(&run, &agent, ReplayOptions::default())
                    .await
                    .unwrap(),
                RunStatus::Completed,
                "{case}"
            );
            // Only the second child, if it had not started, wrote since.
            assert_eq!(
                fx.effects(),
                ran + usize::from(first),
                "{case}: no write ran again"
            );
        })
        .await;
    // Every append of the parent and both children, at both points.
    assert_eq!(visited, 2 * 16, "{kind}");
    // Each child's write intent and completion boundaries, at the points
    // where the write's outcome is unknown: two per child.
    assert_eq!(reconciled, 4, "{kind}");
}

#[tokio::test]
async fn a_crash_at_every_boundary_of_parent_and_children_recovers_on_memory_and_sqlite() {
    a_crash_at_every_boundary("memory").await;
    a_crash_at_every_boundary("sqlite").await;
}

#[tokio::test]
async fn a_crash_at_every_boundary_of_parent_and_children_recovers_on_postgres() {
    if PgSchema::new("children_probe").await.is_none() {
        return;
    }
    a_crash_at_every_boundary("postgres").await;
}

/// A child waiting for approval parks its parent at the call; the child's
/// approval is listed with every other run's; approving it and driving the
/// parent continues both, and the write runs once per child.
async fn a_child_parks_its_parent(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let agent = planner(&fx, true, "", "");
    let rt = runtime(store.clone());
    let run = rt
        .start(&agent, json!("plan"), StartOptions::new().id(id("plan")))
        .await
        .unwrap();
    for n in [1, 2] {
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingChild
        );
        let state = rt.state(&run).await.unwrap();
        assert_eq!(state.status(), RunStatus::AwaitingChild);
        let waiting = store
            .list(&RunFilter::new().status("awaiting_approval"))
            .await
            .unwrap();
        assert_eq!(
            waiting.iter().map(|s| s.run_id.clone()).collect::<Vec<_>>(),
            [child(&run, n)],
            "the child's approval is in the same list"
        );
        let parents = store
            .list(&RunFilter::new().status("awaiting_child"))
            .await
            .unwrap();
        assert_eq!(parents.len(), 1);
        assert_eq!(parents[0].run_id, run);
        // Driving the parent again records nothing new.
        let before = rt.events(&run).await.unwrap().len();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingChild
        );
        assert_eq!(rt.events(&run).await.unwrap().len(), before);
        let child_state = rt.state(&child(&run, n)).await.unwrap();
        let call = match child_state.parked() {
            Some(warden::engine::state::Parked::Approval { call }) => call.call_id.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(fx.effects(), n - 1, "nothing written before approval");
        rt.approve(&child(&run, n), &call, "alice").await.unwrap();
    }
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 2);
    let events = rt.events(&run).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(
                |e| matches!(e, Event::ChildParked(p) if p.status == RunStatus::AwaitingApproval)
            )
            .count(),
        2
    );
    rt.recover(&run, &agent, ReplayOptions::default())
        .await
        .unwrap();
    assert_eq!(fx.effects(), 2);
}

#[tokio::test]
async fn a_child_waiting_for_approval_parks_its_parent_on_memory_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_child_parks_its_parent(Arc::new(MemoryStore::new())).await;
    a_child_parks_its_parent(Arc::new(
        SqliteStore::open(dir.path().join("runs.db")).unwrap(),
    ))
    .await;
}

#[tokio::test]
async fn a_child_waiting_for_approval_parks_its_parent_on_postgres() {
    let Some(pg) = PgSchema::new("children_park").await else {
        return;
    };
    a_child_parks_its_parent(Arc::new(pg.store().await)).await;
}

/// A child asks more than its parent has left: it is granted what is left,
/// the cap is recorded, and its own log enforces it; with nothing left, no
/// child starts and the parent parks over budget.
#[tokio::test]
async fn a_childs_budget_is_capped_by_what_its_parent_has_left() {
    for (name, store) in super::engine::stores(tempfile::tempdir().unwrap().path()) {
        let fx = Fixture::new();
        // One step used by the planner's first call: 4 left of 5, and
        // the worker asks for 10.
        let agent = planner(&fx, false, "max_steps = 5", "budget = { max_steps = 10 }");
        let rt = runtime(store.clone());
        let run = rt
            .start(&agent, json!("plan"), StartOptions::new().id(id("capped")))
            .await
            .unwrap();
        let status = rt.drive(&run, &agent).await.unwrap();
        let events = rt.events(&run).await.unwrap();
        let started: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::ChildStarted(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(started[0].budgets.steps, Some(4), "{name}");
        assert_eq!(started[0].capped, [BudgetKind::Steps], "{name}");
        match &rt.events(&child(&run, 1)).await.unwrap()[0] {
            Event::RunStarted(s) => {
                assert_eq!(s.limits.as_ref().unwrap().budgets.steps, Some(4), "{name}")
            }
            other => panic!("{other:?}"),
        }
        // The first child used 2 steps: 2 left for the second.
        assert_eq!(started[1].budgets.steps, Some(2), "{name}");
        // The planner itself then has nothing left for its last step.
        assert_eq!(status, RunStatus::BudgetExceeded, "{name}");
        assert_eq!(rt.state(&run).await.unwrap().usage.steps, 5, "{name}");

        // A parent with no step left starts no child.
        let fx = Fixture::new();
        let agent = planner(&fx, false, "max_steps = 1", "");
        let rt = runtime(store.clone());
        let run = rt
            .start(&agent, json!("plan"), StartOptions::new().id(id("spent")))
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::BudgetExceeded,
            "{name}"
        );
        let state = rt.state(&run).await.unwrap();
        match state.parked() {
            Some(warden::engine::state::Parked::Budget(o)) => {
                assert_eq!(o.budget, BudgetKind::Steps, "{name}")
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(
            matches!(
                rt.events(&child(&run, 1)).await,
                Err(RuntimeError::UnknownRun { .. })
            ),
            "{name}: no child was created"
        );
        assert_eq!(fx.effects(), 0, "{name}");
    }
}

/// An agent that calls itself, directly or through another, is refused
/// when it is loaded.
#[test]
fn an_agent_calling_itself_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, calls: &str| {
        std::fs::write(
            dir.path().join(format!("{name}.toml")),
            format!(
                "name = \"{name}\"\ninstructions = \"x\"\n[model]\nprovider = \"scripted\"\nname = \"s\"\ntranscript = \"t.toml\"\n[agents.next]\nagent = \"{calls}.toml\"\ndescription = \"d\"\n"
            ),
        )
        .unwrap();
    };
    write("a", "b");
    write("b", "a");
    let err = Agent::load(&dir.path().join("a.toml"), None).unwrap_err();
    assert!(err.to_string().contains("calls itself"), "{err}");
    assert!(err.to_string().contains("agents.next.agent"), "{err}");
}

/// A fork that inherits a child in flight does not drive its source's
/// child: every drive of the fork is refused, typed, naming the child's
/// parent, and writes nothing; the source goes on as before.
#[tokio::test]
async fn a_fork_never_drives_the_child_its_source_started() {
    let fx = Fixture::new();
    let agent = planner(&fx, true, "", "");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone());
    let run = rt
        .start(&agent, json!("plan"), StartOptions::new().id(id("plan")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingChild
    );
    let at = rt.events(&run).await.unwrap().len() as u64;
    let fork = rt
        .fork(
            &run,
            at,
            ForkOptions {
                agent: &agent,
                source_agent: Some(&agent),
                budgets: BudgetLimits::default(),
                run_id: Some(id("plan-fork")),
                by: "ops".into(),
            },
        )
        .await
        .unwrap();
    let before = rt.events(&child(&run, 1)).await.unwrap();
    match rt.drive(&fork, &agent).await {
        Err(RuntimeError::ChildRefused { run_id, reason }) => {
            assert_eq!(run_id, fork);
            assert_eq!(
                reason,
                ChildRefusal::NotThisCall {
                    child_run: child(&run, 1),
                    parent: Some(run.clone()),
                }
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rt.events(&child(&run, 1)).await.unwrap(), before);
    // The source still drives its own child.
    let call = match rt.state(&child(&run, 1)).await.unwrap().parked() {
        Some(warden::engine::state::Parked::Approval { call }) => call.call_id.clone(),
        other => panic!("{other:?}"),
    };
    rt.approve(&child(&run, 1), &call, "alice").await.unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingChild
    );
    assert_eq!(fx.effects(), 1);
}

/// Cancelling a parent whose child waits for approval cancels the child
/// too: neither is left waiting for anyone, and nothing was written.
#[tokio::test]
async fn cancelling_a_parent_cancels_its_child() {
    let fx = Fixture::new();
    let agent = planner(&fx, true, "", "");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone());
    let run = rt
        .start(&agent, json!("plan"), StartOptions::new().id(id("plan")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingChild
    );
    rt.cancel(&run, Some("ops"), Some("not needed".into()))
        .await
        .unwrap();
    assert_eq!(rt.state(&run).await.unwrap().status(), RunStatus::Cancelled);
    assert_eq!(
        rt.state(&child(&run, 1)).await.unwrap().status(),
        RunStatus::Cancelled
    );
    let waiting = store
        .list(&RunFilter::new().status("awaiting_approval"))
        .await
        .unwrap();
    assert!(waiting.is_empty(), "{waiting:?}");
    assert_eq!(fx.effects(), 0);
}
