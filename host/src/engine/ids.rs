//! Identifiers and digests a run's log refers to: [`RunId`], [`CallId`],
//! [`AgentDigest`], [`RequestHash`], and the idempotency key derived from a
//! run and a call.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest run id accepted, in bytes.
pub const MAX_RUN_ID_LEN: usize = 128;

/// A run's id: 1 to 128 bytes of ASCII letters, digits, `-`, `_`, `.` and
/// `:`, so it is safe in file names, URLs and log lines.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct RunId(String);

/// A run id that is empty, too long, or has a character outside the allowed
/// set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a valid run id (use 1 to 128 ASCII letters, digits, `-`, `_`, `.` or `:`)")]
pub struct InvalidRunId(pub String);

impl RunId {
    /// Checks and wraps `id`.
    pub fn new(id: impl Into<String>) -> Result<RunId, InvalidRunId> {
        let id = id.into();
        let valid = !id.is_empty()
            && id.len() <= MAX_RUN_ID_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if valid {
            Ok(RunId(id))
        } else {
            Err(InvalidRunId(id))
        }
    }

    /// A run id made from 128 random bits: `run-` and 32 hex digits.
    pub fn from_random(bits: u128) -> RunId {
        RunId(format!("run-{bits:032x}"))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RunId {
    type Err = InvalidRunId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunId::new(s)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        RunId::new(text).map_err(serde::de::Error::custom)
    }
}

/// A tool call's id within its run: `call-<step>-<n>` for the `n`th call
/// the model made at step `step` (both counting from one). Assigned by the
/// engine, not the model, so it is unique and the same on every replay.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(String);

impl CallId {
    /// The id of the `index`th call (from 1) of step `step`.
    pub fn new(step: u32, index: usize) -> CallId {
        CallId(format!("call-{step}-{index}"))
    }

    /// Wraps an id as given (for example by a human on the command line).
    pub fn from_text(id: impl Into<String>) -> CallId {
        CallId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The idempotency key of a call: the same for every execution of the same
/// call in the same run (retries, recoveries), different for every other
/// call. Lowercase hex sha256 of a versioned domain tag, the run id and the
/// call id.
pub fn idempotency_key(run_id: &RunId, call_id: &CallId) -> String {
    let mut h = Sha256::new();
    h.update(b"warden-idempotency-key-v1\0");
    h.update(run_id.as_str().as_bytes());
    h.update(b"\0");
    h.update(call_id.as_str().as_bytes());
    hex::encode(h.finalize())
}

macro_rules! hex_digest {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a digest given as lowercase hex.
            pub fn from_hex(hex: impl Into<String>) -> Self {
                $name(hex.into())
            }

            /// The sha256 of `bytes`.
            pub fn of(bytes: &[u8]) -> Self {
                $name(hex::encode(Sha256::digest(bytes)))
            }

            /// The digest as lowercase hex.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

hex_digest!(
    /// The sha256 of an agent definition's canonical form (labels excluded):
    /// recorded when a run starts, compared on recovery.
    AgentDigest
);

hex_digest!(
    /// The sha256 of a model request's canonical JSON: recorded with every
    /// model call, whether or not the request itself is, so replay detects a
    /// changed prompt without storing it.
    RequestHash
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked() {
        for good in ["r1", "run-0123", "a.b:c_d", &"x".repeat(128)] {
            assert_eq!(RunId::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(129)] {
            let err = RunId::new(bad).unwrap_err();
            assert!(err.to_string().contains("is not a valid run id"), "{err}");
        }
        assert!(serde_json::from_str::<RunId>("\"a/b\"").is_err());
        assert_eq!(
            RunId::from_random(0xab).as_str(),
            "run-000000000000000000000000000000ab"
        );
    }

    #[test]
    fn idempotency_keys_are_stable_and_distinct() {
        let run = RunId::new("r1").unwrap();
        let key = idempotency_key(&run, &CallId::new(1, 1));
        assert_eq!(key, idempotency_key(&run, &CallId::new(1, 1)));
        assert_eq!(key.len(), 64);
        assert_ne!(key, idempotency_key(&run, &CallId::new(1, 2)));
        assert_ne!(
            key,
            idempotency_key(&RunId::new("r2").unwrap(), &CallId::new(1, 1))
        );
        // Pinned: the key must never change for a recorded call.
        assert_eq!(
            key,
            "1eb0a7a6c8b29b20e210643320eeed3f14153ce3d1d49241069d619886b00554"
        );
    }
}
