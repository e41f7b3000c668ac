//! Effects done right: idempotency commitments across runs, retries by
//! effect class, unknown outcomes of writes whose lease died, and external
//! tools. Real plugins in the real sandbox, over both stores where it
//! matters; the side-effect counter (`work/effects.log`) lives outside the
//! sandbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::{Event, ToolCallError};
use warden::engine::{Agent, KeyState, ReplayOptions, RunId, RunStatus, Runtime, RuntimeError};
use warden::plugins::PluginHost;
use warden::sandbox::Outcome;
use warden::store::{CommitmentFilter, EventStore, MemoryStore, SqliteStore};

use super::engine::Fixture;
use crate::sandbox;
use warden::store::testing::{Hooks, Intercepted};

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
}

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// One keyed payment (an append to the counter), then an answer.
fn pay(claim: Option<&str>) -> String {
    let claim = claim
        .map(|c| format!(", claim_id = \"{c}\""))
        .unwrap_or_default();
    format!(
        r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = {{ op = "append", path = "/workspace/effects.log", content = "paid\n"{claim} }}

[[turns]]
text = "Paid."
"#
    )
}

/// The operator names `claim_id` as the payment tool's idempotency key.
const KEYED: &str = "[plugins.hostile.grant.tools.fs]\nidempotency_key = \"claim_id\"\n";

async fn run_to_end(rt: &Runtime, agent: &Agent, run: &str) -> (RunStatus, Vec<Event>) {
    let run = rt
        .start(agent, json!("go"), StartOptions::new().id(id(run)))
        .await
        .unwrap();
    let status = rt.drive(&run, agent).await.unwrap();
    (status, rt.events(&run).await.unwrap())
}

fn find<'a, T>(events: &'a [Event], pick: impl Fn(&'a Event) -> Option<T>) -> Option<T> {
    events.iter().find_map(pick)
}

#[tokio::test]
async fn a_keyed_write_runs_once_across_runs_and_the_second_gets_the_first_result() {
    for store_kind in ["memory", "sqlite"] {
        let fx = Fixture::new();
        let agent = fx.agent(&pay(Some("claim-42")), KEYED);
        let store: Arc<dyn EventStore> = match store_kind {
            "memory" => Arc::new(MemoryStore::new()),
            _ => Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap()),
        };
        let rt = runtime(store);
        let (status, first) = run_to_end(&rt, &agent, "first").await;
        assert_eq!(status, RunStatus::Completed, "{store_kind}");
        assert_eq!(fx.effects(), 1);
        let intent = find(&first, |e| match e {
            Event::ToolCallIntent(i) => Some(i.clone()),
            _ => None,
        })
        .unwrap();
        assert_eq!(intent.keyed_by.as_ref().unwrap().field, "claim_id");

        let (status, second) = run_to_end(&rt, &agent, "second").await;
        assert_eq!(status, RunStatus::Completed);
        assert_eq!(
            fx.effects(),
            1,
            "{store_kind}: the second run did not pay again"
        );
        let dedup = find(&second, |e| match e {
            Event::ToolCallDeduplicated(d) => Some(d.clone()),
            _ => None,
        })
        .expect("the second run records where its result came from");
        assert_eq!(dedup.origin_run, id("first"));
        assert_eq!(dedup.idempotency_key, intent.idempotency_key);
        assert!(
            !second.iter().any(|e| matches!(e, Event::ToolCallIntent(_))),
            "nothing ran in the second run"
        );
        // The model of the second run saw the first run's output.
        let state = rt.state(&id("second")).await.unwrap();
        let seen = serde_json::to_string(state.conversation()).unwrap();
        assert!(seen.contains("appended"), "{seen}");
    }
}

