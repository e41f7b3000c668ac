//! The Anthropic Messages API (`POST {base_url}/v1/messages`).
//!
//! The request: the instructions as `system`, the quoted context (if any)
//! as the first block of the first user turn, user messages, assistant
//! messages as content blocks (kept blocks in their recorded places, then
//! `text` and `tool_use`), tool results as `tool_result` blocks in the next
//! user message (consecutive results and user text merged into one user
//! turn, as the API wants turns to alternate), the tools with their input
//! schemas, `max_tokens`, and the `anthropic-version` header.
//!
//! The streamed response: `message_start` (input usage), then per content
//! block `content_block_start`, `content_block_delta` (`text_delta`,
//! `input_json_delta` for a `tool_use` block's input, others for other
//! blocks) and `content_block_stop`; `message_delta` (stop reason, output
//! usage); `message_stop`. `ping` and unknown event types are ignored, as
//! the API asks. An `error` event mid-stream ends the call with
//! [`ProviderError::Remote`], transient for `overloaded_error`, `api_error`,
//! `rate_limit_error` and `timeout_error`.
//!
//! Text deltas are handed out as they come, a tool call at its block's
//! stop, usage and the stop reason at `message_stop`. A block of any other
//! type (`thinking` with its signature, `redacted_thinking`, server tool
//! blocks, types newer than this build) is rebuilt from its start and its
//! deltas (string fields appended, `partial_json` parsed into `input`,
//! `citation`s collected) and handed out verbatim as a
//! [`RawBlock`], so it is recorded and sent back in its
//! place.
//!
//! Strict and lenient: data that is not JSON, an event out of order, or
//! bytes that are not UTF-8 before the response is complete are a protocol
//! error; anything after `message_stop` is ignored; a body that ends after
//! `message_delta` carried the stop reason is complete even without
//! `message_stop` (or the blank line that would dispatch it); one that ends
//! before is incomplete (transient).
//!
//! Input usage counts cache writes and reads (`cache_creation_input_tokens`,
//! `cache_read_input_tokens`) with `input_tokens`: all of it was read.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value, json};

use super::http::{
    DecodeError, HttpClient, HttpConfig, HttpModel, Secret, StreamDecoder, WireFormat,
    error_is_transient, preview,
};
use super::sse::SseEvent;
use super::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderError, ProviderEvent, RawBlock,
    StopReason, ToolCall, Usage,
};

/// Anthropic's API, the default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` sent when the agent sets none.
pub const DEFAULT_API_VERSION: &str = "2023-06-01";
/// The name blocks from this wire format carry ([`RawBlock::format`]).
pub const FORMAT: &str = "anthropic";

/// What is particular to the Anthropic wire format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnthropicOptions {
    /// The `anthropic-version` header. Default: [`DEFAULT_API_VERSION`].
    pub api_version: String,
}

impl Default for AnthropicOptions {
    fn default() -> Self {
        AnthropicOptions {
            api_version: DEFAULT_API_VERSION.into(),
        }
    }
}

/// A model behind the Anthropic Messages API.
#[derive(Clone, Debug)]
pub struct AnthropicProvider {
    model: HttpModel,
}

impl AnthropicProvider {
    /// A provider for `config` on the process-wide client.
    pub fn new(config: HttpConfig, options: AnthropicOptions) -> Result<Self, ProviderError> {
        Self::with_client(config, options, HttpClient::shared())
    }

    /// A provider on `client`.
    pub fn with_client(
        config: HttpConfig,
        options: AnthropicOptions,
        client: HttpClient,
    ) -> Result<Self, ProviderError> {
        Ok(AnthropicProvider {
            model: HttpModel::new(Box::new(AnthropicWire { options }), config, client)?,
        })
    }

    /// The URL calls go to, as errors show it (no query).
    pub fn url(&self) -> &str {
        self.model.url()
    }
}

impl ModelProvider for AnthropicProvider {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        self.model.stream(request)
    }
}

struct AnthropicWire {
    options: AnthropicOptions,
}

impl WireFormat for AnthropicWire {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn path(&self) -> &'static str {
        "/v1/messages"
    }

    fn headers(&self, api_key: Option<&Secret>) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        if let Some(key) = api_key {
            let mut value = HeaderValue::from_str(key.expose())
                .map_err(|_| "the API key holds characters not allowed in a header".to_owned())?;
            value.set_sensitive(true);
            headers.insert("x-api-key", value);
        }
        let version = HeaderValue::from_str(&self.options.api_version).map_err(|_| {
            format!(
                "`{}` is not a valid anthropic-version",
                self.options.api_version
            )
        })?;
        headers.insert("anthropic-version", version);
        Ok(headers)
    }

    fn body(&self, request: &ModelRequest, stream: bool) -> Value {
        request_body(request, stream)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(Decoder::default())
    }

    fn whole(&self, body: &[u8]) -> Result<Vec<ProviderEvent>, DecodeError> {
        whole_response(body)
    }
}

