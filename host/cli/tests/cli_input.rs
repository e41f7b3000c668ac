//! End-to-end tests of the `warden` binary fed odd input as a new user
//! would: arguments and file names that are not UTF-8, a stdout closed
//! mid-run, a mount asked for and not granted, the README's own command
//! forms. Each runs the real executable over a real SQLite store and the
//! real built-in plugins.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn command(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden"));
    cmd.current_dir(cwd)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_STORE")
        .env_remove("WARDEN_CONFIG")
        .env_remove("WARDEN_LABELS")
        .env_remove("NO_COLOR");
    cmd
}

fn warden<A: AsRef<OsStr>>(args: &[A], cwd: &Path) -> Output {
    command(cwd).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_out(o: &Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}

/// An argument from raw bytes.
fn raw(bytes: &[u8]) -> OsString {
    OsString::from_vec(bytes.to_vec())
}

fn args(list: &[&[u8]]) -> Vec<OsString> {
    list.iter().map(|a| raw(a)).collect()
}

/// A copy of the notes demo agent in a fresh directory.
fn demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    for file in ["notes.toml", "notes.transcript.toml"] {
        std::fs::copy(examples.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("notes")).unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
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

/// `plugin call builtin:fs list_dir` over `notes/`, read-only, with `more`
/// flags.
fn list_notes(dir: &Path, more: &[&str]) -> Output {
    let mut args = vec![
        "plugin",
        "call",
        "builtin:fs",
        "list_dir",
        "--mount",
        "workspace=notes:ro",
    ];
    args.extend_from_slice(more);
    warden(&args, dir)
}

/// The ids and statuses `runs list` shows; none where no store was ever
/// created (`runs list` refuses a store that does not exist).
fn run_statuses(dir: &Path) -> Vec<(String, String)> {
    if !dir.join(".warden/warden.db").exists() {
        return Vec::new();
    }
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

#[test]
fn a_non_utf8_argument_is_refused_naming_the_argument_and_records_nothing() {
    let dir = demo();
    let cases: [(&[&[u8]], &str); 5] = [
        (
            &[b"run", b"notes.toml", b"go\xff", b"--run-id", b"a"],
            "<INPUT>",
        ),
        (
            &[b"run", b"notes.toml", b"go", b"--run-id", b"r\xfe"],
            "--run-id",
        ),
        (&[b"runs", b"show", b"r\xff"], "<RUN>"),
        (&[b"--store", b"s\xff.db", b"runs", b"list"], "--store"),
        (
            &[
                b"plugin",
                b"call",
                b"builtin:fs",
                b"list_dir",
                b"--mount",
                b"workspace=n\xffotes",
            ],
            "--mount",
        ),
    ];
    for (list, name) in cases {
        let out = warden(&args(list), dir.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{list:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{list:?}: {err}");
        assert!(
            err.contains(&format!("argument {name} is not valid UTF-8")) && err.contains("\\xF"),
            "{list:?}: {err}"
        );
        let mut with_json = args(list);
        with_json.push("--json".into());
        let out = warden(&with_json, dir.path());
        assert_eq!(out.status.code(), Some(2), "{list:?}: {}", stderr(&out));
        let envelope = json_out(&out);
        assert_eq!(envelope["error"]["code"], "usage", "{envelope}");
        assert_eq!(envelope["error"]["details"]["argument"], name, "{envelope}");
    }
    assert_eq!(run_statuses(dir.path()), []);
    assert!(!dir.path().join("s\u{FFFD}.db").exists());
}

#[test]
fn an_agent_file_named_in_non_utf8_is_refused_before_a_run_is_recorded() {
    let dir = demo();
    let name = raw(b"no\xfftes.toml");
    std::fs::copy(dir.path().join("notes.toml"), dir.path().join(&name)).unwrap();
    for verb in ["run", "submit"] {
        let out = warden(&[OsStr::new(verb), &name, OsStr::new("go")], dir.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{verb}: {err}");
        assert!(
            err.contains("no\\xFFtes.toml`: the path is not valid UTF-8"),
            "{verb}: {err}"
        );
        let out = warden(
            &[
                OsStr::new(verb),
                &name,
                OsStr::new("go"),
                OsStr::new("--json"),
            ],
            dir.path(),
        );
        assert_eq!(json_out(&out)["error"]["code"], "path_not_utf8");
    }
    assert_eq!(run_statuses(dir.path()), []);
    // Only read, the path is used as the system gives it.
    let out = warden(
        &[
            OsStr::new("agent"),
            OsStr::new("validate"),
            &name,
            OsStr::new("--json"),
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_out(&out)[0]["file"], "no\\xFFtes.toml");
    assert_eq!(json_out(&out)[0]["ok"], true);
    let out = warden(
        &[
            OsStr::new("agent"),
            OsStr::new("hash"),
            &name,
            OsStr::new("--json"),
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // A missing one is reported with the same escapes, not a crash.
    let missing = raw(b"mis\xfesing.toml");
    let out = warden(
        &[
            OsStr::new("agent"),
            OsStr::new("validate"),
            &missing,
            OsStr::new("--json"),
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        json_out(&out)[0]["error"]["details"]["file"],
        "mis\\xFEsing.toml"
    );
}

/// `warden run … | head`: the reader goes away while the run is live. The
/// run is driven on to where it would have stopped, and stderr says so.
#[test]
fn a_closed_stdout_does_not_leave_a_run_half_driven() {
    let dir = demo();
    for json in [false, true] {
        let id = if json { "closed-json" } else { "closed" };
        let mut run = command(dir.path());
        run.args(["run", "notes.toml", "go", "--run-id", id]);
        if json {
            run.arg("--json");
        }
        let out = with_closed_stdout(&mut run);
        let err = stderr(&out);
        // Parked for approval, exactly as with an open stdout.
        assert_eq!(out.status.code(), Some(4), "{err}");
        assert!(
            err.contains(&format!(
                "stdout was closed; run {id} was driven on without it and is awaiting_approval"
            )),
            "{err}"
        );
        let mut approve = command(dir.path());
        approve.args(["runs", "approve", id, "call-3-1"]);
        let out = with_closed_stdout(&mut approve);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!(
                "run {id} was driven on without it and is completed"
            )),
            "{}",
            stderr(&out)
        );
        std::fs::remove_file(dir.path().join("notes/SUMMARY.md")).unwrap();
    }
    assert_eq!(
        run_statuses(dir.path()),
        [
            ("closed".to_owned(), "completed".to_owned()),
            ("closed-json".to_owned(), "completed".to_owned())
        ]
    );
    // The session-less runs hold nothing; a command that only reads still
    // stops quietly at a closed pipe.
    let mut events = command(dir.path());
    events.args(["runs", "events", "closed"]);
    let out = with_closed_stdout(&mut events);
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

/// Runs `cmd` with a stdout whose reading end is already closed.
fn with_closed_stdout(cmd: &mut Command) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer).stderr(Stdio::piped()).output().unwrap()
}

/// The README's standing-rule example, run as written after the quick
/// start: it approves the quick start's own write, so the next run
/// completes without parking and the summary is written.
#[test]
fn the_readmes_standing_rule_approves_the_quick_starts_write() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let at = readme
        .find("`warden approvals add ")
        .expect("the README shows a standing rule");
    let command = &readme[at + 1..];
    let command = &command[..command.find('`').unwrap()];
    let argv: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|w| w.trim_matches('\'').to_owned())
        .collect();
    let dir = demo();
    // The quick start, as the README runs it first: its write waits.
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "first"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&argv, dir.path());
    assert!(out.status.success(), "{command}: {}", stderr(&out));
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "ruled"],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{command} left the quick start's write waiting: {}",
        stdout(&out)
    );
    assert!(dir.path().join("notes/SUMMARY.md").is_file());
}

#[test]
fn agent_validate_takes_the_readme_form_and_checks_transcripts_as_transcripts() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    let mut files: Vec<OsString> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| Path::new(n).extension() == Some(OsStr::new("toml")))
        .collect();
    files.sort();
    assert!(
        files
            .iter()
            .any(|f| f.as_bytes().ends_with(b".transcript.toml"))
    );
    let mut argv: Vec<OsString> = vec!["agent".into(), "validate".into()];
    argv.extend(files.iter().cloned());
    let out = warden(&argv, &examples);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), files.len(), "{text}");
    assert!(
        text.contains("ok     notes.transcript.toml: a scripted model's transcript, 4 turn(s)"),
        "{text}"
    );
    argv.push("--json".into());
    let rows = json_out(&warden(&argv, &examples));
    let kinds: Vec<(&str, &str)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["file"].as_str().unwrap(), r["kind"].as_str().unwrap()))
        .collect();
    assert!(kinds.contains(&("notes.toml", "agent")), "{kinds:?}");
    assert!(
        kinds.contains(&("notes.transcript.toml", "transcript")),
        "{kinds:?}"
    );

    // A broken transcript is checked as one: the turn is named.
    let dir = demo();
    std::fs::write(
        dir.path().join("broken.transcript.toml"),
        "[[turns]]\ntext = \"hi\"\n[[turns]]\n",
    )
    .unwrap();
    let out = warden(
        &["agent", "validate", "notes.toml", "broken.transcript.toml"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.starts_with("error  broken.transcript.toml: ") && l.contains("turn 2")),
        "{text}"
    );
}

