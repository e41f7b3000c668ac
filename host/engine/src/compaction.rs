//! Context compaction: when the next model request would outgrow the
//! agent's prompt budget (`[compaction] max_prompt_tokens`), the older part
//! of the conversation is summarised by a model call of its own, and the
//! summary stands in for it in every later prompt.
//!
//! The estimate is deliberately simple and documented: a request's tokens
//! are its canonical JSON's bytes divided by 4, rounded up
//! ([`estimate_tokens`]).
//!
//! What is cut: the conversation's first message (the run's input, or in a
//! session the first earlier turn's input) always stays; the
//! messages after it up to a cut are summarised; the cut falls on a model
//! turn (so no tool result is separated from the call it answers) and keeps
//! at least `keep_recent` messages after it. A later compaction summarises
//! the earlier summary with the messages since.
//!
//! Recorded like a model call: `compaction_intent` (step, cut, request
//! hash, the request itself when prompts are recorded), then
//! `compaction_completed` (the summary, usage, cost) or `compaction_failed`
//! (the error). Replay checks the intent's hash and reads the summary back.
//! A failed compaction is counted and the step goes on with the prompt
//! uncompacted: it never loses the run. One attempt per step.
//!
//! Cost: with compaction on, deciding a new step's model call builds the
//! whole request to estimate it, in replay too (O(conversation) per step,
//! where replay otherwise hashes the conversation incrementally).

use serde::{Deserialize, Serialize};

use super::canonical::canonical_json;
use super::ids::RequestHash;
use warden_providers::compaction::{self, COMPACTION_INSTRUCTIONS};
use warden_providers::{Message, ModelRequest};

/// Messages kept after a cut when the agent does not say.
pub const DEFAULT_KEEP_RECENT: usize = 4;

/// The agent's `[compaction]` table, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionSettings {
    /// The prompt budget: estimated tokens of a request above which older
    /// history is summarised.
    pub max_prompt_tokens: u64,
    /// Messages kept verbatim after the cut, at least.
    pub keep_recent: usize,
}

/// The summary that stands in for `conversation[1..upto]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The step whose model call it was made for.
    pub step: u32,
    /// The first message not summarised.
    pub upto: usize,
    /// The summary, as the model wrote it.
    pub text: String,
}

/// What the log recorded of compaction, folded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionProgress {
    /// The summary in force.
    pub summary: Option<Summary>,
    /// A compaction whose intent has no completion: `(step, upto, hash)`.
    pub in_flight: Option<(u32, usize, RequestHash)>,
    /// Compactions that completed.
    pub completed: u32,
    /// Compactions that failed.
    pub failed: u32,
    /// The step of the latest failure: no second attempt for that step.
    pub failed_at_step: Option<u32>,
}

/// The estimated tokens of `request`: its canonical JSON's bytes over 4,
/// rounded up.
pub fn estimate_tokens(request: &ModelRequest) -> u64 {
    let value = serde_json::to_value(request).expect("a model request serializes to JSON");
    (canonical_json(&value).len() as u64).div_ceil(4)
}

/// Where to cut `conversation` so that at least `keep_recent` messages stay
/// after the cut, the cut is on a model turn, and it is past `done` (the
/// cut of the summary in force, or 1 for none): `None` when nothing more
/// can be summarised.
pub fn cut(conversation: &[Message], done: usize, keep_recent: usize) -> Option<usize> {
    let last = conversation.len().checked_sub(keep_recent.max(1))?;
    (done.max(1) + 1..=last)
        .rev()
        .find(|&i| matches!(conversation[i], Message::Assistant { .. }))
}

/// The message `summary` stands as in later prompts, in place of
/// `conversation[1..summary.upto]`. Its first line says how many messages
/// and model turns it replaces (the scripted provider counts turns by it).
pub fn summary_message(summary: &Summary, conversation: &[Message]) -> Message {
    let replaced = &conversation[1.min(summary.upto)..summary.upto.min(conversation.len())];
    let turns = replaced
        .iter()
        .filter(|m| matches!(m, Message::Assistant { .. }))
        .count();
    compaction::summary_message(replaced.len(), turns, &summary.text)
}

/// The messages of the next request: the conversation, or, once a summary
/// is in force, the first message, the summary, and the messages after the
/// cut.
pub fn prompt_messages(conversation: &[Message], summary: Option<&Summary>) -> Vec<Message> {
    match summary {
        None => conversation.to_vec(),
        Some(s) => {
            let mut messages =
                Vec::with_capacity(conversation.len() + 2 - s.upto.min(conversation.len()));
            messages.extend(conversation.first().cloned());
            messages.push(summary_message(s, conversation));
            messages.extend_from_slice(&conversation[s.upto.min(conversation.len())..]);
            messages
        }
    }
}

