//! `warden serve` as people use it: the real binary on loopback over SQLite
//! and PostgreSQL, with a real `warden worker` driving the quick start's
//! demo run. The server refuses to start without credentials or on a
//! non-loopback address without TLS; a request without a token, with a
//! viewer's token for an approval, naming another Host or coming from
//! another Origin is refused with the documented code; a live stream
//! resumed with `Last-Event-ID` sends exactly the events after it; an
//! approval made through the API records `api:<token name>` and is picked
//! up by the worker, which completes the run.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::binary::warden_binary;
use crate::workers::PgSchema;

pub(crate) fn warden(dir: &Path, store: &str) -> Command {
    let mut command = Command::new(warden_binary());
    command
        .current_dir(dir)
        .env("WARDEN_STORE", store)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_TOKENS")
        .stdin(Stdio::null());
    command
}

/// A token made by `warden serve tokens add`.
pub(crate) fn add_token(dir: &Path, name: &str, role: &str) -> String {
    let out = warden(dir, "unused.db")
        .args(["serve", "tokens", "add", name, "--role", role])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A child process killed on drop.
pub(crate) struct Killed(Child);

impl Killed {
    /// `child`, killed on drop.
    pub(crate) fn new(child: Child) -> Killed {
        Killed(child)
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `warden serve` on an ephemeral loopback port, and that port.
pub(crate) fn start_server(dir: &Path, store: &str) -> (Killed, String) {
    start_server_with(dir, store, &[])
}

/// The same with more flags.
pub(crate) fn start_server_with(dir: &Path, store: &str, flags: &[&str]) -> (Killed, String) {
    let mut child = warden(dir, store)
        .args(["--json", "serve", "--bind", "127.0.0.1:0", "--poll", "50ms"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child = Killed(child);
    let listening: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        panic!(
            "no listening line ({e}): {line:?}\n{}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        )
    });
    let url = listening["listening"]
        .as_str()
        .unwrap_or_else(|| panic!("{line}"));
    (child, url.trim_start_matches("http://").to_owned())
}

/// One HTTP/1.1 request; the status and the JSON body.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    (status, json)
}

/// Sends `head` for a POST whose 2-byte body has not been sent yet, reads
/// the refusal, then sends the body and a second request on the same
/// connection, as a client's connection pool would. A server that answers
/// before reading a body must either say the connection closes or go on
/// serving it; otherwise the pool reuses a socket the server has closed
/// and the client's next request fails (seen as `httpcore.ReadError` from
/// the MCP Python SDK under load). Returns the refusal's status and
/// whether the contract held.
pub(crate) fn refusal_leaves_a_usable_or_closed_connection(addr: &str, head: &str) -> (u16, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
        .write_all(
            format!("{head}Content-Type: application/json\r\nContent-Length: 2\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let first = read_response(&mut stream).expect("the refusal");
    let status: u16 = first.split(' ').nth(1).unwrap().parse().unwrap();
    let says_close = first
        .lines()
        .any(|line| line.eq_ignore_ascii_case("connection: close"));
    if says_close {
        return (status, true);
    }
    let second =
        format!("{{}}{head}Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}");
    let answered =
        stream.write_all(second.as_bytes()).is_ok() && read_response(&mut stream).is_some();
    (status, answered)
}

/// One response's head from `stream` (its body, by Content-Length, read
/// and dropped); `None` when the connection ends first.
fn read_response(stream: &mut TcpStream) -> Option<String> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => raw.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8(raw).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    Some(head)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Waits until `check` returns a value, or fails naming `what`.
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The quick start's demo (agent, transcript, notes folder, outbox) in a
/// fresh directory.
pub(crate) fn demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for file in ["notes.toml", "notes.transcript.toml"] {
        std::fs::copy(examples.join(file), dir.path().join(file)).unwrap();
    }
    for sub in ["notes", "out"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    for entry in std::fs::read_dir(examples.join("notes")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dir.path().join("notes").join(entry.file_name()),
        )
        .unwrap();
    }
    dir
}

/// Reads server-sent events from a live stream until `count` events came.
fn read_events(
    addr: &str,
    path: &str,
    token: &str,
    last_id: u64,
    count: usize,
) -> Vec<(u64, Value)> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\nLast-Event-ID: {last_id}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut events = Vec::new();
    let mut id = None;
    let mut line = String::new();
    while events.len() < count {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
        let line = line.trim_end();
        if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.parse::<u64>().unwrap());
        } else if let Some(data) = line.strip_prefix("data: ") {
            events.push((id.take().unwrap(), serde_json::from_str(data).unwrap()));
        }
    }
    events
}

/// The whole flow over the store at `store`.
fn approve_through_the_api(store: &str) {
    let demo = demo();
    let dir = demo.path();
    let alice = add_token(dir, "alice", "approver");
    let viewer = add_token(dir, "vic", "viewer");
    let out = warden(dir, store)
        .args(["submit", "notes.toml", "--run-id", "demo-1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _worker = Killed(
        warden(dir, store)
            .args(["worker", "--poll", "50ms", "--claim-ttl", "5s"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let (_server, addr) = start_server(dir, store);
    let auth = bearer(&viewer);
    let viewing = [("Authorization", auth.as_str())];

    // The worker parks the run on its write; the API lists it.
    let call = wait_for("the run to await approval", || {
        let (status, body) = request(
            &addr,
            "GET",
            "/api/v1/runs?status=awaiting_approval&agent=notes",
            &viewing,
            None,
        );
        assert_eq!(status, 200, "{body}");
        let runs = body["runs"].as_array().unwrap();
        if runs.is_empty() {
            return None;
        }
        let (status, shown) = request(&addr, "GET", "/api/v1/runs/demo-1", &viewing, None);
        assert_eq!(status, 200, "{shown}");
        assert_eq!(shown["status"], "awaiting_approval");
        assert_eq!(shown["pending"]["tool"], "fs__write_file");
        assert_eq!(shown["pending"]["arguments"]["path"], "SUMMARY.md");
        assert!(
            shown["budget"]["steps"]["used"].as_u64().unwrap() >= 1,
            "{shown}"
        );
        assert!(!shown["receipts"].as_array().unwrap().is_empty(), "{shown}");
        let digest = shown["pending"]["digest"].as_str().unwrap().to_owned();
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{shown}"
        );
        Some((
            shown["pending"]["call_id"].as_str().unwrap().to_owned(),
            digest,
        ))
    });
    let (call, digest) = call;
    // The approval names the digest the approver saw.
    let approval = json!({ "call_id": call, "digest": digest });

    // Refusals, each with its code and nothing recorded.
    let (status, body) = request(&addr, "GET", "/api/v1/runs", &[], None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthenticated")),
        "{body}"
    );
    assert_eq!(body["v"], 1);
    let (status, body) = request(
        &addr,
        "GET",
        "/api/v1/runs",
        &[("Authorization", "Bearer wdn_not-a-token")],
        None,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthenticated"))
    );
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &viewing,
        Some(&approval),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    assert_eq!(body["error"]["details"]["needed"], "approver");
    let auth_alice = bearer(&alice);
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &[
            ("Authorization", auth_alice.as_str()),
            ("Host", "attacker.example:80"),
        ],
        Some(&approval),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("host_refused")),
        "{body}"
    );
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &[
            ("Authorization", auth_alice.as_str()),
            ("Origin", "http://attacker.example"),
        ],
        Some(&approval),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("origin_refused")),
        "{body}"
    );
    let (status, body) = request(&addr, "GET", "/api/v1/runs/nope", &viewing, None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_run")),
        "{body}"
    );
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &[("Authorization", auth_alice.as_str())],
        Some(&json!({ "call_id": "call-9-9" })),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_awaiting_approval")),
        "{body}"
    );
    // A digest other than the call's approves nothing.
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &[("Authorization", auth_alice.as_str())],
        Some(&json!({ "call_id": call, "digest": "0".repeat(64) })),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("digest_mismatch")),
        "{body}"
    );
    assert_eq!(body["error"]["details"]["actual"], digest.as_str());

    // A live stream resumed after the events so far gets exactly the ones
    // after them, starting with the approval.
    let (_, before) = request(&addr, "GET", "/api/v1/runs/demo-1/events", &viewing, None);
    let seen = before["events"].as_array().unwrap().len() as u64;
    let stream_addr = addr.clone();
    let stream_token = viewer.clone();
    let streamed = std::thread::spawn(move || {
        read_events(
            &stream_addr,
            "/api/v1/runs/demo-1/stream",
            &stream_token,
            seen,
            2,
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &[("Authorization", auth_alice.as_str())],
        Some(&approval),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["v"], 1);
    let streamed = streamed.join().unwrap();
    assert_eq!(streamed[0].0, seen + 1);
    assert_eq!(streamed[1].0, seen + 2);
    assert_eq!(streamed[0].1["seq"], seen + 1);
    assert_eq!(streamed[0].1["event"]["type"], "approval_granted");
    assert_eq!(streamed[0].1["event"]["by"], "api:alice");

    // The worker picks the approval up and completes the run.
    let done = wait_for("the run to complete", || {
        let (_, shown) = request(&addr, "GET", "/api/v1/runs/demo-1", &viewing, None);
        (shown["status"] == "completed").then_some(shown)
    });
    assert!(
        done["output"].as_str().unwrap().contains("SUMMARY.md"),
        "{done}"
    );
    assert!(dir.join("notes/SUMMARY.md").is_file());
    let grants: Vec<&Value> = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["type"] == "approval_granted")
        .collect();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["event"]["by"], "api:alice");
    assert_eq!(grants[0]["event"]["digest"], digest.as_str());
    // A second approval of the same call is refused: it was consumed.
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/demo-1/approve",
        &[("Authorization", auth_alice.as_str())],
        Some(&approval),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("run_terminal")),
        "{body}"
    );
}

