//! Secrets by handle against the loopback server of `server.rs`: the host
//! puts a secret into a request only for the secret's own hosts (redirects
//! included), the plugin's outputs never hold it, and a plugin that reads a
//! secret granted without `reveal` gets a typed denial.

use std::path::PathBuf;

use serde_json::{Value, json};
use warden::grant::{Grant, GrantError};
use warden::plugins::{PluginError, PluginHost};
use warden::sandbox::{SecretAction, SecretUse, wit};
use warden::testkit::TestPlugin;
use warden_tests::guests;

use crate::sandbox;
use crate::server::TestServer;

/// A value no test writes anywhere else, so finding it means a leak.
const VALUE: &str = "sk-canary-7f3a9c1e5b2d";

fn http_crate() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/http")
}

fn uses(receipt: &warden::sandbox::UsageReceipt) -> Vec<(SecretAction, String)> {
    receipt
        .secrets
        .iter()
        .map(|u| (u.action, u.host.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn the_header_arrives_with_the_value_and_the_plugin_never_holds_it() {
    let server = TestServer::start().await;
    let http = TestPlugin::build(http_crate())
        .host(&server.grant())
        .secret("api", VALUE, &[&server.grant()])
        .load()
        .await
        .unwrap();
    let call = http
        .call(
            "http_get",
            json!({
                "url": server.url("/status/200"),
                "auth": {"secret": "api"},
                "headers": {"x-key": "k={{secret:api}};v=2"},
            }),
        )
        .await;
    let out = call.output();
    assert_eq!(out["status"], 200);
    let seen = server.seen();
    assert_eq!(
        seen[0].header("authorization"),
        Some(&*format!("Bearer {VALUE}"))
    );
    assert_eq!(seen[0].header("x-key"), Some(&*format!("k={VALUE};v=2")));
    assert!(!out.to_string().contains(VALUE), "{out}");
    assert_eq!(
        uses(&call.receipt),
        [(SecretAction::Attached, server.grant())]
    );
    assert!(
        !serde_json::to_string(&call.receipt)
            .unwrap()
            .contains(VALUE)
    );

    // Basic auth: the host encodes `user:value`, the plugin only names it.
    let basic = http
        .call(
            "http_request",
            json!({
                "method": "POST",
                "url": server.url("/status/201"),
                "auth": {"secret": "api", "scheme": "basic", "username": "me"},
            }),
        )
        .await;
    assert_eq!(basic.output()["status"], 201);
    use base64::Engine as _;
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("me:{VALUE}"))
    );
    assert_eq!(server.seen()[1].header("authorization"), Some(&*expected));

    // A host that echoes the credential back gets it into the guest; what
    // the plugin returns has it redacted all the same.
    let echoed = http
        .call(
            "http_get",
            json!({ "url": server.url("/echo"), "auth": {"secret": "api"} }),
        )
        .await;
    let text = echoed.output().to_string();
    assert!(!text.contains(VALUE), "{text}");
    assert!(text.contains("[redacted:api]"), "{text}");
    // So is the basic-auth encoding the host made, which the grant could
    // not know.
    let echoed = http
        .call(
            "http_request",
            json!({
                "method": "POST",
                "url": server.url("/echo"),
                "auth": {"secret": "api", "scheme": "basic", "username": "me"},
            }),
        )
        .await;
    let text = echoed.output().to_string();
    let encoded = expected.strip_prefix("Basic ").unwrap();
    assert!(!text.contains(encoded), "{text}");
    assert!(text.contains("Basic [redacted:api]"), "{text}");
}

#[tokio::test]
async fn a_secret_is_withheld_from_any_other_host_redirects_included() {
    let bound = TestServer::start().await;
    let other = TestServer::start().await;
    let http = TestPlugin::build(http_crate())
        .host(&bound.grant())
        .host(&other.grant())
        .secret("api", VALUE, &[&bound.grant()])
        .load()
        .await
        .unwrap();
    // Aimed at the other host directly: the header is removed, the request
    // still goes.
    let direct = http
        .call(
            "http_get",
            json!({ "url": other.url("/status/200"), "headers": {"x-key": "{{secret:api}}", "accept": "*/*"} }),
        )
        .await;
    assert_eq!(direct.output()["status"], 200);
    let seen = other.seen();
    assert_eq!(seen[0].header("x-key"), None);
    assert_eq!(seen[0].header("accept"), Some("*/*"));
    assert_eq!(
        uses(&direct.receipt),
        [(SecretAction::Withheld, other.grant())]
    );

    // Through a redirect: the plugin carries the header on (it is no
    // credential it knows of); the host drops it at the other host.
    let hop = other.url("/status/204");
    let redirected = http
        .call(
            "http_get",
            json!({
                "url": bound.url(&format!("/redirect?to={hop}")),
                "headers": {"x-key": "{{secret:api}}"},
            }),
        )
        .await;
    assert_eq!(redirected.output()["status"], 204);
    assert_eq!(bound.seen()[0].header("x-key"), Some(VALUE));
    let at_other = other.seen();
    assert_eq!(at_other.len(), 2);
    assert_eq!(at_other[1].header("x-key"), None, "{:?}", at_other[1]);
    assert!(
        !at_other
            .iter()
            .any(|s| s.headers.iter().any(|(_, v)| v.contains(VALUE))),
        "{at_other:?}"
    );
    assert_eq!(
        uses(&redirected.receipt),
        [
            (SecretAction::Attached, bound.grant()),
            (SecretAction::Withheld, other.grant())
        ]
    );
}

fn grant(text: &str) -> Grant {
    toml::from_str(text).unwrap()
}

/// The `net` test guest requesting secrets `api` and `open`, granted the
/// loopback server's host, under `grant`.
async fn net_with_secrets(
    dir: &std::path::Path,
    grant_text: &str,
) -> Result<warden::plugins::LoadedPlugin, PluginError> {
    let source = crate::plugin_manifest(
        dir,
        "net",
        "tool",
        guests::NET,
        "hosts = [\"127.0.0.1\"]\nsecrets = [\"api\", \"open\"]\n",
    );
    let host = PluginHost::new(sandbox().clone());
    let env = |k: &str| match k {
        "API" => Some(VALUE.to_owned()),
        "OPEN" => Some("readable-secret-4411".to_owned()),
        _ => None,
    };
    host.load_with_env(&source, &grant(grant_text), dir, env)
        .await
}

fn call(tool: &str, args: Value) -> wit::Call {
    wit::Call {
        id: "call-1".into(),
        run_id: "run-1".into(),
        tool: tool.into(),
        arguments: args.to_string(),
        idempotency_key: "run-1/call-1".into(),
    }
}

#[tokio::test]
async fn reading_a_secret_without_reveal_is_a_typed_denial() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = net_with_secrets(
        dir.path(),
        "hosts = [\"127.0.0.1\"]\n\
         [secrets.api]\nenv = \"API\"\nhosts = [\"127.0.0.1\"]\n\
         [secrets.open]\nenv = \"OPEN\"\nreveal = true\n",
    )
    .await
    .unwrap();
    let denied = plugin
        .invoke(
            &call("secret", json!({"name": "api", "reveal": true})),
            None,
        )
        .await
        .unwrap();
    match &denied.result {
        Ok(Err(wit::ToolError::Denied(m))) => {
            assert!(m.starts_with("reveal-denied: "), "{m}");
            assert!(m.contains("`api`") && m.contains("by handle only"), "{m}");
        }
        other => panic!("expected a reveal denial, got {other:?}"),
    }
    assert!(denied.receipt.secrets.is_empty());

    // A handle is no value.
    let handle = plugin
        .invoke(&call("secret", json!({"name": "api"})), None)
        .await
        .unwrap();
    let Ok(Ok(out)) = &handle.result else {
        panic!("{:?}", handle.result)
    };
    assert!(out.content.contains("warden-secret-"), "{}", out.content);
    assert!(!out.content.contains(VALUE), "{}", out.content);

    // Revealed: the guest reads it, the host records that, and what the
    // plugin returns has the value redacted.
    let revealed = plugin
        .invoke(
            &call("secret", json!({"name": "open", "reveal": true})),
            None,
        )
        .await
        .unwrap();
    let Ok(Ok(out)) = &revealed.result else {
        panic!("{:?}", revealed.result)
    };
    assert_eq!(out.content, r#"{"value":"[redacted:open]"}"#);
    assert_eq!(
        revealed.receipt.secrets,
        [SecretUse {
            name: "open".into(),
            version: None,
            action: SecretAction::Revealed,
            host: None,
        }]
    );
    let unknown = plugin
        .invoke(&call("secret", json!({"name": "nope"})), None)
        .await
        .unwrap();
    assert!(
        matches!(&unknown.result, Ok(Err(wit::ToolError::Denied(m))) if m.starts_with("not-granted: ")),
        "{:?}",
        unknown.result
    );
}

#[tokio::test]
async fn a_secret_grant_is_checked_against_the_request_and_the_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let err = net_with_secrets(dir.path(), "[secrets.other]\nenv = \"API\"\n")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::Grant(GrantError::UnrequestedSecret { secret, .. }) if secret == "other"),
        "{err}"
    );
    let err = net_with_secrets(
        dir.path(),
        "hosts = [\"127.0.0.1\"]\n[secrets.api]\nenv = \"API\"\nhosts = [\"api.example.com\"]\n",
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("secrets.api.hosts[0]")
            && err.to_string().contains("not among the grant's `hosts`"),
        "{err}"
    );
    let err = net_with_secrets(dir.path(), "[secrets.api]\nenv = \"MISSING\"\n")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::Grant(GrantError::SecretUnavailable { .. })
        ) && err.to_string().contains("`MISSING` is not set"),
        "{err}"
    );
    assert_eq!(err.code(), "secret_unavailable");
}