/// The content blocks of an assistant message: `text`, then `tool_use`,
/// with the kept blocks put back at their recorded indexes.
fn assistant_content(text: &str, calls: &[ToolCall], blocks: &[RawBlock]) -> Vec<Value> {
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for c in calls {
        let input = match &c.arguments {
            Value::Object(_) => c.arguments.clone(),
            // Arguments that were not an object cannot be sent as input.
            _ => json!({}),
        };
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
    }
    let mut kept: Vec<&RawBlock> = blocks.iter().filter(|b| b.format == FORMAT).collect();
    kept.sort_by_key(|b| b.index);
    for b in kept {
        let at = (b.index as usize).min(content.len());
        content.insert(at, b.block.clone());
    }
    content
}

/// The request body for `request`, as sent.
pub fn request_body(request: &ModelRequest, stream: bool) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    // Appends content to the last message if it has `role`, else starts one.
    let mut push = |role: &str, blocks: Vec<Value>| {
        if let Some(last) = messages.last_mut()
            && last["role"] == role
            && let Some(content) = last["content"].as_array_mut()
        {
            content.extend(blocks);
            return;
        }
        messages.push(json!({"role": role, "content": blocks}));
    };
    if !request.context.is_empty() {
        // Quoted data, not instructions: the first block of the first user
        // turn, never the system prompt.
        push(
            "user",
            vec![json!({"type": "text", "text": request.context})],
        );
    }
    for message in &request.messages {
        match message {
            Message::User { content } => {
                push("user", vec![json!({"type": "text", "text": content})])
            }
            Message::Assistant {
                text,
                tool_calls,
                blocks,
            } => {
                let content = assistant_content(text, tool_calls, blocks);
                if !content.is_empty() {
                    push("assistant", content);
                }
            }
            Message::Tool {
                call_id,
                content,
                is_error,
                ..
            } => {
                let mut block =
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
                if *is_error {
                    block["is_error"] = json!(true);
                }
                push("user", vec![block]);
            }
        }
    }
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": messages,
        "stream": stream,
    });
    if !request.instructions.is_empty() {
        body["system"] = json!(request.instructions);
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
    }
    body
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" => StopReason::EndTurn,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "stop_sequence" => StopReason::StopSequence,
        "refusal" => StopReason::Refusal,
        _ => StopReason::Other,
    }
}

/// Input tokens (cache writes and reads included) and output tokens, where
/// `usage` reports them.
fn usage_parts(usage: &Value) -> (Option<u64>, Option<u64>) {
    let n = |k: &str| usage.get(k).and_then(Value::as_u64);
    let input = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .filter_map(|k| n(k))
    .reduce(|a, b| a + b);
    (input, n("output_tokens"))
}

/// An `error` event's or response's error object as a remote error,
/// classified by its type, then its code, then its status (see
/// [`error_is_transient`]).
fn remote_error(error: &Value) -> DecodeError {
    let kind = error
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("error")
        .to_owned();
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string());
    DecodeError::Remote {
        kind,
        message,
        transient: error_is_transient(error, None),
    }
}

enum Block {
    Text,
    Tool {
        id: String,
        name: String,
        input: Value,
        json: String,
    },
    Kept {
        block: Map<String, Value>,
        json: String,
    },
}

impl Block {
    fn start(index: u64, block: &Value) -> Result<Block, DecodeError> {
        let kind = block.get("type").and_then(Value::as_str).ok_or_else(|| {
            DecodeError::Malformed(format!(
                "content block {index} has no `type`: {}",
                preview(&block.to_string())
            ))
        })?;
        Ok(match kind {
            "text" => Block::Text,
            "tool_use" => {
                let field = |k: &str| {
                    block
                        .get(k)
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .ok_or_else(|| {
                            DecodeError::Malformed(format!("tool_use block {index} has no `{k}`"))
                        })
                };
                Block::Tool {
                    id: field("id")?,
                    name: field("name")?,
                    input: block.get("input").cloned().unwrap_or_else(|| json!({})),
                    json: String::new(),
                }
            }
            _ => Block::Kept {
                block: block.as_object().cloned().unwrap_or_default(),
                json: String::new(),
            },
        })
    }

