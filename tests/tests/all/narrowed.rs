//! Calls ahead of an effect run under the narrowed grant: a tool's
//! preflight (asked before the human approves), and by default a context
//! source's resolve and a policy's decide, see their mounts read-only and
//! reach no host, so nothing a plugin does before approval can be the
//! effect itself. The `net` guest's `plant` tool tries a write and a
//! request in its preflight; the `context` and `policy` guests write in
//! their mounts when they resolve and decide.

use std::sync::Arc;
use warden::engine::StartOptions;

use serde_json::{Value, json};
use warden::engine::RunStatus;
use warden::engine::events::Event;
use warden::grant::{Grant, GrantError};
use warden::plugins::{PluginError, PluginHost};
use warden::sandbox::{DenialReason, Outcome, wit};
use warden::store::MemoryStore;
use warden_tests::guests;

use crate::engine::{Fixture, id, runtime};
use crate::server::TestServer;
use crate::{plugin_manifest as manifest, sandbox};

fn grant(text: &str) -> Grant {
    toml::from_str(text).unwrap()
}

#[tokio::test]
async fn a_preflight_cannot_write_or_reach_a_host_and_the_approval_prompt_still_shows() {
    let server = TestServer::start().await;
    let fx = Fixture::new();
    manifest(
        fx.dir.path(),
        "net",
        "tool",
        guests::NET,
        "hosts = [\"127.0.0.1\"]\n[mounts.workspace]\naccess = \"read-write\"\n",
    );
    let turns = format!(
        r#"
[[turns]]
text = "Planting."
[[turns.tool_calls]]
name = "net__plant"
arguments = {{ path = "/workspace/planted.txt", url = "{}" }}

[[turns]]
text = "Done."
"#,
        server.url("/status/200")
    );
    let agent = fx.agent(
        &turns,
        &format!(
            "[plugins.net]\nsource = \"net.toml\"\n[plugins.net.grant]\nhosts = [\"{}\"]\n[plugins.net.grant.mounts.workspace]\ndir = \"work\"\n",
            server.grant()
        ),
    );
    let planted = fx.path("work/planted.txt");
    let rt = runtime(Arc::new(MemoryStore::new()));

    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("denied")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval,
        "the approval prompt still shows"
    );
    let events = rt.events(&run).await.unwrap();
    let asked = match events.last().unwrap() {
        Event::ApprovalRequested(a) => a.clone(),
        other => panic!("{other:?}"),
    };
    let preview = asked.preview.expect("the preflight answered");
    assert_eq!(preview.summary, "harmless preview");
    let tried: Value = serde_json::from_str(&preview.detail).unwrap();
    assert_ne!(tried["write"], "ok", "{tried}");
    assert_ne!(tried["request"], "ok", "{tried}");
    assert!(!planted.exists(), "the preflight's write was refused");
    assert_eq!(
        server.connections(),
        0,
        "the preflight's request never left"
    );
    let network = asked.receipt.unwrap().network.expect("a request was tried");
    assert_eq!(network.requests, 0);
    assert_eq!(network.denials[0].reason, DenialReason::NotGranted);

    rt.deny(&run, &asked.call_id, "bob", "no").await.unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert!(!planted.exists(), "nothing was planted by the denied call");
    assert_eq!(server.connections(), 0);

    // The same call, approved, runs with the whole grant: the guest really
    // does what its preflight could not.
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("approved")))
        .await
        .unwrap();
    assert_eq!(
        rt.drive(&run, &agent).await.unwrap(),
        RunStatus::AwaitingApproval
    );
    let call_id = match rt.events(&run).await.unwrap().last().unwrap() {
        Event::ApprovalRequested(a) => a.call_id.clone(),
        other => panic!("{other:?}"),
    };
    assert!(!planted.exists());
    rt.approve(&run, &call_id, "alice").await.unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "planted");
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn context_sources_and_policies_run_narrowed_unless_their_grant_widens_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("state")).unwrap();
    let host = PluginHost::new(sandbox().clone());
    let context = manifest(
        dir.path(),
        "counter",
        "context",
        guests::CONTEXT,
        "[mounts.state]\naccess = \"read-write\"\n",
    );
    let policy = manifest(
        dir.path(),
        "guard",
        "policy",
        guests::POLICY,
        "[mounts.count]\naccess = \"read-write\"\n",
    );
    let request = wit::ContextRequest {
        run_id: "run-1".into(),
        query:
            json!({ "count": "/state/resolves.log", "items": [{ "source": "a", "content": "x" }] })
                .to_string(),
    };
    let decision = wit::PolicyRequest {
        run_id: "run-1".into(),
        agent: "agent".into(),
        policy: "guard".into(),
        hook: wit::PolicyHook::RunStart,
        subject: json!({ "hook": "run_start", "input": "hi", "session": "s-1" }).to_string(),
    };
    let counted = dir.path().join("state/resolves.log");
    let calls = dir.path().join("state/calls");

    // By default: the source's and the policy's writes are refused.
    let narrowed = host
        .load(
            &context,
            &grant("[mounts.state]\ndir = \"state\"\n"),
            dir.path(),
        )
        .await
        .unwrap();
    assert!(!narrowed.granted().is_widened());
    let leased = narrowed.resolve(&request, None).await.unwrap();
    assert!(matches!(leased.result, Ok(Err(_))), "{:?}", leased.result);
    assert!(!counted.exists());
    let guard = host
        .load(
            &policy,
            &grant("[mounts.count]\ndir = \"state\"\n"),
            dir.path(),
        )
        .await
        .unwrap();
    let leased = guard.decide(&decision, None).await.unwrap();
    match leased.result {
        Ok(Err(wit::PolicyError::Failed(f))) => {
            assert!(f.message.starts_with("count in /count/calls"), "{f:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!calls.exists());

    // Widened by the operator: they run with the whole grant.
    let widened = host
        .load(
            &context,
            &grant("widened = true\n[mounts.state]\ndir = \"state\"\n"),
            dir.path(),
        )
        .await
        .unwrap();
    let leased = widened.resolve(&request, None).await.unwrap();
    assert_eq!(leased.receipt.outcome, Outcome::Ok, "{:?}", leased.result);
    assert_eq!(std::fs::read_to_string(&counted).unwrap(), "run-1\n");
    let guard = host
        .load(
            &policy,
            &grant("widened = true\n[mounts.count]\ndir = \"state\"\n"),
            dir.path(),
        )
        .await
        .unwrap();
    let leased = guard.decide(&decision, None).await.unwrap();
    assert_eq!(leased.result.unwrap(), Ok(wit::Decision::Allow));
    assert!(calls.exists());

    // A tool cannot be widened: its preflight never is.
    let tool = manifest(dir.path(), "noop", "tool", guests::HOSTILE, "");
    match host
        .load(&tool, &grant("widened = true\n"), dir.path())
        .await
    {
        Err(PluginError::Grant(GrantError::Invalid { key, .. })) => assert_eq!(key, "widened"),
        other => panic!("{other:?}"),
    }
}

/// A tool whose effect the grant forbids (a write on a read-only mount) is
/// not offered to the model; called by name anyway, it is refused as an
/// unknown tool before any approval is asked, and nothing is written.
#[tokio::test]
async fn a_write_tool_on_a_read_only_mount_is_not_offered_and_never_asks_for_approval() {
    let fx = Fixture::new();
    let turns = r#"
[[turns]]
text = "Overwriting."
[[turns.tool_calls]]
name = "files__write_file"
arguments = { path = "input.txt", content = "overwritten" }

[[turns]]
text = "Done."
"#;
    let agent = fx.agent(turns, "");
    let rt = runtime(Arc::new(MemoryStore::new())).with_record_prompts(true);
    let run = rt
        .start(&agent, json!("go"), StartOptions::new().id(id("read-only")))
        .await
        .unwrap();
    assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    let events = rt.events(&run).await.unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ApprovalRequested(_))),
        "no approval was asked"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ToolCallRejected(_))),
        "the call was refused"
    );
    let offered: Vec<String> = events
        .iter()
        .find_map(|e| match e {
            Event::ModelCallIntent(i) => i.request.as_ref(),
            _ => None,
        })
        .expect("the prompt is recorded")
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert!(
        offered.contains(&"files__read_file".to_owned()),
        "{offered:?}"
    );
    assert!(
        !offered
            .iter()
            .any(|t| t == "files__write_file" || t == "files__edit_file"),
        "{offered:?}"
    );
    assert_eq!(
        std::fs::read_to_string(fx.path("work/input.txt")).unwrap(),
        "the input file\n"
    );
}
