//! End-to-end tests of the `warden` binary: each runs the real executable and
//! checks its output and exit code, including bad input (each error is one
//! clear line naming the file, key, tool or value).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn warden(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .current_dir(cwd)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A workspace directory with one file.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hello from the host\n").unwrap();
    dir
}

#[test]
fn inspect_a_builtin_plugin() {
    let dir = workspace();
    let out = warden(&["plugin", "inspect", "builtin:fs"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "plugin fs",
        "(tool)",
        "warden:plugin/tool@0.1.0",
        "mount workspace (/workspace, read-write)",
        "read_file [read]",
        "write_file [write]",
        "limits:",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    assert!(!text.contains("wasi:sockets"), "{text}");

    let out = warden(&["plugin", "inspect", "builtin:fs", "--json"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["name"], "fs");
    assert_eq!(json["requests"]["mounts"][0]["name"], "workspace");
    let tools = json["tools"].as_array().unwrap();
    let edit = tools.iter().find(|t| t["name"] == "edit_file").unwrap();
    assert_eq!(edit["effect"], "write");
    assert_eq!(edit["input_schema"]["type"], "object");
}

#[test]
fn inspect_a_component_file() {
    let dir = workspace();
    let wasm = dir.path().join("fs.wasm");
    std::fs::write(&wasm, warden::plugins::builtin::find("fs").unwrap().wasm).unwrap();
    let out = warden(&["plugin", "inspect", "fs.wasm"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("plugin fs (tool)"), "{text}");
    assert!(text.contains("wasi:filesystem/preopens"), "{text}");
    assert!(text.contains("read_file [read]"), "{text}");
}

#[test]
fn call_a_tool_and_print_output_and_receipt() {
    let dir = workspace();
    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "read_file",
            r#"{"path":"hello.txt"}"#,
            "--mount",
            "workspace=.:ro",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["content"], "hello from the host\n");
    let receipt = stderr(&out);
    assert!(receipt.contains("read_file [read] ok"), "{receipt}");
    assert!(receipt.contains("fuel"), "{receipt}");

    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "list_dir",
            "--mount",
            "workspace=.:ro",
            "--json",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["effect"], "read");
    assert_eq!(json["receipt"]["outcome"], "ok");
    assert!(json["receipt"]["fuel_consumed"].as_u64().unwrap() > 0);
    assert_eq!(json["output"]["entries"][0]["name"], "hello.txt");
}

#[test]
fn preflight_shows_a_diff_and_changes_nothing() {
    let dir = workspace();
    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "edit_file",
            r#"{"path":"hello.txt","old":"hello","new":"goodbye"}"#,
            "--mount",
            "workspace=.",
            "--preflight",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("-hello from the host"), "{text}");
    assert!(text.contains("+goodbye from the host"), "{text}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("hello.txt")).unwrap(),
        "hello from the host\n"
    );
}

#[test]
fn a_tool_error_exits_1_and_a_limit_exits_3() {
    let dir = workspace();
    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "read_file",
            r#"{"path":"../outside"}"#,
            "--mount",
            "workspace=.:ro",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("tool error: denied"),
        "{}",
        stderr(&out)
    );

    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "write_file",
            r#"{"path":"new.txt","content":"x"}"#,
            "--mount",
            "workspace=.:ro",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!dir.path().join("new.txt").exists());

    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "list_dir",
            "--mount",
            "workspace=.:ro",
            "--fuel",
            "1000",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ran out of fuel (limit 1000)"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("out_of_fuel"), "{}", stderr(&out));
}

/// Bad input: one line on stderr naming what was wrong, exit code 2.
#[test]
fn bad_input_is_one_clear_line_and_exit_2() {
    let dir = workspace();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "format_disk",
                "{}",
                "--mount",
                "workspace=.",
            ],
            "has no tool `format_disk`",
        ),
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "{}",
                "--mount",
                "home=.",
            ],
            "grant for mount `home`, which the plugin does not request",
        ),
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "{}",
                "--mount",
                "workspace=./missing",
            ],
            "missing",
        ),
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "{not json",
                "--mount",
                "workspace=.",
            ],
            "not valid JSON",
        ),
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "[1]",
                "--mount",
                "workspace=.",
            ],
            "must be a JSON object",
        ),
        (
            &["plugin", "call", "builtin:nope", "list_dir"],
            "no built-in plugin `nope`",
        ),
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "{}",
                "--env",
                "HOME",
            ],
            "environment variable `HOME`, which the plugin does not request",
        ),
        (
            &[
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "{}",
                "--timeout",
                "10",
            ],
            "needs a unit",
        ),
        (&["plugin", "inspect", "missing.toml"], "missing.toml"),
    ];
    for (args, expected) in cases {
        let out = warden(args, dir.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?}: expected `{expected}` in: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
}

