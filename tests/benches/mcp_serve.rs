//! Benchmark of `warden mcp serve` as a client meets it, printing figures:
//! one stdio session of the real binary, on a SQLite store, answering
//! `tools/call` of a read tool (`builtin:fs`'s `read_file`) many times in a
//! row. Each call is timed from its request written to its response read;
//! the figure is the median of the last 50 calls over the median of the
//! first 50, which is 1× when a call's cost does not grow with the
//! session (the target: ≤ 1.2×).
//!
//! `cargo bench -p warden-tests --bench mcp_serve` (or within `--bench
//! all`). `MCP_BENCH_CALLS` changes the number of calls (default 1,000;
//! at least 100).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "table.rs"]
mod table;
use crate::table::Row;

/// The target: the last calls' median over the first calls'.
const TARGET: f64 = 1.2;

/// Calls in each window compared.
const WINDOW: usize = 50;

fn warden_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warden-under-test"))
}

/// A served agent with one read-only `fs` plugin over `work/`.
fn agent(dir: &Path) {
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::write(dir.join("work/input.txt"), "the input file\n").unwrap();
    std::fs::write(
        dir.join("transcript.toml"),
        "[[turns]]\ntext = \"Served over MCP.\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("agent.toml"),
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
"#,
    )
    .unwrap();
}

/// A stdio MCP session with a served agent: newline-delimited JSON-RPC.
struct Session {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
}

impl Session {
    fn start(dir: &Path) -> Session {
        let mut child = Command::new(warden_binary())
            .current_dir(dir)
            .args(["mcp", "serve", "agent.toml"])
            .env("WARDEN_STORE", dir.join("mcp.db"))
            .env(
                "WARDEN_CACHE_DIR",
                std::env::temp_dir().join("warden-bench-components"),
            )
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut session = Session {
            child,
            input,
            output,
            next_id: 0,
        };
        session.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": { "name": "warden-bench", "version": "1" }
            }),
        );
        session.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        session
    }

    fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.input.write_all(&line).unwrap();
        self.input.flush().unwrap();
    }

    /// Sends a request and reads lines until its response.
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        loop {
            let mut line = String::new();
            let read = self.output.read_line(&mut line).unwrap();
            assert!(
                read > 0,
                "the server closed stdout before answering {method}"
            );
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // EOF ends the session; its run completes and the server exits.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn main() {
    run();
}

/// Measures and prints; returns the figures for the table.
pub(crate) fn run() -> Vec<Row> {
    let calls: usize = std::env::var("MCP_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
        .max(2 * WINDOW);
    let dir = tempfile::tempdir().unwrap();
    agent(dir.path());
    let mut session = Session::start(dir.path());
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let began = Instant::now();
        let result = session.request(
            "tools/call",
            json!({ "name": "files__read_file", "arguments": { "path": "input.txt" } }),
        );
        times.push(began.elapsed());
        assert_ne!(result["isError"], true, "{result}");
    }
    drop(session);
    let first = median(&times[..WINDOW]);
    let last = median(&times[calls - WINDOW..]);
    let ratio = last.as_secs_f64() / first.as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "mcp serve (stdio, sqlite): tools/call median of calls 1–{WINDOW} {:.2} ms, {}–{calls} {:.2} ms: {ratio:.2}× (target ≤ {TARGET}×)",
        ms(first),
        calls - WINDOW + 1,
        ms(last),
    );
    for at in [10, 100, calls / 2, calls] {
        println!("  call {at}: {:.2} ms", ms(times[at - 1]));
    }
    vec![Row::new(
        "mcp_serve",
        format!(
            "MCP tools/call over stdio, calls {}–{calls} vs 1–{WINDOW}",
            calls - WINDOW + 1
        ),
        format!("{ratio:.2}× ({:.2} ms vs {:.2} ms)", ms(last), ms(first)),
        format!("≤ {TARGET}× (flat in the session's length)"),
        Some(ratio <= TARGET),
    )]
}
