//! Policies carried out by WASM components (the `policy-plugin` world), end
//! to end: the test guest `policy` loaded under a grant as `[plugins.guard]`
//! and enabled with `[policies.guard] plugin = "guard"`, the scripted model,
//! real tools, both stores, and the `warden` binary. A denial before a tool
//! call is the call's result and the tool never runs; feedback asks the
//! model again; each decision is recorded once with its lease's receipt
//! (counted by the guest in a granted mount), so recovery and replay never
//! ask again; a hostile policy (spinning, trapping, erroring, flooding,
//! answering feedback everywhere) fails its run closed and the host goes on.

use std::sync::Arc;
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::{Event, PolicyDecided, RunError};
use warden::engine::{Agent, PolicyHook, PolicyVerdict, ReplayOptions, RunStatus, RuntimeError};
use warden::store::{EventStore, MemoryStore};
use warden_tests::guests;

use crate::engine::{Fixture, id, runtime, stores};

/// The policies tests' transcript (read, append, finish) with one more
/// answer, for a policy that sends the first one back.
fn transcript() -> String {
    format!(
        "{}\n[[turns]]\ntext = \"Done: I read input.txt.\"\n",
        crate::engine::READ_WRITE_FINISH
    )
}

/// Writes the policy guest's manifest into the fixture (with a `count`
/// mount, bound to `count/`, and the grant widened so the guest may write
/// there while it decides), and returns the agent with the guest enabled
/// as policy `guard` under `config` (TOML lines of the grant's config) and
/// `limits` (a TOML inline table of the grant's limits, or empty).
fn guarded(fx: &Fixture, config: &str, limits: &str) -> Agent {
    crate::plugin_manifest(
        fx.dir.path(),
        "guard",
        "policy",
        guests::POLICY,
        "[mounts.count]\naccess = \"read-write\"\n",
    );
    let _ = std::fs::create_dir(fx.path("count"));
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!("[plugins.guard.grant.limits]\n{limits}\n")
    };
    fx.agent(
        &transcript(),
        &format!(
            "[plugins.guard]\nsource = \"guard.toml\"\n[plugins.guard.grant]\nwidened = true\n[plugins.guard.grant.mounts.count]\ndir = \"count\"\n[plugins.guard.grant.config]\n{config}\n{limits}[policies.guard]\nplugin = \"guard\"\n"
        ),
    )
}

/// How many times the guest was asked (one line per `decide`).
fn asked(fx: &Fixture) -> usize {
    std::fs::read_to_string(fx.path("count/calls"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn decisions(events: &[Event]) -> Vec<&PolicyDecided> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PolicyDecided(d) => Some(d),
            _ => None,
        })
        .collect()
}

fn run_failure(events: &[Event]) -> &RunError {
    match events.last() {
        Some(Event::RunFailed(f)) => &f.error,
        other => panic!("the run did not fail: {other:?}"),
    }
}

