//! The conformance corpus: responses recorded byte for byte from
//! third-party servers (`tests/fixtures/providers/corpus/`, origins in its
//! `SOURCES.md`), replayed exactly, whole and in awkward pieces, through a
//! loopback server, into the providers and through the engine.
//!
//! What they prove: every recorded stream assembles to the same response
//! however it is cut; a tool call whose arguments end mid-JSON is recorded
//! as it came, answered to the model as a typed tool error, and never sent
//! back as broken JSON; a proxy's mid-stream `{"type": null, "code":
//! "500"}` is a transient server error; each recorded error is classified
//! and keeps its `Retry-After`; bytes after a complete response and an
//! Anthropic stream missing its last blank line do not fail the call.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use warden::engine::StartOptions;

use serde_json::{Value, json};
use warden::engine::events::{Event, ToolCallError};
use warden::engine::{Agent, FixedClock, FixedRandom, RunStatus, Runtime};
use warden::plugins::PluginHost;
use warden::providers::{
    AnthropicOptions, AnthropicProvider, HttpConfig, Message, ModelProvider, ModelRequest,
    ModelResponse, OpenAiOptions, OpenAiProvider, ProviderError, StopReason, collect_response,
};
use warden::store::{EventStore, MemoryStore};

use crate::model_server::{FakeModel, Reply, awkward_pieces};
use crate::sandbox;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/providers/corpus")
}

/// The recorded bytes of `name`.
pub(crate) fn recorded(name: &str) -> Vec<u8> {
    let path = corpus_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A recorded response split into its head and its de-chunked body, to
/// derive a variant (bytes added after the end, a blank line taken away)
/// that is sent again as one chunk.
fn split(raw: &[u8]) -> (String, Vec<u8>) {
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..at].to_vec()).unwrap();
    let mut rest = &raw[at + 4..];
    let mut body = Vec::new();
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
    );
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            break;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
    (head, body)
}

