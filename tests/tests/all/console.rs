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

/// The console writes money, durations, counts and times by the command
/// line's rule (`format_amount`, `utc_text`): its `format.js`, run by
/// Node (which `.ci/run`'s JavaScript steps need too), gives the same text
/// for every value here, ties and long fractions included.
#[test]
fn the_console_writes_amounts_as_the_command_line_does() {
    use warden::engine::budget::{BudgetKind, format_amount};
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let module = repo.join("host/server/src/console/format.js");
    let mut cases = Vec::new();
    for n in [
        0u64,
        1,
        75,
        999,
        1_000,
        1_250,
        1_050,
        1_150,
        2_750,
        9_999,
        10_650_000,
        59_999,
        60_000,
        61_250,
        850_000,
        3_600_000,
        3_723_000,
        1_000_000_000,
        1_234_567_891,
        13_839_000,
        300_000,
        9_007_199_254_740_991,
    ] {
        for kind in [BudgetKind::Cost, BudgetKind::WallTime, BudgetKind::Steps] {
            for currency in [Some("USD"), Some("EUR"), Some("CHF"), None] {
                cases.push(serde_json::json!({
                    "kind": kind.as_str(),
                    "n": n,
                    "currency": currency,
                    "text": format_amount(kind, n, currency),
                }));
            }
        }
    }
    let times: Vec<serde_json::Value> =
        [0i64, 1_700_000_000_999, 951_782_400_000, 1_764_892_800_500]
            .iter()
            .map(|&ms| serde_json::json!({ "ms": ms, "text": warden::units::utc_text(ms) }))
            .collect();
    let script = format!(
        "import * as f from {module:?};
         const cases = {cases}; const times = {times};
         const wrong = [];
         for (const c of cases) {{
           const got = f.amount(c.kind, c.n, c.currency);
           if (got !== c.text) wrong.push(`${{c.kind}} ${{c.n}} ${{c.currency}}: console ${{got}}, command line ${{c.text}}`);
         }}
         for (const t of times) {{
           const got = f.utc(t.ms);
           if (got !== t.text) wrong.push(`time ${{t.ms}}: console ${{got}}, command line ${{t.text}}`);
         }}
         console.log(wrong.join('\\n'));
         process.exit(wrong.length ? 1 : 0);",
        module = module.display().to_string(),
        cases = serde_json::Value::from(cases),
        times = serde_json::Value::from(times),
    );
    let out = Command::new("node")
        .args(["--input-type=module", "-e", &script])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run node ({e}): install Node.js as .ci/run's JavaScript steps need")
        });
    assert!(
        out.status.success(),
        "the console and the command line write amounts differently:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The charting library the console serves is the pinned uPlot release
/// its README names, unchanged, with its licence beside it.
#[test]
fn the_vendored_chart_library_is_the_pinned_release() {
    use sha2::{Digest, Sha256};
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = repo.join("host/server/src/console/vendor/uplot");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("version **1.6.32**"), "{readme}");
    for file in ["uPlot.esm.js", "uPlot.min.css"] {
        let digest = hex::encode(Sha256::digest(std::fs::read(dir.join(file)).unwrap()));
        assert!(
            readme.contains(&format!("| `{file}` | `dist/{file}` | `{digest}` |")),
            "{file} is not the pinned release's (sha256 {digest}): copy it again from the package, or update the README's table with the version"
        );
    }
    let licence = std::fs::read_to_string(dir.join("LICENSE")).unwrap();
    assert!(licence.contains("MIT License") && licence.contains("Leon Sorokin"));
}

/// How many runs the many-runs tests seed besides their real ones.
const SEEDED: usize = 3_000;

/// The demo with the planner, its reader and its writer: `plan-0` runs to
/// the end (the writer's write approved by its rule), then, the rule
/// removed, `plan-1` parks on its writer child (`plan-1.call-2-1`, awaiting
/// approval); `watched`, a priced notes run, parks on its write. The
/// store (`store`, created first) holds them.
fn many_runs_demo(dir: &Path, store: &str) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for name in ["planner", "reader", "writer"] {
        for file in [format!("{name}.toml"), format!("{name}.transcript.toml")] {
            std::fs::copy(examples.join(&file), dir.join(&file)).unwrap();
        }
    }
    let run = |args: &[&str], code: i32| {
        let out = warden(dir, store).args(args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "warden {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["store", "migrate"], 0);
    run(
        &["run", "planner.toml", "Plan the week", "--run-id", "plan-0"],
        0,
    );
    let writer = std::fs::read_to_string(dir.join("writer.toml")).unwrap();
    let asking = writer.replace("approval = { write_file = \"never\" }\n", "");
    assert_ne!(asking, writer, "the writer's approval rule moved");
    std::fs::write(dir.join("writer.toml"), asking).unwrap();
    // Parked without a terminal: exit 4.
    run(
        &["run", "planner.toml", "Plan the week", "--run-id", "plan-1"],
        4,
    );
    run(
        &[
            "run",
            "notes.toml",
            "Summarise my notes",
            "--run-id",
            "watched",
        ],
        4,
    );
}

/// Moves every time in an event (each `*_ms` field that holds one) by
/// `shift` milliseconds.
fn shifted(value: &mut serde_json::Value, shift: i64) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v.as_i64() {
                    Some(ms) if key.ends_with("_ms") && ms > 1_000_000_000_000 => {
                        *v = serde_json::json!(ms + shift);
                    }
                    _ => shifted(v, shift),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| shifted(v, shift)),
        _ => {}
    }
}

