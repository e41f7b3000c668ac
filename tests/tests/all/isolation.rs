//! Isolation between leases and from the host: no state survives a lease,
//! only granted environment variables are visible and their values never
//! leave the sandbox, a spinning guest does not starve other work, and a
//! cancelled lease stops.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use warden::sandbox::{Capabilities, LeaseFailure, Limits, Outcome};

use crate::{assert_serves_normal_call, call, hostile, invoke, output, test_limits};

#[tokio::test]
async fn nothing_leaks_from_one_lease_to_the_next() {
    let g = hostile(Capabilities::none(), test_limits());
    let set = invoke(&g, "set_marker", json!({})).await;
    assert_eq!(output(&set)["memory"], true);
    let got = invoke(&g, "get_marker", json!({})).await;
    let got = output(&got);
    assert_eq!(got["memory"], false, "{got}");
    assert_eq!(got["env"], false, "{got}");
    assert_eq!(got["visible"], false, "{got}");
}

#[tokio::test]
async fn only_granted_environment_variables_are_visible() {
    let g = hostile(
        Capabilities::none().env("GRANTED", "visible value"),
        test_limits(),
    );
    let leased = invoke(&g, "env", json!({ "names": ["GRANTED", "HOME", "PATH"] })).await;
    let seen = output(&leased);
    assert_eq!(seen["vars"]["HOME"], json!(null));
    assert_eq!(seen["vars"]["PATH"], json!(null));
    let all = seen["all"].as_object().unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["GRANTED"]);
}

#[tokio::test]
async fn granted_secrets_are_redacted_from_output_and_logs() {
    let secret = "sk-live-0123456789";
    let g = hostile(Capabilities::none().env("API_TOKEN", secret), test_limits());
    let leased = invoke(&g, "env", json!({ "names": ["API_TOKEN"] })).await;
    let out = match &leased.result {
        Ok(Ok(out)) => out.content.clone(),
        other => panic!("{other:?}"),
    };
    assert!(!out.contains(secret), "{out}");
    assert!(out.contains("[redacted:API_TOKEN]"), "{out}");

    // Echoed back in arguments, the value is redacted too.
    let leased = invoke(&g, "echo", json!({ "note": secret })).await;
    let out = output(&leased);
    assert_eq!(out["arguments"]["note"], "[redacted:API_TOKEN]");

    // A secret in a typed error is redacted.
    let leased = invoke(
        &g,
        "fs",
        json!({ "op": "read", "path": format!("/nowhere/{secret}") }),
    )
    .await;
    match &leased.result {
        Ok(Err(e)) => assert!(!format!("{e:?}").contains(secret), "{e:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn config_values_reach_only_their_plugin() {
    let g = hostile(
        Capabilities::none().config("echo", "configured"),
        test_limits(),
    );
    let leased = invoke(&g, "echo", json!({})).await;
    assert_eq!(output(&leased)["config"], "configured");
    let bare = hostile(Capabilities::none(), test_limits());
    let leased = invoke(&bare, "echo", json!({})).await;
    assert_eq!(output(&leased)["config"], json!(null));
}

/// On a single-threaded runtime, a guest spinning without fuel must still let
/// other leases run: the epoch callback yields to the executor at every tick.
/// The spinner is cancelled afterwards, which proves it was still running.
#[tokio::test(flavor = "current_thread")]
async fn a_spinning_guest_does_not_starve_other_leases() {
    let spinner = hostile(
        Capabilities::none(),
        Limits {
            fuel: None,
            timeout: Duration::from_secs(120),
            ..test_limits()
        },
    );
    let token = CancellationToken::new();
    let spin = tokio::spawn({
        let token = token.clone();
        async move { spinner.invoke(&call("spin", json!({})), Some(&token)).await }
    });
    // Let the spinner start.
    tokio::task::yield_now().await;
    let g = hostile(Capabilities::none(), test_limits());
    for _ in 0..20 {
        assert_serves_normal_call(&g).await;
    }
    token.cancel();
    let leased = spin.await.unwrap();
    assert_eq!(leased.receipt.outcome, Outcome::Cancelled);
}

#[tokio::test]
async fn cancelling_a_lease_stops_it() {
    let g = hostile(
        Capabilities::none(),
        Limits {
            timeout: Duration::from_secs(60),
            ..test_limits()
        },
    );
    let token = CancellationToken::new();
    let canceller = {
        let token = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            token.cancel();
        })
    };
    let leased = g
        .invoke(&call("sleep_forever", json!({})), Some(&token))
        .await;
    canceller.await.unwrap();
    assert_eq!(leased.result.unwrap_err().failure, LeaseFailure::Cancelled);
    assert_eq!(leased.receipt.outcome, Outcome::Cancelled);

    // A spinning guest is cancelled at the next epoch tick.
    let spinner = hostile(
        Capabilities::none(),
        Limits {
            fuel: None,
            timeout: Duration::from_secs(60),
            ..test_limits()
        },
    );
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        t.cancel();
    });
    let leased = spinner.invoke(&call("spin", json!({})), Some(&token)).await;
    assert_eq!(leased.receipt.outcome, Outcome::Cancelled);
    assert_serves_normal_call(&g).await;
}