#[tokio::test]
async fn a_wasm_policy_denies_a_named_tool_and_every_decision_is_recorded_with_its_receipt() {
    let fx = Fixture::new();
    let agent = guarded(
        &fx,
        "deny_tools = \"hostile__fs\"\nrequire_in_output = \"input.txt\"",
        "",
    );
    for (name, store) in stores(fx.dir.path()) {
        let _ = std::fs::remove_file(fx.path("count/calls"));
        let rt = runtime(Arc::clone(&store)).with_record_prompts(true);
        let run = rt
            .start(&agent, json!("go"), StartOptions::new().id(id("guarded")))
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Completed,
            "{name}"
        );
        // The write never ran.
        assert_eq!(fx.effects(), 0, "{name}");
        let events = rt.events(&run).await.unwrap();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::ToolCallIntent(i) if i.tool.tool == "fs")),
            "{name}"
        );
        let decided = decisions(&events);
        let seen: Vec<(PolicyHook, PolicyVerdict)> =
            decided.iter().map(|d| (d.hook, d.decision)).collect();
        use PolicyHook::*;
        use PolicyVerdict::*;
        assert_eq!(
            seen,
            [
                (RunStart, Allow),
                (AfterResponse, Allow),
                (BeforeToolCall, Allow),
                (AfterResponse, Allow),
                (BeforeToolCall, Deny),
                (AfterResponse, Allow),
                (BeforeFinish, Feedback),
                (AfterResponse, Allow),
                (BeforeFinish, Allow),
            ],
            "{name}"
        );
        assert_eq!(
            decided[4].reason.as_deref(),
            Some("tool `hostile__fs` is not allowed by policy `guard`"),
            "{name}"
        );
        assert_eq!(
            decided[6].reason.as_deref(),
            Some("the answer must mention `input.txt`"),
            "{name}"
        );
        // One lease per decision, each receipted; the guest was asked once
        // per decision.
        for d in &decided {
            let receipt = d.receipt.as_ref().expect("a policy plugin's receipt");
            assert!(receipt.fuel_consumed > 0, "{name}: {receipt:?}");
        }
        assert_eq!(asked(&fx), decided.len(), "{name}");
        // The model saw the denial as the call's result, and the feedback.
        let sent = crate::policies::last_prompt(&events);
        assert!(
            sent.contains(
                "the call was denied by policy `guard`: tool `hostile__fs` is not allowed by policy `guard`"
            ),
            "{name}: {sent}"
        );
        assert!(
            sent.contains("the answer must mention `input.txt`"),
            "{sent}"
        );
        // The policy's fuel counts against the run's budget: the folded
        // usage is at least the sum of the decisions' fuel.
        let policy_fuel: u64 = decided
            .iter()
            .map(|d| d.receipt.as_ref().unwrap().fuel_consumed)
            .sum();
        let state = warden::engine::state::fold(&events).unwrap();
        assert!(state.usage.fuel >= policy_fuel, "{name}");
    }
}

#[tokio::test]
async fn recovery_and_replay_never_ask_a_wasm_policy_again() {
    let fx = Fixture::new();
    let agent = guarded(&fx, "deny_tools = \"hostile__fs\"", "");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(Arc::clone(&store));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("recovered")))
        .await
        .unwrap();
    // Step until the denial is recorded, then "crash" (drop the runtime).
    loop {
        rt.step(&run, &agent).await.unwrap();
        let events = rt.events(&run).await.unwrap();
        if decisions(&events)
            .iter()
            .any(|d| d.decision == PolicyVerdict::Deny)
        {
            break;
        }
    }
    let before = asked(&fx);
    assert_eq!(
        before,
        decisions(&rt.events(&run).await.unwrap()).len(),
        "asked once per recorded decision"
    );
    drop(rt);

    let rt = runtime(Arc::clone(&store));
    let status = rt
        .recover(&run, &agent, ReplayOptions::default())
        .await
        .unwrap();
    assert_eq!(status, RunStatus::Completed);
    let events = rt.events(&run).await.unwrap();
    let recorded = decisions(&events).len();
    assert!(recorded > before);
    assert_eq!(
        asked(&fx),
        recorded,
        "recovery asked only about what came after the crash"
    );

    // Recovering the finished run replays it, checking every decision
    // against the log: nothing is asked and nothing is written.
    let again = runtime(Arc::clone(&store));
    let status = again
        .recover(&run, &agent, ReplayOptions::default())
        .await
        .unwrap();
    assert_eq!(status, RunStatus::Completed);
    assert_eq!(asked(&fx), recorded);
    assert_eq!(again.events(&run).await.unwrap(), events);
}

