//! Typed results end to end: an agent with an output schema, the scripted
//! model, real plugins and both stores. A final answer is validated; a
//! violation goes back to the model once, a second one fails the run; a
//! host finishes a run with its own output through `finish_with`; each log
//! replays (recovery with a fresh runtime checks every decision again).

use std::sync::Arc;
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::{Event, RunError};
use warden::engine::{ReplayOptions, RunStatus, Runtime, RuntimeError, Step};
use warden::store::EventStore;

use crate::engine::Fixture;

const SCHEMA: &str = r#"output_schema = '{"type": "object", "properties": {"lines": {"type": "integer"}, "first": {"type": "string"}}, "required": ["lines", "first"]}'"#;

/// Reads the input file with the real fs plugin, then answers with each of
/// `answers` in turn.
fn transcript(answers: &[&str]) -> String {
    let mut t = String::from(
        "[[turns]]\ntext = \"Reading.\"\n[[turns.tool_calls]]\nname = \"files__read_file\"\narguments = { path = \"input.txt\" }\n",
    );
    for a in answers {
        t.push_str(&format!("[[turns]]\ntext = '{a}'\n"));
    }
    t
}

/// The agent with the schema, from `Fixture::agent` (which puts extra keys
/// after its tables, so the schema goes at the top of the file).
fn typed_agent(fx: &Fixture, answers: &[&str]) -> warden::engine::Agent {
    let agent = fx.agent(&transcript(answers), "");
    let path = fx.path("agent.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{SCHEMA}\n{text}")).unwrap();
    let typed = warden::engine::Agent::load(&path, None).unwrap();
    assert_ne!(typed.digest, agent.digest);
    typed
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind().as_str()).collect()
}

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    crate::engine::runtime(store)
}

/// Recovering the finished run with a fresh runtime replays every recorded
/// decision against the agent and leaves the log as it was.
async fn replays(store: Arc<dyn EventStore>, run: &str, agent: &warden::engine::Agent) {
    let rt = runtime(Arc::clone(&store));
    let run = crate::engine::id(run);
    let before = rt.events(&run).await.unwrap();
    let status = rt
        .recover(&run, agent, ReplayOptions::default())
        .await
        .unwrap();
    assert!(status.is_terminal(), "{status}");
    assert_eq!(rt.events(&run).await.unwrap(), before);
}

