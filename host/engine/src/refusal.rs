//! What a run does when the model refuses: the agent's `on_refusal`.
//!
//! A refusal (Anthropic's `refusal` stop reason, OpenAI's `refusal` text
//! or `content_filter` finish) ends the turn with `stop_reason =
//! "refusal"` recorded on the completion; [`decide`](fn@super::decide) then
//! fails the run with [`RunError::Refused`](super::events::RunError::Refused)
//! or completes it with the refusal's text, as the agent says.

use serde::{Deserialize, Serialize};

/// What a run does when the model refuses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRefusal {
    /// The run fails with [`RunError::Refused`](super::events::RunError::Refused).
    /// The default.
    #[default]
    Fail,
    /// The run completes with the refusal's text as its output (the
    /// completion records `stop_reason = "refusal"`; no output schema
    /// applies to it).
    Complete,
}
