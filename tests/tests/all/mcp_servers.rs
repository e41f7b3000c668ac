//! MCP servers as tools of a `warden run` (`[mcp_servers.<name>]`),
//! against a server nobody here wrote the protocol side of: one built with
//! the official MCP Python SDK (`tests/mcp/server.py`, `mcp` on PyPI,
//! pinned, in `target/mcp-venv`), run by the real binary inside its OS
//! sandbox (bubblewrap).
//!
//! - a read tool whose `readOnlyHint` the operator accepted runs at once; a
//!   write waits for `warden runs approve`, then runs once; a tool that only
//!   claims to read is a write;
//! - the sandbox: reading or writing outside the granted directories,
//!   reading `/etc/shadow`, opening a TCP connection to a listener on the
//!   host's loopback, and seeing variables that were not granted all fail,
//!   as the operating system reports it; granted directories work;
//! - a server whose tool list changed since it was pinned has the changed
//!   tool refused until `warden mcp accept`, and `warden mcp tools` shows
//!   the diff;
//! - a server that hangs is killed at the deadline, and the next call
//!   starts it again;
//! - with no sandbox available the server is refused (nothing recorded)
//!   unless the operator opted out, and then Warden says so loudly.
//!
//! Without bubblewrap or the SDK these tests fail, naming what to install.

use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binary::warden_binary;

/// The SDK version `.ci/run` installs into `target/mcp-venv`.
const SDK: &str = "2.3.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The venv's Python (the SDK pinned in it) and the installation it was
/// made from: both must be visible inside the sandbox.
pub(crate) fn python() -> (PathBuf, PathBuf) {
    let python = repo().join("target/mcp-venv/bin/python");
    assert!(
        python.exists(),
        "no virtual environment at {}: run .ci/run (its mcp-venv install)",
        python.display()
    );
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys, importlib.metadata as m; print(m.version('mcp')); print(sys.base_prefix)",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(SDK),
        "the MCP SDK in target/mcp-venv is not {SDK}"
    );
    let base = PathBuf::from(lines.next().unwrap());
    assert!(
        Command::new("bwrap")
            .args([
                "--ro-bind",
                "/",
                "/",
                "--unshare-all",
                "--die-with-parent",
                "true"
            ])
            .status()
            .is_ok_and(|s| s.success()),
        "bubblewrap (`bwrap`) is missing or cannot make a sandbox: apt-get install bubblewrap"
    );
    (python, base)
}

struct Fx {
    dir: tempfile::TempDir,
}

impl Fx {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// An agent using the test server with `turns` as its scripted model
    /// and `extra` appended to its server's table.
    fn new(turns: &str, extra: &str) -> Fx {
        let (python, base) = python();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["data", "out", "secret", "srv"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("data/note.txt"), "hello from the note\n").unwrap();
        std::fs::write(d.join("secret/key.txt"), "the secret key\n").unwrap();
        std::fs::copy(repo().join("tests/mcp/server.py"), d.join("srv/server.py")).unwrap();
        std::fs::write(d.join("transcript.toml"), turns).unwrap();
        let venv = repo().join("target/mcp-venv");
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
        std::fs::write(
            d.join("agent.toml"),
            format!(
                r#"name = "mcp-user"
instructions = "Use the notes server."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[mcp_servers.notes]
command = "{python}"
args = ["{srv}/server.py", "{data}", "{out}"]
read = ["data", "srv", "{venv}", "{base}"]
write = ["out"]
env = ["WARDEN_TEST_GRANTED"]
timeout = "20s"
{extra}
[mcp_servers.notes.tools.read_note]
accept_hints = true
"#,
                python = venv.join("bin/python").display(),
                srv = canon(&d.join("srv")),
                data = canon(&d.join("data")),
                out = canon(&d.join("out")),
                venv = canon(&venv),
                base = canon(&base),
            ),
        )
        .unwrap();
        let _ = python;
        Fx { dir }
    }

    fn warden(&self) -> Command {
        let mut c = Command::new(warden_binary());
        c.current_dir(self.dir.path())
            .env("WARDEN_STORE", self.path("warden.db"))
            .env(
                "WARDEN_CACHE_DIR",
                std::env::temp_dir().join("warden-tests-components"),
            )
            .env("WARDEN_TEST_GRANTED", "granted")
            .env("WARDEN_TEST_SECRET", "not granted")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        c
    }