/// A missing mount grant is said as such, with the flag that grants it: in
/// the tool error the caller (or the model) gets, and on stderr.
#[test]
fn a_mount_not_granted_is_named_with_how_to_grant_it() {
    let dir = demo();
    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:fs",
            "read_file",
            r#"{"path":"todo.md"}"#,
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "note: plugin `fs` requested mount `workspace` (read-write) and it is not granted"
        ) && err.contains("--mount workspace=DIR"),
        "{err}"
    );
    assert!(
        err.contains("tool error: denied: mount `workspace` was requested and not granted"),
        "{err}"
    );
    assert!(!err.contains("not found"), "{err}");
    let out = warden(
        &["plugin", "call", "builtin:fs", "list_dir", "--json"],
        dir.path(),
    );
    let body = json_out(&out);
    assert_eq!(body["tool_error"]["kind"], "denied", "{body}");
    assert!(
        body["tool_error"]["message"]
            .as_str()
            .unwrap()
            .contains("`--mount workspace=DIR`"),
        "{body}"
    );
    // Granted, the same call works and no note is printed.
    let out = list_notes(dir.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("note:"), "{}", stderr(&out));
    // The context source says it too.
    let out = warden(
        &["plugin", "resolve", "builtin:files-context", "--json"],
        dir.path(),
    );
    let body = json_out(&out);
    assert_eq!(body["context_error"]["kind"], "denied", "{body}");
    assert!(
        body["context_error"]["message"]
            .as_str()
            .unwrap()
            .contains("mount `files` was requested and not granted"),
        "{body}"
    );
}

