//! The first-party plugins (`plugins/http`, `files-context`,
//! `notes-memory`, `jsonl-channel`, `webhook-channel`, `tool-guard`) built
//! from their crates (or embedded, as `builtin:<name>`) and run through
//! `warden::testkit`, as their authors would, under
//! real grants and against the loopback server of `server.rs`. (Each crate
//! also has native unit tests; `plugins/fs` keeps its testkit tests in its
//! own crate as the example for plugin authors.)

use std::path::PathBuf;

use serde_json::{Value, json};
use warden::grant::EffectClass;
use warden::sandbox::{DenialReason, Outcome, PluginKind, wit};
use warden::testkit::TestPlugin;

use crate::server::TestServer;

fn crate_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(name)
}

fn items(
    leased: &warden::sandbox::Leased<Result<Vec<wit::ContextItem>, wit::ContextError>>,
) -> &[wit::ContextItem] {
    match &leased.result {
        Ok(Ok(items)) => items,
        other => panic!("expected items, got {other:?}"),
    }
}

// ------------------------------------------------------------------ http

#[tokio::test]
async fn http_get_returns_status_headers_and_body_and_follows_granted_redirects() {
    let server = TestServer::start().await;
    let http = TestPlugin::build(crate_dir("http"))
        .host(&server.grant())
        .load()
        .await
        .unwrap();
    // A plugin holding a host is a write unless the operator says otherwise.
    assert_eq!(
        http.plugin().tool("http_get").unwrap().effect,
        EffectClass::Write
    );
    assert_eq!(
        http.plugin().tool("http_get").unwrap().claimed_effect,
        EffectClass::Read
    );

    let ok = http
        .call("http_get", json!({ "url": server.url("/echo") }))
        .await;
    let out = ok.output();
    assert_eq!(out["status"], 200);
    assert_eq!(out["headers"]["content-type"], "application/json");
    let echoed: Value = serde_json::from_str(out["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "GET");
    ok.assert_outcome(Outcome::Ok);
    assert_eq!(ok.receipt.network.as_ref().unwrap().requests, 1);

    let missing = http
        .call("http_get", json!({ "url": server.url("/status/404") }))
        .await;
    assert_eq!(missing.output()["status"], 404);

    let hop = server.url("/status/201");
    let redirected = http
        .call(
            "http_get",
            json!({ "url": server.url(&format!("/redirect?to={hop}")) }),
        )
        .await;
    let out = redirected.output();
    assert_eq!(
        (out["status"].as_u64(), out["url"].as_str()),
        (Some(201), Some(hop.as_str()))
    );
    assert_eq!(redirected.receipt.network.as_ref().unwrap().requests, 2);
}

#[tokio::test]
async fn http_redirects_to_a_host_not_granted_are_denied_at_the_hop() {
    let server = TestServer::start().await;
    let http = TestPlugin::build(crate_dir("http"))
        .host(&server.grant())
        .load()
        .await
        .unwrap();
    let other_port = if server.port == 65535 {
        1
    } else {
        server.port + 1
    };
    for (to, host) in [
        (
            "http://example.com/".to_owned(),
            "example.com:80".to_owned(),
        ),
        (
            format!("http://localhost:{}/", server.port),
            format!("localhost:{}", server.port),
        ),
        (
            format!("http://127.0.0.1:{other_port}/"),
            format!("127.0.0.1:{other_port}"),
        ),
    ] {
        let call = http
            .call(
                "http_get",
                json!({ "url": server.url(&format!("/redirect?to={to}")) }),
            )
            .await;
        assert!(call.denied().contains(&host), "{to}: {}", call.denied());
        let network = call.receipt.network.as_ref().unwrap();
        assert_eq!((network.requests, network.denied), (1, 1), "{to}");
    }
    assert_eq!(server.connections(), 3);
}

#[tokio::test]
async fn http_request_is_a_write_with_a_preview_and_reaches_only_granted_hosts() {
    let server = TestServer::start().await;
    let http = TestPlugin::build(crate_dir("http"))
        .host(&server.grant())
        .effect("http_get", EffectClass::Read)
        .load()
        .await
        .unwrap();
    assert_eq!(
        http.plugin().tool("http_get").unwrap().effect,
        EffectClass::Read
    );
    assert_eq!(
        http.plugin().tool("http_request").unwrap().effect,
        EffectClass::Write
    );
    let args = json!({
        "method": "PUT",
        "url": server.url("/echo"),
        "headers": { "content-type": "text/plain" },
        "body": "new value",
    });
    let preview = http.preflight("http_request", args.clone()).await;
    assert_eq!(
        preview.ok().summary,
        format!("PUT {} (9 bytes of body)", server.url("/echo"))
    );
    assert_eq!(server.connections(), 0);
    let put = http.call("http_request", args).await;
    let echoed: Value = serde_json::from_str(put.output()["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        (echoed["method"].as_str(), echoed["body"].as_str()),
        (Some("PUT"), Some("new value"))
    );
    assert_eq!(put.receipt.network.as_ref().unwrap().bytes_out, 9);

    // No grant: denied before anything leaves, whatever the method.
    let bare = TestPlugin::build(crate_dir("http")).load().await.unwrap();
    let call = bare
        .call(
            "http_request",
            json!({ "method": "POST", "url": server.url("/echo"), "body": "x" }),
        )
        .await;
    assert!(call.denied().contains(&server.grant()), "{}", call.denied());
    assert_eq!(
        call.receipt.network.as_ref().unwrap().denials[0].reason,
        DenialReason::NotGranted
    );
    assert_eq!(server.connections(), 1);
}

// --------------------------------------------------------- files-context

#[tokio::test]
async fn files_context_resolves_named_files_and_globs_from_its_mount() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("docs")).unwrap();
    std::fs::write(dir.path().join("README.md"), "# Project\n").unwrap();
    std::fs::write(dir.path().join("docs/guide.md"), "x".repeat(100)).unwrap();
    std::fs::write(dir.path().join("docs/data.csv"), "a,b\n").unwrap();
    let files = TestPlugin::build(crate_dir("files-context"))
        .mount_read_only("files", dir.path())
        .config("paths", "README.md, docs/*.md")
        .config("max_bytes", "10")
        .load()
        .await
        .unwrap();
    assert_eq!(files.plugin().kinds(), [PluginKind::Context]);
    assert_eq!(files.plugin().source_spec().unwrap().name, "files-context");

    let leased = files.resolve(Value::Null).await;
    let got = items(&leased);
    let summary: Vec<(&str, u64, bool)> = got
        .iter()
        .map(|i| (i.source.as_str(), i.size, i.truncated))
        .collect();
    assert_eq!(
        summary,
        [("README.md", 10, false), ("docs/guide.md", 100, true)]
    );
    assert_eq!(got[1].content.len(), 10);
    assert!(got.iter().all(|i| i.modified_ms.is_some()));
    assert_eq!(leased.receipt.outcome, Outcome::Ok);

    let csv = files.resolve(json!({ "paths": ["**/*.csv"] })).await;
    assert_eq!(items(&csv)[0].source, "docs/data.csv");

    let escape = files.resolve(json!({ "paths": ["../outside.md"] })).await;
    assert!(
        matches!(&escape.result, Ok(Err(wit::ContextError::Denied(m))) if m.contains("../outside.md")),
        "{:?}",
        escape.result
    );
}

// ---------------------------------------------------------- notes-memory

#[tokio::test]
async fn notes_memory_remembers_in_one_lease_and_resolves_in_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let notes = TestPlugin::build(crate_dir("notes-memory"))
        .mount("notes", dir.path())
        .load()
        .await
        .unwrap();
    assert_eq!(
        notes.plugin().kinds(),
        [PluginKind::Tool, PluginKind::Context]
    );
    assert_eq!(
        notes.plugin().tool("remember").unwrap().effect,
        EffectClass::Write
    );

    let empty = notes.resolve(Value::Null).await;
    assert!(items(&empty).is_empty());
    let first = notes
        .call(
            "remember",
            json!({ "text": "The user prefers metric units.", "topic": "prefs" }),
        )
        .await;
    let id = first.output()["id"].as_str().unwrap().to_owned();

    let later = notes.resolve(json!({ "topic": "prefs" })).await;
    let got = items(&later);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].content, "The user prefers metric units.");
    assert_eq!(got[0].source, format!("notes/{id} [prefs]"));

    // A fresh plugin over the same directory (a later run) sees it too.
    let again = TestPlugin::build(crate_dir("notes-memory"))
        .mount_read_only("notes", dir.path())
        .load()
        .await
        .unwrap();
    assert_eq!(items(&again.resolve(Value::Null).await).len(), 1);
    // ... but a read-only grant cannot write.
    let refused = again.call("remember", json!({ "text": "more" })).await;
    assert!(
        refused.denied().contains("cannot write note"),
        "{}",
        refused.denied()
    );

    let forgotten = notes.call("forget", json!({ "id": id })).await;
    assert_eq!(forgotten.output()["forgotten"], true);
    assert!(items(&notes.resolve(Value::Null).await).is_empty());
}

