//! The run engine end to end: real plugins in the real sandbox, a scripted
//! model, and both stores (in-memory and SQLite). Crash tests stop a run at
//! every event boundary, at both crash points, and check that recovery
//! ends with the same log as an uninterrupted run and that no write ever
//! runs twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use warden::engine::StartOptions;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::json;
use warden::engine::events::Event;
use warden::engine::{
    Agent, CallId, FixedClock, FixedRandom, ReplayError, ReplayOptions, RunId, RunStatus,
    RunUpdate, Runtime, RuntimeError,
};
use warden::plugins::PluginHost;
use warden::store::{Durability, EventStore, MemoryStore, SqliteStore, StoreError};
use warden_tests::guests;

use crate::sandbox;
use warden::store::testing::{AppendVia, BeforeAppend, Hooks, Intercepted};

/// A directory with an agent whose plugins are the built-in fs plugin (the
/// `files` key, read-only over `work/`) and the hostile guest (the `hostile`
/// key, read-write over `work/`, its `fs` tool needing no approval unless
/// `approval` says otherwise).
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
}

impl Fixture {
    pub(crate) fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        std::fs::write(dir.path().join("work/input.txt"), "the input file\n").unwrap();
        crate::plugin_manifest(
            dir.path(),
            "hostile",
            "tool",
            guests::HOSTILE,
            "[mounts.workspace]\naccess = \"read-write\"\n[limits]\ntimeout = \"60s\"\n",
        );
        Fixture { dir }
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes the transcript and the agent file; returns the agent.
    pub(crate) fn agent(&self, turns: &str, extra: &str) -> Agent {
        std::fs::write(self.path("transcript.toml"), turns).unwrap();
        let text = format!(
            r#"
name = "tester"
instructions = "Test the engine."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.files]
source = "builtin:fs"
[plugins.files.grant.mounts.workspace]
dir = "work"
access = "read-only"

[plugins.hostile]
source = "hostile.toml"
approval = {{ fs = "never", flaky = "never", write_then_sleep = "never" }}
[plugins.hostile.grant.mounts.workspace]
dir = "work"
{extra}
"#
        );
        std::fs::write(self.path("agent.toml"), text).unwrap();
        Agent::load(&self.path("agent.toml"), None).unwrap()
    }

    /// Lines in the side-effect counter the `append` write adds to.
    pub(crate) fn effects(&self) -> usize {
        std::fs::read_to_string(self.path("work/effects.log"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

/// Read a file, append one line (a write), finish.
pub(crate) const READ_WRITE_FINISH: &str = r#"
[[turns]]
text = "Reading the input."
[[turns.tool_calls]]
name = "files__read_file"
arguments = { path = "input.txt" }

[[turns]]
text = "Recording the effect."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "effect\n" }

[[turns]]
text = "All done."
"#;

pub(crate) fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone())).with_hooks(
        Arc::new(FixedClock(1_700_000_000_000)),
        Arc::new(FixedRandom(7)),
    )
}

/// Both stores, fresh, in `dir`.
pub(crate) fn stores(dir: &Path) -> Vec<(&'static str, Arc<dyn EventStore>)> {
    vec![
        (
            "memory",
            Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
        ),
        (
            "sqlite",
            Arc::new(SqliteStore::open(dir.join("runs.db")).unwrap()) as Arc<dyn EventStore>,
        ),
    ]
}

pub(crate) fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

/// The log with the measured parts of receipts (time, fuel, memory) zeroed:
/// they are measurements of a lease, not decisions, and differ between two
/// executions of the same call.
pub(crate) fn normalized(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .cloned()
        .map(|mut e| {
            let receipt = match &mut e {
                Event::ToolCallCompleted(c) => Some(&mut c.receipt),
                Event::ApprovalRequested(a) => a.receipt.as_mut(),
                _ => None,
            };
            if let Some(r) = receipt {
                r.wall_time_us = 0;
                r.fuel_consumed = 0;
                r.peak_memory_bytes = 0;
            }
            // A child's use sums its receipts' fuel.
            if let Event::ChildFinished(f) = &mut e {
                f.usage.fuel = 0;
            }
            e
        })
        .collect()
}

