//! Context sources and channels through their adapters: same leases, limits,
//! receipts and typed errors as tools.

use std::time::Duration;

use serde_json::json;
use warden::sandbox::{Access, Capabilities, LeaseFailure, Limits, Outcome, PluginKind, wit};
use warden_tests::guests;

use crate::{load, sandbox, test_limits};

fn request(query: serde_json::Value) -> wit::ContextRequest {
    wit::ContextRequest {
        run_id: "run-1".into(),
        query: query.to_string(),
    }
}

#[tokio::test]
async fn context_sources_resolve_items_and_typed_errors() {
    let component = load(guests::CONTEXT);
    assert_eq!(component.kinds(), [PluginKind::Context]);
    let g = sandbox().grant(&component, Capabilities::none(), test_limits());

    let spec = g.describe_source().await.result.unwrap();
    assert!(!spec.name.is_empty());

    let leased = g
        .resolve(
            &request(
                json!({ "items": [{ "source": "a.md", "content": "alpha", "modified_ms": 5 }] }),
            ),
            None,
        )
        .await;
    let items = leased.result.unwrap().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].source, "a.md");
    assert_eq!(items[0].content, "alpha");
    assert_eq!(items[0].modified_ms, Some(5));
    assert_eq!(leased.receipt.outcome, Outcome::Ok);

    let leased = g
        .resolve(
            &request(json!({ "error": { "kind": "denied", "message": "not yours" } })),
            None,
        )
        .await;
    assert_eq!(
        leased.result.unwrap().unwrap_err(),
        wit::ContextError::Denied("not yours".into())
    );
    assert_eq!(leased.receipt.outcome, Outcome::GuestError);

    // Reading a file the source was not granted fails inside the guest.
    let leased = g
        .resolve(&request(json!({ "read": ["/etc/hostname"] })), None)
        .await;
    assert!(matches!(leased.result, Ok(Err(_))), "{:?}", leased.result);
}

#[tokio::test]
async fn a_context_source_is_held_to_its_output_limit() {
    let component = load(guests::CONTEXT);
    let g = sandbox().grant(
        &component,
        Capabilities::none(),
        Limits {
            output_bytes: 1024,
            ..test_limits()
        },
    );
    let big = "x".repeat(4096);
    let leased = g
        .resolve(
            &request(json!({ "items": [{ "source": "big", "content": big }] })),
            None,
        )
        .await;
    assert!(matches!(
        leased.result.unwrap_err().failure,
        LeaseFailure::OutputLimit { limit: 1024, .. }
    ));
}

#[tokio::test]
async fn channels_deliver_and_report_typed_errors() {
    let outbox = tempfile::tempdir().unwrap();
    let component = load(guests::CHANNEL);
    assert_eq!(component.kinds(), [PluginKind::Channel]);
    let caps = Capabilities::none()
        .mount("outbox", outbox.path(), Access::ReadWrite)
        .unwrap();
    let g = sandbox().grant(&component, caps, test_limits());
    g.describe_channel().await.result.unwrap();

    let delivery = |payload: serde_json::Value| wit::Delivery {
        id: "d-1".into(),
        run_id: "run-1".into(),
        kind: "completed".into(),
        payload: payload.to_string(),
    };
    let leased = g.deliver(&delivery(json!({ "outcome": "ok" })), None).await;
    assert_eq!(leased.result.unwrap(), Ok(()));
    let written = std::fs::read_to_string(outbox.path().join("deliveries.jsonl")).unwrap();
    assert_eq!(written.lines().count(), 1);
    assert!(written.contains("d-1"), "{written}");

    let leased = g
        .deliver(
            &delivery(json!({ "outcome": "rejected", "status": 503, "message": "busy" })),
            None,
        )
        .await;
    match leased.result.unwrap() {
        Err(wit::DeliveryError::Rejected(r)) => {
            assert_eq!(r.status, 503);
            assert_eq!(r.message, "busy");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::GuestError);

    // A read-only outbox: the write fails inside the guest, typed.
    let ro = Capabilities::none()
        .mount("outbox", outbox.path(), Access::ReadOnly)
        .unwrap();
    let g = sandbox().grant(
        &component,
        ro,
        Limits {
            timeout: Duration::from_secs(5),
            ..test_limits()
        },
    );
    let leased = g.deliver(&delivery(json!({ "outcome": "ok" })), None).await;
    assert!(
        matches!(leased.result, Ok(Err(wit::DeliveryError::Failed(_)))),
        "{:?}",
        leased.result
    );
    assert_eq!(
        std::fs::read_to_string(outbox.path().join("deliveries.jsonl"))
            .unwrap()
            .lines()
            .count(),
        1
    );
}

#[tokio::test]
async fn a_component_is_only_called_through_the_worlds_it_exports() {
    let component = load(guests::CHANNEL);
    let g = sandbox().grant(&component, Capabilities::none(), test_limits());
    let leased = g.describe_tools().await;
    match leased.result.unwrap_err().failure {
        LeaseFailure::Refused { reason } => {
            assert!(reason.contains("does not export the tool"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::Refused);
}
