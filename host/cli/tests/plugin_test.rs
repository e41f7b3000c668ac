//! `warden plugin test` through the real binary, against first-party
//! components in the real sandbox: cases of every plugin kind passing
//! (outputs, subsets, mount fixtures, files left behind, receipts), a
//! failing case printing its diff and exiting 1, a read outside a mount
//! denied, fuel and deadline limits hit, `--json` in the output contract,
//! and a malformed case file refused with its code.

mod common;

use std::io::Read as _;
use std::path::Path;

use common::{json_out, stderr, stdout, warden};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const PASSING: &str = r#"
plugin = "builtin:fs"

[defaults.mounts.workspace]
files = { "notes.md" = "notes:\nwater the plants\n" }

[[case]]
name = "reads a fixture file"
tool = "read_file"
arguments = { path = "notes.md" }
expect.output_includes = { content = "notes:\nwater the plants\n", total_lines = 2 }
expect.receipt = { min_fuel = 1, max_memory = "64MiB", max_time = "10s" }

[[case]]
name = "writes into the mount"
tool = "write_file"
arguments = { path = "out/summary.md", content = "done", create_dirs = true }
expect.files = { "workspace/out/summary.md" = "done", "workspace/notes.md" = { contains = "plants" } }

[[case]]
name = "a read outside the mount is denied"
tool = "read_file"
arguments = { path = "../secret.txt" }
expect = { denied = true, message = "secret.txt" }

[[case]]
name = "a read-only mount refuses a write"
tool = "write_file"
arguments = { path = "notes.md", content = "gone" }
mounts.workspace = { access = "read-only", files = { "notes.md" = "kept" } }
expect.denied = true
expect.files = { "workspace/notes.md" = "kept" }

[[case]]
name = "bad arguments are a typed error"
tool = "read_file"
arguments = { path = 7 }
expect = { error = "invalid_arguments", message = "path" }

[[case]]
name = "too little fuel stops the call"
tool = "read_file"
arguments = { path = "notes.md" }
limits = { fuel = 5_000 }
expect.limit = "fuel"
"#;

#[test]
fn passing_cases_of_every_kind_and_their_hostile_cases() {
    let dir = tempfile::tempdir().unwrap();
    let tests = dir.path().join("tests");
    std::fs::create_dir(&tests).unwrap();
    write(&tests, "fs.toml", PASSING);
    write(
        &tests,
        "context.toml",
        r#"
plugin = "builtin:files-context"

[[case]]
name = "the files of the mount are items"
resolve = { paths = ["a.md"] }
mounts.files.files = { "a.md" = "alpha", "b.md" = "beta" }
expect.output_includes = [{ source = "a.md", content = "alpha" }]
"#,
    );
    write(
        &tests,
        "channel.toml",
        r#"
plugin = "builtin:jsonl-channel"

[[case]]
name = "a delivery is one line in the outbox"
deliver = "completed"
payload = { summary = "done" }
mounts.outbox = {}
expect.files = { "outbox/deliveries.jsonl" = { contains = '"summary":"done"' } }
"#,
    );
    write(
        &tests,
        "policy.toml",
        r#"
plugin = "builtin:tool-guard"

[defaults]
config = { deny_tools = "fs__write_file" }

[[case]]
name = "a denied tool is denied"
decide = "before_tool_call"
subject = { call_id = "call-1-1", tool = "fs__write_file", arguments = {} }
expect = { denied = true, message = "deny_tools" }

[[case]]
name = "another tool is allowed"
decide = "before_tool_call"
subject = { call_id = "call-1-1", tool = "fs__read_file", arguments = {} }
expect.output = { decision = "allow" }
"#,
    );
    let out = warden(&["plugin", "test"], dir.path());
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("10 cases: 10 passed, 0 failed"), "{text}");
    assert!(
        text.contains("ok    tests/fs.toml: a read outside the mount is denied"),
        "{text}"
    );

    let out = warden(
        &["plugin", "test", "--json", "--filter", "fuel"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report = json_out(&out);
    assert_eq!(report["v"], 1);
    assert_eq!(report["ok"], true);
    assert_eq!(report["passed"], 1);
    assert_eq!(report["skipped"], 9);
    let case = &report["cases"][0];
    assert_eq!(case["actual"]["lease_error"]["outcome"], "out_of_fuel");
    assert_eq!(case["receipt"]["outcome"], "out_of_fuel");
}

#[test]
fn a_failing_case_shows_a_diff_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "cases.toml",
        r#"
plugin = "builtin:fs"

[[case]]
name = "expects the wrong line"
tool = "read_file"
arguments = { path = "notes.md" }
mounts.workspace.files = { "notes.md" = "actual line\n" }
expect.output_includes = { content = "expected line\n", total_lines = 1 }

[[case]]
name = "expects a denial that does not come"
tool = "read_file"
arguments = { path = "notes.md" }
mounts.workspace.files = { "notes.md" = "x" }
expect.denied = true
"#,
    );
    let out = warden(&["plugin", "test", file.to_str().unwrap()], dir.path());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("FAIL  cases.toml: expects the wrong line"),
        "{text}"
    );
    assert!(
        text.contains("the output does not include what was expected"),
        "{text}"
    );
    assert!(
        text.contains("-   \"content\": \"expected line\\n\","),
        "{text}"
    );
    assert!(
        text.contains("+   \"content\": \"actual line\\n\","),
        "{text}"
    );
    assert!(text.contains("    \"total_lines\": 1"), "{text}");
    assert!(text.contains("expected a denial, got output {"), "{text}");
    assert!(text.contains("2 cases: 0 passed, 2 failed"), "{text}");

    let out = warden(
        &["plugin", "test", file.to_str().unwrap(), "--json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let report = json_out(&out);
    assert_eq!(report["ok"], false);
    assert_eq!(report["failed"], 2);
    let failure = &report["cases"][0]["failures"][0];
    assert_eq!(failure["check"], "output_includes");
    assert_eq!(failure["expected"]["content"], "expected line\n");
    assert_eq!(failure["actual"]["content"], "actual line\n");
    assert!(
        failure["diff"].as_str().unwrap().contains("+ "),
        "{failure}"
    );
}

/// A server that accepts connections and never answers: the http plugin's
/// request to it waits until the lease's deadline.
fn silent_server() -> (u16, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut buf = [0u8; 1024];
            // Hold the connection open until the client goes away.
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        }
    });
    (port, handle)
}

