//! OpenAI-compatible chat completions (`POST {base_url}/chat/completions`):
//! OpenAI itself and the servers that speak its protocol (vLLM, llama.cpp
//! server, Ollama, LM Studio, hosted gateways).
//!
//! The request: the instructions as the `system` message, the quoted
//! context (if any) as the first user message, user messages,
//! assistant messages with their `tool_calls` (arguments as JSON text),
//! each tool result as a `tool` message naming its `tool_call_id`, the
//! tools as `function` tools, `max_tokens` (or `max_completion_tokens`),
//! and with streaming `stream_options.include_usage` so the last chunk
//! reports usage.
//!
//! The streamed response: `data:` chunks of `choices[0].delta` (text in
//! `content`, refusals in `refusal`, tool calls in `tool_calls` pieces
//! keyed by `index`: the id and name come first, the arguments in pieces,
//! several calls interleaved when the model calls tools in parallel), a
//! `finish_reason`, a chunk with `usage` and no choices, and `data: [DONE]`.
//! Text deltas are handed out as they come; tool calls once the finish
//! reason arrives, in index order; usage and the stop reason at `[DONE]`
//! (or at the end of the body after a finish reason, for servers that send
//! no `[DONE]`). A chunk with an `error` member is the server reporting an
//! error mid-stream.
//!
//! Arguments that are not valid JSON are kept as a JSON string (what came,
//! recorded as it was), and so are a call's empty arguments when the
//! finish reason is `length` (the call was cut off before them): the engine
//! rejects such a call with a typed error the model sees. Sent back, any
//! arguments that are not an object are sent as `{}`: a request Warden
//! builds is always valid JSON where the protocol wants JSON.
//!
//! Strict and lenient: a chunk that is not JSON, or bytes that are not
//! UTF-8, before the response is complete are a protocol error (the answer
//! cannot be known); anything after `[DONE]` is ignored, whatever it is;
//! a body that ends after a `finish_reason` without `[DONE]` is complete;
//! one that ends before any `finish_reason` is incomplete (transient). An
//! `error` member mid-stream is the server's error, transient or not by
//! its type, then its code (a proxy's `"code": "500"` is a server error),
//! then its status.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::http::{
    DecodeError, HttpClient, HttpConfig, HttpModel, Secret, StreamDecoder, WireFormat,
    error_is_transient, preview,
};
use super::sse::SseEvent;
use super::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderError, ProviderEvent, StopReason,
    ToolCall, Usage,
};

/// OpenAI's API, the default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Which request field carries the output token cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens`: what most compatible servers read. The default.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models require.
    MaxCompletionTokens,
}

/// What is particular to the OpenAI wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenAiOptions {
    /// The field the output token cap goes in. Default: `max_tokens`.
    pub max_tokens_field: MaxTokensField,
    /// Whether a streamed request asks for usage in the stream
    /// (`stream_options.include_usage`); servers that refuse the option
    /// need it off. Default: true.
    pub stream_usage: bool,
}

impl Default for OpenAiOptions {
    fn default() -> Self {
        OpenAiOptions {
            max_tokens_field: MaxTokensField::MaxTokens,
            stream_usage: true,
        }
    }
}

/// A model behind an OpenAI-compatible chat completions endpoint.
#[derive(Clone, Debug)]
pub struct OpenAiProvider {
    model: HttpModel,
}

impl OpenAiProvider {
    /// A provider for `config` on the process-wide client.
    pub fn new(config: HttpConfig, options: OpenAiOptions) -> Result<Self, ProviderError> {
        Self::with_client(config, options, HttpClient::shared())
    }

    /// A provider on `client`.
    pub fn with_client(
        config: HttpConfig,
        options: OpenAiOptions,
        client: HttpClient,
    ) -> Result<Self, ProviderError> {
        Ok(OpenAiProvider {
            model: HttpModel::new(Box::new(OpenAiWire { options }), config, client)?,
        })
    }

    /// The URL calls go to, as errors show it (no query).
    pub fn url(&self) -> &str {
        self.model.url()
    }
}

impl ModelProvider for OpenAiProvider {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        self.model.stream(request)
    }
}

