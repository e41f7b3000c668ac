//! Delivery channels in runs: the `channel` test guest (failing on purpose
//! a configured number of times) and the first-party `jsonl-channel`
//! writing a real file, over the in-memory store and SQLite. Deliveries are
//! recorded effects: intent, attempts, completion or failure; they never
//! change a run's result, go on after its terminal event, and are not
//! repeated by recovery once completed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use warden::engine::StartOptions;

use serde_json::{Value, json};
use warden::engine::events::DeliveryError;
use warden::engine::events::Event;
use warden::engine::{
    Agent, FixedClock, FixedRandom, ReplayOptions, RunId, RunStatus, Runtime, RuntimeError,
};
use warden::plugins::PluginHost;
use warden::store::{EventStore, MemoryStore, SqliteStore};
use warden_tests::guests;

use crate::engine::{CrashPoint, crashing_at_kind};
use crate::sandbox;
use crate::server::TestServer;

const NOW_MS: u64 = 1_700_000_000_000;

/// A directory with an `outbox/` folder, the `channel` test guest's
/// manifest, and a one-turn transcript.
struct Fixture {
    dir: tempfile::TempDir,
}

/// The model answers at once.
const ANSWER: &str = r#"
[[turns]]
text = "The answer is 42."
"#;

/// The model writes a file (a write: it needs approval), then answers.
const WRITE_THEN_ANSWER: &str = r#"
[[turns]]
text = "Writing the report."
[[turns.tool_calls]]
name = "fs__write_file"
arguments = { path = "report.md", content = "all good\n" }