#[test]
fn a_deadline_hit_and_a_host_not_granted() {
    let (port, server) = silent_server();
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "http.toml",
        &format!(
            r#"
plugin = "builtin:http"

[[case]]
name = "a silent server runs into the deadline"
tool = "http_get"
arguments = {{ url = "http://127.0.0.1:{port}/slow" }}
hosts = ["http://127.0.0.1:{port}"]
limits = {{ timeout = "300ms" }}
expect.limit = "timeout"
expect.receipt = {{ max_time = "5s" }}

[[case]]
name = "a host not granted is denied"
tool = "http_get"
arguments = {{ url = "http://127.0.0.1:{port}/" }}
expect.denied = true
expect.receipt = {{ http_denied = 1, http_requests = 0 }}
"#
        ),
    );
    let out = warden(
        &["plugin", "test", file.to_str().unwrap(), "--json"],
        dir.path(),
    );
    let report = json_out(&out);
    assert!(out.status.success(), "{report:#}\n{}", stderr(&out));
    assert_eq!(
        report["cases"][0]["actual"]["lease_error"]["outcome"],
        "timeout"
    );
    drop(server);
}

#[test]
fn a_malformed_case_file_is_refused_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "plugin = \"builtin:fs\"\n[[case]]\nname = \"x\"\ntool = \"read_file\"\nexpect = { output = 1, denied = true }\n",
            "`expect` names `output` and `denied`",
        ),
        (
            "plugin = \"builtin:fs\"\n[[case]]\nname = \"x\"\nresolve = \"q\"\ndecide = \"run_start\"\n",
            "give exactly one of `tool`, `resolve`, `deliver` and `decide`",
        ),
        (
            "plugin = \"builtin:fs\"\n[[case]]\nname = \"x\"\ntool = \"read_file\"\nexpct = {}\n",
            "unknown field `expct`",
        ),
    ];
    for (text, expected) in cases {
        let file = write(dir.path(), "bad.toml", text);
        let out = warden(
            &["plugin", "test", file.to_str().unwrap(), "--json"],
            dir.path(),
        );
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
        let envelope = json_out(&out);
        assert_eq!(envelope["error"]["code"], "test_case_invalid", "{envelope}");
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message}");
    }
    // A directory without cases says where they go.
    let out = warden(&["plugin", "test"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("holds no case files"),
        "{}",
        stderr(&out)
    );
}