#[tokio::test]
async fn two_runs_racing_on_one_key_execute_it_once() {
    for store_kind in ["memory", "sqlite"] {
        let fx = Fixture::new();
        let agent = fx.agent(&pay(Some("claim-race")), KEYED);
        let store: Arc<dyn EventStore> = match store_kind {
            "memory" => Arc::new(MemoryStore::new()),
            _ => Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap()),
        };
        let rt = runtime(store);
        for run in ["a", "b"] {
            rt.start(&agent, json!("go"), StartOptions::new().id(id(run)))
                .await
                .unwrap();
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|run| {
                let (rt, agent, barrier) = (rt.clone(), agent.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    rt.drive(&id(run), &agent).await.unwrap()
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap(), RunStatus::Completed);
        }
        assert_eq!(fx.effects(), 1, "{store_kind}: exactly one run paid");
        let mut ran = 0;
        let mut deduplicated = 0;
        for run in ["a", "b"] {
            for e in rt.events(&id(run)).await.unwrap() {
                match e {
                    Event::ToolCallCompleted(_) => ran += 1,
                    Event::ToolCallDeduplicated(_) => deduplicated += 1,
                    _ => {}
                }
            }
        }
        assert_eq!((ran, deduplicated), (1, 1), "{store_kind}");
    }
}

#[tokio::test]
async fn a_call_missing_its_key_is_refused_before_anything_runs() {
    let fx = Fixture::new();
    let agent = fx.agent(&pay(None), KEYED);
    let rt = runtime(Arc::new(MemoryStore::new()));
    let (status, events) = run_to_end(&rt, &agent, "unkeyed").await;
    assert_eq!(status, RunStatus::Completed);
    let rejected = find(&events, |e| match e {
        Event::ToolCallRejected(r) => Some(r.error.clone()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        rejected,
        ToolCallError::MissingIdempotencyKey {
            field: "claim_id".into()
        }
    );
    assert_eq!(fx.effects(), 0);
}

#[tokio::test]
async fn without_a_key_the_same_write_legitimately_runs_in_each_run() {
    // This is why keys matter: two runs making the same unkeyed call are two
    // calls, and both run.
    let fx = Fixture::new();
    let agent = fx.agent(&pay(Some("claim-1")), "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    run_to_end(&rt, &agent, "one").await;
    run_to_end(&rt, &agent, "two").await;
    assert_eq!(fx.effects(), 2);
}

/// Counts the commitments a store is asked about.
#[derive(Default)]
struct CountClaims(AtomicU64);

impl Hooks for CountClaims {
    fn before_claim_commitment(&self, _: &str) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn replay_uses_the_recorded_deduplication_and_never_consults_commitments() {
    let fx = Fixture::new();
    // Pay (keyed), then a write that waits for approval (`set_marker` is a
    // write on the read-write mount and, unlike `fs`, needs approval).
    let turns = format!(
        "{}\n[[turns.tool_calls]]\nname = \"hostile__set_marker\"\narguments = {{}}\n\n[[turns]]\ntext = \"Done.\"\n",
        pay(Some("claim-9")).replace(
            "\n[[turns]]\ntext = \"Paid.\"\n",
            "\n[[turns]]\ntext = \"Paid; filing the receipt.\"\n"
        )
    );
    let agent = fx.agent(&turns, KEYED);
    let counting = Arc::new(Intercepted {
        inner: Arc::new(MemoryStore::new()),
        hooks: CountClaims::default(),
    });
    let rt = runtime(counting.clone());
    for run in ["payer", "second"] {
        rt.start(&agent, json!("go"), StartOptions::new().id(id(run)))
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&id(run), &agent).await.unwrap(),
            RunStatus::AwaitingApproval
        );
    }
    assert_eq!(
        counting.hooks.0.load(Ordering::SeqCst),
        2,
        "one live claim per run"
    );
    assert!(
        rt.events(&id("second"))
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e, Event::ToolCallDeduplicated(_)))
    );

    // A new process recovers the deduplicated run: replay folds the recorded
    // result without asking the store about the commitment.
    let fresh = runtime(counting.clone());
    assert_eq!(
        fresh
            .recover(&id("second"), &agent, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::AwaitingApproval
    );
    assert_eq!(
        counting.hooks.0.load(Ordering::SeqCst),
        2,
        "replay made no claim"
    );
    assert_eq!(fx.effects(), 1);
}

#[tokio::test]
async fn a_read_is_retried_after_a_transient_failure_and_every_attempt_is_recorded() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Trying."
[[turns.tool_calls]]
name = "hostile__flaky"
arguments = { path = "/workspace/flaky", fail_times = 2 }

[[turns]]
text = "Done."
"#;
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.tools.flaky]\neffect = \"read\"\n",
    );
    let rt = runtime(Arc::new(MemoryStore::new()));
    let (status, events) = run_to_end(&rt, &agent, "flaky-read").await;
    assert_eq!(status, RunStatus::Completed);
    let attempts: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallAttemptFailed(f) => {
                assert!(!f.outcome_unknown);
                assert!(matches!(
                    f.error,
                    ToolCallError::Failed {
                        retryable: true,
                        ..
                    }
                ));
                Some(f.attempt)
            }
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [1, 2]);
    let output = find(&events, |e| match e {
        Event::ToolCallCompleted(c) => Some(serde_json::to_value(&c.result).unwrap()),
        _ => None,
    })
    .unwrap();
    assert_eq!(output["output"]["attempt"], 3);
}