#[tokio::test]
async fn a_run_calls_tools_and_completes_on_both_stores() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "");
    for (name, store) in stores(fx.dir.path()) {
        let rt = runtime(store.clone());
        let run = rt
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(id(&format!("run-{name}"))),
            )
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        let events = rt.events(&run).await.unwrap();
        assert_eq!(
            kinds(&events),
            [
                "run_started",
                "model_call_intent",
                "model_call_completed",
                "tool_call_intent",
                "tool_call_completed",
                "model_call_intent",
                "model_call_completed",
                "tool_call_intent",
                "tool_call_completed",
                "model_call_intent",
                "model_call_completed",
                "run_completed",
            ],
            "{name}"
        );
        match &events[4] {
            Event::ToolCallCompleted(c) => {
                assert!(c.receipt.fuel_consumed > 0);
                let out = serde_json::to_string(&c.result).unwrap();
                assert!(out.contains("the input file"), "{out}");
            }
            other => panic!("{other:?}"),
        }
        let summary = store.summary(&run).await.unwrap();
        assert_eq!(summary.status, "completed");
        assert_eq!(summary.event_count, 12);
        assert!(rt.verify(&run).await.unwrap().is_intact());
        // Driving a finished run does nothing.
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        assert_eq!(rt.events(&run).await.unwrap().len(), 12);
    }
    assert_eq!(fx.effects(), 2, "one write per store");
}

#[tokio::test]
async fn writes_wait_for_approval_and_a_denial_is_the_tools_result() {
    let fx = Fixture::new();
    fx.agent(READ_WRITE_FINISH, "");
    // The same agent, but its writes need approval (the default rule).
    let text = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace(
            "approval = { fs = \"never\", flaky = \"never\", write_then_sleep = \"never\" }\n",
            "",
        );
    std::fs::write(fx.path("agent-approve.toml"), text).unwrap();
    let agent = Agent::load(&fx.path("agent-approve.toml"), None).unwrap();
    let rt = runtime(Arc::new(MemoryStore::new()));

    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("approved")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    assert_eq!(fx.effects(), 0);
    let events = rt.events(&run).await.unwrap();
    let call_id = match events.last().unwrap() {
        Event::ApprovalRequested(a) => {
            // The preview came from the plugin's preflight.
            assert!(a.receipt.is_some());
            a.call_id.clone()
        }
        other => panic!("{other:?}"),
    };
    // Approving the wrong call, or approving twice, is refused.
    let wrong = CallId::new(9, 9);
    assert!(matches!(
        rt.approve(&run, &wrong, "alice").await,
        Err(RuntimeError::NotAwaitingApproval { .. })
    ));
    rt.approve(&run, &call_id, "alice").await.unwrap();
    assert!(matches!(
        rt.approve(&run, &call_id, "alice").await,
        Err(RuntimeError::NotParked { .. })
    ));
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);

    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("denied")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    rt.deny(&run, &call_id, "bob", "not today").await.unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1, "the denied write never ran");
    let state = rt.state(&run).await.unwrap();
    let denial = state
        .conversation()
        .iter()
        .map(|m| serde_json::to_string(m).unwrap())
        .find(|m| m.contains("not today"));
    assert!(denial.is_some(), "the model saw the denial");
}

#[tokio::test]
async fn a_human_tool_suspends_and_resume_validates_before_writing() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Asking."
[[turns.tool_calls]]
name = "ask"
arguments = { question = "how many?" }

