//! Model providers: the [`ModelProvider`] trait every provider implements,
//! the [`ModelRequest`] the engine sends (instructions, [`Message`]s, tool
//! specs), the [`ProviderEvent`]s a provider streams back, the
//! [`ResponseAssembler`] that turns them into one [`ModelResponse`], and the
//! typed [`ProviderError`] (transient or permanent).
//!
//! [`scripted`] replays a transcript file, offline and deterministically: the
//! default for the demo and the tests. [`openai`] speaks OpenAI-compatible
//! chat completions and [`anthropic`] the Anthropic Messages API, both over
//! [`http`] (the shared client, error classification, the call loop) and `sse`
//! (server-sent events).
//!
//! Invariant: this module knows nothing about runs, events or budgets. The
//! engine builds requests and records responses; a provider only talks to a
//! model.

pub mod anthropic;
pub mod compaction;
pub mod config;
pub mod http;
pub mod openai;
pub mod scripted;
mod sse;

use std::pin::Pin;

use futures::Stream;
use serde::{Deserialize, Serialize};

pub use anthropic::{AnthropicOptions, AnthropicProvider};
pub use http::{HttpClient, HttpConfig, PostError, Secret};
pub use openai::{MaxTokensField, OpenAiOptions, OpenAiProvider};
pub use scripted::{ScriptError, ScriptedProvider};

/// One request to a model: everything the model sees for one call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRequest {
    /// The model, as the provider names it.
    pub model: String,
    /// The system prompt: the agent's instructions.
    pub instructions: String,
    /// Context and memory, quoted as non-authoritative data (see
    /// `engine::context`): sent as the first user message, before the
    /// conversation. Empty when the agent has no context source; omitted
    /// then, so requests without context keep their recorded bytes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub context: String,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call. The engine accepts calls to exactly
    /// these names.
    pub tools: Vec<ToolSpec>,
    /// The most output tokens the model may produce in this call.
    pub max_tokens: u32,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// What the user asked.
    User {
        /// The text.
        content: String,
    },
    /// What the model answered: text, tool calls, or both.
    Assistant {
        /// The text. Empty when the model only called tools.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        /// The tools it called, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Content blocks the engine does not interpret (reasoning, server
        /// tool results), kept verbatim so the provider can send them back.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        blocks: Vec<RawBlock>,
    },
    /// The result of one tool call, answering the assistant's call with the
    /// same id.
    Tool {
        /// The id of the call, as the model gave it.
        call_id: String,
        /// The tool's name, as the model called it.
        name: String,
        /// The result as text: JSON, or the error message.
        content: String,
        /// Whether the call failed (or was denied or rejected).
        #[serde(default, skip_serializing_if = "is_false")]
        is_error: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A tool call the model made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The provider's id for the call; tool results refer to it.
    pub id: String,
    /// The tool's name, as offered in [`ModelRequest::tools`].
    pub name: String,
    /// The arguments, normally a JSON object.
    pub arguments: serde_json::Value,
}

/// A content block of a model's answer that the engine does not interpret
/// (a reasoning block and its signature, a server-side tool's use and
/// result, a block type newer than this build), kept verbatim: it is
/// recorded with the completion and sent back, in its place, whenever the
/// conversation is replayed to the same wire format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBlock {
    /// The wire format it came from (`anthropic`); only that format sends
    /// it back.
    pub format: String,
    /// Its position among the answer's content blocks, from 0.
    pub index: u32,
    /// The block as the provider sent it, its deltas applied.
    pub block: serde_json::Value,
}

/// The longest tool name every model API Warden speaks accepts (OpenAI
/// and Anthropic both cap at 64 bytes).
pub const MAX_TOOL_NAME: usize = 64;

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: serde_json::Value,
}

/// Tokens one model call used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Tokens read (the prompt).
    pub input_tokens: u64,
    /// Tokens written (the answer).
    pub output_tokens: u64,
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It wants its tool calls run.
    ToolUse,
    /// It hit the request's `max_tokens`: the answer is cut short.
    MaxTokens,
    /// It produced a stop sequence.
    StopSequence,
    /// It refused to answer.
    Refusal,
    /// Anything else the provider reported.
    Other,
}

impl StopReason {
    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::ToolUse => "tool_use",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
            StopReason::Refusal => "refusal",
            StopReason::Other => "other",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a streamed model response.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderEvent {
    /// More of the answer's text.
    TextDelta(String),
    /// A complete tool call (providers assemble argument deltas first).
    ToolCall(ToolCall),
    /// A complete content block the engine keeps without interpreting.
    Block(RawBlock),
    /// Token usage so far. A provider may report it more than once; the
    /// largest value seen for each field wins.
    Usage(Usage),
    /// The response is complete. Nothing follows it.
    Stop(StopReason),
}

/// The stream of one model call. Dropping it cancels the call.
pub type ModelStream =
    Pin<Box<dyn Stream<Item = Result<ProviderEvent, ProviderError>> + Send + 'static>>;

/// A model behind some protocol. Object-safe: the engine holds an
/// `Arc<dyn ModelProvider>`.
///
/// A provider makes one request per [`stream`](ModelProvider::stream) and
/// never retries: a failure ends the stream with a typed error (transient
/// or not, with what `Retry-After` asked for), and the engine, the one
/// retry layer, records it and decides whether and when to call again.
pub trait ModelProvider: Send + Sync {
    /// The provider's name, as written in agent files (`scripted`, …).
    fn name(&self) -> &str;

