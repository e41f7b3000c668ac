//! Parallel batches (`max_parallel_calls`), on every store (in memory,
//! SQLite, PostgreSQL): the hostile guest's `sleep` tool waits as long as a
//! file outside its arguments says and traces when each call starts and
//! ends, so the same turn can finish in different orders while its log
//! stays the same. A batch of reads records one log whatever finished
//! first, and replays; the bound is respected (counted from the trace); a
//! write waits for its approval and runs alone unless `parallel_writes`;
//! a crash at every event boundary of a batch recovers to the same log
//! with each write once; two child runs in one turn run at once and
//! recover after a crash at any boundary of parent or children.

use std::sync::Arc;

use serde_json::json;
use warden::engine::events::Event;
use warden::engine::{Agent, ReplayOptions, RunId, RunStatus, RuntimeError, StartOptions};
use warden::store::{EventStore, MemoryStore, SqliteStore};

use super::engine::{Fixture, id, normalized, runtime};
use super::sweep::{Crashed, Sweep};
use super::workers::PgSchema;

/// One call to `<plugin>__sleep` labelled `label`, as a transcript entry.
fn sleep(plugin: &str, label: &str) -> String {
    format!(
        "[[turns.tool_calls]]\nname = \"{plugin}__sleep\"\narguments = {{ label = \"{label}\", trace = \"/workspace/trace.log\", delays = \"/workspace/delays.json\" }}\n"
    )
}

/// One append to the side-effect counter (a write needing no approval).
const APPEND: &str = "[[turns.tool_calls]]\nname = \"hostile__fs\"\narguments = { op = \"append\", path = \"/workspace/effects.log\", content = \"effect\\n\" }\n";

/// A turn of `calls`, then (when `last`) the final answer.
fn turns(calls: &[String], last: bool) -> String {
    let mut text = format!("[[turns]]\ntext = \"Working.\"\n{}", calls.concat());
    if last {
        text.push_str("\n[[turns]]\ntext = \"All done.\"\n");
    }
    text
}

/// The agent `name`: the hostile guest twice, as `hostile` (its `sleep` a
/// read, its `fs` a write needing no approval) and as `writer` (its
/// `sleep` a write, approved per `writer_approval`), with `top` at the top
/// of the file (`max_parallel_calls`, `parallel_writes`).
fn agent(fx: &Fixture, name: &str, transcript: &str, top: &str, writer_approval: &str) -> Agent {
    std::fs::write(fx.path(&format!("{name}.transcript.toml")), transcript).unwrap();
    std::fs::write(
        fx.path(&format!("{name}.toml")),
        format!(
            r#"
name = "{name}"
instructions = "Work in parallel."
{top}

[model]
provider = "scripted"
name = "script"
transcript = "{name}.transcript.toml"

[plugins.hostile]
source = "hostile.toml"
approval = {{ fs = "never" }}
[plugins.hostile.grant.mounts.workspace]
dir = "work"
[plugins.hostile.grant.tools.sleep]
effect = "read"

[plugins.writer]
source = "hostile.toml"
{writer_approval}
[plugins.writer.grant.mounts.workspace]
dir = "work"
"#
        ),
    )
    .unwrap();
    Agent::load(&fx.path(&format!("{name}.toml")), None).unwrap()
}

/// Each call's wait, by label.
fn delays(fx: &Fixture, delays: serde_json::Value) {
    std::fs::write(fx.path("work/delays.json"), delays.to_string()).unwrap();
}

