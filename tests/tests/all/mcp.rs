//! `warden mcp serve` against a client nobody here wrote: the official MCP
//! Python SDK (`mcp` on PyPI), driving `tests/mcp/client.py` over stdio
//! and over streamable HTTP. The client lists the tools with their
//! annotations, calls a read tool, a write approved by elicitation, a
//! write approved with `warden runs approve` from "another terminal", a
//! write declined by elicitation and one denied with `warden runs deny`,
//! and a write nobody approves (refused when the approval times out);
//! over HTTP also requests without the token, with a wrong one, from
//! another Origin or naming another Host (refused). Then the store is
//! read: each session is a completed run that recorded each call as an
//! effect, and the side-effect file holds each approved write once. The
//! client's decisions are recorded under the identity its transport
//! authenticated (the local account over stdio, the token over HTTP);
//! under `--approvals operators` (HTTP's default) a client that would
//! approve anything is never asked, and its write waits for `warden runs
//! approve`, then is made once.
//!
//! A server killed with SIGKILL between a write's intent and its
//! completion leaves the write parked as dangling (`needs_reconciliation`)
//! and a restarted server never makes it again.
//!
//! The same session from the official TypeScript SDK
//! (`tests/mcp/client.mjs`, `@modelcontextprotocol/sdk` in
//! `target/mcp-js`), over stdio and HTTP: tools, a read, a write approved
//! and one denied from another terminal, an unknown tool.
//!
//! The SDK must be installed in `target/mcp-venv` (`.ci/run` creates it
//! and pins the version); without it these tests fail, never skip.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::engine::Fixture;
use crate::binary::warden_binary;

/// The SDK version `.ci/run` installs.
const SDK: &str = "2.3.0";

const INSTALL: &str = "bash .ci/run (its mcp-venv install), or: \
    python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install mcp==2.3.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The virtual environment's Python, with the pinned SDK in it.
fn python() -> PathBuf {
    let python = repo().join("target/mcp-venv/bin/python");
    assert!(
        python.exists(),
        "no virtual environment at {}: {INSTALL}",
        python.display()
    );
    let out = Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('mcp'))",
        ])
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        version,
        SDK,
        "the MCP SDK in target/mcp-venv is not {SDK} ({}): {INSTALL}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    python
}

/// The fixture's plugins (the built-in `fs` over `work/` read-only, the
/// hostile guest over it read-write, so its tools are writes) as an agent
/// to serve; its scripted model only ever ends a run another driver takes.
fn served() -> Fixture {
    let fx = Fixture::new();
    std::fs::write(
        fx.path("transcript.toml"),
        "[[turns]]\ntext = \"This agent's tools are served over MCP.\"\n",
    )
    .unwrap();
    std::fs::write(
        fx.path("agent.toml"),
        r#"name = "served"
instructions = "Tools served over MCP."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.files]
source = "builtin:fs"
[plugins.files.grant.mounts.workspace]
dir = "work"
access = "read-only"

[plugins.hostile]
source = "hostile.toml"
[plugins.hostile.grant.mounts.workspace]
dir = "work"
"#,
    )
    .unwrap();
    fx
}

/// `warden` in the fixture's directory on its store.
fn warden(dir: &Path) -> Command {
    let mut command = Command::new(warden_binary());
    command
        .current_dir(dir)
        .env("WARDEN_STORE", dir.join("mcp.db"))
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_MCP_TOKEN")
        .stdin(Stdio::null());
    command
}