struct OpenAiWire {
    options: OpenAiOptions,
}

impl WireFormat for OpenAiWire {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn path(&self) -> &'static str {
        "/chat/completions"
    }

    fn headers(&self, api_key: Option<&Secret>) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        if let Some(key) = api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                .map_err(|_| "the API key holds characters not allowed in a header".to_owned())?;
            value.set_sensitive(true);
            headers.insert(http::header::AUTHORIZATION, value);
        }
        Ok(headers)
    }

    fn body(&self, request: &ModelRequest, stream: bool) -> Value {
        request_body(request, stream, self.options)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(Decoder::default())
    }

    fn whole(&self, body: &[u8]) -> Result<Vec<ProviderEvent>, DecodeError> {
        whole_response(body)
    }
}

/// The request body for `request`, as sent.
pub fn request_body(request: &ModelRequest, stream: bool, options: OpenAiOptions) -> Value {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.instructions.is_empty() {
        messages.push(json!({"role": "system", "content": request.instructions}));
    }
    if !request.context.is_empty() {
        // Quoted data, not instructions: a user message, never a system one.
        messages.push(json!({"role": "user", "content": request.context}));
    }
    for message in &request.messages {
        messages.push(match message {
            Message::User { content } => json!({"role": "user", "content": content}),
            Message::Assistant {
                text, tool_calls, ..
            } => {
                let mut m = json!({
                    "role": "assistant",
                    "content": if text.is_empty() { Value::Null } else { Value::String(text.clone()) },
                });
                if !tool_calls.is_empty() {
                    m["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": arguments_text(&c.arguments)},
                            })
                        })
                        .collect();
                }
                m
            }
            Message::Tool {
                call_id, content, ..
            } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
        });
    }
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "stream": stream,
    });
    let field = match options.max_tokens_field {
        MaxTokensField::MaxTokens => "max_tokens",
        MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
    };
    body[field] = json!(request.max_tokens);
    if stream && options.stream_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                })
            })
            .collect();
    }
    body
}

/// Arguments as the wire wants them: the JSON text of an object. Anything
/// else (arguments that were not valid JSON, or cut off, kept as a string
/// in the log) is sent as `{}`: the server parses what it is sent back, and
/// broken text would make the whole conversation unusable. The tool's
/// result tells the model what was wrong with its call.
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::Object(_) => arguments.to_string(),
        _ => "{}".into(),
    }
}

/// Arguments from the wire's JSON text: `{}` when empty, the text itself
/// (as a JSON string) when it is not JSON.
fn parse_arguments(text: &str) -> Value {
    if text.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "stop" => StopReason::EndTurn,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        "content_filter" => StopReason::Refusal,
        _ => StopReason::Other,
    }
}

fn usage_of(value: &Value) -> Option<Usage> {
    let u = value.as_object()?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: n("prompt_tokens"),
        output_tokens: n("completion_tokens"),
    })
}

