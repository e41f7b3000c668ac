//! End-to-end tests of the `warden` binary: each runs the real executable and
//! checks its output and exit code, including bad input (each error is one
//! clear line naming the file, key, tool or value).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{demo, json_out, stderr, stdout, warden};
use serde_json::Value;

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

/// A manifest naming a component outside its directory (`../fs.wasm`, here
/// a real, correctly pinned component) is refused with `component_refused`,
/// the path and how to allow it; the operator's grant naming that file lets
/// it load.
#[test]
fn a_component_outside_its_plugin_directory_is_refused_until_the_grant_names_it() {
    let dir = workspace();
    let builtin = warden::plugins::builtin::find("fs").unwrap();
    std::fs::write(dir.path().join("fs.wasm"), builtin.wasm).unwrap();
    std::fs::create_dir(dir.path().join("plugin")).unwrap();
    std::fs::write(
        dir.path().join("plugin/plugin.toml"),
        format!(
            "name = \"fs\"\nversion = \"0.1.0\"\nkind = \"tool\"\ncomponent = \"../fs.wasm\"\nsha256 = \"{}\"\n[mounts.workspace]\naccess = \"read-write\"\n",
            builtin.sha256
        ),
    )
    .unwrap();
    let call = [
        "plugin",
        "call",
        "plugin/plugin.toml",
        "list_dir",
        "{}",
        "--mount",
        "workspace=.:ro",
    ];
    let details = assert_refused(
        dir.path(),
        &call,
        "component_refused",
        "component `plugin/../fs.wasm` is outside the plugin's directory",
    );
    assert_eq!(details["file"], "plugin/../fs.wasm", "{details}");
    let out = warden(&call, dir.path());
    let canonical = std::fs::canonicalize(dir.path().join("fs.wasm")).unwrap();
    assert!(
        stderr(&out).contains(&format!(
            "naming it in the plugin's grant as `component = \"{}\"`",
            canonical.display()
        )),
        "{}",
        stderr(&out)
    );
    // The grant names the file: it loads and answers.
    std::fs::write(dir.path().join("grant.toml"), "component = \"fs.wasm\"\n").unwrap();
    let mut granted = call.to_vec();
    granted.extend(["--grant", "grant.toml"]);
    let out = warden(&granted, dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("fs.wasm"), "{}", stdout(&out));
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
        text.contains("? call-3-1 fs__write_file [write] digest ")
            && text.contains("┆ create `SUMMARY.md`"),
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
    // The run completed, then its channel delivered the output.
    let types: Vec<&str> = lines
        .iter()
        .map(|l| l["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types[types.len() - 3..],
        ["run_completed", "delivery_intent", "delivery_completed"]
    );
    let completed_at = lines.len() - 3;
    let delivery_id = format!("demo-1/results/{completed_at}");
    assert_eq!(lines[completed_at + 1]["event"]["delivery_id"], delivery_id);
    // The quick start's JSONL line: the final output, with the stable id.
    let text = std::fs::read_to_string(dir.path().join("out/deliveries.jsonl")).unwrap();
    let delivered: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(delivered.len(), 1, "{text}");
    assert_eq!(delivered[0]["id"], delivery_id);
    assert_eq!(delivered[0]["run_id"], "demo-1");
    assert_eq!(delivered[0]["kind"], "completed");
    assert_eq!(delivered[0]["payload"]["agent"], "notes");
    assert_eq!(
        delivered[0]["payload"]["event"]["output"],
        "I wrote SUMMARY.md: the folder holds one todo list with three open items."
    );
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
    assert!(
        stdout(&out).contains(&format!("✉ delivered {delivery_id} (attempt 1, ok · fuel ")),
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
    // Not a terminal: no progress, no logs; stdout is only JSON.
    assert_eq!(stderr(&out), "");
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
    let notes = std::fs::read_to_string(dir.path().join("notes.toml")).unwrap();
    for (file, plugin) in [
        ("tool-as-source.toml", "fs"),
        ("no-such-source.toml", "wiki"),
    ] {
        std::fs::write(
            dir.path().join(file),
            notes.replace(
                "plugin = \"notes-files\"",
                &format!("plugin = \"{plugin}\""),
            ),
        )
        .unwrap();
    }
    std::fs::write(
        dir.path().join("tool-as-channel.toml"),
        notes.replace("plugin = \"outbox\"", "plugin = \"fs\""),
    )
    .unwrap();
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
        (
            &["run", "tool-as-source.toml", "go"],
            "key `context.notes.plugin`: plugin `fs` (builtin:fs) is not a context source",
        ),
        (
            &["run", "tool-as-channel.toml", "go"],
            "key `channels.results.plugin`: plugin `fs` (builtin:fs) is not a channel",
        ),
        (
            &["run", "no-such-source.toml", "go"],
            "key `context.notes.plugin`: `wiki` is not a plugin of this agent (its [plugins]: fs, notes-files, outbox)",
        ),
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
    assert!(
        Command::new("script").arg("--version").output().is_ok(),
        "this test fakes a terminal with util-linux `script`: install it (Debian: bsdutils)"
    );
    let dir = demo();
    let command = format!(
        "{} run notes.toml 'Summarise my notes' --run-id tty",
        env!("CARGO_BIN_EXE_warden")
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path())
        // A cache of its own: the component is compiled, with a spinner.
        .env("WARDEN_CACHE_DIR", dir.path().join("cache"))
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
    assert!(
        text.contains("approve call-3-1 fs__write_file [write] digest "),
        "{text}"
    );
    assert!(text.contains("approved by terminal-user"), "{text}");
    assert!(text.contains("run tty: completed"), "{text}");
    assert!(dir.path().join("notes/SUMMARY.md").exists());
    // Progress, on the terminal only.
    assert!(
        text.contains("compiling plugin `fs` (first use; cached afterwards)"),
        "{text}"
    );
    assert!(text.contains("step 1: waiting for the model"), "{text}");
}

/// Runs the binary with extra environment variables.
fn warden_env(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden"));
    cmd.args(args)
        .current_dir(cwd)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_STORE")
        .env_remove("WARDEN_CONFIG")
        .env_remove("WARDEN_LABELS")
        .env_remove("WARDEN_RECORD_PROMPTS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The JSON document a `--json` command printed.
/// Asserts that `args` fails with exit 2, one line on stderr containing
/// `message`, and, with `--json`, the envelope with `code` on stdout.
fn assert_refused(dir: &Path, args: &[&str], code: &str, message: &str) -> Value {
    let out = warden(args, dir);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(message),
        "{args:?}: expected `{message}` in: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let out = warden(&with_json, dir);
    assert_eq!(out.status.code(), Some(2), "{with_json:?}");
    assert!(stderr(&out).is_empty(), "{with_json:?}: {}", stderr(&out));
    let envelope = json_out(&out);
    assert_eq!(envelope["error"]["code"], code, "{with_json:?}: {envelope}");
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains(message),
        "{envelope}"
    );
    envelope["error"]["details"].clone()
}

/// The ids and statuses `runs list` shows.
fn run_statuses(dir: &Path) -> Vec<(String, String)> {
    let runs = json_out(&warden(&["runs", "list", "--json"], dir));
    runs.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_owned(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The demo with one completed run (`done`) and one parked for approval
/// (`parked`).
fn demo_with_runs() -> tempfile::TempDir {
    let dir = demo();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "done"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&["runs", "approve", "done", "call-3-1"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_file(dir.path().join("notes/SUMMARY.md")).unwrap();
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "parked"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    dir
}

#[test]
fn errors_in_json_mode_are_envelopes_with_stable_codes_and_evidence() {
    let dir = demo_with_runs();
    let unrequested = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace(
            "[plugins.fs.grant.mounts.workspace]",
            "[plugins.fs.grant.mounts.home]",
        );
    std::fs::write(dir.path().join("unrequested.toml"), unrequested).unwrap();
    std::fs::write(dir.path().join("bad.toml"), "name = \"x\"\nsurprise = 1\n").unwrap();

    let details = assert_refused(dir.path(), &["runs", "show", "nope"], "unknown_run", "nope");
    assert_eq!(details["run_id"], "nope");
    let details = assert_refused(
        dir.path(),
        &["runs", "approve", "done", "call-3-1"],
        "run_terminal",
        "run `done` is already completed",
    );
    assert_eq!(details["status"], "completed");
    let details = assert_refused(
        dir.path(),
        &["runs", "resolve", "parked", "--output", "{}"],
        "nothing_to_resolve",
        "run `parked` is awaiting_approval: there is no write to resolve",
    );
    assert_eq!(details["status"], "awaiting_approval");
    let details = assert_refused(
        dir.path(),
        &["runs", "approve", "parked", "call-9-9"],
        "not_awaiting_approval",
        "call `call-9-9` is not awaiting approval (awaiting: call-3-1)",
    );
    assert_eq!(details["awaiting"], "call-3-1");
    let details = assert_refused(
        dir.path(),
        &["run", "bad.toml", "go"],
        "agent_invalid",
        "unknown field `surprise`",
    );
    assert!(details["file"].as_str().unwrap().ends_with("bad.toml"));
    let details = assert_refused(
        dir.path(),
        &["run", "unrequested.toml", "go"],
        "grant_not_requested",
        "grant for mount `home`, which the plugin does not request",
    );
    assert_eq!(details["mount"], "home");
    let details = assert_refused(
        dir.path(),
        &[
            "plugin",
            "call",
            "builtin:fs",
            "list_dir",
            "--mount",
            "home=.",
        ],
        "grant_not_requested",
        "grant for mount `home`",
    );
    assert_eq!(details["plugin"], "fs");
    assert_refused(
        dir.path(),
        &["runs", "show", "a/b"],
        "invalid_run_id",
        "`a/b` is not a valid run id",
    );

    // A usage error clap finds is an envelope too.
    let out = warden(&["runs", "list", "--bogus", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_out(&out)["error"]["code"], "usage");

    // Nothing the refusals touched changed.
    assert_eq!(
        run_statuses(dir.path()),
        [
            ("done".to_owned(), "completed".to_owned()),
            ("parked".to_owned(), "awaiting_approval".to_owned())
        ]
    );
}

#[test]
fn warden_toml_sets_store_labels_default_model_and_grants_under_env_and_flags() {
    let dir = demo();
    // An agent with neither a model nor a grant: both come from warden.toml.
    std::fs::write(
        dir.path().join("bare.toml"),
        "name = \"bare\"\ninstructions = \"Tidy the notes.\"\n[plugins.fs]\nsource = \"builtin:fs\"\n[plugins.fs.grant.tools.read_file]\neffect = \"read\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("warden.toml"),
        r#"store = "runs/warden.db"
[labels]
team = "ops"
[defaults.model]
provider = "scripted"
name = "demo"
transcript = "notes.transcript.toml"
[grants.fs.mounts.workspace]
dir = "notes"
[grants.fs.tools.list_dir]
effect = "read"
[grants.hook.config]
url = "https://hooks.example.com/x"
api_token = "sk-live-do-not-print"
"#,
    )
    .unwrap();

    // `bare` grants fs nothing inline, so the configured grant applies; an
    // inline grant would win whole.
    // Its inline grant holds no mount, so fs cannot write: `write_file` is
    // not offered, the demo's call to it is refused, and the run completes.
    let out = warden(&["run", "bare.toml", "go", "--run-id", "b1"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("rejected: there is no tool `fs__write_file`"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("→ call-1-1 fs__list_dir [read]"),
        "{}",
        stdout(&out)
    );
    assert!(dir.path().join("runs/warden.db").is_file());
    assert!(!dir.path().join(".warden").exists());
    let runs = json_out(&warden(&["runs", "list", "--json"], dir.path()));
    assert_eq!(runs[0]["labels"]["team"], "ops");

    // The environment beats the file; a flag beats the environment.
    let env = [
        ("WARDEN_STORE", "env.db"),
        ("WARDEN_LABELS", "team=sre,zone=a"),
    ];
    let out = warden_env(
        &["run", "bare.toml", "go", "--run-id", "b2"],
        dir.path(),
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let runs = json_out(&warden_env(&["runs", "list", "--json"], dir.path(), &env));
    assert_eq!(runs[0]["run_id"], "b2");
    assert_eq!(runs[0]["labels"]["team"], "sre");
    let out = warden_env(
        &["runs", "list", "--json", "--store", "runs/warden.db"],
        dir.path(),
        &env,
    );
    assert_eq!(json_out(&out)[0]["run_id"], "b1");

    // config show: every setting with its source, secrets masked.
    let out = warden_env(
        &["config", "show"],
        dir.path(),
        &[("WARDEN_RECORD_PROMPTS", "1")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "store = \"sqlite:",
        "runs/warden.db\"    # file",
        "record_prompts = true    # env WARDEN_RECORD_PROMPTS",
        "[defaults.model]",
        "[grants.fs]",
        "api_token = \"***\"",
        "team = \"ops\"",
        // Every table in force, defaults included (issue 42, item 3).
        "[ceilings]",
        "fuel = 100000000000",
        "[serve]",
        "header_timeout = \"10s\"",
        "max_unauthenticated_connections = 256",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    assert!(!text.contains("sk-live-do-not-print"), "{text}");
    let out = warden(&["config", "show", "--json", "--store", "x.db"], dir.path());
    let shown = json_out(&out);
    assert_eq!(shown["store"]["source"], "flag --store");
    assert_eq!(shown["grants"]["hook"]["config"]["api_token"], "***");
    assert_eq!(shown["serve"]["max_connections"], 1024);
    assert_eq!(shown["ceilings"]["http_requests"], 256);
    assert!(!stdout(&out).contains("sk-live-do-not-print"));

    // A bad file is one line naming the file and the key; nothing recorded.
    std::fs::write(
        dir.path().join("warden.toml"),
        "store = \"runs/warden.db\"\n[grants.fs.limits]\ntimeout = \"0s\"\n",
    )
    .unwrap();
    let details = assert_refused(
        dir.path(),
        &["run", "bare.toml", "go", "--run-id", "b3"],
        "config_invalid",
        "key `grants.fs.limits.timeout`: must be more than zero",
    );
    assert_eq!(details["key"], "grants.fs.limits.timeout");
    std::fs::write(dir.path().join("warden.toml"), "stroe = \"x.db\"\n").unwrap();
    let err = stderr(&warden(&["runs", "list"], dir.path()));
    assert!(
        err.contains("warden.toml") && err.contains("unknown field `stroe`"),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("warden.toml")).unwrap();
    let out = warden(
        &["runs", "list", "--json", "--store", "runs/warden.db"],
        dir.path(),
    );
    assert_eq!(
        json_out(&out).as_array().unwrap().len(),
        1,
        "b3 was not recorded"
    );
}

#[test]
fn agent_validate_reports_every_file_and_hash_prints_the_recorded_digest() {
    let dir = demo();
    let notes = std::fs::read_to_string(dir.path().join("notes.toml")).unwrap();
    std::fs::write(dir.path().join("bad.toml"), "name = \"x\"\n[model\n").unwrap();
    std::fs::write(
        dir.path().join("unknown-tool.toml"),
        notes.replace(
            "[plugins.fs.grant.tools.search]",
            "[plugins.fs.grant.tools.format_disk]",
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("unrequested.toml"),
        notes.replace(
            "[plugins.fs.grant.mounts.workspace]",
            "[plugins.fs.grant.mounts.home]",
        ),
    )
    .unwrap();
    let files = [
        "notes.toml",
        "bad.toml",
        "unknown-tool.toml",
        "unrequested.toml",
        "missing.toml",
    ];
    let mut args = vec!["agent", "validate"];
    args.extend(files);
    let out = warden(&args, dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), files.len(), "{text}");
    assert!(
        lines[0].starts_with("ok     notes.toml: agent `notes`, 5 tool(s)")
            && lines[0].ends_with("; 1 channel(s): results"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("error  bad.toml: agent `") && lines[1].contains("line 2"),
        "{text}"
    );
    assert!(lines[2].contains("format_disk"), "{text}");
    assert!(lines[3].contains("grant for mount `home`"), "{text}");
    assert!(lines[4].contains("missing.toml"), "{text}");
    assert!(stderr(&out).contains("4 of 5 agent file(s) failed validation"));

    args.push("--json");
    let report = json_out(&warden(&args, dir.path()));
    let codes: Vec<&str> = report
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["error"]["code"].as_str().unwrap_or("ok"))
        .collect();
    assert_eq!(
        codes,
        [
            "ok",
            "agent_invalid",
            "tool_spec_invalid",
            "grant_not_requested",
            "agent_unreadable"
        ]
    );
    assert_eq!(report[0]["tools"][0], "fs__edit_file");

    let out = warden(&["agent", "hash", "notes.toml", "--json"], dir.path());
    let digest = json_out(&out)["digest"].as_str().unwrap().to_owned();
    assert_eq!(digest.len(), 64);
    let out = warden(&["run", "notes.toml", "go", "--run-id", "h"], dir.path());
    assert_eq!(out.status.code(), Some(4));
    let events = stdout(&warden(&["runs", "events", "h"], dir.path()));
    let first: Value = serde_json::from_str(events.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"]["agent_digest"], digest.as_str());
    let out = warden(&["agent", "hash", "notes.toml"], dir.path());
    assert_eq!(stdout(&out), format!("{digest}  notes.toml\n"));
}

#[test]
fn runs_list_filters_groups_and_flags_stalled_runs() {
    let dir = demo_with_runs();
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            "detached",
            "--detach",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(
        json_out(&out),
        serde_json::json!({"v": 1, "run_id": "detached", "status": "queued",
            "next": [{"action": "resume", "command": "warden runs resume detached"}]})
    );

    let grouped = json_out(&warden(&["runs", "list", "--group", "--json"], dir.path()));
    let ids = |group: &str| -> Vec<String> {
        grouped[group]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids("waiting"), ["parked"]);
    assert_eq!(ids("in_progress"), ["detached"]);
    assert_eq!(ids("terminal"), ["done"]);
    assert_eq!(grouped["in_progress"][0]["stalled"], false);

    // Recorded for a driver, the detached run is queued, never stalled.
    let out = warden(&["runs", "list", "--stalled-after", "0s"], dir.path());
    let text = stdout(&out);
    assert!(text.contains("queued"), "{text}");
    assert!(!text.contains("stalled"), "{text}");
    let out = warden(&["runs", "list", "--group"], dir.path());
    let text = stdout(&out);
    for heading in [
        "waiting for a human or a time (1)",
        "in progress (1)",
        "terminal (1)",
    ] {
        assert!(text.contains(heading), "{text}");
    }

    let count = |args: &[&str]| {
        json_out(&warden(args, dir.path()))
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count(&["runs", "list", "--since", "1h", "--json"]), 3);
    assert_eq!(
        count(&["runs", "list", "--since", "2999-01-01", "--json"]),
        0
    );
    assert_eq!(
        count(&["runs", "list", "--status", "completed", "--json"]),
        1
    );
    assert_eq!(
        count(&["runs", "list", "--label", "example=notes", "--json"]),
        3
    );
    assert_eq!(count(&["runs", "list", "--agent", "other", "--json"]), 0);
    assert_refused(
        dir.path(),
        &["runs", "list", "--since", "yesterday"],
        "usage",
        "--since `yesterday`",
    );
    assert_refused(
        dir.path(),
        &["runs", "list", "--status", "sleeping"],
        "usage",
        "--status `sleeping`: not a status",
    );
}

#[test]
fn runs_show_is_a_timeline_with_budget_use_and_the_next_step() {
    let dir = demo_with_runs();
    let out = warden(&["runs", "show", "done"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("run done · agent notes · completed · example=notes"),
        "{text}"
    );
    assert!(text.contains("→ call-2-1 fs__read_file [read]"), "{text}");
    assert!(text.contains("✓ call-3-1 approved by"), "{text}");
    assert!(text.contains("budget: steps 4 of 10"), "{text}");
    assert!(text.contains("tool calls 3 of 20"), "{text}");
    assert!(text.contains("wall time"), "{text}");
    assert!(text.lines().nth(1).unwrap().contains("+0."), "{text}");

    let out = warden(&["runs", "show", "parked"], dir.path());
    let text = stdout(&out);
    assert!(text.contains("status: awaiting_approval"), "{text}");
    assert!(
        text.contains("approve with: warden runs approve parked call-3-1"),
        "{text}"
    );

    let shown = json_out(&warden(&["runs", "show", "done", "--json"], dir.path()));
    assert_eq!(shown["status"], "completed");
    assert_eq!(
        shown["budget"]["steps"],
        serde_json::json!({"used": 4, "limit": 10})
    );
    assert_eq!(shown["budget"]["tool_calls"]["used"], 3);
    assert_eq!(shown["events"][0]["event"]["type"], "run_started");
    assert_eq!(shown["limits_known"], true);
}

#[test]
fn run_and_resume_read_input_from_a_file() {
    let dir = demo();
    std::fs::write(dir.path().join("request.json"), r#"{"task": "summarise"}"#).unwrap();
    let out = warden(
        &[
            "run",
            "notes.toml",
            "--input",
            "@request.json",
            "--run-id",
            "f",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let shown = json_out(&warden(&["runs", "show", "f", "--json"], dir.path()));
    assert_eq!(shown["input"], serde_json::json!({"task": "summarise"}));
    assert_refused(
        dir.path(),
        &["run", "notes.toml", "--input", "@missing.json"],
        "input_unreadable",
        "cannot read input file `missing.json`",
    );
}

/// An agent whose model asks the operator a question and finishes with the
/// answer.
fn asking_agent(dir: &Path) {
    std::fs::write(
        dir.join("ask.toml"),
        r#"name = "ask"
instructions = "Ask, then answer."
[model]
provider = "scripted"
name = "demo"
transcript = "ask.transcript.toml"
[human_tools.ask_operator]
description = "Ask the operator"
response_schema = '{"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}'
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("ask.transcript.toml"),
        r#"[[turns]]
text = "I need to ask."
[[turns.tool_calls]]
name = "ask_operator"
arguments = { question = "Which colour?" }

[[turns]]
text = "The operator chose."
"#,
    )
    .unwrap();
}

#[test]
fn resume_gives_input_to_a_suspended_run_and_recovers_a_run_nobody_drives() {
    let dir = demo();
    asking_agent(dir.path());
    let out = warden(&["run", "ask.toml", "go", "--run-id", "q"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("answer with: warden runs resume q --input"),
        "{}",
        stdout(&out)
    );
    let details = assert_refused(
        dir.path(),
        &["runs", "resume", "q"],
        "input_required",
        "run `q` is suspended: it needs --input",
    );
    assert_eq!(details["status"], "suspended");
    assert_refused(
        dir.path(),
        &["runs", "resume", "q", "--input", r#"{"shade": 1}"#],
        "input_rejected",
        "run `q`: input rejected",
    );
    std::fs::write(dir.path().join("answer.json"), r#"{"colour": "green"}"#).unwrap();
    let out = warden(
        &["runs", "resume", "q", "--input", "@answer.json"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("… resumed with {\"colour\":\"green\"}"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("run q: completed"),
        "{}",
        stdout(&out)
    );

    // Recorded but never driven: `resume` recovers it and drives it on.
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "idle", "--detach"],
        dir.path(),
    );
    assert_eq!(stdout(&out), "idle\n");
    assert_refused(
        dir.path(),
        &["runs", "resume", "idle", "--input", "{}"],
        "input_not_expected",
        "run `idle` is queued: it takes no input",
    );
    let out = warden(&["runs", "resume", "idle"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run idle: awaiting_approval"),
        "{}",
        stdout(&out)
    );
    // Parked for approval: resume says what to do instead.
    assert_refused(
        dir.path(),
        &["runs", "resume", "idle"],
        "awaiting_approval",
        "approve with: warden runs approve idle call-3-1",
    );
    assert_refused(
        dir.path(),
        &["runs", "resume", "q"],
        "run_terminal",
        "run `q` is already completed",
    );
}

/// Records in the demo's store a run `id` whose log is that of the demo run
/// cut just after the intent of its write: what a crash in the middle of
/// the write leaves behind. The whole run is made in a store of its own
/// first (the same id: idempotency keys are derived from it).
fn record_dangling_write(dir: &Path, id: &str) {
    use warden::engine::RunStatus;
    use warden::engine::events::{Event, decode};
    use warden::store::{EventStore, ListingStatus, RunId, RunMeta, SqliteStore};
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            id,
            "--store",
            "whole.db",
        ],
        dir,
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(
        &["runs", "approve", id, "call-3-1", "--store", "whole.db"],
        dir,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_file(dir.join("notes/SUMMARY.md")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let id = RunId::new(id).unwrap();
        let whole = SqliteStore::open(dir.join("whole.db")).unwrap();
        let stored = whole.load(&id).await.unwrap();
        let cut = stored
            .iter()
            .position(|e| {
                matches!(decode(&e.bytes).unwrap(), Event::ToolCallIntent(i) if i.call_id.as_str() == "call-3-1")
            })
            .unwrap();
        let Event::RunStarted(started) = decode(&stored[0].bytes).unwrap() else {
            panic!("the log starts with run_started")
        };
        let meta = RunMeta {
            agent: "notes".into(),
            labels: started.labels.clone(),
            session: None,
            session_runs: None,
            history: Vec::new(),
            history_head: None,
            created_ms: started.clock_seed_ms as i64,
        };
        let bytes: Vec<bytes::Bytes> = stored[..=cut].iter().map(|e| e.bytes.clone()).collect();
        let store = SqliteStore::open(dir.join(".warden/warden.db")).unwrap();
        store
            .create(&id, meta, bytes[0].clone(), ListingStatus::RUNNING)
            .await
            .unwrap();
        store
            .append(&id, 1, &bytes[1..], RunStatus::NeedsReconciliation.listing().into(), 0)
            .await
            .unwrap();
    });
}

#[test]
fn a_dangling_write_is_refused_with_its_evidence_until_resolved() {
    let dir = demo_with_runs();
    record_dangling_write(dir.path(), "crashed");

    let out = warden(&["runs", "resume", "crashed"], dir.path());
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "run crashed needs reconciliation: write call-3-1 to fs__write_file with {\"content\""
        ),
        "{err}"
    );
    assert!(
        err.contains("warden runs resolve crashed --output"),
        "{err}"
    );
    let out = warden(&["runs", "resume", "crashed", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(5));
    let envelope = json_out(&out);
    assert_eq!(envelope["error"]["code"], "needs_reconciliation");
    let details = &envelope["error"]["details"];
    assert_eq!(details["write"]["call_id"], "call-3-1");
    assert_eq!(details["write"]["arguments"]["path"], "SUMMARY.md");
    assert!(
        details["next"][0]
            .as_str()
            .unwrap()
            .starts_with("warden runs resolve crashed")
    );
    let out = warden(&["runs", "recover", "crashed"], dir.path());
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert_eq!(run_statuses(dir.path())[2].1, "needs_reconciliation");

    // The operator checks by hand: the write never happened. Resolved, the
    // run goes on from there.
    let out = warden(
        &[
            "runs",
            "resolve",
            "crashed",
            "--output",
            r#"{"written": false}"#,
            "--note",
            "file absent",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "resolved; continue with: warden runs resume crashed\n"
    );
    let out = warden(&["runs", "resume", "crashed"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run crashed: completed"),
        "{}",
        stdout(&out)
    );
    assert!(
        !dir.path().join("notes/SUMMARY.md").exists(),
        "the write never ran"
    );
}

/// A write under another driver's live claim may be in progress: `runs
/// recover` names the driver and says to wait, not to check and resolve;
/// once the claim is gone the usual advice comes back. A run `warden run`
/// drives has no claim: the advice then says to let a live one end first.
#[test]
fn recovering_a_write_another_driver_holds_names_the_driver() {
    use warden::store::{EventStore, RunId, SqliteStore};
    let dir = demo_with_runs();
    record_dangling_write(dir.path(), "crashed");
    let out = warden(&["runs", "recover", "crashed"], dir.path());
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("if the `warden run` driving it is still running"),
        "{}",
        stderr(&out)
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = SqliteStore::open(dir.path().join(".warden/warden.db")).unwrap();
    let id = RunId::new("crashed").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let claim = rt
        .block_on(store.acquire_claim(&id, "worker-7", now, 600_000))
        .unwrap();
    let out = warden(&["runs", "recover", "crashed"], dir.path());
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("run crashed is held by another driver")
            && err.contains("may still be in progress")
            && err.contains("wait for worker worker-7")
            && err.contains("claim runs out in 9m"),
        "{err}"
    );
    assert!(!err.contains("needs reconciliation"), "{err}");
    let out = warden(&["runs", "resume", "crashed", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(5));
    let envelope = json_out(&out);
    let details = &envelope["error"]["details"];
    assert_eq!(details["held_by"]["owner"], "worker-7");
    assert_eq!(details["held_by"]["expires_ms"], claim.expires_ms);
    assert!(
        details["next"][0]
            .as_str()
            .unwrap()
            .starts_with("wait for worker worker-7")
    );
    // Nothing was recorded.
    assert_eq!(run_statuses(dir.path())[2].1, "needs_reconciliation");

    // The claim gone, the write is the operator's to check.
    rt.block_on(store.release_claim(&claim, None)).unwrap();
    let out = warden(&["runs", "recover", "crashed"], dir.path());
    assert_eq!(out.status.code(), Some(5));
    let err = stderr(&out);
    assert!(
        err.contains("run crashed needs reconciliation")
            && err.contains("check whether the write happened")
            && !err.contains("`warden run` driving it"),
        "{err}"
    );
}

#[test]
fn store_backup_is_an_online_verified_copy_and_prune_erases_finished_runs() {
    let dir = demo_with_runs();
    let out = warden(&["store", "backup", "backup.db"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("backed up 2 run(s)") && stdout(&out).contains("every chain intact"),
        "{}",
        stdout(&out)
    );
    assert_refused(
        dir.path(),
        &["store", "backup", "backup.db"],
        "usage",
        "already exists",
    );
    // The copy is a store of its own: the same runs, chains intact.
    let out = warden(&["runs", "verify", "--store", "backup.db"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("done: intact"), "{}", stdout(&out));
    let out = warden(
        &["runs", "list", "--json", "--store", "backup.db"],
        dir.path(),
    );
    assert_eq!(json_out(&out).as_array().unwrap().len(), 2);

    // Prune: finished runs only; a dry run deletes nothing.
    let out = warden(
        &["runs", "prune", "--older-than", "0s", "--dry-run"],
        dir.path(),
    );
    assert!(
        stdout(&out).contains("would prune 1 run(s)\n  done (completed"),
        "{}",
        stdout(&out)
    );
    assert_eq!(run_statuses(dir.path()).len(), 2);
    let out = warden(
        &["runs", "prune", "--older-than", "0s", "--json"],
        dir.path(),
    );
    let pruned = json_out(&out);
    assert_eq!(pruned["runs"][0]["run_id"], "done");
    assert_eq!(pruned["runs"].as_array().unwrap().len(), 1);
    let details = assert_refused(
        dir.path(),
        &["runs", "show", "done"],
        "pruned",
        "run done was pruned",
    );
    assert_eq!(details["run_id"], "done");
    assert_eq!(
        run_statuses(dir.path()),
        [("parked".to_owned(), "awaiting_approval".to_owned())]
    );
    assert_refused(
        dir.path(),
        &[
            "runs",
            "prune",
            "--older-than",
            "0s",
            "--status",
            "awaiting_approval",
        ],
        "usage",
        "only finished runs are pruned",
    );
    let out = warden(&["store", "compact"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden(&["runs", "verify"], dir.path());
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("parked: intact"), "{}", stdout(&out));
}

#[test]
fn completions_are_printed_for_each_shell() {
    let dir = workspace();
    for (shell, marker) in [
        ("bash", "_warden()"),
        ("zsh", "#compdef warden"),
        ("fish", "complete -c warden"),
    ] {
        let out = warden(&["completions", shell], dir.path());
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        assert!(stdout(&out).contains(marker), "{shell}");
        assert!(stdout(&out).contains("resume"), "{shell}");
    }
}

#[test]
fn the_code_review_example_reads_its_tree_read_only_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    // A copy of the example, so its delivery lands in the copy's `out/`.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    let examples = dir.path().join("agents");
    for file in ["code-review.toml", "code-review.transcript.toml"] {
        std::fs::create_dir_all(&examples).unwrap();
        std::fs::copy(source.join(file), examples.join(file)).unwrap();
    }
    copy_tree(&source.join("review"), &examples.join("review"));
    std::fs::create_dir(examples.join("out")).unwrap();
    let out = warden(
        &[
            "run",
            examples.join("code-review.toml").to_str().unwrap(),
            "Review the crate in review/",
            "--run-id",
            "cr",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("· step 1: context `style` resolved: 1 item, "),
        "the house style is quoted: {text}"
    );
    assert!(text.contains("→ call-2-1 fs__search [read]"), "{text}");
    // The sandboxed guard denied reading a secret file; the tool never ran.
    assert!(
        text.contains(
            "§ policy `guard` at before_tool_call (call-3-1): deny: path `.env` is denied by the operator (deny_paths `.env`)"
        ),
        "{text}"
    );
    assert!(!text.contains("→ call-3-1"), "{text}");
    assert!(text.contains("\"line\":16"), "{text}");
    assert!(text.contains("✓ completed: Review of src/lib.rs"), "{text}");
    // The review was delivered: one JSON line with the output.
    assert!(text.contains("✉ delivered cr/review/"), "{text}");
    let delivered = std::fs::read_to_string(examples.join("out/reviews.jsonl")).unwrap();
    let lines: Vec<Value> = delivered
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{delivered}");
    assert_eq!(lines[0]["kind"], "completed");
    assert!(
        lines[0]["payload"]["event"]["output"]
            .as_str()
            .unwrap()
            .starts_with("Review of src/lib.rs"),
        "{delivered}"
    );
    // Its grant is read-only: the agent's writing tools cannot change a file.
    let out = warden(
        &[
            "agent",
            "validate",
            examples.join("code-review.toml").to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("; 1 policy(ies): guard (plugin `guard`)"),
        "{}",
        stdout(&out)
    );
}

/// Writes `agent.toml`, a scripted greeter, and its two-turn transcript
/// into `dir`.
fn greeter(dir: &Path) {
    std::fs::write(
        dir.join("transcript.toml"),
        "[[turns]]\ntext = \"Hello, Ada.\"\n\n[[turns]]\ntext = \"Your name is Ada.\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("agent.toml"),
        "name = \"greeter\"\ninstructions = \"Greet.\"\n[model]\nprovider = \"scripted\"\nname = \"script\"\ntranscript = \"transcript.toml\"\n",
    )
    .unwrap();
}

/// `warden submit --session`: the queued run holds the session (a second
/// submit or run there is refused, naming it, with nothing recorded); once
/// it is driven (here by `runs resume`, as a worker would), the next
/// submit's run names the first run's transcript as its history.
#[test]
fn submit_in_a_session_queues_a_run_that_holds_the_session_and_sees_its_history() {
    let dir = tempfile::tempdir().unwrap();
    greeter(dir.path());
    let submit = |input: &str, id: &str| {
        warden(
            &[
                "submit",
                "agent.toml",
                input,
                "--session",
                "chat",
                "--run-id",
                id,
                "--json",
            ],
            dir.path(),
        )
    };
    let first = submit("My name is Ada.", "first");
    assert!(first.status.success(), "{}", stderr(&first));
    let queued: Value = serde_json::from_str(&stdout(&first)).unwrap();
    assert_eq!(
        queued,
        serde_json::json!({"v": 1, "run_id": "first", "status": "queued", "session": "chat",
            "next": [{"action": "resume", "command": "warden runs resume first"}]})
    );
    let refused = submit("What is my name?", "second");
    assert_eq!(refused.status.code(), Some(2));
    let json: Value = serde_json::from_str(&stdout(&refused)).unwrap();
    assert_eq!(json["error"]["code"], "session_busy");
    assert_eq!(json["error"]["details"]["active_run"], "first");
    let unknown = warden(&["runs", "events", "second"], dir.path());
    assert_eq!(unknown.status.code(), Some(2), "nothing was recorded");

    let driven = warden(&["runs", "resume", "first"], dir.path());
    assert!(driven.status.success(), "{}", stderr(&driven));
    let second = submit("What is my name?", "second");
    assert!(second.status.success(), "{}", stderr(&second));
    let events = warden(&["runs", "events", "second"], dir.path());
    let started: Value = serde_json::from_str(stdout(&events).lines().next().unwrap()).unwrap();
    let session = &started["event"]["session"];
    assert_eq!(session["session_id"], "chat");
    assert_eq!(session["position"], 1);
    // The history by reference: the first run's transcript (its input and
    // the answer) is a shared chunk the chain names, not a copy.
    assert_eq!(session["chain"]["runs"], 1);
    assert_eq!(session["chain"]["messages"], 2);
    assert!(
        session["chain"]["head"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:") && h.len() == 71),
        "{session}"
    );
    assert!(session.get("history").is_none() && session.get("runs").is_none());
    let bad = warden(
        &["submit", "agent.toml", "x", "--session", "a b"],
        dir.path(),
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("`a b` is not a valid session id"),
        "{}",
        stderr(&bad)
    );
}

/// `warden run --session` twice with the scripted model: the second run's
/// recorded prompt holds the first run's transcript, so the transcript's
/// second turn answers it; `warden sessions show` lists both; a second
/// start while a run is active is refused naming it, with nothing recorded.
#[test]
fn runs_in_a_session_see_earlier_runs_and_a_busy_session_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    greeter(dir.path());
    let run = |input: &str, id: &str, session: &str| {
        warden(
            &[
                "run",
                "agent.toml",
                input,
                "--session",
                session,
                "--run-id",
                id,
                "--record-prompts",
            ],
            dir.path(),
        )
    };
    let first = run("My name is Ada.", "first", "chat");
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stdout(&first).contains("Hello, Ada."), "{}", stdout(&first));
    let second = run("What is my name?", "second", "chat");
    assert!(second.status.success(), "{}", stderr(&second));
    let text = stdout(&second);
    assert!(
        text.contains("in session chat (run #1, history of 1 completed run(s), 2 message(s))"),
        "{text}"
    );
    assert!(text.contains("Your name is Ada."), "{text}");
    // The recorded prompt: the first run's transcript, then the input.
    let events = warden(&["runs", "events", "second"], dir.path());
    let intent: Value = stdout(&events)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"]["type"] == "model_call_intent")
        .unwrap();
    assert_eq!(
        intent["event"]["request"]["messages"],
        serde_json::json!([
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "text": "Hello, Ada."},
            {"role": "user", "content": "What is my name?"},
        ])
    );

    let show = warden(&["sessions", "show", "chat"], dir.path());
    assert!(show.status.success(), "{}", stderr(&show));
    let text = stdout(&show);
    assert!(text.starts_with("session chat: 2 run(s); idle"), "{text}");
    assert!(text.contains("first"), "{text}");
    assert!(
        text.contains("\"What is my name?\" → \"Your name is Ada.\""),
        "{text}"
    );
    let show = warden(&["sessions", "show", "chat", "--json"], dir.path());
    let json: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(json["session"], "chat");
    assert_eq!(json["active_run"], Value::Null);
    assert_eq!(json["runs"][0]["run_id"], "first");
    assert_eq!(json["runs"][1]["status"], "completed");
    assert_eq!(json["runs"][1]["position"], 1);
    assert_eq!(json["runs"][1]["history_runs"], 1);
    assert_eq!(json["runs"][1]["output"], "Your name is Ada.");
    let listed = warden(&["runs", "list", "--session", "chat", "--json"], dir.path());
    let json: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let listed: Vec<(&str, &str)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap(),
                r["session"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, [("first", "chat"), ("second", "chat")]);

    // A detached run is active: the next start is refused and records nothing.
    let detached = warden(
        &[
            "run",
            "agent.toml",
            "hi",
            "--session",
            "busy",
            "--run-id",
            "held",
            "--detach",
        ],
        dir.path(),
    );
    assert!(detached.status.success(), "{}", stderr(&detached));
    let refused = run("hello?", "refused", "busy");
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        stderr(&refused).trim(),
        "error: session `busy` is busy: run `held` is still active in it"
    );
    let refused = warden(
        &[
            "run",
            "agent.toml",
            "hello?",
            "--session",
            "busy",
            "--run-id",
            "refused",
            "--json",
        ],
        dir.path(),
    );
    let json: Value = serde_json::from_str(&stdout(&refused)).unwrap();
    assert_eq!(json["error"]["code"], "session_busy");
    assert_eq!(json["error"]["details"]["active_run"], "held");
    assert_eq!(json["error"]["details"]["session"], "busy");
    let unknown = warden(&["runs", "events", "refused"], dir.path());
    assert_eq!(unknown.status.code(), Some(2), "{}", stdout(&unknown));
    let show = warden(&["sessions", "show", "busy"], dir.path());
    assert!(
        stdout(&show).starts_with("session busy: 1 run(s); busy: run held is queued"),
        "{}",
        stdout(&show)
    );
    // Cancelling the active run releases the session.
    let cancel = warden(&["runs", "cancel", "held"], dir.path());
    assert!(cancel.status.success(), "{}", stderr(&cancel));
    let again = run("hello?", "after", "busy");
    assert!(again.status.success(), "{}", stderr(&again));

    let bad = run("x", "bad", "a b");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("`a b` is not a valid session id"),
        "{}",
        stderr(&bad)
    );
}

/// An agent that declares its output's schema, with a transcript whose
/// first answer is prose (sent back) and second is valid JSON.
fn typed_agent(dir: &Path) {
    std::fs::write(
        dir.join("typed.toml"),
        r#"
name = "typed"
instructions = "Count the notes."
output_schema_file = "count.schema.json"

[model]
provider = "scripted"
name = "demo"
transcript = "typed.transcript.toml"
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("count.schema.json"),
        r#"{"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("typed.transcript.toml"),
        "[[turns]]\ntext = \"There are three notes.\"\n[[turns]]\ntext = '{\"count\": 3}'\n",
    )
    .unwrap();
}

#[test]
fn run_and_runs_show_print_the_typed_output() {
    let dir = tempfile::tempdir().unwrap();
    typed_agent(dir.path());
    let out = warden(
        &["run", "typed.toml", "go", "--run-id", "t1", "--json"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["event"]["type"] == "output_rejected"),
        "{lines:?}"
    );
    let last = lines.last().unwrap();
    assert_eq!(last["status"], "completed");
    assert_eq!(last["output"], serde_json::json!({"count": 3}));

    let out = warden(&["run", "typed.toml", "go", "--run-id", "t2"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("final answer sent back to the model: the final answer is not a JSON value"),
        "{text}"
    );
    assert!(text.contains("output:\n{\n  \"count\": 3\n}"), "{text}");

    let shown = json_out(&warden(&["runs", "show", "t1", "--json"], dir.path()));
    assert_eq!(shown["output"], serde_json::json!({"count": 3}));
    let out = warden(&["runs", "show", "t1"], dir.path());
    assert!(
        stdout(&out).contains("output:\n{\n  \"count\": 3\n}"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn run_refuses_an_agent_enabling_a_policy_it_cannot_register_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    typed_agent(dir.path());
    let text = std::fs::read_to_string(dir.path().join("typed.toml")).unwrap();
    std::fs::write(
        dir.path().join("typed.toml"),
        format!("{text}\n[policies.reviewer]\n"),
    )
    .unwrap();
    let details = assert_refused(
        dir.path(),
        &["run", "typed.toml", "go", "--run-id", "p1"],
        "policy_not_registered",
        "agent `typed` enables policy `reviewer`, which is not registered on this runtime (set `plugin` in [policies.reviewer] to a policy plugin of the agent, or register it with Runtime::with_policy)",
    );
    assert_eq!(details["policy"], "reviewer");
    let out = warden(&["runs", "show", "p1"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
}

#[test]
fn runs_show_counts_compactions_and_shows_context_resolutions() {
    let dir = demo();
    let notes = std::fs::read_to_string(dir.path().join("notes.toml")).unwrap();
    std::fs::write(
        dir.path().join("reads.transcript.toml"),
        r#"
[[turns]]
text = "One."
[[turns.tool_calls]]
name = "fs__read_file"
arguments = { path = "todo.md" }

[[turns]]
text = "Two."
[[turns.tool_calls]]
name = "fs__read_file"
arguments = { path = "todo.md" }

[[turns]]
text = "Three."
[[turns.tool_calls]]
name = "fs__read_file"
arguments = { path = "todo.md" }

[[turns]]
text = "Read it three times."
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("reads.toml"),
        notes
            .replace("notes.transcript.toml", "reads.transcript.toml")
            .replace(
                "[budgets]",
                "[compaction]\nmax_prompt_tokens = 256\nkeep_recent = 1\n\n[budgets]",
            ),
    )
    .unwrap();
    let out = warden(
        &[
            "run",
            "reads.toml",
            "go",
            "--run-id",
            "small",
            "--record-prompts",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("· step 1: context `notes` resolved: 1 item, "),
        "{text}"
    );
    assert!(
        text.contains("· step 3: the prompt is over its budget: summarising messages 2 to 3"),
        "{text}"
    );
    assert!(
        text.contains("· step 3: compacted: messages 2 to 3 are now a "),
        "{text}"
    );
    let out = warden(&["runs", "show", "small"], dir.path());
    let shown = stdout(&out);
    assert!(shown.contains("compaction: 2 done, 0 failed"), "{shown}");
    // The recorded prompts: the notes quoted, fenced, with their age.
    let out = warden(&["runs", "show", "small", "--prompts"], dir.path());
    let shown = stdout(&out);
    assert!(
        shown.contains("               context:\n                 Context for this request"),
        "{shown}"
    );
    assert!(
        shown.contains("source=\"notes\" item=\"todo.md\" age=\""),
        "{shown}"
    );
    assert!(
        shown.contains("                 - [ ] water the plants\n"),
        "{shown}"
    );
    let out = warden(&["runs", "show", "demo-none", "--prompts"], dir.path());
    assert_eq!(out.status.code(), Some(2), "an unknown run");
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "unrecorded"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&["runs", "show", "unrecorded", "--prompts"], dir.path());
    assert!(
        stdout(&out).contains("(prompt not recorded: run with --record-prompts)"),
        "{}",
        stdout(&out)
    );
    let out = warden(&["runs", "show", "small", "--json"], dir.path());
    let body: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        body["compaction"],
        serde_json::json!({"completed": 2, "failed": 0})
    );
}

/// Copies the directory `from` to `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// An agent whose one write, `write_file` of `out/a.txt`, is keyed by its
/// `path` (the operator's grant), then an answer.
fn keyed_writer() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::write(
        dir.path().join("transcript.toml"),
        r#"
[[turns]]
text = "Writing."
[[turns.tool_calls]]
name = "fs__write_file"
arguments = { path = "out/a.txt", content = "one\n" }

[[turns]]
text = "Done."
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        r#"
name = "writer"
instructions = "Write the file."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.fs]
source = "builtin:fs"
approval = { write_file = "never" }
[plugins.fs.grant.mounts.workspace]
dir = "work"
[plugins.fs.grant.tools.write_file]
idempotency_key = "path"
"#,
    )
    .unwrap();
    dir
}

#[test]
fn keys_are_listed_shown_and_released_and_a_failed_write_leaves_its_key_free() {
    let dir = keyed_writer();
    let keys = |dir: &Path| json_out(&warden(&["keys", "list", "--json"], dir))["keys"].clone();
    // The write fails (`out/` is missing): nothing is kept for its key.
    let out = warden(
        &["run", "agent.toml", "go", "--run-id", "first"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(keys(dir.path()), serde_json::json!([]));
    // Once the cause is fixed, a later run makes the call.
    std::fs::create_dir(dir.path().join("work/out")).unwrap();
    let out = warden(
        &["run", "agent.toml", "go", "--run-id", "second"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/out/a.txt")).unwrap(),
        "one\n"
    );
    let listed = keys(dir.path());
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "settled");
    assert_eq!(listed[0]["run_id"], "second");
    assert_eq!(listed[0]["call_id"], "call-1-1");
    let key = listed[0]["key"].as_str().unwrap().to_owned();
    let text = stdout(&warden(&["keys", "list"], dir.path()));
    assert!(text.contains(&key) && text.contains("settled"), "{text}");

    // A third run gets the recorded result: the file is not written again.
    std::fs::write(dir.path().join("work/out/a.txt"), "changed by hand\n").unwrap();
    let out = warden(
        &["run", "agent.toml", "go", "--run-id", "third"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/out/a.txt")).unwrap(),
        "changed by hand\n"
    );

    let shown = json_out(&warden(&["keys", "show", &key, "--json"], dir.path()));
    assert_eq!(shown["state"], "settled");
    assert_eq!(shown["run_status"], "completed");
    assert_eq!(shown["result"]["output"]["path"], "out/a.txt");
    let text = stdout(&warden(&["keys", "show", &key], dir.path()));
    assert!(
        text.contains("holder: run second (completed), call call-1-1"),
        "{text}"
    );
    // The value an operator knows (the key argument, `out/a.txt`) is not
    // the key: `keys show` says how to find the key from the run.
    let out = warden(&["keys", "show", "out/a.txt"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("`out/a.txt` is not a key")
            && stderr(&out).contains("`warden keys list --run RUN`"),
        "{}",
        stderr(&out)
    );
    let text = stdout(&warden(&["keys", "list", "--run", "second"], dir.path()));
    assert!(text.contains(&key) && text.contains("call-1-1"), "{text}");
    let help = stdout(&warden(&["keys", "show", "--help"], dir.path()));
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("`warden keys list --run RUN`"), "{help}");

    // Released, with who and why in the holder run's log.
    let out = warden(
        &[
            "keys", "release", &key, "--by", "ops", "--note", "redo it", "--json",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let released = json_out(&out);
    assert_eq!(released["released"], key.as_str());
    assert_eq!(released["was"], "settled");
    assert_eq!(keys(dir.path()), serde_json::json!([]));
    let events = stdout(&warden(&["runs", "events", "second", "--json"], dir.path()));
    let last: Value = serde_json::from_str(events.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"]["type"], "key_released", "{events}");
    assert_eq!(last["event"]["by"], "ops");
    assert_eq!(last["event"]["note"], "redo it");
    let out = warden(&["runs", "verify", "second"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    // The next run makes the call again.
    let out = warden(
        &["run", "agent.toml", "go", "--run-id", "fourth"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/out/a.txt")).unwrap(),
        "one\n"
    );

    // Settled by the fourth run: settling it by hand is refused.
    let details = assert_refused(
        dir.path(),
        &[
            "keys",
            "settle",
            &key,
            "--output",
            r#"{"path": "out/a.txt"}"#,
        ],
        "key_settled",
        "is already settled by run `fourth`",
    );
    assert_eq!(details["holder_run"], "fourth");
    let details = assert_refused(
        dir.path(),
        &["keys", "settle", "no-such-key", "--output", "{}"],
        "unknown_key",
        "no-such-key",
    );
    assert_eq!(details["key"], "no-such-key");
    let details = assert_refused(
        dir.path(),
        &["keys", "release", "no-such-key"],
        "unknown_key",
        "no idempotency key `no-such-key` is recorded",
    );
    assert_eq!(details["key"], "no-such-key");
    let details = assert_refused(
        dir.path(),
        &["keys", "show", "no-such-key"],
        "unknown_key",
        "no-such-key",
    );
    assert_eq!(details["key"], "no-such-key");
}

/// `n` as unsigned LEB128.
fn leb(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A hostile component, written byte by byte: one core function with
/// `locals` 64-bit locals, each set at the start and all summed at the end
/// (so every one is live throughout), and `blocks` conditional blocks in
/// between, each changing one local (so each join merges values). Small on
/// disk, and a compile whose register allocation grows with locals times
/// blocks. It has no imports and exports nothing: the sandbox compiles it
/// before it could find it is no plugin.
fn pathological_component(locals: u32, blocks: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(1); // one local declaration
    leb(u64::from(locals), &mut body);
    body.push(0x7e); // i64
    for i in 0..locals {
        body.push(0x42); // i64.const (small, so signed LEB = unsigned)
        leb(u64::from(i % 64), &mut body);
        body.push(0x21); // local.set
        leb(u64::from(i + 1), &mut body);
    }
    for j in 0..blocks {
        let local = u64::from(1 + (j * 7919) % locals);
        body.extend([0x20, 0x00, 0x04, 0x40]); // local.get 0 (the param); if
        body.push(0x20); // local.get
        leb(local, &mut body);
        body.extend([0x42, 0x01, 0x7c]); // i64.const 1; i64.add
        body.push(0x21); // local.set
        leb(local, &mut body);
        body.push(0x0b); // end
    }
    body.extend([0x20, 0x01]); // local.get 1
    for i in 2..=locals {
        body.push(0x20);
        leb(u64::from(i), &mut body);
        body.push(0x7c); // i64.add
    }
    body.push(0x0b);
    let section = |id: u8, content: &[u8], out: &mut Vec<u8>| {
        out.push(id);
        leb(content.len() as u64, out);
        out.extend_from_slice(content);
    };
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 1, 0x7f, 1, 0x7e], &mut module); // (func (param i32) (result i64))
    section(3, &[1, 0], &mut module);
    let mut code = vec![1];
    leb(body.len() as u64, &mut code);
    code.extend_from_slice(&body);
    section(10, &code, &mut module);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    section(1, &module, &mut component); // a core module
    component
}

/// Issue 37, item 7: compiling is bounded by the operator's `[compile]`
/// limits, in a child process of the real binary. A hostile component whose
/// compile would run on is stopped at the deadline, and one whose compile
/// grows past the memory limit is stopped there, each with one line naming
/// the limit and how to raise it; a component over the size limit is
/// refused before it is compiled. A small one of the same shape compiles in
/// the child and loads here (then is refused as no plugin).
#[test]
fn compiling_a_hostile_component_stops_at_the_operators_limits() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = pathological_component(20_000, 20_000);
    std::fs::write(dir.path().join("hostile.wasm"), &wasm).unwrap();
    let inspect = |config: &str| {
        std::fs::write(dir.path().join("warden.toml"), config).unwrap();
        let started = std::time::Instant::now();
        let out = warden(&["plugin", "inspect", "hostile.wasm"], dir.path());
        (out, started.elapsed())
    };

    let (out, took) = inspect("[compile]\ntimeout = \"2s\"\n");
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.contains("compiling the component passed its time limit of 2s")
            && text.contains("raise `[compile] timeout` in warden.toml"),
        "{text}"
    );
    assert!(took < std::time::Duration::from_secs(15), "took {took:?}");

    let (out, took) = inspect("[compile]\nmemory = \"64MiB\"\ntimeout = \"60s\"\n");
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.contains("compiling the component passed its memory limit of 64.0 MiB"),
        "{text}"
    );
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");

    let (out, _) = inspect("[compile]\nmax_size = \"1KiB\"\n");
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(
        text.contains("passed its size limit of 1.0 KiB")
            && text.contains("raise `[compile] max_size`"),
        "{text}"
    );

    let out = warden(&["config", "show", "--json"], dir.path());
    assert_eq!(json_out(&out)["compile"]["max_size"], 1024);

    std::fs::write(
        dir.path().join("small.wasm"),
        pathological_component(10, 10),
    )
    .unwrap();
    std::fs::write(dir.path().join("warden.toml"), "").unwrap();
    let out = warden(&["plugin", "inspect", "small.wasm"], dir.path());
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(text.contains("exports none of"), "{text}");
}