/// The client script with `args`, in the fixture's directory.
fn client(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(python());
    command
        .current_dir(dir)
        .arg(repo().join("tests/mcp/client.py"))
        .args(args)
        .env("WARDEN_BIN", warden_binary())
        .env("WARDEN_STORE", dir.join("mcp.db"))
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env("MCP_WORK", dir.join("work"))
        .env("MCP_SERVER_LOG", dir.join("server.log"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

fn run_client(dir: &Path, args: &[&str]) {
    run_client_with(dir, args, &[]);
}

/// [`run_client`] with more environment for the client.
fn run_client_with(dir: &Path, args: &[&str], envs: &[(&str, &str)]) {
    let started = Instant::now();
    let out = client(dir, args)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the MCP client failed ({:?}):\n{}\n{}\nserver log:\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
    );
}

/// `warden --json ARGS` and its JSON.
fn json(dir: &Path, args: &[&str]) -> Value {
    let out = warden(dir).arg("--json").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "warden {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The session's one run, once it has completed (within 30 s): served
/// sessions end their run when the client goes.
fn the_completed_session_run(dir: &Path) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = session_runs(dir);
        if runs.len() == 1 && runs[0]["status"] == "completed" || Instant::now() > deadline {
            break runs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let run = runs.into_iter().next().unwrap();
    assert_eq!(run["status"], "completed", "{run:#}");
    run
}

/// The served sessions' runs, each as `runs show` prints it.
fn session_runs(dir: &Path) -> Vec<Value> {
    json(dir, &["runs", "list", "--label", "mcp=serve"])
        .as_array()
        .unwrap()
        .iter()
        .map(|run| json(dir, &["runs", "show", run["run_id"].as_str().unwrap()]))
        .collect()
}

fn events<'a>(run: &'a Value, kind: &str) -> Vec<&'a Value> {
    run["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|line| &line["event"])
        .filter(|event| event["type"] == kind)
        .collect()
}

/// The side-effect file's lines.
fn effects(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("work/effects.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The account this test runs as (`id -un`): what a stdio client's
/// decisions are recorded under, whatever name the client gives itself.
fn account() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    assert!(out.status.success(), "id -un: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// What every session of the scenarios left in the store: a completed run
/// per session with a call, each call recorded as an intent and a
/// completion, the approvals and denials with who made them: the client
/// by `client`, the identity its transport authenticated, never by the
/// name it gave itself.
fn check_recorded(dir: &Path, client: &str) {
    // A session's run completes once the client closed it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = session_runs(dir);
        if runs.len() >= 6 && runs.iter().all(|r| r["status"] == "completed")
            || Instant::now() > deadline
        {
            break runs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // read, write_elicited, write_cli, denied (two sessions), timeout;
    // listing the tools starts no run.
    assert_eq!(runs.len(), 6, "{runs:#?}");
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        assert_eq!(run["agent"], "served");
        assert_eq!(run["labels"]["mcp_client"], "warden-tests");
        assert_eq!(run["output"], "the MCP session ended", "{run:#}");
        // Each call the engine ran is an intent and then a completion.
        assert_eq!(
            events(run, "tool_call_intent").len(),
            events(run, "tool_call_completed").len(),
            "{run:#}"
        );
    }
    let all = |kind: &str| -> Vec<Value> {
        runs.iter()
            .flat_map(|run| events(run, kind))
            .cloned()
            .collect()
    };
    let granted = all("approval_granted");
    assert_eq!(granted.len(), 2, "{granted:#?}");
    assert!(granted.iter().any(|e| e["by"] == client), "{granted:#?}");
    let denied = all("approval_denied");
    assert_eq!(denied.len(), 3, "{denied:#?}");
    assert!(
        denied.iter().any(|e| e["by"] == "warden mcp serve"
            && e["reason"]
                .as_str()
                .unwrap()
                .starts_with("no approval within")),
        "{denied:#?}"
    );
    assert!(denied.iter().any(|e| e["by"] == client), "{denied:#?}");
    assert!(
        denied.iter().any(|e| e["reason"] == "not now"),
        "{denied:#?}"
    );
    // Each approved write happened once; no other did.
    assert_eq!(effects(dir), ["elicited", "approved"]);
}

const SCENARIOS: &[&str] = &[
    "tools",
    "read",
    "write_elicited",
    "write_cli",
    "denied",
    "timeout",
];

#[test]
fn the_python_sdk_uses_the_served_tools_over_stdio() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    let mut args = vec!["stdio", bin.to_str().unwrap(), "agent.toml"];
    args.extend(SCENARIOS);
    run_client(dir, &args);
    check_recorded(dir, &format!("mcp:stdio:{}", account()));
}

/// A client's bad arguments, more in a row than the agent's
/// `max_invalid_tool_calls`: each is that call's error result, the session
/// goes on, and its run completes with only the good calls in its log.
#[test]
fn a_clients_bad_arguments_are_errors_of_the_call_and_never_end_the_session() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client(
        dir,
        &["stdio", bin.to_str().unwrap(), "agent.toml", "mistakes"],
    );
    let run = &the_completed_session_run(dir);
    assert_eq!(run["output"], "the MCP session ended", "{run:#}");
    assert!(events(run, "tool_call_rejected").is_empty(), "{run:#}");
    assert_eq!(events(run, "tool_call_completed").len(), 2, "{run:#}");
}

/// What a cancelled and an abandoned parked write left: each denied by
/// `warden mcp serve` (the client cancelled it, or its session ended),
/// neither made, every session's run completed.
fn check_withdrawn(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = session_runs(dir);
        if runs.len() == 2 && runs.iter().all(|r| r["status"] == "completed")
            || Instant::now() > deadline
        {
            break runs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let mut reasons = Vec::new();
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        assert!(events(run, "approval_granted").is_empty(), "{run:#}");
        let denied = events(run, "approval_denied");
        assert_eq!(denied.len(), 1, "{run:#}");
        assert_eq!(denied[0]["by"], "warden mcp serve", "{run:#}");
        reasons.push(denied[0]["reason"].as_str().unwrap().to_owned());
    }
    assert!(
        reasons
            .iter()
            .any(|r| r == "the client cancelled the call or ended the session"),
        "{reasons:?}"
    );
    assert!(effects(dir).is_empty(), "{:?}", effects(dir));
}

#[test]
fn a_cancelled_or_abandoned_parked_write_is_withdrawn_over_stdio() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client_with(
        dir,
        &[
            "stdio",
            bin.to_str().unwrap(),
            "agent.toml",
            "cancel_parked",
            "end_parked",
        ],
        &[("MCP_APPROVAL_TIMEOUT", "60s")],
    );
    check_withdrawn(dir);
}

#[test]
fn a_cancelled_or_abandoned_parked_write_is_withdrawn_over_streamable_http() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(dir, "tok", &["--approval-timeout", "60s"]);
    run_client(dir, &["http", &url, "tok", "cancel_parked", "end_parked"]);
    check_withdrawn(dir);
}

/// What a write parked with progress left: one completed run, its write
/// approved from another terminal and made once.
fn check_progressed(dir: &Path) {
    let run = the_completed_session_run(dir);
    assert_eq!(events(&run, "approval_granted").len(), 1, "{run:#}");
    assert_eq!(effects(dir), ["progressed"]);
}

/// A synchronous client's write parked for approval receives
/// `notifications/progress` at a steady interval until a human decides, so
/// its request timeout (reset by progress) does not fire meanwhile.
#[test]
fn a_parked_call_sends_progress_while_it_waits_over_stdio() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client_with(
        dir,
        &[
            "stdio",
            bin.to_str().unwrap(),
            "agent.toml",
            "progress_parked",
        ],
        &[
            ("MCP_APPROVAL_TIMEOUT", "60s"),
            ("MCP_SERVE_FLAGS", "--progress-interval 1s"),
        ],
    );
    check_progressed(dir);
}