[[turns]]
text = "Thanks."
"#;
    let agent = fx.agent(
        turns,
        "[human_tools.ask]\ndescription = \"Ask a human\"\nresponse_schema = '{\"type\": \"object\", \"required\": [\"count\"], \"properties\": {\"count\": {\"type\": \"integer\"}}}'\n",
    );
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("asked")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Suspended);
    let before = rt.events(&run).await.unwrap().len();
    for bad in [json!(null), json!({"count": "three"}), json!({})] {
        let err = rt
            .resume(&run, &agent, bad.clone(), None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, RuntimeError::InputRejected { .. }),
            "{bad}: {err}"
        );
    }
    assert_eq!(
        rt.events(&run).await.unwrap().len(),
        before,
        "nothing written"
    );
    rt.resume(&run, &agent, json!({"count": 3}), Some("carol".into()))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    // Resume on a run that is not parked is refused.
    assert!(matches!(
        rt.resume(&run, &agent, json!({"count": 3}), None).await,
        Err(RuntimeError::AlreadyTerminal { .. })
    ));
}

#[tokio::test]
async fn a_budget_parks_the_run_and_an_extension_resumes_it() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "[budgets]\nmax_tool_calls = 1\n");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("budget")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::BudgetExceeded
    );
    assert_eq!(fx.effects(), 0, "the second call never ran");
    match rt.events(&run).await.unwrap().last().unwrap() {
        Event::BudgetExceeded(b) => {
            assert_eq!((b.used, b.limit), (1, 1));
        }
        other => panic!("{other:?}"),
    }
    let err = rt
        .resume(&run, &agent, json!({"max_tool_calls": 1}), None)
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::InputRejected { .. }), "{err}");
    rt.resume(
        &run,
        &agent,
        json!({"max_tool_calls": 5}),
        Some("dave".into()),
    )
    .await
    .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
}

#[tokio::test]
async fn verbs_refuse_what_does_not_fit_and_write_nothing() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("verbs")))
        .await
        .unwrap();
    assert!(matches!(
        rt.start(&agent, json!("again"), StartOptions::new().id(id("verbs")))
            .await,
        Err(RuntimeError::AlreadyStarted { .. })
    ));
    assert!(matches!(
        rt.drive(&id("nope"), &agent).await,
        Err(RuntimeError::UnknownRun { .. })
    ));
    assert!(matches!(
        rt.resolve(&run, json!({}), "erin", None).await,
        Err(RuntimeError::NotReconcilable {
            status: RunStatus::Running,
            ..
        })
    ));
    assert!(matches!(
        rt.approve(&run, &CallId::new(1, 1), "erin").await,
        Err(RuntimeError::NotParked { .. })
    ));
    assert_eq!(rt.events(&run).await.unwrap().len(), 1);
    rt.abandon(&run, "tester", "changed my mind").await.unwrap();
    assert_eq!(rt.state(&run).await.unwrap().status(), RunStatus::Abandoned);
    assert!(matches!(
        rt.abandon(&run, "tester", "again").await,
        Err(RuntimeError::AlreadyTerminal { .. })
    ));
    assert!(matches!(
        rt.cancel(&run, None, None).await,
        Err(RuntimeError::AlreadyTerminal { .. })
    ));
}

#[tokio::test]
async fn recovering_with_a_changed_agent_is_refused_unless_accepted_and_divergence_is_named() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("changed")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);

    // The operator now calls the hostile plugin's tools reads: a different
    // agent digest, and a different effect class at the recorded write.
    let changed = fx.agent(
        READ_WRITE_FINISH,
        "[plugins.hostile.grant.tools.fs]\neffect = \"read\"\n",
    );
    assert_ne!(changed.digest, agent.digest);
    let err = rt
        .recover(&run, &changed, ReplayOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RuntimeError::Replay {
                error: ReplayError::AgentChanged { .. },
                ..
            }
        ),
        "{err}"
    );
    let err = rt
        .recover(
            &run,
            &changed,
            ReplayOptions {
                accept_agent_change: true,
            },
        )
        .await
        .unwrap_err();
    match &err {
        RuntimeError::Replay {
            error: ReplayError::Divergence { position, .. },
            ..
        } => assert_eq!(*position, 7, "the write's intent: {err}"),
        other => panic!("expected a divergence, got {other}"),
    }
    // The unchanged agent replays cleanly.
    assert_eq!(
        rt.recover(&run, &agent, ReplayOptions::default())
            .await
            .unwrap(),
        RunStatus::Completed
    );
}