/// The request that summarises `conversation[1..upto]`, after `previous`
/// (the summary in force, which it folds in): the messages as one quoted
/// transcript, so no provider sees tool calls without tools.
pub fn request(
    model: &str,
    conversation: &[Message],
    previous: Option<&Summary>,
    upto: usize,
    max_tokens: u32,
) -> ModelRequest {
    let from = previous.map_or(1, |s| s.upto);
    let mut transcript = String::new();
    if let Some(first) = conversation.first() {
        transcript.push_str(&entry(first));
    }
    if let Some(previous) = previous {
        transcript.push_str(&format!(
            "[summary of what came before]\n{}\n\n",
            previous.text
        ));
    }
    for message in &conversation[from.min(upto)..upto] {
        transcript.push_str(&entry(message));
    }
    ModelRequest {
        model: model.to_owned(),
        instructions: COMPACTION_INSTRUCTIONS.to_owned(),
        context: String::new(),
        messages: vec![Message::User {
            content: transcript,
        }],
        tools: Vec::new(),
        max_tokens,
    }
}

/// One message of a transcript.
fn entry(message: &Message) -> String {
    match message {
        Message::User { content } => format!("[user]\n{content}\n\n"),
        Message::Assistant {
            text, tool_calls, ..
        } => {
            let mut out = format!("[assistant]\n{text}\n");
            for call in tool_calls {
                out.push_str(&format!("(called {} with {})\n", call.name, call.arguments));
            }
            out.push('\n');
            out
        }
        Message::Tool {
            name,
            content,
            is_error,
            ..
        } => format!(
            "[{} from {name}]\n{content}\n\n",
            if *is_error { "error" } else { "result" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use warden_providers::ToolCall;
    use warden_providers::compaction::summarised_turns;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.into(),
        }
    }

    fn assistant(text: &str) -> Message {
        Message::Assistant {
            text: text.into(),
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: "fs__read_file".into(),
                arguments: json!({"path": "a"}),
            }],
            blocks: vec![],
        }
    }

    fn tool(text: &str) -> Message {
        Message::Tool {
            call_id: "c".into(),
            name: "fs__read_file".into(),
            content: text.into(),
            is_error: false,
        }
    }

    /// input, then three turns each with a tool result: 7 messages.
    fn conversation() -> Vec<Message> {
        vec![
            user("go"),
            assistant("one"),
            tool("r1"),
            assistant("two"),
            tool("r2"),
            assistant("three"),
            tool("r3"),
        ]
    }

    #[test]
    fn the_cut_falls_on_a_model_turn_and_keeps_the_recent_messages() {
        let c = conversation();
        // Keep 2: the last turn (5, 6) stays; 1..5 is summarised.
        assert_eq!(cut(&c, 1, 2), Some(5));
        // Keep 3: index 4 is a tool result, so the cut moves back to 3.
        assert_eq!(cut(&c, 1, 3), Some(3));
        // Nothing before the first turn can be cut.
        assert_eq!(cut(&c, 1, 6), None);
        assert_eq!(cut(&c, 1, 7), None);
        assert_eq!(cut(&c, 1, 70), None);
        // Past the summary in force only.
        assert_eq!(cut(&c, 3, 2), Some(5));
        assert_eq!(cut(&c, 5, 2), None);
        // keep_recent 0 counts as 1.
        assert_eq!(cut(&c, 1, 0), Some(5));
    }

    #[test]
    fn a_summary_stands_for_the_cut_messages_and_says_how_many_turns() {
        let c = conversation();
        let summary = Summary {
            step: 4,
            upto: 5,
            text: "read r1 and r2".into(),
        };
        let messages = prompt_messages(&c, Some(&summary));
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[0], c[0]);
        assert_eq!(messages[2..], c[5..]);
        let Message::User { content } = &messages[1] else {
            panic!("the summary is a user message");
        };
        assert!(
            content.starts_with("Summary of the earlier conversation (4 messages, 2 model turns;")
        );
        assert!(content.ends_with("\nread r1 and r2"));
        assert_eq!(summarised_turns(&messages[1]), Some(2));
        assert_eq!(summarised_turns(&messages[0]), None);
        assert_eq!(prompt_messages(&c, None), c);
    }

    #[test]
    fn the_estimate_is_bytes_over_four() {
        let request = request("m", &conversation(), None, 5, 100);
        let bytes = canonical_json(&serde_json::to_value(&request).unwrap()).len() as u64;
        assert_eq!(estimate_tokens(&request), bytes.div_ceil(4));
    }

    #[test]
    fn the_request_quotes_the_input_the_previous_summary_and_the_cut_messages() {
        let c = conversation();
        let previous = Summary {
            step: 2,
            upto: 3,
            text: "read r1".into(),
        };
        let r = request("m", &c, Some(&previous), 5, 100);
        assert_eq!(r.instructions, COMPACTION_INSTRUCTIONS);
        assert!(r.tools.is_empty() && r.context.is_empty());
        let Message::User { content } = &r.messages[0] else {
            panic!("one user message");
        };
        assert_eq!(
            content,
            "[user]\ngo\n\n[summary of what came before]\nread r1\n\n[assistant]\ntwo\n(called fs__read_file with {\"path\":\"a\"})\n\n[result from fs__read_file]\nr2\n\n"
        );
        assert!(!content.contains("three"));
    }
}