#[tokio::test]
async fn an_idempotent_call_is_retried_with_the_same_key_and_a_write_never() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Trying."
[[turns.tool_calls]]
name = "hostile__flaky"
arguments = { path = "/workspace/flaky", fail_times = 1 }

[[turns]]
text = "Done."
"#;
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.tools.flaky]\neffect = \"idempotent\"\n",
    );
    let rt = runtime(Arc::new(MemoryStore::new()));
    let (status, events) = run_to_end(&rt, &agent, "flaky-idem").await;
    assert_eq!(status, RunStatus::Completed);
    let keys = std::fs::read_to_string(fx.path("work/flaky.keys")).unwrap();
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 2, "tried twice");
    assert_eq!(keys[0], keys[1], "the plugin saw the same key both times");
    let intent_key = find(&events, |e| match e {
        Event::ToolCallIntent(i) => Some(i.idempotency_key.clone()),
        _ => None,
    })
    .unwrap();
    assert_eq!(keys[0], intent_key);

    // The same flaky tool as a write is tried once: its failure is the result.
    std::fs::remove_file(fx.path("work/flaky")).unwrap();
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.tools.flaky]\neffect = \"write\"\n",
    );
    let (status, events) = run_to_end(&rt, &agent, "flaky-write").await;
    assert_eq!(status, RunStatus::Completed);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ToolCallAttemptFailed(_)))
    );
    let result = find(&events, |e| match e {
        Event::ToolCallCompleted(c) => Some(serde_json::to_value(&c.result).unwrap()),
        _ => None,
    })
    .unwrap();
    assert_eq!(result["error"]["kind"], "failed");
}

#[tokio::test]
async fn a_write_whose_lease_dies_after_touching_the_mount_needs_reconciliation() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Writing."
[[turns.tool_calls]]
name = "hostile__write_then_sleep"
arguments = { path = "/workspace/effects.log", content = "half-done\n" }

[[turns]]
text = "Done."
"#;
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.limits]\ntimeout = \"300ms\"\n",
    );
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("died")))
        .await
        .unwrap();
    let err = rt.drive(&run, &agent).await.unwrap_err();
    let RuntimeError::NeedsReconciliation { write, .. } = err else {
        panic!("expected needs_reconciliation, got {err}");
    };
    assert_eq!(write.tool.tool, "write_then_sleep");
    assert_eq!(
        fx.effects(),
        1,
        "the write touched the mount before its lease died"
    );
    let events = rt.events(&run).await.unwrap();
    let failed = find(&events, |e| match e {
        Event::ToolCallAttemptFailed(f) => Some(f.clone()),
        _ => None,
    })
    .unwrap();
    assert!(failed.outcome_unknown);
    assert_eq!(
        failed.receipt.outcome,
        Outcome::Timeout,
        "the lease's receipt is kept"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ToolCallCompleted(_))),
        "the model was not told it failed"
    );
    assert_eq!(
        rt.state(&run).await.unwrap().status(),
        RunStatus::NeedsReconciliation
    );
    // A human who checked resolves it; the run finishes without running it again.
    rt.resolve(
        &run,
        json!({"appended": 10}),
        "ops",
        Some("the line is there".into()),
    )
    .await
    .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
}

#[tokio::test]
async fn an_unknown_keyed_write_holds_its_commitment_until_resolved() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__write_then_sleep"
arguments = { path = "/workspace/effects.log", content = "paid\n", claim_id = "c-77" }