    /// Starts one call. The stream yields text deltas and tool calls in
    /// order, usage, and ends with [`ProviderEvent::Stop`]; or it yields an
    /// error and ends.
    fn stream(&self, request: &ModelRequest) -> ModelStream;
}

/// A complete model response.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelResponse {
    /// The answer's text, deltas joined.
    pub text: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Blocks kept verbatim, in order.
    pub blocks: Vec<RawBlock>,
    /// Tokens used; zero where the provider reported none.
    pub usage: Usage,
    /// Why the model stopped.
    pub stop_reason: Option<StopReason>,
}

/// Builds a [`ModelResponse`] from streamed events, so a caller can forward
/// each event (for example text deltas to subscribers) while assembling.
#[derive(Debug, Default)]
pub struct ResponseAssembler {
    provider: String,
    response: ModelResponse,
}

impl ResponseAssembler {
    /// An assembler for a response from `provider` (named in errors).
    pub fn new(provider: &str) -> Self {
        ResponseAssembler {
            provider: provider.to_owned(),
            response: ModelResponse::default(),
        }
    }

    /// Adds one event. An event after [`ProviderEvent::Stop`] is a protocol
    /// error.
    pub fn push(&mut self, event: ProviderEvent) -> Result<(), ProviderError> {
        if let Some(stop) = self.response.stop_reason {
            return Err(ProviderError::Protocol {
                provider: self.provider.clone(),
                message: format!("an event arrived after the stop reason `{stop}`"),
            });
        }
        match event {
            ProviderEvent::TextDelta(delta) => self.response.text.push_str(&delta),
            ProviderEvent::ToolCall(call) => self.response.tool_calls.push(call),
            ProviderEvent::Block(block) => self.response.blocks.push(block),
            ProviderEvent::Usage(usage) => {
                let total = &mut self.response.usage;
                total.input_tokens = total.input_tokens.max(usage.input_tokens);
                total.output_tokens = total.output_tokens.max(usage.output_tokens);
            }
            ProviderEvent::Stop(reason) => self.response.stop_reason = Some(reason),
        }
        Ok(())
    }

    /// The response. A stream that ended without a stop reason is a protocol
    /// error: the answer may be cut short.
    pub fn finish(self) -> Result<ModelResponse, ProviderError> {
        if self.response.stop_reason.is_none() {
            return Err(ProviderError::Protocol {
                provider: self.provider,
                message: "the stream ended without a stop reason".into(),
            });
        }
        Ok(self.response)
    }
}

/// Runs `stream` to its end and assembles the response.
pub async fn collect_response(
    provider: &str,
    mut stream: ModelStream,
) -> Result<ModelResponse, ProviderError> {
    use futures::StreamExt;
    let mut assembler = ResponseAssembler::new(provider);
    while let Some(event) = stream.next().await {
        assembler.push(event?)?;
    }
    assembler.finish()
}

/// A model call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The model could not be reached: connect error, reset, timeout.
    /// Transient.
    #[error("provider `{provider}`: cannot reach the model: {message}")]
    Transport {
        /// The provider.
        provider: String,
        /// What went wrong.
        message: String,
    },
    /// The server answered with an error status. Transient or not as the
    /// body's error object says (its type, then its code), else by status:
    /// 408, 409, 429, 529 and 5xx are transient.
    #[error("provider `{provider}`: {url} answered {status}: {body}")]
    Http {
        /// The provider.
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The URL, without secrets.
        url: String,
        /// The response body, size-capped.
        body: String,
        /// What `Retry-After` asked for, in milliseconds.
        retry_after_ms: Option<u64>,
        /// Whether trying again may succeed (see above).
        transient: bool,
    },
    /// The model's API reported an error in the middle of a response (an
    /// `error` event). Transient when its kind says so (overloaded, a
    /// server error, a rate limit).
    #[error("provider `{provider}`: the model reported `{kind}` mid-stream: {message}")]
    Remote {
        /// The provider.
        provider: String,
        /// The error's type, as the API named it.
        kind: String,
        /// Its message.
        message: String,
        /// Whether trying again may succeed.
        transient: bool,
    },
    /// The response could not be understood: malformed JSON or stream, an
    /// event out of order. Permanent.
    #[error("provider `{provider}`: malformed response: {message}")]
    Protocol {
        /// The provider.
        provider: String,
        /// What was malformed.
        message: String,
    },
    /// The request cannot be made: missing configuration, an unknown model.
    /// Permanent.
    #[error("provider `{provider}`: cannot make the request: {message}")]
    InvalidRequest {
        /// The provider.
        provider: String,
        /// Why.
        message: String,
    },
    /// The scripted provider's transcript is unreadable, malformed or used
    /// up. Permanent.
    #[error(transparent)]
    Script(#[from] ScriptError),
}