/// The session example of docs/sessions.md, offline, run twice in a row in the same
/// session: every run completes, and each second run answers from the
/// history.
#[test]
fn the_session_example_works_twice_in_a_row() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    let dir = tempfile::tempdir().unwrap();
    for file in ["chat.toml", "chat.transcript.toml"] {
        std::fs::copy(examples.join(file), dir.path().join(file)).unwrap();
    }
    for round in 0..2 {
        let out = warden(
            &[
                "run",
                "chat.toml",
                "My name is Ada.",
                "--session",
                "chat-42",
            ],
            dir.path(),
        );
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert!(stdout(&out).contains("Hello, Ada."), "{}", stdout(&out));
        let out = warden(
            &[
                "run",
                "chat.toml",
                "What is my name?",
                "--session",
                "chat-42",
            ],
            dir.path(),
        );
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("Your name is Ada"),
            "{}",
            stdout(&out)
        );
    }
    let out = warden(&["sessions", "show", "chat-42", "--json"], dir.path());
    let shown = json_out(&out);
    let runs = shown["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{shown}");
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{shown}");
    // The guide's commands, as written there, validate.
    let guide = std::fs::read_to_string(examples.join("../../docs/sessions.md")).unwrap();
    assert!(
        guide
            .contains("warden run examples/agents/chat.toml \"My name is Ada.\" --session chat-42"),
        "docs/sessions.md shows the session example"
    );
}

