//! The HTTP model providers against a fake model API on loopback
//! (`model_server`): both wire formats streamed at awkward byte boundaries
//! (recorded fixtures in `tests/fixtures/providers/`), one request per
//! call whatever the error (the engine is the one retry layer: see
//! `retries.rs`), errors that say whether they are transient and what
//! `Retry-After` asked for, a stream cut mid-way, invalid JSON, timeouts,
//! cancellation reaching the
//! socket, connection pooling and the concurrency cap, secrets kept out of
//! errors; then conformance (scripted, OpenAI and Anthropic feed the engine
//! the same events and record the same run; streamed and whole responses
//! record the same completion) and agents that run end to end with tools
//! in the sandbox.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use warden::engine::StartOptions;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use warden::engine::events::{Event, ModelCallCompleted};
use warden::engine::{Agent, FixedClock, FixedRandom, RunStatus, RunUpdate, Runtime};
use warden::plugins::PluginHost;
use warden::providers::scripted::ScriptedTurn;
use warden::providers::{
    AnthropicOptions, AnthropicProvider, HttpClient, HttpConfig, Message, ModelProvider,
    ModelRequest, ModelResponse, OpenAiOptions, OpenAiProvider, ProviderError, ProviderEvent,
    RawBlock, ScriptedProvider, Secret, StopReason, ToolCall, Usage, collect_response,
};
use warden::store::{EventStore, MemoryStore};

use crate::binary::warden_binary;
use crate::model_server::{After, FakeModel, Reply, Seen, awkward_pieces};
use crate::sandbox;

// ---------------------------------------------------------------------------
// Helpers.

/// The two wire formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wire {
    OpenAi,
    Anthropic,
}

pub(crate) const WIRES: [Wire; 2] = [Wire::OpenAi, Wire::Anthropic];

impl Wire {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wire::OpenAi => "openai",
            Wire::Anthropic => "anthropic",
        }
    }

    /// The base URL of `server` for this wire format.
    fn base_url(self, server: &FakeModel) -> String {
        match self {
            Wire::OpenAi => server.url("/v1"),
            Wire::Anthropic => server.url(""),
        }
    }
}

/// A provider of `wire` for `server`, on its own client, with `tweak`
/// applied to the default settings.
pub(crate) fn provider(
    wire: Wire,
    server: &FakeModel,
    tweak: impl FnOnce(&mut HttpConfig),
) -> Arc<dyn ModelProvider> {
    provider_on(wire, server, HttpClient::new(), tweak)
}

fn provider_on(
    wire: Wire,
    server: &FakeModel,
    client: HttpClient,
    tweak: impl FnOnce(&mut HttpConfig),
) -> Arc<dyn ModelProvider> {
    let mut config = HttpConfig::new(wire.base_url(server));
    config.timeout = Duration::from_secs(10);
    tweak(&mut config);
    match wire {
        Wire::OpenAi => {
            Arc::new(OpenAiProvider::with_client(config, OpenAiOptions::default(), client).unwrap())
        }
        Wire::Anthropic => Arc::new(
            AnthropicProvider::with_client(config, AnthropicOptions::default(), client).unwrap(),
        ),
    }
}

fn request(text: &str) -> ModelRequest {
    ModelRequest {
        model: "test-model".into(),
        instructions: "Be brief.".into(),
        context: String::new(),
        messages: vec![Message::User {
            content: text.into(),
        }],
        tools: vec![],
        max_tokens: 256,
    }
}

async fn call(provider: &Arc<dyn ModelProvider>) -> Result<ModelResponse, ProviderError> {
    collect_response(provider.name(), provider.stream(&request("hi"))).await
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/providers")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A short streamed answer saying "ok", in `wire`'s format.
pub(crate) fn ok_stream(wire: Wire) -> Vec<u8> {
    let turn = ScriptedTurn {
        text: "ok".into(),
        usage: Some(Usage {
            input_tokens: 3,
            output_tokens: 1,
        }),
        ..ScriptedTurn::default()
    };
    render_stream(wire, &turn).into_bytes()
}

fn ok_response() -> ModelResponse {
    ModelResponse {
        text: "ok".into(),
        usage: Usage {
            input_tokens: 3,
            output_tokens: 1,
        },
        stop_reason: Some(StopReason::EndTurn),
        ..ModelResponse::default()
    }
}

// ---------------------------------------------------------------------------
// Rendering scripted turns in each wire format: what a real API would have
// sent for the same answer.

fn stop_of(turn: &ScriptedTurn) -> StopReason {
    turn.stop_reason.unwrap_or(if turn.tool_calls.is_empty() {
        StopReason::EndTurn
    } else {
        StopReason::ToolUse
    })
}

fn usage_of(turn: &ScriptedTurn) -> Usage {
    turn.usage.expect("conformance turns state their usage")
}

/// A turn's text in the pieces the scripted provider streams it in.
fn text_pieces(turn: &ScriptedTurn) -> Vec<&str> {
    turn.text.split_inclusive(' ').collect()
}

/// A string cut in two at a character boundary near its middle.
fn halves(s: &str) -> (&str, &str) {
    let mut at = s.len() / 2;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.split_at(at)
}

pub(crate) fn render_stream(wire: Wire, turn: &ScriptedTurn) -> String {
    match wire {
        Wire::OpenAi => openai_stream(turn),
        Wire::Anthropic => anthropic_stream(turn, &[]),
    }
}

fn openai_stream(turn: &ScriptedTurn) -> String {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "test-model",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut out = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    for piece in text_pieces(turn) {
        out.push_str(&chunk(json!({"content": piece}), Value::Null));
    }
    // Every call's id and name first, then the arguments in two halves,
    // interleaved across calls, as parallel calls arrive.
    let args: Vec<String> = turn
        .tool_calls
        .iter()
        .map(|c| c.arguments.to_string())
        .collect();
    for (i, c) in turn.tool_calls.iter().enumerate() {
        out.push_str(&chunk(
            json!({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}),
            Value::Null,
        ));
    }
    for half in 0..2 {
        for (i, a) in args.iter().enumerate() {
            let (first, second) = halves(a);
            let piece = if half == 0 { first } else { second };
            out.push_str(&chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    let finish = match stop_of(turn) {
        StopReason::ToolUse => "tool_calls",
        StopReason::MaxTokens => "length",
        _ => "stop",
    };
    out.push_str(&chunk(json!({}), json!(finish)));
    let u = usage_of(turn);
    out.push_str(&format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens, "total_tokens": u.input_tokens + u.output_tokens}})
    ));
    out
}