#[test]
fn a_plugin_on_disk_is_pinned_by_its_manifest() {
    let dir = workspace();
    let builtin = warden::plugins::builtin::find("fs").unwrap();
    std::fs::write(dir.path().join("fs.wasm"), builtin.wasm).unwrap();
    let manifest = |sha: &str| {
        format!(
            "name = \"fs\"\nversion = \"0.1.0\"\nkind = \"tool\"\ncomponent = \"fs.wasm\"\nsha256 = \"{sha}\"\n[mounts.workspace]\naccess = \"read-write\"\n"
        )
    };
    std::fs::write(dir.path().join("plugin.toml"), manifest(builtin.sha256)).unwrap();
    let out = warden(
        &[
            "plugin",
            "call",
            "plugin.toml",
            "list_dir",
            "{}",
            "--mount",
            "workspace=.:ro",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));

    std::fs::write(dir.path().join("plugin.toml"), manifest(&"ab".repeat(32))).unwrap();
    let out = warden(
        &[
            "plugin",
            "call",
            "plugin.toml",
            "list_dir",
            "{}",
            "--mount",
            "workspace=.:ro",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("but the manifest pins abab"),
        "{}",
        stderr(&out)
    );

    std::fs::write(
        dir.path().join("plugin.toml"),
        "name = \"fs\"\nversion = \"1\"\nkind = \"tool\"\nsurprise = true\n",
    )
    .unwrap();
    let out = warden(&["plugin", "inspect", "plugin.toml"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("plugin.toml"), "{}", stderr(&out));
    assert!(stderr(&out).contains("surprise"), "{}", stderr(&out));
}

/// A one-route HTTP server on loopback in a thread: every request gets
/// `200 hello`. Returns its port.
fn hello_server() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
            );
        }
    });
    port
}

#[test]
fn the_http_plugin_reaches_only_an_allowed_host() {
    let dir = workspace();
    let port = hello_server();
    let args = format!(r#"{{"url": "http://127.0.0.1:{port}/"}}"#);
    let grant = format!("127.0.0.1:{port}");
    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:http",
            "http_get",
            &args,
            "--allow-host",
            &grant,
            "--json",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["output"]["status"], 200);
    assert_eq!(json["output"]["body"], "hello");
    assert_eq!(json["receipt"]["network"]["hosts"][0], grant.as_str());

    let out = warden(
        &["plugin", "call", "builtin:http", "http_get", &args],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("denied: request to `{grant}` denied")),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("1 denied"), "{}", stderr(&out));
}

