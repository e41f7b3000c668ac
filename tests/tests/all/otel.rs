//! Traces from the log, received by a real OTLP receiver: Arize Phoenix
//! (`phoenix serve`, from PyPI, in `target/phoenix-venv`; `.ci/run`'s
//! phoenix-venv install, pinned). `warden otel export`
//! sends the quick start's demo run, a planner whose child waits for an
//! approval, a run killed mid-way and recovered, and a fork; the spans are
//! then read back through Phoenix's own REST API: parentage (a child's run
//! span under its parent's tool call, a fork rooting its own trace), the
//! GenAI attributes, and no duplicate after the crash, after a second
//! export (which sends nothing: the store remembers how far it got), nor
//! after a third under a fresh cursor (which sends everything again, with
//! the same ids). Without the receiver the test fails naming the step.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::serve::{Killed, demo, warden};

/// The Phoenix release `.ci/run` pins.
const PHOENIX: &str = "20.26.1";

const INSTALL: &str = "bash .ci/run (its phoenix-venv install), or: \
    python3 -m venv target/phoenix-venv && target/phoenix-venv/bin/pip install arize-phoenix==20.26.1";

fn phoenix_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/phoenix-venv/bin/phoenix");
    assert!(bin.exists(), "no Phoenix at {}: {INSTALL}", bin.display());
    let version = Command::new(bin.with_file_name("python"))
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('arize-phoenix'))",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        PHOENIX,
        "Phoenix is not the pinned release: {INSTALL}"
    );
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `phoenix serve` on free loopback ports, its data in `dir`; its HTTP
/// address once it answers.
fn start_phoenix(dir: &Path) -> (Killed, String) {
    let (http, grpc) = (free_port(), free_port());
    let child = Command::new(phoenix_binary())
        .arg("serve")
        .env("PHOENIX_WORKING_DIR", dir)
        .env("PHOENIX_HOST", "127.0.0.1")
        .env("PHOENIX_PORT", http.to_string())
        .env("PHOENIX_GRPC_PORT", grpc.to_string())
        .env("PHOENIX_TELEMETRY_ENABLED", "false")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("phoenix.log")).unwrap())
        .stderr(std::fs::File::create(dir.join("phoenix.err")).unwrap())
        .spawn()
        .unwrap();
    let child = Killed::new(child);
    let addr = format!("127.0.0.1:{http}");
    let deadline = Instant::now() + Duration::from_secs(180);
    while get(&addr, "/healthz").is_none_or(|(status, _)| status != 200) {
        assert!(
            Instant::now() < deadline,
            "Phoenix did not answer on {addr}: {}",
            std::fs::read_to_string(dir.join("phoenix.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    (child, addr)
}

/// A GET on `addr`: status and body, or `None` when nothing answers.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// Every span Phoenix holds in its default project, by span id.
fn spans(addr: &str) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/v1/projects/default/spans?limit=1000{cursor}");
        let (status, body) = get(addr, &path).expect("Phoenix answers");
        assert_eq!(status, 200, "{path}: {body}");
        let page: Value = serde_json::from_str(&body).unwrap();
        for span in page["data"].as_array().unwrap() {
            let id = span["context"]["span_id"].as_str().unwrap().to_owned();
            assert!(
                all.insert(id.clone(), span.clone()).is_none(),
                "Phoenix holds span {id} twice"
            );
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return all,
        }
    }
}

/// Waits until Phoenix holds at least `at_least` spans and the number has
/// stopped moving (it inserts in batches).
fn settled_spans(addr: &str, at_least: usize) -> BTreeMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = usize::MAX;
    loop {
        let now = spans(addr);
        if now.len() >= at_least && now.len() == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "Phoenix holds {} spans, expected at least {at_least}",
            now.len()
        );
        last = now.len();
        std::thread::sleep(Duration::from_millis(1500));
    }
}

/// An attribute of a span as Phoenix returns it (flat or nested by dots).
fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let attributes = &span["attributes"];
    attributes
        .get(key)
        .or_else(|| key.split('.').try_fold(attributes, |v, part| v.get(part)))
}