[[turns]]
text = "I wrote report.md."
"#;

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["outbox", "work"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        crate::plugin_manifest(
            dir.path(),
            "test-channel",
            "channel",
            guests::CHANNEL,
            "[mounts.outbox]\naccess = \"read-write\"\n",
        );
        Fixture { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// An agent with the builtin `fs` plugin over `work/` and `plugins`
    /// and `channels` as given.
    fn agent(&self, turns: &str, rest: &str) -> Agent {
        std::fs::write(self.path("transcript.toml"), turns).unwrap();
        let text = format!(
            r#"
name = "notifier"
instructions = "Answer, then your channels tell people."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.fs]
source = "builtin:fs"
[plugins.fs.grant.mounts.workspace]
dir = "work"
{rest}
"#
        );
        std::fs::write(self.path("agent.toml"), text).unwrap();
        Agent::load(&self.path("agent.toml"), None).unwrap()
    }

    /// An agent whose channel `notify` is the test guest, configured with
    /// `config` (TOML lines) and the channel settings `settings`.
    fn guest_agent(&self, turns: &str, config: &str, settings: &str) -> Agent {
        self.agent(
            turns,
            &format!(
                r#"
[plugins.outbox]
source = "test-channel.toml"
[plugins.outbox.grant.mounts.outbox]
dir = "outbox"
[plugins.outbox.grant.config]
{config}

[channels.notify]
plugin = "outbox"
{settings}
"#
            ),
        )
    }

    /// An agent whose channel `notify` is `builtin:jsonl-channel` writing
    /// `outbox/<file>`.
    fn jsonl_agent(&self, turns: &str, file: &str, settings: &str) -> Agent {
        self.agent(
            turns,
            &format!(
                r#"
[plugins.jsonl]
source = "builtin:jsonl-channel"
[plugins.jsonl.grant.mounts.outbox]
dir = "outbox"
[plugins.jsonl.grant.config]
file = {file:?}

[channels.notify]
plugin = "jsonl"
{settings}
"#
            ),
        )
    }

    /// The JSON lines of `outbox/<file>` (none when it does not exist).
    fn lines(&self, file: &str) -> Vec<Value> {
        std::fs::read_to_string(self.path("outbox").join(file))
            .map(|text| {
                text.lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_hooks(Arc::new(FixedClock(NOW_MS)), Arc::new(FixedRandom(7)))
}

/// Both stores, fresh, in `dir`.
fn stores(dir: &Path) -> Vec<(&'static str, Arc<dyn EventStore>)> {
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

fn deliveries(events: &[Event]) -> Vec<&Event> {
    events.iter().filter(|e| e.is_delivery()).collect()
}

fn position_of(events: &[Event], kind: &str) -> usize {
    events
        .iter()
        .position(|e| e.kind().as_str() == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[tokio::test]
async fn a_channel_that_fails_twice_then_succeeds_records_three_attempts_and_delivers_one_line() {
    let fx = Fixture::new();
    for (name, store) in stores(fx.dir.path()) {
        let _ = std::fs::remove_file(fx.path("outbox/attempts"));
        let _ = std::fs::remove_file(fx.path("outbox/deliveries.jsonl"));
        let agent = fx.guest_agent(
            ANSWER,
            "fail_first = \"2\"",
            "max_attempts = 3\nbackoff = \"10ms\"\nbackoff_cap = \"15ms\"",
        );
        let rt = runtime(store);
        let run = rt
            .start(&agent, json!("What is the answer?"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        let events = rt.events(&run).await.unwrap();
        let completed = position_of(&events, "run_completed");
        let id = format!("{run}/notify/{completed}");
        let delivered = deliveries(&events);
        assert_eq!(delivered.len(), 4, "{name}: {delivered:#?}");
        match delivered[0] {
            Event::DeliveryIntent(i) => {
                assert_eq!(i.delivery_id, id);
                assert_eq!(i.channel, "notify");
                assert_eq!(i.kind, "completed");
                assert_eq!(i.source, completed as u64);
                assert_eq!(i.payload["agent"], "notifier");
                assert_eq!(i.payload["event"]["output"], "The answer is 42.");
            }
            other => panic!("{name}: {other:?}"),
        }
        // Each failed attempt records when the next is due: the backoff,
        // doubled, capped, from the injected clock.
        for (event, attempt, retry_at) in [
            (delivered[1], 1, NOW_MS + 10),
            (delivered[2], 2, NOW_MS + 15),
        ] {
            match event {
                Event::DeliveryAttemptFailed(f) => {
                    assert_eq!(f.delivery_id, id);
                    assert_eq!(f.attempt, attempt);
                    assert_eq!(f.retry_at_ms, retry_at, "{name}");
                    assert!(
                        matches!(&f.error, DeliveryError::Failed { retryable: true, message } if message.contains(&format!("attempt {attempt} fails"))),
                        "{name}: {:?}",
                        f.error
                    );
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        match delivered[3] {
            Event::DeliveryCompleted(c) => {
                assert_eq!(c.delivery_id, id);
                assert_eq!(c.attempt, 3);
                assert_eq!(c.receipt.outcome, warden::sandbox::Outcome::Ok);
            }
            other => panic!("{name}: {other:?}"),
        }
        let lines = fx.lines("deliveries.jsonl");
        assert_eq!(lines.len(), 1, "{name}: one line delivered: {lines:?}");
        assert_eq!(lines[0]["id"], id.as_str());
        assert_eq!(lines[0]["kind"], "completed");
        assert_eq!(lines[0]["payload"]["event"]["output"], "The answer is 42.");
        assert_eq!(
            std::fs::read_to_string(fx.path("outbox/attempts")).unwrap(),
            "3"
        );
        let state = rt.state(&run).await.unwrap();
        assert_eq!(state.deliveries.completed, 1);
        assert!(state.deliveries.in_flight.is_none());
        // Driving again delivers nothing more.
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        assert_eq!(rt.events(&run).await.unwrap().len(), events.len());
    }
}

#[tokio::test]
async fn a_channel_that_always_fails_leaves_the_result_unchanged_and_records_the_failure() {
    let fx = Fixture::new();
    for (name, store) in stores(fx.dir.path()) {
        let _ = std::fs::remove_file(fx.path("outbox/attempts"));
        let agent = fx.guest_agent(
            ANSWER,
            "fail_first = \"1000\"",
            "receives = [\"output\", \"failures\"]\nmax_attempts = 3\nbackoff = \"5ms\"",
        );
        let rt = runtime(store);
        let run = rt
            .start(&agent, json!("What is the answer?"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        let events = rt.events(&run).await.unwrap();
        let kinds: Vec<&str> = deliveries(&events)
            .iter()
            .map(|e| e.kind().as_str())
            .collect();
        assert_eq!(
            kinds,
            [
                "delivery_intent",
                "delivery_attempt_failed",
                "delivery_attempt_failed",
                "delivery_failed"
            ],
            "{name}"
        );
        match events.last().unwrap() {
            Event::DeliveryFailed(f) => {
                assert_eq!(f.attempts, 3);
                assert!(f.error.is_retryable(), "attempts ran out: {:?}", f.error);
                assert!(f.receipt.is_some());
            }
            other => panic!("{name}: {other:?}"),
        }
        let state = rt.state(&run).await.unwrap();
        assert_eq!(state.status(), RunStatus::Completed, "{name}");
        assert_eq!(state.deliveries.failed, 1);
        assert!(fx.lines("deliveries.jsonl").is_empty());
        assert_eq!(
            std::fs::read_to_string(fx.path("outbox/attempts")).unwrap(),
            "3"
        );
    }

    // A permanent error is given up at once: jsonl-channel denies a file
    // outside its mount.
    let agent = fx.jsonl_agent(ANSWER, "../escape.jsonl", "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("What is the answer?"), StartOptions::new())
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    match rt.events(&run).await.unwrap().last().unwrap() {
        Event::DeliveryFailed(f) => {
            assert_eq!(f.attempts, 1);
            assert!(
                matches!(&f.error, DeliveryError::Denied { message } if message.contains("inside the outbox mount")),
                "{:?}",
                f.error
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!fx.path("escape.jsonl").exists());
}

#[tokio::test]
async fn a_parked_notice_is_delivered_while_the_run_waits_for_approval() {
    let fx = Fixture::new();
    for (name, store) in stores(fx.dir.path()) {
        let file = format!("{name}.jsonl");
        let agent = fx.jsonl_agent(
            WRITE_THEN_ANSWER,
            &file,
            "receives = [\"parked\", \"output\"]",
        );
        let rt = runtime(store);
        let run = rt
            .start(&agent, json!("Write the report"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingApproval,
            "{name}"
        );
        let events = rt.events(&run).await.unwrap();
        let requested = position_of(&events, "approval_requested");
        let call_id = match &events[requested] {
            Event::ApprovalRequested(a) => a.call_id.clone(),
            other => panic!("{other:?}"),
        };
        let lines = fx.lines(&file);
        assert_eq!(lines.len(), 1, "{name}: {lines:?}");
        assert_eq!(lines[0]["kind"], "approval-requested");
        assert_eq!(lines[0]["id"], format!("{run}/notify/{requested}"));
        assert_eq!(lines[0]["run_id"], run.to_string());
        assert_eq!(
            lines[0]["payload"]["event"]["call_id"],
            call_id.to_string(),
            "{name}"
        );
        assert_eq!(
            lines[0]["payload"]["event"]["tool"]["tool"], "write_file",
            "{name}"
        );
        // The run is still parked: a delivery never changes its status.
        assert_eq!(
            rt.state(&run).await.unwrap().status(),
            RunStatus::AwaitingApproval
        );

        rt.approve(&run, &call_id, "tester").await.unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        let lines = fx.lines(&file);
        assert_eq!(lines.len(), 2, "{name}: {lines:?}");
        assert_eq!(lines[1]["kind"], "completed");
        assert_eq!(lines[1]["payload"]["event"]["output"], "I wrote report.md.");
        let state = rt.state(&run).await.unwrap();
        assert_eq!(state.deliveries.completed, 2);
        // The recorded log replays with the agent as it is.
        let events = rt.events(&run).await.unwrap();
        warden::engine::replay(
            &events,
            &view_of(&rt, &agent, &run).await,
            ReplayOptions::default(),
        )
        .unwrap();
    }
}

/// The agent's view, through a recovery that has nothing left to do.
async fn view_of(rt: &Runtime, agent: &Agent, run: &RunId) -> warden::engine::AgentView {
    // `recover` replays the log checked against the agent before it drives;
    // a completed run with nothing owed records nothing.
    let before = rt.events(run).await.unwrap().len();
    rt.recover(run, agent, ReplayOptions::default())
        .await
        .unwrap();
    assert_eq!(rt.events(run).await.unwrap().len(), before);
    let host = PluginHost::new(sandbox().clone());
    let mut tools = Vec::new();
    for p in &agent.plugins {
        let loaded = host.load(&p.source, &p.grant, &p.grant_base).await.unwrap();
        tools.push((p.key.clone(), loaded.tools().to_vec()));
    }
    let tools: Vec<(&str, &[warden::plugins::ToolDescriptor])> = tools
        .iter()
        .map(|(k, t)| (k.as_str(), t.as_slice()))
        .collect();
    warden::engine::AgentView::new(agent, &tools).unwrap()
}

/// A crash between a delivery's intent and its completion: recovery
/// delivers again with the same id (at least once, stable id). A crash
/// right after the completion was written: recovery delivers nothing.
#[tokio::test]
async fn recovery_redelivers_an_intent_without_completion_with_the_same_id_and_never_repeats_a_completed_one()
 {
    let fx = Fixture::new();
    for store_kind in ["memory", "sqlite"] {
        // The control run tells where the delivery's events are.
        let file = format!("{store_kind}-control.jsonl");
        let agent = fx.jsonl_agent(ANSWER, &file, "");
        let control = runtime(Arc::new(MemoryStore::new()));
        let run = RunId::new("chan-crash").unwrap();
        control
            .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
            .await
            .unwrap();
        control.drive(&run, &agent).await.unwrap();
        let control_events = control.events(&run).await.unwrap();
        let intent_at = position_of(&control_events, "delivery_intent");
        let completion_at = position_of(&control_events, "delivery_completed");
        assert_eq!(completion_at, control_events.len() - 1);
        let id = format!("{run}/notify/{}", intent_at - 1);

        for point in [CrashPoint::BeforeWrite, CrashPoint::AfterWrite] {
            let case = format!("{store_kind}, crash at the completion {point:?}");
            let file = format!("{store_kind}-{point:?}.jsonl");
            let agent = fx.jsonl_agent(ANSWER, &file, "");
            let inner: Arc<dyn EventStore> = match store_kind {
                "memory" => Arc::new(MemoryStore::new()),
                _ => Arc::new(SqliteStore::open(fx.path(&format!("crash-{point:?}.db"))).unwrap()),
            };
            let crashing = runtime(crashing_at_kind(inner.clone(), "delivery_completed", point));
            crashing
                .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
                .await
                .unwrap();
            let err = crashing.drive(&run, &agent).await.unwrap_err();
            assert!(err.to_string().contains("injected crash"), "{case}: {err}");
            drop(crashing);
            // The channel ran once before the crash.
            assert_eq!(fx.lines(&file).len(), 1, "{case}");
            let stored = inner.load(&run).await.unwrap().len();
            let expected_stored = match point {
                CrashPoint::BeforeWrite => completion_at,
                CrashPoint::AfterWrite => completion_at + 1,
            };
            assert_eq!(stored, expected_stored, "{case}");

            // A new process recovers the run: completed already, so only
            // the delivery can be owed.
            let rt = runtime(inner);
            let owed = rt.owed_delivery(&run, &agent).await.unwrap();
            match point {
                CrashPoint::BeforeWrite => {
                    assert_eq!(owed.map(|i| i.delivery_id), Some(id.clone()), "{case}")
                }
                CrashPoint::AfterWrite => assert_eq!(owed, None, "{case}"),
            }
            assert_eq!(
                rt.recover(&run, &agent, ReplayOptions::default())
                    .await
                    .unwrap(),
                RunStatus::Completed,
                "{case}"
            );
            let events = rt.events(&run).await.unwrap();
            let lines = fx.lines(&file);
            match point {
                CrashPoint::BeforeWrite => {
                    // Delivered again, with the same id: a reader drops the
                    // duplicate by id.
                    assert_eq!(lines.len(), 2, "{case}: {lines:?}");
                    assert_eq!(lines[0]["id"], id.as_str(), "{case}");
                    assert_eq!(lines[1]["id"], id.as_str(), "{case}");
                }
                CrashPoint::AfterWrite => {
                    assert_eq!(lines.len(), 1, "{case}: not delivered again");
                    assert_eq!(lines[0]["id"], id.as_str(), "{case}");
                }
            }
            // Either way the log has one intent and one completion, like
            // the uninterrupted run's.
            assert_eq!(events.len(), control_events.len(), "{case}");
            let kinds: Vec<&str> = deliveries(&events)
                .iter()
                .map(|e| e.kind().as_str())
                .collect();
            assert_eq!(kinds, ["delivery_intent", "delivery_completed"], "{case}");
            assert_eq!(rt.state(&run).await.unwrap().status(), RunStatus::Completed);
            assert_eq!(rt.owed_delivery(&run, &agent).await.unwrap(), None);
        }
    }
}

/// A process that dies right after `run_completed`, before the delivery's
/// intent: the run is finished but owes its delivery, and `warden runs
/// resume` makes it (and nothing else); a second resume has nothing to do.
#[tokio::test]
async fn runs_resume_makes_the_deliveries_a_finished_run_still_owes() {
    let fx = Fixture::new();
    let agent = fx.jsonl_agent(ANSWER, "owed.jsonl", "");
    let run = RunId::new("chan-owed").unwrap();
    let control = runtime(Arc::new(MemoryStore::new()));
    control
        .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    control.drive(&run, &agent).await.unwrap();
    let control_events = control.events(&run).await.unwrap();
    let completed = position_of(&control_events, "run_completed");
    std::fs::remove_file(fx.path("outbox/owed.jsonl")).unwrap();

    let inner: Arc<dyn EventStore> = Arc::new(SqliteStore::open(fx.path("runs.db")).unwrap());
    // The delivery intent's append, right after run_completed.
    let crashing = runtime(crashing_at_kind(
        inner.clone(),
        "delivery_intent",
        CrashPoint::BeforeWrite,
    ));
    crashing
        .start(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    assert!(crashing.drive(&run, &agent).await.is_err());
    drop(crashing);
    assert_eq!(inner.load(&run).await.unwrap().len(), completed + 1);
    let id = format!("{run}/notify/{completed}");
    let owed = runtime(inner.clone())
        .owed_delivery(&run, &agent)
        .await
        .unwrap();
    assert_eq!(owed.map(|i| i.delivery_id), Some(id.clone()));
    drop(inner);

    let warden = |args: &[&str]| {
        crate::kill::warden(args, fx.dir.path())
            .args(["--store", "runs.db"])
            .output()
            .unwrap()
    };
    let resume = || warden(&["runs", "resume", "chan-owed"]);
    // Listed as finished and owing its delivery, in text and JSON.
    let listed = |json: bool| {
        let out = warden(if json {
            &["runs", "list", "--json"]
        } else {
            &["runs", "list"]
        });
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        listed(false).contains("completed (owes 1 delivery)"),
        "{}",
        listed(false)
    );
    let runs: Value = serde_json::from_str(&listed(true)).unwrap();
    assert_eq!(runs[0]["owes_deliveries"], 1, "{runs}");
    let out = warden(&["runs", "show", "chan-owed"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("status: completed (owes 1 delivery)"),
        "{text}"
    );
    let out = warden(&["runs", "show", "chan-owed", "--json"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["owes_deliveries"], 1);

    let out = resume();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("✉ delivered {id} (attempt 1, ok")),
        "{text}"
    );
    assert!(text.contains("run chan-owed: completed"), "{text}");
    let lines = fx.lines("owed.jsonl");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["id"], id.as_str());
    let runs: Value = serde_json::from_str(&listed(true)).unwrap();
    assert_eq!(runs[0]["owes_deliveries"], 0, "{runs}");
    assert!(!listed(false).contains("owes"), "{}", listed(false));

    // Nothing is owed any more: the verb refuses a finished run as before.
    let out = resume();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already completed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fx.lines("owed.jsonl").len(), 1);
}

#[tokio::test]
async fn an_agent_naming_a_plugin_that_is_not_a_channel_is_refused_before_anything_is_recorded() {
    let fx = Fixture::new();
    let agent = fx.agent(ANSWER, "[channels.notify]\nplugin = \"fs\"\n");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone());
    let err = rt
        .start(&agent, json!("go"), StartOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Agent { message, .. } if message.contains("`channels.notify.plugin`") && message.contains("not a channel")),
        "{err}"
    );
    assert!(store.run_ids().await.unwrap().is_empty());
}

/// `builtin:webhook-channel` over real HTTP on loopback: a receiver that
/// answers 503 is retried and given up, one that answers 200 gets the
/// delivery once, its id as the `idempotency-key` header.
#[tokio::test]
async fn the_webhook_channel_posts_over_loopback_with_the_delivery_id_as_idempotency_key() {
    let server = TestServer::start().await;
    let fx = Fixture::new();
    let hook = |key: &str, path: &str| {
        format!(
            "[plugins.{key}]\nsource = \"builtin:webhook-channel\"\n[plugins.{key}.grant]\nhosts = [{:?}]\n[plugins.{key}.grant.config]\nurl = {:?}\ntimeout_ms = \"2000\"\n",
            server.grant(),
            server.url(path)
        )
    };
    let agent = fx.agent(
        ANSWER,
        &format!(
            "{}{}\n[channels.busy]\nplugin = \"busy\"\nmax_attempts = 2\nbackoff = \"5ms\"\n\n[channels.hook]\nplugin = \"hook\"\n",
            hook("busy", "/status/503"),
            hook("hook", "/echo"),
        ),
    );
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("What is the answer?"), StartOptions::new())
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    let events = rt.events(&run).await.unwrap();
    let completed = position_of(&events, "run_completed");
    let kinds: Vec<&str> = deliveries(&events)
        .iter()
        .map(|e| e.kind().as_str())
        .collect();
    // Channels in name order: `busy` first, then `hook`.
    assert_eq!(
        kinds,
        [
            "delivery_intent",
            "delivery_attempt_failed",
            "delivery_failed",
            "delivery_intent",
            "delivery_completed"
        ]
    );
    match deliveries(&events)[2] {
        Event::DeliveryFailed(f) => {
            assert_eq!(f.delivery_id, format!("{run}/busy/{completed}"));
            assert!(
                matches!(&f.error, DeliveryError::Rejected { status: 503, .. }),
                "{:?}",
                f.error
            );
        }
        other => panic!("{other:?}"),
    }
    let seen = server.seen();
    let busy: Vec<_> = seen.iter().filter(|s| s.path == "/status/503").collect();
    assert_eq!(busy.len(), 2, "two attempts reached the busy receiver");
    let echo: Vec<_> = seen.iter().filter(|s| s.path == "/echo").collect();
    assert_eq!(echo.len(), 1);
    assert_eq!(echo[0].method, "POST");
    let id = format!("{run}/hook/{completed}");
    assert_eq!(echo[0].header("idempotency-key"), Some(id.as_str()));
    let body: Value = serde_json::from_slice(&echo[0].body).unwrap();
    assert_eq!(body["payload"]["event"]["output"], "The answer is 42.");
    assert_eq!(body["kind"], "completed");
}