// --------------------------------------------------------- jsonl-channel

#[tokio::test]
async fn jsonl_channel_appends_one_line_per_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = TestPlugin::build(crate_dir("jsonl-channel"))
        .mount("outbox", dir.path())
        .config("file", "runs.jsonl")
        .load()
        .await
        .unwrap();
    assert_eq!(jsonl.plugin().channel_spec().unwrap().name, "jsonl-channel");
    for kind in ["completed", "failed"] {
        let leased = jsonl.deliver(kind, json!({ "summary": kind })).await;
        assert_eq!(leased.result.as_ref().unwrap(), &Ok(()));
    }
    let text = std::fs::read_to_string(dir.path().join("runs.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["kind"], "failed");
    assert_eq!(lines[1]["payload"]["summary"], "failed");

    let read_only = TestPlugin::build(crate_dir("jsonl-channel"))
        .mount_read_only("outbox", dir.path())
        .load()
        .await
        .unwrap();
    let leased = read_only.deliver("completed", json!({})).await;
    assert!(
        matches!(&leased.result, Ok(Err(wit::DeliveryError::Denied(_)))),
        "{:?}",
        leased.result
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("runs.jsonl")).unwrap(),
        text
    );
}

// ------------------------------------------------------- webhook-channel

#[tokio::test]
async fn webhook_channel_posts_json_and_reports_status_timeouts_and_denials() {
    let server = TestServer::start().await;
    let hook = |path: &str, timeout_ms: &str| {
        TestPlugin::build(crate_dir("webhook-channel"))
            .host(&server.grant())
            .config("url", &server.url(path))
            .config("timeout_ms", timeout_ms)
            .env("WEBHOOK_TOKEN", "s3cret-token")
            .load()
    };
    let ok = hook("/echo", "2000").await.unwrap();
    let leased = ok.deliver("completed", json!({ "summary": "done" })).await;
    assert_eq!(leased.result.as_ref().unwrap(), &Ok(()));
    let seen = &server.seen()[0];
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.header("idempotency-key"), Some("test-delivery"));
    assert_eq!(seen.header("authorization"), Some("Bearer s3cret-token"));
    let body: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(body["payload"]["summary"], "done");

    let busy = hook("/status/503", "2000").await.unwrap();
    match busy.deliver("completed", json!({})).await.result.unwrap() {
        Err(wit::DeliveryError::Rejected(r)) => {
            assert_eq!(r.status, 503);
            assert!(r.message.contains("status 503"), "{}", r.message);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }

    let slow = hook("/slow", "200").await.unwrap();
    match slow.deliver("completed", json!({})).await.result.unwrap() {
        Err(wit::DeliveryError::Failed(f)) => {
            assert!(f.retryable && f.message.contains("timed out"), "{f:?}")
        }
        other => panic!("expected a retryable failure, got {other:?}"),
    }

    let elsewhere = TestPlugin::build(crate_dir("webhook-channel"))
        .host(&server.grant())
        .config("url", "http://example.com/hook")
        .load()
        .await
        .unwrap();
    match elsewhere
        .deliver("completed", json!({}))
        .await
        .result
        .unwrap()
    {
        Err(wit::DeliveryError::Denied(m)) => assert!(m.contains("example.com:80"), "{m}"),
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(server.connections(), 3);
}

// ------------------------------------------------------------ tool-guard

#[tokio::test]
async fn tool_guard_denies_by_name_effect_and_path_and_fails_closed_on_bad_config() {
    let guard = TestPlugin::source("builtin:tool-guard")
        .config("deny_tools", "fs__delete_*")
        .config("deny_effects", "idempotent")
        .config("deny_paths", "secrets/**")
        .load()
        .await
        .unwrap();
    assert_eq!(guard.plugin().kinds(), [PluginKind::Policy]);
    let ask = |tool: &str, effect: &str, arguments: Value| json!({ "call_id": "call-1-1", "tool": tool, "effect": effect, "arguments": arguments });
    let cases = [
        (
            ask("fs__delete_file", "write", json!({"path": "a.md"})),
            Some("tool `fs__delete_file` is denied by the operator (deny_tools `fs__delete_*`)"),
        ),
        (
            ask("http__put", "idempotent", json!({})),
            Some(
                "tool `http__put` has effect `idempotent`, which the operator denies (deny_effects)",
            ),
        ),
        (
            ask(
                "fs__read_file",
                "read",
                json!({"path": "notes/../secrets/key"}),
            ),
            Some("path `notes/../secrets/key` is denied by the operator (deny_paths `secrets/**`)"),
        ),
        (
            ask("fs__read_file", "read", json!({"path": "notes/a.md"})),
            None,
        ),
    ];
    for (subject, denied) in cases {
        let leased = guard
            .decide(wit::PolicyHook::BeforeToolCall, subject.clone())
            .await;
        assert_eq!(leased.receipt.outcome, Outcome::Ok, "{subject}");
        let expected = match denied {
            Some(reason) => wit::Decision::Deny(reason.into()),
            None => wit::Decision::Allow,
        };
        assert_eq!(leased.result.unwrap().unwrap(), expected, "{subject}");
    }
    // Every other hook is allowed.
    let start = guard
        .decide(wit::PolicyHook::RunStart, json!({"input": "go"}))
        .await;
    assert_eq!(start.result.unwrap().unwrap(), wit::Decision::Allow);

    // A config it cannot read is an error (the host fails the run closed).
    let misconfigured = TestPlugin::source("builtin:tool-guard")
        .config("deny_effects", "wrte")
        .load()
        .await
        .unwrap();
    let leased = misconfigured
        .decide(
            wit::PolicyHook::BeforeToolCall,
            ask("fs__read_file", "read", json!({})),
        )
        .await;
    match leased.result.unwrap() {
        Err(wit::PolicyError::Failed(f)) => assert_eq!(
            f.message,
            "config `deny_effects`: `wrte` is not an effect class (read, idempotent, write)"
        ),
        other => panic!("{other:?}"),
    }
}