fn openai_whole(turn: &ScriptedTurn) -> Value {
    let u = usage_of(turn);
    let calls: Vec<Value> = turn
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
        .collect();
    let mut message = json!({"role": "assistant", "content": if turn.text.is_empty() { Value::Null } else { json!(turn.text) }});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": if turn.tool_calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens, "total_tokens": u.input_tokens + u.output_tokens},
    })
}

/// An Anthropic stream for `turn`, with `kept` blocks (raw JSON) first.
fn anthropic_stream(turn: &ScriptedTurn, kept: &[Value]) -> String {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let u = usage_of(turn);
    let mut out = event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "test-model", "content": [], "stop_reason": null, "usage": {"input_tokens": u.input_tokens, "output_tokens": 1}}}),
    );
    let mut index = 0;
    for block in kept {
        let mut start = block.clone();
        let thinking = start["thinking"].as_str().unwrap_or("").to_owned();
        let signature = start["signature"].as_str().unwrap_or("").to_owned();
        start["thinking"] = json!("");
        start["signature"] = json!("");
        out.push_str(&event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        out.push_str(&event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": thinking}})));
        out.push_str(&event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}})));
        out.push_str(&event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    if !turn.text.is_empty() {
        out.push_str(&event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})));
        out.push_str(&event("ping", json!({"type": "ping"})));
        for piece in text_pieces(turn) {
            out.push_str(&event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}})));
        }
        out.push_str(&event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for c in &turn.tool_calls {
        out.push_str(&event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}})));
        let args = c.arguments.to_string();
        let (first, second) = halves(&args);
        for piece in ["", first, second] {
            out.push_str(&event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})));
        }
        out.push_str(&event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    let stop = match stop_of(turn) {
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        _ => "end_turn",
    };
    out.push_str(&event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": u.output_tokens}})));
    out.push_str(&event("message_stop", json!({"type": "message_stop"})));
    out
}

fn anthropic_whole(turn: &ScriptedTurn) -> Value {
    let u = usage_of(turn);
    let mut content = Vec::new();
    if !turn.text.is_empty() {
        content.push(json!({"type": "text", "text": turn.text}));
    }
    for c in &turn.tool_calls {
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}));
    }
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "test-model", "content": content,
        "stop_reason": if turn.tool_calls.is_empty() { "end_turn" } else { "tool_use" }, "stop_sequence": null,
        "usage": {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens},
    })
}

/// How many assistant turns the conversation in a request already has:
/// which turn answers it (the scripted provider's rule).
fn turn_index(seen: &Seen) -> usize {
    seen.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .count()
}

/// A server that answers each request with the turn it asks for, in
/// `wire`'s format: streamed (at awkward boundaries) or whole, as the
/// request asks.
async fn scripted_server(wire: Wire, turns: Vec<ScriptedTurn>) -> FakeModel {
    FakeModel::start(move |seen, _| {
        let turn = &turns[turn_index(seen)];
        if seen.json()["stream"] == json!(true) {
            Reply::sse(awkward_pieces(render_stream(wire, turn).as_bytes()))
        } else {
            let body = match wire {
                Wire::OpenAi => openai_whole(turn),
                Wire::Anthropic => anthropic_whole(turn),
            };
            Reply::json(200, &body)
        }
    })
    .await
}

// ---------------------------------------------------------------------------
// Recorded streams, split at awkward boundaries.

fn parallel_tools_response() -> ModelResponse {
    ModelResponse {
        text: "Let me check both files — café ☕ first.".into(),
        tool_calls: vec![
            ToolCall {
                id: "call_kWvbE1oP5xR0mS2dHc8QyTfN".into(),
                name: "files__read_file".into(),
                arguments: json!({"path": "input.txt"}),
            },
            ToolCall {
                id: "call_3nLqA7fYd9ZcJ4uRbX1sWm0E".into(),
                name: "files__search".into(),
                arguments: json!({"pattern": "TODO", "path": "."}),
            },
        ],
        blocks: vec![],
        usage: Usage {
            input_tokens: 412,
            output_tokens: 61,
        },
        stop_reason: Some(StopReason::ToolUse),
    }
}

fn thinking_tool_use_response() -> ModelResponse {
    ModelResponse {
        text: "I'll read the file — 📄 input.txt.".into(),
        tool_calls: vec![ToolCall {
            id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            name: "files__read_file".into(),
            arguments: json!({"path": "input.txt"}),
        }],
        blocks: vec![RawBlock {
            format: "anthropic".into(),
            index: 0,
            block: json!({
                "type": "thinking",
                "thinking": "The user wants the file read. I'll call read_file on input.txt — naïve approach first.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
            }),
        }],
        usage: Usage {
            input_tokens: 472 + 2048,
            output_tokens: 89,
        },
        stop_reason: Some(StopReason::ToolUse),
    }
}