    /// The event the block is once it stopped.
    fn stop(self, index: u64) -> Option<ProviderEvent> {
        let parse = |json: &str, start: Value| {
            if json.trim().is_empty() {
                start
            } else {
                serde_json::from_str(json).unwrap_or_else(|_| Value::String(json.to_owned()))
            }
        };
        match self {
            Block::Text => None,
            Block::Tool {
                id,
                name,
                input,
                json,
            } => Some(ProviderEvent::ToolCall(ToolCall {
                id,
                name,
                arguments: parse(&json, input),
            })),
            Block::Kept { mut block, json } => {
                if !json.is_empty() {
                    let start = block.remove("input").unwrap_or_else(|| json!({}));
                    block.insert("input".into(), parse(&json, start));
                }
                Some(ProviderEvent::Block(RawBlock {
                    format: FORMAT.into(),
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    block: Value::Object(block),
                }))
            }
        }
    }
}

/// The streamed response's state.
#[derive(Default)]
struct Decoder {
    blocks: BTreeMap<u64, Block>,
    input: u64,
    output: u64,
    stop: Option<StopReason>,
    started: bool,
    done: bool,
}

fn index_of(data: &Value, kind: &str) -> Result<u64, DecodeError> {
    data.get("index")
        .and_then(Value::as_u64)
        .ok_or_else(|| DecodeError::Malformed(format!("`{kind}` without an `index`")))
}

impl Decoder {
    /// The response's last events: blocks that never stopped (they still
    /// count), usage, the stop reason.
    fn complete(&mut self, stop: StopReason) -> Vec<ProviderEvent> {
        self.done = true;
        let mut out = Vec::new();
        for (index, block) in std::mem::take(&mut self.blocks) {
            out.extend(block.stop(index));
        }
        out.push(ProviderEvent::Usage(Usage {
            input_tokens: self.input,
            output_tokens: self.output,
        }));
        out.push(ProviderEvent::Stop(stop));
        out
    }

    fn usage(&mut self, usage: &Value) {
        let (input, output) = usage_parts(usage);
        self.input = self.input.max(input.unwrap_or(0));
        self.output = self.output.max(output.unwrap_or(0));
    }
}

impl StreamDecoder for Decoder {
    fn event(&mut self, event: &SseEvent) -> Result<Vec<ProviderEvent>, DecodeError> {
        if self.done {
            return Ok(Vec::new());
        }
        let data: Value = serde_json::from_str(&event.data).map_err(|e| {
            DecodeError::Malformed(format!(
                "the data of a `{}` event is not JSON ({e}): {}",
                event.event,
                preview(&event.data)
            ))
        })?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(&event.event)
            .to_owned();
        let mut out = Vec::new();
        match kind.as_str() {
            "message_start" => {
                self.started = true;
                if let Some(usage) = data.pointer("/message/usage") {
                    self.usage(usage);
                }
            }
            "content_block_start" => {
                let index = index_of(&data, &kind)?;
                let block = data.get("content_block").ok_or_else(|| {
                    DecodeError::Malformed(format!(
                        "`content_block_start` {index} has no `content_block`"
                    ))
                })?;
                if let Some(text) = block.get("text").and_then(Value::as_str)
                    && block.get("type").and_then(Value::as_str) == Some("text")
                    && !text.is_empty()
                {
                    out.push(ProviderEvent::TextDelta(text.to_owned()));
                }
                self.blocks.insert(index, Block::start(index, block)?);
            }
            "content_block_delta" => {
                let index = index_of(&data, &kind)?;
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let delta_kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
                let block = self.blocks.get_mut(&index).ok_or_else(|| {
                    DecodeError::Malformed(format!(
                        "a `{delta_kind}` for content block {index}, which never started"
                    ))
                })?;
                match (block, delta_kind) {
                    (Block::Text, "text_delta") => {
                        if let Some(text) = delta.get("text").and_then(Value::as_str)
                            && !text.is_empty()
                        {
                            out.push(ProviderEvent::TextDelta(text.to_owned()));
                        }
                    }
                    (Block::Tool { json, .. } | Block::Kept { json, .. }, "input_json_delta") => {
                        json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    (Block::Kept { block, .. }, _) => merge_delta(block, delta),
                    (Block::Text, "citations_delta") => {}
                    (_, other) => {
                        return Err(DecodeError::Malformed(format!(
                            "a `{other}` for content block {index}, which does not take it"
                        )));
                    }
                }
            }
            "content_block_stop" => {
                let index = index_of(&data, &kind)?;
                let block = self.blocks.remove(&index).ok_or_else(|| {
                    DecodeError::Malformed(format!(
                        "`content_block_stop` for content block {index}, which never started"
                    ))
                })?;
                out.extend(block.stop(index));
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(stop_reason(reason));
                }
                if let Some(usage) = data.get("usage") {
                    self.usage(usage);
                }
            }
            "message_stop" => {
                let stop = self.stop.ok_or_else(|| {
                    DecodeError::Malformed("`message_stop` came before any stop reason".into())
                })?;
                out.extend(self.complete(stop));
            }
            "error" => {
                return Err(remote_error(data.get("error").unwrap_or(&data)));
            }
            other => {
                tracing::debug!(event = other, "ignoring an unknown event type");
            }
        }
        Ok(out)
    }

