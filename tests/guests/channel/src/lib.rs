//! Test guest `channel`: a minimal delivery channel, for the host's channel
//! adapter tests. `describe` names it `test-channel`; what `deliver` does
//! depends on the delivery's `payload`, a JSON object:
//!
//! ```json
//! {"outcome": "ok" | "rejected" | "denied" | "invalid" | "failed",
//!  "status": 503, "message": "why", "retryable": true,
//!  "path": "/outbox/deliveries.jsonl"}
//! ```
//!
//! - `ok` (the default): appends one line to a file,
//!   `{"id", "run_id", "kind", "payload"}` with the payload as a JSON value.
//!   The file is `path` if given, else the host's config value `outbox`, else
//!   `/outbox/deliveries.jsonl`; so a test grants a mount and reads the file.
//!   A failed write is a `failed` error with `retryable: true`.
//! - `rejected`: a `rejected` error with `status` (default 503) and `message`.
//! - `denied` / `invalid`: those errors, with `message`.
//! - `failed`: a `failed` error with `message` and `retryable` (default false).
//!
//! A payload that is not a JSON object is an `invalid-delivery` error.
//!
//! Failing on purpose, for the engine's retry tests: with the host config
//! value `fail_first` set to `N`, each delivery first counts itself in the
//! file named by the config value `attempts_file` (default
//! `/outbox/attempts`), and the first `N` deliveries this channel sees fail
//! with a retryable `failed` error; later ones go on as above. A large `N`
//! makes a channel that always fails.

mod bindings {
    //! wit-bindgen glue for the `channel-plugin` world, and the export of
    //! [`Channel`](super::Channel): the only generated unsafe code.
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({ path: "../../../wit", world: "channel-plugin" });
    use super::Channel;
    export!(Channel with_types_in crate::bindings);
}

use std::fs::OpenOptions;
use std::io::Write;

use bindings::exports::warden::plugin::channel::Guest;
use bindings::warden::plugin::host;
use bindings::warden::plugin::types::{Delivery, DeliveryError, Failure, Rejection, SourceSpec};
use serde_json::{Value, json};

/// Where deliveries go when neither the payload nor the config says.
const DEFAULT_OUTBOX: &str = "/outbox/deliveries.jsonl";

struct Channel;

impl Guest for Channel {
    fn describe() -> SourceSpec {
        SourceSpec {
            name: "test-channel".into(),
            description: "Appends deliveries to a file, or fails as the payload asks.".into(),
        }
    }

    fn deliver(delivery: Delivery) -> Result<(), DeliveryError> {
        fail_first()?;
        let payload = match serde_json::from_str::<Value>(&delivery.payload) {
            Ok(value @ Value::Object(_)) => value,
            _ => {
                return Err(DeliveryError::InvalidDelivery(format!(
                    "payload must be a JSON object, got {}",
                    delivery.payload
                )));
            }
        };
        let text = |key: &str, default: &str| {
            payload
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let message = text("message", "requested by the payload");
        match payload
            .get("outcome")
            .and_then(Value::as_str)
            .unwrap_or("ok")
        {
            "ok" => append(&delivery, &payload),
            "rejected" => Err(DeliveryError::Rejected(Rejection {
                status: payload
                    .get("status")
                    .and_then(Value::as_u64)
                    .and_then(|s| u16::try_from(s).ok())
                    .unwrap_or(503),
                message,
            })),
            "denied" => Err(DeliveryError::Denied(message)),
            "invalid" => Err(DeliveryError::InvalidDelivery(message)),
            "failed" => Err(DeliveryError::Failed(Failure {
                message,
                retryable: payload
                    .get("retryable")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            })),
            other => Err(DeliveryError::InvalidDelivery(format!(
                "unknown outcome `{other}`"
            ))),
        }
    }
}

/// With `fail_first = N` configured: counts this attempt in the attempts
/// file and fails it while the count is at most `N`.
fn fail_first() -> Result<(), DeliveryError> {
    let Some(limit) = host::config("fail_first") else {
        return Ok(());
    };
    let limit: u64 = limit.trim().parse().map_err(|_| {
        DeliveryError::InvalidDelivery(format!("config `fail_first` is not a number: {limit}"))
    })?;
    let counter = host::config("attempts_file").unwrap_or_else(|| "/outbox/attempts".to_owned());
    let seen = std::fs::read_to_string(&counter)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    std::fs::write(&counter, seen.to_string()).map_err(|e| {
        DeliveryError::Failed(Failure {
            message: format!("count the attempt in {counter}: {e}"),
            retryable: true,
        })
    })?;
    if seen <= limit {
        return Err(DeliveryError::Failed(Failure {
            message: format!("attempt {seen} fails: the first {limit} are configured to"),
            retryable: true,
        }));
    }
    Ok(())
}

/// Appends the delivery as one JSON line to the outbox file.
fn append(delivery: &Delivery, payload: &Value) -> Result<(), DeliveryError> {
    let path = match payload.get("path").and_then(Value::as_str) {
        Some(path) => path.to_owned(),
        None => host::config("outbox").unwrap_or_else(|| DEFAULT_OUTBOX.to_owned()),
    };
    let line = json!({
        "id": delivery.id,
        "run_id": delivery.run_id,
        "kind": delivery.kind,
        "payload": payload,
    });
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{line}"))
        .map_err(|e| {
            DeliveryError::Failed(Failure {
                message: format!("append to {path}: {e}"),
                retryable: true,
            })
        })
}