#[test]
fn a_parked_call_sends_progress_while_it_waits_over_streamable_http() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(
        dir,
        "tok",
        &["--approval-timeout", "60s", "--progress-interval", "1s"],
    );
    run_client(dir, &["http", &url, "tok", "progress_parked"]);
    check_progressed(dir);
}

/// What a write only operators could approve left: one completed run
/// recording who may approve (`mcp_approvers=operators`), its write
/// approved once by the operator at the terminal (never by the client,
/// which was not asked) and made once.
fn check_operators_only(dir: &Path) {
    let run = &the_completed_session_run(dir);
    assert_eq!(run["labels"]["mcp_approvers"], "operators", "{run:#}");
    let granted = events(run, "approval_granted");
    assert_eq!(granted.len(), 1, "{run:#}");
    assert!(
        !granted[0]["by"].as_str().unwrap().starts_with("mcp:"),
        "{run:#}"
    );
    assert!(events(run, "approval_denied").is_empty(), "{run:#}");
    assert_eq!(events(run, "tool_call_intent").len(), 1, "{run:#}");
    assert_eq!(effects(dir), ["operator"]);
}

/// Over HTTP only operators approve by default: a client whose elicitation
/// handler approves everything is never asked, its write stays parked until
/// `warden runs approve`, then is made exactly once.
#[test]
fn over_streamable_http_only_operators_approve_by_default() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(dir, "tok", &["--approval-timeout", "60s"]);
    run_client(dir, &["http", &url, "tok", "write_operators_only"]);
    check_operators_only(dir);
}

