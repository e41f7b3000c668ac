//! Policies end to end: native policies registered on the runtime and
//! enabled per agent, real plugins in the real sandbox, the scripted model,
//! both stores. A denial before a tool call is the call's result and the
//! tool never runs; feedback before finishing asks the model again; every
//! decision is recorded once, so neither a recovery after a crash nor a
//! replay with no policy registered asks again; a failing policy fails the
//! run closed without hurting the host.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::{Event, PolicyDecided, RunError};
use warden::engine::{
    Agent, Policy, PolicyDecision, PolicyError, PolicyHook, PolicyRequest, PolicySubject,
    PolicyVerdict, ReplayOptions, RunId, RunStatus, Runtime, RuntimeError, Step,
};
use warden::store::{EventStore, MemoryStore};

use crate::engine::{Fixture, READ_WRITE_FINISH, id, runtime, stores};

/// Denies every `append` through the hostile plugin's `fs` tool; counts
/// how often it is asked.
#[derive(Default)]
struct NoAppends {
    asked: AtomicUsize,
}

#[async_trait::async_trait]
impl Policy for NoAppends {
    async fn decide(&self, request: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(match &request.subject {
            PolicySubject::BeforeToolCall {
                tool, arguments, ..
            } if tool == "hostile__fs" && arguments["op"] == "append" => PolicyDecision::Deny {
                reason: "appending is not allowed here".into(),
            },
            _ => PolicyDecision::Allow,
        })
    }
}

/// Sends a final answer back until it mentions the input file.
#[derive(Default)]
struct MustCite {
    asked: AtomicUsize,
}

#[async_trait::async_trait]
impl Policy for MustCite {
    async fn decide(&self, request: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let PolicySubject::BeforeFinish { output, .. } = &request.subject else {
            return Err(PolicyError::new("asked at the wrong hook"));
        };
        Ok(
            if output.as_str().unwrap_or_default().contains("input.txt") {
                PolicyDecision::Allow
            } else {
                PolicyDecision::Feedback {
                    message: "name the file you read".into(),
                }
            },
        )
    }
}

struct Panics;

#[async_trait::async_trait]
impl Policy for Panics {
    async fn decide(&self, _: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
        panic!("the policy has a bug")
    }
}

/// The messages of the run's last recorded model request, as JSON text.
pub(crate) fn last_prompt(events: &[Event]) -> String {
    let Some(Event::ModelCallIntent(last)) = events
        .iter()
        .rev()
        .find(|e| matches!(e, Event::ModelCallIntent(_)))
    else {
        panic!("no model call");
    };
    let request = last.request.as_ref().expect("prompts are recorded");
    serde_json::to_string(&request.messages).unwrap()
}

fn decisions(events: &[Event]) -> Vec<&PolicyDecided> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PolicyDecided(d) => Some(d),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_denied_tool_call_never_runs_and_its_denial_is_the_result() {
    let fx = Fixture::new();
    let agent = fx.agent(
        READ_WRITE_FINISH,
        "[policies.no-appends]\nhooks = [\"before_tool_call\"]\n",
    );
    for (name, store) in stores(fx.dir.path()) {
        let policy = Arc::new(NoAppends::default());
        let rt = runtime(Arc::clone(&store))
            .with_record_prompts(true)
            .with_policy("no-appends", policy.clone());
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("deny")))
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        // The write never ran: no line in the effects log, no intent.
        assert_eq!(fx.effects(), 0, "{name}");
        let events = rt.events(&run).await.unwrap();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::ToolCallIntent(i) if i.tool.tool == "fs")),
            "{name}"
        );
        let decided = decisions(&events);
        assert_eq!(decided.len(), 2, "{name}: one decision per tool call");
        assert_eq!(decided[0].decision, PolicyVerdict::Allow);
        assert_eq!(decided[1].hook, PolicyHook::BeforeToolCall);
        assert_eq!(decided[1].call_id.as_ref().unwrap().to_string(), "call-2-1");
        assert_eq!(decided[1].decision, PolicyVerdict::Deny);
        assert_eq!(
            decided[1].reason.as_deref(),
            Some("appending is not allowed here")
        );
        assert_eq!(policy.asked.load(Ordering::SeqCst), 2);
        // The model saw the denial as the call's result.
        let seen = last_prompt(&events);
        assert!(
            seen.contains(
                "the call was denied by policy `no-appends`: appending is not allowed here"
            ),
            "{seen}"
        );
    }
    // The same call without the policy does run (the denial is the
    // policy's, not the plugin's).
    let plain = fx.agent(READ_WRITE_FINISH, "");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&plain, json!("go"), StartOptions::new().id(id("plain")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &plain).await.unwrap(), RunStatus::Completed);
    assert_eq!(fx.effects(), 1);
}

