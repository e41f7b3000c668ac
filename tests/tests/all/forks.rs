//! Forks through the runtime on every store (in memory, SQLite,
//! PostgreSQL): a fork at each position of a recorded run reuses every
//! effect before it (model calls counted by a counting provider, writes by
//! the hostile guest's counter outside the sandbox) and asks again for a
//! later write; a write in flight at the fork point needs reconciliation;
//! an approval granted before the fork point for a call that had not run
//! is asked again; a changed agent and budgets are recorded and used; bad
//! positions write nothing; a fork cut short by a crash is refused until
//! it is made again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use warden::engine::StartOptions;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::json;
use warden::engine::events::{Event, ToolCallResult};
use warden::engine::{
    Agent, BudgetLimits, CallId, ForkOptions, ForkRefusal, ReplayError, ReplayOptions, RunId,
    RunStatus, Runtime, RuntimeError,
};
use warden::providers::{ModelProvider, ModelRequest, ModelStream};
use warden::store::{EventStore, MemoryStore, RunFilter, SqliteStore, StoreError};

use super::engine::{Fixture, READ_WRITE_FINISH, id, runtime};
use super::workers::PgSchema;
use warden::store::testing::{AppendVia, BeforeAppend, Hooks, Intercepted};

/// The scripted provider, counting the calls made to it.
struct Counting {
    inner: Arc<dyn ModelProvider>,
    calls: AtomicU64,
}

impl Counting {
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl ModelProvider for Counting {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.stream(request)
    }
}

/// The engine fixture's agent (read a file, append a line, finish) with
/// its write asking for approval, and a runtime over `store` counting the
/// model calls.
fn approving(fx: &Fixture, store: Arc<dyn EventStore>) -> (Agent, Runtime, Arc<Counting>) {
    fx.agent(READ_WRITE_FINISH, "");
    let text = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace(
            "approval = { fs = \"never\", flaky = \"never\", write_then_sleep = \"never\" }\n",
            "",
        );
    std::fs::write(fx.path("agent.toml"), text).unwrap();
    let agent = Agent::load(&fx.path("agent.toml"), None).unwrap();
    let counting = Arc::new(Counting {
        inner: agent.model.provider().unwrap(),
        calls: AtomicU64::new(0),
    });
    let rt = runtime(store).with_provider(counting.clone());
    (agent, rt, counting)
}

fn options<'a>(agent: &'a Agent, fork: &str) -> ForkOptions<'a> {
    ForkOptions {
        agent,
        source_agent: Some(agent),
        budgets: BudgetLimits::default(),
        run_id: Some(id(fork)),
        by: "ops".into(),
    }
}

fn awaiting(state: &warden::engine::RunState) -> CallId {
    match state.parked() {
        Some(warden::engine::state::Parked::Approval { call }) => call.call_id.clone(),
        other => panic!("not awaiting approval: {other:?}"),
    }
}