#[test]
fn context_sources_resolve_and_channels_deliver_from_the_shell() {
    let dir = workspace();
    let out = warden(
        &[
            "plugin",
            "resolve",
            "builtin:files-context",
            r#"{"paths": ["*.txt"]}"#,
            "--mount",
            "files=.",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let items: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(items[0]["source"], "hello.txt");
    assert_eq!(items[0]["content"], "hello from the host\n");
    assert!(
        stderr(&out).contains("── resolve [read] ok"),
        "{}",
        stderr(&out)
    );

    let out = warden(
        &[
            "plugin",
            "deliver",
            "builtin:jsonl-channel",
            "completed",
            r#"{"summary": "done"}"#,
            "--mount",
            "outbox=.",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let line = std::fs::read_to_string(dir.path().join("deliveries.jsonl")).unwrap();
    assert!(line.contains(r#""summary":"done""#), "{line}");

    let out = warden(
        &[
            "plugin",
            "deliver",
            "builtin:jsonl-channel",
            "completed",
            "{}",
            "--mount",
            "outbox=.:ro",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("delivery error: denied"),
        "{}",
        stderr(&out)
    );
}

/// A copy of the notes demo agent in a fresh directory.
fn demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for file in ["notes.toml", "notes.transcript.toml"] {
        std::fs::copy(examples.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("notes")).unwrap();
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

#[test]
fn run_parks_for_approval_and_runs_approve_finishes_it() {
    let dir = demo();
    let out = warden(
        &[
            "run",
            "notes.toml",
            "Summarise my notes",
            "--run-id",
            "demo-1",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("→ call-1-1 fs__list_dir [read]"), "{text}");
    assert!(
        text.contains("needs approval: create `SUMMARY.md`"),
        "{text}"
    );
    assert!(text.contains("run demo-1: awaiting_approval"), "{text}");
    assert!(
        text.contains("warden runs approve demo-1 call-3-1"),
        "{text}"
    );
    assert!(!dir.path().join("notes/SUMMARY.md").exists());

    let out = warden(
        &["runs", "approve", "demo-1", "call-3-1", "--by", "tester"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run demo-1: completed"),
        "{}",
        stdout(&out)
    );
    assert!(dir.path().join("notes/SUMMARY.md").exists());

    let out = warden(&["runs", "list", "--json"], dir.path());
    let runs: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(runs[0]["run_id"], "demo-1");
    assert_eq!(runs[0]["status"], "completed");
    let out = warden(
        &["runs", "list", "--status", "awaiting_approval", "--json"],
        dir.path(),
    );
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&out)).unwrap(),
        serde_json::json!([])
    );

    let out = warden(&["runs", "events", "demo-1"], dir.path());
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["event"]["type"], "run_started");
    assert_eq!(lines.last().unwrap()["event"]["type"], "run_completed");
    assert!(
        lines
            .iter()
            .any(|l| l["event"]["type"] == "approval_granted" && l["event"]["by"] == "tester")
    );

    let out = warden(&["runs", "show", "demo-1"], dir.path());
    assert!(
        stdout(&out).contains("✓ call-3-1 approved by tester"),
        "{}",
        stdout(&out)
    );
    let out = warden(&["runs", "verify"], dir.path());
    assert!(out.status.success());
    assert!(stdout(&out).contains("demo-1: intact"), "{}", stdout(&out));
}

#[test]
fn run_json_prints_one_event_per_line_and_a_final_status() {
    let dir = demo();
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "j", "--json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(lines.last().unwrap()["status"], "awaiting_approval");
    let out = warden(
        &["runs", "deny", "j", "call-3-1", "--reason", "no", "--json"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!dir.path().join("notes/SUMMARY.md").exists());
}

/// Bad input to `warden run` and `warden runs`: one line naming what was
/// wrong, exit 2, nothing recorded.
#[test]
fn run_verbs_refuse_bad_input_and_record_nothing() {
    let dir = demo();
    std::fs::write(
        dir.path().join("bad.toml"),
        "name = \"x\"\ninstructions = \"\"\nsurprise = 1\n",
    )
    .unwrap();
    let unknown_tool = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace(
            "[plugins.fs.grant.tools.search]",
            "[plugins.fs.grant.tools.format_disk]",
        );
    std::fs::write(dir.path().join("unknown-tool.toml"), unknown_tool).unwrap();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "done"], dir.path());
    assert_eq!(out.status.code(), Some(4));
    let ok = warden(&["runs", "approve", "done", "call-3-1"], dir.path());
    assert!(ok.status.success());
    let parked = warden(
        &["run", "notes.toml", "go", "--run-id", "parked"],
        dir.path(),
    );
    assert_eq!(parked.status.code(), Some(4));

    let cases: &[(&[&str], &str)] = &[
        (&["run", "bad.toml", "go"], "surprise"),
        (&["run", "missing.toml", "go"], "missing.toml"),
        (&["run", "unknown-tool.toml", "go"], "format_disk"),
        (&["runs", "show", "nope"], "nope"),
        (
            &["runs", "approve", "nope", "call-1-1"],
            "unknown run `nope`",
        ),
        (
            &["runs", "approve", "done", "call-3-1"],
            "run `done` is already completed",
        ),
        (
            &["runs", "resolve", "parked", "--output", "{}"],
            "run `parked` is awaiting_approval: there is no write to resolve",
        ),
        (
            &["runs", "approve", "parked", "call-9-9"],
            "call `call-9-9` is not awaiting approval (awaiting: call-3-1)",
        ),
        (
            &["runs", "resume", "parked", "--input", "{}"],
            "run `parked` is awaiting approval of call-3-1: approve with: warden runs approve parked call-3-1",
        ),
        (&["runs", "cancel", "done"], "already completed"),
        (
            &["run", "notes.toml", "go", "--run-id", "done"],
            "run `done` already exists",
        ),
        (
            &["run", "notes.toml", "go", "--label", "novalue"],
            "--label `novalue`",
        ),
    ];
    for (args, expected) in cases {
        let out = warden(args, dir.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?}: expected `{expected}` in: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    let out = warden(&["runs", "list", "--json"], dir.path());
    let runs: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let statuses: Vec<(&str, &str)> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["run_id"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [("done", "completed"), ("parked", "awaiting_approval")],
        "only the good runs were recorded, and the refusals changed nothing"
    );
    let out = warden(&["runs", "events", "parked"], dir.path());
    let last: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last["event"]["type"], "approval_requested");
}

/// On a terminal, `warden run` asks for approval and goes on with the
/// answer. The terminal comes from util-linux `script`.
#[test]
fn on_a_terminal_run_asks_for_approval_and_continues() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIPPED: util-linux `script` is not installed, so no terminal can be faked");
        return;
    }
    let dir = demo();
    let command = format!(
        "{} run notes.toml 'Summarise my notes' --run-id tty",
        env!("CARGO_BIN_EXE_warden")
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path())
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env("USER", "terminal-user")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        // The answer waits in the terminal's input until the prompt reads it.
        stdin.write_all(b"y\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    assert!(text.contains("approve call-3-1?"), "{text}");
    assert!(text.contains("approved by terminal-user"), "{text}");
    assert!(text.contains("run tty: completed"), "{text}");
    assert!(dir.path().join("notes/SUMMARY.md").exists());
}
