//! Isolation between leases and from the host: no state survives a lease,
//! no byte of a lease's linear memory reaches the next one, only granted environment variables are visible and their values never
//! leave the sandbox, a spinning guest does not starve other work, and a
//! cancelled lease stops.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use warden::sandbox::{Capabilities, LeaseFailure, Limits, Outcome, Sandbox, SandboxConfig};
use warden_tests::guests;

use crate::{Logs, assert_serves_normal_call, call, failure, hostile, invoke, output, test_limits};

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

/// The pooling allocator keeps a slot's memory resident between leases and
/// resets in place only the pages a lease wrote (the sandbox's engine
/// settings): a page the reset missed would hand one lease's bytes to the
/// next. A guest writes a secret across its memory (stack, zeroed and
/// initialised statics, heap, grown pages; more than is kept resident, so
/// both resets run), and later leases of the same component scan all of
/// theirs for it. The writing lease's own scan finds every word it wrote:
/// without the reset, the next lease in that slot would find them too.
#[tokio::test]
async fn no_byte_of_a_leases_memory_reaches_the_next_lease() {
    // One lease at a time: a pool of two memory slots, so each is reused
    // within a few leases, whichever the pool picks.
    let sandbox = Sandbox::new(SandboxConfig {
        cache_dir: Some(std::env::temp_dir().join("warden-tests-components")),
        max_concurrent_leases: 1,
        ..SandboxConfig::default()
    })
    .unwrap();
    let wasm = std::fs::read(guests::HOSTILE).unwrap();
    let component = sandbox.load("hostile", &wasm, None).unwrap();
    let g = sandbox.grant(&component, Capabilities::none(), test_limits());
    let mut seeds = Vec::new();
    for round in 0..6_u64 {
        let seed = 0x5ec2_e7a1_0000_0000 | round;
        let wrote = output(&invoke(&g, "scatter_secret", json!({ "seed": seed })).await);
        assert!(wrote["written"].as_u64().unwrap() > 400_000, "{wrote}");
        assert_eq!(wrote["found"], wrote["written"], "the scan misses: {wrote}");
        seeds.push(seed);
        for lease in 0..3 {
            let seen = output(&invoke(&g, "scan_secret", json!({ "seeds": seeds })).await);
            assert_eq!(seen["found"], 0, "round {round}, lease {lease}: {seen}");
            assert_eq!(seen["data_restored"], true, "round {round}: {seen}");
        }
    }
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
    let logs = Logs::capture();
    let g = hostile(Capabilities::none().env("API_TOKEN", secret), test_limits());
    let leased = invoke(&g, "env", json!({ "names": ["API_TOKEN"] })).await;
    let out = match &leased.result {
        Ok(Ok(out)) => out.content.clone(),
        other => panic!("{other:?}"),
    };
    assert!(!out.contains(secret), "{out}");
    assert!(out.contains("[redacted:API_TOKEN]"), "{out}");

    // Echoed back in arguments, the value is redacted too (the guest also
    // logs the arguments through the host).
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

    // Written to stdout and stderr, logged through the host, and in a
    // panic (stderr, then a trap).
    let said = format!("token {secret} said");
    let leased = invoke(
        &g,
        "say",
        json!({ "log": said, "stdout": said, "stderr": said }),
    )
    .await;
    assert_eq!(leased.receipt.outcome, Outcome::Ok);
    let leased = invoke(&g, "panic", json!({ "message": said })).await;
    let failure = leased.result.unwrap_err();
    assert!(!failure.to_string().contains(secret), "{failure}");

    let text = logs.text();
    assert!(!text.contains(secret), "{text}");
    for stream in ["stdout", "stderr"] {
        assert!(
            text.lines()
                .any(|l| l.contains(stream) && l.contains("token [redacted:API_TOKEN] said")),
            "{stream}: {text}"
        );
    }
    assert!(
        text.contains("echo: {\"note\":\"[redacted:API_TOKEN]\"}"),
        "{text}"
    );
    assert_serves_normal_call(&g).await;
}

/// The host parses a tool's output as JSON; a secret written with `\u`
/// escapes is redacted in what that decoding yields, strings and keys.
#[tokio::test]
async fn a_secret_in_json_escapes_is_redacted_after_decoding() {
    let secret = "sk-live-0123456789";
    let g = hostile(Capabilities::none().env("API_TOKEN", secret), test_limits());
    let escaped: String = secret
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let text = format!(r#"{{"token": "{escaped}", "{escaped}": ["x{escaped}"]}}"#);
    let leased = invoke(&g, "say", json!({ "output": text })).await;
    let decoded = output(&leased);
    assert!(!decoded.to_string().contains(secret), "{decoded}");
    assert_eq!(decoded["token"], "[redacted:API_TOKEN]");
    assert_eq!(decoded["[redacted:API_TOKEN]"][0], "x[redacted:API_TOKEN]");
    // In a typed error the same.
    let leased = invoke(&g, "say", json!({ "error": text })).await;
    let message = failure(&leased);
    let decoded: serde_json::Value = serde_json::from_str(&message).unwrap();
    assert!(!decoded.to_string().contains(secret), "{decoded}");
    assert_serves_normal_call(&g).await;
}

/// A host log line is cut at 4096 bytes after redaction, not before: no
/// beginning of a secret straddling the cut is left.
#[tokio::test]
async fn a_log_line_is_redacted_before_it_is_cut() {
    let secret = "sk-live-0123456789abcdefgh";
    let logs = Logs::capture();
    let g = hostile(Capabilities::none().env("API_TOKEN", secret), test_limits());
    let line = format!("{}{secret}", "y".repeat(4096 - 25));
    let leased = invoke(&g, "say", json!({ "log": line })).await;
    assert_eq!(leased.receipt.outcome, Outcome::Ok);
    // Cut by the stdio budget, the end of stdout keeps no prefix either.
    let small = hostile(
        Capabilities::none().env("API_TOKEN", secret),
        Limits {
            stdio_bytes: 100,
            ..test_limits()
        },
    );
    let out = format!("{}{secret}", "z".repeat(90));
    let leased = invoke(&small, "say", json!({ "stdout": out })).await;
    assert!(leased.receipt.stdio_dropped_bytes > 0);
    let text = logs.text();
    assert!(text.contains(&"y".repeat(100)), "the line was logged");
    assert!(text.contains(&"z".repeat(90)), "stdout was logged");
    assert!(!text.contains("sk-l"), "{text}");
    assert_serves_normal_call(&g).await;
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
