//! `webhook-channel`: Warden's first-party channel that POSTs each delivery
//! as JSON to one URL, the config value `url`, whose host the operator must
//! grant.
//!
//! The body is `{"id", "run_id", "kind", "payload"}` with the payload as a
//! JSON value; headers are `content-type: application/json`,
//! `idempotency-key: <delivery id>` (stable across retries, so the receiver
//! can drop duplicates) and, when the operator grants `WEBHOOK_TOKEN`,
//! `authorization: Bearer <token>`. Each delivery is one request with a
//! timeout (config `timeout_ms`, default [`DEFAULT_TIMEOUT_MS`], for
//! connecting, the first byte and between bytes); redirects are not
//! followed.
//!
//! Outcomes: a 2xx answer is success; any other status is `rejected`
//! carrying the status and the start of the answer's body; a request the
//! host's policy refuses is `denied`, naming the host; timeouts and
//! transport failures are `failed` and retryable; a missing or bad `url`, or
//! a payload that is not JSON, is `failed` / `invalid-delivery`.
#![forbid(unsafe_code)]

use std::time::Duration;

use serde_json::{Value, json};
use warden_guest::http::{self, HttpError, Request, Response};
use warden_guest::{ChannelPlugin, Delivery, DeliveryError, SourceSpec};

/// Default of the `timeout_ms` config value.
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;
/// Most bytes of a rejecting answer's body kept in the error.
const MAX_REJECTION_BODY: usize = 512;

/// The request for `delivery`.
pub fn request(
    url: &str,
    timeout: Duration,
    token: Option<&str>,
    delivery: &Delivery,
) -> Result<Request, DeliveryError> {
    let payload: Value = if delivery.payload.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(&delivery.payload).map_err(|e| {
            DeliveryError::invalid_delivery(format!(
                "payload of delivery `{}` is not JSON: {e}",
                delivery.id
            ))
        })?
    };
    let body = json!({
        "id": delivery.id,
        "run_id": delivery.run_id,
        "kind": delivery.kind,
        "payload": payload,
    });
    let mut request = Request::new("POST", url)
        .header("content-type", "application/json")
        .header("idempotency-key", &delivery.id)
        .header("user-agent", "warden-webhook-channel/0.1")
        .body(body.to_string())
        .timeout(timeout)
        .max_response_bytes(MAX_REJECTION_BODY);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    Ok(request)
}

/// What an answer or an HTTP error means for the delivery.
pub fn outcome(result: Result<Response, HttpError>) -> Result<(), DeliveryError> {
    match result {
        Ok(response) if response.is_success() => Ok(()),
        Ok(response) => {
            let body = String::from_utf8_lossy(&response.body);
            let body = body.trim();
            Err(DeliveryError::rejected(
                response.status,
                if body.is_empty() {
                    format!("the webhook answered {}", response.status)
                } else {
                    format!("the webhook answered {}: {body}", response.status)
                },
            ))
        }
        Err(e @ HttpError::Denied { .. }) => Err(DeliveryError::denied(e.to_string())),
        Err(e @ (HttpError::InvalidUrl { .. } | HttpError::InvalidRequest { .. })) => Err(
            DeliveryError::failed(format!("config `url` cannot be used: {e}")),
        ),
        Err(e) if e.is_retryable() => Err(DeliveryError::retryable(e.to_string())),
        Err(e) => Err(DeliveryError::failed(e.to_string())),
    }
}

/// The plugin as the component exports it.
pub struct WebhookChannel;

impl ChannelPlugin for WebhookChannel {
    fn describe() -> SourceSpec {
        SourceSpec::new(
            "webhook-channel",
            "POSTs each delivery as JSON to a configured URL on a granted host",
        )
    }

    fn deliver(delivery: Delivery) -> Result<(), DeliveryError> {
        let url = warden_guest::config("url")
            .ok_or_else(|| DeliveryError::failed("config `url` is not set"))?;
        let timeout = match warden_guest::config("timeout_ms") {
            None => DEFAULT_TIMEOUT_MS,
            Some(t) => t.trim().parse().map_err(|_| {
                DeliveryError::failed(format!("config `timeout_ms` is `{t}`, expected a number"))
            })?,
        };
        let token = std::env::var("WEBHOOK_TOKEN").ok();
        let request = request(
            &url,
            Duration::from_millis(timeout),
            token.as_deref(),
            &delivery,
        )?;
        outcome(http::send(&request))
    }
}

warden_guest::export_channel_plugin!(WebhookChannel);

#[cfg(test)]
mod tests {
    use super::*;
    use warden_guest::testing::{clear_config, delivery, set_config, set_http};

    fn answer(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            truncated: false,
        }
    }

    #[test]
    fn posts_the_delivery_as_json_with_its_id_as_idempotency_key() {
        clear_config();
        set_config("url", "https://hooks.example.com/warden");
        let seen = std::rc::Rc::new(std::cell::RefCell::new(None));
        let log = std::rc::Rc::clone(&seen);
        set_http(move |r| {
            *log.borrow_mut() = Some(r.clone());
            Ok(answer(204, ""))
        });
        WebhookChannel::deliver(delivery("completed", json!({"summary": "ok"}))).unwrap();
        let sent = seen.borrow().clone().unwrap();
        assert_eq!(
            (sent.method.as_str(), sent.url.as_str()),
            ("POST", "https://hooks.example.com/warden")
        );
        assert_eq!(
            sent.timeout,
            Some(Duration::from_millis(DEFAULT_TIMEOUT_MS))
        );
        assert!(
            sent.headers
                .contains(&("idempotency-key".into(), "test-delivery".into()))
        );
        let body: Value = serde_json::from_slice(&sent.body).unwrap();
        assert_eq!(
            body,
            json!({"id": "test-delivery", "run_id": "", "kind": "completed", "payload": {"summary": "ok"}})
        );
    }

    #[test]
    fn answers_and_errors_become_typed_delivery_errors() {
        assert_eq!(outcome(Ok(answer(200, "fine"))), Ok(()));
        assert_eq!(
            outcome(Ok(answer(503, " busy \n"))),
            Err(DeliveryError::rejected(
                503,
                "the webhook answered 503: busy"
            ))
        );
        assert_eq!(
            outcome(Ok(answer(302, ""))),
            Err(DeliveryError::rejected(302, "the webhook answered 302"))
        );
        let host = "hooks.example.com:443".to_string();
        assert!(matches!(
            outcome(Err(HttpError::Denied { host: host.clone(), reason: "no".into() })),
            Err(DeliveryError::Denied(m)) if m.contains("hooks.example.com:443")
        ));
        assert!(matches!(
            outcome(Err(HttpError::Timeout { host })),
            Err(DeliveryError::Failed(f)) if f.retryable
        ));
    }

    #[test]
    fn configuration_problems_are_failures() {
        clear_config();
        assert_eq!(
            WebhookChannel::deliver(delivery("completed", json!({}))),
            Err(DeliveryError::failed("config `url` is not set"))
        );
        set_config("url", "ftp://x/");
        assert!(matches!(
            WebhookChannel::deliver(delivery("completed", json!({}))),
            Err(DeliveryError::Failed(f)) if f.message.contains("config `url`")
        ));
        let mut d = delivery("completed", json!({}));
        d.payload = "nope".into();
        assert!(matches!(
            request("http://h/", Duration::from_secs(1), None, &d),
            Err(DeliveryError::InvalidDelivery(_))
        ));
    }
}