/// `SEEDED` more runs, made from the log of `plan-0` (a real run), each
/// under its own id (`seed-00000`…), created a minute apart, the newest
/// ten minutes before now,
/// with the labels `batch=b0`…`b6` and `seed=<n>`: most completed as
/// `plan-0` did, one in ten failed and one in ten cancelled right after
/// starting.
async fn seed(store: std::sync::Arc<dyn warden::store::EventStore>) {
    use warden::store::{ListingStatus, RunId, RunMeta};
    let template = store.load(&RunId::new("plan-0").unwrap()).await.unwrap();
    let events: Vec<serde_json::Value> = template
        .iter()
        .map(|e| serde_json::from_slice(&e.bytes).unwrap())
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let started = events[0]["event"]["clock_seed_ms"].as_i64().unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..SEEDED {
        if tasks.len() >= 32 {
            tasks.join_next().await.unwrap().unwrap();
        }
        // All before the real runs, which stay the newest.
        let created = now - 600_000 - ((SEEDED - i) as i64) * 60_000;
        let id = format!("seed-{i:05}");
        let labels = std::collections::BTreeMap::from([
            ("batch".to_owned(), format!("b{}", i % 7)),
            ("seed".to_owned(), i.to_string()),
        ]);
        let (status, mut log) = match i % 10 {
            3 => (
                ListingStatus::FAILED,
                vec![
                    events[0].clone(),
                    serde_json::json!({"v": 1, "event": {"type": "run_failed", "error": {"kind": "host", "message": "seeded: the plugin did not load"}}}),
                ],
            ),
            7 => (
                ListingStatus::CANCELLED,
                vec![
                    events[0].clone(),
                    serde_json::json!({"v": 1, "event": {"type": "run_cancelled", "reason": "seeded"}}),
                ],
            ),
            _ => (ListingStatus::COMPLETED, events.clone()),
        };
        for event in &mut log {
            shifted(event, created - started);
        }
        log[0]["event"]["run_id"] = serde_json::json!(id);
        log[0]["event"]["labels"] = serde_json::json!(labels);
        let bytes: Vec<bytes::Bytes> = log
            .iter()
            .map(|e| bytes::Bytes::from(serde_json::to_vec(e).unwrap()))
            .collect();
        let meta = RunMeta {
            agent: "planner".into(),
            labels,
            session: None,
            session_runs: None,
            history: Vec::new(),
            history_head: None,
            created_ms: created,
        };
        let store = std::sync::Arc::clone(&store);
        tasks.spawn(async move {
            let run = RunId::new(id).unwrap();
            store
                .create(&run, meta, bytes[0].clone(), ListingStatus::RUNNING)
                .await
                .unwrap();
            store
                .append(&run, 1, &bytes[1..], status.into(), created + 5_000)
                .await
                .unwrap();
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// Runs `tests/console/many_runs_test.py` against a server on `store`.
fn many_runs_in_the_browser(dir: &Path, store: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = browser_ready();
    let token = add_token(dir, "olive", "operator");
    let (_server, addr) = start_server(dir, store);
    let shots = repo.join("target/console-screenshots");
    let out = Command::new(&python)
        .arg(repo.join("tests/console/many_runs_test.py"))
        .args([&addr, &token])
        .arg(dir)
        .arg(warden_binary())
        .arg(store)
        .arg(&shots)
        .arg(SEEDED.to_string())
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the many-runs console test on {store} failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
}

/// The console over a few thousand runs in SQLite, in Chromium: it finds
/// runs by label and by id, pages newest first, opens a parked child from
/// its parent, shows a cost in dollars, approves from the inbox, and draws
/// a run's timeline chart and the overview (screenshots for docs/serve.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_finds_reads_and_pictures_thousands_of_runs_over_sqlite() {
    let demo = demo();
    let dir = demo.path().to_owned();
    let setup = dir.clone();
    tokio::task::spawn_blocking(move || many_runs_demo(&setup, "serve.db"))
        .await
        .unwrap();
    let store = warden::SqliteStore::open(dir.join("serve.db")).unwrap();
    seed(std::sync::Arc::new(store)).await;
    tokio::task::spawn_blocking(move || many_runs_in_the_browser(&dir, "serve.db"))
        .await
        .unwrap();
    drop(demo);
}

/// The same over PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_finds_reads_and_pictures_thousands_of_runs_over_postgres() {
    let Some(pg) = PgSchema::new("console_many").await else {
        return;
    };
    let demo = demo();
    let dir = demo.path().to_owned();
    let (setup, url) = (dir.clone(), pg.url.clone());
    tokio::task::spawn_blocking(move || many_runs_demo(&setup, &url))
        .await
        .unwrap();
    seed(std::sync::Arc::new(pg.store().await)).await;
    let url = pg.url.clone();
    tokio::task::spawn_blocking(move || many_runs_in_the_browser(&dir, &url))
        .await
        .unwrap();
    drop(demo);
}