impl ProviderError {
    /// Whether trying the same request again later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ProviderError::Transport { .. } => true,
            ProviderError::Http { transient, .. } | ProviderError::Remote { transient, .. } => {
                *transient
            }
            ProviderError::Protocol { .. }
            | ProviderError::InvalidRequest { .. }
            | ProviderError::Script(_) => false,
        }
    }

    /// The stable code naming this error in the command line's `--json`
    /// envelope, the HTTP API and the Python package (docs/json-output.md).
    pub fn code(&self) -> &'static str {
        match self {
            ProviderError::Transport { .. } => "provider_unreachable",
            ProviderError::Http { .. } => "provider_http",
            ProviderError::InvalidRequest { .. } => "provider_invalid",
            ProviderError::Script(_) => "transcript_invalid",
            ProviderError::Remote { .. } | ProviderError::Protocol { .. } => "provider_failed",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            ProviderError::Http {
                provider,
                status,
                url,
                ..
            } => json!({ "provider": provider, "status": status, "url": url }),
            ProviderError::Transport { provider, .. }
            | ProviderError::InvalidRequest { provider, .. }
            | ProviderError::Remote { provider, .. }
            | ProviderError::Protocol { provider, .. } => json!({ "provider": provider }),
            ProviderError::Script(_) => json!({}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_serialize_tagged_by_role_and_omit_empty_fields() {
        let cases = [
            (
                Message::User {
                    content: "hi".into(),
                },
                r#"{"role":"user","content":"hi"}"#,
            ),
            (
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "fs__read_file".into(),
                        arguments: json!({"path": "a"}),
                    }],
                    blocks: vec![],
                },
                r#"{"role":"assistant","tool_calls":[{"id":"c1","name":"fs__read_file","arguments":{"path":"a"}}]}"#,
            ),
            (
                Message::Tool {
                    call_id: "c1".into(),
                    name: "fs__read_file".into(),
                    content: "boom".into(),
                    is_error: true,
                },
                r#"{"role":"tool","call_id":"c1","name":"fs__read_file","content":"boom","is_error":true}"#,
            ),
        ];
        for (message, text) in cases {
            assert_eq!(serde_json::to_string(&message).unwrap(), text);
            assert_eq!(serde_json::from_str::<Message>(text).unwrap(), message);
        }
        let unknown = r#"{"role":"user","content":"hi","extra":1}"#;
        assert!(serde_json::from_str::<Message>(unknown).is_err());
    }

    #[test]
    fn the_assembler_joins_deltas_keeps_the_largest_usage_and_needs_a_stop() {
        let mut a = ResponseAssembler::new("p");
        for event in [
            ProviderEvent::TextDelta("hel".into()),
            ProviderEvent::Usage(Usage {
                input_tokens: 10,
                output_tokens: 1,
            }),
            ProviderEvent::TextDelta("lo".into()),
            ProviderEvent::Usage(Usage {
                input_tokens: 0,
                output_tokens: 7,
            }),
            ProviderEvent::Stop(StopReason::EndTurn),
        ] {
            a.push(event).unwrap();
        }
        let err = a.push(ProviderEvent::TextDelta("late".into())).unwrap_err();
        assert!(err.to_string().contains("after the stop reason"), "{err}");
        let r = a.finish().unwrap();
        assert_eq!(r.text, "hello");
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 10,
                output_tokens: 7
            }
        );
        assert_eq!(r.stop_reason, Some(StopReason::EndTurn));

        let mut a = ResponseAssembler::new("p");
        a.push(ProviderEvent::TextDelta("cut".into())).unwrap();
        let err = a.finish().unwrap_err();
        assert!(
            matches!(err, ProviderError::Protocol { .. }) && !err.is_transient(),
            "{err}"
        );
    }

    #[test]
    fn transient_and_permanent_errors() {
        let http = |status| ProviderError::Http {
            provider: "p".into(),
            status,
            url: "https://api.example.com/v1".into(),
            body: String::new(),
            retry_after_ms: None,
            transient: http::status_is_transient(status),
        };
        for status in [408, 409, 429, 500, 503, 529] {
            assert!(http(status).is_transient(), "{status}");
        }
        for status in [400, 401, 403, 404, 422] {
            assert!(!http(status).is_transient(), "{status}");
        }
        let transport = ProviderError::Transport {
            provider: "p".into(),
            message: "reset".into(),
        };
        assert!(transport.is_transient());
        assert_eq!(
            http(429).to_string(),
            "provider `p`: https://api.example.com/v1 answered 429: "
        );
    }
}
