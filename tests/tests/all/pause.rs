//! A paused writer (issue 15): a driver stopped in the middle of a long
//! write, past its claim, makes no further effect once it wakes.
//!
//! - Through the real binary on PostgreSQL: a `warden worker` is stopped
//!   with SIGSTOP while the hostile guest's `slow_append` writes a file one
//!   line per host call; once its claim has run out an operator resolves
//!   the dangling write with `warden runs resolve` and a second worker
//!   takes the run over and finishes it; then the first gets SIGCONT. The file must hold what it held when the first was stopped,
//!   and the log what the second left.
//! - The same inside a child run (issue 36): a child is driven under its
//!   parent's claim, so a worker paused inside a child's write makes no
//!   further effect once it wakes, and while the worker's claim is live
//!   `runs resolve` and `runs recover` on the child are refused, naming
//!   the worker.
//! - The same inside an MCP server's write (issue 36): the server is a
//!   process of its own, which SIGSTOP of the worker does not stop; the
//!   claim's watchdog kills it at the worker's view of the claim, so the
//!   write the operator made by hand once the claim ran out is the only
//!   one.
//! - Through the library: a driver whose own view of its claim
//!   ([`ValidUntil`]) passes mid-write stops with
//!   [`RuntimeError::ClaimExpired`], its write stops, and nothing is
//!   appended after the write's intent.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use warden::engine::StartOptions;

use serde_json::json;
use warden::engine::events::Event;
use warden::engine::{Agent, ReplayOptions, RunId, Runtime, RuntimeError};
use warden::plugins::PluginHost;
use warden::sandbox::ValidUntil;
use warden::store::{EventStore, MemoryStore};

use super::engine::Fixture;
use super::workers::{KillOnDrop, PgSchema, now_ms, wait_for};
use crate::binary::warden_binary;
use crate::sandbox;

/// An agent file `agents/<name>.toml` whose one tool call appends `steps`
/// lines to `work/slow.log`, `step_ms` apart, then finishes.
fn slow_agent(fx: &Fixture, name: &str, steps: u64, step_ms: u64) -> Agent {
    let dir = fx.dir.path().join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.transcript.toml")),
        format!(
            r#"
[[turns]]
text = "Writing slowly."
[[turns.tool_calls]]
name = "hostile__slow_append"
arguments = {{ path = "/workspace/slow.log", steps = {steps}, step_ms = {step_ms} }}

[[turns]]
text = "Written."
"#
        ),
    )
    .unwrap();
    let text = format!(
        r#"
name = "{name}"
instructions = "Write slowly."

[model]
provider = "scripted"
name = "script"
transcript = "{name}.transcript.toml"

[plugins.hostile]
source = "../hostile.toml"
approval = {{ slow_append = "never" }}
[plugins.hostile.grant.mounts.workspace]
dir = "../work"
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    Agent::load(&path.canonicalize().unwrap(), None).unwrap()
}

/// An agent file `agents/<name>.toml` that calls the agent `child` (an
/// agent file `agents/<child>.toml`) once, then finishes.
fn parent_agent(fx: &Fixture, name: &str, child: &str) -> Agent {
    let dir = fx.dir.path().join("agents");
    std::fs::write(
        dir.join(format!("{name}.transcript.toml")),
        format!(
            r#"
[[turns]]
text = "Delegating."
[[turns.tool_calls]]
name = "{child}"
arguments = {{ task = "write" }}

[[turns]]
text = "Delegated."
"#
        ),
    )
    .unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
name = "{name}"
instructions = "Delegate."

[model]
provider = "scripted"
name = "script"
transcript = "{name}.transcript.toml"

[agents.{child}]
agent = "{child}.toml"
description = "Writes slowly"
"#
        ),
    )
    .unwrap();
    Agent::load(&path.canonicalize().unwrap(), None).unwrap()
}

/// `warden ARGS` against the store at `url`, from `dir`.
fn warden(dir: &Path, url: &str, args: &[&str]) -> std::process::Output {
    Command::new(warden_binary())
        .args(args)
        .env("WARDEN_STORE", url)
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .output()
        .unwrap()
}

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
}

