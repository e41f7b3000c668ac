//! Orchestrated runs (plan files, `engine/plan.rs`) on every store (in
//! memory, SQLite, PostgreSQL): the example plan (planner → workers as a
//! batch → reviewer) completes offline and its log replays; a plan whose
//! workers each make one write (counted by the hostile guest's counter
//! outside the sandbox), killed at every event boundary of the plan's run
//! and its children, recovers to the same final logs with each write once
//! and no second child; a stopping rule ends a repeated phase on a typed
//! result, and another phase ends at its maximum of rounds; a role waiting
//! for approval parks the plan's run, which resumes through it; bad plans
//! are refused with a typed error naming what is wrong.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use warden::engine::agent::plan::{Decision, EndReason, Next, PlanError};
use warden::engine::events::Event;
use warden::engine::{Agent, AgentError, ReplayOptions, RunId, RunStatus, Runtime, StartOptions};
use warden::providers::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderEvent, StopReason,
};
use warden::store::{EventStore, MemoryStore, RunFilter, SqliteStore};

use super::engine::{Fixture, id, normalized, runtime};
use super::sweep::{Crashed, Sweep};
use super::workers::PgSchema;

/// The decisions a plan's run recorded, in order.
fn decisions(events: &[Event]) -> Vec<Decision> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ModelCallCompleted(c) => c
                .blocks
                .iter()
                .find(|b| b.format == "plan")
                .map(|b| serde_json::from_value(b.block["decision"].clone()).unwrap()),
            _ => None,
        })
        .collect()
}

/// The child runs a plan's run started, in order.
fn children(events: &[Event]) -> Vec<(String, RunId)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ChildStarted(c) => Some((c.agent.clone(), c.child_run.clone())),
            _ => None,
        })
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The example plan, copied with the notes it reads into `dir`.
fn example(dir: &Path) -> Agent {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    copy_dir(&examples.join("plans"), &dir.join("plans"));
    copy_dir(&examples.join("agents/notes"), &dir.join("agents/notes"));
    Agent::load(&dir.join("plans/review.toml"), None).unwrap()
}