#[tokio::test]
async fn feedback_before_finishing_asks_the_model_again() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Done."

[[turns]]
text = "Done: I read input.txt."
"#;
    let agent = fx.agent(turns, "[policies.must-cite]\nhooks = [\"before_finish\"]\n");
    for (name, store) in stores(fx.dir.path()) {
        let policy = Arc::new(MustCite::default());
        let rt = runtime(Arc::clone(&store))
            .with_record_prompts(true)
            .with_policy("must-cite", policy.clone());
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("feedback")))
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        let events = rt.events(&run).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind().as_str()).collect();
        assert_eq!(
            kinds,
            [
                "run_started",
                "model_call_intent",
                "model_call_completed",
                "policy_decided",
                "model_call_intent",
                "model_call_completed",
                "policy_decided",
                "run_completed"
            ],
            "{name}"
        );
        let decided = decisions(&events);
        assert_eq!(decided[0].decision, PolicyVerdict::Feedback);
        assert_eq!(decided[0].step, Some(1));
        assert_eq!(decided[1].decision, PolicyVerdict::Allow);
        let Event::ModelCallIntent(second) = &events[4] else {
            panic!("{:?}", events[4]);
        };
        assert_eq!(second.step, 2);
        let seen = serde_json::to_string(&second.request.as_ref().unwrap().messages).unwrap();
        assert!(
            seen.contains("Policy `must-cite` sent your answer back: name the file you read"),
            "{seen}"
        );
        assert_eq!(
            rt.state(&run).await.unwrap().output(),
            Some(&json!("Done: I read input.txt."))
        );
        assert_eq!(policy.asked.load(Ordering::SeqCst), 2);
    }
}

/// Steps the run until its last event satisfies `stop`.
async fn step_until(rt: &Runtime, run: &RunId, agent: &Agent, stop: impl Fn(&Event) -> bool) {
    for _ in 0..50 {
        assert_eq!(rt.step(run, agent).await.unwrap(), Step::Progressed);
        if stop(rt.events(run).await.unwrap().last().unwrap()) {
            return;
        }
    }
    panic!("the run never got there");
}

#[tokio::test]
async fn recorded_decisions_are_never_asked_again_by_recovery_or_replay() {
    let fx = Fixture::new();
    let agent = fx.agent(
        READ_WRITE_FINISH,
        "[policies.no-appends]\nhooks = [\"before_tool_call\"]\n",
    );
    for (name, store) in stores(fx.dir.path()) {
        // A driver stops right after the first decision (an allow), before
        // the tool call it allows: the crash point between decision and
        // effect.
        let first = Arc::new(NoAppends::default());
        let rt = runtime(Arc::clone(&store)).with_policy("no-appends", first.clone());
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("crash")))
            .await
            .unwrap();
        step_until(&rt, &run, &agent, |e| matches!(e, Event::PolicyDecided(_))).await;
        assert_eq!(first.asked.load(Ordering::SeqCst), 1);
        // Recovery with a fresh policy: the recorded allow stands, only the
        // second call is asked about.
        let second = Arc::new(NoAppends::default());
        let rt = runtime(Arc::clone(&store)).with_policy("no-appends", second.clone());
        step_until(
            &rt,
            &run,
            &agent,
            |e| matches!(e, Event::PolicyDecided(d) if d.decision == PolicyVerdict::Deny),
        )
        .await;
        assert_eq!(second.asked.load(Ordering::SeqCst), 1, "{name}");
        let events = rt.events(&run).await.unwrap();
        assert!(
            events.iter().any(
                |e| matches!(e, Event::ToolCallCompleted(c) if c.call_id.to_string() == "call-1-1")
            ),
            "{name}: the allowed read ran"
        );
        // Now no policy is registered at all: recovery replays the log
        // (checking every decision) and finishes from the recorded denial.
        let bare = runtime(Arc::clone(&store));
        let status = bare
            .recover(&run, &agent, ReplayOptions::default())
            .await
            .unwrap();
        assert_eq!(status, RunStatus::Completed, "{name}");
        assert_eq!(fx.effects(), 0, "{name}");
        let events = bare.events(&run).await.unwrap();
        assert_eq!(decisions(&events).len(), 2, "{name}");
        // Replaying the finished run again changes nothing.
        assert_eq!(
            bare.recover(&run, &agent, ReplayOptions::default())
                .await
                .unwrap(),
            RunStatus::Completed
        );
        assert_eq!(bare.events(&run).await.unwrap(), events);
    }
}