/// The lines of `work/slow.log`, checked to be `step-0`, `step-1`, ... in
/// order (no line torn, none twice).
fn steps_written(fx: &Fixture) -> (String, usize) {
    let text = std::fs::read_to_string(fx.dir.path().join("work/slow.log")).unwrap_or_default();
    let mut n = 0;
    for line in text.lines() {
        assert_eq!(line, format!("step-{n}"), "slow.log is not whole");
        n += 1;
    }
    (text, n)
}

/// The operator resolves `run`'s dangling write with `output` (`warden
/// runs resolve`), and `worker-b` takes the run over and finishes it: its
/// log then.
async fn resolved_and_finished(
    dir: &Path,
    url: &str,
    store: &Arc<dyn EventStore>,
    run: &RunId,
    output: &str,
    note: &str,
) -> Vec<warden::store::StoredEvent> {
    let resolved = warden(
        dir,
        url,
        &[
            "runs",
            "resolve",
            run.as_str(),
            "--output",
            output,
            "--note",
            note,
        ],
    );
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    wait_for("worker-b never finished the run", async || {
        store
            .summary(run)
            .await
            .is_ok_and(|s| s.status == "completed" && s.claim.is_none() && s.claim_token >= 2)
    })
    .await;
    store.load(run).await.unwrap()
}