/// `--approvals operators` over stdio: the same, for the local client.
#[test]
fn over_stdio_only_operators_approve_when_the_operator_says_so() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client_with(
        dir,
        &[
            "stdio",
            bin.to_str().unwrap(),
            "agent.toml",
            "write_operators_only",
        ],
        &[
            ("MCP_APPROVAL_TIMEOUT", "60s"),
            ("MCP_SERVE_FLAGS", "--approvals operators"),
        ],
    );
    check_operators_only(dir);
}

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `warden mcp serve --http` on an ephemeral loopback port with `token`,
/// and its URL.
fn start_http(dir: &Path, token: &str, flags: &[&str]) -> (Killed, String) {
    start_http_on(dir, None, token, flags)
}

/// [`start_http`] on `store` (default: the fixture's SQLite file).
fn start_http_on(dir: &Path, store: Option<&str>, token: &str, flags: &[&str]) -> (Killed, String) {
    let mut server = warden(dir);
    if let Some(store) = store {
        server.env("WARDEN_STORE", store);
    }
    let mut child = server
        .args([
            "--json",
            "mcp",
            "serve",
            "agent.toml",
            "--http",
            "127.0.0.1:0",
        ])
        .args(if flags.contains(&"--approval-timeout") {
            &[][..]
        } else {
            &["--approval-timeout", "5s"][..]
        })
        .args(flags)
        .env("WARDEN_MCP_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("server.log"))
                .unwrap(),
        )
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
            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        )
    });
    (child, listening["listening"].as_str().unwrap().to_owned())
}

#[test]
fn the_python_sdk_uses_the_served_tools_over_streamable_http() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(dir, "s3cret-token", &["--approvals", "client"]);
    let mut args = vec!["http", url.as_str(), "s3cret-token"];
    args.extend(SCENARIOS);
    args.push("refused");
    run_client(dir, &args);
    check_recorded(dir, "mcp:token:WARDEN_MCP_TOKEN");
}

#[test]
fn a_refusal_never_leaves_a_closed_connection_for_a_client_to_reuse() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(dir, "s3cret-token", &[]);
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    for (what, extra) in [
        ("no token", ""),
        ("a wrong token", "Authorization: Bearer wrong\r\n"),
        (
            "another origin",
            "Authorization: Bearer s3cret-token\r\nOrigin: http://evil.example\r\n",
        ),
    ] {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/event-stream\r\n{extra}"
        );
        let (status, held) =
            crate::serve::refusal_leaves_a_usable_or_closed_connection(&addr, &head);
        assert!((400..500).contains(&status), "{what}: {status}");
        assert!(
            held,
            "{what}: refused with {status}, then the connection closed without saying so"
        );
    }
}

