//! Prompt assembly: the one place a [`ModelRequest`] is built from a run's
//! state and its agent, so the request recorded (and hashed) is exactly the
//! request sent.
//!
//! Order: the agent's instructions (the system prompt), then the
//! conversation folded from the log (the input, each model turn, each tool
//! result, denials and rejections included), then the tool specs, which are
//! the same set the engine accepts calls to ([`AgentView::tools`]). Context
//! sources and memory, quoted as non-authoritative data, will go between the
//! instructions and the conversation.

use super::state::RunState;
use super::view::AgentView;
use crate::providers::ModelRequest;

/// The request for the next model call of `state`, capped at `max_tokens`
/// output tokens.
pub fn build_request(state: &RunState, view: &AgentView, max_tokens: u32) -> ModelRequest {
    ModelRequest {
        messages: state.conversation().to_vec(),
        ..request_frame(view, max_tokens)
    }
}

/// Everything of the request but its messages: what replay hashes after the
/// conversation it hashed incrementally.
pub(crate) fn request_frame(view: &AgentView, max_tokens: u32) -> ModelRequest {
    ModelRequest {
        model: view.model.clone(),
        instructions: view.instructions.clone(),
        messages: Vec::new(),
        tools: view.tool_specs(),
        max_tokens,
    }
}