fn start_worker(dir: &Path, url: &str, id: &str) -> KillOnDrop {
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
    let child = Command::new(warden_binary())
        .args([
            "worker",
            "--claim-ttl",
            "1s",
            "--poll",
            "50ms",
            "--grace",
            "1s",
            "--id",
            id,
        ])
        .env("WARDEN_STORE", url)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

fn signal(worker: &KillOnDrop, sig: &str) {
    let pid = worker.0.id().to_string();
    let sent = Command::new("kill").args([sig, &pid]).status().unwrap();
    assert!(sent.success(), "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_mid_write_past_its_claim_writes_nothing_after_it_wakes() {
    let Some(pg) = PgSchema::new("pause").await else {
        return;
    };
    let fx = Fixture::new();
    let dir = fx.dir.path();
    let store: Arc<dyn EventStore> = Arc::new(pg.store().await);
    let rt = runtime(store.clone());
    let run = RunId::new("paused").unwrap();
    // Lines as fast as the host calls go: a writer that wakes and is not
    // stopped at once writes some.
    let agent = slow_agent(&fx, "paused", 5_000_000, 0);
    rt.submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();

    let first = start_worker(dir, &pg.url, "worker-a");
    wait_for("worker-a never started the write", async || {
        steps_written(&fx).1 >= 200
    })
    .await;
    signal(&first, "-STOP");
    // Stopped: the file no longer grows.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (at_stop, steps) = steps_written(&fx);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(steps_written(&fx).1, steps, "worker-a did not stop");

    // Its claim runs out, its write dangling (the run is listed as needing
    // reconciliation since the write began); another worker is up.
    let second = start_worker(dir, &pg.url, "worker-b");
    wait_for("worker-a's claim never ran out", async || {
        store.summary(&run).await.is_ok_and(|s| {
            s.status == "needs_reconciliation"
                && s.claim.as_ref().is_some_and(|l| l.is_expired(now_ms()))
        })
    })
    .await;
    // The operator looks at the file and resolves the write as not made;
    // the other worker takes the run over and finishes it.
    let events = resolved_and_finished(
        dir,
        &pg.url,
        &store,
        &run,
        r#"{"applied": false}"#,
        "the writer was paused; its file is as it was",
    )
    .await;
    assert_eq!(steps_written(&fx).0, at_stop);

    // The paused worker wakes: it writes nothing more, to the file or to
    // the log.
    signal(&first, "-CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, after_steps) = steps_written(&fx);
    let worker_log = std::fs::read_to_string(dir.join("worker-a.log")).unwrap_or_default();
    assert_eq!(
        after_steps,
        steps,
        "worker-a wrote {} more steps after it woke: {worker_log}",
        after_steps - steps
    );
    assert_eq!(after, at_stop);
    assert_eq!(store.load(&run).await.unwrap(), events, "the log changed");
    let summary = store.summary(&run).await.unwrap();
    assert_eq!(summary.status, "completed");
    assert!(store.verify(&run).await.unwrap().is_intact());
    let recorded: Vec<Event> = rt.events(&run).await.unwrap();
    let intents = recorded
        .iter()
        .filter(|e| matches!(e, Event::ToolCallIntent(_)))
        .count();
    let resolutions = recorded
        .iter()
        .filter(|e| matches!(e, Event::ToolCallResolved(_)))
        .count();
    assert_eq!((intents, resolutions), (1, 1), "{recorded:?}");
    eprintln!(
        "paused writer: stopped after {steps} steps, nothing written after SIGCONT; worker-a said: {}",
        worker_log.lines().last().unwrap_or("nothing")
    );
    drop(second);
    drop(first);
}

/// A parent run whose child's slow write a real `warden worker`
/// (`worker-a`) on PostgreSQL has started, under the parent's claim.
struct ChildWrite {
    pg: PgSchema,
    fx: Fixture,
    store: Arc<dyn EventStore>,
    rt: Runtime,
    run: RunId,
    child: RunId,
    worker: KillOnDrop,
}

/// [`ChildWrite`] in a schema named `schema`, the parent run named `run`;
/// `None` only when PostgreSQL tests are explicitly skipped.
async fn a_child_write_under_way(schema: &str, run: &str) -> Option<ChildWrite> {
    let pg = PgSchema::new(schema).await?;
    let fx = Fixture::new();
    let store: Arc<dyn EventStore> = Arc::new(pg.store().await);
    let rt = runtime(store.clone());
    let child = RunId::new(format!("{run}.call-1-1")).unwrap();
    let run = RunId::new(run).unwrap();
    slow_agent(&fx, "slow", 5_000_000, 0);
    let parent = parent_agent(&fx, run.as_str(), "slow");
    rt.submit(&parent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    let worker = start_worker(fx.dir.path(), &pg.url, "worker-a");
    wait_for("worker-a never started the child's write", async || {
        steps_written(&fx).1 >= 200
    })
    .await;
    Some(ChildWrite {
        pg,
        fx,
        store,
        rt,
        run,
        child,
        worker,
    })
}

/// Issue 36, without a pause: while a worker drives a child's write under
/// the parent's live claim, the operator's `runs resolve` and `runs
/// recover` on the child are refused, naming the worker, and record
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciling_a_child_under_a_live_parent_claim_is_refused() {
    let Some(ChildWrite {
        pg,
        fx,
        store,
        child,
        worker,
        ..
    }) = a_child_write_under_way("childheld", "held").await
    else {
        return;
    };
    let dir = fx.dir.path();
    let before = store.load(&child).await.unwrap();
    // Resolving is refused (exit 2, nothing recorded); recovering gets
    // the advice for a write another driver holds (exit 5: wait for it),
    // not the one for an interrupted `warden run`.
    for (args, exit) in [
        (
            vec![
                "runs",
                "resolve",
                child.as_str(),
                "--output",
                r#"{"applied": false}"#,
            ],
            2,
        ),
        (vec!["runs", "recover", child.as_str()], 5),
        (
            vec![
                "--json",
                "runs",
                "resolve",
                child.as_str(),
                "--output",
                "{}",
            ],
            2,
        ),
    ] {
        let out = warden(dir, &pg.url, &args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(exit), "{args:?}: {stdout}{stderr}");
        assert!(
            !stderr.contains("`warden run` driving it"),
            "{args:?}: {stderr}"
        );
        assert!(
            stdout.contains("worker-a") || stderr.contains("worker-a"),
            "{args:?} does not name the worker: {stdout}{stderr}"
        );
        if args[0] == "--json" {
            let envelope: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(envelope["error"]["code"], "run_claimed", "{stdout}");
            assert_eq!(envelope["error"]["details"]["claimed_run"], "held");
            assert_eq!(envelope["error"]["details"]["held_by"], "worker-a");
        }
    }
    // Nothing recorded: the child's log is as the worker left it (it
    // appends nothing while its write goes on).
    assert_eq!(store.load(&child).await.unwrap(), before);
    drop(worker);
}

/// Issue 36, the pause: a worker stopped (SIGSTOP) inside a child's write,
/// past its claim; the operator resolves the child's write once the claim
/// ran out and drives the parent to the end; the worker gets SIGCONT and
/// makes no further effect: the file and both logs are as the operator
/// left them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_inside_a_childs_write_writes_nothing_after_it_wakes() {
    let Some(ChildWrite {
        pg,
        fx,
        store,
        rt,
        run,
        child,
        worker: first,
    }) = a_child_write_under_way("childpause", "tree").await
    else {
        return;
    };
    let dir = fx.dir.path();
    signal(&first, "-STOP");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (at_stop, steps) = steps_written(&fx);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(steps_written(&fx).1, steps, "worker-a did not stop");
    wait_for("worker-a's claim never ran out", async || {
        store
            .summary(&run)
            .await
            .is_ok_and(|s| s.claim.as_ref().is_some_and(|l| l.is_expired(now_ms())))
    })
    .await;
    // The operator checks the file, resolves the child's write as not
    // made, and drives the tree to the end.
    let resolved = warden(
        dir,
        &pg.url,
        &[
            "runs",
            "resolve",
            child.as_str(),
            "--output",
            r#"{"applied": false}"#,
        ],
    );
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    let resumed = warden(dir, &pg.url, &["runs", "resume", run.as_str()]);
    assert!(
        resumed.status.success(),
        "{}{}",
        String::from_utf8_lossy(&resumed.stdout),
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(store.summary(&run).await.unwrap().status, "completed");
    assert_eq!(store.summary(&child).await.unwrap().status, "completed");
    let (parent_log, child_log) = (
        store.load(&run).await.unwrap(),
        store.load(&child).await.unwrap(),
    );
    assert_eq!(steps_written(&fx).0, at_stop);

    // The paused worker wakes: nothing more, to the file or to either log.
    signal(&first, "-CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, after_steps) = steps_written(&fx);
    let worker_log = std::fs::read_to_string(dir.join("worker-a.log")).unwrap_or_default();
    assert_eq!(
        after_steps,
        steps,
        "worker-a wrote {} more steps after it woke: {worker_log}",
        after_steps - steps
    );
    assert_eq!(after, at_stop);
    assert_eq!(
        store.load(&run).await.unwrap(),
        parent_log,
        "the parent's log changed"
    );
    assert_eq!(
        store.load(&child).await.unwrap(),
        child_log,
        "the child's log changed"
    );
    assert!(store.verify(&child).await.unwrap().is_intact());
    let resolutions = rt
        .events(&child)
        .await
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::ToolCallResolved(_)))
        .count();
    assert_eq!(resolutions, 1);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_claim_view_passes_mid_write_stops_and_records_nothing() {
    let fx = Fixture::new();
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone());
    let run = RunId::new("lapsed").unwrap();
    let agent = slow_agent(&fx, "lapsed", 10_000, 2);
    rt.submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    // The store's claim is good for a minute; the driver's own view of it,
    // only 300 ms (a worker that could not renew, say).
    let claim = store
        .acquire_claim(&run, "driver", now_ms(), 60_000)
        .await
        .unwrap();
    let valid = ValidUntil::for_next(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = rt
        .recover_claimed(&agent, ReplayOptions::default(), claim, valid)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::ClaimExpired { run_id } if *run_id == run),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let (written, steps) = steps_written(&fx);
    assert!(steps > 0 && steps < 10_000, "{steps} steps");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(steps_written(&fx).0, written, "the write went on");
    let events = rt.events(&run).await.unwrap();
    assert!(
        matches!(events.last(), Some(Event::ToolCallIntent(_))),
        "nothing after the write's intent: {events:?}"
    );
}

/// Issue 36, an MCP server's write: a `warden worker` on PostgreSQL is
/// stopped (SIGSTOP) while its local MCP server (the Python SDK's, in its
/// bubblewrap sandbox) takes 4 s over an append. Once the worker's claim
/// has run out the operator finds the line missing, makes the write by
/// hand and resolves it, as docs/operations.md says; a second worker
/// finishes the run. The server must not add its line after that: the
/// claim's watchdog killed it at the paused worker's view of the claim.
/// Counted in the file, outside the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_inside_an_mcp_servers_write_leaves_one_write() {
    let Some(pg) = PgSchema::new("mcppause").await else {
        return;
    };
    let fx = Fixture::new();
    let dir = fx.dir.path();
    let store: Arc<dyn EventStore> = Arc::new(pg.store().await);
    let rt = runtime(store.clone());
    let run = RunId::new("mcp-paused").unwrap();
    let (agent, _) = super::effects_matrix::mcp_agent(&fx, false);
    const DELAY: Duration = Duration::from_secs(4);
    std::fs::write(fx.path("data/delay"), DELAY.as_secs().to_string()).unwrap();
    let notes = fx.path("out/notes.log");
    let lines = || {
        std::fs::read_to_string(&notes)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == "m")
            .count()
    };
    rt.submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();

    let first = start_worker(dir, &pg.url, "worker-a");
    wait_for(
        "worker-a's MCP server never started the write",
        async || fx.path("out/append-started").exists(),
    )
    .await;
    let started = std::time::Instant::now();
    signal(&first, "-STOP");

    // Its claim runs out with the write dangling; another worker is up.
    let second = start_worker(dir, &pg.url, "worker-b");
    wait_for("worker-a's claim never ran out", async || {
        store.summary(&run).await.is_ok_and(|s| {
            s.status == "needs_reconciliation"
                && s.claim.as_ref().is_some_and(|l| l.is_expired(now_ms()))
        })
    })
    .await;
    assert!(
        started.elapsed() < DELAY,
        "the claim ran out only after the server's write was due: raise DELAY"
    );
    // The operator checks the file: the line is not there. They make the
    // write by hand and resolve it as made.
    assert_eq!(
        lines(),
        0,
        "the server's write landed before the operator looked"
    );
    {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&notes)
            .unwrap();
        writeln!(file, "m").unwrap();
    }
    let events = resolved_and_finished(
        dir,
        &pg.url,
        &store,
        &run,
        r#"{"applied": true}"#,
        "the worker was paused; I appended the line by hand",
    )
    .await;

    // Past the time the server's write was due, the paused worker wakes.
    tokio::time::sleep((DELAY + Duration::from_secs(1)).saturating_sub(started.elapsed())).await;
    let before_wake = lines();
    signal(&first, "-CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let worker_log = std::fs::read_to_string(dir.join("worker-a.log")).unwrap_or_default();
    assert_eq!(
        (before_wake, lines()),
        (1, 1),
        "the MCP write happened more than once (before worker-a woke, after): {worker_log}"
    );
    assert_eq!(store.load(&run).await.unwrap(), events, "the log changed");
    assert_eq!(store.summary(&run).await.unwrap().status, "completed");
    assert!(store.verify(&run).await.unwrap().is_intact());
    let recorded: Vec<Event> = rt.events(&run).await.unwrap();
    let resolutions = recorded
        .iter()
        .filter(|e| matches!(e, Event::ToolCallResolved(_)))
        .count();
    assert_eq!(resolutions, 1, "{recorded:?}");
    eprintln!(
        "paused MCP write: one line in the file {:?} after the stop; worker-a said: {}",
        started.elapsed(),
        worker_log.lines().last().unwrap_or("nothing")
    );
    drop(second);
    drop(first);
}
