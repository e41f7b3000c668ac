//! Operator ceilings and run budgets bound every lease: a manifest that
//! declares huge limits (unmetered fuel, an hour, gigabytes of stdio and
//! output, unbounded HTTP) gets at most the sandbox's ceilings, and each
//! lease a run makes fits in what is left of the run's fuel and wall time.

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::{Event, ToolCallError};
use warden::engine::{Agent, RunStatus};
use warden::grant::Grant;
use warden::plugins::PluginHost;
use warden::sandbox::{LeaseFailure, Limits, Outcome, Sandbox, SandboxConfig};
use warden::store::MemoryStore;
use warden_tests::guests;

use crate::engine::{id, runtime};
use crate::plugin_manifest as manifest;
use crate::{call, output};

/// What a third-party manifest may ask for: everything, without end.
const HUGE_LIMITS: &str = "[limits]\nfuel = \"unmetered\"\ntimeout = \"1h\"\nmemory = \"64MiB\"\ntables = 100000000\noutput = \"1GiB\"\nstdio = \"1GiB\"\nhttp_requests = 1000000\nhttp_response = \"1024GiB\"\n";

/// The ceilings of the small sandbox below.
fn ceilings() -> Limits {
    Limits {
        fuel: Some(300_000_000),
        timeout: Duration::from_secs(3),
        memory_bytes: 32 << 20,
        table_elements: 20_000,
        output_bytes: 64 << 10,
        stdio_bytes: 4 << 10,
        http_requests: 2,
        http_response_bytes: 1000,
    }
}

/// A sandbox whose operator set tight ceilings.
fn capped() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        Sandbox::new(SandboxConfig {
            cache_dir: Some(std::env::temp_dir().join("warden-tests-components")),
            max_concurrent_leases: 4,
            max_memory_bytes: 64 << 20,
            ceilings: ceilings(),
            ..SandboxConfig::default()
        })
        .unwrap()
    })
}

#[tokio::test]
async fn a_manifest_declaring_huge_limits_gets_the_operator_ceilings() {
    let dir = tempfile::tempdir().unwrap();
    let source = manifest(dir.path(), "greedy", "tool", guests::HOSTILE, HUGE_LIMITS);
    let host = PluginHost::new(capped().clone());
    let plugin = host
        .load(&source, &Grant::default(), dir.path())
        .await
        .unwrap();
    assert_eq!(plugin.granted().limits(), &ceilings());

    // Unmetered fuel is the ceiling's fuel.
    let leased = plugin.invoke(&call("spin", json!({})), None).await.unwrap();
    assert_eq!(
        leased.result.unwrap_err().failure,
        LeaseFailure::OutOfFuel { limit: 300_000_000 }
    );
    // 1 MiB of stdout: host memory holds at most the ceiling's 4 KiB.
    let leased = plugin
        .invoke(
            &call(
                "huge_stdout",
                json!({ "bytes": 1 << 20, "chunk_bytes": 4096 }),
            ),
            None,
        )
        .await
        .unwrap();
    let receipt = &leased.receipt;
    assert_eq!(receipt.stdout_bytes, 1 << 20);
    assert!(receipt.stdout_bytes - receipt.stdio_dropped_bytes <= 4 << 10);
    // A 1 MiB answer is over the ceiling's 64 KiB of output.
    let leased = plugin
        .invoke(&call("huge_output", json!({ "bytes": 1 << 20 })), None)
        .await
        .unwrap();
    assert!(matches!(
        leased.result.unwrap_err().failure,
        LeaseFailure::OutputLimit { limit, .. } if limit == 64 << 10
    ));
    // The host serves a normal call after each.
    let leased = plugin.invoke(&call("noop", json!({})), None).await.unwrap();
    assert_eq!(leased.receipt.outcome, Outcome::Ok);
    assert_eq!(output(&leased), json!({}));

    // The default ceilings hold when the operator sets none.
    let host = PluginHost::new(crate::sandbox().clone());
    let plugin = host
        .load(&source, &Grant::default(), dir.path())
        .await
        .unwrap();
    let limits = plugin.granted().limits();
    assert_eq!(limits.fuel, Limits::CEILINGS.fuel);
    assert_eq!(limits.timeout, Limits::CEILINGS.timeout);
    assert_eq!(limits.stdio_bytes, Limits::CEILINGS.stdio_bytes);
    assert_eq!(limits.output_bytes, Limits::CEILINGS.output_bytes);
    assert_eq!(limits.http_requests, Limits::CEILINGS.http_requests);
    assert_eq!(
        limits.http_response_bytes,
        Limits::CEILINGS.http_response_bytes
    );
}