#[tokio::test]
async fn recorded_streams_split_at_awkward_boundaries_assemble_exactly() {
    let cases = [
        (
            Wire::OpenAi,
            "openai-parallel-tools.sse",
            parallel_tools_response(),
        ),
        (
            Wire::OpenAi,
            "openai-text-ollama.sse",
            ModelResponse {
                text: "The input file says: \"the input file\".".into(),
                usage: Usage {
                    input_tokens: 88,
                    output_tokens: 12,
                },
                stop_reason: Some(StopReason::EndTurn),
                ..ModelResponse::default()
            },
        ),
        (
            Wire::Anthropic,
            "anthropic-thinking-tool-use.sse",
            thinking_tool_use_response(),
        ),
        (
            Wire::Anthropic,
            "anthropic-text.sse",
            ModelResponse {
                text: "Hello! The file says \"the input file\".".into(),
                usage: Usage {
                    input_tokens: 25,
                    output_tokens: 15,
                },
                stop_reason: Some(StopReason::EndTurn),
                ..ModelResponse::default()
            },
        ),
    ];
    for (wire, name, expected) in cases {
        let bytes = fixture(name);
        // Whole, in awkward pieces, and one byte at a time.
        for pieces in [
            vec![bytes.clone()],
            awkward_pieces(&bytes),
            bytes.chunks(1).map(<[u8]>::to_vec).collect(),
        ] {
            let server = FakeModel::start(move |_, _| Reply::sse(pieces.clone())).await;
            let p = provider(wire, &server, |_| {});
            assert_eq!(call(&p).await.unwrap(), expected, "{name}");
            assert_eq!(server.seen().len(), 1, "{name}");
        }
    }
}

#[tokio::test]
async fn whole_recorded_responses_assemble_like_their_streams() {
    for (wire, name, expected) in [
        (Wire::OpenAi, "openai-whole.json", parallel_tools_response()),
        (
            Wire::Anthropic,
            "anthropic-whole.json",
            thinking_tool_use_response(),
        ),
    ] {
        let body: Value = serde_json::from_slice(&fixture(name)).unwrap();
        let server = FakeModel::start(move |_, _| Reply::json(200, &body)).await;
        let p = provider(wire, &server, |c| c.stream = false);
        assert_eq!(call(&p).await.unwrap(), expected, "{name}");
        let sent = server.seen()[0].json();
        assert_eq!(sent["stream"], json!(false), "{name}");
        assert!(sent.get("stream_options").is_none(), "{name}");
    }
}

// ---------------------------------------------------------------------------
// Requests.