/// The levels of stderr: nothing coloured off a terminal, `-v` Warden's
/// own events only, `-q` errors only.
#[test]
fn stderr_follows_the_command_line_conventions() {
    let dir = demo();
    // A fresh cache: the component is compiled, so wasmtime has things to say.
    let cache = tempfile::tempdir().unwrap();
    let call = |flags: &[&str]| {
        let mut cmd = command(dir.path());
        cmd.env("WARDEN_CACHE_DIR", cache.path())
            .args([
                "plugin",
                "call",
                "builtin:fs",
                "list_dir",
                "--mount",
                "workspace=notes:ro",
            ])
            .args(flags);
        cmd.output().unwrap()
    };
    let out = call(&["-v"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains('\u{1b}'), "colour off a terminal: {err:?}");
    let targets: Vec<&str> = err
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let level = words.nth(1)?;
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
                .contains(&level)
                .then(|| words.next().unwrap_or_default())
        })
        .collect();
    assert!(!targets.is_empty(), "-v shows Warden's events: {err}");
    assert!(
        targets.iter().all(|t| t.starts_with("warden")),
        "-v shows only Warden's events: {targets:?}"
    );
    let out = call(&["-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "-q: no receipt, no notes");
    let out = call(&["-q", "-v"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// An agent whose grant leaves a plugin's write tool no way to act (here
/// `fs`'s `workspace` mount read-only) does not offer the tool to the
/// model, and says so when it is loaded: `agent validate` and `run` warn
/// naming the tool, the plugin and the mount to grant read-write; `-q`
/// keeps it off stderr.
#[test]
fn a_tool_dropped_for_a_mount_not_granted_is_named_at_load() {
    let dir = demo();
    let agent = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace(
            "[plugins.fs.grant.mounts.workspace]\ndir = \"notes\"\n",
            "[plugins.fs.grant.mounts.workspace]\ndir = \"notes\"\naccess = \"read-only\"\n",
        );
    assert!(agent.contains("access = \"read-only\""), "{agent}");
    std::fs::write(dir.path().join("notes.toml"), agent).unwrap();
    let warning = "warden: tool `fs__write_file` of plugin `fs` is not offered: its effect is `write` and the grant allows no change (no read-write mount, no outbound host); not granted: read-write mount `workspace`";
    let out = warden(&["agent", "validate", "notes.toml"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(warning), "{}", stderr(&out));
    assert!(!stdout(&out).contains("fs__write_file"), "{}", stdout(&out));
    let out = warden(&["run", "notes.toml", "go", "--run-id", "ro"], dir.path());
    assert_eq!(stderr(&out).matches(warning).count(), 1, "{}", stderr(&out));
    let out = warden(&["-q", "agent", "validate", "notes.toml"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

/// `-q` on the verbs that drive a run prints only errors, as the docs say:
/// no timeline, no receipts, no streamed text, no "run …: status" line;
/// what the run returned is still the command's output, how a parked run
/// stands is its exit code (4), and a failure is said on stderr.
#[test]
fn quiet_drives_print_only_errors_and_the_result() {
    let dir = demo();
    let out = warden(
        &["-q", "run", "notes.toml", "go", "--run-id", "q"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "no timeline");
    assert_eq!(stderr(&out), "", "no notes");
    let out = warden(
        &["-q", "runs", "approve", "q", "call-3-1", "--by", "tester"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "I wrote SUMMARY.md: the folder holds one todo list with three open items.\n",
        "the output alone"
    );
    assert_eq!(stderr(&out), "");
    // Without -q the same drive prints its timeline and receipts.
    let out = warden(&["run", "notes.toml", "go", "--run-id", "loud"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run loud: awaiting_approval"),
        "{}",
        stdout(&out)
    );
    // A run that fails says so on stderr, even with -q: a transcript that
    // runs out after one turn fails the second model call for good.
    std::fs::write(
        dir.path().join("notes.transcript.toml"),
        "[[turns]]\ntext = \"Looking.\"\n[[turns.tool_calls]]\nname = \"fs__list_dir\"\n",
    )
    .unwrap();
    let out = warden(
        &["-q", "run", "notes.toml", "go", "--run-id", "bad"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "no timeline");
    let err = stderr(&out);
    assert!(
        err.starts_with("warden: run bad failed:") && err.contains("step 2"),
        "{err}"
    );
}

#[test]
fn plugin_call_on_a_bare_component_says_what_to_name_instead() {
    let dir = demo();
    std::fs::write(
        dir.path().join("fs.wasm"),
        warden::plugins::builtin::find("fs").unwrap().wasm,
    )
    .unwrap();
    let out = warden(&["plugin", "call", "fs.wasm", "list_dir"], dir.path());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`fs.wasm`: is a WebAssembly component, not a manifest")
            && err.contains("warden plugin inspect"),
        "{err}"
    );
    assert!(!err.contains("UTF-8"), "{err}");
}

/// With `$USER` and `$LOGNAME` unset, an approval records the account the
/// process runs as, not a made-up "cli".
#[test]
fn an_approval_without_user_records_the_account() {
    let dir = demo();
    let bare = |args: &[&str]| {
        let mut cmd = command(dir.path());
        cmd.env_remove("USER").env_remove("LOGNAME").args(args);
        cmd.output().unwrap()
    };
    let out = bare(&["run", "notes.toml", "go", "--run-id", "u"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = bare(&["runs", "approve", "u", "call-3-1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let who = Command::new("id").arg("-un").output().unwrap();
    let who = String::from_utf8_lossy(&who.stdout).trim().to_owned();
    assert!(!who.is_empty());
    assert!(
        stdout(&out).contains(&format!("✓ call-3-1 approved by {who}")),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_dns_failure_is_said_in_words() {
    let dir = demo();
    let out = warden(
        &[
            "plugin",
            "call",
            "builtin:http",
            "http_get",
            r#"{"url": "http://no-such-host.invalid/"}"#,
            "--allow-host",
            "no-such-host.invalid",
        ],
        dir.path(),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("request to `no-such-host.invalid:80` failed: the name does not resolve"),
        "{err}"
    );
    assert!(
        !err.contains("Payload") && !err.contains("DnsError"),
        "{err}"
    );
}

/// After a deny, the demo's last answer does not claim the file was written.
#[test]
fn after_a_deny_the_demo_says_it_did_not_write() {
    let dir = demo();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "d"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(
        &["runs", "deny", "d", "call-3-1", "--reason", "not now"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("I did not write SUMMARY.md"), "{text}");
    assert!(!text.contains("I wrote SUMMARY.md"), "{text}");
    assert!(!dir.path().join("notes/SUMMARY.md").exists());
}

/// The receipt's `unlisted` of a JSON tool call, context resolution or
/// event.
fn unlisted(receipt: &Value) -> Vec<String> {
    receipt["unlisted"]["names"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .map(|n| n.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_non_utf8_name_in_a_mount_is_left_out_and_reported_and_the_rest_goes_on() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = demo();
    let notes = dir.path().join("notes");
    // Latin-1 names, which are not UTF-8, with files listed after them that
    // a listing stopped at the first would lose; one in a subdirectory.
    std::fs::write(notes.join(OsStr::from_bytes(b"caf\xe9.md")), "latin-1").unwrap();
    std::fs::write(notes.join("zz.md"), "- last\n").unwrap();
    std::fs::create_dir(notes.join("sub")).unwrap();
    std::fs::write(notes.join("sub").join(OsStr::from_bytes(b"\xff.md")), "x").unwrap();
    std::fs::write(notes.join("sub/ok.md"), "- ok\n").unwrap();

    // The fs plugin's list_dir, called directly.
    let out = list_notes(dir.path(), &[]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains(r"/workspace/caf\xe9.md"),
        "the entry is named on stderr: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(r"left out 1 entry whose name is not UTF-8: /workspace/caf\xe9.md"),
        "{}",
        stderr(&out)
    );
    let out = list_notes(dir.path(), &["--json"]);
    let body = json_out(&out);
    let names: Vec<&str> = body["output"]["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sub", "todo.md", "zz.md"], "{body}");
    assert_eq!(unlisted(&body["receipt"]), [r"/workspace/caf\xe9.md"]);
    assert_eq!(body["receipt"]["unlisted"]["count"], 1);

    // The demo run: its context source and its list_dir both see every
    // other file, and the log records what was left out.
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "n", "--json"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let event = |kind: &str| {
        lines
            .iter()
            .find(|l| l["event"]["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {lines:?}"))["event"]
            .clone()
    };
    let context = event("context_resolved");
    let sources: Vec<&str> = context["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["sub/ok.md", "todo.md", "zz.md"], "{context}");
    let mut left_out = unlisted(&context["receipt"]);
    left_out.sort();
    assert_eq!(left_out, [r"/files/caf\xe9.md", r"/files/sub/\xff.md"]);
    let listed = event("tool_call_completed");
    assert_eq!(
        listed["result"]["output"]["entries"]
            .as_array()
            .unwrap()
            .len(),
        3,
        "{listed}"
    );
    assert_eq!(unlisted(&listed["receipt"]), [r"/workspace/caf\xe9.md"]);
    let shown = stdout(&warden(&["runs", "show", "n"], dir.path()));
    assert!(
        shown.contains(r"left out 1 entry whose name is not UTF-8: /workspace/caf\xe9.md"),
        "{shown}"
    );
    assert!(
        shown.contains(r"left out 2 entries whose name is not UTF-8:"),
        "{shown}"
    );
}