/// Remembers the session each `run_start` was asked about.
#[derive(Default)]
struct Sessions {
    seen: std::sync::Mutex<Vec<Option<String>>>,
}

#[async_trait::async_trait]
impl Policy for Sessions {
    async fn decide(&self, request: &PolicyRequest) -> Result<PolicyDecision, PolicyError> {
        let PolicySubject::RunStart { session, input } = &request.subject else {
            return Err(PolicyError::new("asked at the wrong hook"));
        };
        self.seen.lock().unwrap().push(session.clone());
        Ok(if input == "forbidden" {
            PolicyDecision::Deny {
                reason: "not in this session".into(),
            }
        } else {
            PolicyDecision::Allow
        })
    }
}

#[tokio::test]
async fn the_run_start_hook_sees_the_session_and_a_denial_fails_the_run() {
    let fx = Fixture::new();
    let agent = fx.agent(
        "[[turns]]\ntext = \"Hello.\"\n",
        "[policies.sessions]\nhooks = [\"run_start\"]\n",
    );
    let policy = Arc::new(Sessions::default());
    let rt = runtime(Arc::new(MemoryStore::new())).with_policy("sessions", policy.clone());
    let session = warden::engine::SessionId::new("chat-1").unwrap();
    let first = rt
        .start(
            &agent,
            json!("hello"),
            StartOptions::new().session(session.clone()).id(id("s1")),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&first, &agent).await.unwrap(),
        RunStatus::Completed
    );
    let second = rt
        .start(
            &agent,
            json!("forbidden"),
            StartOptions::new().session(session.clone()).id(id("s2")),
        )
        .await
        .unwrap();
    assert_eq!(rt.drive(&second, &agent).await.unwrap(), RunStatus::Failed);
    let outside = rt
        .start(
            &agent,
            json!("hello"),
            StartOptions::new().id(id("outside")),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&outside, &agent).await.unwrap(),
        RunStatus::Completed
    );
    assert_eq!(
        *policy.seen.lock().unwrap(),
        [Some("chat-1".to_owned()), Some("chat-1".to_owned()), None]
    );
    let events = rt.events(&second).await.unwrap();
    let Some(Event::RunFailed(failed)) = events.last() else {
        panic!("{:?}", events.last());
    };
    assert_eq!(
        failed.error,
        RunError::PolicyDenied {
            policy: "sessions".into(),
            hook: PolicyHook::RunStart,
            reason: "not in this session".into(),
        }
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ModelCallIntent(_)))
    );
}

#[tokio::test]
async fn a_failing_policy_fails_the_run_closed_and_the_host_goes_on() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "[policies.buggy]\n");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(Arc::clone(&store)).with_policy("buggy", Arc::new(Panics));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("panics")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Failed);
    let events = rt.events(&run).await.unwrap();
    let decided = decisions(&events);
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].hook, PolicyHook::RunStart);
    assert_eq!(decided[0].decision, PolicyVerdict::Failed);
    assert_eq!(
        decided[0].reason.as_deref(),
        Some("the policy panicked: the policy has a bug")
    );
    let Some(Event::RunFailed(failed)) = events.last() else {
        panic!("{:?}", events.last());
    };
    assert_eq!(
        failed.error,
        RunError::PolicyFailed {
            policy: "buggy".into(),
            hook: PolicyHook::RunStart,
            message: "the policy panicked: the policy has a bug".into(),
        }
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ModelCallIntent(_)))
    );
    // The host is fine: the same runtime runs another agent.
    let plain = fx.agent(READ_WRITE_FINISH, "");
    let other = rt
        .start(&plain, json!("go"), StartOptions::new().id(id("after")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&other, &plain).await.unwrap(),
        RunStatus::Completed
    );
}

#[tokio::test]
async fn a_run_enabling_an_unregistered_policy_is_refused_before_anything_is_recorded() {
    let fx = Fixture::new();
    let agent = fx.agent(READ_WRITE_FINISH, "[policies.missing]\n");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(Arc::clone(&store));
    let err = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("refused")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::PolicyNotRegistered { policy, .. } if policy == "missing"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "agent `tester` enables policy `missing`, which is not registered on this runtime (set `plugin` in [policies.missing] to a policy plugin of the agent, or register it with Runtime::with_policy)"
    );
    assert!(store.run_ids().await.unwrap().is_empty());
}
