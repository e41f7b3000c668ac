//! Idempotency keys as an operator sees them: [`KeyInfo`], one commitment
//! with the state its holder run leaves it in ([`KeyState`]). The verbs
//! that list and release keys are [`Runtime::keys`](super::Runtime::keys)
//! and [`Runtime::release_key`](super::Runtime::release_key).
//!
//! Every way a run ends leaves each of its keys in a state a later run can
//! act on: a call that completed settles its key (later runs get its
//! result); a call that failed releases it (a later run makes the call
//! again); a write whose outcome stays unknown when its run is abandoned or
//! cancelled leaves the key [`KeyState::Orphaned`]: a later run with the key
//! stops at once saying so, and an operator who checked what happened
//! releases it (`warden keys release`), recorded in the holder run's log.

use serde::Serialize;
use serde_json::Value;

use warden_store::{Commitment, RunId, SETTLED_STATUSES};

/// What a key's holder leaves it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyState {
    /// Held unsettled by a run that has not ended: its call may be running
    /// now, or wait for a human to reconcile it there.
    Held,
    /// Settled: every later run with the key gets its result.
    Settled,
    /// Held unsettled by a run that ended (abandoned or cancelled with the
    /// call's outcome unknown) or is gone: only an operator can act on it.
    Orphaned,
}

impl KeyState {
    /// As shown: `held`, `settled`, `orphaned`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Held => "held",
            KeyState::Settled => "settled",
            KeyState::Orphaned => "orphaned",
        }
    }
}

/// One idempotency key.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KeyInfo {
    /// The key.
    pub key: String,
    /// What its holder leaves it as.
    pub state: KeyState,
    /// The run that claimed it.
    pub run_id: RunId,
    /// Its call.
    pub call_id: String,
    /// The holder run's listed status; `None` when the run is gone (pruned).
    pub run_status: Option<String>,
    /// The settled result as recorded (`{"output": ...}`), if settled.
    pub result: Option<Value>,
}

impl KeyInfo {
    /// `commitment`, whose holder run is listed with `run_status`.
    pub(crate) fn new(commitment: Commitment, run_status: Option<String>) -> KeyInfo {
        let ended = run_status
            .as_deref()
            .is_none_or(|s| SETTLED_STATUSES.contains(&s));
        let state = match (&commitment.result, ended) {
            (Some(_), _) => KeyState::Settled,
            (None, false) => KeyState::Held,
            (None, true) => KeyState::Orphaned,
        };
        let result = commitment.result.map(|bytes| {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        });
        KeyInfo {
            key: commitment.key,
            state,
            run_id: commitment.holder.run_id,
            call_id: commitment.holder.call_id,
            run_status,
            result,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use warden_store::Holder;

    fn commitment(result: Option<&str>) -> Commitment {
        Commitment {
            key: "k".into(),
            holder: Holder {
                run_id: RunId::new("r").unwrap(),
                call_id: "c".into(),
            },
            result: result.map(|r| Bytes::from(r.to_owned())),
        }
    }

    #[test]
    fn the_state_follows_the_result_and_the_holders_end() {
        let cases = [
            (None, Some("running"), KeyState::Held),
            (None, Some("needs_reconciliation"), KeyState::Held),
            (None, Some("abandoned"), KeyState::Orphaned),
            (None, Some("cancelled"), KeyState::Orphaned),
            (None, None, KeyState::Orphaned),
            (Some(r#"{"output":1}"#), Some("running"), KeyState::Settled),
            (Some(r#"{"output":1}"#), None, KeyState::Settled),
        ];
        for (result, status, expected) in cases {
            let info = KeyInfo::new(commitment(result), status.map(str::to_owned));
            assert_eq!(info.state, expected, "{result:?} {status:?}");
        }
        let info = KeyInfo::new(commitment(Some(r#"{"output":1}"#)), None);
        assert_eq!(info.result, Some(serde_json::json!({"output": 1})));
    }
}