#[tokio::test]
async fn requests_carry_the_key_headers_and_usage_options_and_errors_never_show_secrets() {
    for wire in WIRES {
        let key = "sk-test-0123456789abcdef";
        let server = FakeModel::start(move |_, _| {
            Reply::json(
                401,
                &json!({"error": {"message": format!("Incorrect API key provided: {key}."), "type": "invalid_request_error"}}),
            )
        })
        .await;
        let p = provider(wire, &server, |c| {
            c.api_key = Some(Secret::new(key));
            c.headers = vec![("x-team".into(), "ops".into())];
            c.secret_headers = vec![("x-gateway-key".into(), Secret::new("gw-secret-42"))];
            c.base_url.push_str("?tenant=t1");
        });
        let err = call(&p).await.unwrap_err();
        let text = err.to_string();
        assert!(!text.contains(key), "{text}");
        assert!(
            text.contains("Incorrect API key provided: [redacted]."),
            "{text}"
        );
        match &err {
            ProviderError::Http {
                status, url, body, ..
            } => {
                assert_eq!(*status, 401);
                let path = match wire {
                    Wire::OpenAi => "/v1/chat/completions",
                    Wire::Anthropic => "/v1/messages",
                };
                assert_eq!(url, &format!("http://127.0.0.1:{}{path}?…", server.port));
                assert!(!body.contains(key), "{body}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!err.is_transient(), "401 is permanent");
        assert_eq!(server.seen().len(), 1, "one request per call");

        let seen = &server.seen()[0];
        assert!(seen.path.ends_with("?tenant=t1"), "{}", seen.path);
        assert_eq!(seen.header("x-team"), Some("ops"));
        assert_eq!(seen.header("x-gateway-key"), Some("gw-secret-42"));
        assert_eq!(seen.header("content-type"), Some("application/json"));
        assert_eq!(seen.header("accept"), Some("text/event-stream"));
        let body = seen.json();
        assert_eq!(body["stream"], json!(true));
        match wire {
            Wire::OpenAi => {
                assert_eq!(
                    seen.header("authorization"),
                    Some(&*format!("Bearer {key}"))
                );
                assert_eq!(body["stream_options"], json!({"include_usage": true}));
                assert_eq!(
                    body["messages"][0],
                    json!({"role": "system", "content": "Be brief."})
                );
                assert_eq!(body["max_tokens"], json!(256));
            }
            Wire::Anthropic => {
                assert_eq!(seen.header("x-api-key"), Some(key));
                assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
                assert_eq!(body["system"], json!("Be brief."));
                assert_eq!(body["max_tokens"], json!(256));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Errors: one request per call, and what the engine needs to retry.

#[tokio::test]
async fn a_429_is_one_request_whose_error_carries_retry_after() {
    for wire in WIRES {
        let server = FakeModel::start(move |_, _| {
            Reply::json(
                429,
                &json!({"error": {"type": "rate_limit_error", "message": "slow down"}}),
            )
            .header("retry-after", "7")
        })
        .await;
        let p = provider(wire, &server, |_| {});
        match call(&p).await.unwrap_err() {
            e @ ProviderError::Http {
                status: 429,
                retry_after_ms: Some(7_000),
                ..
            } => assert!(e.is_transient(), "{wire:?}"),
            other => panic!("{wire:?}: {other:?}"),
        }
        assert_eq!(
            server.seen().len(),
            1,
            "{wire:?}: the provider never retries"
        );
    }
}

#[tokio::test]
async fn server_errors_are_one_request_each_and_transient() {
    for (wire, status) in [
        (Wire::OpenAi, 500),
        (Wire::OpenAi, 503),
        (Wire::Anthropic, 529),
        (Wire::Anthropic, 500),
    ] {
        let server = FakeModel::start(move |_, _| {
            Reply::json(
                status,
                &json!({"error": {"type": "overloaded_error", "message": "busy"}}),
            )
        })
        .await;
        let p = provider(wire, &server, |_| {});
        let err = call(&p).await.unwrap_err();
        assert!(err.is_transient(), "{wire:?} {status}: {err}");
        assert_eq!(server.seen().len(), 1, "{wire:?} {status}");
    }
}

#[tokio::test]
async fn an_error_keeps_status_url_and_a_capped_body() {
    for wire in WIRES {
        let big = "x".repeat(100_000);
        let server = FakeModel::start(move |_, _| Reply {
            status: 503,
            headers: vec![],
            pieces: vec![format!("upstream unavailable {big}").into_bytes()],
            after: After::End,
            delay: Duration::ZERO,
            raw: false,
        })
        .await;
        let p = provider(wire, &server, |_| {});
        let err = call(&p).await.unwrap_err();
        assert!(err.is_transient(), "{wire:?}");
        match &err {
            ProviderError::Http {
                status,
                body,
                retry_after_ms,
                ..
            } => {
                assert_eq!(*status, 503);
                assert_eq!(*retry_after_ms, None);
                assert!(body.starts_with("upstream unavailable xxx"), "{wire:?}");
                assert!(body.ends_with("… (cut at 16384 bytes)"), "{wire:?}");
                assert!(body.len() < 16_500, "{}", body.len());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(server.seen().len(), 1, "{wire:?}");
    }
}

#[tokio::test]
async fn a_long_retry_after_is_handed_to_the_engine_with_its_value() {
    let server = FakeModel::start(|_, _| {
        Reply::json(429, &json!({"error": {"message": "quota"}})).header("retry-after", "3600")
    })
    .await;
    let p = provider(Wire::OpenAi, &server, |_| {});
    match call(&p).await.unwrap_err() {
        ProviderError::Http {
            status: 429,
            retry_after_ms: Some(3_600_000),
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn an_overloaded_error_event_ends_the_stream_before_or_after_content() {
    let start = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":3,"output_tokens":1}}}

"#;
    let text = r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"partial"}}

"#;
    let error = r#"event: error
data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}

"#;
    // Before any content: a transient error, for the engine to retry.
    let first = format!("{start}{error}");
    let server = FakeModel::start(move |_, _| Reply::sse(vec![first.clone().into_bytes()])).await;
    let p = provider(Wire::Anthropic, &server, |_| {});
    let err = call(&p).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Remote { kind, .. } if kind == "overloaded_error")
            && err.is_transient(),
        "{err:?}"
    );
    assert_eq!(server.seen().len(), 1);

    // After content: the stream hands out what it had, then the error.
    let second = format!("{start}{text}{error}");
    let server = FakeModel::start(move |_, _| Reply::sse(vec![second.clone().into_bytes()])).await;
    let p = provider(Wire::Anthropic, &server, |_| {});
    let items: Vec<_> = p.stream(&request("hi")).collect().await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(
        items[0].as_ref().unwrap(),
        &ProviderEvent::TextDelta("partial".into())
    );
    match &items[1] {
        Err(e @ ProviderError::Remote { kind, .. }) => {
            assert_eq!(kind, "overloaded_error");
            assert!(e.is_transient());
            assert_eq!(
                e.to_string(),
                "provider `anthropic`: the model reported `overloaded_error` mid-stream: Overloaded"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.seen().len(), 1, "one request per call");
}

// ---------------------------------------------------------------------------
// Broken streams.

#[tokio::test]
async fn a_stream_that_stops_mid_way_is_retried_only_if_nothing_was_handed_out() {
    for wire in WIRES {
        let full = String::from_utf8(
            render_stream(
                wire,
                &ScriptedTurn {
                    text: "one two three four".into(),
                    usage: Some(Usage {
                        input_tokens: 3,
                        output_tokens: 4,
                    }),
                    ..ScriptedTurn::default()
                },
            )
            .into_bytes(),
        )
        .unwrap();
        // Cut right after the second text delta's event.
        let marker = match wire {
            Wire::OpenAi => "two ",
            Wire::Anthropic => "two ",
        };
        let cut_at = full.find(marker).unwrap();
        let cut_at = cut_at + full[cut_at..].find("\n\n").unwrap() + 2;
        let cut = full[..cut_at].to_owned();
        let server = FakeModel::start(move |_, _| {
            Reply::sse(awkward_pieces(cut.as_bytes())).then(After::Cut)
        })
        .await;
        let p = provider(wire, &server, |_| {});
        let items: Vec<_> = p.stream(&request("hi")).collect().await;
        let deltas: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                Ok(ProviderEvent::TextDelta(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, ["one ", "two "], "{wire:?}");
        match items.last().unwrap() {
            Err(e @ ProviderError::Transport { message, .. }) => {
                assert!(e.is_transient());
                assert!(message.contains("broke off"), "{message}");
            }
            other => panic!("{wire:?}: {other:?}"),
        }
        assert_eq!(server.seen().len(), 1, "{wire:?}: one request per call");

        // Cut before any content: a transient error, for the engine to
        // retry; still one request.
        let head = full[..full.find("\n\n").unwrap() + 2].to_owned();
        let server = FakeModel::start(move |_, _| {
            Reply::sse(vec![head.clone().into_bytes()]).then(After::Cut)
        })
        .await;
        let p = provider(wire, &server, |_| {});
        let err = call(&p).await.unwrap_err();
        assert!(err.is_transient(), "{wire:?}: {err}");
        assert_eq!(server.seen().len(), 1, "{wire:?}");
    }
}

#[tokio::test]
async fn invalid_json_is_a_permanent_protocol_error_naming_what_was_malformed() {
    for (wire, body, expected) in [
        (
            Wire::OpenAi,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\": [{\"delta\": oops}]}\n\n",
            "provider `openai`: malformed response: chunk 2 is not JSON (expected value at line 1 column 24): {\"choices\": [{\"delta\": oops}]}",
        ),
        (
            Wire::Anthropic,
            "event: message_start\ndata: {\"type\": \"message_start\", \"message\": \n\n",
            "provider `anthropic`: malformed response: the data of a `message_start` event is not JSON (EOF while parsing a value at line 1 column 37): {\"type\": \"message_start\", \"message\": ",
        ),
    ] {
        let server =
            FakeModel::start(move |_, _| Reply::sse(awkward_pieces(body.as_bytes()))).await;
        let p = provider(wire, &server, |_| {});
        let err = call(&p).await.unwrap_err();
        assert!(matches!(err, ProviderError::Protocol { .. }), "{err:?}");
        assert!(!err.is_transient());
        assert_eq!(err.to_string(), expected);
        assert_eq!(server.seen().len(), 1, "a protocol error is not retried");
    }
    // A whole response that is not JSON.
    let server = FakeModel::start(|_, _| Reply {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        pieces: vec![b"<html>gateway</html>".to_vec()],
        after: After::End,
        delay: Duration::ZERO,
        raw: false,
    })
    .await;
    let p = provider(Wire::OpenAi, &server, |_| {});
    let err = call(&p).await.unwrap_err();
    assert!(
        err.to_string().contains("the response is not JSON")
            && err.to_string().ends_with("<html>gateway</html>"),
        "{err}"
    );
}

#[tokio::test]
async fn a_slow_server_past_the_timeout_is_a_transient_transport_error() {
    for wire in WIRES {
        // No response head in time.
        let server = FakeModel::start(|_, _| Reply {
            delay: Duration::from_secs(60),
            ..Reply::sse(vec![])
        })
        .await;
        let p = provider(wire, &server, |c| {
            c.timeout = Duration::from_millis(300);
        });
        let err = call(&p).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            matches!(&err, ProviderError::Transport { message, .. } if message.ends_with("no response within 300ms")),
            "{err}"
        );
        assert!(err.is_transient(), "timeouts are transient");
        assert_eq!(server.seen().len(), 1, "one request per call");

        // A stream that stalls after its first event.
        let stall = ok_stream(wire);
        let first = stall[..stall.windows(2).position(|w| w == b"\n\n").unwrap() + 2].to_vec();
        let server =
            FakeModel::start(move |_, _| Reply::sse(vec![first.clone()]).then(After::Hang)).await;
        let p = provider(wire, &server, |c| {
            c.timeout = Duration::from_millis(300);
        });
        let err = call(&p).await.unwrap_err();
        assert!(
            matches!(&err, ProviderError::Transport { message, .. } if message.ends_with("no data for 300ms mid-stream")),
            "{err}"
        );
        // The stalled connection was closed, not left behind.
        server
            .wait_for("the stalled connection closed", |s| {
                s.closed_by_client() == 1
            })
            .await;
    }
}

#[tokio::test]
async fn a_refused_connection_is_a_transient_transport_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let config = HttpConfig::new(format!("http://127.0.0.1:{port}/v1"));
    let p =
        OpenAiProvider::with_client(config, OpenAiOptions::default(), HttpClient::new()).unwrap();
    let p: Arc<dyn ModelProvider> = Arc::new(p);
    let err = call(&p).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "provider `openai`: cannot reach the model: POST http://127.0.0.1:{port}/v1/chat/completions: cannot connect to 127.0.0.1:{port}"
        )),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// Cancellation, pooling, the concurrency cap.

#[tokio::test]
async fn dropping_the_stream_mid_way_closes_the_connection() {
    for wire in WIRES {
        let stream = ok_stream(wire);
        // Everything up to the first text delta, then nothing.
        let text_at = stream.windows(4).position(|w| w == b"\"ok\"").unwrap();
        let end = text_at
            + stream[text_at..]
                .windows(2)
                .position(|w| w == b"\n\n")
                .unwrap()
            + 2;
        let head = stream[..end].to_vec();
        let server =
            FakeModel::start(move |_, _| Reply::sse(vec![head.clone()]).then(After::Hang)).await;
        let p = provider(wire, &server, |_| {});
        let mut s = p.stream(&request("hi"));
        assert_eq!(
            s.next().await.unwrap().unwrap(),
            ProviderEvent::TextDelta("ok".into())
        );
        assert_eq!(server.closed_by_client(), 0);
        drop(s);
        server
            .wait_for("the client close the connection", |s| {
                s.closed_by_client() == 1
            })
            .await;
    }
}

#[tokio::test]
async fn connections_are_pooled_per_origin_and_reused() {
    for wire in WIRES {
        let ok = ok_stream(wire);
        let server = FakeModel::start(move |_, _| Reply::sse(awkward_pieces(&ok))).await;
        let client = HttpClient::new();
        let p = provider_on(wire, &server, client.clone(), |_| {});
        for _ in 0..3 {
            assert_eq!(call(&p).await.unwrap(), ok_response());
        }
        // A second provider on the same client shares the pool.
        let q = provider_on(wire, &server, client.clone(), |_| {});
        assert_eq!(call(&q).await.unwrap(), ok_response());
        assert_eq!(server.seen().len(), 4);
        assert_eq!(server.connections(), 1, "{wire:?}: one connection, reused");
        assert_eq!(client.idle_connections(), 1);
    }
}

#[tokio::test]
async fn a_provider_caps_its_calls_in_flight() {
    let gate = Arc::new(Semaphore::new(0));
    let ok = ok_stream(Wire::OpenAi);
    let server = FakeModel::start_gated(
        move |_, _| Reply::sse(vec![ok.clone()]),
        Some(Arc::clone(&gate)),
    )
    .await;
    let p = provider(Wire::OpenAi, &server, |c| c.max_concurrent_calls = 2);
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let p = Arc::clone(&p);
            tokio::spawn(async move { call(&p).await })
        })
        .collect();
    // Two calls reach the server; the other three wait for a slot.
    server
        .wait_for("two requests", |s| s.seen().len() == 2)
        .await;
    // Time for a third to arrive if the cap let it through (not a
    // measurement: the assertions below hold however long this takes).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.seen().len(), 2);
    // Let them through one at a time.
    for done in 1..=5 {
        gate.add_permits(1);
        server
            .wait_for("an answer finish", |s| s.seen().len() >= (done + 2).min(5))
            .await;
    }
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), ok_response());
    }
    assert_eq!(server.max_in_flight(), 2);
}

// ---------------------------------------------------------------------------
// Conformance and end to end.

/// A conversation: two parallel tool calls into the sandbox, then a
/// sequential one, then the answer. Texts hold multi-byte characters.
const CONVERSATION: &str = r#"
[[turns]]
text = "Let me look — both files ☕."
usage = { input_tokens = 120, output_tokens = 30 }
[[turns.tool_calls]]
id = "call_a1"
name = "files__read_file"
arguments = { path = "input.txt" }
[[turns.tool_calls]]
id = "call_a2"
name = "files__search"
arguments = { pattern = "input", path = "." }

[[turns]]
usage = { input_tokens = 260, output_tokens = 12 }
[[turns.tool_calls]]
id = "call_b1"
name = "files__read_file"
arguments = { path = "missing.txt" }

[[turns]]
text = "The file says “the input file”; there is no missing.txt."
usage = { input_tokens = 330, output_tokens = 18 }
"#;

pub(crate) fn conversation() -> Vec<ScriptedTurn> {
    ScriptedProvider::parse(CONVERSATION, Path::new("conversation.toml"), false)
        .unwrap()
        .turns()
        .to_vec()
}

/// The agent file for `provider`, with the built-in fs plugin (`files`)
/// read-only over `work/`.
fn agent_text(model: &str) -> String {
    format!(
        r#"
name = "conformance"
instructions = "Answer from the files."

[model]
{model}

[plugins.files]
source = "builtin:fs"
approval = {{ read_file = "never", search = "never" }}
[plugins.files.grant.mounts.workspace]
dir = "work"
access = "read-only"
"#
    )
}

pub(crate) fn write_agent(dir: &Path, model: &str) -> Agent {
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::write(dir.join("work/input.txt"), "the input file\n").unwrap();
    std::fs::write(dir.join("conversation.toml"), CONVERSATION).unwrap();
    std::fs::write(dir.join("agent.toml"), agent_text(model)).unwrap();
    Agent::load(&dir.join("agent.toml"), None).unwrap()
}

pub(crate) fn model_table(wire: Option<Wire>, server: Option<&FakeModel>, extra: &str) -> String {
    match (wire, server) {
        (None, _) => {
            "provider = \"scripted\"\nname = \"test-model\"\ntranscript = \"conversation.toml\""
                .into()
        }
        (Some(w), Some(s)) => format!(
            "provider = \"{}\"\nname = \"test-model\"\nbase_url = \"{}\"\ntimeout = \"10s\"\n{extra}",
            w.name(),
            w.base_url(s)
        ),
        (Some(_), None) => unreachable!(),
    }
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

/// Runs `agent` to its end; returns the log and the text deltas streamed.
async fn run(agent: &Agent) -> (RunStatus, Vec<Event>, Vec<String>) {
    let rt = runtime();
    let id = warden::engine::RunId::new("conformance-run").unwrap();
    let run = rt
        .start(
            agent,
            json!("What do the files say?"),
            StartOptions::new().id(id),
        )
        .await
        .unwrap();
    let mut updates = rt.subscribe(&run);
    let status = rt.drive(&run, agent).await.unwrap();
    let events = rt.events(&run).await.unwrap();
    let mut deltas = Vec::new();
    while let Ok(Some(update)) =
        tokio::time::timeout(Duration::from_millis(1), updates.next()).await
    {
        if let RunUpdate::TextDelta { text, .. } = update {
            deltas.push(text);
        }
    }
    (status, events, deltas)
}

/// The log without `run_started` (its digest names the provider), without
/// the provider each model call's intent names, and with the measured
/// parts of receipts zeroed.
fn comparable(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .skip(1)
        .cloned()
        .map(|mut e| {
            match &mut e {
                Event::ToolCallCompleted(c) => {
                    c.receipt.wall_time_us = 0;
                    c.receipt.fuel_consumed = 0;
                    c.receipt.peak_memory_bytes = 0;
                }
                Event::ModelCallIntent(i) => i.provider = None,
                _ => {}
            }
            e
        })
        .collect()
}

fn completions(events: &[Event]) -> Vec<ModelCallCompleted> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ModelCallCompleted(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn every_provider_feeds_the_engine_the_same_events_for_the_same_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let scripted = write_agent(dir.path(), &model_table(None, None, ""));
    let (status, control, control_deltas) = run(&scripted).await;
    assert_eq!(status, RunStatus::Completed);
    assert_eq!(completions(&control).len(), 3);

    // The requests the engine made, recorded with their intents.
    let requests: Vec<ModelRequest> = control
        .iter()
        .filter_map(|e| match e {
            Event::ModelCallIntent(i) => i.request.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(requests.len(), 3);
    let scripted_provider = scripted.model.provider().unwrap();
    let events_of = |p: Arc<dyn ModelProvider>, r: ModelRequest| async move {
        p.stream(&r)
            .map(|e| e.unwrap())
            .collect::<Vec<ProviderEvent>>()
            .await
    };

    for wire in WIRES {
        let server = scripted_server(wire, conversation()).await;
        let http = provider(wire, &server, |_| {});
        // Provider by provider, request by request: the same events.
        for r in &requests {
            assert_eq!(
                events_of(Arc::clone(&http), r.clone()).await,
                events_of(Arc::clone(&scripted_provider), r.clone()).await,
                "{wire:?}"
            );
        }
        // Through the engine: the same log and the same streamed deltas.
        let agent = write_agent(dir.path(), &model_table(Some(wire), Some(&server), ""));
        let (status, events, deltas) = run(&agent).await;
        assert_eq!(status, RunStatus::Completed, "{wire:?}");
        assert_eq!(comparable(&events), comparable(&control), "{wire:?}");
        assert_eq!(deltas, control_deltas, "{wire:?}");
    }
}

#[tokio::test]
async fn streamed_and_whole_responses_record_the_same_completions() {
    let dir = tempfile::tempdir().unwrap();
    for wire in WIRES {
        let server = scripted_server(wire, conversation()).await;
        let streamed = write_agent(dir.path(), &model_table(Some(wire), Some(&server), ""));
        let (status, streamed, _) = run(&streamed).await;
        assert_eq!(status, RunStatus::Completed, "{wire:?}");
        let whole = write_agent(
            dir.path(),
            &model_table(Some(wire), Some(&server), "stream = false"),
        );
        let (status, whole, _) = run(&whole).await;
        assert_eq!(status, RunStatus::Completed, "{wire:?}");
        assert_eq!(completions(&whole), completions(&streamed), "{wire:?}");
        assert_eq!(comparable(&whole), comparable(&streamed), "{wire:?}");
        let streams: Vec<Value> = server
            .seen()
            .iter()
            .map(|s| s.json()["stream"].clone())
            .collect();
        assert_eq!(
            streams,
            [
                json!(true),
                json!(true),
                json!(true),
                json!(false),
                json!(false),
                json!(false)
            ]
        );
    }
}

#[tokio::test]
async fn an_openai_agent_runs_end_to_end_with_tools_in_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let server = scripted_server(Wire::OpenAi, conversation()).await;
    let agent = write_agent(
        dir.path(),
        &model_table(Some(Wire::OpenAi), Some(&server), ""),
    );
    let (status, events, _) = run(&agent).await;
    assert_eq!(status, RunStatus::Completed);
    let Some(Event::RunCompleted(done)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(
        done.output,
        json!("The file says “the input file”; there is no missing.txt.")
    );

    // The second request carries both parallel calls and their results,
    // the file's content read in the sandbox.
    let second = server.seen()[1].json();
    let messages = second["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(messages[2]["tool_calls"][1]["id"], json!("call_a2"));
    assert_eq!(messages[3]["tool_call_id"], json!("call_a1"));
    assert!(
        messages[3]["content"]
            .as_str()
            .unwrap()
            .contains("the input file"),
        "{}",
        messages[3]
    );
    assert_eq!(messages[4]["tool_call_id"], json!("call_a2"));
    let tools: Vec<&str> = second["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"files__read_file") && tools.contains(&"files__search"),
        "{tools:?}"
    );
    // The failed read went back as the tool's error.
    let third = server.seen()[2].json();
    let last = third["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["tool_call_id"], json!("call_b1"));
    // Usage fed the run's totals.
    let usage: Vec<Usage> = completions(&events).iter().map(|c| c.usage).collect();
    assert_eq!(
        usage[0],
        Usage {
            input_tokens: 120,
            output_tokens: 30
        }
    );
}

#[tokio::test]
async fn an_anthropic_agent_runs_end_to_end_and_replays_its_thinking_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let turns = conversation();
    let thinking =
        json!({"type": "thinking", "thinking": "Both files, in parallel.", "signature": "sig-Eq1"});
    let kept = thinking.clone();
    let server = FakeModel::start(move |seen, _| {
        let n = turn_index(seen);
        let kept: &[Value] = if n == 0 {
            std::slice::from_ref(&kept)
        } else {
            &[]
        };
        Reply::sse(awkward_pieces(anthropic_stream(&turns[n], kept).as_bytes()))
    })
    .await;
    let agent = write_agent(
        dir.path(),
        &model_table(
            Some(Wire::Anthropic),
            Some(&server),
            "[model.pricing]\ninput_per_million = 3.0\noutput_per_million = 15.0",
        ),
    );
    let (status, events, _) = run(&agent).await;
    assert_eq!(status, RunStatus::Completed);
    let done = completions(&events);
    // The block is recorded with the first completion, and priced usage with each.
    assert_eq!(
        done[0].blocks,
        [RawBlock {
            format: "anthropic".into(),
            index: 0,
            block: thinking.clone(),
        }]
    );
    assert!(done[1].blocks.is_empty());
    assert_eq!(done[0].cost_nanos, Some(120 * 3_000 + 30 * 15_000));
    // And sent back, in its place, with the tool results as one user turn.
    let second = server.seen()[1].json();
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1]["role"], json!("assistant"));
    assert_eq!(messages[1]["content"][0], thinking);
    assert_eq!(messages[1]["content"][1]["type"], json!("text"));
    assert_eq!(messages[1]["content"][2]["id"], json!("call_a1"));
    let results: Vec<&Value> = messages[2]["content"].as_array().unwrap().iter().collect();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["type"], json!("tool_result"));
    assert_eq!(results[0]["tool_use_id"], json!("call_a1"));
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("the input file")
    );
    // The failed read is flagged as an error.
    let third = server.seen()[2].json();
    let last = third["messages"].as_array().unwrap().last().unwrap()["content"][0].clone();
    assert_eq!(
        (last["tool_use_id"].clone(), last["is_error"].clone()),
        (json!("call_b1"), json!(true))
    );
}

#[tokio::test]
async fn a_stream_broken_after_its_first_event_is_recorded_once_and_the_step_retried() {
    for wire in WIRES {
        let dir = tempfile::tempdir().unwrap();
        let turns = conversation();
        let server = FakeModel::start(move |seen, n| {
            let turn = &turns[turn_index(seen)];
            let full = render_stream(wire, turn);
            if n == 0 {
                // The first request breaks off after the first text delta.
                let at = full.find("Let ").unwrap();
                let end = at + full[at..].find("\n\n").unwrap() + 2;
                Reply::sse(vec![full.as_bytes()[..end].to_vec()]).then(After::Cut)
            } else {
                Reply::sse(awkward_pieces(full.as_bytes()))
            }
        })
        .await;
        let agent = write_agent(dir.path(), &model_table(Some(wire), Some(&server), ""));
        let (status, events, _) = run(&agent).await;
        assert_eq!(status, RunStatus::Completed, "{wire:?}");
        let kinds: Vec<&str> = events.iter().take(5).map(|e| e.kind().as_str()).collect();
        assert_eq!(
            kinds,
            [
                "run_started",
                "model_call_intent",
                "model_call_failed",
                "model_call_intent",
                "model_call_completed"
            ],
            "{wire:?}"
        );
        let Event::ModelCallFailed(f) = &events[2] else {
            unreachable!()
        };
        assert!(
            f.error.transient && f.error.message.contains("broke off"),
            "{:?}",
            f.error
        );
        // One completion per step: the broken attempt left none.
        let steps: Vec<u32> = completions(&events).iter().map(|c| c.step).collect();
        assert_eq!(steps, [1, 2, 3], "{wire:?}");
    }
}

#[tokio::test]
async fn cancelling_a_run_mid_stream_closes_the_connection() {
    for wire in WIRES {
        let dir = tempfile::tempdir().unwrap();
        let turns = conversation();
        let server = FakeModel::start(move |_, _| {
            let full = render_stream(wire, &turns[0]);
            let at = full.find("Let ").unwrap();
            let end = at + full[at..].find("\n\n").unwrap() + 2;
            Reply::sse(vec![full.as_bytes()[..end].to_vec()]).then(After::Hang)
        })
        .await;
        let agent = write_agent(dir.path(), &model_table(Some(wire), Some(&server), ""));
        let rt = runtime();
        let run = rt
            .start(&agent, json!("go"), StartOptions::new())
            .await
            .unwrap();
        let mut updates = rt.subscribe(&run);
        let driver = {
            let (rt, run, agent) = (rt.clone(), run.clone(), agent.clone());
            tokio::spawn(async move { rt.drive(&run, &agent).await })
        };
        // Wait for the first streamed text, then cancel.
        loop {
            match updates.next().await {
                Some(RunUpdate::TextDelta { text, .. }) => {
                    assert_eq!(text, "Let ");
                    break;
                }
                Some(_) => {}
                None => panic!("the runtime went away"),
            }
        }
        rt.cancel(&run, None, Some("operator".into()))
            .await
            .unwrap();
        assert_eq!(
            driver.await.unwrap().unwrap(),
            RunStatus::Cancelled,
            "{wire:?}"
        );
        server
            .wait_for("the connection close", |s| s.closed_by_client() == 1)
            .await;
        let events = rt.events(&run).await.unwrap();
        assert_eq!(events.last().unwrap().kind().as_str(), "run_cancelled");
    }
}

#[tokio::test]
async fn the_cli_runs_an_openai_agent_with_its_key_from_the_environment_and_never_shows_it() {
    let key = "sk-cli-test-7f3a9c0d2e1b";
    let dir = tempfile::tempdir().unwrap();
    let server = scripted_server(Wire::OpenAi, conversation()).await;
    write_agent(
        dir.path(),
        &model_table(
            Some(Wire::OpenAi),
            Some(&server),
            "api_key_env = \"WARDEN_TEST_OPENAI_KEY\"",
        ),
    );
    let output = tokio::process::Command::new(warden_binary())
        .args(["run", "agent.toml", "What do the files say?", "--store"])
        .arg(dir.path().join("runs.db"))
        .current_dir(dir.path())
        .env("WARDEN_TEST_OPENAI_KEY", key)
        .env("RUST_LOG", "trace")
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Exit 0: the run completed.
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains(key) && !stderr.contains(key),
        "the key leaked"
    );
    assert!(stderr.contains("model_http_request"), "requests are traced");
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.header("authorization"), Some(&*format!("Bearer {key}")));
    }

    // Without the variable, the run is refused before anything is recorded,
    // naming the variable.
    let output = tokio::process::Command::new(warden_binary())
        .args(["run", "agent.toml", "again", "--store"])
        .arg(dir.path().join("runs.db"))
        .current_dir(dir.path())
        .env_remove("WARDEN_TEST_OPENAI_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "environment variable `WARDEN_TEST_OPENAI_KEY` is not set (model.api_key_env)"
        ),
        "{stderr}"
    );
    assert_eq!(server.seen().len(), 3, "nothing was sent");
}