#[test]
fn a_server_killed_mid_write_parks_it_and_never_makes_it_again() {
    let fx = served();
    let dir = fx.dir.path();
    let (mut server, url) = start_http(dir, "tok", &["--claim-ttl", "1s", "--approvals", "client"]);
    let mut writer = Killed(
        client(dir, &["http", &url, "tok", "crash_write"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The write's effect happened (the tool then blocks): kill the server
    // between the intent and the completion.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !effects(dir).contains(&"crash".to_owned()) {
        assert!(Instant::now() < deadline, "the write never ran");
        assert!(writer.0.try_wait().unwrap().is_none(), "the client gave up");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let _ = writer.0.kill();
    let runs = session_runs(dir);
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    assert_eq!(run["status"], "needs_reconciliation", "{run:#}");
    assert_eq!(events(run, "tool_call_intent").len(), 1);
    assert!(events(run, "tool_call_completed").is_empty());

    // Restarted once the dead server's claim ran out: the run stays parked
    // and a new session works without the write running again.
    std::thread::sleep(Duration::from_millis(1500));
    let (_server, url) = start_http(dir, "tok", &["--claim-ttl", "1s"]);
    run_client(dir, &["http", &url, "tok", "read"]);
    let shown = json(dir, &["runs", "show", &run_id]);
    assert_eq!(shown["status"], "needs_reconciliation", "{shown:#}");
    assert_eq!(events(&shown, "tool_call_intent").len(), 1);
    assert_eq!(effects(dir), ["crash"]);
    // Recovering it by hand refuses to guess, as for any run.
    let out = warden(dir)
        .args(["--json", "runs", "recover", &run_id])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(effects(dir), ["crash"]);
}

#[test]
fn serving_refuses_an_unprotected_bind_and_an_agent_without_plugin_tools() {
    let fx = served();
    let dir = fx.dir.path();
    let refused = |args: &[&str], code: &str| {
        let out = warden(dir).arg("--json").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let envelope: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(envelope["error"]["code"], code, "{envelope:#}");
    };
    refused(
        &["mcp", "serve", "agent.toml", "--http", "0.0.0.0:0"],
        "mcp_unprotected",
    );
    // A client's approval needs an identity to be recorded under.
    refused(
        &[
            "mcp",
            "serve",
            "agent.toml",
            "--http",
            "127.0.0.1:0",
            "--approvals",
            "client",
        ],
        "mcp_anonymous_approver",
    );
    std::fs::write(
        dir.join("bare.toml"),
        "name = \"bare\"\ninstructions = \"-\"\n[model]\nprovider = \"scripted\"\nname = \"s\"\ntranscript = \"transcript.toml\"\n",
    )
    .unwrap();
    std::fs::write(dir.join("transcript.toml"), "[[turns]]\ntext = \"-\"\n").unwrap();
    refused(&["mcp", "serve", "bare.toml"], "agent_unservable");
}

/// The TypeScript SDK's client (`tests/mcp/client.mjs`), copied next to
/// the SDK `.ci/run` installs into `target/mcp-js` so Node resolves it
/// there.
fn ts_client(dir: &Path, args: &[&str]) {
    static COPIED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let script = COPIED.get_or_init(|| {
        let js = repo().join("target/mcp-js");
        assert!(
            js.join("node_modules/@modelcontextprotocol/sdk").exists(),
            "no TypeScript SDK in {}: run .ci/run (its npm-tools install)",
            js.display()
        );
        let script = js.join("client.mjs");
        std::fs::copy(repo().join("tests/mcp/client.mjs"), &script).unwrap();
        script
    });
    let out = Command::new("node")
        .current_dir(dir)
        .arg(script)
        .args(args)
        .env("WARDEN_BIN", warden_binary())
        .env("WARDEN_STORE", dir.join("mcp.db"))
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env("MCP_WORK", dir.join("work"))
        .env("MCP_SERVE_FLAGS", "--progress-interval 1s")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("node (Node.js) runs the TypeScript SDK's client");
    assert!(
        out.status.success(),
        "the TypeScript client failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
    );
}

/// What the TypeScript client's session left: one run, its approved write
/// made once (and the one kept alive by progress), the denied one never,
/// each call an intent and a completion.
fn check_ts_recorded(dir: &Path) {
    let run = &the_completed_session_run(dir);
    assert_eq!(run["labels"]["mcp_client"], "warden-tests-ts");
    assert_eq!(
        events(run, "tool_call_intent").len(),
        events(run, "tool_call_completed").len(),
        "{run:#}"
    );
    assert_eq!(events(run, "approval_granted").len(), 2, "{run:#}");
    assert_eq!(events(run, "approval_denied").len(), 1, "{run:#}");
    assert_eq!(effects(dir), ["ts-approved", "ts-progressed"]);
}

#[test]
fn the_typescript_sdk_uses_the_served_tools_over_stdio() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    ts_client(dir, &["stdio", bin.to_str().unwrap(), "agent.toml"]);
    check_ts_recorded(dir);
}

#[test]
fn the_typescript_sdk_uses_the_served_tools_over_streamable_http() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(
        dir,
        "ts-token",
        &["--approval-timeout", "60s", "--progress-interval", "1s"],
    );
    ts_client(dir, &["http", url.as_str(), "ts-token"]);
    check_ts_recorded(dir);
}

/// The runs of the served sessions that made a call (a session that only
/// listed or read starts one too: each read is a call).
fn runs_with_a_write(dir: &Path) -> Vec<Value> {
    session_runs(dir)
        .into_iter()
        .filter(|run| {
            events(run, "model_call_completed")
                .iter()
                .any(|e| e.to_string().contains("hostile__fs"))
        })
        .collect()
}

/// The run holding the one write, once it has completed (within 30 s).
fn the_completed_write_run(dir: &Path) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs = runs_with_a_write(dir);
        if runs.len() == 1 && runs[0]["status"] == "completed" || Instant::now() > deadline {
            assert_eq!(runs.len(), 1, "{runs:#?}");
            assert_eq!(runs[0]["status"], "completed", "{:#}", runs[0]);
            return runs.into_iter().next().unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The run and call waiting for approval, as an operator finds them.
fn awaiting_approval(dir: &Path, store: Option<&str>) -> (String, String) {
    let mut list = warden(dir);
    if let Some(store) = store {
        list.env("WARDEN_STORE", store);
    }
    let out = list
        .args(["--json", "runs", "list", "--status", "awaiting_approval"])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = runs[0]["run_id"]
        .as_str()
        .expect("a run awaits approval")
        .to_owned();
    let mut show = warden(dir);
    if let Some(store) = store {
        show.env("WARDEN_STORE", store);
    }
    let out = show
        .args(["--json", "runs", "show", &run])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let call = shown["next"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["action"] == "approve")
        .and_then(|step| step["command"].as_str())
        .and_then(|command| command.split_whitespace().last())
        .expect("an approve step")
        .to_owned();
    (run, call)
}

/// `warden runs approve RUN CALL` from another terminal, on `store`.
fn approve(dir: &Path, store: Option<&str>, run: &str, call: &str) {
    let mut command = warden(dir);
    if let Some(store) = store {
        command.env("WARDEN_STORE", store);
    }
    let out = command
        .args(["--json", "runs", "approve", run, call])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "approve: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a task approved once left: its run completed, the write approved
/// by the operator once, recorded as an intent and a completion, and made
/// once.
fn check_task_made_once(dir: &Path) {
    let run = &the_completed_write_run(dir);
    assert_eq!(events(run, "approval_granted").len(), 1, "{run:#}");
    assert!(events(run, "approval_denied").is_empty(), "{run:#}");
    assert_eq!(events(run, "tool_call_intent").len(), 1, "{run:#}");
    assert_eq!(events(run, "tool_call_completed").len(), 1, "{run:#}");
    assert!(run["labels"]["mcp_task_key"].is_string(), "{run:#}");
    assert_eq!(effects(dir), ["tasked"]);
}

/// Both protocol revisions from one endpoint: the official Python SDK's
/// `Client` shaking hands (`initialize`, 2025-11-25) and discovering
/// (`server/discover`, 2026-07-28, no session), each listing and calling.
#[test]
fn both_revisions_are_served_over_stdio() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client(
        dir,
        &["stdio", bin.to_str().unwrap(), "agent.toml", "revisions"],
    );
}

#[test]
fn both_revisions_are_served_over_streamable_http() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(dir, "tok", &[]);
    run_client(dir, &["http", &url, "tok", "revisions"]);
}

/// A write that parks for approval, from a client that takes tasks
/// (2026-07-28 over HTTP): answered at once with a handle; the client
/// leaves and `warden mcp serve` is killed; an operator approves from
/// another terminal; a new server, polled by a new client with the kept
/// handle, makes the write once and answers its result.
#[test]
fn a_task_survives_its_client_and_a_server_restart_and_is_made_once_over_streamable_http() {
    let fx = served();
    let dir = fx.dir.path();
    let (server, url) = start_http(dir, "tok", &["--claim-ttl", "1s"]);
    run_client(dir, &["http", &url, "tok", "task_park"]);
    drop(server);
    assert!(effects(dir).is_empty(), "{:?}", effects(dir));
    let (run, call) = awaiting_approval(dir, None);
    approve(dir, None, &run, &call);
    let (_server, url) = start_http(dir, "tok", &["--claim-ttl", "1s"]);
    run_client(dir, &["http", &url, "tok", "task_result"]);
    check_task_made_once(dir);
}

/// The same over stdio: the server exits when its client leaves; the next
/// client's server finds the approved task and makes it once.
#[test]
fn a_task_survives_its_client_and_its_server_and_is_made_once_over_stdio() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    let bin = bin.to_str().unwrap();
    run_client(dir, &["stdio", bin, "agent.toml", "task_park"]);
    let (run, call) = awaiting_approval(dir, None);
    approve(dir, None, &run, &call);
    run_client(dir, &["stdio", bin, "agent.toml", "task_result"]);
    check_task_made_once(dir);
}

