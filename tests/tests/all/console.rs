//! The web console in a real Chromium (Debian's `chromium`, at
//! /usr/bin/chromium) driven by Playwright for Python, both installed by
//! `.ci/run` (Playwright pinned, into target/py-venv): the script
//! `tests/console/console_test.py` logs in, watches a run started from the
//! command line stream in, approves its write from the inbox, denies
//! another with a reason, answers a suspended run through the form made
//! from its recorded schema, reads the audit view, and checks the CSP and
//! the CSRF defences. Screenshots go to target/console-screenshots. A
//! missing browser or Playwright fails the test naming the fix.
//!
//! `tests/console/workers_test.py` does the same over PostgreSQL with two
//! `warden worker` processes: a run started from the console and queued is
//! parked by one worker, that worker is stopped, the approval made in the
//! console is picked up by the other, and a fork made from the run's
//! timeline reuses its effects and completes once approved.
//!
//! `tests/console/live_test.py` holds back the run view's read of a run
//! while the live stream brings newer events (the race a loaded machine
//! makes by itself) and checks that the view catches up with the log.
//!
//! The three share `tests/console/console_common.py`: their arguments, the
//! `warden` command on the test's store, the browser and its page, and
//! logging in.

use std::path::Path;
use std::process::Command;

use crate::binary::warden_binary;
use crate::serve::{add_token, demo, start_server, start_server_with, warden};
use crate::workers::PgSchema;

/// The Python with Playwright, once checked that it and Chromium are there.
fn browser_ready() -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = repo.join("target/py-venv/bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import playwright.sync_api"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ready,
        "Playwright is not installed in {}: run .ci/run's \"Python package\" step",
        python.display()
    );
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "no Chromium at /usr/bin/chromium: `apt-get install chromium` (.ci/run does)"
    );
    python
}

/// An agent whose scripted model asks a person for a count (a human tool
/// with a response schema), then answers with it.
fn ask_agent(dir: &Path) {
    std::fs::write(
        dir.join("ask.toml"),
        r#"
name = "ask"
instructions = "Ask how many, then say it."

[model]
provider = "scripted"
name = "demo"
transcript = "ask.transcript.toml"

[human_tools.ask]
description = "Ask a person"
response_schema = '{"type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}, "note": {"type": "string"}}}'
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("ask.transcript.toml"),
        r#"
[[turns]]
text = "Asking."
[[turns.tool_calls]]
name = "ask"
arguments = { question = "how many?" }

[[turns]]
text = "Counted."
"#,
    )
    .unwrap();
}

/// The demo agent with a model that asks for two writes, one per turn
/// (`call-1-1` to `a.md`, then `call-2-1` to `b.md`), then answers.
fn twice_agent(dir: &Path) {
    let notes = std::fs::read_to_string(dir.join("notes.toml")).unwrap();
    let twice = notes
        .replace("name = \"notes\"", "name = \"twice\"")
        .replace("notes.transcript.toml", "twice.transcript.toml");
    assert!(twice.contains("twice.transcript.toml"), "{twice}");
    std::fs::write(dir.join("twice.toml"), twice).unwrap();
    std::fs::write(
        dir.join("twice.transcript.toml"),
        r#"
[[turns]]
text = "The first."
[[turns.tool_calls]]
name = "fs__write_file"
arguments = { path = "a.md", content = "first\n" }

[[turns]]
text = "The second."
[[turns.tool_calls]]
name = "fs__write_file"
arguments = { path = "b.md", content = "second\n" }

[[turns]]
text = "Both written."
"#,
    )
    .unwrap();
}

/// The run view's read of a run, answered after the live stream brought
/// newer events (the first write approved from the command line, the run
/// parked on the second), is followed by another: the view shows the
/// second write waiting and approving it completes the run. Today's
/// console kept the first write's decision and made no further read.
#[test]
fn the_run_view_catches_up_with_events_streamed_while_it_was_reading_the_run() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = browser_ready();
    let demo = demo();
    let dir = demo.path();
    twice_agent(dir);
    let token = add_token(dir, "olive", "operator");
    let created = warden(dir, "serve.db")
        .args(["store", "migrate"])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let (_server, addr) = start_server(dir, "serve.db");
    let out = Command::new(&python)
        .arg(repo.join("tests/console/live_test.py"))
        .args([&addr, &token])
        .arg(dir)
        .arg(warden_binary())
        .arg("serve.db")
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the live console test failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

#[test]
fn the_console_logs_in_streams_a_run_and_decides_in_a_real_browser() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = browser_ready();
    let demo = demo();
    let dir = demo.path();
    ask_agent(dir);
    let token = add_token(dir, "olive", "operator");
    // The store exists before the server opens it; runs come later.
    let created = warden(dir, "serve.db")
        .args(["store", "migrate"])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let (_server, addr) = start_server(dir, "serve.db");
    let shots = repo.join("target/console-screenshots");
    let out = Command::new(&python)
        .arg(repo.join("tests/console/console_test.py"))
        .args([&addr, &token])
        .arg(dir)
        .arg(warden_binary())
        .arg("serve.db")
        .arg(&shots)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the console test failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_in_the_console_is_picked_up_by_whichever_postgres_worker_holds_the_run() {
    let python = browser_ready();
    let Some(pg) = PgSchema::new("console").await else {
        return;
    };
    let url = pg.url.clone();
    tokio::task::spawn_blocking(move || {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let demo = demo();
        let dir = demo.path();
        let token = add_token(dir, "olive", "operator");
        let created = warden(dir, &url)
            .args(["store", "migrate"])
            .output()
            .unwrap();
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        let (_server, addr) = start_server_with(dir, &url, &["--agent", "notes.toml"]);
        let shots = repo.join("target/console-screenshots");
        let out = Command::new(&python)
            .arg(repo.join("tests/console/workers_test.py"))
            .args([&addr, &token])
            .arg(dir)
            .arg(warden_binary())
            .arg(&url)
            .arg(&shots)
            .env(
                "WARDEN_CACHE_DIR",
                std::env::temp_dir().join("warden-tests-components"),
            )
            .output()
            .unwrap();
        let log = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            out.status.success(),
            "the console test failed:\n{}\n{}\nserver log:\n{}\nw1:\n{}\nw2:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            log("serve.log"),
            log("w1.log"),
            log("w2.log")
        );
    })
    .await
    .unwrap();
}
