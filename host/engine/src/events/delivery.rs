//! The payloads of the delivery events: a delivery's intent, a failed
//! attempt, its completion, the delivery given up, and the typed error a
//! channel's lease ends with. What channels receive and when a delivery is
//! owed is `channels.rs`'s.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use warden_sandbox::{LeaseError, Outcome, UsageReceipt, wit};

/// [`Event::DeliveryIntent`](super::Event::DeliveryIntent): a delivery is
/// about to be made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryIntent {
    /// `<run>/<channel>/<source>`: passed to the channel, the same on every
    /// attempt and after recovery.
    pub delivery_id: String,
    /// The channel's name.
    pub channel: String,
    /// The position (from 0) of the event it reports.
    pub source: u64,
    /// What happened, as the channel is told: `completed`, `failed`,
    /// `approval-requested`, …, or the event's type for an `events` channel.
    pub kind: String,
    /// The JSON object handed to the channel, frozen here.
    pub payload: Value,
}

impl DeliveryIntent {
    /// The message to hand the channel's plugin.
    pub fn wit_delivery(&self, run_id: &str) -> wit::Delivery {
        wit::Delivery {
            id: self.delivery_id.clone(),
            run_id: run_id.to_owned(),
            kind: self.kind.clone(),
            payload: self.payload.to_string(),
        }
    }
}

/// [`Event::DeliveryAttemptFailed`](super::Event::DeliveryAttemptFailed):
/// one attempt failed and the delivery will be tried again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryAttemptFailed {
    /// The delivery.
    pub delivery_id: String,
    /// Which attempt failed, from 1.
    pub attempt: u32,
    /// How.
    pub error: DeliveryError,
    /// What the attempt's lease used.
    pub receipt: UsageReceipt,
    /// When the next attempt is due (the injected clock's milliseconds since
    /// the Unix epoch): a recovered driver waits only what is left.
    pub retry_at_ms: u64,
}

/// [`Event::DeliveryCompleted`](super::Event::DeliveryCompleted): the
/// channel took the delivery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryCompleted {
    /// The delivery.
    pub delivery_id: String,
    /// The attempt that succeeded, from 1.
    pub attempt: u32,
    /// What its lease used.
    pub receipt: UsageReceipt,
}

/// [`Event::DeliveryFailed`](super::Event::DeliveryFailed): the delivery is
/// given up: a permanent error, or its attempts ran out. The run's result is
/// unchanged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryFailed {
    /// The delivery.
    pub delivery_id: String,
    /// Attempts made, counting the last.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: DeliveryError,
    /// The last attempt's receipt. Omitted when no lease ran (the channel is
    /// no longer the agent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<UsageReceipt>,
}

/// Why a delivery attempt failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The channel found the delivery malformed.
    #[error("the channel refused the delivery as invalid: {message}")]
    InvalidDelivery {
        /// What it said.
        message: String,
    },
    /// The channel's policy forbids it.
    #[error("the channel was denied: {message}")]
    Denied {
        /// What it said.
        message: String,
    },
    /// The receiver refused it.
    #[error("the receiver answered {status}: {message}")]
    Rejected {
        /// The status it answered.
        status: u16,
        /// What it said.
        message: String,
    },
    /// The channel failed.
    #[error("the channel failed{}: {message}", if *.retryable { " (retryable)" } else { "" })]
    Failed {
        /// What it said.
        message: String,
        /// Whether trying again may help.
        retryable: bool,
    },
    /// The sandbox stopped the channel's lease.
    #[error("the sandbox stopped the delivery ({outcome}): {message}")]
    LeaseFailed {
        /// How the lease ended.
        outcome: Outcome,
        /// What happened.
        message: String,
    },
    /// The channel cannot be used (it is no longer the agent's, or its
    /// plugin is not a channel).
    #[error("the channel is unavailable: {message}")]
    Unavailable {
        /// Why.
        message: String,
    },
}

impl DeliveryError {
    /// The error a guest returned.
    pub fn from_wit(error: &wit::DeliveryError) -> DeliveryError {
        match error {
            wit::DeliveryError::InvalidDelivery(message) => DeliveryError::InvalidDelivery {
                message: message.clone(),
            },
            wit::DeliveryError::Denied(message) => DeliveryError::Denied {
                message: message.clone(),
            },
            wit::DeliveryError::Rejected(r) => DeliveryError::Rejected {
                status: r.status,
                message: r.message.clone(),
            },
            wit::DeliveryError::Failed(f) => DeliveryError::Failed {
                message: f.message.clone(),
                retryable: f.retryable,
            },
        }
    }

    /// A lease the host stopped.
    pub fn from_lease(error: &LeaseError) -> DeliveryError {
        DeliveryError::LeaseFailed {
            outcome: error.failure.outcome(),
            message: error.to_string(),
        }
    }

    /// Whether another attempt may succeed: a retryable failure, a receiver
    /// that answered 408, 429 or 5xx, or a lease stopped by a limit or a
    /// trap (not one refused before the guest ran, nor a cancellation).
    pub fn is_retryable(&self) -> bool {
        match self {
            DeliveryError::Failed { retryable, .. } => *retryable,
            DeliveryError::Rejected { status, .. } => {
                matches!(status, 408 | 429) || (500..600).contains(status)
            }
            DeliveryError::LeaseFailed { outcome, .. } => {
                !matches!(outcome, Outcome::Refused | Outcome::Cancelled)
            }
            DeliveryError::InvalidDelivery { .. }
            | DeliveryError::Denied { .. }
            | DeliveryError::Unavailable { .. } => false,
        }
    }
}