[[turns]]
text = "Paid."
"#;
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.limits]\ntimeout = \"300ms\"\n[plugins.hostile.grant.tools.write_then_sleep]\nidempotency_key = \"claim_id\"\n",
    );
    let rt = runtime(Arc::new(MemoryStore::new())).with_commitment_wait(Duration::from_millis(200));
    let a = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("a")))
        .await
        .unwrap();
    assert!(matches!(
        rt.drive(&a, &agent).await,
        Err(RuntimeError::NeedsReconciliation { .. })
    ));
    // Another run making the same payment waits for the holder, then stops
    // and says who holds it.
    let b = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("b")))
        .await
        .unwrap();
    match rt.drive(&b, &agent).await {
        Err(RuntimeError::CommitmentHeld { holder, .. }) => assert_eq!(holder.run_id, a),
        other => panic!("expected the commitment to be held, got {other:?}"),
    }
    assert_eq!(fx.effects(), 1);
    // Resolving the holder settles the commitment; the other run gets the
    // resolved result without paying.
    rt.resolve(&a, json!({"paid": true}), "ops", None)
        .await
        .unwrap();
    assert_eq!(rt.drive(&b, &agent).await.unwrap(), RunStatus::Completed);
    let dedup = find(&rt.events(&b).await.unwrap(), |e| match e {
        Event::ToolCallDeduplicated(d) => Some(d.clone()),
        _ => None,
    })
    .unwrap();
    assert_eq!(dedup.origin_run, a);
    assert_eq!(
        serde_json::to_value(&dedup.result).unwrap()["output"]["paid"],
        true
    );
    assert_eq!(fx.effects(), 1);
}

/// The application pays invoices itself; the run parks at the call.
pub(crate) const EXTERNAL: &str = r#"
[external_tools.pay_invoice]
description = "Pay an invoice (the application does it with its own credentials)"
arguments_schema = '{"type": "object", "required": ["invoice_id", "amount"], "properties": {"invoice_id": {"type": "string"}, "amount": {"type": "integer"}}}'
output_schema = '{"type": "object", "required": ["invoice_id", "status"], "properties": {"invoice_id": {"type": "string"}, "status": {"enum": ["paid", "declined"]}}}'
must_match = ["invoice_id"]
"#;

pub(crate) const PAY_INVOICE: &str = r#"
[[turns]]
text = "Paying the invoice."
[[turns.tool_calls]]
name = "pay_invoice"
arguments = { invoice_id = "inv-1", amount = 12 }

[[turns]]
text = "The invoice is paid."
"#;

#[tokio::test]
async fn an_external_tool_parks_the_run_with_its_frozen_arguments_and_checks_the_report() {
    let fx = Fixture::new();
    let agent = fx.agent(PAY_INVOICE, EXTERNAL);
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("invoice")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingExternal
    );
    let events = rt.events(&run).await.unwrap();
    let request = find(&events, |e| match e {
        Event::ExternalCallRequested(r) => Some(r.clone()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        request.arguments,
        json!({"invoice_id": "inv-1", "amount": 12})
    );
    let before = events.len();

    // A report for another invoice, or one the schema refuses, writes nothing.
    let err = rt
        .complete_external(
            &run,
            &request.call_id,
            json!({"invoice_id": "inv-2", "status": "paid"}),
            None,
        )
        .await
        .unwrap_err();
    match err {
        RuntimeError::ExternalMismatch {
            field,
            recorded,
            given,
            ..
        } => {
            assert_eq!(field, "invoice_id");
            assert_eq!((*recorded, *given), (json!("inv-1"), json!("inv-2")));
        }
        other => panic!("expected a mismatch, got {other}"),
    }
    let err = rt
        .complete_external(
            &run,
            &request.call_id,
            json!({"invoice_id": "inv-1", "status": "lost"}),
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::OutputRejected { .. }), "{err}");
    // Resuming it as if it were a human's input is refused too.
    let err = rt
        .resume(&run, &agent, json!("paid"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::NotParked { .. }), "{err}");
    assert_eq!(
        rt.events(&run).await.unwrap().len(),
        before,
        "nothing written"
    );

    rt.complete_external(
        &run,
        &request.call_id,
        json!({"invoice_id": "inv-1", "status": "paid"}),
        Some("billing".into()),
    )
    .await
    .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    let state = rt.state(&run).await.unwrap();
    let seen = serde_json::to_string(state.conversation()).unwrap();
    assert!(
        seen.contains("paid"),
        "the model saw the reported output: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_tool_is_completed_from_a_second_process() {
    let fx = Fixture::new();
    let agent = fx.agent(PAY_INVOICE, EXTERNAL);
    let db = fx.path("runs.db");
    {
        let rt = runtime(Arc::new(SqliteStore::open(&db).unwrap()));
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("remote")))
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingExternal
        );
    }
    // A report for a call the run does not wait for is refused, naming the
    // one it does wait for, and records nothing.
    let wrong = super::kill::warden(
        &[
            "runs",
            "complete",
            "remote",
            "call-9-9",
            "--output",
            r#"{"invoice_id": "inv-1", "status": "paid"}"#,
            "--json",
            "--store",
        ],
        fx.dir.path(),
    )
    .arg(&db)
    .output()
    .unwrap();
    assert!(!wrong.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&wrong.stdout),
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert!(
        said.contains("not_awaiting_external") && said.contains("call-1-1"),
        "names the call the run waits for: {said}"
    );
    {
        let store = SqliteStore::open(&db).unwrap();
        assert_eq!(
            store.summary(&id("remote")).await.unwrap().status,
            "awaiting_external"
        );
    }
    // The application, another process, reports the payment through the CLI.
    let out = super::kill::warden(
        &[
            "runs",
            "complete",
            "remote",
            "call-1-1",
            "--output",
            r#"{"invoice_id": "inv-1", "status": "paid"}"#,
            "--store",
        ],
        fx.dir.path(),
    )
    .arg(&db)
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("remote: completed"));
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(
        store.summary(&id("remote")).await.unwrap().status,
        "completed"
    );
    let events = store.load(&id("remote")).await.unwrap();
    let completed = events
        .iter()
        .filter_map(|e| warden::engine::decode(&e.bytes).ok())
        .find_map(|e| match e {
            Event::ExternalCallCompleted(c) => Some(c),
            _ => None,
        })
        .unwrap();
    assert_eq!(completed.output["status"], "paid");
}

