//! The scripted provider: replays a transcript file of assistant turns,
//! offline and deterministically. The default for the demo and the tests.
//!
//! A transcript, in TOML (or the same shape in JSON, for a `.json` file):
//!
//! ```toml
//! [[turns]]
//! text = "Let me read the notes."          # optional
//! [[turns.tool_calls]]
//! name = "fs__read_file"                   # as the engine names tools
//! arguments = { path = "notes.txt" }       # optional; default {}
//! id = "read-1"                            # optional; default call_<turn>_<n>
//!
//! [[turns]]
//! text = "The notes say hello."
//! text_after_error = "I could not read the notes."  # optional: after a failed or denied call
//! usage = { input_tokens = 120, output_tokens = 8 }   # optional
//! stop_reason = "end_turn"                 # optional
//! ```
//!
//! With `repeat = true` at the top, the turns start again at the first
//! after the last, so a session's runs can go on past the transcript.
//!
//! Which turn answers a request is read off the request itself: the turn
//! after the assistant messages already in its conversation. So the provider
//! keeps no state, a retried call gets the same turn again, and a run
//! recovered after a crash picks up exactly where its log ends.
//!
//! A summary after a compaction counts for the model turns it says it
//! replaces. A compaction call (the request whose instructions are
//! [`COMPACTION_INSTRUCTIONS`]) is not a turn: it is answered with a summary
//! made from the quoted transcript itself, the first line of each entry.
//!
//! Without `usage`, a turn reports an estimate: a token per 4 bytes of the
//! request's JSON (input) and of the turn's text and tool calls (output).
//! Without `stop_reason`, a turn stops with `tool_use` if it calls tools and
//! `end_turn` otherwise.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::compaction::{COMPACTION_INSTRUCTIONS, summarised_turns};

use super::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderEvent, StopReason, ToolCall, Usage,
};

/// A transcript that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file cannot be read.
    #[error("cannot read transcript `{path}`: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The file is not valid TOML or JSON, or has unknown or mistyped keys.
    #[error("transcript `{path}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// One turn is not acceptable.
    #[error("transcript `{path}`: turn {turn}: {message}")]
    InvalidTurn {
        /// The file.
        path: PathBuf,
        /// The turn, counting from 1.
        turn: usize,
        /// What is wrong.
        message: String,
    },
    /// The model was asked for a turn past the last one.
    #[error(
        "transcript `{path}` has {turns} turns and all were used: the model was asked for turn {requested}"
    )]
    Exhausted {
        /// The file.
        path: PathBuf,
        /// How many turns it has.
        turns: usize,
        /// The turn asked for, counting from 1.
        requested: usize,
    },
}

/// One assistant turn of a transcript.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedTurn {
    /// The answer's text. Default: none.
    #[serde(default)]
    pub text: String,
    /// The text instead of `text` when a tool result just before this turn
    /// is an error (a call denied, rejected or failed), so a transcript can
    /// tell the truth after a refusal. Default: `text` either way.
    #[serde(default)]
    pub text_after_error: Option<String>,
    /// The tools it calls, in order. Default: none.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// The usage it reports. Default: an estimate (see the module docs).
    pub usage: Option<Usage>,
    /// Why it stops. Default: `tool_use` with tool calls, else `end_turn`.
    pub stop_reason: Option<StopReason>,
}

/// One tool call in a scripted turn.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    /// The call's id. Default: `call_<turn>_<n>`, both counting from 1.
    pub id: Option<String>,
    /// The tool, as offered to the model.
    pub name: String,
    /// The arguments, a table (object). Default: `{}`.
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TranscriptFile {
    turns: Vec<ScriptedTurn>,
    /// After the last turn, start again at the first.
    #[serde(default)]
    repeat: bool,
}

/// Replays a transcript. Cheap to share: it holds no state between calls.
#[derive(Clone, Debug)]
pub struct ScriptedProvider {
    path: PathBuf,
    turns: Vec<ScriptedTurn>,
    repeat: bool,
}