#[tokio::test]
async fn a_hostile_wasm_policy_fails_its_run_closed_and_the_host_goes_on() {
    let fx = Fixture::new();
    let cases: &[(&str, &str, &str)] = &[
        ("mode = \"loop\"", "fuel = 20_000_000", "out of fuel"),
        (
            "mode = \"loop\"",
            "fuel = \"unmetered\"\ntimeout = \"300ms\"",
            "hit its deadline",
        ),
        ("mode = \"trap\"", "", "the policy plugin failed"),
        (
            "mode = \"error\"",
            "",
            "the policy failed: policy backend unavailable",
        ),
        ("mode = \"huge\"", "output = \"1MiB\"", "output"),
        (
            "mode = \"feedback_everywhere\"",
            "",
            "feedback is only taken before_finish",
        ),
    ];
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    for (i, (config, limits, expected)) in cases.iter().enumerate() {
        let agent = guarded(&fx, config, limits);
        let rt = runtime(Arc::clone(&store));
        let run = rt
            .start(
                &agent,
                json!("go"),
                StartOptions::new().id(id(&format!("hostile-{i}"))),
            )
            .await
            .unwrap();
        assert_eq!(
            rt.drive(&run, &agent).await.unwrap(),
            RunStatus::Failed,
            "{config}"
        );
        let events = rt.events(&run).await.unwrap();
        let decided = decisions(&events);
        assert_eq!(decided.len(), 1, "{config}: the first question failed");
        assert_eq!(decided[0].hook, PolicyHook::RunStart);
        assert_eq!(decided[0].decision, PolicyVerdict::Failed, "{config}");
        let reason = decided[0].reason.clone().unwrap();
        assert!(reason.contains(expected), "{config}: {reason}");
        assert!(decided[0].receipt.is_some(), "{config}: the lease ran");
        assert_eq!(
            run_failure(&events),
            &RunError::PolicyFailed {
                policy: "guard".into(),
                hook: PolicyHook::RunStart,
                message: reason.clone(),
            },
            "{config}"
        );
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::ModelCallIntent(_))),
            "{config}: nothing ran after the failure"
        );
    }
    // The host is fine: a well-behaved policy on the same store completes.
    let agent = guarded(&fx, "", "");
    let rt = runtime(Arc::clone(&store));
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("after")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
}

#[tokio::test]
async fn an_agent_naming_a_plugin_that_is_not_a_policy_is_refused_before_anything_is_recorded() {
    let fx = Fixture::new();
    let agent = fx.agent(&transcript(), "[policies.guard]\nplugin = \"files\"\n");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let err = runtime(Arc::clone(&store))
        .start(&agent, json!("go"), StartOptions::new().id(id("refused")))
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Agent { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "agent `tester`: key `policies.guard.plugin`: plugin `files` (builtin:fs) is not a policy (its kinds: tool)"
    );
    assert!(store.run_ids().await.unwrap().is_empty());
}

/// `warden run` takes an agent whose policy is a plugin (it cannot register
/// native policies), and `warden plugin decide` asks the plugin directly.
#[test]
fn the_command_line_runs_an_agent_guarded_by_a_wasm_policy() {
    let fx = Fixture::new();
    guarded(&fx, "deny_tools = \"hostile__fs\"", "");
    let warden = |args: &[&str]| crate::kill::warden(args, fx.dir.path()).output().unwrap();
    let out = warden(&[
        "run",
        "agent.toml",
        "go",
        "--run-id",
        "cli-guarded",
        "--store",
        "runs.db",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "policy `guard` at before_tool_call (call-2-1): deny: tool `hostile__fs` is not allowed by policy `guard`"
        ),
        "{stdout}"
    );
    assert_eq!(fx.effects(), 0);

    let out = warden(&[
        "plugin",
        "decide",
        "guard.toml",
        "before_tool_call",
        r#"{"call_id": "call-1-1", "tool": "hostile__fs", "arguments": {}}"#,
        "--config",
        "deny_tools=hostile__fs",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["decision"], "deny");
    assert_eq!(
        answer["reason"],
        "tool `hostile__fs` is not allowed by policy `guard`"
    );
    assert!(answer["receipt"]["fuel_consumed"].as_u64().unwrap() > 0);

    let out = warden(&["plugin", "decide", "guard.toml", "whenever"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "`whenever` is not a policy hook (hooks: run_start, after_response, before_tool_call, before_finish)"
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