#[tokio::test]
async fn a_tool_finds_its_own_intent_already_in_the_store() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Looking for my own intent in the store's write-ahead log."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "contains", path = "/workspace/runs.db-wal", needle = "\"tool_call_intent\",\"call_id\":\"call-1-1\"" }

[[turns]]
text = "Done."
"#;
    let agent = fx.agent(turns, "");
    // The store lives in the directory the plugin can read.
    let store = Arc::new(SqliteStore::open(fx.path("work/runs.db")).unwrap());
    let rt = runtime(store);
    let run = rt
        .start(
            &agent,
            json!("go"),
            StartOptions::new().id(id("write-ahead")),
        )
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    match &rt.events(&run).await.unwrap()[4] {
        Event::ToolCallCompleted(c) => {
            let result = serde_json::to_value(&c.result).unwrap();
            assert_eq!(result["output"]["contains"], true, "{result}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn cancelling_interrupts_an_in_flight_lease_and_is_recorded() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Sleeping."
[[turns.tool_calls]]
name = "hostile__sleep_forever"

[[turns]]
text = "Never reached."
"#;
    let agent = fx.agent(
        turns,
        "[plugins.hostile.grant.tools.sleep_forever]\neffect = \"read\"\n",
    );
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("cancelled")))
        .await
        .unwrap();
    let mut updates = rt.subscribe(&run);
    let driver = {
        let (rt, run, agent) = (rt.clone(), run.clone(), agent.clone());
        tokio::spawn(async move { rt.drive(&run, &agent).await })
    };
    // Wait until the tool call is in flight.
    loop {
        match updates.next().await.unwrap() {
            RunUpdate::Event { event, .. } if matches!(*event, Event::ToolCallIntent(_)) => break,
            _ => {}
        }
    }
    rt.cancel(&run, Some("ops"), Some("operator stop".into()))
        .await
        .unwrap();
    assert_eq!(driver.await.unwrap().unwrap(), RunStatus::Cancelled);
    match rt.events(&run).await.unwrap().last().unwrap() {
        Event::RunCancelled(c) => {
            assert_eq!(c.reason.as_deref(), Some("operator stop"));
            // The driver that stops records who asked, not only why.
            assert_eq!(c.by.as_deref(), Some("ops"));
            assert_eq!(c.unresolved_write, None, "the call was a read");
        }
        other => panic!("{other:?}"),
    }

    // A run nobody drives is cancelled by recording it.
    let idle = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("idle")))
        .await
        .unwrap();
    rt.cancel(&idle, None, None).await.unwrap();
    assert_eq!(
        rt.state(&idle).await.unwrap().status(),
        RunStatus::Cancelled
    );
}

#[tokio::test]
async fn subscribers_see_every_event_in_order_and_text_before_its_completion() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = id("watched");
    let mut updates = rt.subscribe(&run);
    rt.start(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    rt.drive(&run, &agent).await.unwrap();
    let mut seqs = Vec::new();
    let mut saw_delta_for_step_1 = false;
    while seqs.len() < 12 {
        match updates.next().await.unwrap() {
            RunUpdate::Event { seq, event } => {
                if let Event::ModelCallCompleted(c) = &*event
                    && c.step == 1
                {
                    assert!(saw_delta_for_step_1, "the delta came before the completion");
                }
                seqs.push(seq);
            }
            RunUpdate::TextDelta { step: 1, text } => {
                assert!(!text.is_empty());
                saw_delta_for_step_1 = true;
            }
            RunUpdate::TextDelta { .. } => {}
            RunUpdate::Lagged { missed } => panic!("lagged by {missed}"),
        }
    }
    assert_eq!(seqs, (1..=12).collect::<Vec<u64>>());
}

// ---- crash tests ----

/// Where an injected crash strikes an append.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum CrashPoint {
    /// The append never reaches the store.
    BeforeWrite,
    /// The append is durable, but the driver dies before it learns so.
    AfterWrite,
}

