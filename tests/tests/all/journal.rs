//! Journal poisoning: whatever the engine accepts from a hostile model or
//! plugin it can always read back. JSON nested past what decoding reads
//! (serde_json stops at 128 levels) is refused where it enters, with a
//! typed, recorded answer the model sees, and the run goes on; what an
//! embedding application hands in too deeply nested is refused before
//! anything is written. A property test sends arbitrary values through
//! append and decode on both stores.

use std::sync::Arc;
use warden::engine::StartOptions;

use serde_json::{Value, json};
use warden::engine::events::{Event, ToolCallError, ToolCallResult, decode};
use warden::engine::{Agent, RunStatus, RuntimeError};
use warden::json_limits::MAX_DEPTH;
use warden::store::EventStore;

use crate::engine::{Fixture, id, runtime, stores};
use crate::model_server::{FakeModel, Reply};

/// `[[…[1]…]]`, `levels` deep, as text.
fn nested_text(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

/// `{"a": {"a": … 1 …}}`, `levels` deep, built in code.
fn nested_object(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

/// Every stored event of `run` decodes, and `verify` (which decodes too)
/// finds the run intact.
async fn assert_readable(store: &Arc<dyn EventStore>, rt: &warden::engine::Runtime, run: &str) {
    let run = id(run);
    for stored in store.load(&run).await.unwrap() {
        decode(&stored.bytes).unwrap_or_else(|e| panic!("event {} of {run}: {e}", stored.seq));
    }
    let report = rt.verify(&run).await.unwrap();
    assert!(report.is_intact(), "{:?}", report.findings);
}

/// A run of `agent` on `store`, started with id `run` and driven to
/// completion.
async fn completed_run(
    store: &Arc<dyn EventStore>,
    agent: &Agent,
    run: &str,
) -> (warden::engine::Runtime, warden::engine::RunId) {
    let rt = runtime(store.clone());
    let run = rt
        .start(agent, json!("go"), StartOptions::new().id(id(run)))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, agent).await.unwrap(),
        RunStatus::Completed,
        "{run}"
    );
    (rt, run)
}

/// An OpenAI-compatible stream: one tool call with `arguments` (text), then
/// on the next request a plain answer.
fn openai_server(arguments: String) -> impl Fn(&crate::model_server::Seen, usize) -> Reply {
    move |seen, _| {
        // The first request of a run gets the tool call; the one that
        // carries its answer gets the final text.
        let answered = seen.json()["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let mut body = String::new();
        if !answered {
            body.push_str(&chunk(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_deep", "type": "function",
                        "function": {"name": "hostile__echo", "arguments": arguments}}]}),
                Value::Null,
            ));
            body.push_str(&chunk(json!({}), json!("tool_calls")));
        } else {
            body.push_str(&chunk(
                json!({"role": "assistant", "content": "Done."}),
                Value::Null,
            ));
            body.push_str(&chunk(json!({}), json!("stop")));
        }
        body.push_str("data: [DONE]\n\n");
        Reply::sse(vec![body.into_bytes()])
    }
}

/// The fixture's agent file with `from` replaced by `to`, loaded.
fn edited_agent(fx: &Fixture, from: &str, to: &str) -> Agent {
    let text = std::fs::read_to_string(fx.path("agent.toml")).unwrap();
    assert!(text.contains(from), "{from}");
    std::fs::write(fx.path("agent.toml"), text.replace(from, to)).unwrap();
    Agent::load(&fx.path("agent.toml"), None).unwrap()
}

fn openai_agent(fx: &Fixture, server: &FakeModel) -> Agent {
    fx.agent("[[turns]]\ntext = \"unused\"\n", "");
    edited_agent(fx, "fs = \"never\"", "fs = \"never\", echo = \"never\"");
    edited_agent(
        fx,
        "provider = \"scripted\"\nname = \"script\"\ntranscript = \"transcript.toml\"",
        &format!(
            "provider = \"openai\"\nname = \"m\"\nbase_url = \"{}\"\ntimeout = \"10s\"",
            server.url("/v1")
        ),
    )
}

