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
//!
//! What a start needs is kept as runs are created and settle, so reading it
//! costs the same however long the session ([`EventStore::session_head`]
//! and [`SessionHead`]): the active run (the unique index above finds it),
//! how many runs were ever created in the session, how many completed and
//! which completed last. The persistent stores keep the counts in a
//! `sessions` table written by triggers on `runs`, so every path that
//! creates a run or sets its status (an append, a released claim) keeps it
//! in the same transaction; a prune leaves the counts as they are (a
//! pruned run was still lived in the session).
//!
//! [`EventStore::session_head`]: super::EventStore::session_head

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

/// What a start in a session reads: its run count, active run and last
/// completed run, kept by the store as runs start and settle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionHead {
    /// How many runs were ever created in the session, pruned ones
    /// included: what [`RunMeta::session_runs`](super::RunMeta::session_runs)
    /// is compared with, and the next run's position.
    pub runs: u64,
    /// The session's active run (one not settled) and its listed status.
    pub active: Option<(super::RunId, String)>,
    /// How many of its runs completed.
    pub completed: u64,
    /// The run that completed last: in a session lived one run at a time,
    /// the one whose history holds every other completed run. A reader
    /// checks that (its history's count is `completed - 1`) before relying
    /// on it.
    pub latest_completed: Option<super::RunId>,
}

impl SessionHead {
    /// The head as `runs` (the session's runs as listed, in any order)
    /// show it: what a store that keeps no counts answers, reading every
    /// run of the session. Pruned runs are not counted.
    pub fn from_listing(runs: &[super::RunSummary]) -> Self {
        let completed: Vec<&super::RunSummary> = runs
            .iter()
            .filter(|r| r.status == super::ListingStatus::COMPLETED.name())
            .collect();
        Self {
            runs: runs.len() as u64,
            active: runs
                .iter()
                .find(|r| !super::SETTLED_STATUSES.contains(&r.status.as_str()))
                .map(|r| (r.run_id.clone(), r.status.clone())),
            completed: completed.len() as u64,
            latest_completed: completed
                .iter()
                .max_by_key(|r| (r.created_ms, r.run_id.clone()))
                .map(|r| r.run_id.clone()),
        }
    }
}

/// A [`SessionHead`] from what a persistent store reads: its `sessions` row
/// (runs, completed, latest completed; none for a session with no run) and
/// its active run (id, status). A stored id that is not a valid run id is
/// a [`StoreError::Backend`](super::StoreError::Backend) naming `context`.
pub(crate) fn head_of_rows(
    counts: Option<(i64, i64, Option<String>)>,
    active: Option<(String, String)>,
    context: impl Fn() -> String,
) -> Result<SessionHead, super::StoreError> {
    let id = |text: &str| {
        super::RunId::new(text).map_err(|e| super::StoreError::Backend {
            context: context(),
            error: Box::new(e),
        })
    };
    let (runs, completed, latest) = counts.unwrap_or((0, 0, None));
    Ok(SessionHead {
        runs: runs.max(0) as u64,
        completed: completed.max(0) as u64,
        latest_completed: latest.as_deref().map(id).transpose()?,
        active: match active {
            Some((run, status)) => Some((id(&run)?, status)),
            None => None,
        },
    })
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