#[test]
fn an_approval_through_the_api_is_picked_up_by_a_worker_on_sqlite() {
    approve_through_the_api("serve.db");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_through_the_api_is_picked_up_by_a_worker_on_postgres() {
    let Some(pg) = PgSchema::new("serve").await else {
        return;
    };
    let url = pg.url.clone();
    tokio::task::spawn_blocking(move || approve_through_the_api(&url))
        .await
        .unwrap();
}

#[test]
fn a_refusal_never_leaves_a_closed_connection_for_a_client_to_reuse() {
    let demo = demo();
    add_token(demo.path(), "ops", "operator");
    // A run, so the store exists.
    let out = warden(demo.path(), "serve.db")
        .args(["submit", "notes.toml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (_server, addr) = start_server(demo.path(), "serve.db");
    for (what, extra) in [
        ("no token", String::new()),
        (
            "a wrong token",
            "Authorization: Bearer wdn_not-a-token\r\n".to_owned(),
        ),
        (
            "another origin",
            "Origin: http://evil.example\r\n".to_owned(),
        ),
    ] {
        let head = format!("POST /api/v1/runs HTTP/1.1\r\nHost: {addr}\r\n{extra}");
        let (status, held) = refusal_leaves_a_usable_or_closed_connection(&addr, &head);
        assert!((400..500).contains(&status), "{what}: {status}");
        assert!(
            held,
            "{what}: refused with {status}, then the connection closed without saying so"
        );
    }
}

#[test]
fn the_server_refuses_to_start_without_credentials_or_tls_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let out = warden(dir, "serve.db")
        .args(["--json", "serve", "--bind", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["error"]["code"], "no_credentials", "{body}");
    std::fs::write(dir.join("empty.toml"), "").unwrap();
    let out = warden(dir, "serve.db")
        .args(["--json", "serve", "--tokens", "empty.toml"])
        .output()
        .unwrap();
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["error"]["code"], "no_credentials", "{body}");

    add_token(dir, "ops", "operator");
    let out = warden(dir, "serve.db")
        .args(["--json", "serve", "--bind", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["error"]["code"], "tls_required", "{body}");
    // The token file keeps digests only, and names each token's role.
    let file = std::fs::read_to_string(dir.join(".warden/tokens.toml")).unwrap();
    assert!(
        file.contains("role = \"operator\"") && file.contains("sha256"),
        "{file}"
    );
    assert!(!file.contains("wdn_"), "{file}");
}

#[test]
fn a_run_no_worker_holds_is_continued_by_the_server_after_a_denial() {
    let demo = demo();
    let dir = demo.path();
    let token = add_token(dir, "bob", "approver");
    // Without a terminal the run parks on its write and the command exits 4.
    let out = warden(dir, "serve.db")
        .args([
            "run",
            "notes.toml",
            "Summarise my notes",
            "--run-id",
            "mine",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_server, addr) = start_server(dir, "serve.db");
    let auth = bearer(&token);
    let headers = [("Authorization", auth.as_str())];
    let (_, shown) = request(&addr, "GET", "/api/v1/runs/mine", &headers, None);
    let call = shown["pending"]["call_id"].as_str().unwrap().to_owned();
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/mine/deny",
        &headers,
        Some(&json!({ "call_id": call, "reason": "not today" })),
    );
    assert_eq!(status, 200, "{body}");
    let done = wait_for("the server to finish the run", || {
        let (_, shown) = request(&addr, "GET", "/api/v1/runs/mine", &headers, None);
        (shown["status"] == "completed").then_some(shown)
    });
    assert!(
        done["output"].as_str().unwrap().contains("did not write"),
        "{done}"
    );
    assert!(!dir.join("notes/SUMMARY.md").exists());
    let denial = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["type"] == "approval_denied")
        .unwrap();
    assert_eq!(denial["event"]["by"], "api:bob");
    assert_eq!(denial["event"]["reason"], "not today");
}

/// Standing rules through the API: only an operator creates or revokes
/// one (a viewer lists them), an expired token is refused; a rule approves
/// the demo's write for the worker, the grant naming the rule and its
/// creator; once revoked, the next run's write waits for a human.
#[test]
fn standing_rules_through_the_api_need_an_operator_and_reach_the_worker() {
    let demo = demo();
    let dir = demo.path();
    let store = "rules.db";
    let viewer = bearer(&add_token(dir, "vic", "viewer"));
    let approver = bearer(&add_token(dir, "alice", "approver"));
    let operator = bearer(&add_token(dir, "ops", "operator"));
    let out = warden(dir, "unused.db")
        .args([
            "serve",
            "tokens",
            "add",
            "old",
            "--role",
            "operator",
            "--expires",
            "1ms",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expired = bearer(String::from_utf8(out.stdout).unwrap().trim());
    std::thread::sleep(Duration::from_millis(20));
    // The run is recorded first (that makes the store); no worker drives
    // it before the rule exists.
    let submit = |run: &str| {
        let out = warden(dir, store)
            .args(["submit", "notes.toml", "--run-id", run])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    submit("ruled");
    let (_server, addr) = start_server(dir, store);
    let rules = "/api/v1/approvals/rules";

    let (status, body) = request(&addr, "GET", rules, &[("Authorization", &expired)], None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("token_expired")),
        "{body}"
    );
    let rule = json!({ "tool": "fs__write_file", "arguments": { "path": "SUMMARY.md" } });
    for who in [&viewer, &approver] {
        let (status, body) = request(&addr, "POST", rules, &[("Authorization", who)], Some(&rule));
        assert_eq!(
            (
                status,
                body["error"]["code"].as_str(),
                body["error"]["details"]["needed"].as_str()
            ),
            (403, Some("forbidden"), Some("operator")),
            "{body}"
        );
    }
    let (status, body) = request(
        &addr,
        "POST",
        rules,
        &[("Authorization", &operator)],
        Some(&json!({})),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("rule_invalid")),
        "a rule naming nothing approves too much: {body}"
    );
    // An empty name matches no call: refused, naming the field, not
    // stored as a rule that approves nothing.
    for (empty, field) in [
        (json!({ "plugin": "" }), "plugin"),
        (json!({ "plugin": "fs", "tool": "" }), "tool"),
    ] {
        let (status, body) = request(
            &addr,
            "POST",
            rules,
            &[("Authorization", &operator)],
            Some(&empty),
        );
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("rule_invalid")),
            "{empty}: {body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("`{field}` is empty")),
            "{body}"
        );
    }
    let (status, body) = request(
        &addr,
        "POST",
        rules,
        &[("Authorization", &operator)],
        Some(&rule),
    );
    assert_eq!(status, 200, "{body}");
    let id = body["rule"]["id"].as_str().unwrap().to_owned();
    assert_eq!(body["rule"]["created_by"], "api:ops");
    assert_eq!(body["rule"]["standing"], "live");
    let (status, listed) = request(&addr, "GET", rules, &[("Authorization", &viewer)], None);
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["rules"][0]["id"], id.as_str());

    // The worker's run is approved by the rule, recorded as such.
    let _worker = Killed(
        warden(dir, store)
            .args(["worker", "--poll", "50ms", "--claim-ttl", "5s"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let done = wait_for("the ruled run to complete", || {
        let (_, shown) = request(
            &addr,
            "GET",
            "/api/v1/runs/ruled",
            &[("Authorization", &viewer)],
            None,
        );
        (shown["status"] == "completed").then_some(shown)
    });
    let grant = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["type"] == "approval_granted")
        .unwrap()["event"]
        .clone();
    assert_eq!(grant["by"], format!("rule:{id}"));
    assert_eq!(grant["rule"], json!({ "id": id, "created_by": "api:ops" }));

    // Revoked (by an operator only), it approves nothing more.
    let revoke = format!("{rules}/{id}/revoke");
    let (status, _) = request(
        &addr,
        "POST",
        &revoke,
        &[("Authorization", &approver)],
        Some(&json!({})),
    );
    assert_eq!(status, 403);
    let (status, body) = request(
        &addr,
        "POST",
        &revoke,
        &[("Authorization", &operator)],
        Some(&json!({})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rule"]["standing"], "revoked");
    assert_eq!(body["rule"]["revoked"]["by"], "api:ops");
    let (status, body) = request(
        &addr,
        "POST",
        &format!("{rules}/rule-nope/revoke"),
        &[("Authorization", &operator)],
        Some(&json!({})),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_rule")),
        "{body}"
    );
    submit("after");
    let parked = wait_for("the next run to wait for a human", || {
        let (_, shown) = request(
            &addr,
            "GET",
            "/api/v1/runs/after",
            &[("Authorization", &viewer)],
            None,
        );
        (shown["status"] == "awaiting_approval").then_some(shown)
    });
    // Approving for the whole run is a rule: an approver may not.
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/after/approve",
        &[("Authorization", &approver)],
        Some(&json!({ "call_id": parked["pending"]["call_id"], "scope": "run" })),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
}

/// schemathesis (PyPI, pinned and installed by `.ci/run`) checks the
/// served OpenAPI document against the real server: every response of
/// every operation has a documented status, content type and shape, no
/// request makes a server error, valid requests are not refused as
/// malformed nor malformed ones accepted, and the API refuses requests
/// without its token. Bounded: a few examples per operation, one seed.
#[test]
fn the_api_keeps_its_openapi_contract_under_schemathesis() {
    let demo = demo();
    let dir = demo.path();
    let token = add_token(dir, "contract", "operator");
    let out = warden(dir, "serve.db")
        .args(["submit", "notes.toml", "--run-id", "queued-1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // schemathesis checks that bad tokens are refused: many failed logins.
    // A served agent: the documented example starts a real run of it.
    let (_server, addr) = start_server_with(
        dir,
        "serve.db",
        &[
            "--failed-logins-per-minute",
            "100000",
            "--agent",
            "notes.toml",
        ],
    );
    let out = Command::new("schemathesis")
        .current_dir(dir)
        .args([
            "run",
            &format!("http://{addr}/api/v1/openapi.json"),
            "--header",
            &format!("Authorization: Bearer {token}"),
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection,ignored_auth",
            // A live stream never ends: schemathesis cannot read it whole.
            "--exclude-operation-id",
            "streamRun",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            "8",
            "--seed",
            "1",
            "--workers",
            "2",
            "--suppress-health-check",
            "all",
        ])
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run schemathesis ({e}): install it (`.ci/run` pins the version)")
        });
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The planner example run by `warden run`, then seen through the API:
/// the planner's children with their statuses, and a child's parent.
#[test]
fn the_api_shows_a_runs_children_and_a_childs_parent() {
    let demo = demo();
    let dir = demo.path();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for name in ["planner", "reader", "writer"] {
        for file in [format!("{name}.toml"), format!("{name}.transcript.toml")] {
            std::fs::copy(examples.join(&file), dir.join(&file)).unwrap();
        }
    }
    let token = add_token(dir, "vera", "viewer");
    let out = warden(dir, "serve.db")
        .args(["run", "planner.toml", "Plan the week", "--run-id", "plan-1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_server, addr) = start_server(dir, "serve.db");
    let auth = bearer(&token);
    let headers = [("Authorization", auth.as_str())];
    let (status, shown) = request(&addr, "GET", "/api/v1/runs/plan-1", &headers, None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["parent"], Value::Null);
    let children = shown["children"].as_array().unwrap();
    let got: Vec<(&str, &str, &str)> = children
        .iter()
        .map(|c| {
            (
                c["run_id"].as_str().unwrap(),
                c["agent"].as_str().unwrap(),
                c["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("plan-1.call-1-1", "reader", "completed"),
            ("plan-1.call-2-1", "writer", "completed"),
        ]
    );
    let (_, child) = request(&addr, "GET", "/api/v1/runs/plan-1.call-1-1", &headers, None);
    assert_eq!(child["parent"]["run_id"], "plan-1");
    assert_eq!(child["parent"]["call_id"], "call-1-1");
    assert_eq!(child["children"], json!([]));
}

/// Runs started, submitted and forked through the API: only an operator
/// may, only of an agent the server was started with (`--agent`), named by
/// its name, never by a path; a started run is driven by the server and
/// labelled with who started it; a submitted one waits for workers; a fork
/// reuses the source's effects (no model or tool call made again before
/// its own approval) and, approved, completes. The inbox lists every run
/// waiting for a person in one request; the plugins view shows the grants
/// without config values.
fn start_submit_and_fork_through_the_api(store: &str) {
    let demo = demo();
    let dir = demo.path();
    let operator = bearer(&add_token(dir, "olga", "operator"));
    let approver = bearer(&add_token(dir, "ann", "approver"));
    let migrated = warden(dir, store)
        .args(["store", "migrate"])
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let (_server, addr) = start_server_with(dir, store, &["--agent", "notes.toml"]);
    let ops = [("Authorization", operator.as_str())];
    let appr = [("Authorization", approver.as_str())];

    let (status, agents) = request(&addr, "GET", "/api/v1/agents", &appr, None);
    assert_eq!(status, 200, "{agents}");
    assert_eq!(agents["agents"].as_array().unwrap().len(), 1, "{agents}");
    assert_eq!(agents["agents"][0]["name"], "notes");
    assert_eq!(
        agents["agents"][0]["plugins"],
        json!(["fs", "notes-files", "outbox"])
    );
    let (status, plugins) = request(&addr, "GET", "/api/v1/plugins", &appr, None);
    assert_eq!(status, 200, "{plugins}");
    let fs = &plugins["plugins"][0];
    assert_eq!(
        (fs["agent"].as_str(), fs["key"].as_str()),
        (Some("notes"), Some("fs")),
        "{plugins}"
    );
    assert_eq!(fs["source"], "builtin:fs");
    let mount = fs["grant"]["mounts"]["workspace"]["dir"].as_str().unwrap();
    assert!(mount.ends_with("notes"), "{plugins}");
    assert_eq!(fs["grant"]["env"], json!([]));
    let outbox = &plugins["plugins"][2];
    assert_eq!(outbox["key"], "outbox");
    assert_eq!(outbox["grant"]["config_keys"], json!(["file"]));
    assert!(
        !plugins.to_string().contains("deliveries.jsonl"),
        "config values are not shown (they may be secrets): {plugins}"
    );

    // Refusals: the role, and agents the server does not serve, whatever
    // the request names.
    let start = json!({ "agent": "notes", "input": "Summarise my notes", "run_id": "started" });
    let (status, body) = request(&addr, "POST", "/api/v1/runs", &appr, Some(&start));
    assert_eq!(
        (
            status,
            body["error"]["code"].as_str(),
            body["error"]["details"]["needed"].as_str()
        ),
        (403, Some("forbidden"), Some("operator")),
        "{body}"
    );
    for named in [
        "notes.toml",
        "../examples/agents/notes.toml",
        "/etc/passwd",
        "chat",
    ] {
        let (status, body) = request(
            &addr,
            "POST",
            "/api/v1/runs",
            &ops,
            Some(&json!({ "agent": named })),
        );
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("agent_not_served")),
            "{named}: {body}"
        );
        assert_eq!(body["error"]["details"]["served"], json!(["notes"]));
    }
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs",
        &ops,
        Some(&json!({ "agent": "notes", "labels": { "warden.started_by": "someone" } })),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("usage")),
        "{body}"
    );
    // A label the runtime refuses is the caller's to fix (400), named, not
    // the agent's (500): an empty key, a key over the limit, submitted or
    // started.
    let long = "k".repeat(200);
    for (labels, label) in [
        (json!({ "": "x" }), ""),
        (json!({ long.as_str(): "x" }), long.as_str()),
    ] {
        for submit in [false, true] {
            let (status, body) = request(
                &addr,
                "POST",
                "/api/v1/runs",
                &ops,
                Some(&json!({ "agent": "notes", "labels": labels, "submit": submit })),
            );
            assert_eq!(
                (
                    status,
                    body["error"]["code"].as_str(),
                    body["error"]["details"]["label"].as_str()
                ),
                (400, Some("invalid_labels"), Some(label)),
                "{body}"
            );
        }
    }
    let (_, listed) = request(&addr, "GET", "/api/v1/runs", &ops, None);
    assert!(
        listed["runs"].as_array().unwrap().is_empty(),
        "nothing was started: {listed}"
    );

    // Started: the server drives it to its write.
    let (status, body) = request(&addr, "POST", "/api/v1/runs", &ops, Some(&start));
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["run_id"].as_str(), body["status"].as_str()),
        (Some("started"), Some("running"))
    );
    let parked = wait_for("the started run to await approval", || {
        let (_, shown) = request(&addr, "GET", "/api/v1/runs/started", &ops, None);
        (shown["status"] == "awaiting_approval").then_some(shown)
    });
    assert_eq!(
        parked["labels"]["warden.started_by"], "api:olga",
        "{parked}"
    );
    let (status, body) = request(&addr, "POST", "/api/v1/runs", &ops, Some(&start));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("run_exists")),
        "{body}"
    );

    // Submitted: queued, and nothing here drives it.
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs",
        &ops,
        Some(
            &json!({ "agent": "notes", "input": "Summarise", "run_id": "queued", "submit": true }),
        ),
    );
    assert_eq!(
        (status, body["status"].as_str()),
        (201, Some("queued")),
        "{body}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let (_, shown) = request(&addr, "GET", "/api/v1/runs/queued", &ops, None);
    assert_eq!(shown["status"], "queued", "{shown}");
    assert_eq!(shown["events"].as_array().unwrap().len(), 1, "{shown}");

    // Forked just before the source asked for approval: everything before
    // is reused, and the fork asks for its own approval.
    let events = parked["events"].as_array().unwrap();
    let asked = events
        .iter()
        .find(|e| e["event"]["type"] == "approval_requested")
        .unwrap()["seq"]
        .as_u64()
        .unwrap();
    let fork = json!({ "at": asked - 1, "run_id": "forked" });
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/started/fork",
        &appr,
        Some(&fork),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/started/fork",
        &ops,
        Some(&json!({ "at": asked - 1, "agent": "writer" })),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("agent_not_served")),
        "{body}"
    );
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/started/fork",
        &ops,
        Some(&json!({ "at": 999 })),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("fork_refused")),
        "{body}"
    );
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/started/fork",
        &ops,
        Some(&fork),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["run_id"], "forked");
    assert_eq!(
        body["forked_from"],
        json!({ "run_id": "started", "at": asked - 1 })
    );
    let forked = wait_for("the fork to await approval", || {
        let (_, shown) = request(&addr, "GET", "/api/v1/runs/forked", &ops, None);
        (shown["status"] == "awaiting_approval").then_some(shown)
    });
    let fork_events = forked["events"].as_array().unwrap();
    for (inherited, source) in fork_events.iter().zip(&events[..(asked - 1) as usize]) {
        assert_eq!(inherited["event"], source["event"], "inherited as it was");
    }
    let made: Vec<&str> = fork_events[(asked - 1) as usize..]
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(made[0], "run_forked", "{made:?}");
    assert!(
        !made.iter().any(|t| t.ends_with("_intent")),
        "the fork made no call again before its approval: {made:?}"
    );
    assert_eq!(fork_events[(asked - 1) as usize]["event"]["by"], "api:olga");

    // The inbox: every run waiting for a person, in one request.
    let (status, inbox) = request(&addr, "GET", "/api/v1/inbox", &appr, None);
    assert_eq!(status, 200, "{inbox}");
    let waiting: Vec<(&str, &str)> = inbox["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap(),
                r["pending"]["tool"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        waiting,
        [("started", "fs__write_file"), ("forked", "fs__write_file")],
        "{inbox}"
    );
    assert!(inbox["runs"][1]["events"].as_array().unwrap().len() > 2);

    // Approved, the fork completes (the server drives it) and writes once.
    let call = forked["pending"]["call_id"].clone();
    let (status, body) = request(
        &addr,
        "POST",
        "/api/v1/runs/forked/approve",
        &appr,
        Some(&json!({ "call_id": call, "digest": forked["pending"]["digest"] })),
    );
    assert_eq!(status, 200, "{body}");
    let done = wait_for("the fork to complete", || {
        let (_, shown) = request(&addr, "GET", "/api/v1/runs/forked", &ops, None);
        (shown["status"] == "completed").then_some(shown)
    });
    let writes = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["type"] == "tool_call_completed" && e["event"]["call_id"] == call)
        .count();
    assert_eq!(writes, 1, "{done}");
    assert!(dir.join("notes/SUMMARY.md").is_file());
    let (_, inbox) = request(&addr, "GET", "/api/v1/inbox", &appr, None);
    assert_eq!(inbox["runs"].as_array().unwrap().len(), 1, "{inbox}");
}

