//! Guests that try to exhaust a limit. Each case asserts the typed outcome,
//! that the receipt names the limit, and that the host then serves a normal
//! call.

use std::time::Duration;

use serde_json::json;
use warden::sandbox::{
    Capabilities, GrowthResource, LeaseFailure, Limits, Outcome, Sandbox, SandboxConfig,
};
use warden_tests::guests;

use crate::{assert_serves_normal_call, failure, hostile, invoke, load, output, test_limits};

#[tokio::test]
async fn an_infinite_loop_runs_out_of_fuel() {
    let g = hostile(
        Capabilities::none(),
        Limits {
            fuel: Some(50_000_000),
            ..test_limits()
        },
    );
    let leased = invoke(&g, "spin", json!({})).await;
    assert_eq!(
        leased.result.unwrap_err().failure,
        LeaseFailure::OutOfFuel { limit: 50_000_000 }
    );
    assert_eq!(leased.receipt.outcome, Outcome::OutOfFuel);
    assert_eq!(leased.receipt.fuel_consumed, 50_000_000);
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn an_infinite_loop_without_fuel_hits_the_epoch_deadline() {
    let g = hostile(
        Capabilities::none(),
        Limits {
            fuel: None,
            timeout: Duration::from_millis(200),
            ..test_limits()
        },
    );
    let leased = invoke(&g, "spin", json!({})).await;
    assert_eq!(
        leased.result.unwrap_err().failure,
        LeaseFailure::Timeout {
            limit: Duration::from_millis(200)
        }
    );
    assert_eq!(leased.receipt.outcome, Outcome::Timeout);
    assert!(leased.receipt.wall_time_us >= 200_000);
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn sleeping_forever_in_a_host_call_hits_the_deadline() {
    let g = hostile(
        Capabilities::none(),
        Limits {
            timeout: Duration::from_millis(200),
            ..test_limits()
        },
    );
    let leased = invoke(&g, "sleep_forever", json!({})).await;
    assert_eq!(
        leased.receipt.outcome,
        Outcome::Timeout,
        "{:?}",
        leased.result
    );
    assert!(matches!(
        leased.result.unwrap_err().failure,
        LeaseFailure::Timeout { .. }
    ));
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn a_host_call_loop_is_stopped_by_fuel_and_by_the_deadline() {
    let fueled = hostile(
        Capabilities::none(),
        Limits {
            fuel: Some(20_000_000),
            ..test_limits()
        },
    );
    let leased = invoke(&fueled, "host_call_loop", json!({})).await;
    assert_eq!(
        leased.receipt.outcome,
        Outcome::OutOfFuel,
        "{:?}",
        leased.result
    );

    let unmetered = hostile(
        Capabilities::none(),
        Limits {
            fuel: None,
            timeout: Duration::from_millis(200),
            ..test_limits()
        },
    );
    let leased = invoke(&unmetered, "host_call_loop", json!({})).await;
    assert_eq!(
        leased.receipt.outcome,
        Outcome::Timeout,
        "{:?}",
        leased.result
    );
    assert_serves_normal_call(&unmetered).await;
}

#[tokio::test]
async fn memory_growth_past_the_limit_is_named_as_the_memory_limit() {
    let limits = Limits {
        memory_bytes: 16 << 20,
        ..test_limits()
    };
    let g = hostile(Capabilities::none(), limits);

    // A guest that lets the failed allocation abort: an opaque `unreachable`
    // trap, attributed to the recorded denial.
    let leased = invoke(&g, "grow_memory", json!({ "abort": true })).await;
    match leased.result.unwrap_err().failure {
        LeaseFailure::MemoryLimit { requested, limit } => {
            assert_eq!(limit, 16 << 20);
            assert!(requested > limit);
        }
        other => panic!("expected the memory limit, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::MemoryLimit);
    assert!(leased.receipt.peak_memory_bytes <= 16 << 20);
    assert!(leased.receipt.peak_memory_bytes > 8 << 20);

    // A guest that copes with the refusal returns its own error; the receipt
    // still records the denial.
    let leased = invoke(&g, "grow_memory", json!({})).await;
    assert!(failure(&leased).contains("allocation failed"));
    assert_eq!(leased.receipt.outcome, Outcome::GuestError);
    let denied = leased.receipt.denied_growth.unwrap();
    assert_eq!(denied.resource, GrowthResource::Memory);
    assert_eq!(denied.limit, 16 << 20);
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn table_growth_is_denied_at_the_limit() {
    let component = load(guests::TABLE_GROW);
    let g = crate::sandbox().grant(
        &component,
        Capabilities::none(),
        Limits {
            table_elements: 10_000,
            ..test_limits()
        },
    );
    let leased = invoke(&g, "table_grow", json!({})).await;
    assert!(failure(&leased).contains("table.grow failed"));
    let denied = leased.receipt.denied_growth.unwrap();
    assert_eq!(denied.resource, GrowthResource::Table);
    assert_eq!(denied.limit, 10_000);
    assert!(denied.requested > 10_000);
    // The sandbox's ceiling clamps any grant.
    let capped = Sandbox::new(SandboxConfig {
        max_table_elements: 5_000,
        ..SandboxConfig::default()
    })
    .unwrap();
    let wasm = std::fs::read(guests::TABLE_GROW).unwrap();
    let c = capped.load("table-grow", &wasm, None).unwrap();
    let g = capped.grant(&c, Capabilities::none(), test_limits());
    assert_eq!(g.limits().table_elements, 5_000);
    let leased = invoke(&g, "table_grow", json!({})).await;
    assert_eq!(leased.receipt.denied_growth.unwrap().limit, 5_000);
}

#[tokio::test]
async fn deep_recursion_is_a_stack_overflow_trap() {
    let g = hostile(Capabilities::none(), test_limits());
    let leased = invoke(&g, "recurse", json!({})).await;
    match leased.result.unwrap_err().failure {
        LeaseFailure::Trap { message } => {
            assert!(message.contains("call stack exhausted"), "{message}")
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::Trap);
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn huge_stdout_is_capped_and_counted_without_killing_the_guest() {
    let g = hostile(
        Capabilities::none(),
        Limits {
            stdio_bytes: 4096,
            ..test_limits()
        },
    );
    let bytes = 8u64 << 20;
    let leased = invoke(&g, "huge_stdout", json!({ "bytes": bytes })).await;
    assert_eq!(output(&leased), json!({ "written": bytes }));
    assert_eq!(leased.receipt.stdout_bytes, bytes);
    assert_eq!(leased.receipt.stdio_dropped_bytes, bytes - 4096);

    let leased = invoke(&g, "huge_stderr", json!({ "bytes": bytes })).await;
    assert_eq!(leased.receipt.stderr_bytes, bytes);
    assert_eq!(leased.receipt.stdio_dropped_bytes, bytes - 4096);

    let leased = invoke(&g, "log_flood", json!({ "lines": 1000, "line_bytes": 100 })).await;
    assert_eq!(leased.receipt.outcome, Outcome::Ok, "{:?}", leased.result);
    assert!(leased.receipt.log_bytes >= 100_000);
    assert!(leased.receipt.stdio_dropped_bytes >= 100_000 - 4096);
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn a_huge_return_value_hits_the_output_limit() {
    let g = hostile(
        Capabilities::none(),
        Limits {
            output_bytes: 1 << 20,
            ..test_limits()
        },
    );
    let leased = invoke(&g, "huge_output", json!({ "bytes": 4 << 20 })).await;
    match leased.result.unwrap_err().failure {
        LeaseFailure::OutputLimit { bytes, limit } => {
            assert_eq!(limit, 1 << 20);
            assert!(bytes >= 4 << 20);
        }
        other => panic!("expected the output limit, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::OutputLimit);
    // Just under the limit is fine.
    let leased = invoke(&g, "huge_output", json!({ "bytes": (1 << 20) - 16 })).await;
    assert_eq!(leased.receipt.outcome, Outcome::Ok);
    assert_serves_normal_call(&g).await;
}

#[tokio::test]
async fn a_guest_panic_is_a_trap_with_its_backtrace() {
    let g = hostile(Capabilities::none(), test_limits());
    let leased = invoke(&g, "panic", json!({ "message": "boom" })).await;
    match leased.result.unwrap_err().failure {
        LeaseFailure::Trap { message } => {
            assert!(message.contains("unreachable"), "{message}");
            assert!(message.contains("panic"), "{message}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_eq!(leased.receipt.outcome, Outcome::Trap);
    // The panic message went to the guest's stderr, which was captured.
    assert!(leased.receipt.stderr_bytes > 0);
    assert_serves_normal_call(&g).await;
}
