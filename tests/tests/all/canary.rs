//! The canary: one unique secret value, kept in the encrypted secrets file
//! and granted to the built-in `http` plugin by handle, goes through an
//! agent run driven by the real `warden` binary: a call that succeeds, one
//! that fails and is retried, a write that waits for approval, a crash in
//! the middle of a call, a rotation of the secret before `runs recover`,
//! and a host that echoes the credential back. Then every byte Warden
//! wrote or showed (the store's files or tables, a backup, stdout and
//! stderr of every command at every verbosity, `runs show` / `events` /
//! `--json`) is searched for both values and their common encodings:
//! none may appear. The same run goes once on SQLite and once on
//! PostgreSQL (`WARDEN_TEST_POSTGRES`, as `workers.rs`).
//!
//! Not covered here: the HTTP API, `mcp serve`, model providers' keys and
//! remote MCP headers, which do not take secrets from the store yet.

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

use crate::kill::warden;
use crate::server::TestServer;
use crate::workers::PgSchema;

/// Both values hold `+`, `/` and `=`, so their URL encoding differs from
/// them.
const FIRST: &str = "cAn4ry+Fst/91e0a7=Qx";
const SECOND: &str = "cAn4ry+Snd/5b2c4d=Zw";

/// Every form a leak could take.
fn needles(value: &str) -> Vec<(String, Vec<u8>)> {
    let b = value.as_bytes();
    let std64 = base64::engine::general_purpose::STANDARD;
    let url64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let bare64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    let url: String = b
        .iter()
        .map(|&c| {
            if c.is_ascii_alphanumeric() || b"-_.~".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect();
    vec![
        ("raw".into(), b.to_vec()),
        ("base64".into(), std64.encode(b).into_bytes()),
        (
            "base64 without padding".into(),
            bare64.encode(b).into_bytes(),
        ),
        ("base64url".into(), url64.encode(b).into_bytes()),
        ("hex".into(), hex::encode(b).into_bytes()),
        ("HEX".into(), hex::encode_upper(b).into_bytes()),
        ("url".into(), url.clone().into_bytes()),
        (
            "url lowercase".into(),
            url.to_ascii_lowercase().into_bytes(),
        ),
        (
            "basic auth".into(),
            std64.encode(format!("canary:{value}")).into_bytes(),
        ),
    ]
}

/// Everything Warden wrote or showed, by where it came from.
#[derive(Default)]
struct Seen(Vec<(String, Vec<u8>)>);

impl Seen {
    fn add(&mut self, what: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.0.push((what.into(), bytes.into()));
    }

    fn output(&mut self, what: &str, out: &Output) {
        self.add(format!("{what}: stdout"), out.stdout.clone());
        self.add(format!("{what}: stderr"), out.stderr.clone());
    }

    fn files(&mut self, dir: &Path) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                self.files(&path);
            } else if path.extension().is_none_or(|e| e != "toml") {
                self.add(path.display().to_string(), std::fs::read(&path).unwrap());
            }
        }
    }

    /// Where any form of `value` appears.
    fn leaks(&self, value: &str) -> Vec<String> {
        let mut found = Vec::new();
        for (form, needle) in needles(value) {
            for (what, bytes) in &self.0 {
                if bytes.windows(needle.len()).any(|w| w == needle.as_slice()) {
                    found.push(format!("{form} in {what}"));
                }
            }
        }
        found
    }

    fn total(&self) -> usize {
        self.0.iter().map(|(_, b)| b.len()).sum()
    }
}

fn agent(server: &TestServer, dead_port: u16) -> String {
    let host = server.grant();
    format!(
        r#"name = "canary"
instructions = "Call the API."

[model]
provider = "scripted"
name = "demo"
transcript = "canary.transcript.toml"

[plugins.http]
source = "builtin:http"
[plugins.http.grant]
hosts = ["{host}", "127.0.0.1:{dead_port}"]
[plugins.http.grant.secrets.api]
store = "api"
hosts = ["{host}"]
[plugins.http.grant.tools.http_get]
effect = "read"
[plugins.http.grant.config]
timeout_ms = "60000"
"#
    )
}