/// A chunk's or response's `error` member as a remote error, classified
/// by its type, then its code, then its status (see
/// [`error_is_transient`]): a proxy's `{"type": null, "code": "500"}` is
/// a transient server error.
fn remote_error(error: &Value) -> DecodeError {
    let name = |v: Option<&Value>| {
        v.and_then(|v| {
            v.as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .or_else(|| v.as_u64().map(|n| n.to_string()))
        })
    };
    let kind = name(error.get("type"))
        .or_else(|| name(error.get("code")))
        .unwrap_or_else(|| "error".into());
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

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The streamed response's state.
#[derive(Default)]
struct Decoder {
    calls: BTreeMap<u64, PartialCall>,
    /// The index the last tool call piece went to.
    last_index: Option<u64>,
    calls_out: usize,
    finish: Option<StopReason>,
    refused: bool,
    usage: Option<Usage>,
    done: bool,
    chunks: u64,
}

impl Decoder {
    fn flush_calls(&mut self) -> Result<Vec<ProviderEvent>, DecodeError> {
        let calls = std::mem::take(&mut self.calls);
        // Cut off by the token cap, the last call is partial unless its
        // arguments are a whole JSON object: then they are kept as the text
        // that came, never run as a call with empty arguments.
        let cut_at = match self.finish {
            Some(StopReason::MaxTokens) => calls.keys().next_back().copied(),
            _ => None,
        };
        let mut out = Vec::with_capacity(calls.len());
        for (index, call) in calls {
            let arguments = match parse_arguments(&call.arguments) {
                Value::Object(_) if cut_at == Some(index) && call.arguments.trim().is_empty() => {
                    Value::String(call.arguments.clone())
                }
                parsed => parsed,
            };
            if call.name.is_empty() {
                return Err(DecodeError::Malformed(format!(
                    "the tool call at index {index} has no function name"
                )));
            }
            let id = if call.id.is_empty() {
                format!("call_{}", index + 1)
            } else {
                call.id
            };
            out.push(ProviderEvent::ToolCall(ToolCall {
                id,
                name: call.name,
                arguments,
            }));
        }
        self.calls_out += out.len();
        Ok(out)
    }

    fn complete(&mut self) -> Result<Vec<ProviderEvent>, DecodeError> {
        let Some(finish) = self.finish else {
            return Err(DecodeError::Malformed(
                "`[DONE]` came before any `finish_reason`".into(),
            ));
        };
        self.done = true;
        let mut out = self.flush_calls()?;
        if let Some(usage) = self.usage {
            out.push(ProviderEvent::Usage(usage));
        }
        let stop = match finish {
            StopReason::EndTurn if self.calls_out > 0 => StopReason::ToolUse,
            StopReason::EndTurn if self.refused => StopReason::Refusal,
            other => other,
        };
        out.push(ProviderEvent::Stop(stop));
        Ok(out)
    }
}

impl StreamDecoder for Decoder {
    fn event(&mut self, event: &SseEvent) -> Result<Vec<ProviderEvent>, DecodeError> {
        let data = event.data.trim();
        if data.is_empty() || self.done {
            return Ok(Vec::new());
        }
        self.chunks += 1;
        if data == "[DONE]" {
            return self.complete();
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            DecodeError::Malformed(format!(
                "chunk {} is not JSON ({e}): {}",
                self.chunks,
                preview(data)
            ))
        })?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(remote_error(error));
        }
        if let Some(usage) = chunk.get("usage").and_then(usage_of) {
            self.usage = Some(usage);
        }
        let choices = match chunk.get("choices") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(choices)) => choices,
            Some(other) => {
                return Err(DecodeError::Malformed(format!(
                    "chunk {}: `choices` is not an array: {}",
                    self.chunks,
                    preview(&other.to_string())
                )));
            }
        };
        let mut out = Vec::new();
        for choice in choices {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                out.push(ProviderEvent::TextDelta(text.to_owned()));
            }
            if let Some(text) = delta.get("refusal").and_then(Value::as_str)
                && !text.is_empty()
            {
                self.refused = true;
                out.push(ProviderEvent::TextDelta(text.to_owned()));
            }
            match delta.get("tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(pieces)) => {
                    for piece in pieces {
                        self.tool_call_piece(piece)?;
                    }
                }
                Some(other) => {
                    return Err(DecodeError::Malformed(format!(
                        "chunk {}: `tool_calls` is not an array: {}",
                        self.chunks,
                        preview(&other.to_string())
                    )));
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(stop_reason(reason));
                out.extend(self.flush_calls()?);
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
        if self.finish.is_some() {
            // Some servers end the body after the finish reason without
            // `[DONE]`.
            return self.complete();
        }
        Err(DecodeError::Incomplete(format!(
            "the stream ended after {} chunks, before a finish_reason",
            self.chunks
        )))
    }
}