fn rechunk(head: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("{head}\r\n\r\n{:x}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}

/// The ways a recording is cut into pieces: whole, awkward, one byte at a
/// time.
fn cuts(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    vec![
        vec![bytes.to_vec()],
        awkward_pieces(bytes),
        bytes.chunks(1).map(<[u8]>::to_vec).collect(),
    ]
}

/// A server answering request `n` with `replies[n]` (the last one again
/// after the list), each written exactly as recorded.
async fn replay(replies: Vec<Vec<Vec<u8>>>) -> FakeModel {
    FakeModel::start(move |_, n| Reply::raw(replies[n.min(replies.len() - 1)].clone())).await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    OpenAi,
    Anthropic,
}

impl Wire {
    fn of(name: &str) -> Wire {
        if name.starts_with("anthropic") {
            Wire::Anthropic
        } else {
            Wire::OpenAi
        }
    }

    fn base_url(self, server: &FakeModel) -> String {
        match self {
            Wire::OpenAi => server.url("/v1"),
            Wire::Anthropic => server.url("/anthropic"),
        }
    }
}

/// A provider of `wire` for `server` making one attempt per call.
fn provider(wire: Wire, server: &FakeModel) -> Arc<dyn ModelProvider> {
    let mut config = HttpConfig::new(wire.base_url(server));
    config.timeout = Duration::from_secs(10);
    match wire {
        Wire::OpenAi => Arc::new(OpenAiProvider::new(config, OpenAiOptions::default()).unwrap()),
        Wire::Anthropic => {
            Arc::new(AnthropicProvider::new(config, AnthropicOptions::default()).unwrap())
        }
    }
}

fn request() -> ModelRequest {
    ModelRequest {
        model: "gpt-4o-mini".into(),
        instructions: String::new(),
        context: String::new(),
        messages: vec![Message::User {
            content: "Say hello".into(),
        }],
        tools: vec![],
        max_tokens: 16,
    }
}

/// One call to a server replaying `pieces`; with the requests it saw.
async fn call_with(
    wire: Wire,
    pieces: Vec<Vec<u8>>,
) -> (Result<ModelResponse, ProviderError>, usize) {
    let server = replay(vec![pieces]).await;
    let p = provider(wire, &server);
    let result = collect_response(p.name(), p.stream(&request())).await;
    (result, server.seen().len())
}

/// Text, tool calls (name and arguments) and stop reason of a response.
type Summary = (String, Vec<(String, Value)>, Option<StopReason>);

fn summary(r: &ModelResponse) -> Summary {
    (
        r.text.clone(),
        r.tool_calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect(),
        r.stop_reason,
    )
}

#[tokio::test]
async fn every_recorded_stream_assembles_the_same_however_it_is_cut() {
    let read = || ("fs__read_file".to_owned(), json!({"path": "a.txt"}));
    let cases: Vec<(&str, Summary)> = vec![
        (
            "openai-text.http",
            (
                "Hello there, friend.".into(),
                vec![],
                Some(StopReason::EndTurn),
            ),
        ),
        (
            "openai-tool-call.http",
            (String::new(), vec![read()], Some(StopReason::ToolUse)),
        ),
        (
            "openai-malformed-arguments.http",
            (
                String::new(),
                vec![("fs__read_file".into(), json!("{\"path\": \""))],
                Some(StopReason::ToolUse),
            ),
        ),
        (
            "openai-tool-call-length.http",
            (String::new(), vec![read()], Some(StopReason::MaxTokens)),
        ),
        (
            "openai-content-filter.http",
            ("I can".into(), vec![], Some(StopReason::Refusal)),
        ),
        (
            "anthropic-text.http",
            (
                "Hello there, friend.".into(),
                vec![],
                Some(StopReason::EndTurn),
            ),
        ),
        (
            "anthropic-tool-use.http",
            (String::new(), vec![read()], Some(StopReason::ToolUse)),
        ),
        (
            "anthropic-malformed-input.http",
            (
                String::new(),
                vec![("fs__read_file".into(), json!("{\"path\": \""))],
                Some(StopReason::ToolUse),
            ),
        ),
        (
            "anthropic-tool-use-max-tokens.http",
            (String::new(), vec![read()], Some(StopReason::MaxTokens)),
        ),
        (
            "anthropic-refusal.http",
            ("I can".into(), vec![], Some(StopReason::Refusal)),
        ),
        (
            "litellm-openai-text.http",
            (
                "Hello there, friend.".into(),
                vec![],
                Some(StopReason::EndTurn),
            ),
        ),
        (
            "litellm-openai-tool-call.http",
            (String::new(), vec![read()], Some(StopReason::ToolUse)),
        ),
        (
            "litellm-malformed-arguments.http",
            (
                String::new(),
                vec![("fs__read_file".into(), json!("{\"path\": \""))],
                Some(StopReason::ToolUse),
            ),
        ),
        (
            "litellm-content-filter.http",
            ("I can".into(), vec![], Some(StopReason::Refusal)),
        ),
    ];
    for (name, expected) in cases {
        let bytes = recorded(name);
        for pieces in cuts(&bytes) {
            let n = pieces.len();
            let (result, requests) = call_with(Wire::of(name), pieces).await;
            let response = result.unwrap_or_else(|e| panic!("{name} in {n} pieces: {e}"));
            assert_eq!(summary(&response), expected, "{name} in {n} pieces");
            assert_eq!(requests, 1, "{name}");
        }
    }
}

#[tokio::test]
async fn recorded_errors_are_classified_by_type_then_code_then_status_and_keep_retry_after() {
    // (file, transient, status, retry-after ms)
    let cases = [
        (
            "openai-429-retry-after-120.http",
            true,
            Some(429),
            Some(120_000),
        ),
        ("openai-500.http", true, Some(500), None),
        ("openai-400.http", false, Some(400), None),
        (
            "anthropic-429-retry-after-120.http",
            true,
            Some(429),
            Some(120_000),
        ),
        ("anthropic-529.http", true, Some(529), Some(1_000)),
        // The proxy's type is its own (`throttling_error`), its code the
        // status as text, and the wait only in the header it forwards.
        ("litellm-upstream-429.http", true, Some(429), Some(120_000)),
        ("litellm-upstream-500.http", true, Some(500), None),
        // An upstream disconnect, reported mid-stream with `type: null`
        // and `code: "500"`.
        ("litellm-upstream-disconnect.http", true, None, None),
        // Streams that end early or break: incomplete is transient,
        // malformed is not.
        ("openai-truncated.http", true, None, None),
        ("anthropic-truncated.http", true, None, None),
        ("openai-malformed-chunk.http", false, None, None),
    ];
    for (name, transient, status, retry_after) in cases {
        let (result, requests) = call_with(Wire::of(name), awkward_pieces(&recorded(name))).await;
        let error = result.expect_err(name);
        assert_eq!(error.is_transient(), transient, "{name}: {error}");
        let (got_status, got_retry) = match &error {
            ProviderError::Http {
                status,
                retry_after_ms,
                ..
            } => (Some(*status), *retry_after_ms),
            _ => (None, None),
        };
        assert_eq!((got_status, got_retry), (status, retry_after), "{name}");
        assert!(requests >= 1, "{name}");
    }
}

#[tokio::test]
async fn bytes_after_a_complete_response_and_a_missing_last_blank_line_do_not_fail_the_call() {
    // Bytes that are not UTF-8 after `[DONE]`, in the same piece as it.
    let (head, mut body) = split(&recorded("openai-text.http"));
    body.extend_from_slice(b"\xff\xfe garbage\n\n");
    for pieces in cuts(&rechunk(&head, &body)) {
        let (result, requests) = call_with(Wire::OpenAi, pieces).await;
        let r = result.expect("bytes after [DONE] are not part of the response");
        assert_eq!(r.text, "Hello there, friend.");
        assert_eq!(requests, 1);
    }
    // The same bytes before the finish reason are a malformed stream.
    let (head, body) = split(&recorded("openai-text.http"));
    let text = String::from_utf8(body).unwrap();
    let at = text.find("data: [DONE]").unwrap();
    let cut = text[..at].rfind("data: {").unwrap();
    let mut broken = text.as_bytes()[..cut].to_vec();
    broken.extend_from_slice(b"data: \xff\xfe\n\n");
    broken.extend_from_slice(&text.as_bytes()[cut..]);
    let (result, _) = call_with(Wire::OpenAi, vec![rechunk(&head, &broken)]).await;
    let error = result.expect_err("not UTF-8 mid-response");
    assert!(
        matches!(error, ProviderError::Protocol { .. }) && !error.is_transient(),
        "{error}"
    );

    // An Anthropic stream whose last event (`message_stop`) has no blank
    // line after it, or is missing: `message_delta` carried the stop
    // reason, so the answer is whole.
    let (head, body) = split(&recorded("anthropic-text.http"));
    let text = String::from_utf8(body).unwrap();
    let no_blank = text.trim_end_matches('\n').to_owned() + "\n";
    let no_stop = text[..text.find("event: message_stop").unwrap()].to_owned();
    for variant in [no_blank, no_stop] {
        for pieces in cuts(&rechunk(&head, variant.as_bytes())) {
            let (result, requests) = call_with(Wire::Anthropic, pieces).await;
            let r = result.expect("the stop reason arrived");
            assert_eq!(r.text, "Hello there, friend.");
            assert_eq!(r.stop_reason, Some(StopReason::EndTurn));
            assert_eq!(requests, 1);
        }
    }
}

// ---------------------------------------------------------------------------
// Through the engine.

fn agent(dir: &Path, wire: Wire, server: &FakeModel) -> Agent {
    agent_with(dir, wire, server, "")
}

/// The agent with `top` added to its top-level keys.
fn agent_with(dir: &Path, wire: Wire, server: &FakeModel, top: &str) -> Agent {
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::write(dir.join("work/a.txt"), "the a file\n").unwrap();
    let provider = match wire {
        Wire::OpenAi => "openai",
        Wire::Anthropic => "anthropic",
    };
    let text = format!(
        r#"
name = "corpus"
instructions = "Answer from the files."
{top}

[model]
provider = "{provider}"
name = "gpt-4o-mini"
base_url = "{}"
timeout = "10s"

[plugins.fs]
source = "builtin:fs"
approval = {{ read_file = "never" }}
[plugins.fs.grant.mounts.workspace]
dir = "work"
access = "read-only"
"#,
        wire.base_url(server)
    );
    std::fs::write(dir.join("agent.toml"), text).unwrap();
    Agent::load(&dir.join("agent.toml"), None).unwrap()
}

fn runtime() -> Runtime {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_hooks(
            Arc::new(FixedClock(1_700_000_000_000)),
            Arc::new(FixedRandom(7)),
        )
        .with_record_prompts(true)
}

async fn run(agent: &Agent) -> (RunStatus, Vec<Event>) {
    let rt = runtime();
    let id = warden::engine::RunId::new("corpus-run").unwrap();
    let run = rt
        .start(agent, json!("Read a.txt"), StartOptions::new().id(id))
        .await
        .unwrap();
    let status = rt.drive(&run, agent).await.unwrap();
    (status, rt.events(&run).await.unwrap())
}

#[tokio::test]
async fn a_tool_call_with_broken_arguments_is_answered_as_a_typed_error_and_never_echoed() {
    for (wire, broken, text) in [
        (
            Wire::OpenAi,
            "openai-malformed-arguments.http",
            "openai-text.http",
        ),
        (
            Wire::OpenAi,
            "litellm-malformed-arguments.http",
            "litellm-openai-text.http",
        ),
        (
            Wire::Anthropic,
            "anthropic-malformed-input.http",
            "anthropic-text.http",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let server = replay(vec![
            awkward_pieces(&recorded(broken)),
            awkward_pieces(&recorded(text)),
        ])
        .await;
        let (status, events) = run(&agent(dir.path(), wire, &server)).await;
        assert_eq!(status, RunStatus::Completed, "{broken}: {events:?}");
        // Two requests: the broken call, then its typed error answered.
        let seen = server.seen();
        assert_eq!(seen.len(), 2, "{broken}");
        // Recorded as what it was: the text that came.
        let recorded_call = events.iter().find_map(|e| match e {
            Event::ModelCallCompleted(c) => c.tool_calls.first().cloned(),
            _ => None,
        });
        assert_eq!(
            recorded_call.map(|c| c.arguments),
            Some(json!("{\"path\": \"")),
            "{broken}"
        );
        let rejected = events.iter().find_map(|e| match e {
            Event::ToolCallRejected(r) => Some(r.error.clone()),
            _ => None,
        });
        match rejected {
            Some(ToolCallError::InvalidArguments { message }) => {
                assert!(message.contains("not valid JSON"), "{broken}: {message}")
            }
            other => panic!("{broken}: {other:?}"),
        }
        // The second request is valid for its protocol: the call's
        // arguments are a JSON object (OpenAI: JSON text of one).
        let body = seen[1].json();
        let sent: Vec<Value> = match wire {
            Wire::OpenAi => body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
                .map(|c| {
                    let text = c["function"]["arguments"].as_str().unwrap().to_owned();
                    serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("{broken}: sent back `{text}`: {e}"))
                })
                .collect(),
            Wire::Anthropic => body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["input"].clone())
                .collect(),
        };
        assert_eq!(sent.len(), 1, "{broken}");
        assert!(sent[0].is_object(), "{broken}: {sent:?}");
    }
}

#[tokio::test]
async fn a_refusal_or_content_filter_ends_the_run_as_the_agent_says() {
    use warden::engine::events::RunError;
    for (wire, name) in [
        (Wire::OpenAi, "openai-content-filter.http"),
        (Wire::OpenAi, "litellm-content-filter.http"),
        (Wire::Anthropic, "anthropic-refusal.http"),
    ] {
        for top in ["", "on_refusal = \"fail\"", "on_refusal = \"complete\""] {
            let dir = tempfile::tempdir().unwrap();
            let server = replay(vec![awkward_pieces(&recorded(name))]).await;
            let (status, events) = run(&agent_with(dir.path(), wire, &server, top)).await;
            assert_eq!(server.seen().len(), 1, "{name} {top}");
            let completion = events.iter().find_map(|e| match e {
                Event::ModelCallCompleted(c) => Some(c.clone()),
                _ => None,
            });
            let completion = completion.unwrap();
            assert_eq!(completion.stop_reason, StopReason::Refusal, "{name}");
            assert!(
                completion.at_ms.is_some(),
                "{name}: when the answer arrived"
            );
            let last = events.last().unwrap();
            if top.contains("complete") {
                assert_eq!(status, RunStatus::Completed, "{name} {top}");
                assert!(
                    matches!(last, Event::RunCompleted(c) if c.output == json!("I can")),
                    "{name}: {last:?}"
                );
            } else {
                assert_eq!(status, RunStatus::Failed, "{name} {top}");
                match last {
                    Event::RunFailed(f) => assert_eq!(
                        f.error,
                        RunError::Refused {
                            step: 1,
                            message: "I can".into()
                        },
                        "{name}"
                    ),
                    other => panic!("{name}: {other:?}"),
                }
            }
        }
    }
}