fn transcript(server: &TestServer, dead_port: u16) -> String {
    let ok = server.url("/status/200");
    let echo = server.url("/echo");
    let hang = server.url("/hang-once/canary");
    format!(
        r#"[[turns]]
text = "Calling the API."
[[turns.tool_calls]]
name = "http__http_get"
arguments = {{ url = "{ok}", auth = {{ secret = "api" }} }}

[[turns]]
text = "Calling a host that is down."
[[turns.tool_calls]]
name = "http__http_get"
arguments = {{ url = "http://127.0.0.1:{dead_port}/", headers = {{ x-key = "{{{{secret:api}}}}" }} }}

[[turns]]
text = "Posting, which needs approval; this host echoes what it gets."
[[turns.tool_calls]]
name = "http__http_request"
arguments = {{ method = "POST", url = "{echo}", auth = {{ secret = "api", scheme = "basic", username = "canary" }}, body = "hello" }}

[[turns]]
text = "One more call, which the crash interrupts."
[[turns.tool_calls]]
name = "http__http_get"
arguments = {{ url = "{hang}", auth = {{ secret = "api" }} }}

[[turns]]
text = "Done."
"#
    )
}

fn run_to_end(cmd: &mut std::process::Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn last_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "no JSON on stdout: {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap()
}

/// `warden` with the secrets file and key of `dir`, the store `store`.
fn cmd(args: &[&str], dir: &Path, store: &str) -> std::process::Command {
    let mut c = warden(args, dir);
    c.env("WARDEN_SECRETS_KEY_FILE", dir.join("secrets.key"))
        .env("WARDEN_SECRETS_FILE", dir.join("secrets.enc"))
        .env("WARDEN_STORE", store)
        .env_remove("WARDEN_SECRETS_KEY");
    c
}