/// Records the source: approved, written, completed.
async fn record_source(rt: &Runtime, agent: &Agent, fx: &Fixture) -> RunId {
    let source = rt
        .start(agent, json!("go"), StartOptions::new().id(id("source")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&source, agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    let call = awaiting(&rt.state(&source).await.unwrap());
    rt.approve(&source, &call, "alice").await.unwrap();
    assert_eq!(
        rt.drive(&source, agent).await.unwrap(),
        RunStatus::Completed
    );
    assert_eq!(fx.effects(), 1);
    source
}

/// Forks the recorded run at each position before its end and drives each
/// fork to its end: the fork's first events are the source's bytes, no
/// inherited model or tool call is made again, a write not completed
/// before the fork point is asked for again (or, in flight there, needs
/// reconciliation), and every fork ends like the source and replays.
async fn a_fork_at_each_position(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let (agent, rt, counting) = approving(&fx, Arc::clone(&store));
    let source = record_source(&rt, &agent, &fx).await;
    let source_log = store.load(&source).await.unwrap();
    let source_events = rt.events(&source).await.unwrap();
    let source_output = rt.state(&source).await.unwrap().output().cloned();
    let model_calls = counting.calls();
    assert_eq!(model_calls, 3);
    let end = source_events
        .iter()
        .position(|e| matches!(e, Event::RunCompleted(_)))
        .unwrap();
    let write_call = source_events
        .iter()
        .find_map(|e| match e {
            Event::ToolCallIntent(i) if i.tool.plugin == "hostile" => Some(i.call_id.clone()),
            _ => None,
        })
        .unwrap();
    let write_output = source_events
        .iter()
        .find_map(|e| match e {
            Event::ToolCallCompleted(c) if c.call_id == write_call => match &c.result {
                ToolCallResult::Output(v) => Some(v.clone()),
                ToolCallResult::Error(e) => panic!("{e}"),
            },
            _ => None,
        })
        .unwrap();
    for at in 1..=end {
        let prefix = &source_events[..at];
        let has = |pick: &dyn Fn(&Event) -> bool| prefix.iter().any(pick);
        let write_done =
            has(&|e| matches!(e, Event::ToolCallCompleted(c) if c.call_id == write_call));
        let write_started =
            has(&|e| matches!(e, Event::ToolCallIntent(i) if i.call_id == write_call));
        let approved_not_run = prefix
            .last()
            .is_some_and(|e| matches!(e, Event::ApprovalGranted(_)));
        let models_done = prefix
            .iter()
            .filter(|e| matches!(e, Event::ModelCallCompleted(_)))
            .count() as u64;
        let (effects, calls) = (fx.effects(), counting.calls());
        let name = format!("fork-{at}");
        let fork = rt
            .fork(&source, at as u64, options(&agent, &name))
            .await
            .unwrap();
        assert_eq!(fork, id(&name));

        // The inherited events are the source's, byte for byte, then the
        // fork's own record of where it comes from.
        let log = store.load(&fork).await.unwrap();
        for (mine, theirs) in log[..at].iter().zip(&source_log[..at]) {
            assert_eq!(mine.bytes, theirs.bytes, "{name}: event {}", mine.seq);
        }
        let forked = match decode(&log[at].bytes) {
            Event::RunForked(f) => f,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(
            (forked.source_run.clone(), forked.position),
            (source.clone(), at as u64)
        );
        assert_eq!(forked.source_head, source_log[at - 1].hash.to_hex());
        assert!(forked.changed.is_empty(), "{name}: {:?}", forked.changed);
        assert_eq!(
            forked.withdrawn_approval.is_some(),
            approved_not_run,
            "{name}: an approval for a call that had not run is withdrawn"
        );
        assert!(rt.verify(&fork).await.unwrap().is_intact(), "{name}");

        // Drive the fork to its end like an operator would.
        let mut asked = 0;
        let mut resolved = false;
        let mut status = match rt.recover(&fork, &agent, ReplayOptions::default()).await {
            Ok(status) => status,
            Err(RuntimeError::NeedsReconciliation { write, .. }) => {
                assert_eq!(write.call_id, write_call, "{name}");
                RunStatus::NeedsReconciliation
            }
            Err(error) => panic!("{name}: {error}"),
        };
        loop {
            match status {
                RunStatus::Completed => break,
                RunStatus::AwaitingApproval => {
                    asked += 1;
                    let call = awaiting(&rt.state(&fork).await.unwrap());
                    rt.approve(&fork, &call, "bob").await.unwrap();
                }
                RunStatus::NeedsReconciliation => {
                    resolved = true;
                    // The human found the source's outcome and records it.
                    rt.resolve(
                        &fork,
                        write_output.clone(),
                        "ops",
                        Some("from the source".into()),
                    )
                    .await
                    .unwrap();
                }
                other => panic!("{name}: {other}"),
            }
            status = rt.drive(&fork, &agent).await.unwrap();
        }
        let new_write = !write_started;
        assert_eq!(
            fx.effects() - effects,
            usize::from(new_write),
            "{name}: the write ran in the fork only if it had not started before the fork point"
        );
        assert_eq!(
            asked,
            u32::from(new_write),
            "{name}: a new write is approved anew"
        );
        assert_eq!(resolved, write_started && !write_done, "{name}");
        assert_eq!(
            counting.calls() - calls,
            model_calls - models_done,
            "{name}: no inherited model call was made again"
        );
        let events = rt.events(&fork).await.unwrap();
        let after = &events[at + 1..];
        for e in after {
            if let Event::ToolCallIntent(i) = e {
                assert!(
                    !has(&|p| matches!(p, Event::ToolCallCompleted(c) if c.call_id == i.call_id)),
                    "{name}: {} ran again",
                    i.call_id
                );
                // A write in the fork ran after an approval given in the fork.
                if i.call_id == write_call {
                    assert!(
                        after
                            .iter()
                            .any(|e| matches!(e, Event::ApprovalGranted(g) if g.by == "bob"))
                    );
                }
            }
        }
        let state = rt.state(&fork).await.unwrap();
        assert_eq!(state.output().cloned(), source_output, "{name}");
        assert_eq!(state.run_id, fork);
        // The finished fork replays against its agent.
        assert_eq!(
            rt.recover(&fork, &agent, ReplayOptions::default())
                .await
                .unwrap(),
            RunStatus::Completed,
            "{name}"
        );
    }
    // The source is untouched.
    assert_eq!(store.load(&source).await.unwrap(), source_log);
}

fn decode(bytes: &Bytes) -> Event {
    warden::engine::decode(bytes).unwrap()
}

#[tokio::test]
async fn a_fork_at_each_position_reuses_every_earlier_effect_on_memory_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_fork_at_each_position(Arc::new(MemoryStore::new())).await;
    a_fork_at_each_position(Arc::new(
        SqliteStore::open(dir.path().join("runs.db")).unwrap(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_at_each_position_reuses_every_earlier_effect_on_postgres() {
    let Some(pg) = PgSchema::new("forks_each").await else {
        return;
    };
    a_fork_at_each_position(Arc::new(pg.store().await)).await;
}

/// A fork with other instructions and budgets records what changed, goes
/// on with the new agent (the old one is refused), and its requests after
/// the fork point carry the new instructions.
#[tokio::test]
async fn a_fork_records_what_the_operator_changed_and_goes_on_with_it() {
    let fx = Fixture::new();
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let (agent, rt, _) = approving(&fx, Arc::clone(&store));
    let source = record_source(&rt, &agent, &fx).await;
    let text = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace("Test the engine.", "Test the engine, carefully.");
    std::fs::write(fx.path("agent-b.toml"), text).unwrap();
    let changed = Agent::load(&fx.path("agent-b.toml"), None).unwrap();
    // After the first model call's completion.
    let events = rt.events(&source).await.unwrap();
    let at = events
        .iter()
        .position(|e| matches!(e, Event::ModelCallCompleted(_)))
        .unwrap()
        + 1;
    let fork = rt
        .fork(
            &source,
            at as u64,
            ForkOptions {
                agent: &changed,
                source_agent: Some(&agent),
                budgets: BudgetLimits {
                    steps: Some(10),
                    ..BudgetLimits::default()
                },
                run_id: Some(id("changed")),
                by: "ops".into(),
            },
        )
        .await
        .unwrap();
    let state = rt.state(&fork).await.unwrap();
    let forked = state.fork.clone().unwrap();
    assert_eq!(forked.changed, ["instructions", "budgets"]);
    assert_eq!(forked.agent_digest, changed.digest);
    assert_eq!(forked.limits.budgets.steps, Some(10));
    assert_eq!(state.limits.as_ref().unwrap().budgets.steps, Some(10));
    // The old agent may not continue it; the new one replays the
    // inherited events as facts and goes on.
    assert!(matches!(
        rt.drive(&fork, &agent).await,
        Err(RuntimeError::Replay {
            error: ReplayError::AgentChanged { .. },
            ..
        })
    ));
    let mut status = rt
        .recover(&fork, &changed, ReplayOptions::default())
        .await
        .unwrap();
    while status == RunStatus::AwaitingApproval {
        let call = awaiting(&rt.state(&fork).await.unwrap());
        rt.approve(&fork, &call, "bob").await.unwrap();
        status = rt.drive(&fork, &changed).await.unwrap();
    }
    assert_eq!(status, RunStatus::Completed);
    let hashes = |events: &[Event]| -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::ModelCallIntent(i) => Some(i.request_hash.to_string()),
                _ => None,
            })
            .collect()
    };
    let (theirs, mine) = (hashes(&events), hashes(&rt.events(&fork).await.unwrap()));
    assert_eq!(mine[0], theirs[0], "the inherited call is the source's");
    assert_ne!(
        mine[1], theirs[1],
        "the fork's calls carry the new instructions"
    );
    assert_eq!(
        rt.recover(&fork, &changed, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::Completed
    );
}

/// Positions outside the log, at or after the end, and another agent are
/// refused, naming why, and write nothing.
#[tokio::test]
async fn a_fork_outside_the_log_after_its_end_or_of_another_agent_writes_nothing() {
    let fx = Fixture::new();
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let (agent, rt, _) = approving(&fx, Arc::clone(&store));
    let source = record_source(&rt, &agent, &fx).await;
    let len = store.load(&source).await.unwrap().len() as u64;
    let refusal = |r: Result<RunId, RuntimeError>| match r {
        Err(RuntimeError::ForkRefused { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        refusal(rt.fork(&source, 0, options(&agent, "f0")).await),
        ForkRefusal::OutOfRange { at: 0, .. }
    ));
    assert!(matches!(
        refusal(rt.fork(&source, len + 1, options(&agent, "f1")).await),
        ForkRefusal::OutOfRange { .. }
    ));
    let ended = refusal(rt.fork(&source, len, options(&agent, "f2")).await);
    assert!(
        matches!(
            ended,
            ForkRefusal::AfterEnd {
                status: "completed",
                ..
            }
        ),
        "{ended}"
    );
    let mut other = agent.clone();
    other.name = "someone-else".into();
    assert!(matches!(
        refusal(rt.fork(&source, 2, options(&other, "f3")).await),
        ForkRefusal::OtherAgent { .. }
    ));
    assert_eq!(store.list(&RunFilter::new()).await.unwrap().len(), 1);
}

/// Fails the first append to the run `cut`: the fork's second write.
struct CutShort(AtomicU64);

#[async_trait]
impl Hooks for CutShort {
    async fn before_append(&self, _: AppendVia, run_id: &RunId, _: &[Bytes]) -> BeforeAppend {
        if run_id.as_str() == "cut" && self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return BeforeAppend::Fail(StoreError::Closed);
        }
        BeforeAppend::Write
    }
}

/// A crash between the fork's two writes leaves a one-event log naming the
/// source: every verb refuses it, and forking again with its id finishes
/// it.
#[tokio::test]
async fn a_fork_cut_short_is_refused_until_it_is_made_again() {
    let fx = Fixture::new();
    let store: Arc<dyn EventStore> = Arc::new(Intercepted {
        inner: Arc::new(MemoryStore::new()),
        hooks: CutShort(AtomicU64::new(0)),
    });
    let (agent, rt, _) = approving(&fx, Arc::clone(&store));
    let source = record_source(&rt, &agent, &fx).await;
    assert!(rt.fork(&source, 3, options(&agent, "cut")).await.is_err());
    assert_eq!(store.load(&id("cut")).await.unwrap().len(), 1);
    for refused in [
        rt.drive(&id("cut"), &agent).await.map(|_| ()),
        rt.recover(&id("cut"), &agent, ReplayOptions::default())
            .await
            .map(|_| ()),
        rt.cancel(&id("cut"), None, None).await,
    ] {
        assert!(
            matches!(refused, Err(RuntimeError::UnfinishedFork { ref source_run, .. }) if *source_run == source),
            "{refused:?}"
        );
    }
    assert_eq!(store.load(&id("cut")).await.unwrap().len(), 1);
    rt.fork(&source, 3, options(&agent, "cut")).await.unwrap();
    assert_eq!(store.load(&id("cut")).await.unwrap().len(), 4);
    assert_eq!(
        rt.recover(&id("cut"), &agent, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::AwaitingApproval
    );
}

/// A keyed write in flight at the fork point: the source holds (and here
/// settled) its commitment, so resolving it in the fork records the
/// outcome in the fork and leaves the source's commitment as it was; the
/// write never runs again.
#[tokio::test]
async fn a_keyed_write_inherited_in_flight_is_resolved_in_the_fork_without_touching_the_sources_key()
 {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "paid\n", claim_id = "claim-7" }

[[turns]]
text = "Paid."
"#;
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.tools.fs]\nidempotency_key = \"claim_id\"\n",
    );
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(Arc::clone(&store));
    let source = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("payer")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&source, &agent).await.unwrap(),
        RunStatus::Completed
    );
    assert_eq!(fx.effects(), 1);
    let events = rt.events(&source).await.unwrap();
    let at = events
        .iter()
        .position(|e| matches!(e, Event::ToolCallIntent(_)))
        .unwrap()
        + 1;
    let keys = store
        .commitments(&warden::store::CommitmentFilter::new())
        .await
        .unwrap();
    let fork = rt
        .fork(&source, at as u64, options(&agent, "payer-2"))
        .await
        .unwrap();
    assert!(matches!(
        rt.recover(&fork, &agent, ReplayOptions::default()).await,
        Err(RuntimeError::NeedsReconciliation { .. })
    ));
    rt.resolve(&fork, json!("paid, per the source"), "ops", None)
        .await
        .unwrap();
    assert_eq!(rt.drive(&fork, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1, "the write never ran again");
    assert_eq!(
        store
            .commitments(&warden::store::CommitmentFilter::new())
            .await
            .unwrap(),
        keys,
        "the source's commitment is as it was"
    );
}