#[tokio::test]
async fn the_local_model_example_runs_against_an_openai_compatible_server() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    let path = examples.join("code-review-local.toml");
    let agent = Agent::load(&path, None).unwrap();
    let http = agent.model.http.clone().unwrap();
    assert_eq!(http.base_url, "http://localhost:11434/v1");
    assert_eq!(http.api_key_env, None);

    // The same agent pointed at the fake server: it lists the tree in the
    // sandbox, then answers.
    let turns = ScriptedProvider::parse(
        r#"
[[turns]]
usage = { input_tokens = 10, output_tokens = 5 }
[[turns.tool_calls]]
id = "call_1"
name = "fs__list_dir"
arguments = { path = "." }

[[turns]]
text = "No findings."
usage = { input_tokens = 20, output_tokens = 3 }
"#,
        Path::new("t.toml"),
        false,
    )
    .unwrap()
    .turns()
    .to_vec();
    let server = scripted_server(Wire::OpenAi, turns).await;
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("http://localhost:11434/v1", &server.url("/v1"));
    let agent = Agent::parse(&text, &path, None).unwrap();
    let (status, events, _) = run(&agent).await;
    assert_eq!(status, RunStatus::Completed, "{events:?}");
    let listed = server.seen()[1].json()["messages"][3]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(listed.contains("STYLE.md"), "{listed}");
}
