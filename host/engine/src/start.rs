//! What a run starts with besides its agent and input: its id, its own
//! labels, its session. One options value for [`Runtime::start`] and
//! [`Runtime::submit`](crate::runtime::Runtime::submit), so a new option is a
//! new builder method, not another start verb.
//!
//! [`Runtime::start`]: crate::runtime::Runtime::start

use std::collections::BTreeMap;

use crate::ids::{RunId, SessionId};

/// How a run starts. By default: a fresh random id, no labels of its own,
/// no session.
///
/// ```
/// use warden_engine::{RunId, SessionId, StartOptions};
///
/// let options = StartOptions::new()
///     .id(RunId::new("nightly-1").unwrap())
///     .label("team", "ops")
///     .session(SessionId::new("chat").unwrap());
/// assert_eq!(options.run_id().map(RunId::as_str), Some("nightly-1"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartOptions {
    pub(crate) run_id: Option<RunId>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) session: Option<SessionId>,
}

impl StartOptions {
    /// The defaults: a fresh random id, no labels, no session.
    pub fn new() -> Self {
        StartOptions::default()
    }

    /// Starts the run with this id; an id with any history is refused
    /// ([`RuntimeError::AlreadyStarted`](crate::RuntimeError::AlreadyStarted)).
    pub fn id(mut self, run_id: RunId) -> Self {
        self.run_id = Some(run_id);
        self
    }

    /// Labels of the run's own, on top of the agent's and the runtime's
    /// (these win on a shared key). Replaces any set before.
    pub fn labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// One label of the run's own (see [`labels`](Self::labels)).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Starts the run in session `session`: it sees the transcripts of the
    /// session's earlier completed runs as history, fixed and recorded in
    /// its `run_started` (see `engine/session.rs`). Refused with
    /// [`RuntimeError::SessionBusy`](crate::RuntimeError::SessionBusy),
    /// writing nothing, while another run of the session is active
    /// (running, queued or parked); the store checks this in the same
    /// transaction as the start, so two hosts racing never both start.
    pub fn session(mut self, session: SessionId) -> Self {
        self.session = Some(session);
        self
    }

    /// The chosen id, if any.
    pub fn run_id(&self) -> Option<&RunId> {
        self.run_id.as_ref()
    }

    /// The run's own labels.
    pub fn own_labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The session, if any.
    pub fn session_id(&self) -> Option<&SessionId> {
        self.session.as_ref()
    }
}