impl ScriptedProvider {
    /// Reads a transcript: JSON if the file name ends in `.json`, TOML
    /// otherwise.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|error| ScriptError::Read {
            path: path.to_owned(),
            error,
        })?;
        let json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        Self::parse(&text, path, json)
    }

    /// Parses transcript text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path, json: bool) -> Result<Self, ScriptError> {
        let parsed: Result<TranscriptFile, String> = if json {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            toml::from_str(text).map_err(|e| warden_syntax::toml_errors::one_line(text, &e))
        };
        let file = parsed.map_err(|message| ScriptError::Parse {
            path: path.to_owned(),
            message,
        })?;
        Ok(Self::from_turns(path, file.turns)?.repeating(file.repeat))
    }

    /// The same provider, starting again at the first turn after the last
    /// when `repeat` is set (a session example that can be run again).
    pub fn repeating(mut self, repeat: bool) -> Self {
        self.repeat = repeat;
        self
    }

    /// A provider over `turns`; `path` names the transcript in errors.
    pub fn from_turns(
        path: impl Into<PathBuf>,
        mut turns: Vec<ScriptedTurn>,
    ) -> Result<Self, ScriptError> {
        let path = path.into();
        if turns.is_empty() {
            return Err(ScriptError::Parse {
                path,
                message: "has no turns: add at least one [[turns]]".into(),
            });
        }
        for (i, turn) in turns.iter_mut().enumerate() {
            let invalid = |message: String| ScriptError::InvalidTurn {
                path: path.clone(),
                turn: i + 1,
                message,
            };
            if turn.text.is_empty() && turn.tool_calls.is_empty() {
                return Err(invalid("has neither text nor tool calls".into()));
            }
            let mut ids = BTreeSet::new();
            for (n, call) in turn.tool_calls.iter_mut().enumerate() {
                if call.name.is_empty() {
                    return Err(invalid(format!("tool call {} has an empty name", n + 1)));
                }
                if !call.arguments.is_object() {
                    return Err(invalid(format!(
                        "tool call {} (`{}`): arguments must be a table (object), got `{}`",
                        n + 1,
                        call.name,
                        call.arguments
                    )));
                }
                let id = call
                    .id
                    .get_or_insert_with(|| format!("call_{}_{}", i + 1, n + 1));
                if id.is_empty() {
                    return Err(invalid(format!("tool call {} has an empty id", n + 1)));
                }
                if !ids.insert(id.clone()) {
                    return Err(invalid(format!("tool call id `{id}` is used twice")));
                }
            }
        }
        Ok(ScriptedProvider {
            path,
            turns,
            repeat: false,
        })
    }

    /// The transcript's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The turns.
    pub fn turns(&self) -> &[ScriptedTurn] {
        &self.turns
    }

    /// The events answering `request`, or why there are none.
    pub fn events_for(&self, request: &ModelRequest) -> Result<Vec<ProviderEvent>, ScriptError> {
        if request.instructions == COMPACTION_INSTRUCTIONS {
            return Ok(summary_events(request));
        }
        let index = request
            .messages
            .iter()
            .map(|m| match m {
                Message::Assistant { .. } => 1,
                other => summarised_turns(other).unwrap_or(0),
            })
            .sum::<usize>();
        let index = if self.repeat {
            index % self.turns.len()
        } else {
            index
        };
        let turn = self
            .turns
            .get(index)
            .ok_or_else(|| ScriptError::Exhausted {
                path: self.path.clone(),
                turns: self.turns.len(),
                requested: index + 1,
            })?;
        let after_error = request
            .messages
            .iter()
            .rev()
            .map_while(|m| match m {
                Message::Tool { is_error, .. } => Some(*is_error),
                _ => None,
            })
            .any(|e| e);
        let text = match &turn.text_after_error {
            Some(text) if after_error => text,
            _ => &turn.text,
        };
        let mut events: Vec<ProviderEvent> = text
            .split_inclusive(' ')
            .map(|chunk| ProviderEvent::TextDelta(chunk.to_owned()))
            .collect();
        let calls: Vec<ToolCall> = turn
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone().unwrap_or_default(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        let usage = turn.usage.unwrap_or_else(|| estimate_usage(request, turn));
        events.extend(calls.into_iter().map(ProviderEvent::ToolCall));
        events.push(ProviderEvent::Usage(usage));
        let stop = turn.stop_reason.unwrap_or(if turn.tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        });
        events.push(ProviderEvent::Stop(stop));
        Ok(events)
    }
}

