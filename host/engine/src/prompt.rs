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
//!    compacted ([`super::tool_errors::compact_tool_error`]; the log keeps
//!    them whole); once
//!    the history has been summarised ([`super::compaction`]), the input,
//!    the summary, and the messages after the cut;
//! 4. the tool specs: [`AgentView::tool_specs`], the same list
//!    [`AgentView::tool`] accepts calls from, built once with the view.

use super::compaction::{prompt_messages, summary_message};
use super::context::quote;
use super::ids::RequestHash;
use super::request_hash::{FrameBytes, RequestHasher};
use super::state::RunState;
use super::view::AgentView;
use warden_providers::{Message, ModelRequest};

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
    /// The canonical bytes of the latest request's frame, kept while the
    /// frame does not change (starting over keeps them: the frame is not
    /// the conversation's).
    frame: FrameBytes,
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
                frame: std::mem::take(&mut self.frame),
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
        self.hasher.finish_frame(self.frame.of(frame))
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