    fn is_complete(&self) -> bool {
        self.done
    }

    fn end(&mut self) -> Result<Vec<ProviderEvent>, DecodeError> {
        if self.done {
            return Ok(Vec::new());
        }
        if let Some(stop) = self.stop {
            // `message_delta` carried the stop reason: it comes after every
            // content block, so only `message_stop` can be missing (or its
            // blank line, so it was never dispatched). The answer is whole.
            return Ok(self.complete(stop));
        }
        Err(DecodeError::Incomplete(if self.started {
            "the stream ended before `message_stop`".into()
        } else {
            "the stream ended before `message_start`".into()
        }))
    }
}

/// Applies a delta to a kept block: string fields are appended, a
/// `citation` joins `citations`, anything else replaces the field.
fn merge_delta(block: &mut Map<String, Value>, delta: &Value) {
    let Some(delta) = delta.as_object() else {
        return;
    };
    for (key, value) in delta {
        match (key.as_str(), value) {
            ("type" | "partial_json", _) => {}
            ("citation", v) => {
                let list = block.entry("citations").or_insert_with(|| json!([]));
                if let Some(list) = list.as_array_mut() {
                    list.push(v.clone());
                }
            }
            (k, Value::String(s)) => match block.get_mut(k) {
                Some(Value::String(existing)) => existing.push_str(s),
                _ => {
                    block.insert(k.to_owned(), Value::String(s.clone()));
                }
            },
            (k, v) => {
                block.insert(k.to_owned(), v.clone());
            }
        }
    }
}