/// The answer to a compaction call: the first line of each entry of the
/// quoted transcript, in order.
fn summary_events(request: &ModelRequest) -> Vec<ProviderEvent> {
    let transcript: String = request
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::User { content } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    let mut lines = transcript.lines();
    let mut parts = Vec::new();
    while let Some(line) = lines.next() {
        if line.starts_with('[') && line.ends_with(']') {
            let first = lines.next().unwrap_or_default();
            let cut = first.char_indices().nth(80).map_or(first.len(), |(i, _)| i);
            parts.push(format!("{} {}", line, &first[..cut]));
        }
    }
    let text = format!("Scripted summary: {}", parts.join("; "));
    let request_bytes = serde_json::to_vec(request).map_or(0, |v| v.len());
    vec![
        ProviderEvent::TextDelta(text.clone()),
        ProviderEvent::Usage(Usage {
            input_tokens: (request_bytes as u64).div_ceil(4),
            output_tokens: (text.len() as u64).div_ceil(4),
        }),
        ProviderEvent::Stop(StopReason::EndTurn),
    ]
}

fn estimate_usage(request: &ModelRequest, turn: &ScriptedTurn) -> Usage {
    let tokens = |bytes: usize| (bytes as u64).div_ceil(4).max(1);
    let request_bytes = serde_json::to_vec(request).map_or(0, |v| v.len());
    let output_bytes = turn.text.len()
        + turn
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.to_string().len())
            .sum::<usize>();
    Usage {
        input_tokens: tokens(request_bytes),
        output_tokens: tokens(output_bytes),
    }
}