/// A directory with a greedy hostile plugin (huge manifest limits, no
/// mount) whose `spin` runs without approval, and an agent over it with
/// `budgets` (TOML lines).
fn greedy_agent(dir: &std::path::Path, budgets: &str, spin_effect: &str) -> Agent {
    manifest(dir, "greedy", "tool", guests::HOSTILE, HUGE_LIMITS);
    std::fs::write(
        dir.join("transcript.toml"),
        "[[turns]]\ntext = \"Spinning.\"\n[[turns.tool_calls]]\nname = \"greedy__spin\"\narguments = {}\n\n[[turns]]\ntext = \"Done.\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("agent.toml"),
        format!(
            "name = \"spinner\"\ninstructions = \"Spin.\"\n\n[model]\nprovider = \"scripted\"\nname = \"script\"\ntranscript = \"transcript.toml\"\n\n[budgets]\n{budgets}\n\n[plugins.greedy]\nsource = \"greedy.toml\"\napproval = {{ spin = \"never\" }}\n[plugins.greedy.grant.tools.spin]\neffect = \"{spin_effect}\"\n"
        ),
    )
    .unwrap();
    Agent::load(&dir.join("agent.toml"), None).unwrap()
}

#[tokio::test]
async fn a_lease_fits_in_what_is_left_of_the_runs_fuel() {
    let dir = tempfile::tempdir().unwrap();
    let agent = greedy_agent(dir.path(), "max_fuel = 50_000_000", "read");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("fuel")))
        .await
        .unwrap();
    rt.drive(&run, &agent).await.unwrap();
    let events = rt.events(&run).await.unwrap();
    let completed = events
        .iter()
        .find_map(|e| match e {
            Event::ToolCallCompleted(c) => Some(c),
            _ => None,
        })
        .expect("the spin was completed");
    assert_eq!(completed.receipt.outcome, Outcome::OutOfFuel);
    assert!(completed.receipt.fuel_consumed <= 50_000_000);
    let text = serde_json::to_string(&completed.result).unwrap();
    assert!(text.contains("limit 50000000"), "{text}");
}

#[tokio::test]
async fn a_lease_fits_in_what_is_left_of_the_runs_wall_time() {
    let dir = tempfile::tempdir().unwrap();
    // A write: tried once, so the test waits one bounded deadline.
    let agent = greedy_agent(dir.path(), "max_wall_time = \"1s\"", "write");
    let rt = runtime(Arc::new(MemoryStore::new()));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("wall")))
        .await
        .unwrap();
    // The driver stops at the write whose outcome is unknown.
    let _ = rt.drive(&run, &agent).await;
    assert_eq!(
        rt.state(&run).await.unwrap().status(),
        RunStatus::NeedsReconciliation
    );
    let events = rt.events(&run).await.unwrap();
    let failed = events
        .iter()
        .find_map(|e| match e {
            Event::ToolCallAttemptFailed(f) => Some(f),
            _ => None,
        })
        .expect("the spin's lease died");
    assert_eq!(failed.receipt.outcome, Outcome::Timeout);
    match &failed.error {
        ToolCallError::LeaseFailed { message, .. } => {
            assert!(message.contains("deadline of 1s"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

/// Issue 37, item 9: with no budget set, a run's fuel is bounded by the
/// host's `fuel_per_run` ceiling: once the run has used it, its next plugin
/// call is refused, naming the ceiling and its value. Under the default
/// ceiling the same response's second call runs.
#[tokio::test]
async fn a_run_past_its_fuel_ceiling_starts_no_more_plugin_calls() {
    use warden::engine::ceilings::{Ceiling, RunCeilings};
    let dir = tempfile::tempdir().unwrap();
    greedy_agent(dir.path(), "", "read");
    std::fs::write(
        dir.path().join("transcript.toml"),
        "[[turns]]\ntext = \"Spinning twice.\"\n[[turns.tool_calls]]\nname = \"greedy__spin\"\narguments = {}\n[[turns.tool_calls]]\nname = \"greedy__spin\"\narguments = {}\n\n[[turns]]\ntext = \"Done.\"\n",
    )
    .unwrap();
    let agent = Agent::load(&dir.path().join("agent.toml"), None).unwrap();
    let spins = |ceilings: RunCeilings, run: &'static str| {
        let agent = agent.clone();
        async move {
            let rt = warden::Runtime::new(
                Arc::new(MemoryStore::new()),
                PluginHost::new(capped().clone()),
            )
            .with_ceilings(ceilings);
            let run = rt
                .start(&agent, json!("go"), StartOptions::new().id(id(run)))
                .await
                .unwrap();
            assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
            rt.events(&run).await.unwrap()
        }
    };
    let low = RunCeilings {
        fuel_per_run: 100_000_000,
        ..RunCeilings::DEFAULT
    };
    let events = spins(low, "fuel-ceiling").await;
    let ran = events
        .iter()
        .filter(|e| matches!(e, Event::ToolCallIntent(_)))
        .count();
    let refused: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallRejected(r) => Some(r.error.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ran, 1, "the first spin ran");
    assert_eq!(
        refused,
        [ToolCallError::CeilingReached {
            ceiling: Ceiling::FuelPerRun,
            limit: 100_000_000
        }]
    );
    assert!(
        refused[0]
            .to_string()
            .contains("raises `[ceilings] fuel_per_run` in warden.toml"),
        "{}",
        refused[0]
    );
    // The default ceiling lets both run.
    let events = spins(RunCeilings::DEFAULT, "fuel-default").await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ToolCallRejected(_)))
    );
}