/// The events of a whole (not streamed) message.
pub(crate) fn whole_response(body: &[u8]) -> Result<Vec<ProviderEvent>, DecodeError> {
    let text = String::from_utf8_lossy(body);
    let message: Value = serde_json::from_slice(body).map_err(|e| {
        DecodeError::Malformed(format!(
            "the response is not JSON ({e}): {}",
            preview(&text)
        ))
    })?;
    if message.get("type").and_then(Value::as_str) == Some("error") {
        return Err(remote_error(message.get("error").unwrap_or(&message)));
    }
    let content = message
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            DecodeError::Malformed(format!("the response has no `content`: {}", preview(&text)))
        })?;
    let mut out = Vec::new();
    for (index, block) in content.iter().enumerate() {
        let index = index as u64;
        if block.get("type").and_then(Value::as_str) == Some("text") {
            if let Some(text) = block.get("text").and_then(Value::as_str)
                && !text.is_empty()
            {
                out.push(ProviderEvent::TextDelta(text.to_owned()));
            }
            continue;
        }
        out.extend(Block::start(index, block)?.stop(index));
    }
    let (input, output) = message.get("usage").map_or((None, None), usage_parts);
    out.push(ProviderEvent::Usage(Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
    }));
    let stop = message
        .get("stop_reason")
        .and_then(Value::as_str)
        .ok_or_else(|| DecodeError::Malformed("the response has no `stop_reason`".into()))?;
    out.push(ProviderEvent::Stop(stop_reason(stop)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ResponseAssembler, ToolSpec};

    fn decode(events: &[(&str, &str)]) -> Result<Vec<ProviderEvent>, DecodeError> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for (event, data) in events {
            out.extend(d.event(&SseEvent {
                event: (*event).into(),
                data: (*data).into(),
            })?);
        }
        out.extend(d.end()?);
        Ok(out)
    }

    const THINKING_THEN_TOOL: &[(&str, &str)] = &[
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":100,"cache_read_input_tokens":20,"output_tokens":1}}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"I should "}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"read it."}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        ("ping", r#"{"type":"ping"}"#),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Reading."}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":1}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"fs__read_file","input":{}}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"a."}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"txt\"}"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":2}"#,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ];

    fn thinking_block() -> RawBlock {
        RawBlock {
            format: "anthropic".into(),
            index: 0,
            block: json!({"type": "thinking", "thinking": "I should read it.", "signature": "EqQBCgIYAhIM"}),
        }
    }

    #[test]
    fn text_tool_use_and_unknown_blocks_are_decoded_and_kept() {
        let events = decode(THINKING_THEN_TOOL).unwrap();
        assert_eq!(
            events,
            vec![
                ProviderEvent::Block(thinking_block()),
                ProviderEvent::TextDelta("Reading.".into()),
                ProviderEvent::ToolCall(ToolCall {
                    id: "toolu_1".into(),
                    name: "fs__read_file".into(),
                    arguments: json!({"path": "a.txt"}),
                }),
                ProviderEvent::Usage(Usage {
                    input_tokens: 120,
                    output_tokens: 42
                }),
                ProviderEvent::Stop(StopReason::ToolUse),
            ]
        );
    }

    #[test]
    fn kept_blocks_are_sent_back_in_their_place() {
        let request = ModelRequest {
            model: "claude".into(),
            instructions: "Be brief.".into(),
            context: String::new(),
            messages: vec![
                Message::User {
                    content: "read a".into(),
                },
                Message::Assistant {
                    text: "Reading.".into(),
                    tool_calls: vec![ToolCall {
                        id: "toolu_1".into(),
                        name: "fs__read_file".into(),
                        arguments: json!({"path": "a.txt"}),
                    }],
                    blocks: vec![thinking_block()],
                },
                Message::Tool {
                    call_id: "toolu_1".into(),
                    name: "fs__read_file".into(),
                    content: "no such file".into(),
                    is_error: true,
                },
                Message::User {
                    content: "and then?".into(),
                },
            ],
            tools: vec![ToolSpec {
                name: "fs__read_file".into(),
                description: "Read".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 64,
        };
        assert_eq!(
            request_body(&request, true),
            json!({
                "model": "claude",
                "max_tokens": 64,
                "stream": true,
                "system": "Be brief.",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "read a"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "I should read it.", "signature": "EqQBCgIYAhIM"},
                        {"type": "text", "text": "Reading."},
                        {"type": "tool_use", "id": "toolu_1", "name": "fs__read_file", "input": {"path": "a.txt"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such file", "is_error": true},
                        {"type": "text", "text": "and then?"},
                    ]},
                ],
                "tools": [{"name": "fs__read_file", "description": "Read", "input_schema": {"type": "object"}}],
            })
        );
    }

    #[test]
    fn errors_mid_stream_and_cut_streams_are_typed() {
        let overloaded = decode(&[
            THINKING_THEN_TOOL[0],
            (
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
        ]);
        match overloaded {
            Err(DecodeError::Remote {
                kind,
                message,
                transient,
            }) => {
                assert_eq!(
                    (kind.as_str(), message.as_str(), transient),
                    ("overloaded_error", "Overloaded", true)
                );
            }
            other => panic!("{other:?}"),
        }
        let invalid = decode(&[(
            "error",
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
        )]);
        assert!(matches!(
            invalid,
            Err(DecodeError::Remote {
                transient: false,
                ..
            })
        ));
        match decode(&THINKING_THEN_TOOL[..9]) {
            Err(DecodeError::Incomplete(m)) => assert!(m.contains("before `message_stop`"), "{m}"),
            other => panic!("{other:?}"),
        }
        match decode(&[(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#,
        )]) {
            Err(DecodeError::Malformed(m)) => {
                assert_eq!(m, "a `text_delta` for content block 4, which never started")
            }
            other => panic!("{other:?}"),
        }
        match decode(&[("message_start", "{\"type\": \"message_st")]) {
            Err(DecodeError::Malformed(m)) => assert!(
                m.starts_with("the data of a `message_start` event is not JSON"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_whole_message_yields_what_its_stream_would() {
        let whole = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"thinking","thinking":"I should read it.","signature":"EqQBCgIYAhIM"},{"type":"text","text":"Reading."},{"type":"tool_use","id":"toolu_1","name":"fs__read_file","input":{"path":"a.txt"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":100,"cache_read_input_tokens":20,"output_tokens":42}}"#;
        let assemble = |events: Vec<ProviderEvent>| {
            let mut a = ResponseAssembler::new("anthropic");
            for e in events {
                a.push(e).unwrap();
            }
            a.finish().unwrap()
        };
        assert_eq!(
            assemble(whole_response(whole).unwrap()),
            assemble(decode(THINKING_THEN_TOOL).unwrap())
        );
    }
}