/// A keyed write that fails leaves nothing for its key: a later run, once
/// the cause is fixed, makes the call instead of being handed the error.
#[tokio::test]
async fn a_failed_keyed_write_leaves_its_key_to_a_later_run() {
    for store_kind in ["memory", "sqlite"] {
        let fx = Fixture::new();
        let turns = r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/ledger/effects.log", content = "paid\n", claim_id = "c-9" }

[[turns]]
text = "Paid."
"#;
        let agent = fx.agent(turns, KEYED);
        let store: Arc<dyn EventStore> = match store_kind {
            "memory" => Arc::new(MemoryStore::new()),
            _ => Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap()),
        };
        let rt = runtime(store.clone());
        // `ledger/` is missing: the append fails.
        let (status, first) = run_to_end(&rt, &agent, "first").await;
        assert_eq!(status, RunStatus::Completed, "{store_kind}");
        assert!(
            first.iter().any(|e| matches!(
                e,
                Event::ToolCallCompleted(c)
                    if matches!(c.result, warden::engine::events::ToolCallResult::Error(_))
            )),
            "{store_kind}: the failure is the first run's result"
        );
        assert_eq!(
            rt.keys(&CommitmentFilter::new()).await.unwrap(),
            [],
            "{store_kind}: nothing kept for the key"
        );
        std::fs::create_dir(fx.path("work/ledger")).unwrap();
        let (status, second) = run_to_end(&rt, &agent, "second").await;
        assert_eq!(status, RunStatus::Completed);
        assert!(
            !second
                .iter()
                .any(|e| matches!(e, Event::ToolCallDeduplicated(_))),
            "{store_kind}: the second run was not handed the first run's error"
        );
        assert_eq!(
            std::fs::read_to_string(fx.path("work/ledger/effects.log")).unwrap(),
            "paid\n"
        );
        let keys = rt.keys(&CommitmentFilter::new()).await.unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(
            (keys[0].state, keys[0].run_id.as_str()),
            (KeyState::Settled, "second")
        );
    }
}