#[test]
fn runs_are_started_submitted_and_forked_through_the_api_on_sqlite() {
    start_submit_and_fork_through_the_api("serve.db");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_started_submitted_and_forked_through_the_api_on_postgres() {
    let Some(pg) = PgSchema::new("servestart").await else {
        return;
    };
    let url = pg.url.clone();
    tokio::task::spawn_blocking(move || start_submit_and_fork_through_the_api(&url))
        .await
        .unwrap();
}

/// `GET /runs` a page at a time: newest first, `next` the cursor of the
/// page after (null on the last), the filters kept across pages; the id
/// prefix and the time range filter; a cursor the server did not give, a
/// page of 0 or over 500 runs, and an unknown order are refused as
/// `usage`; every status, the parked kinds included, is a filter.
#[test]
fn the_api_pages_runs_newest_first_with_an_opaque_cursor() {
    let demo = demo();
    let dir = demo.path();
    let token = bearer(&add_token(dir, "vera", "viewer"));
    for run in ["job-1", "job-2", "job-3", "job-4", "other-5"] {
        let out = warden(dir, "serve.db")
            .args(["submit", "notes.toml", "--run-id", run])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Each a millisecond or more after the one before.
        std::thread::sleep(Duration::from_millis(5));
    }
    let (_server, addr) = start_server(dir, "serve.db");
    let headers = [("Authorization", token.as_str())];
    let get = |path: &str| request(&addr, "GET", path, &headers, None);
    let ids = |body: &Value| -> Vec<String> {
        body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };

    let mut seen = Vec::new();
    let mut path = "/api/v1/runs?id_prefix=job-&limit=3".to_owned();
    loop {
        let (status, body) = get(&path);
        assert_eq!(status, 200, "{body}");
        seen.extend(ids(&body));
        match body["next"].as_str() {
            Some(cursor) => path = format!("/api/v1/runs?id_prefix=job-&limit=3&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["job-4", "job-3", "job-2", "job-1"]);

    let (_, all) = get("/api/v1/runs");
    assert_eq!(
        ids(&all),
        ["other-5", "job-4", "job-3", "job-2", "job-1"],
        "{all}"
    );
    assert_eq!(all["next"], Value::Null);
    let (_, oldest) = get("/api/v1/runs?order=oldest&limit=2");
    assert_eq!(ids(&oldest), ["job-1", "job-2"]);
    let created = |i: usize| all["runs"][i]["created_ms"].as_i64().unwrap();
    let (_, window) = get(&format!(
        "/api/v1/runs?since_ms={}&before_ms={}",
        created(3),
        created(1)
    ));
    assert_eq!(ids(&window), ["job-3", "job-2"], "{window}");
    let (_, parked) = get("/api/v1/runs?status=waiting,awaiting_external,awaiting_child");
    assert_eq!(ids(&parked), Vec::<String>::new());
    let (_, queued) = get("/api/v1/runs?status=queued&id_prefix=other");
    assert_eq!(ids(&queued), ["other-5"]);

    for bad in [
        "/api/v1/runs?cursor=zz",
        "/api/v1/runs?cursor=6a6f622d31",
        "/api/v1/runs?limit=0",
        "/api/v1/runs?limit=501",
        "/api/v1/runs?order=sideways",
        "/api/v1/runs?id_prefix=no%20spaces",
    ] {
        let (status, body) = get(bad);
        assert_eq!(status, 400, "{bad}: {body}");
        let code = body["error"]["code"].as_str().unwrap();
        assert!(code == "usage" || code == "invalid_run_id", "{bad}: {body}");
    }
}
