//! Context sources, channels and policies through their adapters: same
//! leases, limits, receipts and typed errors as tools.

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

fn policy_request(hook: wit::PolicyHook, subject: serde_json::Value) -> wit::PolicyRequest {
    wit::PolicyRequest {
        run_id: "run-1".into(),
        agent: "agent".into(),
        policy: "guard".into(),
        hook,
        subject: subject.to_string(),
    }
}

#[tokio::test]
async fn policies_decide_from_their_config_and_count_their_calls() {
    let count = tempfile::tempdir().unwrap();
    let component = load(guests::POLICY);
    assert_eq!(component.kinds(), [PluginKind::Policy]);
    let caps = Capabilities::none()
        .mount("count", count.path(), Access::ReadWrite)
        .unwrap()
        .config("deny_tools", "fs__delete, fs__write_file")
        .config("require_in_output", "42");
    // Widened: the guest counts its calls by writing in its mount.
    let g = sandbox().grant(&component, caps, test_limits()).widened();
    assert_eq!(
        g.describe_policy().await.result.unwrap().name,
        "test-policy"
    );

    let tool_call = |tool: &str| {
        policy_request(
            wit::PolicyHook::BeforeToolCall,
            json!({ "hook": "before_tool_call", "call_id": "call-1-1", "tool": tool,
                    "arguments": { "path": "a.md" }, "effect": "write" }),
        )
    };
    let finish = |output: serde_json::Value| {
        policy_request(
            wit::PolicyHook::BeforeFinish,
            json!({ "hook": "before_finish", "step": 2, "output": output }),
        )
    };
    let cases = [
        (
            tool_call("fs__write_file"),
            wit::Decision::Deny("tool `fs__write_file` is not allowed by policy `guard`".into()),
        ),
        (tool_call("fs__read_file"), wit::Decision::Allow),
        (
            finish(json!("the answer is 41")),
            wit::Decision::Feedback("the answer must mention `42`".into()),
        ),
        (finish(json!({ "answer": 42 })), wit::Decision::Allow),
        (
            policy_request(
                wit::PolicyHook::RunStart,
                json!({ "hook": "run_start", "input": "hi", "session": "s-1" }),
            ),
            wit::Decision::Allow,
        ),
    ];
    for (request, expected) in &cases {
        let leased = g.decide(request, None).await;
        assert_eq!(leased.result.unwrap(), Ok(expected.clone()), "{request:?}");
        assert_eq!(leased.receipt.outcome, Outcome::Ok);
    }

    // A subject that does not fit its hook is the guest's typed error.
    let leased = g
        .decide(
            &policy_request(
                wit::PolicyHook::BeforeFinish,
                json!({ "hook": "before_finish", "step": 2 }),
            ),
            None,
        )
        .await;
    match leased.result.unwrap() {
        Err(wit::PolicyError::InvalidRequest(message)) => assert!(
            message.starts_with("invalid subject for hook `before_finish`: missing field `output`"),
            "{message}"
        ),
        other => panic!("expected an invalid request, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::GuestError);

    let calls = std::fs::read_to_string(count.path().join("calls")).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(
        lines,
        [
            "before_tool_call run-1",
            "before_tool_call run-1",
            "before_finish run-1",
            "before_finish run-1",
            "run_start run-1",
            "before_finish run-1",
        ]
    );
}

#[tokio::test]
async fn a_misbehaving_policy_is_stopped_with_a_typed_failure() {
    let component = load(guests::POLICY);
    let in_mode = |mode: &str, limits: Limits| {
        sandbox().grant(
            &component,
            Capabilities::none().config("mode", mode),
            limits,
        )
    };
    let run_start = policy_request(
        wit::PolicyHook::RunStart,
        json!({ "hook": "run_start", "input": "hi" }),
    );

    let leased = in_mode("error", test_limits())
        .decide(&run_start, None)
        .await;
    assert_eq!(
        leased.result.unwrap(),
        Err(wit::PolicyError::Failed(wit::Failure {
            message: "policy backend unavailable".into(),
            retryable: false,
        }))
    );

    // The adapter passes misplaced feedback on; the engine is the one that
    // counts it as a failure.
    let leased = in_mode("feedback_everywhere", test_limits())
        .decide(&run_start, None)
        .await;
    assert_eq!(
        leased.result.unwrap(),
        Ok(wit::Decision::Feedback(
            "feedback from policy `guard` at `run_start`".into()
        ))
    );

    let leased = in_mode("trap", test_limits())
        .decide(&run_start, None)
        .await;
    match leased.result.unwrap_err().failure {
        LeaseFailure::Trap { message } => assert!(message.contains("unreachable"), "{message}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::Trap);
    // The panic message went to the guest's stderr, which was captured.
    assert!(leased.receipt.stderr_bytes > 0);

    let fuel = Limits {
        fuel: Some(50_000_000),
        ..test_limits()
    };
    let leased = in_mode("loop", fuel).decide(&run_start, None).await;
    assert!(
        matches!(
            leased.result.as_ref().unwrap_err().failure,
            LeaseFailure::OutOfFuel { limit: 50_000_000 }
        ),
        "{:?}",
        leased.result
    );

    let unmetered = Limits {
        fuel: None,
        timeout: Duration::from_millis(300),
        ..test_limits()
    };
    let leased = in_mode("loop", unmetered).decide(&run_start, None).await;
    assert!(
        matches!(
            leased.result.as_ref().unwrap_err().failure,
            LeaseFailure::Timeout { .. }
        ),
        "{:?}",
        leased.result
    );

    let leased = in_mode("huge", test_limits())
        .decide(&run_start, None)
        .await;
    assert!(
        matches!(
            leased.result.as_ref().unwrap_err().failure,
            LeaseFailure::OutputLimit { limit, bytes } if limit == test_limits().output_bytes && bytes >= 16 << 20
        ),
        "{:?}",
        leased.result.as_ref().map(|_| ())
    );
}