/// A keyed write whose outcome is unknown when its run is abandoned leaves
/// its key orphaned: a later run stops at once saying so (no wait), the
/// key cannot be released while its holder may still make the call, and an
/// operator's release (recorded in the holder's log) lets the next run
/// make it.
/// An operator who checked that an orphaned key's call did have its effect
/// settles the key with its output (`warden keys settle`): recorded as
/// `key_settled` in the holder's log, and a later run with the key gets
/// that output and makes no call. A key held by a run that has not ended,
/// or already settled, is refused.
#[tokio::test]
async fn an_orphaned_keyed_write_settled_by_an_operator_hands_its_output_to_later_runs() {
    for store_kind in ["memory", "sqlite"] {
        let fx = Fixture::new();
        let turns = r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__write_then_sleep"
arguments = { path = "/workspace/effects.log", content = "paid\n", claim_id = "c-79" }

[[turns]]
text = "Paid."
"#;
        let agent = fx.agent(
            turns,
            "[plugins.hostile.grant.limits]\ntimeout = \"300ms\"\n[plugins.hostile.grant.tools.write_then_sleep]\nidempotency_key = \"claim_id\"\n",
        );
        let store: Arc<dyn EventStore> = match store_kind {
            "memory" => Arc::new(MemoryStore::new()),
            _ => Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap()),
        };
        let rt = runtime(store);
        let a = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("a")))
            .await
            .unwrap();
        assert!(matches!(
            rt.drive(&a, &agent).await,
            Err(RuntimeError::NeedsReconciliation { .. })
        ));
        let key = rt.keys(&CommitmentFilter::new()).await.unwrap()[0]
            .key
            .clone();
        let paid = json!({ "paid": true, "receipt": "r-1" });
        assert!(
            matches!(
                rt.settle_key(&key, paid.clone(), "ops", None).await,
                Err(RuntimeError::KeyInUse { .. })
            ),
            "{store_kind}: settled while its holder may still resolve it"
        );
        rt.abandon(&a, "ops", "the operator gave up on the run")
            .await
            .unwrap();
        assert_eq!(rt.key(&key).await.unwrap().state, KeyState::Orphaned);

        // The operator checked: the payment went through.
        rt.settle_key(&key, paid.clone(), "ops", Some("in the ledger".into()))
            .await
            .unwrap();
        match rt.events(&a).await.unwrap().last() {
            Some(Event::KeySettled(s)) => assert_eq!(
                (s.key.as_str(), &s.output, s.by.as_str()),
                (key.as_str(), &paid, "ops")
            ),
            other => panic!("{store_kind}: expected key_settled last, got {other:?}"),
        }
        assert_eq!(rt.state(&a).await.unwrap().status(), RunStatus::Abandoned);
        assert_eq!(rt.key(&key).await.unwrap().state, KeyState::Settled);
        assert!(matches!(
            rt.settle_key(&key, json!({}), "ops", None).await,
            Err(RuntimeError::KeyAlreadySettled { .. })
        ));

        // A later run with the key gets the output; the write never runs.
        let b = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("b")))
            .await
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), rt.drive(&b, &agent))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, RunStatus::Completed, "{store_kind}");
        assert_eq!(fx.effects(), 1, "{store_kind}: the write ran again");
        let deduplicated = rt
            .events(&b)
            .await
            .unwrap()
            .into_iter()
            .find_map(|e| match e {
                Event::ToolCallDeduplicated(d) => Some(d),
                _ => None,
            })
            .expect("b's call was deduplicated");
        assert_eq!(
            deduplicated.result,
            warden::engine::events::ToolCallResult::Output(paid),
            "{store_kind}"
        );
    }
}