impl ModelProvider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        let items: Vec<Result<ProviderEvent, super::ProviderError>> = match self.events_for(request)
        {
            Ok(events) => events.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e.into())],
        };
        Box::pin(futures::stream::iter(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ProviderError, collect_response};
    use serde_json::json;

    const TRANSCRIPT: &str = r#"
[[turns]]
text = "Let me read the notes."
[[turns.tool_calls]]
name = "fs__read_file"
arguments = { path = "notes.txt" }

[[turns]]
text = "They say hello."
usage = { input_tokens = 120, output_tokens = 8 }
"#;

    fn request(assistant_turns: usize) -> ModelRequest {
        let mut messages = vec![Message::User {
            content: "read my notes".into(),
        }];
        for i in 0..assistant_turns {
            messages.push(Message::Assistant {
                text: format!("turn {i}"),
                tool_calls: vec![],
                blocks: vec![],
            });
        }
        ModelRequest {
            model: "demo".into(),
            instructions: "be brief".into(),
            context: String::new(),
            messages,
            tools: vec![],
            max_tokens: 100,
        }
    }

    fn run(
        provider: &ScriptedProvider,
        request: &ModelRequest,
    ) -> Result<super::super::ModelResponse, ProviderError> {
        futures::executor::block_on(collect_response("scripted", provider.stream(request)))
    }

    #[test]
    fn replays_turns_by_the_number_of_assistant_messages() {
        let p = ScriptedProvider::parse(TRANSCRIPT, Path::new("t.toml"), false).unwrap();
        let first = run(&p, &request(0)).unwrap();
        assert_eq!(first.text, "Let me read the notes.");
        assert_eq!(
            first.tool_calls,
            vec![ToolCall {
                id: "call_1_1".into(),
                name: "fs__read_file".into(),
                arguments: json!({"path": "notes.txt"}),
            }]
        );
        assert_eq!(first.stop_reason, Some(StopReason::ToolUse));
        // The estimate: a token per 4 bytes, deterministic.
        let bytes = serde_json::to_vec(&request(0)).unwrap().len() as u64;
        assert_eq!(first.usage.input_tokens, bytes.div_ceil(4));
        // Asked again (a retry, or after a crash): the same turn.
        assert_eq!(run(&p, &request(0)).unwrap(), first);

        let second = run(&p, &request(1)).unwrap();
        assert_eq!(second.text, "They say hello.");
        assert_eq!(second.stop_reason, Some(StopReason::EndTurn));
        assert_eq!(
            second.usage,
            Usage {
                input_tokens: 120,
                output_tokens: 8
            }
        );
    }

    #[test]
    fn text_streams_in_deltas() {
        let p = ScriptedProvider::parse(TRANSCRIPT, Path::new("t.toml"), false).unwrap();
        let events = p.events_for(&request(1)).unwrap();
        let deltas: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                ProviderEvent::TextDelta(d) => Some(d.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, ["They ", "say ", "hello."]);
    }

    #[test]
    fn an_exhausted_script_is_a_permanent_error_naming_the_file_and_turn() {
        let p = ScriptedProvider::parse(TRANSCRIPT, Path::new("demo.toml"), false).unwrap();
        let err = run(&p, &request(2)).unwrap_err();
        assert!(!err.is_transient());
        assert_eq!(
            err.to_string(),
            "transcript `demo.toml` has 2 turns and all were used: the model was asked for turn 3"
        );
    }

    #[test]
    fn json_transcripts_have_the_same_shape() {
        let text = r#"{"turns": [{"text": "hi", "tool_calls": [{"id": "x", "name": "t", "arguments": {"a": 1}}], "stop_reason": "tool_use"}]}"#;
        let p = ScriptedProvider::parse(text, Path::new("t.json"), true).unwrap();
        assert_eq!(p.turns()[0].tool_calls[0].id.as_deref(), Some("x"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, text).unwrap();
        assert_eq!(ScriptedProvider::load(&path).unwrap().turns(), p.turns());
    }

    #[test]
    fn malformed_transcripts_are_refused_naming_the_file_and_turn() {
        let cases: &[(&str, bool, &str)] = &[
            (
                "turns = 3",
                false,
                "transcript `t`: line 1, column 9: invalid type",
            ),
            (
                "[[turns]]\ntext = \"a\"\nextra = 1\n",
                false,
                "unknown field `extra`",
            ),
            ("turns = []", false, "has no turns"),
            (
                "[[turns]]\n[[turns]]\ntext = \"a\"\n",
                false,
                "turn 1: has neither text nor tool calls",
            ),
            (
                "[[turns]]\ntext = \"a\"\n[[turns]]\n[[turns.tool_calls]]\nname = \"t\"\narguments = [1]\n",
                false,
                "turn 2: tool call 1 (`t`): arguments must be a table",
            ),
            (
                "[[turns]]\n[[turns.tool_calls]]\nname = \"t\"\nid = \"a\"\n[[turns.tool_calls]]\nname = \"u\"\nid = \"a\"\n",
                false,
                "turn 1: tool call id `a` is used twice",
            ),
            (
                "[[turns]]\n[[turns.tool_calls]]\nname = \"\"\n",
                false,
                "turn 1: tool call 1 has an empty name",
            ),
            (
                "{\"turns\": [{\"text\": 1}]}",
                true,
                "transcript `t`: invalid type",
            ),
        ];
        for (text, json, expected) in cases {
            let err = ScriptedProvider::parse(text, Path::new("t"), *json).unwrap_err();
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
        let err = ScriptedProvider::load(Path::new("/nonexistent/t.toml")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read transcript `/nonexistent/t.toml`"),
            "{err}"
        );
    }
}