/// A task cancelled while its write waits for approval: withdrawn by the
/// denial a cancelled call gets, `cancelled`, a later approval refused,
/// the write never made, the run completed.
#[test]
fn a_cancelled_task_is_withdrawn_and_never_made() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client(
        dir,
        &[
            "stdio",
            bin.to_str().unwrap(),
            "agent.toml",
            "task_cancel_parked",
        ],
    );
    let (_server, url) = start_http(dir, "tok", &[]);
    run_client(dir, &["http", &url, "tok", "task_cancel_parked"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = runs_with_a_write(dir);
        if runs.iter().all(|r| r["status"] == "completed") || Instant::now() > deadline {
            break runs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(runs.len(), 2, "{runs:#?}");
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        assert!(events(run, "approval_granted").is_empty(), "{run:#}");
        assert!(events(run, "tool_call_intent").is_empty(), "{run:#}");
        let denied = events(run, "approval_denied");
        assert_eq!(denied.len(), 1, "{run:#}");
        assert_eq!(denied[0]["by"], "warden mcp serve", "{run:#}");
        assert_eq!(
            denied[0]["reason"], "the client cancelled the task",
            "{run:#}"
        );
    }
    assert!(effects(dir).is_empty(), "{:?}", effects(dir));
}

/// Under `--approvals client` (stdio's default) a task asks its client for
/// the approval form; the client's `tasks/update` approves it, recorded
/// under the local account (never the client's name), made once.
#[test]
fn a_tasks_client_approves_it_through_the_task_when_the_operator_lets_it() {
    let fx = served();
    let dir = fx.dir.path();
    let bin = warden_binary();
    run_client(
        dir,
        &[
            "stdio",
            bin.to_str().unwrap(),
            "agent.toml",
            "task_client_approves",
        ],
    );
    let run = &the_completed_write_run(dir);
    let granted = events(run, "approval_granted");
    assert_eq!(granted.len(), 1, "{run:#}");
    assert_eq!(
        granted[0]["by"],
        format!("mcp:stdio:{}", account()),
        "{run:#}"
    );
    assert_eq!(events(run, "tool_call_intent").len(), 1, "{run:#}");
    assert_eq!(effects(dir), ["client-approved"]);
}

/// Task handles are capabilities: a client that did not receive one
/// cannot read or cancel another session's task by its run and call ids,
/// nor reach a run through a made-up handle (`-32602`, as an unknown
/// task); the owner's task is untouched until the owner cancels it.
#[test]
fn a_client_cannot_read_or_cancel_another_sessions_task() {
    let fx = served();
    let dir = fx.dir.path();
    let (_server, url) = start_http(dir, "tok", &[]);
    run_client(dir, &["http", &url, "tok", "task_foreign"]);
    assert!(effects(dir).is_empty(), "{:?}", effects(dir));
}

/// A task approved while no `warden mcp serve` runs is finished by a
/// `warden worker` on PostgreSQL (with the agent file's model: the session
/// is over), and the handle reads its result from any server after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_approved_with_no_server_is_finished_by_a_worker_on_postgres() {
    let Some(pg) = crate::workers::PgSchema::new("mcptask").await else {
        return;
    };
    let url = pg.url.clone();
    tokio::task::spawn_blocking(move || {
        let fx = served();
        let dir = fx.dir.path();
        // The worker's model ends the run whatever turn it is asked for.
        std::fs::write(
            fx.path("transcript.toml"),
            "repeat = true\n[[turns]]\ntext = \"This agent's tools are served over MCP.\"\n",
        )
        .unwrap();
        let store = Some(url.as_str());
        let (server, mcp) = start_http_on(dir, store, "tok", &["--claim-ttl", "1s"]);
        run_client_with(
            dir,
            &["http", &mcp, "tok", "task_park"],
            &[("WARDEN_STORE", &url)],
        );
        drop(server);
        let (run, call) = awaiting_approval(dir, store);
        approve(dir, store, &run, &call);
        let _worker = Killed(
            warden(dir)
                .env("WARDEN_STORE", &url)
                .args(["worker", "--poll", "50ms", "--claim-ttl", "5s"])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while !effects(dir).contains(&"tasked".to_owned()) {
            assert!(
                Instant::now() < deadline,
                "the worker never made the write:\n{}",
                std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let (_server, mcp) = start_http_on(dir, store, "tok", &[]);
        run_client_with(
            dir,
            &["http", &mcp, "tok", "task_result"],
            &[("WARDEN_STORE", &url)],
        );
        assert_eq!(effects(dir), ["tasked"]);
    })
    .await
    .unwrap();
}