/// The example completes offline: the planner's parts fan out to three
/// workers in one step, the reviewer approves in its first round (the
/// stopping rule), the output is the reviewer's typed result, every
/// decision is in the log, and the log replays (and recovering it writes
/// nothing).
async fn the_example_completes(store: Arc<dyn EventStore>) {
    let dir = tempfile::tempdir().unwrap();
    let agent = example(dir.path());
    let rt = runtime(store.clone());
    let run = rt
        .start(
            &agent,
            json!("Plan the week from my notes"),
            StartOptions::new().id(id("review-1")),
        )
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    let state = rt.state(&run).await.unwrap();
    assert_eq!(
        state.output(),
        Some(&json!({"approved": true, "summary": "Three parts drafted and reviewed."}))
    );
    let review = dir.path().join("plans/out/review.md");
    assert!(
        std::fs::read_to_string(&review)
            .unwrap()
            .starts_with("# Review")
    );
    let events = rt.events(&run).await.unwrap();
    let started = children(&events);
    let agents: Vec<&str> = started.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        agents,
        ["planner", "worker", "worker", "worker", "reviewer"]
    );
    // The workers were one step: their calls are the same model turn's.
    let ids: Vec<&str> = started.iter().map(|(_, r)| r.as_str()).collect();
    assert_eq!(
        ids,
        [
            "review-1.call-1-1",
            "review-1.call-2-1",
            "review-1.call-2-2",
            "review-1.call-2-3",
            "review-1.call-3-1"
        ]
    );
    for (_, child) in &started {
        assert_eq!(
            rt.state(child).await.unwrap().status(),
            RunStatus::Completed
        );
    }
    let worker_input = events
        .iter()
        .find_map(|e| match e {
            Event::ChildStarted(c) if c.agent == "worker" => Some(c.input.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(worker_input, json!({"part": "water the plants"}));
    let d = decisions(&events);
    assert_eq!(d.len(), 4, "{d:?}");
    match &d[1].next {
        Next::Calls {
            phase,
            batch,
            max_concurrent,
            calls,
            ..
        } => {
            assert_eq!(phase, "work");
            assert!(*batch);
            assert_eq!(*max_concurrent, 2);
            assert_eq!(calls.len(), 3);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(d[3].next, Next::Finish(_)));
    assert_eq!(d[3].ended[0].phase, "review");
    assert_eq!(d[3].ended[0].reason, EndReason::Until);
    assert_eq!(d[3].ended[0].value, Some(json!(true)));
    // The log replays against the plan, decision by decision (recovering
    // a finished run checks every recorded decision and effect), and
    // nothing runs again.
    std::fs::remove_file(&review).unwrap();
    assert_eq!(
        rt.recover(&run, &agent, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::Completed
    );
    assert!(
        !review.exists(),
        "recovering a finished plan writes nothing"
    );
}

#[tokio::test]
async fn the_example_plan_completes_offline_and_replays_on_memory_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    the_example_completes(Arc::new(MemoryStore::new())).await;
    the_example_completes(Arc::new(
        SqliteStore::open(dir.path().join("runs.db")).unwrap(),
    ))
    .await;
}

#[tokio::test]
async fn the_example_plan_completes_offline_and_replays_on_postgres() {
    let Some(pg) = PgSchema::new("plans_example").await else {
        return;
    };
    the_example_completes(Arc::new(pg.store().await)).await;
}

/// A worker's turns: one write (appending its name to the side-effect
/// counter), then a typed result.
fn worker_turns(name: &str) -> String {
    format!(
        r#"
[[turns]]
text = "Working."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = {{ op = "append", path = "/workspace/effects.log", content = "{name}\n" }}

[[turns]]
text = '{{"done": true}}'
"#
    )
}

/// The writes worker `name` made, counted outside the sandbox.
fn writes(fx: &Fixture, name: &str) -> usize {
    std::fs::read_to_string(fx.path("work/effects.log"))
        .map(|s| s.lines().filter(|l| *l == name).count())
        .unwrap_or(0)
}

/// Writes three workers (`worker`, `left`, `right`: one write each,
/// approved by nobody unless `approval`), a checker (no tools; its answer
/// scripted) and `plan` into the fixture; returns the plan.
fn write_plan(fx: &Fixture, approval: bool, plan: &str) -> Agent {
    let rule = if approval {
        ""
    } else {
        "approval = { fs = \"never\" }\n"
    };
    for name in ["worker", "left", "right"] {
        std::fs::write(
            fx.path(&format!("{name}.transcript.toml")),
            worker_turns(name),
        )
        .unwrap();
        std::fs::write(
            fx.path(&format!("{name}.toml")),
            format!(
                r#"
name = "{name}"
instructions = "Do the part."
output_schema = '{{"type": "object", "required": ["done"]}}'

[model]
provider = "scripted"
name = "script"
transcript = "{name}.transcript.toml"

[plugins.hostile]
source = "hostile.toml"
{rule}[plugins.hostile.grant.mounts.workspace]
dir = "work"
"#
            ),
        )
        .unwrap();
    }
    std::fs::write(
        fx.path("checker.transcript.toml"),
        "[[turns]]\ntext = '{\"ok\": true, \"score\": 1}'\n",
    )
    .unwrap();
    std::fs::write(
        fx.path("checker.toml"),
        r#"
name = "checker"
instructions = "Check the work."
output_schema = '{"type": "object", "required": ["ok", "score"]}'

[model]
provider = "scripted"
name = "script"
transcript = "checker.transcript.toml"
"#,
    )
    .unwrap();
    std::fs::write(fx.path("plan.toml"), plan).unwrap();
    Agent::load(&fx.path("plan.toml"), None).unwrap()
}

/// Two workers, each its own role, as one batch step, then a checker.
const LEFT_RIGHT_THEN_CHECK: &str = r#"
name = "pair"
max_concurrent = 2

[roles.left]
agent = "left.toml"
[roles.right]
agent = "right.toml"
[roles.checker]
agent = "checker.toml"

[[phases]]
name = "work"
roles = ["left", "right"]
batch = true

[[phases]]
name = "check"
roles = ["checker"]
input = { left = "/left", right = "/right" }

[result]
role = "checker"
pointer = "/ok"
"#;

/// Two workers as a batch, over the input's parts, then a checker.
const BATCH_THEN_CHECK: &str = r#"
name = "batch"
max_concurrent = 2

[roles.worker]
agent = "worker.toml"
[roles.checker]
agent = "checker.toml"

[[phases]]
name = "work"
roles = ["worker"]
for_each = "/input/parts"
input = { part = "/item" }

[[phases]]
name = "check"
roles = ["checker"]
input = { results = "/worker" }

[result]
role = "checker"
pointer = "/ok"
"#;

/// The plan's run and its three children.
fn runs(plan: &RunId) -> Vec<RunId> {
    ["call-1-1", "call-1-2", "call-2-1"]
        .iter()
        .map(|c| id(&format!("{plan}.{c}")))
        .collect()
}

/// Crashes at every append of the plan's run and its children, at both
/// crash points, then recovers the plan's run in a new runtime: the same
/// final logs as a run never interrupted, each write made once and never a
/// second child (the store holds exactly the plan's run and its three);
/// a crash where a worker's write has no recorded outcome leaves that
/// worker needing a human and the plan waiting for it, and resolving the
/// worker then recovering the plan finishes all without writing again.
async fn a_crash_at_every_boundary(kind: &str) {
    let fx = Fixture::new();
    let agent = write_plan(&fx, false, LEFT_RIGHT_THEN_CHECK);
    let run = id("plan");
    let mut runs_swept = vec![run.clone()];
    runs_swept.extend(runs(&run));
    let sweep = Sweep {
        fx: &fx,
        agent: &agent,
        runs: runs_swept,
        input: json!("go"),
        store: kind,
        name: "plans_crash",
    };
    let (control_store, control) = sweep.uninterrupted().await;
    assert_eq!(
        runtime(control_store).state(&run).await.unwrap().output(),
        Some(&json!(true))
    );
    let appends: u64 = control.iter().map(|l| l.len() as u64 - 1).sum();
    // The plan: three decisions (intent, completion), two children in the
    // first step and one in the second (started, finished), the end; each
    // worker: 7; the checker: 3.
    assert_eq!(appends, 13 + 2 * 7 + 3);

    let mut reconciled = 0;
    let visited = sweep
        .crash_at_every_boundary(async |Crashed { case, store, rt }| {
            let status = rt
                .recover(&run, &agent, ReplayOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            if status == RunStatus::Completed {
                assert_eq!(sweep.logs(&store).await, control, "{case}");
                for name in ["left", "right"] {
                    assert_eq!(writes(&fx, name), 1, "{case}: {name} wrote once");
                }
            } else {
                // A worker's write has no recorded outcome: it needs a
                // human, and the plan waits for it (for each such worker:
                // with a batch in flight, both may).
                let mut status = status;
                let mut resolved = Vec::new();
                let ran = [writes(&fx, "left"), writes(&fx, "right")];
                while status == RunStatus::AwaitingChild {
                    reconciled += 1;
                    let waiting = rt.state(&run).await.unwrap();
                    let (_, child_run) = waiting.child_in_flight().expect("a child in flight");
                    let child_run = child_run.clone();
                    resolved.push(child_run.clone());
                    assert_eq!(
                        rt.state(&child_run).await.unwrap().status(),
                        RunStatus::NeedsReconciliation,
                        "{case}"
                    );
                    // Driving the plan records nothing while it waits.
                    let before = rt.events(&run).await.unwrap().len();
                    assert_eq!(
                        rt.drive(&run, &agent).await.unwrap(),
                        RunStatus::AwaitingChild,
                        "{case}"
                    );
                    assert_eq!(rt.events(&run).await.unwrap().len(), before, "{case}");
                    // A human checks the counter and records what happened.
                    rt.resolve(&child_run, json!({ "appended": 7 }), "tester", None)
                        .await
                        .unwrap();
                    status = rt
                        .recover(&run, &agent, ReplayOptions::default())
                        .await
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                }
                assert_eq!(status, RunStatus::Completed, "{case}");
                // No write ran again: a resolved worker wrote nothing after
                // the crash; the others wrote exactly once.
                for (n, name) in ["left", "right"].into_iter().enumerate() {
                    let child = &runs(&run)[n];
                    if resolved.contains(child) {
                        assert_eq!(writes(&fx, name), ran[n], "{case}: {name}");
                        assert!(ran[n] <= 1, "{case}: {name}");
                    } else {
                        assert_eq!(writes(&fx, name), 1, "{case}: {name} wrote once");
                    }
                }
            }
            // Never a second child: the plan's run and its three, no more.
            let listed = store.list(&RunFilter::new()).await.unwrap();
            assert_eq!(listed.len(), 4, "{case}: {listed:?}");
        })
        .await;
    // Every append of the plan's run and its three children, at both points.
    assert_eq!(visited, 2 * 22, "{kind}");
    // Each worker's write intent and completion boundaries, where the
    // write's outcome is unknown: two per worker at least (more when a
    // crash finds both in flight).
    assert!(reconciled >= 4, "{kind}: {reconciled}");
}

#[tokio::test]
async fn a_crash_at_every_boundary_of_a_plan_and_its_children_recovers_on_memory_and_sqlite() {
    a_crash_at_every_boundary("memory").await;
    a_crash_at_every_boundary("sqlite").await;
}

#[tokio::test]
async fn a_crash_at_every_boundary_of_a_plan_and_its_children_recovers_on_postgres() {
    if PgSchema::new("plans_probe").await.is_none() {
        return;
    }
    a_crash_at_every_boundary("postgres").await;
}

/// A stand-in for a reviewing model: reads the round from its input and
/// approves from round `approve_at` on (never when 0), a typed result the
/// plan's stopping rule reads.
struct Reviewer {
    approve_at: u64,
}

impl ModelProvider for Reviewer {
    fn name(&self) -> &str {
        "reviewer"
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        let round = match request.messages.first() {
            Some(Message::User { content }) => serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|v| v["round"].as_u64())
                .unwrap_or(0),
            _ => 0,
        };
        let approved = self.approve_at != 0 && round >= self.approve_at;
        let text = json!({"approved": approved, "round": round}).to_string();
        Box::pin(futures::stream::iter([
            Ok(ProviderEvent::TextDelta(text)),
            Ok(ProviderEvent::Stop(StopReason::EndTurn)),
        ]))
    }
}

/// A plan repeating a review phase: the reviewer's typed result ends it.
fn review_loop(fx: &Fixture) -> Agent {
    std::fs::write(
        fx.path("reviewer.toml"),
        r#"
name = "reviewer"
instructions = "Review."
output_schema = '{"type": "object", "required": ["approved", "round"]}'

[model]
provider = "scripted"
name = "script"
transcript = "unused.toml"
"#,
    )
    .unwrap();
    std::fs::write(fx.path("unused.toml"), "[[turns]]\ntext = \"unused\"\n").unwrap();
    std::fs::write(
        fx.path("loop.toml"),
        r#"
name = "loop"

[roles.reviewer]
agent = "reviewer.toml"

[[phases]]
name = "review"
roles = ["reviewer"]
input = { round = "/round", last = "/reviewer/approved" }
max_rounds = 3
until = { role = "reviewer", pointer = "/approved", equals = true }

[result]
role = "reviewer"
"#,
    )
    .unwrap();
    Agent::load(&fx.path("loop.toml"), None).unwrap()
}

/// The rule met at round 2 ends the phase there; a reviewer that never
/// approves ends it at its third round, `max_rounds`; either way the
/// output is the last round's typed result and the reason is recorded.
async fn stopping_rules(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let agent = review_loop(&fx);
    for (approve_at, rounds, reason, name) in [
        (2, 2, EndReason::Until, "until"),
        (0, 3, EndReason::MaxRounds, "max"),
    ] {
        let rt: Runtime = runtime(store.clone()).with_provider(Arc::new(Reviewer { approve_at }));
        let run = rt
            .start(&agent, json!("review"), StartOptions::new().id(id(name)))
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        let events = rt.events(&run).await.unwrap();
        assert_eq!(children(&events).len(), rounds as usize, "{name}");
        // The first round read no earlier result (null); later ones the
        // previous round's.
        let inputs: Vec<Value> = events
            .iter()
            .filter_map(|e| match e {
                Event::ChildStarted(c) => Some(c.input.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(inputs[0], json!({"round": 1, "last": null}), "{name}");
        assert_eq!(inputs[1], json!({"round": 2, "last": false}), "{name}");
        let d = decisions(&events);
        let last = d.last().unwrap();
        assert_eq!(last.ended[0].rounds, rounds, "{name}");
        assert_eq!(last.ended[0].reason, reason, "{name}");
        assert_eq!(
            rt.state(&run).await.unwrap().output(),
            Some(&json!({"approved": approve_at != 0, "round": rounds})),
            "{name}"
        );
        rt.recover(&run, &agent, ReplayOptions::default())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_stopping_rule_ends_a_repeated_phase_on_a_typed_result_or_its_max_rounds_on_memory_and_sqlite()
 {
    let dir = tempfile::tempdir().unwrap();
    stopping_rules(Arc::new(MemoryStore::new())).await;
    stopping_rules(Arc::new(
        SqliteStore::open(dir.path().join("runs.db")).unwrap(),
    ))
    .await;
}

#[tokio::test]
async fn a_stopping_rule_ends_a_repeated_phase_on_a_typed_result_or_its_max_rounds_on_postgres() {
    let Some(pg) = PgSchema::new("plans_rules").await else {
        return;
    };
    stopping_rules(Arc::new(pg.store().await)).await;
}

/// A worker waiting for approval parks the plan's run (`awaiting_child`);
/// driving the plan records nothing more; approving the worker and
/// driving the plan goes on through it, each write once.
async fn a_role_parks_the_plan(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    // One call in flight: the first worker parks the plan before the
    // second starts (side by side, both would wait for approval).
    let plan = BATCH_THEN_CHECK.replace("max_concurrent = 2", "max_concurrent = 1");
    let agent = write_plan(&fx, true, &plan);
    let rt = runtime(store.clone());
    let run = rt
        .start(
            &agent,
            json!({"parts": ["a", "b"]}),
            StartOptions::new().id(id("parked")),
        )
        .await
        .unwrap();
    for n in 0..2 {
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingChild
        );
        let worker = runs(&run)[n].clone();
        let waiting = store
            .list(&RunFilter::new().status("awaiting_approval"))
            .await
            .unwrap();
        assert_eq!(
            waiting.iter().map(|s| s.run_id.clone()).collect::<Vec<_>>(),
            std::slice::from_ref(&worker)
        );
        let before = rt.events(&run).await.unwrap().len();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingChild
        );
        assert_eq!(rt.events(&run).await.unwrap().len(), before);
        assert_eq!(fx.effects(), n, "nothing written before approval");
        let call = match rt.state(&worker).await.unwrap().parked() {
            Some(warden::engine::state::Parked::Approval { call }) => call.call_id.clone(),
            other => panic!("{other:?}"),
        };
        rt.approve(&worker, &call, "alice").await.unwrap();
    }
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 2);
    rt.recover(&run, &agent, ReplayOptions::default())
        .await
        .unwrap();
    assert_eq!(fx.effects(), 2);
}

#[tokio::test]
async fn a_role_waiting_for_approval_parks_the_plan_on_memory_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_role_parks_the_plan(Arc::new(MemoryStore::new())).await;
    a_role_parks_the_plan(Arc::new(
        SqliteStore::open(dir.path().join("runs.db")).unwrap(),
    ))
    .await;
}

#[tokio::test]
async fn a_role_waiting_for_approval_parks_the_plan_on_postgres() {
    let Some(pg) = PgSchema::new("plans_park").await else {
        return;
    };
    a_role_parks_the_plan(Arc::new(pg.store().await)).await;
}

/// Bad plans are refused when loaded, with a typed error naming the key
/// and the kind of mistake; nothing can start from them.
#[test]
fn a_bad_plan_is_refused_naming_what_is_wrong() {
    let fx = Fixture::new();
    write_plan(&fx, false, BATCH_THEN_CHECK);
    let refused = |plan: String| -> (PlanError, AgentError) {
        std::fs::write(fx.path("bad.toml"), plan).unwrap();
        match Agent::load(&fx.path("bad.toml"), None) {
            Err(e @ AgentError::Plan { .. }) => {
                let AgentError::Plan { error, .. } = &e else {
                    unreachable!()
                };
                (error.clone(), e)
            }
            other => panic!("{other:?}"),
        }
    };
    let (error, e) =
        refused(BATCH_THEN_CHECK.replace("roles = [\"checker\"]", "roles = [\"judge\"]"));
    assert!(
        matches!(&error, PlanError::UnknownRole { key, role, .. } if key == "phases[1].roles" && role == "judge"),
        "{error:?}"
    );
    assert_eq!(e.code(), "plan_invalid");
    assert_eq!(e.details()["problem"], "unknown_role");
    assert_eq!(e.details()["key"], "phases[1].roles");
    assert!(
        e.to_string().contains("`judge` is not a role of the plan"),
        "{e}"
    );

    let (error, _) =
        refused(BATCH_THEN_CHECK.replace("agent = \"checker.toml\"", "agent = \"nobody.toml\""));
    assert!(
        matches!(&error, PlanError::UnknownAgent { key, role, .. } if key == "roles.checker.agent" && role == "checker"),
        "{error:?}"
    );

    // The worker reads the checker's result, which only the next phase
    // makes.
    let (error, e) = refused(BATCH_THEN_CHECK.replace(
        "input = { part = \"/item\" }",
        "input = { part = \"/item\", verdict = \"/checker/ok\" }",
    ));
    assert!(
        matches!(&error, PlanError::Cycle { key, .. } if key == "phases[0].input.verdict"),
        "{error:?}"
    );
    assert_eq!(e.details()["problem"], "cycle");
    // A role bound to the plan itself.
    let (error, _) =
        refused(BATCH_THEN_CHECK.replace("agent = \"checker.toml\"", "agent = \"bad.toml\""));
    assert!(matches!(&error, PlanError::Cycle { .. }), "{error:?}");

    // A stopping rule on a phase that does not repeat, one with two
    // tests, one naming a role of another phase.
    for (rule, key) in [
        (
            "until = { role = \"checker\", pointer = \"/ok\", equals = true }",
            "phases[1].until",
        ),
        (
            "max_rounds = 2\nuntil = { role = \"checker\", pointer = \"/score\", at_least = 1, less_than = 3 }",
            "phases[1].until",
        ),
        (
            "max_rounds = 2\nuntil = { role = \"worker\", pointer = \"/0/done\", equals = true }",
            "phases[1].until.role",
        ),
    ] {
        let (error, e) = refused(BATCH_THEN_CHECK.replace(
            "input = { results = \"/worker\" }",
            &format!("input = {{ results = \"/worker\" }}\n{rule}"),
        ));
        assert!(
            matches!(&error, PlanError::BadRule { key: k, .. } if k == key),
            "{rule}: {error:?}"
        );
        assert_eq!(e.details()["problem"], "bad_rule");
    }
}
/// A stand-in model for the workers of a batch: each call stays in flight
/// a while, and the most calls in flight at once is counted.
#[derive(Default)]
struct Overlapping {
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl ModelProvider for Overlapping {
    fn name(&self) -> &str {
        "overlapping"
    }

    fn stream(&self, _: &ModelRequest) -> ModelStream {
        use futures::StreamExt as _;
        use std::sync::atomic::Ordering;
        let in_flight = Arc::clone(&self.in_flight);
        let most = Arc::clone(&self.most);
        let answer = async move {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            vec![
                Ok(ProviderEvent::TextDelta(r#"{"done": true}"#.into())),
                Ok(ProviderEvent::Stop(StopReason::EndTurn)),
            ]
        };
        Box::pin(futures::stream::once(answer).flat_map(futures::stream::iter))
    }
}

/// A batch phase of four workers with `max_concurrent = 2` runs two at a
/// time, never more, and its log is recorded in call order whatever
/// finished first: it equals the log of the same plan run one call at a
/// time, and replays.
#[tokio::test]
async fn a_batch_phase_runs_its_calls_at_once_up_to_its_bound() {
    // Fails on main until the batch executor (issue 23 item 2) lands and
    // plan::parse passes `max_concurrent` as the agent's
    // `max_parallel_calls`: today one call is in flight at a time.
    let fx = Fixture::new();
    std::fs::write(
        fx.path("drafter.toml"),
        r#"
name = "drafter"
instructions = "Draft."
output_schema = '{"type": "object", "required": ["done"]}'

[model]
provider = "scripted"
name = "script"
transcript = "unused.toml"
"#,
    )
    .unwrap();
    std::fs::write(fx.path("unused.toml"), "[[turns]]\ntext = \"unused\"\n").unwrap();
    let plan = |bound: u32| {
        format!(
            r#"
name = "drafts"
max_concurrent = {bound}

[roles.drafter]
agent = "drafter.toml"

[[phases]]
name = "draft"
roles = ["drafter"]
for_each = "/input/parts"

[result]
role = "drafter"
"#
        )
    };
    let mut logs = Vec::new();
    for (bound, expected) in [(2, 2), (1, 1)] {
        std::fs::write(fx.path("drafts.toml"), plan(bound)).unwrap();
        let agent = Agent::load(&fx.path("drafts.toml"), None).unwrap();
        let model = Arc::new(Overlapping::default());
        let most = Arc::clone(&model.most);
        let rt = runtime(Arc::new(MemoryStore::new())).with_provider(model);
        let run = rt
            .start(
                &agent,
                json!({"parts": [1, 2, 3, 4]}),
                StartOptions::new().id(id("drafts")),
            )
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        assert_eq!(
            most.load(std::sync::atomic::Ordering::SeqCst),
            expected,
            "bound {bound}"
        );
        assert_eq!(
            rt.state(&run).await.unwrap().output(),
            Some(&json!([{"done": true}, {"done": true}, {"done": true}, {"done": true}]))
        );
        rt.recover(&run, &agent, ReplayOptions::default())
            .await
            .unwrap();
        let events = normalized(&rt.events(&run).await.unwrap());
        // Only the bound differs between the two plans' logs (it is in
        // the plan, so in the digest, the instructions and the decision).
        let mut kinds = events.iter().map(|e| e.kind().as_str()).collect::<Vec<_>>();
        // Side by side, a call's start is recorded before the one before
        // it finishes; outcomes stay in call order either way.
        kinds.sort_unstable();
        logs.push(kinds);
    }
    assert_eq!(logs[0], logs[1], "the same events");
}