#[tokio::test]
async fn a_valid_final_answer_is_the_runs_json_output() {
    let fx = Fixture::new();
    let agent = typed_agent(&fx, &[r#"{"lines": 1, "first": "the input file"}"#]);
    for (name, store) in crate::engine::stores(fx.dir.path()) {
        let rt = runtime(Arc::clone(&store));
        let run = rt
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(crate::engine::id("valid")),
            )
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        let state = rt.state(&run).await.unwrap();
        assert_eq!(
            state.output(),
            Some(&json!({"lines": 1, "first": "the input file"})),
            "{name}"
        );
        let events = rt.events(&run).await.unwrap();
        assert!(!kinds(&events).contains(&"output_rejected"), "{name}");
        replays(store, "valid", &agent).await;
    }
}

#[tokio::test]
async fn an_invalid_answer_goes_back_once_and_the_corrected_one_completes() {
    let fx = Fixture::new();
    let agent = typed_agent(
        &fx,
        &[
            "The file has one line.",
            r#"{"lines": 1, "first": "the input file"}"#,
        ],
    );
    for (name, store) in crate::engine::stores(fx.dir.path()) {
        let rt = runtime(Arc::clone(&store)).with_record_prompts(true);
        let run = rt
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(crate::engine::id("again")),
            )
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        let events = rt.events(&run).await.unwrap();
        assert_eq!(
            kinds(&events)[6..],
            [
                "model_call_completed",
                "output_rejected",
                "model_call_intent",
                "model_call_completed",
                "run_completed"
            ],
            "{name}"
        );
        let Event::OutputRejected(rejected) = &events[7] else {
            panic!("{:?}", events[7]);
        };
        assert!(
            rejected
                .violation
                .starts_with("the final answer is not a JSON value"),
            "{}",
            rejected.violation
        );
        // The recorded prompt of the retry: the schema in the instructions,
        // the violation right after the rejected answer.
        let Event::ModelCallIntent(retry) = &events[8] else {
            panic!("{:?}", events[8]);
        };
        let request = retry.request.as_ref().unwrap();
        assert!(
            request
                .instructions
                .contains(r#""required":["lines","first"]"#)
        );
        let last = serde_json::to_value(request.messages.last().unwrap()).unwrap();
        assert!(
            last.to_string().contains("Your final answer was rejected"),
            "{last}"
        );
        assert_eq!(
            rt.state(&run).await.unwrap().output(),
            Some(&json!({"lines": 1, "first": "the input file"}))
        );
        replays(store, "again", &agent).await;
    }
}

#[tokio::test]
async fn an_answer_invalid_twice_is_a_typed_failure_naming_the_violation() {
    let fx = Fixture::new();
    let agent = typed_agent(&fx, &[r#"{"lines": "one"}"#, r#"{"lines": 1, "first": 7}"#]);
    for (name, store) in crate::engine::stores(fx.dir.path()) {
        let rt = runtime(Arc::clone(&store));
        let run = rt
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(crate::engine::id("twice")),
            )
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Failed);
        let events = rt.events(&run).await.unwrap();
        let Some(Event::RunFailed(failed)) = events.last() else {
            panic!("{name}: {:?}", events.last());
        };
        let RunError::OutputInvalid { step, violation } = &failed.error else {
            panic!("{name}: {:?}", failed.error);
        };
        assert_eq!(*step, 3);
        assert!(violation.contains("at `/first`"), "{violation}");
        assert_eq!(
            kinds(&events)
                .iter()
                .filter(|k| **k == "output_rejected")
                .count(),
            1
        );
        replays(store, "twice", &agent).await;
    }
}

#[tokio::test]
async fn a_host_finishes_a_run_with_its_own_output_validated_and_without_a_model_call() {
    let fx = Fixture::new();
    // The model would answer with prose: the host never lets it.
    let agent = typed_agent(&fx, &["prose the host does not want"]);
    for (name, store) in crate::engine::stores(fx.dir.path()) {
        let rt = runtime(Arc::clone(&store));
        let run = rt
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(crate::engine::id("host")),
            )
            .await
            .unwrap();
        // Step by step: the first model call, then the tool call.
        assert_eq!(rt.step(&run, &agent).await.unwrap(), Step::Progressed);
        // A tool call is outstanding: the run cannot finish yet.
        let err = rt
            .finish_with(&run, &agent, json!({"lines": 1, "first": "x"}))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, RuntimeError::CannotFinish { reason, .. } if reason.contains("call-1-1")),
            "{name}: {err}"
        );
        assert_eq!(rt.step(&run, &agent).await.unwrap(), Step::Progressed);
        let before = rt.events(&run).await.unwrap();
        assert_eq!(kinds(&before).last(), Some(&"tool_call_completed"));
        // Invalid: refused, naming the violation, nothing written.
        let err = rt
            .finish_with(&run, &agent, json!({"lines": "one", "first": "x"}))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, RuntimeError::FinishRejected { violation, .. } if violation.contains("at `/lines`")),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("run `host`"), "{err}");
        assert_eq!(rt.events(&run).await.unwrap(), before);
        // Valid: one event, no model call.
        rt.finish_with(&run, &agent, json!({"lines": 1, "first": "the input file"}))
            .await
            .unwrap();
        let events = rt.events(&run).await.unwrap();
        assert_eq!(events.len(), before.len() + 1);
        let Some(Event::RunCompleted(done)) = events.last() else {
            panic!("{:?}", events.last());
        };
        assert!(done.by_host);
        assert_eq!(done.output, json!({"lines": 1, "first": "the input file"}));
        assert_eq!(rt.state(&run).await.unwrap().status(), RunStatus::Completed);
        // Terminal now: refused.
        let err = rt
            .finish_with(&run, &agent, json!({"lines": 1, "first": "x"}))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::AlreadyTerminal { .. }), "{err}");
        replays(store, "host", &agent).await;
    }
}
