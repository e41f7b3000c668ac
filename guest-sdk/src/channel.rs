//! Delivery channels: the [`ChannelPlugin`] trait the export macro binds to
//! the WIT `channel` interface, typed payload parsing, and constructors for
//! [`DeliveryError`].

use serde::de::DeserializeOwned;

use crate::json;
use crate::types::{Delivery, DeliveryError, Failure, Rejection, SourceSpec};

/// A plugin that delivers a run's results. Export it with
/// [`export_channel_plugin!`](crate::export_channel_plugin).
///
/// Both functions are plain Rust: unit-test them by calling them.
pub trait ChannelPlugin {
    /// The channel's name and description.
    fn describe() -> SourceSpec;

    /// Delivers one message. `delivery.id` is stable across retries: use it
    /// to drop duplicates where the receiver allows. Use
    /// [`Delivery::payload_as`] to read the payload as a typed value.
    fn deliver(delivery: Delivery) -> Result<(), DeliveryError>;
}

impl Delivery {
    /// Parses the payload into a `T`. A blank payload counts as `{}`.
    ///
    /// # Errors
    /// [`DeliveryError::InvalidDelivery`] with serde's reason, naming the
    /// field and the delivery's kind.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, DeliveryError> {
        json::parse(&self.payload).map_err(|reason| {
            DeliveryError::invalid_delivery(format!(
                "invalid payload for delivery kind `{}`: {reason}",
                self.kind
            ))
        })
    }
}

impl DeliveryError {
    /// The delivery does not fit what the channel understands.
    pub fn invalid_delivery(message: impl Into<String>) -> Self {
        DeliveryError::InvalidDelivery(message.into())
    }

    /// The channel refused.
    pub fn denied(message: impl Into<String>) -> Self {
        DeliveryError::Denied(message.into())
    }

    /// The receiver refused the delivery and answered `status`.
    pub fn rejected(status: u16, message: impl Into<String>) -> Self {
        DeliveryError::Rejected(Rejection {
            status,
            message: message.into(),
        })
    }

    /// The channel tried and failed; trying again will not help.
    pub fn failed(message: impl Into<String>) -> Self {
        DeliveryError::Failed(Failure::new(message, false))
    }

    /// The channel tried and failed; trying again later may succeed.
    pub fn retryable(message: impl Into<String>) -> Self {
        DeliveryError::Failed(Failure::new(message, true))
    }

    /// The error's message, whatever its variant.
    pub fn message(&self) -> &str {
        match self {
            DeliveryError::InvalidDelivery(message) | DeliveryError::Denied(message) => message,
            DeliveryError::Rejected(rejection) => &rejection.message,
            DeliveryError::Failed(failure) => &failure.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::delivery;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Completed {
        summary: String,
    }

    #[test]
    fn payload_as_parses_the_payload() {
        let d = delivery("completed", json!({"summary": "done"}));
        assert_eq!(
            d.payload_as::<Completed>().unwrap(),
            Completed {
                summary: "done".into()
            }
        );
    }

    #[test]
    fn payload_as_errors_name_the_kind_and_field() {
        let err = delivery("completed", json!({"summary": 1}))
            .payload_as::<Completed>()
            .unwrap_err();
        assert!(
            matches!(&err, DeliveryError::InvalidDelivery(m)
                if m.starts_with("invalid payload for delivery kind `completed`: field `summary`: invalid type: integer `1`")),
            "{err:?}"
        );
    }

    #[test]
    fn error_constructors_pick_the_variant() {
        assert_eq!(
            DeliveryError::rejected(429, "slow down"),
            DeliveryError::Rejected(Rejection {
                status: 429,
                message: "slow down".into()
            })
        );
        assert_eq!(DeliveryError::rejected(500, "boom").message(), "boom");
        assert_eq!(
            DeliveryError::retryable("later"),
            DeliveryError::Failed(Failure::new("later", true))
        );
        assert!(matches!(
            DeliveryError::denied("no"),
            DeliveryError::Denied(m) if m == "no"
        ));
    }
}