impl Decoder {
    fn tool_call_piece(&mut self, piece: &Value) -> Result<(), DecodeError> {
        let id = piece.get("id").and_then(Value::as_str).unwrap_or("");
        let index = match piece.get("index").and_then(Value::as_u64) {
            Some(i) => i,
            // Servers that omit the index: a piece with an id starts a call.
            None if !id.is_empty() || self.last_index.is_none() => self
                .calls
                .keys()
                .next_back()
                .map_or(self.calls_out as u64, |i| i + 1),
            None => self.last_index.unwrap_or(0),
        };
        self.last_index = Some(index);
        let call = self.calls.entry(index).or_default();
        if !id.is_empty() {
            call.id = id.to_owned();
        }
        let function = piece.get("function").unwrap_or(&Value::Null);
        if let Some(name) = function.get("name").and_then(Value::as_str)
            && call.name.is_empty()
        {
            call.name = name.to_owned();
        }
        match function.get("arguments") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => call.arguments.push_str(s),
            // Some servers send the arguments as an object.
            Some(other) => call.arguments.push_str(&other.to_string()),
        }
        Ok(())
    }
}

/// The events of a whole (not streamed) `chat.completion`.
pub(crate) fn whole_response(body: &[u8]) -> Result<Vec<ProviderEvent>, DecodeError> {
    let text = String::from_utf8_lossy(body);
    let response: Value = serde_json::from_slice(body).map_err(|e| {
        DecodeError::Malformed(format!(
            "the response is not JSON ({e}): {}",
            preview(&text)
        ))
    })?;
    if let Some(error) = response.get("error").filter(|e| !e.is_null()) {
        return Err(remote_error(error));
    }
    let choice = response
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| {
            DecodeError::Malformed(format!("the response has no `choices`: {}", preview(&text)))
        })?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    if let Some(content) = message.get("content").and_then(Value::as_str)
        && !content.is_empty()
    {
        out.push(ProviderEvent::TextDelta(content.to_owned()));
    }
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str)
        && !refusal.is_empty()
    {
        decoder.refused = true;
        out.push(ProviderEvent::TextDelta(refusal.to_owned()));
    }
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, call) in calls.iter().enumerate() {
            let mut piece = call.clone();
            piece["index"] = json!(i);
            decoder.tool_call_piece(&piece)?;
        }
    }
    decoder.usage = response.get("usage").and_then(usage_of);
    decoder.finish = Some(
        choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map_or(StopReason::Other, stop_reason),
    );
    out.extend(decoder.complete()?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ResponseAssembler, ToolSpec};

    fn sse(data: &str) -> SseEvent {
        SseEvent {
            event: "message".into(),
            data: data.into(),
        }
    }

    fn decode(chunks: &[&str]) -> Result<Vec<ProviderEvent>, DecodeError> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(d.event(&sse(c))?);
        }
        out.extend(d.end()?);
        Ok(out)
    }

    #[test]
    fn parallel_tool_calls_are_assembled_from_interleaved_pieces() {
        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"fs__read_file","arguments":""}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"fs__search","arguments":"{\"pat"}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"a"}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"tern\": \"x\"}"}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":".txt\"}"}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":20,"total_tokens":70}}"#,
            "[DONE]",
        ])
        .unwrap();
        assert_eq!(
            events,
            vec![
                ProviderEvent::ToolCall(ToolCall {
                    id: "call_a".into(),
                    name: "fs__read_file".into(),
                    arguments: json!({"path": "a.txt"}),
                }),
                ProviderEvent::ToolCall(ToolCall {
                    id: "call_b".into(),
                    name: "fs__search".into(),
                    arguments: json!({"pattern": "x"}),
                }),
                ProviderEvent::Usage(Usage {
                    input_tokens: 50,
                    output_tokens: 20
                }),
                ProviderEvent::Stop(StopReason::ToolUse),
            ]
        );
    }

    #[test]
    fn text_streams_and_stop_reasons_map() {
        let events = decode(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"length"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert_eq!(
            events,
            vec![
                ProviderEvent::TextDelta("Hel".into()),
                ProviderEvent::TextDelta("lo".into()),
                ProviderEvent::Stop(StopReason::MaxTokens),
            ]
        );
        // A body ending after the finish reason, without [DONE], is complete.
        let events =
            decode(&[r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}"#]).unwrap();
        assert_eq!(
            events.last(),
            Some(&ProviderEvent::Stop(StopReason::EndTurn))
        );
    }

    #[test]
    fn malformed_and_incomplete_streams_are_told_apart() {
        match decode(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#, "{not json"]) {
            Err(DecodeError::Malformed(m)) => {
                assert!(m.starts_with("chunk 2 is not JSON"), "{m}");
                assert!(m.ends_with("{not json"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        match decode(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#]) {
            Err(DecodeError::Incomplete(m)) => assert!(m.contains("before a finish_reason"), "{m}"),
            other => panic!("{other:?}"),
        }
        match decode(&[r#"{"choices":{"x":1}}"#]) {
            Err(DecodeError::Malformed(m)) => {
                assert!(m.contains("`choices` is not an array"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        match decode(&["[DONE]"]) {
            Err(DecodeError::Malformed(m)) => {
                assert!(m.contains("before any `finish_reason`"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        match decode(&[r#"{"error":{"message":"The server had an error","type":"server_error"}}"#])
        {
            Err(DecodeError::Remote {
                kind, transient, ..
            }) => {
                assert_eq!(kind, "server_error");
                assert!(transient);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arguments_that_are_not_json_are_kept_as_text_and_sent_back_as_an_empty_object() {
        let events = decode(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"t","arguments":"{oops"}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        let ProviderEvent::ToolCall(call) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(call.arguments, json!("{oops"));
        assert_eq!(arguments_text(&call.arguments), "{}");
        assert_eq!(arguments_text(&json!([1])), "{}");
        // Cut off by the token cap: the last call's empty arguments are
        // kept as what came, not run as `{}`.
        let events = decode(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"t","arguments":"{}"}},{"index":1,"id":"b","function":{"name":"t"}}]},"finish_reason":"length"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        let args: Vec<&Value> = events
            .iter()
            .filter_map(|e| match e {
                ProviderEvent::ToolCall(c) => Some(&c.arguments),
                _ => None,
            })
            .collect();
        assert_eq!(args, [&json!({}), &json!("")]);
        assert_eq!(
            events.last(),
            Some(&ProviderEvent::Stop(StopReason::MaxTokens))
        );
        assert_eq!(arguments_text(&json!({"a": 1})), r#"{"a":1}"#);
        assert_eq!(parse_arguments("  "), json!({}));
    }

    #[test]
    fn the_request_carries_system_tools_results_and_usage_options() {
        let request = ModelRequest {
            model: "gpt-4o".into(),
            instructions: "Be brief.".into(),
            context: String::new(),
            messages: vec![
                Message::User {
                    content: "read a".into(),
                },
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "fs__read_file".into(),
                        arguments: json!({"path": "a"}),
                    }],
                    blocks: vec![],
                },
                Message::Tool {
                    call_id: "call_1".into(),
                    name: "fs__read_file".into(),
                    content: "hello".into(),
                    is_error: false,
                },
            ],
            tools: vec![ToolSpec {
                name: "fs__read_file".into(),
                description: "Read".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 100,
        };
        let body = request_body(&request, true, OpenAiOptions::default());
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o",
                "stream": true,
                "max_tokens": 100,
                "stream_options": {"include_usage": true},
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "read a"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "fs__read_file", "arguments": "{\"path\":\"a\"}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
                ],
                "tools": [{"type": "function", "function": {"name": "fs__read_file", "description": "Read", "parameters": {"type": "object"}}}],
            })
        );
        let options = OpenAiOptions {
            max_tokens_field: MaxTokensField::MaxCompletionTokens,
            stream_usage: false,
        };
        let body = request_body(&request, false, options);
        assert_eq!(body["max_completion_tokens"], json!(100));
        assert!(body.get("max_tokens").is_none() && body.get("stream_options").is_none());
    }

    #[test]
    fn a_whole_response_yields_what_its_stream_would() {
        let whole = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Let me look.","tool_calls":[{"id":"call_a","type":"function","function":{"name":"t","arguments":"{\"x\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#;
        let streamed = decode(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"look."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"t","arguments":"{\"x\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
            "[DONE]",
        ])
        .unwrap();
        let assemble = |events: Vec<ProviderEvent>| {
            let mut a = ResponseAssembler::new("openai");
            for e in events {
                a.push(e).unwrap();
            }
            a.finish().unwrap()
        };
        assert_eq!(assemble(whole_response(whole).unwrap()), assemble(streamed));
    }
}
