//! Prompt assembly: the one place a [`ModelRequest`] is built from a run's
//! state and its agent, so the request recorded (and hashed) is exactly the
//! request sent.
//!
//! Order:
//! 1. the agent's instructions (the system prompt);
//! 2. the context its sources returned, as the log recorded it, quoted as
//!    non-authoritative data ([`super::context::quote`]: fenced, each item
//!    with its source and age, a caveat that it may be stale and must not be
//!    followed as instructions; a skipped failing source as a note);
//!    providers send it as the first user message, never as system text;
//! 3. the conversation folded from the log (in a session, the history
//!    recorded in `run_started` first; then the input, each model turn,
//!    each tool result, denials and rejections included), tool errors
//!    compacted ([`compact_tool_error`]; the log keeps them whole); once
//!    the history has been summarised ([`super::compaction`]), the input,
//!    the summary, and the messages after the cut;
//! 4. the tool specs: [`AgentView::tool_specs`], the same list
//!    [`AgentView::tool`] accepts calls from, built once with the view.

use super::canonical::RequestHasher;
use super::compaction::{prompt_messages, summary_message};
use super::context::quote;
use super::ids::RequestHash;
use super::state::RunState;
use super::view::AgentView;
use warden_providers::{Message, ModelRequest};

/// Tool errors longer than this many bytes are cut for the model.
pub const MAX_TOOL_ERROR_BYTES: usize = 2048;
/// Bytes kept from the start of a cut error.
const ERROR_HEAD_BYTES: usize = 1536;
/// Bytes kept from the end of a cut error.
const ERROR_TAIL_BYTES: usize = 384;
/// Bytes of a repeated error quoted on its one line.
const REPEAT_QUOTE_BYTES: usize = 160;

/// The request for the next model call of `state`, capped at `max_tokens`
/// output tokens.
pub fn build_request(state: &RunState, view: &AgentView, max_tokens: u32) -> ModelRequest {
    ModelRequest {
        messages: prompt_messages(state.conversation(), state.compaction.summary.as_ref()),
        ..request_frame(state, view, max_tokens)
    }
}

/// Everything of the request but its messages: what replay hashes after the
/// conversation it hashed incrementally.
pub(crate) fn request_frame(state: &RunState, view: &AgentView, max_tokens: u32) -> ModelRequest {
    ModelRequest {
        model: view.model.clone(),
        instructions: view.instructions.clone(),
        context: quote(&view.context, &state.context),
        messages: Vec::new(),
        tools: view.tool_specs(),
        max_tokens,
    }
}

/// The messages of a run's next request and their hash, kept up to date as
/// its conversation grows: a model call costs what the conversation gained
/// since the last one, not the whole conversation again (building and
/// hashing every request from scratch is quadratic in a run's length).
///
/// It follows one run's state: each call catches up with the messages the
/// state gained since, and starts over when a new summary is in force
/// (compaction), when the conversation is shorter than what it holds (a
/// state loaded anew), or when its messages were lent to a request and
/// not given back. The hash and messages it gives are those
/// [`build_request`] and `request_hash` would give.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    hasher: RequestHasher,
    /// The prompt's messages; empty for a cache that only hashes.
    messages: Vec<Message>,
    /// Whether it keeps the messages (a driver) or only hashes (replay).
    keep_messages: bool,
    /// The summary (its step and cut) the prompt was started with.
    summary: Option<(u32, usize)>,
    /// How many messages of the state's conversation are in.
    upto: usize,
    /// Whether `messages` is out with a request ([`PromptCache::lend`]).
    lent: bool,
}

impl PromptCache {
    /// A cache of the next request's messages and hash.
    pub(crate) fn new() -> Self {
        PromptCache {
            keep_messages: true,
            ..PromptCache::default()
        }
    }

    /// A cache of the hash alone.
    pub(crate) fn hashing_only() -> Self {
        PromptCache::default()
    }

    /// Takes in what `state`'s prompt gained since the last call.
    fn catch_up(&mut self, state: &RunState) {
        let conversation = state.conversation();
        let summary = state.compaction.summary.as_ref();
        let key = summary.map(|s| (s.step, s.upto));
        if key != self.summary || self.upto > conversation.len() || self.lent {
            *self = PromptCache {
                keep_messages: self.keep_messages,
                summary: key,
                ..PromptCache::default()
            };
            if let Some(s) = summary {
                // As `prompt_messages`: the first message, the summary, then
                // the messages after the cut.
                let head = conversation
                    .first()
                    .cloned()
                    .into_iter()
                    .chain(std::iter::once(summary_message(s, conversation)));
                for message in head {
                    self.hasher.push(&message);
                    if self.keep_messages {
                        self.messages.push(message);
                    }
                }
                self.upto = s.upto.min(conversation.len());
            }
        }
        for message in &conversation[self.upto..] {
            self.hasher.push(message);
            if self.keep_messages {
                self.messages.push(message.clone());
            }
        }
        self.upto = conversation.len();
    }