#[tokio::test]
async fn an_abandoned_keyed_write_orphans_its_key_until_an_operator_releases_it() {
    for store_kind in ["memory", "sqlite"] {
        let fx = Fixture::new();
        let turns = r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__write_then_sleep"
arguments = { path = "/workspace/effects.log", content = "paid\n", claim_id = "c-78" }

[[turns]]
text = "Paid."
"#;
        let agent = fx.agent(
            turns,
            "[plugins.hostile.grant.limits]\ntimeout = \"300ms\"\n[plugins.hostile.grant.tools.write_then_sleep]\nidempotency_key = \"claim_id\"\n",
        );
        let store: Arc<dyn EventStore> = match store_kind {
            "memory" => Arc::new(MemoryStore::new()),
            _ => Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap()),
        };
        // A wait this long would fail the test's time budget: the orphaned
        // key must be reported without it.
        let rt = runtime(store).with_commitment_wait(Duration::from_secs(600));
        let a = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("a")))
            .await
            .unwrap();
        assert!(matches!(
            rt.drive(&a, &agent).await,
            Err(RuntimeError::NeedsReconciliation { .. })
        ));
        let key = rt.keys(&CommitmentFilter::new()).await.unwrap()[0]
            .key
            .clone();
        // Held by a run that may still be reconciled: not released.
        match rt.release_key(&key, "ops", None).await {
            Err(RuntimeError::KeyInUse { holder, status, .. }) => {
                assert_eq!(
                    (holder.run_id, status.as_str()),
                    (a.clone(), "needs_reconciliation")
                )
            }
            other => panic!("{store_kind}: expected the key in use, got {other:?}"),
        }
        rt.abandon(&a, "tester", "the payment provider is down")
            .await
            .unwrap();
        assert_eq!(rt.key(&key).await.unwrap().state, KeyState::Orphaned);

        let b = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("b")))
            .await
            .unwrap();
        match rt.drive(&b, &agent).await {
            Err(RuntimeError::CommitmentOrphaned {
                holder,
                holder_status,
                ..
            }) => {
                assert_eq!(
                    (holder.run_id, holder_status.as_str()),
                    (a.clone(), "abandoned")
                )
            }
            other => panic!("{store_kind}: expected an orphaned key, got {other:?}"),
        }
        assert_eq!(fx.effects(), 1);

        // The operator checked: the payment did not reach the provider.
        let released = rt
            .release_key(&key, "ops", Some("not in the provider's ledger".into()))
            .await
            .unwrap();
        assert_eq!(released.state, KeyState::Orphaned);
        let events = rt.events(&a).await.unwrap();
        match events.last() {
            Some(Event::KeyReleased(r)) => {
                assert_eq!((r.key.as_str(), r.by.as_str()), (key.as_str(), "ops"))
            }
            other => panic!("{store_kind}: expected key_released last, got {other:?}"),
        }
        assert_eq!(rt.state(&a).await.unwrap().status(), RunStatus::Abandoned);
        assert!(matches!(
            rt.key(&key).await,
            Err(RuntimeError::UnknownKey { .. })
        ));
        // b's next drive makes the call (b's wait was cut short, not its
        // claim: it simply tries again).
        let drove = tokio::time::timeout(Duration::from_secs(20), rt.drive(&b, &agent)).await;
        // write_then_sleep outlives its lease: the write happened, its
        // outcome is unknown, and it holds the key for b now.
        assert!(
            matches!(drove, Ok(Err(RuntimeError::NeedsReconciliation { .. }))),
            "{store_kind}: {drove:?}"
        );
        assert_eq!(fx.effects(), 2);
        let held = rt.key(&key).await.unwrap();
        assert_eq!((held.state, held.run_id), (KeyState::Held, b.clone()));
    }
}

/// Issue 36: a run stopped at a key another run orphaned is recorded and
/// left waiting, so `warden run` does not exit 2 ("nothing recorded"): it
/// exits 4, as a run waiting for a human, and the message names `keys
/// release` and then `runs resume` (the real binary).
#[test]
fn a_run_stopped_at_an_orphaned_key_exits_4_and_names_release_then_resume() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__write_then_sleep"
arguments = { path = "/workspace/effects.log", content = "paid\n", claim_id = "c-79" }

[[turns]]
text = "Paid."
"#;
    fx.agent(
        turns,
        "[plugins.hostile.grant.limits]\ntimeout = \"300ms\"\n[plugins.hostile.grant.tools.write_then_sleep]\nidempotency_key = \"claim_id\"\n",
    );
    let warden = |args: &[&str]| {
        std::process::Command::new(crate::binary::warden_binary())
            .args(args)
            .env("WARDEN_STORE", fx.path("runs.db"))
            .env(
                "WARDEN_CACHE_DIR",
                std::env::temp_dir().join("warden-tests-components"),
            )
            .env_remove("RUST_LOG")
            .current_dir(fx.dir.path())
            .output()
            .unwrap()
    };
    let out = warden(&["run", "agent.toml", "go", "--run-id", "a"]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = warden(&["runs", "abandon", "a", "--reason", "the provider is down"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = warden(&["run", "agent.toml", "go", "--run-id", "b"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("commitment"), "{stderr}");
    let release = stderr.find("warden keys release").expect(&stderr);
    let resume = stderr.find("warden runs resume b").expect(&stderr);
    assert!(release < resume, "{stderr}");
    // Recorded, and left waiting: not a refusal.
    let out = warden(&["runs", "events", "b"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("run_started"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(fx.effects(), 1);
}