#[tokio::test]
async fn a_model_sending_arguments_nested_past_the_decoder_is_answered_and_the_run_stays_readable()
{
    let fx = Fixture::new();
    // 125 levels: serde_json parses the text (its limit is 128), but stored
    // inside an event it would be read back 129 levels deep.
    let server = FakeModel::start(openai_server(nested_object(125).to_string())).await;
    let agent = openai_agent(&fx, &server);
    for (name, store) in stores(fx.dir.path()) {
        let (rt, run) = completed_run(&store, &agent, &format!("deep-args-{name}")).await;
        let events = rt.events(&run).await.unwrap();
        let rejected = events
            .iter()
            .find_map(|e| match e {
                Event::ToolCallRejected(r) => Some(r.error.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name}: no rejection in {events:?}"));
        match rejected {
            ToolCallError::InvalidArguments { message } => {
                assert!(
                    message.contains("nested 125 levels deep"),
                    "{name}: {message}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
        // The model was told, in the next request.
        let second = &server.seen()[server.seen().len() - 1];
        assert!(
            String::from_utf8_lossy(&second.body).contains("nested 125 levels deep"),
            "{name}"
        );
        assert_readable(&store, &rt, run.as_str()).await;
    }
}

#[tokio::test]
async fn a_tool_output_nested_past_the_decoder_is_a_typed_error_and_the_run_goes_on() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Asking for something deep."
[[turns.tool_calls]]
name = "hostile__nested_output"
arguments = { depth = 125 }

[[turns]]
text = "Asking for something shallow."
[[turns.tool_calls]]
name = "hostile__nested_output"
arguments = { depth = 64 }

[[turns]]
text = "Done."
"#;
    fx.agent(turns, "");
    let agent = edited_agent(
        &fx,
        "fs = \"never\"",
        "fs = \"never\", nested_output = \"never\"",
    );
    for (name, store) in stores(fx.dir.path()) {
        let (rt, run) = completed_run(&store, &agent, &format!("deep-output-{name}")).await;
        let results: Vec<ToolCallResult> = rt
            .events(&run)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| match e {
                Event::ToolCallCompleted(c) => Some(c.result),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 2, "{name}");
        match &results[0] {
            ToolCallResult::Error(ToolCallError::InvalidOutput { message }) => {
                assert!(
                    message.contains("nested 125 levels deep"),
                    "{name}: {message}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
        // At the limit the output is kept as a value.
        match &results[1] {
            ToolCallResult::Output(value) => {
                assert_eq!(warden::json_limits::depth(value), MAX_DEPTH);
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_readable(&store, &rt, run.as_str()).await;
    }
}

#[tokio::test]
async fn a_final_answer_nested_past_the_decoder_is_sent_back_not_recorded_as_the_output() {
    let fx = Fixture::new();
    let deep = nested_text(125);
    let turns = format!("[[turns]]\ntext = '{deep}'\n\n[[turns]]\ntext = '[1]'\n");
    fx.agent(&turns, "");
    let agent = edited_agent(
        &fx,
        "instructions = \"Test the engine.\"",
        "instructions = \"Test the engine.\"\noutput_schema = '{\"type\": \"array\"}'",
    );
    for (name, store) in stores(fx.dir.path()) {
        let (rt, run) = completed_run(&store, &agent, &format!("deep-answer-{name}")).await;
        let events = rt.events(&run).await.unwrap();
        let violation = events
            .iter()
            .find_map(|e| match e {
                Event::OutputRejected(r) => Some(r.violation.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name}: no rejection"));
        assert!(
            violation.contains("nested 125 levels deep"),
            "{name}: {violation}"
        );
        match events.last().unwrap() {
            Event::RunCompleted(c) => assert_eq!(c.output, json!([1]), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        assert_readable(&store, &rt, run.as_str()).await;
    }
}

#[tokio::test]
async fn an_input_too_deep_to_read_back_is_refused_before_anything_is_written() {
    let fx = Fixture::new();
    let agent = fx.agent("[[turns]]\ntext = \"Done.\"\n", "");
    for (name, store) in stores(fx.dir.path()) {
        let rt = runtime(store.clone());
        let run = id(&format!("deep-input-{name}"));
        let err = rt
            .start(
                &agent,
                nested_object(130),
                StartOptions::new().id(run.clone()),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, RuntimeError::Unrecordable { .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains("run_started"), "{name}: {err}");
        assert!(
            store.load(&run).await.is_err() || store.load(&run).await.unwrap().is_empty(),
            "{name}: nothing recorded"
        );
        // The same runtime and store go on serving.
        let ok = rt
            .start(
                &agent,
                nested_object(MAX_DEPTH),
                StartOptions::new().id(id(&format!("after-{name}"))),
            )
            .await
            .unwrap();
        assert_eq!(rt.drive(&ok, &agent).await.unwrap(), RunStatus::Completed);
        assert_readable(&store, &rt, ok.as_str()).await;
    }
}

/// A JSON value: scalars (every kind of number and string, including
/// escapes and non-ASCII) in arrays and objects a few levels deep, then
/// wrapped in up to 140 more levels, around and past both limits.
fn any_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[\\[\\]{}\"\\\\\u{0}-\u{1f}]{0,8}".prop_map(Value::from),
    ];
    let shallow = leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    (shallow, 0usize..140, any::<bool>()).prop_map(|(value, wraps, in_arrays)| {
        (0..wraps).fold(value, |inner, _| {
            if in_arrays {
                json!([inner])
            } else {
                json!({ "k": inner })
            }
        })
    })
}

/// Whatever `start` accepts as a run's input is stored readably and reads
/// back equal; what it refuses is refused before anything is written; a
/// value within [`MAX_DEPTH`] is always accepted. On both stores.
#[test]
fn any_value_a_run_accepts_reads_back_equal_on_every_store() {
    use proptest::test_runner::{Config, TestRunner};
    let fx = Fixture::new();
    let agent = fx.agent("[[turns]]\ntext = \"Done.\"\n", "");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let stores = stores(fx.dir.path());
    let count = std::sync::atomic::AtomicU64::new(0);
    let cases = std::env::var("WARDEN_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(96);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&any_value(), |value| {
            tokio.block_on(async {
                for (name, store) in &stores {
                    let rt = runtime(store.clone());
                    let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let run = id(&format!("prop-{n}"));
                    match rt
                        .start(&agent, value.clone(), StartOptions::new().id(run.clone()))
                        .await
                    {
                        Ok(_) => {
                            let stored = store.load(&run).await.unwrap();
                            let Event::RunStarted(started) = decode(&stored[0].bytes).unwrap()
                            else {
                                panic!("{name}: the first event is not run_started");
                            };
                            proptest::prop_assert_eq!(&started.input, &value, "{}", name);
                            proptest::prop_assert!(rt.verify(&run).await.unwrap().is_intact());
                        }
                        Err(RuntimeError::Unrecordable { .. }) => {
                            proptest::prop_assert!(
                                warden::json_limits::depth(&value) > MAX_DEPTH,
                                "{}: a value within the limit was refused",
                                name
                            );
                            proptest::prop_assert!(
                                store.load(&run).await.map(|e| e.is_empty()).unwrap_or(true),
                                "{}: something was written",
                                name
                            );
                        }
                        Err(other) => proptest::prop_assert!(false, "{}: {}", name, other),
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}