/// The trace: `+label` when a call started, `-label` when it ended.
fn trace(fx: &Fixture) -> Vec<String> {
    std::fs::read_to_string(fx.path("work/trace.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The most calls in flight at once in `trace`.
fn overlap(trace: &[String]) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for line in trace {
        if line.starts_with('+') {
            now += 1;
            most = most.max(now);
        } else {
            now -= 1;
        }
    }
    most
}

/// The labels in the order their calls ended.
fn ended(trace: &[String]) -> Vec<&str> {
    trace.iter().filter_map(|l| l.strip_prefix('-')).collect()
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

/// The call ids of the tool call completions, in log order.
fn completed(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallCompleted(c) => Some(c.call_id.to_string()),
            _ => None,
        })
        .collect()
}

/// Runs `agent` as `run` on `store` to its end.
async fn run_to_end(store: Arc<dyn EventStore>, agent: &Agent, run: &RunId) -> RunStatus {
    let rt = runtime(store);
    rt.start(agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    rt.drive(run, agent).await.unwrap()
}

/// Three reads in one turn, run twice with waits that make them finish in
/// opposite orders: the same log both times (intents in the model's order,
/// then completions in the model's order), all three in flight at once,
/// and the log replays against the agent with nothing run again.
async fn one_log_whatever_finishes_first(store: impl Fn(&str) -> Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let calls = [
        sleep("hostile", "a"),
        sleep("hostile", "b"),
        sleep("hostile", "c"),
    ];
    let agent = agent(
        &fx,
        "reader",
        &turns(&calls, true),
        "max_parallel_calls = 3",
        "",
    );
    let run = id("batch");
    let mut logs = Vec::new();
    let mut orders = Vec::new();
    for (order, waits) in [
        ("a last", json!({"a": 600, "b": 50, "c": 300})),
        ("a first", json!({"a": 50, "b": 600, "c": 300})),
    ] {
        let _ = std::fs::remove_file(fx.path("work/trace.log"));
        delays(&fx, waits);
        let store = store(order);
        assert_eq!(
            run_to_end(store.clone(), &agent, &run).await,
            RunStatus::Completed,
            "{order}"
        );
        let trace = trace(&fx);
        assert_eq!(overlap(&trace), 3, "{order}: {trace:?}");
        orders.push(ended(&trace).join(""));
        let rt = runtime(store.clone());
        let events = rt.events(&run).await.unwrap();
        assert_eq!(
            kinds(&events),
            [
                "run_started",
                "model_call_intent",
                "model_call_completed",
                "tool_call_intent",
                "tool_call_intent",
                "tool_call_intent",
                "tool_call_completed",
                "tool_call_completed",
                "tool_call_completed",
                "model_call_intent",
                "model_call_completed",
                "run_completed",
            ],
            "{order}"
        );
        assert_eq!(
            completed(&events),
            ["call-1-1", "call-1-2", "call-1-3"],
            "{order}"
        );
        // Checked replay agrees with every recorded decision, and runs
        // nothing again.
        let before = trace.len();
        assert_eq!(
            rt.recover(&run, &agent, ReplayOptions::default())
                .await
                .unwrap(),
            RunStatus::Completed
        );
        assert_eq!(rt.events(&run).await.unwrap(), events, "{order}");
        assert_eq!(
            self::trace(&fx).len(),
            before,
            "{order}: replay ran nothing"
        );
        logs.push(normalized(&events));
    }
    assert_eq!(
        orders,
        ["bca", "acb"],
        "the calls ended in different orders"
    );
    assert_eq!(logs[0], logs[1], "one log whatever finished first");
}

#[tokio::test]
async fn a_batch_of_reads_records_one_log_whatever_finishes_first_on_memory_and_sqlite() {
    one_log_whatever_finishes_first(|_| Arc::new(MemoryStore::new())).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    one_log_whatever_finishes_first(move |order| {
        Arc::new(SqliteStore::open(path.join(format!("{order}.db"))).unwrap())
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_reads_records_one_log_whatever_finishes_first_on_postgres() {
    // A schema per order: the same run id in each.
    let (Some(first), Some(second)) = (
        PgSchema::new("batch_order").await,
        PgSchema::new("batch_order").await,
    ) else {
        return;
    };
    let stores: Vec<Arc<dyn EventStore>> = vec![
        Arc::new(first.store().await),
        Arc::new(second.store().await),
    ];
    one_log_whatever_finishes_first(|order| stores[usize::from(order == "a first")].clone()).await;
}

/// Four reads with a bound of two: never more than two in flight, and the
/// next starts as soon as the first in the model's order has its outcome
/// recorded. Without the setting, one at a time.
#[tokio::test]
async fn the_bound_is_respected_and_the_default_is_one_call_at_a_time() {
    let fx = Fixture::new();
    let calls: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|l| sleep("hostile", l))
        .collect();
    delays(&fx, json!({"a": 200, "b": 200, "c": 200, "d": 200}));
    let bounded = agent(
        &fx,
        "two",
        &turns(&calls, true),
        "max_parallel_calls = 2",
        "",
    );
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    assert_eq!(
        run_to_end(store.clone(), &bounded, &id("two")).await,
        RunStatus::Completed
    );
    assert_eq!(overlap(&trace(&fx)), 2, "{:?}", trace(&fx));
    let events = runtime(store).events(&id("two")).await.unwrap();
    assert_eq!(
        kinds(&events)[3..11],
        [
            "tool_call_intent",
            "tool_call_intent",
            "tool_call_completed",
            "tool_call_intent",
            "tool_call_completed",
            "tool_call_intent",
            "tool_call_completed",
            "tool_call_completed",
        ]
    );

    let _ = std::fs::remove_file(fx.path("work/trace.log"));
    let alone = agent(&fx, "one", &turns(&calls, true), "", "");
    assert_eq!(
        run_to_end(Arc::new(MemoryStore::new()), &alone, &id("one")).await,
        RunStatus::Completed
    );
    assert_eq!(overlap(&trace(&fx)), 1, "{:?}", trace(&fx));
}

/// A read, a write needing approval, and a read in one turn: the first read
/// runs, then the run parks for the write (the second read has not
/// started); once approved, the write runs alone, then the last read. A
/// write needing no approval runs alone too, unless `parallel_writes`.
#[tokio::test]
async fn a_write_in_a_batch_waits_for_its_approval_and_runs_alone() {
    for (name, store) in super::engine::stores(tempfile::tempdir().unwrap().path()) {
        let fx = Fixture::new();
        delays(&fx, json!({"a": 100, "w": 100, "b": 100}));
        let calls = [
            sleep("hostile", "a"),
            sleep("writer", "w"),
            sleep("hostile", "b"),
        ];
        let mixed = agent(
            &fx,
            "mixed",
            &turns(&calls, true),
            "max_parallel_calls = 3",
            "",
        );
        let rt = runtime(store.clone());
        let run = rt
            .start(&mixed, json!("go"), StartOptions::new().id(id("mixed")))
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &mixed).await.unwrap(),
            RunStatus::AwaitingApproval,
            "{name}"
        );
        assert_eq!(trace(&fx), ["+a", "-a"], "{name}: nothing else started");
        let call = warden::engine::CallId::new(1, 2);
        rt.approve(&run, &call, "alice").await.unwrap();
        assert_eq!(
            rt.drive(&run, &mixed).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        assert_eq!(
            trace(&fx),
            ["+a", "-a", "+w", "-w", "+b", "-b"],
            "{name}: the write ran alone"
        );
        rt.recover(&run, &mixed, ReplayOptions::default())
            .await
            .unwrap();
        assert_eq!(trace(&fx).len(), 6, "{name}");

        for (top, expected) in [
            ("max_parallel_calls = 3", 1),
            ("max_parallel_calls = 3\nparallel_writes = true", 3),
        ] {
            let _ = std::fs::remove_file(fx.path("work/trace.log"));
            let unapproved = agent(
                &fx,
                "unapproved",
                &turns(&calls, true),
                top,
                "approval = { sleep = \"never\" }",
            );
            let run = id(&format!("unapproved-{expected}"));
            assert_eq!(
                run_to_end(store.clone(), &unapproved, &run).await,
                RunStatus::Completed,
                "{name}: {top}"
            );
            assert_eq!(
                overlap(&trace(&fx)),
                expected,
                "{name}: {top}: {:?}",
                trace(&fx)
            );
        }
    }
}

/// Crashes at every append of a run whose turns each hold reads in
/// parallel and a write, at both crash points, then recovers: the same
/// log as a run never interrupted and each write once; a crash at a
/// write's boundary leaves it for a human, who resolves it, and the run
/// finishes without writing again.
async fn a_batch_crashed_at_every_boundary(kind: &str) {
    let fx = Fixture::new();
    delays(&fx, json!({"a": 60, "b": 10, "c": 30}));
    let transcript = format!(
        "{}\n{}",
        turns(
            &[sleep("hostile", "a"), sleep("hostile", "b"), APPEND.into()],
            false
        ),
        turns(&[sleep("hostile", "c"), APPEND.into()], true)
    );
    let agent = agent(&fx, "crashy", &transcript, "max_parallel_calls = 3", "");
    let run = id("crashy");
    let sweep = Sweep {
        fx: &fx,
        agent: &agent,
        runs: vec![run.clone()],
        input: json!("go"),
        store: kind,
        name: "batch_crash",
    };
    let (_, control) = sweep.uninterrupted().await;
    assert_eq!(fx.effects(), 2);

    let mut reconciled = 0;
    let visited = sweep
        .crash_at_every_boundary(async |Crashed { case, store, rt }| {
            match rt.recover(&run, &agent, ReplayOptions::default()).await {
                Ok(status) => {
                    assert_eq!(status, RunStatus::Completed, "{case}");
                    assert_eq!(sweep.logs(&store).await, control, "{case}");
                    assert_eq!(fx.effects(), 2, "{case}: each write ran exactly once");
                }
                Err(RuntimeError::NeedsReconciliation { write, .. }) => {
                    reconciled += 1;
                    assert_eq!(write.tool.tool, "fs", "{case}");
                    let ran = fx.effects();
                    assert!(ran <= 2, "{case}");
                    rt.resolve(&run, json!({ "appended": 7 }), "tester", None)
                        .await
                        .unwrap();
                    assert_eq!(
                        rt.recover(&run, &agent, ReplayOptions::default())
                            .await
                            .unwrap_or_else(|e| panic!("{case}: {e}")),
                        RunStatus::Completed,
                        "{case}"
                    );
                    let after = fx.effects();
                    assert!(after <= 2 && after >= ran, "{case}: {ran} then {after}");
                    // The resolved write was not made again: only a later
                    // one, never made before the crash, was.
                    let events = rt.events(&run).await.unwrap();
                    let made_later = events
                        .iter()
                        .skip_while(|e| !matches!(e, Event::ToolCallResolved(_)))
                        .filter(|e| matches!(e, Event::ToolCallIntent(i) if i.tool.tool == "fs"))
                        .count();
                    assert_eq!(after, ran + made_later, "{case}");
                }
                Err(other) => panic!("{case}: {other}"),
            }
        })
        .await;
    // Every append of the run, at both points.
    assert_eq!(visited, 2 * 9, "{kind}");
    // Each write's intent and completion boundaries, where its outcome is
    // unknown: two per write.
    assert_eq!(reconciled, 4, "{kind}");
}

#[tokio::test]
async fn a_batch_crashed_at_every_boundary_recovers_on_memory_and_sqlite() {
    a_batch_crashed_at_every_boundary("memory").await;
    a_batch_crashed_at_every_boundary("sqlite").await;
}

#[tokio::test]
async fn a_batch_crashed_at_every_boundary_recovers_on_postgres() {
    if PgSchema::new("batch_probe").await.is_none() {
        return;
    }
    a_batch_crashed_at_every_boundary("postgres").await;
}

/// The planner calls two agents in one turn (each a read that waits, then
/// a typed result), then makes a write.
fn planner(fx: &Fixture) -> Agent {
    for side in ["left", "right"] {
        std::fs::write(
            fx.path(&format!("{side}.transcript.toml")),
            format!(
                "{}\n[[turns]]\ntext = '{{\"side\": \"{side}\"}}'\n",
                turns(&[sleep("hostile", side)], false)
            ),
        )
        .unwrap();
        std::fs::write(
            fx.path(&format!("{side}.toml")),
            format!(
                r#"
name = "{side}"
instructions = "Do one side."
output_schema = '{{"type": "object", "required": ["side"]}}'

[model]
provider = "scripted"
name = "script"
transcript = "{side}.transcript.toml"

[plugins.hostile]
source = "hostile.toml"
[plugins.hostile.grant.mounts.workspace]
dir = "work"
[plugins.hostile.grant.tools.sleep]
effect = "read"
"#
            ),
        )
        .unwrap();
    }
    let transcript = format!(
        "[[turns]]\ntext = \"Delegating.\"\n[[turns.tool_calls]]\nname = \"left\"\narguments = {{ task = \"l\" }}\n[[turns.tool_calls]]\nname = \"right\"\narguments = {{ task = \"r\" }}\n\n{}",
        turns(&[APPEND.into()], true)
    );
    std::fs::write(fx.path("planner.transcript.toml"), transcript).unwrap();
    std::fs::write(
        fx.path("planner.toml"),
        r#"
name = "planner"
instructions = "Plan, then hand both sides out at once."
max_parallel_calls = 2

[model]
provider = "scripted"
name = "script"
transcript = "planner.transcript.toml"

[plugins.hostile]
source = "hostile.toml"
approval = { fs = "never" }
[plugins.hostile.grant.mounts.workspace]
dir = "work"

[agents.left]
agent = "left.toml"
description = "Does the left side"

[agents.right]
agent = "right.toml"
description = "Does the right side"
"#,
    )
    .unwrap();
    Agent::load(&fx.path("planner.toml"), None).unwrap()
}

/// Two children of one turn run at once (their reads overlap), the
/// parent's log records both starts, then both ends, in the model's
/// order; a crash at every append of parent or children, at both points,
/// recovers to the same logs, each child started once and the parent's
/// write made once.
async fn two_children_at_once(kind: &str) {
    let fx = Fixture::new();
    delays(&fx, json!({"left": 300, "right": 300}));
    let agent = planner(&fx);
    let run = id("plan");
    let sweep = Sweep {
        fx: &fx,
        agent: &agent,
        runs: vec![
            run.clone(),
            id(&format!("{run}.call-1-1")),
            id(&format!("{run}.call-1-2")),
        ],
        input: json!("go"),
        store: kind,
        name: "batch_family",
    };
    let (_, control) = sweep.uninterrupted().await;
    assert_eq!(overlap(&trace(&fx)), 2, "the children ran at once");
    assert_eq!(
        kinds(&control[0])[3..7],
        [
            "child_started",
            "child_started",
            "child_finished",
            "child_finished"
        ]
    );
    delays(&fx, json!({"left": 20, "right": 20}));

    let mut reconciled = 0;
    let visited = sweep
        .crash_at_every_boundary(async |Crashed { case, store, rt }| {
            match rt.recover(&run, &agent, ReplayOptions::default()).await {
                Ok(status) => {
                    assert_eq!(status, RunStatus::Completed, "{case}");
                    assert_eq!(sweep.logs(&store).await, control, "{case}");
                    assert_eq!(fx.effects(), 1, "{case}: the write ran once");
                }
                Err(RuntimeError::NeedsReconciliation { .. }) => {
                    reconciled += 1;
                    let ran = fx.effects();
                    rt.resolve(&run, json!({ "appended": 7 }), "tester", None)
                        .await
                        .unwrap();
                    assert_eq!(
                        rt.recover(&run, &agent, ReplayOptions::default())
                            .await
                            .unwrap(),
                        RunStatus::Completed,
                        "{case}"
                    );
                    assert_eq!(fx.effects(), ran, "{case}: never written again");
                }
                Err(other) => panic!("{case}: {other}"),
            }
        })
        .await;
    // Every append of the parent and both children, at both points.
    assert_eq!(visited, 2 * 18, "{kind}");
    assert_eq!(reconciled, 2, "{kind}: the parent's write's two boundaries");
}

#[tokio::test]
async fn two_children_in_one_turn_run_at_once_and_recover_on_memory_and_sqlite() {
    two_children_at_once("memory").await;
    two_children_at_once("sqlite").await;
}

#[tokio::test]
async fn two_children_in_one_turn_run_at_once_and_recover_on_postgres() {
    if PgSchema::new("batch_family_probe").await.is_none() {
        return;
    }
    two_children_at_once("postgres").await;
}