fn run_of(span: &Value) -> String {
    attr(span, "warden.run.id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `warden --json otel export` with `args`: how many spans it sent.
fn export(dir: &Path, store: &str, collector: &str, args: &[&str]) -> u64 {
    let out = warden(dir, store)
        .args(["--json", "otel", "export"])
        .args(args)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"))
        .output()
        .unwrap();
    ok(&out);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["spans"].as_u64().unwrap()
}

#[test]
fn exported_traces_arrive_in_phoenix_with_their_parentage_and_no_duplicates() {
    let phoenix_dir = tempfile::tempdir().unwrap();
    let (_phoenix, collector) = start_phoenix(phoenix_dir.path());
    let dir = demo();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for name in ["planner", "reader", "writer"] {
        for file in [format!("{name}.toml"), format!("{name}.transcript.toml")] {
            std::fs::copy(examples.join(&file), dir.path().join(&file)).unwrap();
        }
    }
    // The writer's write needs approval, so the planner's child parks.
    let writer = std::fs::read_to_string(dir.path().join("writer.toml"))
        .unwrap()
        .replace("approval = { write_file = \"never\" }\n", "");
    std::fs::write(dir.path().join("writer.toml"), writer).unwrap();
    let store = "warden.db";
    let d = dir.path();
    let run = |args: &[&str]| warden(d, store).args(args).output().unwrap();

    // The demo: parks for its write, approved.
    let out = run(&[
        "run",
        "notes.toml",
        "Summarise my notes",
        "--run-id",
        "demo-1",
    ]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    ok(&run(&["runs", "approve", "demo-1", "call-3-1"]));
    // A fork of it before the write ran: asks again, approved.
    std::fs::remove_file(d.join("notes/SUMMARY.md")).unwrap();
    let events: Vec<Value> = String::from_utf8(run(&["--json", "runs", "events", "demo-1"]).stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let granted = events
        .iter()
        .find(|e| e["event"]["type"] == "approval_granted")
        .unwrap()["seq"]
        .as_u64()
        .unwrap();
    ok(&run(&[
        "runs",
        "fork",
        "demo-1",
        "--at",
        &granted.to_string(),
        "--run-id",
        "fork-1",
    ]));
    ok(&run(&["runs", "approve", "fork-1", "call-3-1"]));
    // The planner: its writer child waits for approval.
    let out = run(&["run", "planner.toml", "Plan the week", "--run-id", "plan-1"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    ok(&run(&["runs", "approve", "plan-1.call-2-1", "call-1-1"]));
    ok(&run(&["runs", "resume", "plan-1"]));

    // A run killed once its second step's tool call is printed, exported
    // as it was left, then recovered and finished.
    std::fs::remove_file(d.join("notes/SUMMARY.md")).unwrap();
    let mut child = warden(d, store)
        .args([
            "run",
            "notes.toml",
            "Summarise my notes",
            "--run-id",
            "crash-1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        if line.unwrap().contains("call-2-1") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let first = export(d, store, &collector, &[]);
    assert!(first > 0);
    let recovered = run(&["runs", "recover", "crash-1"]);
    assert!(
        matches!(recovered.status.code(), Some(0 | 4)),
        "{recovered:?}"
    );
    if recovered.status.code() == Some(4) {
        ok(&run(&["runs", "approve", "crash-1", "call-3-1"]));
    }
    let second = export(d, store, &collector, &[]);
    assert!(second > 0, "the recovered run's spans");
    // Nothing new: the store remembers how far the export got.
    assert_eq!(export(d, store, &collector, &[]), 0);

    let held = settled_spans(&collector, (first + second) as usize);
    assert_eq!(
        held.len() as u64,
        first + second,
        "every span sent arrived once"
    );
    let by_run =
        |run: &str| -> Vec<&Value> { held.values().filter(|s| run_of(s) == run).collect() };
    let named = |spans: &[&Value], prefix: &str| -> usize {
        spans
            .iter()
            .filter(|s| s["name"].as_str().unwrap().starts_with(prefix))
            .count()
    };

    // The demo: one root, its model calls with the GenAI attributes, its
    // tools with their effect class, the approval's wait; all in its trace,
    // under its run span.
    let demo_spans = by_run("demo-1");
    let roots: Vec<_> = demo_spans
        .iter()
        .filter(|s| s["parent_id"].is_null())
        .collect();
    assert_eq!(roots.len(), 1, "{demo_spans:#?}");
    let root = roots[0];
    assert_eq!(root["name"], "invoke_agent notes");
    let trace = root["context"]["trace_id"].as_str().unwrap();
    let root_id = root["context"]["span_id"].as_str().unwrap();
    for span in &demo_spans {
        assert_eq!(span["context"]["trace_id"], trace);
        if span["context"]["span_id"] != root_id {
            assert_eq!(span["parent_id"], root_id, "{span:#}");
        }
    }
    let chats: Vec<_> = demo_spans
        .iter()
        .filter(|s| s["name"] == "chat demo")
        .collect();
    assert_eq!(chats.len(), 4, "{demo_spans:#?}");
    for chat in &chats {
        assert_eq!(attr(chat, "gen_ai.system").unwrap(), "scripted", "{chat:#}");
        assert_eq!(attr(chat, "gen_ai.request.model").unwrap(), "demo");
        assert!(
            attr(chat, "gen_ai.usage.input_tokens").is_some(),
            "{chat:#}"
        );
        assert!(attr(chat, "gen_ai.usage.output_tokens").is_some());
        assert!(attr(chat, "gen_ai.response.finish_reasons").is_some());
    }
    let write = demo_spans
        .iter()
        .find(|s| s["name"] == "execute_tool fs__write_file")
        .expect("the write's span");
    assert_eq!(attr(write, "warden.effect").unwrap(), "write");
    assert!(attr(write, "warden.fuel_consumed").is_some());
    assert_eq!(named(&demo_spans, "await_approval fs__write_file"), 1);
    // No content by default.
    assert!(attr(root, "input.value").is_none(), "{root:#}");

    // The planner: its children's run spans hang under its tool calls, in
    // its trace; the writer child's approval wait is there too.
    let plan = by_run("plan-1");
    let plan_root = plan.iter().find(|s| s["parent_id"].is_null()).unwrap();
    let plan_trace = plan_root["context"]["trace_id"].as_str().unwrap();
    let writer_call = plan
        .iter()
        .find(|s| s["name"] == "execute_tool writer")
        .expect("the planner's call to the writer");
    let writer_root = by_run("plan-1.call-2-1")
        .into_iter()
        .find(|s| s["name"] == "invoke_agent writer")
        .expect("the writer's run span");
    assert_eq!(writer_root["context"]["trace_id"], plan_trace);
    assert_eq!(writer_root["parent_id"], writer_call["context"]["span_id"]);
    assert_eq!(
        named(&by_run("plan-1.call-2-1"), "await_approval fs__write_file"),
        1
    );
    assert_eq!(
        by_run("plan-1.call-1-1")
            .iter()
            .find(|s| s["name"] == "invoke_agent reader")
            .unwrap()["context"]["trace_id"],
        plan_trace
    );

    // The fork roots its own trace, names its source, and holds only what
    // it did after the fork point.
    let fork = by_run("fork-1");
    let fork_root = fork.iter().find(|s| s["parent_id"].is_null()).unwrap();
    assert_ne!(fork_root["context"]["trace_id"], trace);
    assert_eq!(attr(fork_root, "warden.fork.source_run").unwrap(), "demo-1");
    assert_eq!(named(&fork, "execute_tool fs__write_file"), 1);
    assert_eq!(named(&fork, "execute_tool fs__read_file"), 0, "{fork:#?}");

    // The crashed run, recovered: as many spans of each kind as the demo,
    // none twice.
    let crash = by_run("crash-1");
    let kinds = |spans: &[&Value]| -> BTreeMap<String, usize> {
        let mut kinds = BTreeMap::new();
        for s in spans {
            *kinds
                .entry(s["name"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        kinds
    };
    assert_eq!(kinds(&crash), kinds(&demo_spans));

    // A fresh cursor sends every span again, with the same ids: Phoenix
    // still holds each once.
    let again = export(d, store, &collector, &["--reader", "again"]);
    assert_eq!(again, first + second);
    std::thread::sleep(Duration::from_secs(3));
    let after = settled_spans(&collector, held.len());
    let ids = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(ids(&after), ids(&held));
}