    /// [`warden`](Self::warden) with the remote server's header value in
    /// its variable.
    fn remote_warden(&self) -> Command {
        let mut c = self.warden();
        c.env("WARDEN_TEST_HEADER", HEADER_SECRET);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.warden().args(args).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.warden().arg("--json").args(args).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "warden {args:?} ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
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

/// The completed tool calls' outputs, in order, as text.
fn outputs(run: &Value) -> Vec<String> {
    events(run, "tool_call_completed")
        .iter()
        .map(|e| e["result"].to_string())
        .collect()
}

fn calls(names: &[(&str, &str)]) -> String {
    let mut t = String::new();
    for (name, args) in names {
        t.push_str(&format!(
            "[[turns]]\ntext = \"calling {name}\"\n[[turns.tool_calls]]\nname = \"{name}\"\narguments = {args}\n\n"
        ));
    }
    t.push_str("[[turns]]\ntext = \"done\"\n");
    t
}

/// The only run in the store, as `runs show` prints it.
fn only_run(fx: &Fx) -> Value {
    let runs = fx.json(&["runs", "list"]);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    fx.json(&["runs", "show", runs[0]["run_id"].as_str().unwrap()])
}

#[test]
fn a_read_runs_and_a_write_waits_for_approval_then_runs_once() {
    let fx = Fx::new(
        &calls(&[
            ("notes__read_note", "{ name = \"note.txt\" }"),
            (
                "notes__write_note",
                "{ name = \"a.txt\", text = \"written\" }",
            ),
        ]),
        "",
    );
    let out = fx.run(&["run", "agent.toml"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let run = only_run(&fx);
    assert_eq!(run["status"], "awaiting_approval", "{run:#}");
    assert!(outputs(&run)[0].contains("hello from the note"), "{run:#}");
    assert!(
        !fx.path("out/a.txt").exists(),
        "a write ran before approval"
    );
    // The pins were recorded at first use.
    let pins: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.path("agent.mcp-pins.json")).unwrap())
            .unwrap();
    assert!(
        pins["servers"]["notes"]["tools"]["write_note"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );

    let run_id = run["run_id"].as_str().unwrap();
    let requested = events(&run, "approval_requested");
    let call_id = requested[0]["call_id"].as_str().unwrap();
    let out = fx.run(&["runs", "approve", run_id, call_id]);
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(&fx);
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(
        std::fs::read_to_string(fx.path("out/a.txt")).unwrap(),
        "written"
    );
    assert_eq!(events(&run, "tool_call_intent").len(), 2, "{run:#}");
    assert_eq!(events(&run, "tool_call_completed").len(), 2, "{run:#}");

    // A claim of readOnlyHint the operator did not accept is a write.
    let tools = fx.json(&["mcp", "tools", "notes", "--agent", "agent.toml"]);
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(tool("peek")["claimed_effect"], "read", "{tools:#}");
    assert_eq!(tool("peek")["effect"], "write", "{tools:#}");
    assert_eq!(tool("peek")["needs_approval"], true, "{tools:#}");
    assert_eq!(tool("read_note")["effect"], "read", "{tools:#}");
    assert_eq!(tool("read_note")["needs_approval"], false, "{tools:#}");
    assert_eq!(tools["matches_pins"], true, "{tools:#}");
}

#[test]
fn the_os_sandbox_refuses_what_was_not_granted() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let fx = Fx::new("", "");
    let d = std::fs::canonicalize(fx.dir.path()).unwrap();
    let p = |rel: &str| d.join(rel).display().to_string();
    let read_path = |path: String| format!("{{ path = \"{path}\" }}");
    let turns = calls(&[
        ("notes__read_path", &read_path(p("data/note.txt"))),
        ("notes__read_path", &read_path(p("secret/key.txt"))),
        ("notes__read_path", &read_path("/etc/shadow".into())),
        ("notes__read_path", &read_path("/root/.bashrc".into())),
        (
            "notes__write_path",
            &format!("{{ path = \"{}\", text = \"x\" }}", p("data/planted.txt")),
        ),
        (
            "notes__write_path",
            &format!("{{ path = \"{}\", text = \"x\" }}", p("secret/planted.txt")),
        ),
        (
            "notes__connect",
            &format!("{{ host = \"127.0.0.1\", port = {port} }}"),
        ),
        ("notes__env_names", "{}"),
    ]);
    std::fs::write(fx.path("transcript.toml"), turns).unwrap();
    // The operator trusts these tools' claims: no approval in the way.
    let agent = std::fs::read_to_string(fx.path("agent.toml")).unwrap();
    let mut agent = agent;
    for tool in ["read_path", "write_path", "connect", "env_names"] {
        agent.push_str(&format!(
            "[mcp_servers.notes.tools.{tool}]\neffect = \"read\"\n"
        ));
    }
    std::fs::write(fx.path("agent.toml"), agent).unwrap();

    let out = fx.run(&["run", "agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(&fx);
    let o = outputs(&run);
    assert_eq!(o.len(), 8, "{run:#}");
    assert!(
        o[0].contains("hello from the note"),
        "a granted directory is readable: {o:?}"
    );
    assert!(o[1].contains("ERROR ENOENT"), "outside the grant: {}", o[1]);
    assert!(o[2].contains("ERROR ENOENT"), "/etc/shadow: {}", o[2]);
    assert!(o[3].contains("ERROR ENOENT"), "/root: {}", o[3]);
    assert!(
        o[4].contains("ERROR EROFS"),
        "a read-only directory: {}",
        o[4]
    );
    assert!(o[5].contains("ERROR ENOENT"), "outside the grant: {}", o[5]);
    assert!(!fx.path("data/planted.txt").exists());
    assert!(!fx.path("secret/planted.txt").exists());
    assert!(
        o[6].contains("ERROR ENETUNREACH") || o[6].contains("ERROR ECONNREFUSED"),
        "no network: {}",
        o[6]
    );
    let mut buf = [0u8; 16];
    match listener.accept() {
        Ok((mut s, _)) => panic!(
            "the sandboxed server reached the host's loopback: {:?}",
            s.read(&mut buf)
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
    }
    assert!(o[7].contains("WARDEN_TEST_GRANTED"), "{}", o[7]);
    assert!(!o[7].contains("WARDEN_TEST_SECRET"), "{}", o[7]);
    assert!(!o[7].contains("WARDEN_STORE"), "{}", o[7]);
}

/// Breaks 2 and 11 of issue 37. A `write` directory swapped for a
/// relative symlink (`out -> secret`) between two processes must not be
/// bound into the server's sandbox: the second `warden run` refuses the
/// agent, naming the key and the link, and the server never reads the
/// secret or plants a file beside it. And the server's `/proc/1/cmdline`
/// (bubblewrap, its pid 1) does not show the sandbox's command line: its
/// arguments are passed on a descriptor.
#[test]
fn a_bound_directory_swapped_for_a_symlink_is_refused_not_bound() {
    let fx = Fx::new("", "");
    let d = std::fs::canonicalize(fx.dir.path()).unwrap();
    let p = |rel: &str| d.join(rel).display().to_string();
    let turns = calls(&[
        ("notes__read_path", "{ path = \"/proc/1/cmdline\" }"),
        (
            "notes__read_path",
            &format!("{{ path = \"{}\" }}", p("secret/key.txt")),
        ),
        (
            "notes__write_path",
            &format!("{{ path = \"{}\", text = \"x\" }}", p("secret/planted.txt")),
        ),
    ]);
    std::fs::write(fx.path("transcript.toml"), turns).unwrap();
    let mut agent = std::fs::read_to_string(fx.path("agent.toml")).unwrap();
    for tool in ["read_path", "write_path"] {
        agent.push_str(&format!(
            "[mcp_servers.notes.tools.{tool}]\neffect = \"read\"\n"
        ));
    }
    std::fs::write(fx.path("agent.toml"), agent).unwrap();

    let out = fx.run(&["run", "agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    let o = outputs(&only_run(&fx));
    assert_eq!(o.len(), 3, "{o:?}");
    assert!(o[0].contains("server.py"), "pid 1's command line: {}", o[0]);
    for shown in ["--unshare-all", "--ro-bind", "--cap-drop"] {
        assert!(
            !o[0].contains(shown),
            "the sandbox's command line is visible inside it: {}",
            o[0]
        );
    }
    assert!(o[1].contains("ERROR ENOENT"), "outside the grant: {}", o[1]);
    assert!(o[2].contains("ERROR ENOENT"), "outside the grant: {}", o[2]);

    // The swap, as a server or plugin with write access beside `out` could
    // make it: the directory moved away, a relative link in its place.
    std::fs::rename(fx.path("out"), fx.path("out.moved")).unwrap();
    std::os::unix::fs::symlink("secret", fx.path("out")).unwrap();
    let second = fx.run(&["run", "agent.toml"]);
    let said = text(&second);
    for run in fx.json(&["runs", "list"]).as_array().unwrap() {
        let shown = fx.json(&["runs", "show", run["run_id"].as_str().unwrap()]);
        assert!(
            !shown.to_string().contains("the secret key"),
            "the swapped directory was bound into the sandbox: {shown:#}"
        );
    }
    assert!(!said.contains("the secret key"), "{said}");
    assert!(!fx.path("secret/planted.txt").exists());
    assert_eq!(second.status.code(), Some(2), "{said}");
    for needle in ["mcp_servers.notes.write[0]", "symbolic link", "`secret`"] {
        assert!(said.contains(needle), "`{needle}` not in: {said}");
    }
}

#[test]
fn a_changed_tool_list_is_refused_until_accepted() {
    let turns = calls(&[("notes__read_note", "{ name = \"note.txt\" }")]);
    let fx = Fx::new(&turns, "");
    let out = fx.run(&["run", "agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    let pins_before = std::fs::read_to_string(fx.path("agent.mcp-pins.json")).unwrap();

    // The rug pull: the same server, another description.
    std::fs::write(fx.path("data/variant"), "2").unwrap();
    let tools = fx.json(&["mcp", "tools", "notes", "--agent", "agent.toml"]);
    assert_eq!(tools["matches_pins"], false, "{tools:#}");
    assert_eq!(tools["changed"][0]["tool"], "read_note", "{tools:#}");
    assert_eq!(
        tools["changed"][0]["fields"][0]["field"], "description",
        "{tools:#}"
    );
    let human = fx.run(&["mcp", "tools", "notes", "--agent", "agent.toml"]);
    let shown = text(&human);
    assert!(shown.contains("DIFFERS from the pinned list"), "{shown}");
    assert!(
        shown.contains("~/.ssh/id_rsa"),
        "the diff shows the new text: {shown}"
    );
    assert_eq!(
        std::fs::read_to_string(fx.path("agent.mcp-pins.json")).unwrap(),
        pins_before,
        "listing does not accept"
    );

    std::fs::remove_file(fx.path("warden.db")).unwrap();
    let out = fx.run(&["run", "agent.toml"]);
    assert!(
        text(&out).contains("is not offered"),
        "Warden says why: {}",
        text(&out)
    );
    let run = only_run(&fx);
    assert!(
        events(&run, "tool_call_intent").is_empty(),
        "the changed tool ran: {run:#}"
    );

    let out = fx.run(&["mcp", "accept", "notes", "--agent", "agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("accepted"), "{}", text(&out));
    std::fs::remove_file(fx.path("warden.db")).unwrap();
    let out = fx.run(&["run", "agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(&fx);
    assert!(outputs(&run)[0].contains("hello from the note"), "{run:#}");
}

#[test]
fn a_hung_server_is_killed_at_the_deadline_and_started_again() {
    let turns = calls(&[
        ("notes__hang", "{}"),
        ("notes__read_note", "{ name = \"note.txt\" }"),
    ]);
    let fx = Fx::new(&turns, "");
    let agent = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace("timeout = \"20s\"", "timeout = \"2s\"");
    std::fs::write(
        fx.path("agent.toml"),
        format!("{agent}[mcp_servers.notes.tools.hang]\neffect = \"read\"\n"),
    )
    .unwrap();
    let started = Instant::now();
    let out = fx.run(&["run", "agent.toml"]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(&fx);
    // A read is tried again: each attempt hit the deadline.
    let failed = events(&run, "tool_call_attempt_failed");
    assert!(!failed.is_empty(), "{run:#}");
    let o = outputs(&run);
    assert!(o[0].contains("deadline"), "{o:?}");
    assert!(o[1].contains("hello from the note"), "started again: {o:?}");
    let hangs = std::fs::read_dir(fx.path("out"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("hang-")
        })
        .count();
    assert_eq!(hangs as u32, 3, "one server per attempt");
    assert!(took < Duration::from_secs(60), "{took:?}");
    // No server process outlived the run. The sandbox's own child dies
    // with bubblewrap (`--die-with-parent`), which the kernel signals as
    // Warden exits: give a loaded machine a moment to deliver it.
    let marker = fx.dir.path().display().to_string();
    let survivors = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
            .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
            .filter(|cmdline| cmdline.contains(&marker) && cmdline.contains("server.py"))
            .collect::<Vec<_>>()
    };
    let exited = Instant::now();
    while !survivors().is_empty() && exited.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = survivors();
    assert!(
        left.is_empty(),
        "a server outlived its run by 5 s: {left:?}"
    );
}

#[test]
fn without_a_sandbox_a_local_server_is_refused_unless_the_operator_opts_out() {
    let d_turns = calls(&[("notes__read_note", "{ name = \"note.txt\" }")]);
    let fx = Fx::new(&d_turns, "");
    // A PATH without bubblewrap: no sandbox to be had.
    let out = fx
        .warden()
        .env("PATH", "/nonexistent")
        .args(["--json", "run", "agent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let error: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| serde_json::from_slice(&out.stderr).unwrap_or(Value::Null));
    assert!(
        text(&out).contains("mcp_sandbox_unavailable"),
        "{error:#} {}",
        text(&out)
    );
    assert!(
        !fx.path("agent.mcp-pins.json").exists(),
        "a refused server was not even started"
    );

    let fx = Fx::new(&d_turns, "unsandboxed = true");
    let out = fx
        .warden()
        .env("PATH", "/nonexistent")
        .args(["run", "agent.toml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("WITHOUT an OS sandbox"),
        "the opt-out is loud: {}",
        text(&out)
    );
}

/// The reference filesystem server (`@modelcontextprotocol/server-filesystem`
/// from npm, pinned in `tests/mcp/package.json`), under Node in its sandbox.
fn reference_server() -> PathBuf {
    let server = repo()
        .join("target/mcp-js/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(
        server.exists(),
        "no reference server at {}: run .ci/run (its npm-tools install)",
        server.display()
    );
    server
}

#[test]
fn the_reference_filesystem_server_reads_at_once_and_writes_after_approval() {
    let server = reference_server();
    python(); // bubblewrap's check
    let node = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .unwrap();
    let node = String::from_utf8_lossy(&node.stdout).trim().to_owned();
    assert!(!node.is_empty(), "no `node` on PATH: install Node.js");
    let node = std::fs::canonicalize(node).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(d.join("work")).unwrap();
    std::fs::create_dir(d.join("secret")).unwrap();
    std::fs::write(d.join("work/hello.txt"), "hello, reference server\n").unwrap();
    std::fs::write(d.join("secret/key.txt"), "the secret key\n").unwrap();
    let work = d.join("work").display().to_string();
    let turns = calls(&[
        (
            "fs__read_text_file",
            &format!("{{ path = \"{work}/hello.txt\" }}"),
        ),
        (
            "fs__write_file",
            &format!("{{ path = \"{work}/new.txt\", content = \"from the model\" }}"),
        ),
    ]);
    std::fs::write(d.join("transcript.toml"), turns).unwrap();
    let js = std::fs::canonicalize(repo().join("target/mcp-js")).unwrap();
    std::fs::write(
        d.join("agent.toml"),
        format!(
            r#"name = "fs-user"
instructions = "Use the filesystem server."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[mcp_servers.fs]
command = "{node}"
args = ["{server}", "{work}"]
read = ["{js}"]
write = ["work"]

[mcp_servers.fs.tools.read_text_file]
accept_hints = true
"#,
            node = node.display(),
            server = std::fs::canonicalize(server).unwrap().display(),
            js = js.display(),
        ),
    )
    .unwrap();
    let fx = Fx { dir };
    let out = fx.run(&["run", "agent.toml"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let run = only_run(&fx);
    assert!(
        outputs(&run)[0].contains("hello, reference server"),
        "{run:#}"
    );
    assert!(!d.join("work/new.txt").exists(), "written before approval");
    let requested = events(&run, "approval_requested");
    assert_eq!(requested.len(), 1, "{run:#}");
    let out = fx.run(&[
        "runs",
        "approve",
        run["run_id"].as_str().unwrap(),
        requested[0]["call_id"].as_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(d.join("work/new.txt")).unwrap(),
        "from the model"
    );
    let run = only_run(&fx);
    assert_eq!(run["status"], "completed", "{run:#}");
    // Its write_file claims idempotentHint; unaccepted, it stayed a write.
    let tools = fx.json(&["mcp", "tools", "fs", "--agent", "agent.toml"]);
    let write = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "write_file")
        .unwrap();
    assert_eq!(write["claimed_effect"], "idempotent", "{tools:#}");
    assert_eq!(write["effect"], "write", "{tools:#}");
}

/// `warden --json ARGS` refused as `mcp_server_failed`: its message.
fn server_failed(fx: &Fx, args: &[&str]) -> String {
    let out = fx.warden().arg("--json").args(args).output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let envelope: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(
        envelope["error"]["code"], "mcp_server_failed",
        "{envelope:#}"
    );
    assert_eq!(
        envelope["error"]["details"]["server"], "notes",
        "{envelope:#}"
    );
    envelope["error"]["message"].as_str().unwrap().to_owned()
}

/// A server that fails to start says why: its exit status and the end of
/// its stderr. A command that resolves outside what its sandbox sees (a
/// link out of a granted directory, a script whose interpreter is not
/// granted) is refused before it starts, naming the path; a server that
/// dies mid-call says the same in the call's failure.
#[test]
fn a_server_that_cannot_start_says_why() {
    let turns = calls(&[("notes__read_note", "{ name = \"note.txt\" }")]);
    let fx = Fx::new(&turns, "");
    std::fs::write(
        fx.path("srv/server.py"),
        "import sys\nsys.stderr.write('starting\\nboom: no database at /srv/notes.db\\n')\nsys.exit(3)\n",
    )
    .unwrap();
    for args in [
        &["run", "agent.toml"][..],
        &["mcp", "tools", "notes", "--agent", "agent.toml"],
    ] {
        let message = server_failed(&fx, args);
        assert!(message.contains("exited with status 3"), "{message}");
        assert!(
            message.contains("boom: no database at /srv/notes.db"),
            "{message}"
        );
    }

    // A command linked out of the granted directories, and a script whose
    // interpreter is not granted: refused, naming the path, nothing run.
    let d = std::fs::canonicalize(fx.dir.path()).unwrap();
    std::fs::write(d.join("secret/server"), "#!/bin/sh\necho ran > /tmp/ran\n").unwrap();
    std::os::unix::fs::symlink(d.join("secret/server"), d.join("data/server")).unwrap();
    std::fs::copy("/bin/sh", d.join("secret/sh")).unwrap();
    std::fs::write(
        d.join("data/script"),
        format!("#!{}\necho ran\n", d.join("secret/sh").display()),
    )
    .unwrap();
    for f in ["secret/server", "data/script"] {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let agent = std::fs::read_to_string(d.join("agent.toml")).unwrap();
    let command = agent
        .lines()
        .find(|l| l.starts_with("command = "))
        .unwrap()
        .to_owned();
    for (program, named) in [
        ("data/server", "secret/server"),
        ("data/script", "secret/sh"),
    ] {
        std::fs::write(
            d.join("agent.toml"),
            agent.replace(
                &command,
                &format!("command = \"{}\"", d.join(program).display()),
            ),
        )
        .unwrap();
        let message = server_failed(&fx, &["run", "agent.toml"]);
        assert!(
            message.contains(&format!("`{}`", d.join(named).display())),
            "{program}: {message}"
        );
        assert!(
            message.contains("outside what its sandbox sees"),
            "{message}"
        );
    }
}

/// The reference "everything" server (`@modelcontextprotocol/server-everything`
/// from npm, pinned in `tests/mcp/package.json`), whose tools are named with
/// hyphens (`get-sum`): called through an agent by the names MCP gave them,
/// one renamed by the operator, and `warden mcp tools` showing both names.
#[test]
fn server_everythings_hyphenated_tools_are_called_through_an_agent() {
    let server = repo()
        .join("target/mcp-js/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        server.exists(),
        "no server-everything at {}: run .ci/run (its npm-tools install)",
        server.display()
    );
    python(); // bubblewrap's check
    let node = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .unwrap();
    let node = String::from_utf8_lossy(&node.stdout).trim().to_owned();
    assert!(!node.is_empty(), "no `node` on PATH: install Node.js");
    let node = std::fs::canonicalize(node).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = std::fs::canonicalize(dir.path()).unwrap();
    let turns = calls(&[
        ("ev__get-sum", "{ a = 2, b = 40 }"),
        ("ev__weather", "{ location = \"Chicago\" }"),
    ]);
    std::fs::write(d.join("transcript.toml"), turns).unwrap();
    let js = std::fs::canonicalize(repo().join("target/mcp-js")).unwrap();
    std::fs::write(
        d.join("agent.toml"),
        format!(
            r#"name = "everything-user"
instructions = "Use the everything server."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[mcp_servers.ev]
command = "{node}"
args = ["{server}", "stdio"]
read = ["{js}"]

[mcp_servers.ev.tools.get-sum]
accept_hints = true

[mcp_servers.ev.tools.get-structured-content]
effect = "read"
rename = "weather"
"#,
            node = node.display(),
            server = std::fs::canonicalize(server).unwrap().display(),
            js = js.display(),
        ),
    )
    .unwrap();
    let fx = Fx { dir };
    let out = fx.run(&["run", "agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(&fx);
    assert_eq!(run["status"], "completed", "{run:#}");
    let outputs = outputs(&run);
    assert_eq!(outputs.len(), 2, "{run:#}");
    assert!(outputs[0].contains("42"), "{outputs:?}");
    assert!(outputs[1].contains("temperature"), "{outputs:?}");
    let intents = events(&run, "tool_call_intent");
    assert_eq!(intents[0]["tool"]["tool"], "get-sum", "{run:#}");
    assert_eq!(intents[1]["tool"]["tool"], "weather", "{run:#}");

    let tools = fx.json(&["mcp", "tools", "ev", "--agent", "agent.toml"]);
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {tools:#}"))
            .clone()
    };
    assert_eq!(tool("get-sum")["model_name"], "ev__get-sum");
    assert_eq!(tool("get-sum")["offered"], true);
    let renamed = tool("get-structured-content");
    assert_eq!(renamed["model_name"], "ev__weather");
    assert_eq!(renamed["offered"], true);
    // Every tool the server lists is offered.
    let all = tools["tools"].as_array().unwrap();
    assert!(all.len() >= 10, "{tools:#}");
    assert!(all.iter().all(|t| t["offered"] == true), "{tools:#}");
    let out = fx.run(&["mcp", "tools", "ev", "--agent", "agent.toml"]);
    assert!(
        text(&out).contains("ev__weather (the server's `get-structured-content`)"),
        "{}",
        text(&out)
    );
}

/// The test server (`tests/mcp/server.py`, the official Python SDK) serving
/// streamable HTTP on a loopback port: a remote server, started by the
/// test, not by Warden. Killed when dropped.
pub(crate) struct HttpServer {
    child: std::process::Child,
    pub(crate) port: u16,
    log: PathBuf,
}

impl HttpServer {
    /// Serves `fx`'s data and out directories on a free port (`port`, or
    /// any).
    fn start(fx: &Fx, port: Option<u16>) -> HttpServer {
        HttpServer::serve(fx.dir.path(), port)
    }

    /// Serves `dir`'s `data` and `out` with `dir/srv/server.py` on a free
    /// port (`port`, or any).
    pub(crate) fn serve(dir: &Path, port: Option<u16>) -> HttpServer {
        let (python, _) = python();
        let port = port.unwrap_or_else(|| {
            TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let log = dir.join(format!("http-server-{port}.log"));
        let child = Command::new(python)
            .arg(dir.join("srv/server.py"))
            .arg(dir.join("data"))
            .arg(dir.join("out"))
            .args(["--http", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        let server = HttpServer { child, port, log };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the HTTP server did not listen: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// What it logged (uvicorn logs each request).
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The header value the remote tests send, from a variable: never in the
/// agent file, the log or Warden's output.
const HEADER_SECRET: &str = "s3cret-header-value-9f1c";

/// `fx`'s agent turned into one that reaches `server` over HTTP with `hosts`
/// granted, `extra` appended to the server's table.
fn remote_agent(fx: &Fx, server: &HttpServer, hosts: &str, extra: &str) {
    std::fs::write(
        fx.path("agent.toml"),
        format!(
            r#"name = "mcp-remote-user"
instructions = "Use the remote notes server."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[mcp_servers.notes]
url = "{url}"
hosts = {hosts}
header_env = {{ "X-Warden-Test" = "WARDEN_TEST_HEADER" }}
timeout = "20s"
{extra}
[mcp_servers.notes.tools.read_note]
accept_hints = true
[mcp_servers.notes.tools.header]
effect = "read"
"#,
            url = server.url(),
        ),
    )
    .unwrap();
}

/// An agent whose scripted model plays `turns` and whose `notes` server is
/// the test server over HTTP, started here on a free port, that port
/// granted and `extra` appended to the server's table. The server stops
/// when the returned value is dropped.
fn remote(turns: &str, extra: &str) -> (Fx, HttpServer) {
    let fx = Fx::new(turns, "");
    let server = HttpServer::start(&fx, None);
    remote_agent(
        &fx,
        &server,
        &format!("[\"127.0.0.1:{}\"]", server.port),
        extra,
    );
    (fx, server)
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

#[test]
fn a_remote_server_reads_at_once_writes_after_approval_and_gets_its_header() {
    let (fx, _server) = remote(
        &calls(&[
            ("notes__read_note", "{ name = \"note.txt\" }"),
            ("notes__header", "{ name = \"X-Warden-Test\" }"),
            (
                "notes__write_note",
                "{ name = \"a.txt\", text = \"written remotely\" }",
            ),
        ]),
        "",
    );
    let agent = std::fs::read_to_string(fx.path("agent.toml")).unwrap();
    assert!(!agent.contains(HEADER_SECRET));

    let out = fx
        .remote_warden()
        .args(["run", "agent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let run = only_run(&fx);
    assert_eq!(run["status"], "awaiting_approval", "{run:#}");
    let o = outputs(&run);
    assert!(o[0].contains("hello from the note"), "{o:?}");
    // The server saw the header's value; only its digest comes back.
    assert!(
        o[1].contains(&format!(
            "X-Warden-Test=sha256:{}",
            sha256_hex(HEADER_SECRET)
        )),
        "{o:?}"
    );
    assert!(
        !fx.path("out/a.txt").exists(),
        "a write ran before approval"
    );

    // The run's log says which pinned list the model was offered.
    let pins: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.path("agent.mcp-pins.json")).unwrap())
            .unwrap();
    let started = &events(&run, "run_started")[0];
    assert_eq!(
        started["mcp_tools"]["notes"]["pins"], pins["servers"]["notes"]["digest"],
        "{started:#}"
    );
    let offered = started["mcp_tools"]["notes"]["offered"].as_array().unwrap();
    assert!(offered.iter().any(|t| t == "write_note"), "{started:#}");

    let run_id = run["run_id"].as_str().unwrap();
    let call_id = events(&run, "approval_requested")[0]["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = fx
        .remote_warden()
        .args(["runs", "approve", run_id, &call_id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(HEADER_SECRET));
    let run = only_run(&fx);
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(
        std::fs::read_to_string(fx.path("out/a.txt")).unwrap(),
        "written remotely"
    );
    assert_eq!(events(&run, "tool_call_intent").len(), 3, "{run:#}");
    // The secret is in no file Warden wrote (the store, the pins) and in
    // nothing it printed.
    for file in ["warden.db", "agent.mcp-pins.json"] {
        let bytes = std::fs::read(fx.path(file)).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(HEADER_SECRET),
            "{file} holds the header's value"
        );
    }
    assert!(!run.to_string().contains(HEADER_SECRET));

    // Without the variable the server is not reached, and it says which.
    std::fs::remove_file(fx.path("warden.db")).unwrap();
    let out = fx.run(&["--json", "run", "agent.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("env_missing"), "{}", text(&out));
    assert!(text(&out).contains("WARDEN_TEST_HEADER"), "{}", text(&out));
}

#[test]
fn a_remote_host_not_granted_is_refused_before_anything_is_recorded() {
    let fx = Fx::new(
        &calls(&[("notes__read_note", "{ name = \"note.txt\" }")]),
        "",
    );
    let server = HttpServer::start(&fx, None);
    for hosts in ["[]", "[\"mcp.example.com\"]", "[\"127.0.0.1:1\"]"] {
        remote_agent(&fx, &server, hosts, "");
        let out = fx
            .remote_warden()
            .args(["--json", "run", "agent.toml"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{hosts}: {}", text(&out));
        let error: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!("{hosts}: not JSON: {}", text(&out));
        });
        assert_eq!(error["error"]["code"], "mcp_host_not_granted", "{error:#}");
        assert_eq!(
            error["error"]["details"]["host"],
            format!("127.0.0.1:{}", server.port),
            "{error:#}"
        );
        assert!(
            !fx.path("agent.mcp-pins.json").exists(),
            "a refused server was reached"
        );
        let runs = fx.json(&["runs", "list"]);
        assert!(runs.as_array().is_none_or(|r| r.is_empty()), "{runs:#}");
    }
    assert!(
        !server.log().contains("POST /mcp"),
        "a request reached the server: {}",
        server.log()
    );
    // `*` and a name pattern allow no loopback address: only the address
    // itself does.
    remote_agent(&fx, &server, "[\"*\"]", "");
    let out = fx
        .remote_warden()
        .args(["run", "agent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("not public"), "{}", text(&out));
    assert!(!server.log().contains("POST /mcp"), "{}", server.log());
}

#[test]
fn a_changed_remote_tool_list_is_refused_until_accepted() {
    let (fx, server) = remote(
        &calls(&[("notes__read_note", "{ name = \"note.txt\" }")]),
        "",
    );
    let run = |fx: &Fx| {
        fx.remote_warden()
            .args(["run", "agent.toml"])
            .output()
            .unwrap()
    };
    let out = run(&fx);
    assert!(out.status.success(), "{}", text(&out));
    let first = only_run(&fx);
    let pinned = events(&first, "run_started")[0]["mcp_tools"]["notes"]["pins"].clone();

    // The rug pull: the server restarted with another description.
    let port = server.port;
    drop(server);
    std::fs::write(fx.path("data/variant"), "2").unwrap();
    let server = HttpServer::start(&fx, Some(port));
    std::fs::remove_file(fx.path("warden.db")).unwrap();
    let out = run(&fx);
    assert!(text(&out).contains("is not offered"), "{}", text(&out));
    let run_log = only_run(&fx);
    assert!(
        events(&run_log, "tool_call_intent").is_empty(),
        "{run_log:#}"
    );
    let offered = &events(&run_log, "run_started")[0]["mcp_tools"]["notes"];
    assert_eq!(offered["pins"], pinned, "still the pinned list");
    assert!(
        !offered["offered"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "read_note"),
        "{offered:#}"
    );

    let out = fx
        .remote_warden()
        .args(["mcp", "accept", "notes", "--agent", "agent.toml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(fx.path("warden.db")).unwrap();
    let out = run(&fx);
    assert!(out.status.success(), "{}", text(&out));
    let run_log = only_run(&fx);
    assert!(
        outputs(&run_log)[0].contains("hello from the note"),
        "{run_log:#}"
    );
    assert_ne!(
        events(&run_log, "run_started")[0]["mcp_tools"]["notes"]["pins"],
        pinned,
        "the accepted list is recorded"
    );
    drop(server);
}

#[test]
fn a_hung_remote_server_fails_at_the_deadline_and_the_run_goes_on() {
    let turns = calls(&[
        ("notes__hang", "{}"),
        ("notes__read_note", "{ name = \"note.txt\" }"),
    ]);
    let (fx, server) = remote(&turns, "");
    let agent = std::fs::read_to_string(fx.path("agent.toml"))
        .unwrap()
        .replace("timeout = \"20s\"", "timeout = \"2s\"");
    std::fs::write(
        fx.path("agent.toml"),
        format!("{agent}[mcp_servers.notes.tools.hang]\neffect = \"read\"\n"),
    )
    .unwrap();
    let started = Instant::now();
    let out = fx
        .remote_warden()
        .args(["run", "agent.toml"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(&fx);
    // A read is tried again by its retry rules: each attempt hit the
    // deadline, then the run went on.
    let failed = events(&run, "tool_call_attempt_failed");
    assert!(!failed.is_empty(), "{run:#}");
    let o = outputs(&run);
    assert!(o[0].contains("deadline"), "{o:?}");
    assert!(o[1].contains("hello from the note"), "a new session: {o:?}");
    let hangs = std::fs::read_dir(fx.path("out"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("hang-")
        })
        .count();
    assert_eq!(hangs, failed.len() + 1, "one call per attempt");
    assert!(took < Duration::from_secs(60), "{took:?}");
    drop(server);
}

/// A result over `max_output` fails the call with the output limit, cut as
/// it arrives (the bytes read when it was cut are recorded, far fewer than
/// were sent), over stdio and over HTTP; the next call gets a fresh session.
#[test]
fn a_result_over_max_output_fails_with_the_output_limit() {
    const SENT: u64 = 20 << 20;
    let turns = calls(&[
        ("notes__big", &format!("{{ size = {SENT} }}")),
        ("notes__big", "{ size = 100 }"),
    ]);
    let check = |fx: &Fx, out: Output| {
        assert!(out.status.success(), "{}", text(&out));
        let run = only_run(fx);
        let o = outputs(&run);
        assert_eq!(o.len(), 2, "{run:#}");
        assert!(o[0].contains("over its output limit of 1024"), "{}", o[0]);
        let receipts: Vec<&Value> = events(&run, "tool_call_completed")
            .into_iter()
            .map(|e| &e["receipt"])
            .collect();
        assert_eq!(receipts[0]["outcome"], "output_limit", "{run:#}");
        let read = receipts[0]["output_bytes"].as_u64().unwrap();
        assert!(
            read > 1024 && read < 1 << 20,
            "cut at {read} bytes of {SENT}: {run:#}"
        );
        assert!(o[1].contains(&"x".repeat(100)), "{o:?}");
    };
    let limit = "max_output = \"1KiB\"\n[mcp_servers.notes.tools.big]\neffect = \"read\"";

    let fx = Fx::new(&turns, limit);
    let out = fx.run(&["run", "agent.toml"]);
    check(&fx, out);

    let (fx, server) = remote(&turns, limit);
    let out = fx
        .remote_warden()
        .args(["run", "agent.toml"])
        .output()
        .unwrap();
    check(&fx, out);
    drop(server);
}