fn set_secret(dir: &Path, store: &str, verb: &str, value: &str, seen: &mut Seen) {
    use std::io::Write;
    let mut child = cmd(&["secrets", verb, "api"], dir, store)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    seen.output(&format!("secrets {verb}"), &out);
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool, child: &mut Child) {
    let start = Instant::now();
    while !done() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("warden exited ({status}) before {what}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no {what} in 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The whole scenario against `store`; returns what Warden wrote or showed
/// outside the store itself.
async fn scenario(dir: &Path, store: &str) -> Seen {
    let server = TestServer::start().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    std::fs::write(dir.join("canary.toml"), agent(&server, dead_port)).unwrap();
    std::fs::write(
        dir.join("canary.transcript.toml"),
        transcript(&server, dead_port),
    )
    .unwrap();
    let mut seen = Seen::default();
    let out = run_to_end(&mut cmd(
        &["secrets", "keygen", "--out", "secrets.key"],
        dir,
        store,
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    set_secret(dir, store, "set", FIRST, &mut seen);

    // Success, then a failure retried, then a write that parks for approval.
    let out = run_to_end(&mut cmd(
        &["-vvv", "run", "--json", "canary.toml", "go"],
        dir,
        store,
    ));
    seen.output("run -vvv", &out);
    let summary = last_json(&out);
    assert_eq!(summary["status"], "awaiting_approval", "{summary}");
    let run = summary["run_id"].as_str().unwrap().to_owned();
    let first = server.seen();
    assert_eq!(
        first[0].header("authorization"),
        Some(&*format!("Bearer {FIRST}"))
    );

    // Approved, the run goes on into a call the server holds; the process
    // dies there.
    let tasks = tokio::task::spawn_blocking({
        let (dir, store, run) = (dir.to_owned(), store.to_owned(), run.clone());
        let received = server.received_counter();
        move || {
            let mut child = cmd(&["-vv", "runs", "approve", &run, "call-3-1"], &dir, &store)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            wait_for("the held call", || received() >= 3, &mut child);
            child.kill().unwrap();
            child.wait_with_output().unwrap()
        }
    });
    let out = tasks.await.unwrap();
    seen.output("runs approve -vv (killed)", &out);
    assert!(
        server.seen().iter().any(|s| s.path == "/hang-once/canary"),
        "{:?}",
        server.seen()
    );

    // The secret is rotated while the run is down; recovery sends the new
    // value with the interrupted call and never re-sends a recorded one.
    set_secret(dir, store, "rotate", SECOND, &mut seen);
    let out = run_to_end(&mut cmd(
        &["-v", "runs", "recover", "--json", &run],
        dir,
        store,
    ));
    seen.output("runs recover -v", &out);
    assert_eq!(
        last_json(&out)["status"],
        "completed",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = server.seen();
    let paths: Vec<&str> = requests.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/status/200",
            "/echo",
            "/hang-once/canary",
            "/hang-once/canary"
        ],
        "a recorded call was sent again"
    );
    assert_eq!(
        requests[3].header("authorization"),
        Some(&*format!("Bearer {SECOND}"))
    );

    // What the log says of the secret: its name and two versions.
    let out = run_to_end(&mut cmd(&["runs", "events", "--json", &run], dir, store));
    seen.output("runs events --json", &out);
    let events = String::from_utf8_lossy(&out.stdout).into_owned();
    let versions: std::collections::BTreeSet<String> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| {
            let mut found = Vec::new();
            collect_versions(&v, &mut found);
            found
        })
        .collect();
    assert_eq!(
        versions.len(),
        2,
        "one version per value: {versions:?}\n{events}"
    );
    for args in [
        vec!["runs", "show", &run],
        vec!["runs", "show", "--json", &run],
        vec!["-vvv", "runs", "events", &run],
        vec!["-q", "runs", "list"],
        vec!["runs", "verify", &run],
        vec!["secrets", "list"],
        vec!["secrets", "list", "--json"],
    ] {
        let out = run_to_end(&mut cmd(&args, dir, store));
        seen.output(&args.join(" "), &out);
    }
    seen
}

/// Every `version` under a `secrets` list in an event.
fn collect_versions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(uses)) = map.get("secrets") {
                for u in uses {
                    if let Some(v) = u["version"].as_str() {
                        found.push(v.to_owned());
                    }
                }
            }
            for v in map.values() {
                collect_versions(v, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_versions(v, found)),
        _ => {}
    }
}

fn assert_no_leak(seen: &Seen) {
    assert!(
        seen.total() > 10_000,
        "too little was searched: {} bytes",
        seen.total()
    );
    for value in [FIRST, SECOND] {
        let leaks = seen.leaks(value);
        assert!(leaks.is_empty(), "the canary leaked: {leaks:#?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_canary_is_nowhere_warden_writes_or_shows_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("warden.db");
    let store = format!("sqlite:{}", db.display());
    let mut seen = scenario(dir.path(), &store).await;
    let out = run_to_end(&mut cmd(
        &["store", "backup", "backup.db"],
        dir.path(),
        &store,
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    seen.output("store backup", &out);
    // The database, its WAL, the backup, the witness: every file there.
    seen.files(dir.path());
    assert_no_leak(&seen);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_canary_is_nowhere_warden_writes_or_shows_on_postgres() {
    let Some(schema) = PgSchema::new("canary").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut seen = scenario(dir.path(), &schema.url).await;
    seen.files(dir.path());
    // Every row of every table of the run's schema, as text.
    let base = schema.url.split("?schema=").next().unwrap().to_owned();
    let name = schema.url.rsplit("schema=").next().unwrap().to_owned();
    let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let tables = client
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert!(!tables.is_empty(), "no tables in schema {name}");
    for table in tables {
        let table: String = table.get(0);
        let rows = client
            .query(&format!("SELECT t::text FROM {name}.{table} t"), &[])
            .await
            .unwrap();
        let text: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        seen.add(format!("postgres table {table}"), text.join("\n"));
    }
    assert_no_leak(&seen);
}
