//! Sessions as the store sees them: the [`SessionId`] type and the one rule
//! every store enforces, **at most one active run per session**.
//!
//! A run belongs to a session when it is created with
//! [`RunMeta::session`](super::RunMeta::session) set. A run is *active*
//! while its listing status is not [settled](super::StatusClass::Settled)
//! (`completed`, `failed`, `cancelled`, `abandoned`): running, queued, and
//! every parked status (awaiting approval, suspended, awaiting external,
//! over budget, needing reconciliation) hold the session. Only a terminal
//! status releases it, so a run parked for a human keeps its session until
//! it ends one way or another (completes after the human acts, or is
//! cancelled or abandoned).
//!
//! [`EventStore::create`](super::EventStore::create) of a run in a session
//! that has an active run is refused with
//! [`StoreError::SessionBusy`](super::StoreError::SessionBusy), naming the
//! active run, and writes nothing. The check and the insert are one
//! transaction; the persistent stores also carry a unique partial index
//! over `(session)` for active runs, so two hosts racing to start in one
//! session cannot both succeed whatever the isolation level.

use std::fmt;
use std::str::FromStr;

/// The id of a session: 1 to 128 ASCII letters, digits, `-`, `_`, `.` or
/// `:`, the same rules as a [`RunId`](super::RunId). Chosen by the
/// application (a conversation's id, a user's thread).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId(String);

impl SessionId {
    /// The longest id, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Checks and wraps an id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidSessionId> {
        let id = id.into();
        match super::id_problem(&id, Self::MAX_LEN) {
            Some(reason) => Err(InvalidSessionId { id, reason }),
            None => Ok(Self(id)),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({:?})", self.0)
    }
}

impl FromStr for SessionId {
    type Err = InvalidSessionId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for SessionId {
    type Error = InvalidSessionId;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> Self {
        id.0
    }
}

impl AsRef<str> for SessionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A string that is not a valid [`SessionId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{id}` is not a valid session id: it {reason}")]
pub struct InvalidSessionId {
    id: String,
    reason: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_follow_the_run_id_rules() {
        for good in ["s1", "chat-42", "user:7.thread_3", &"x".repeat(128)] {
            assert_eq!(SessionId::new(good).unwrap().as_str(), good);
        }
        for (bad, reason) in [
            ("", "it is empty"),
            ("a b", "it may only hold"),
            ("a/b", "it may only hold"),
            (&"x".repeat(129), "it is longer than 128 bytes"),
        ] {
            let message = SessionId::new(bad).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("`{bad}` is not a valid session id: {reason}")),
                "{message}"
            );
        }
        let id: SessionId = serde_json::from_str("\"s-1\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"s-1\"");
        assert!(serde_json::from_str::<SessionId>("\"a b\"").is_err());
    }
}