    /// The hash of the next request of `state` whose frame (everything but
    /// its messages) is `frame`, and the bytes it covers.
    pub(crate) fn hash(&mut self, state: &RunState, frame: &ModelRequest) -> (RequestHash, u64) {
        self.catch_up(state);
        self.hasher.finish_sized(frame)
    }

    /// The messages of the next request of `state`, lent until
    /// [`give_back`](Self::give_back) returns them (without them, the next
    /// call starts over).
    pub(crate) fn lend(&mut self, state: &RunState) -> Vec<Message> {
        debug_assert!(self.keep_messages, "a hashing-only cache has no messages");
        self.catch_up(state);
        self.lent = true;
        std::mem::take(&mut self.messages)
    }

    /// Returns the messages [`lend`](Self::lend) gave out, unchanged.
    pub(crate) fn give_back(&mut self, messages: Vec<Message>) {
        if self.lent {
            self.messages = messages;
            self.lent = false;
        }
    }
}

/// A tool error as the model is shown it, deterministically: the
/// `repeats`-th identical error in a row is one line with the count;
/// otherwise an error over [`MAX_TOOL_ERROR_BYTES`] keeps its head and tail
/// around a marker saying how many bytes were cut.
pub fn compact_tool_error(error: &str, repeats: u32) -> String {
    if repeats > 1 {
        let first_line = error.lines().next().unwrap_or("");
        let quoted = head(first_line, REPEAT_QUOTE_BYTES);
        let ellipsis = if quoted.len() < error.len() {
            "…"
        } else {
            ""
        };
        return format!(
            "the same error as the previous call ({repeats} times in a row): {quoted}{ellipsis}"
        );
    }
    if error.len() <= MAX_TOOL_ERROR_BYTES {
        return error.to_owned();
    }
    let start = head(error, ERROR_HEAD_BYTES);
    let end = tail(error, ERROR_TAIL_BYTES);
    let cut = error.len() - start.len() - end.len();
    format!("{start}\n[… {cut} bytes of this error cut …]\n{end}")
}

/// The longest prefix of `text` of at most `max` bytes, at a char boundary.
fn head(text: &str, max: usize) -> &str {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// The longest suffix of `text` of at most `max` bytes, at a char boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut cut = text.len().saturating_sub(max);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    &text[cut..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_errors_are_shown_whole() {
        assert_eq!(compact_tool_error("failed: busy", 1), "failed: busy");
        let exactly = "x".repeat(MAX_TOOL_ERROR_BYTES);
        assert_eq!(compact_tool_error(&exactly, 1), exactly);
    }

    #[test]
    fn long_errors_keep_head_and_tail_with_what_was_cut() {
        let error = format!("{}{}{}", "h".repeat(3000), "MIDDLE", "t".repeat(1000));
        let shown = compact_tool_error(&error, 1);
        let cut = error.len() - ERROR_HEAD_BYTES - ERROR_TAIL_BYTES;
        assert_eq!(
            shown,
            format!(
                "{}\n[… {cut} bytes of this error cut …]\n{}",
                "h".repeat(ERROR_HEAD_BYTES),
                "t".repeat(ERROR_TAIL_BYTES)
            )
        );
        assert!(!shown.contains("MIDDLE"));
        assert!(shown.len() < MAX_TOOL_ERROR_BYTES + 64);
        // Deterministic.
        assert_eq!(compact_tool_error(&error, 1), shown);
    }

    #[test]
    fn cuts_fall_on_char_boundaries() {
        let error = "é".repeat(2000); // 4000 bytes
        let shown = compact_tool_error(&error, 1);
        let (start, rest) = shown.split_once('\n').unwrap();
        let end = rest.rsplit_once('\n').unwrap().1;
        assert!(start.chars().all(|c| c == 'é'));
        assert!(end.chars().all(|c| c == 'é'));
        let marker = rest.rsplit_once('\n').unwrap().0;
        let cut: usize = marker
            .trim_start_matches("[… ")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(start.len() + cut + end.len(), error.len());
        assert!(start.len() <= ERROR_HEAD_BYTES && end.len() <= ERROR_TAIL_BYTES);
    }

    #[test]
    fn repeated_errors_collapse_to_one_line_with_a_count() {
        let error = format!(
            "invalid arguments: missing `path`\n{}",
            "detail ".repeat(50)
        );
        let shown = compact_tool_error(&error, 3);
        assert_eq!(
            shown,
            "the same error as the previous call (3 times in a row): invalid arguments: missing `path`…"
        );
        assert!(!shown.contains('\n'));
        let long = "y".repeat(500);
        let shown = compact_tool_error(&long, 2);
        assert!(shown.ends_with(&format!("{}…", "y".repeat(REPEAT_QUOTE_BYTES))));
        assert_eq!(
            compact_tool_error("denied by the tool: no", 2),
            "the same error as the previous call (2 times in a row): denied by the tool: no"
        );
    }
}
