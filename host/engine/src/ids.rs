//! Identifiers and digests a run's log refers to: [`RunId`] (the store's),
//! [`CallId`], [`AgentDigest`], [`RequestHash`], and the idempotency key
//! derived from a run and a call.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A run's id, shared with the store (the store owns its rules).
pub use warden_store::{InvalidRunId, RunId};

/// A session's id, shared with the store (the store owns its rules).
pub use warden_store::{InvalidSessionId, SessionId};

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
    lower_hex(&h.finalize())
}

/// The commitment key of a call whose tool takes its idempotency key from an
/// argument: the same for every run making the call with that argument,
/// whatever the run and call ids. `scope` is `<plugin>/<tool>`; `value` the
/// argument's value, canonical JSON.
pub fn commitment_key(scope: &str, value: &serde_json::Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"warden.commitment.v1\0");
    hasher.update(scope.as_bytes());
    hasher.update(b"\0");
    hasher.update(super::canonical::canonical_json(value).as_bytes());
    lower_hex(&hasher.finalize())
}

/// `bytes` as lowercase hex. `hex::encode` goes through an iterator of
/// chars, which an unoptimised build (tests, `--profile dev` benches)
/// makes a visible part of every call's decision and replay.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    hex::encode_to_slice(bytes, &mut out).expect("the buffer is twice the input");
    String::from_utf8(out).expect("hex digits are ASCII")
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
                $name(lower_hex(&Sha256::digest(bytes)))
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

hex_digest!(
    /// What an approval binds to: the sha256 of a domain tag, the tool's
    /// model name and the canonical JSON of the call's frozen arguments
    /// ([`CallDigest::of_call`]). Recorded when approval is asked and when
    /// it is granted, and compared before the call runs.
    CallDigest
);

impl CallDigest {
    /// The digest of a call to the tool the model names `tool` with
    /// `arguments`.
    pub fn of_call(tool: &str, arguments: &serde_json::Value) -> CallDigest {
        let mut hasher = Sha256::new();
        hasher.update(b"warden.call.v1\0");
        hasher.update(tool.as_bytes());
        hasher.update(b"\0");
        hasher.update(super::canonical::canonical_json(arguments).as_bytes());
        CallDigest(lower_hex(&hasher.finalize()))
    }
}

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
    fn call_digests_bind_the_tool_and_the_canonical_arguments() {
        let args = serde_json::json!({"path": "a.txt", "content": "hi"});
        let reordered: serde_json::Value =
            serde_json::from_str(r#"{"content":"hi","path":"a.txt"}"#).unwrap();
        let digest = CallDigest::of_call("fs__write_file", &args);
        assert_eq!(digest, CallDigest::of_call("fs__write_file", &reordered));
        assert_ne!(digest, CallDigest::of_call("fs__delete_file", &args));
        assert_ne!(
            digest,
            CallDigest::of_call(
                "fs__write_file",
                &serde_json::json!({"path": "b.txt", "content": "hi"})
            )
        );
        // Pinned: a recorded approval must keep meaning the same call.
        assert_eq!(
            digest.as_str(),
            "06bcdc6ada004e7584039c0fd708f9b9a8b121a9ccd3f297c3fc6d039f333bf8"
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