/// Crashes the driver at the `at`-th append (counting from 0) of `run`, or
/// of any run when `None`; from then on every append fails, whichever run
/// makes it, as none can once the process is gone.
pub(crate) struct CrashAt {
    pub(crate) run: Option<RunId>,
    pub(crate) appends: AtomicU64,
    pub(crate) crashed: AtomicBool,
    pub(crate) at: u64,
    pub(crate) point: CrashPoint,
}

/// A store whose `at`-th append, of any run, crashes the driver at `point`.
pub(crate) fn crashing(
    inner: Arc<dyn EventStore>,
    at: u64,
    point: CrashPoint,
) -> Arc<Intercepted<CrashAt>> {
    crashing_in(inner, None, at, point)
}

/// A store whose `at`-th append of `run` (or of any run, when `None`)
/// crashes the driver at `point`.
pub(crate) fn crashing_in(
    inner: Arc<dyn EventStore>,
    run: Option<RunId>,
    at: u64,
    point: CrashPoint,
) -> Arc<Intercepted<CrashAt>> {
    Arc::new(Intercepted {
        inner,
        hooks: CrashAt {
            run,
            appends: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            at,
            point,
        },
    })
}

fn crash() -> StoreError {
    StoreError::Backend {
        context: "append".into(),
        error: Box::new(std::io::Error::other("injected crash")),
    }
}

#[async_trait]
impl Hooks for CrashAt {
    async fn before_append(&self, _: AppendVia, run_id: &RunId, _: &[Bytes]) -> BeforeAppend {
        if self.crashed.load(Ordering::SeqCst) {
            return BeforeAppend::Fail(crash());
        }
        if self.run.as_ref().is_some_and(|run| run != run_id) {
            return BeforeAppend::Write;
        }
        let n = self.appends.fetch_add(1, Ordering::SeqCst);
        if n < self.at {
            return BeforeAppend::Write;
        }
        self.crashed.store(true, Ordering::SeqCst);
        if n == self.at && self.point == CrashPoint::AfterWrite {
            BeforeAppend::WriteThenFail(crash())
        } else {
            BeforeAppend::Fail(crash())
        }
    }
}

/// Crashes the driver at its first append carrying an event of `kind`.
pub(crate) struct CrashAtKind {
    pub(crate) kind: &'static str,
    pub(crate) point: CrashPoint,
}

#[async_trait]
impl Hooks for CrashAtKind {
    async fn before_append(&self, _: AppendVia, _: &RunId, events: &[Bytes]) -> BeforeAppend {
        let carries = events.iter().any(|bytes| {
            warden::engine::events::decode(bytes).is_ok_and(|e| e.kind().as_str() == self.kind)
        });
        match (carries, self.point) {
            (false, _) => BeforeAppend::Write,
            (true, CrashPoint::AfterWrite) => BeforeAppend::WriteThenFail(crash()),
            (true, CrashPoint::BeforeWrite) => BeforeAppend::Fail(crash()),
        }
    }
}

/// A store whose first append carrying an event of `kind` crashes the
/// driver at `point` (appends may carry several events, so a position in
/// the log does not name an append).
pub(crate) fn crashing_at_kind(
    inner: Arc<dyn EventStore>,
    kind: &'static str,
    point: CrashPoint,
) -> Arc<Intercepted<CrashAtKind>> {
    Arc::new(Intercepted {
        inner,
        hooks: CrashAtKind { kind, point },
    })
}

/// Counts the appends made through it, of any kind, run by run.
#[derive(Default)]
pub(crate) struct AppendCount(Mutex<BTreeMap<RunId, u64>>);

impl AppendCount {
    /// The appends of every run.
    pub(crate) fn total(&self) -> u64 {
        self.0.lock().unwrap().values().sum()
    }

    /// The appends of each run that made any.
    pub(crate) fn per_run(&self) -> BTreeMap<RunId, u64> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl Hooks for AppendCount {
    async fn before_append(&self, _: AppendVia, run_id: &RunId, _: &[Bytes]) -> BeforeAppend {
        *self.0.lock().unwrap().entry(run_id.clone()).or_default() += 1;
        BeforeAppend::Write
    }
}

/// A memory store that counts the appends made to it.
pub(crate) fn counting() -> Arc<Intercepted<AppendCount>> {
    Arc::new(Intercepted {
        inner: Arc::new(MemoryStore::new()),
        hooks: AppendCount::default(),
    })
}

/// For every append of the control run and both crash points: crash there,
/// recover, and check the outcome.
#[tokio::test]
async fn a_crash_at_every_event_boundary_recovers_to_the_same_log_and_no_write_runs_twice() {
    for store_kind in ["memory", "sqlite"] {
        let fx = Fixture::new();
        let agent = fx.agent(READ_WRITE_FINISH, "");
        let control_store = counting();
        let control_rt = runtime(control_store.clone());
        let run = id("crash");
        control_rt
            .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
            .await
            .unwrap();
        assert_eq!(
            control_rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed
        );
        let control = normalized(&control_rt.events(&run).await.unwrap());
        // Each append may carry more than one event: the crash cases are
        // the appends the run made, not its events.
        let appends = control_store.hooks.total();
        std::fs::remove_file(fx.path("work/effects.log")).unwrap();

        let mut reconciled = 0;
        for at in 0..appends {
            for point in [CrashPoint::BeforeWrite, CrashPoint::AfterWrite] {
                let case = format!("{store_kind}: crash at append {at} {point:?}");
                let _ = std::fs::remove_file(fx.path("work/effects.log"));
                let inner: Arc<dyn EventStore> = match store_kind {
                    "memory" => Arc::new(MemoryStore::new()),
                    _ => Arc::new(
                        SqliteStore::open(fx.path(&format!("crash-{at}-{point:?}.db"))).unwrap(),
                    ),
                };
                let crashing = runtime(crashing(inner.clone(), at, point));
                crashing
                    .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
                    .await
                    .unwrap();
                let err = crashing.drive(&run, &agent).await.unwrap_err();
                assert!(err.to_string().contains("injected crash"), "{case}: {err}");
                drop(crashing);

                // A new process: recover from what the store holds.
                let rt = runtime(inner);
                match rt.recover(&run, &agent, ReplayOptions::default()).await {
                    Ok(status) => {
                        assert_eq!(status, RunStatus::Completed, "{case}");
                        let log = normalized(&rt.events(&run).await.unwrap());
                        assert_eq!(log, control, "{case}");
                        assert_eq!(fx.effects(), 1, "{case}: the write ran exactly once");
                    }
                    Err(RuntimeError::NeedsReconciliation { write, .. }) => {
                        reconciled += 1;
                        assert_eq!(write.tool.tool, "fs", "{case}");
                        assert_eq!(write.arguments["op"], "append", "{case}");
                        let ran = fx.effects();
                        assert!(ran <= 1, "{case}");
                        // Every automatic verb refuses it.
                        assert!(matches!(
                            rt.drive(&run, &agent).await,
                            Err(RuntimeError::NeedsReconciliation { .. })
                        ));
                        // A human checks the counter and records what happened.
                        rt.resolve(&run, json!({ "appended": ran * 7 }), "tester", None)
                            .await
                            .unwrap();
                        assert_eq!(
                            rt.recover(&run, &agent, ReplayOptions::default())
                                .await
                                .unwrap(),
                            RunStatus::Completed,
                            "{case}"
                        );
                        assert_eq!(fx.effects(), ran, "{case}: the write was never run again");
                    }
                    Err(other) => panic!("{case}: {other}"),
                }
            }
        }
        // The write's intent and completion boundaries, at both points, are
        // the cases that need a human: after the intent was written (the
        // effect did not run) and before its completion was written (it
        // did).
        assert_eq!(reconciled, 2, "{store_kind}");
    }
}

// ---- durability: which appends wait for the disk ----

/// Each append: the kinds of its events, and how durable it asked to be.
#[derive(Default)]
struct Durabilities(std::sync::Mutex<Vec<(Vec<&'static str>, Durability)>>);

impl Hooks for Durabilities {
    fn durability(&self, _: &RunId, events: &[Bytes], durability: Durability) {
        let kinds = events
            .iter()
            .map(|bytes| {
                let event = warden::engine::events::decode(bytes).unwrap();
                event.kind().as_str()
            })
            .collect();
        self.0.lock().unwrap().push((kinds, durability));
    }
}

/// The run of `agent`, driven on a memory store until it ends or parks
/// with `status`: what each append carried and asked of the disk.
async fn appends_of(agent: &Agent, status: RunStatus) -> Vec<(Vec<&'static str>, Durability)> {
    let store = Arc::new(Intercepted {
        inner: Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
        hooks: Durabilities::default(),
    });
    let rt = runtime(store.clone());
    let run = rt
        .start(agent, json!("go"), StartOptions::new().id(id("durable")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, agent).await.unwrap(), status);
    store.hooks.0.lock().unwrap().clone()
}

/// The run of `turns`, driven to completion: what each append carried and
/// asked of the disk, and how many times the write ran.
async fn durabilities(turns: &str) -> (Vec<(Vec<&'static str>, Durability)>, usize) {
    let fx = Fixture::new();
    let seen = appends_of(&fx.agent(turns, ""), RunStatus::Completed).await;
    (seen, fx.effects())
}

/// An event after which the run only decides rides with the next append:
/// a model call's completion with the intents (or the end) it leads to, a
/// tool call's completion with the next model call's intent. Only what the
/// run can lose in a machine crash and make again without harm is
/// deferred: a model call's completion, a read's intent and completion. A
/// write's intent is synced before it runs, its completion before the next
/// effect; so are every model call's intent and the end. A turn calling a
/// read costs two appends and one fsync, a turn calling a write two of
/// each.
#[tokio::test]
async fn only_what_a_run_can_make_again_waits_for_the_next_sync() {
    use Durability::{Deferred as D, Synced as S};
    let (seen, effects) = durabilities(READ_WRITE_FINISH).await;
    assert_eq!(effects, 1);
    assert_eq!(
        seen,
        [
            (vec!["model_call_intent"], S),
            (vec!["model_call_completed", "tool_call_intent"], D), // the read
            (vec!["tool_call_completed", "model_call_intent"], S),
            // The write's intent, before it runs.
            (vec!["model_call_completed", "tool_call_intent"], S),
            (vec!["tool_call_completed", "model_call_intent"], S),
            (vec!["model_call_completed", "run_completed"], S),
        ]
    );
    // A write followed by a read in the same turn: the write's completion
    // is synced with the read's intent, before the read runs.
    let (seen, effects) = durabilities(
        r#"
[[turns]]
text = "Both."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "effect\n" }
[[turns.tool_calls]]
name = "files__read_file"
arguments = { path = "input.txt" }

[[turns]]
text = "All done."
"#,
    )
    .await;
    assert_eq!(effects, 1);
    assert_eq!(
        seen,
        [
            (vec!["model_call_intent"], S),
            (vec!["model_call_completed", "tool_call_intent"], S),
            (vec!["tool_call_completed", "tool_call_intent"], S), // a read runs next
            (vec!["tool_call_completed", "model_call_intent"], S),
            (vec!["model_call_completed", "run_completed"], S),
        ]
    );
}

/// A write's completion, held, is written and synced before a step that
/// starts an effect before its own first append: here the preview a tool
/// needing approval runs in a lease of its own before the request is
/// recorded.
#[tokio::test]
async fn a_held_write_completion_is_synced_before_an_approval_preview_runs() {
    use Durability::Synced as S;
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Write, then read."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "append", path = "/workspace/effects.log", content = "effect\n" }
[[turns.tool_calls]]
name = "files__read_file"
arguments = { path = "input.txt" }
"#;
    let agent = fx.agent(turns, "[plugins.files.approval]\nread_file = \"always\"\n");
    let seen = appends_of(&agent, RunStatus::AwaitingApproval).await;
    assert_eq!(fx.effects(), 1);
    assert_eq!(
        seen,
        [
            (vec!["model_call_intent"], S),
            (vec!["model_call_completed", "tool_call_intent"], S),
            // Alone: the preview is next, and it appends only after.
            (vec!["tool_call_completed"], S),
            (vec!["approval_requested"], S),
        ]
    );
}

/// The SQLite store commits the deferred appends without an fsync: a run
/// of read turns costs one synced commit per model call (its intent) and
/// one for the end; a run of write turns one more per write (its intent).
#[tokio::test]
async fn on_sqlite_a_read_turn_costs_one_fsync_and_a_write_turn_two() {
    let fx = Fixture::new();
    let read = "[[turns]]\ntext = \"Reading.\"\n[[turns.tool_calls]]\nname = \"files__read_file\"\narguments = { path = \"input.txt\" }\n\n";
    let write = "[[turns]]\ntext = \"Writing.\"\n[[turns.tool_calls]]\nname = \"hostile__fs\"\narguments = { op = \"append\", path = \"/workspace/effects.log\", content = \"effect\\n\" }\n\n";
    let done = "[[turns]]\ntext = \"All done.\"\n";
    for (name, turn, synced_per_turn) in [("read", read, 1), ("write", write, 2)] {
        const TURNS: u64 = 5;
        let agent = fx.agent(&format!("{}{done}", turn.repeat(TURNS as usize)), "");
        let store = Arc::new(SqliteStore::open(fx.path(&format!("{name}.db"))).unwrap());
        let rt = runtime(store.clone());
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id(name)))
            .await
            .unwrap();
        let before = store.stats();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        let after = store.stats();
        let commits = after.transactions - before.transactions;
        let deferred = after.deferred_transactions - before.deferred_transactions;
        // The first model call's intent; per tool turn the model's
        // completion with the call's intent, and the call's completion with
        // the next model call's intent; the last completion with the end.
        assert_eq!(commits, 2 * TURNS + 2, "{name}");
        // The tool turns, the last model call and the end.
        assert_eq!(
            commits - deferred,
            TURNS * synced_per_turn + 2,
            "{name}: {commits} commits, {deferred} deferred"
        );
    }
}

#[tokio::test]
async fn the_demo_agent_runs_offline_with_approval() {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for entry in ["notes.toml", "notes.transcript.toml"] {
        std::fs::copy(examples.join(entry), dir.path().join(entry)).unwrap();
    }
    copy_dir(&examples.join("notes"), &dir.path().join("notes"));
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let agent = Agent::load(&dir.path().join("notes.toml"), None).unwrap();
    let rt = Runtime::new(
        Arc::new(MemoryStore::new()),
        PluginHost::new(sandbox().clone()),
    );
    let run = rt
        .start(&agent, json!("Summarise my notes"), StartOptions::new())
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    let call = match rt.events(&run).await.unwrap().last().unwrap() {
        Event::ApprovalRequested(a) => a.call_id.clone(),
        other => panic!("{other:?}"),
    };
    rt.approve(&run, &call, "test").await.unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert!(dir.path().join("notes/SUMMARY.md").exists());
    // The final output was delivered to the JSONL file, once.
    let text = std::fs::read_to_string(dir.path().join("out/deliveries.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!(lines[0]["kind"], "completed");
    assert_eq!(lines[0]["run_id"], run.to_string());
    assert_eq!(
        lines[0]["payload"]["event"]["output"],
        "I wrote SUMMARY.md: the folder holds one todo list with three open items."
    );
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

#[tokio::test]
async fn step_performs_one_logical_operation_at_a_time() {
    use warden::engine::Step;
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("stepped")))
        .await
        .unwrap();
    let mut lengths = vec![rt.events(&run).await.unwrap().len()];
    while let Step::Progressed = rt.step(&run, &agent).await.unwrap() {
        lengths.push(rt.events(&run).await.unwrap().len());
    }
    // Each model or tool call is one step (intent + completion); finishing is
    // one more.
    assert_eq!(lengths, [1, 3, 5, 7, 9, 11, 12]);
    assert_eq!(rt.state(&run).await.unwrap().status(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
}
