//! A lease's [`ValidUntil`] bounds what the lease may still do (issue 15):
//! a lease whose validity has passed never runs; one that passes mid-call
//! makes no further filesystem change, whichever the call, and no further
//! request; guest code computing without host calls is trapped, and a guest
//! waiting in a host call is stopped; each ends as
//! [`LeaseFailure::Expired`]. A validity its holder keeps extending lets
//! the lease run to its end. Another process held to a validity
//! ([`ValidUntil::fence_process`], a local MCP server) is killed when it
//! passes, by a watchdog that runs while its holder is stopped, and is
//! left alone while it is extended or once its fence is dropped.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use warden::sandbox::{
    Access, Capabilities, LeaseError, LeaseFailure, Limits, Moment, Outcome, PluginComponent,
    ValidUntil,
};
use warden_tests::guests;

use crate::server::TestServer;
use crate::{assert_serves_normal_call, hostile, invoke, load, sandbox, test_limits};

fn mounted(dir: &Path) -> Capabilities {
    Capabilities::none()
        .mount("workspace", dir, Access::ReadWrite)
        .unwrap()
}

/// Limits with no fuel limit and a deadline far off: only the validity can
/// stop the guest early.
fn long_limits() -> Limits {
    Limits {
        fuel: None,
        timeout: Duration::from_secs(20),
        ..test_limits()
    }
}

fn expired<T: std::fmt::Debug>(result: &Result<T, LeaseError>) {
    match result {
        Err(e) => assert_eq!(e.failure, LeaseFailure::Expired, "{e}"),
        Ok(other) => panic!("expected the lease to expire, got {other:?}"),
    }
}

/// Ends `valid` after `ms`, as a holder that learns it lost its authority
/// would: nothing waiting for the deadline notices at once, only the checks.
fn revoke_after(valid: &ValidUntil, ms: u64) {
    let valid = valid.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        valid.revoke();
    });
}

#[tokio::test]
async fn a_lease_whose_validity_has_passed_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let valid = ValidUntil::for_next(Duration::from_secs(60));
    valid.revoke();
    let g = hostile(mounted(dir.path()), test_limits()).valid_until(valid);
    let leased = invoke(
        &g,
        "fs",
        json!({ "op": "write", "path": "/workspace/f.txt", "content": "x" }),
    )
    .await;
    expired(&leased.result);
    assert_eq!(leased.receipt.outcome, Outcome::Cancelled);
    assert_eq!(leased.receipt.fuel_consumed, 0);
    assert!(!dir.path().join("f.txt").exists());
    // The same component without a validity is not affected.
    assert_serves_normal_call(&hostile(Capabilities::none(), test_limits())).await;
}

/// One filesystem change the `fs` tool can make: its name, its arguments,
/// and whether the directory shows it happened.
type Change = (&'static str, Value, fn(&Path) -> bool);

fn changes() -> Vec<Change> {
    vec![
        (
            "write",
            json!({ "op": "write", "path": "/workspace/file.txt", "content": "changed" }),
            |d| std::fs::read_to_string(d.join("file.txt")).unwrap() != "original",
        ),
        (
            "append",
            json!({ "op": "append", "path": "/workspace/file.txt", "content": "more" }),
            |d| std::fs::read_to_string(d.join("file.txt")).unwrap() != "original",
        ),
        (
            "create",
            json!({ "op": "create", "path": "/workspace/new.txt" }),
            |d| d.join("new.txt").exists(),
        ),
        (
            "truncate",
            json!({ "op": "truncate", "path": "/workspace/file.txt", "len": 2 }),
            |d| std::fs::read_to_string(d.join("file.txt")).unwrap() != "original",
        ),
        (
            "rename",
            json!({ "op": "rename", "from": "/workspace/file.txt", "to": "/workspace/moved.txt" }),
            |d| !d.join("file.txt").exists(),
        ),
        (
            "unlink",
            json!({ "op": "unlink", "path": "/workspace/file.txt" }),
            |d| !d.join("file.txt").exists(),
        ),
        (
            "mkdir",
            json!({ "op": "mkdir", "path": "/workspace/sub" }),
            |d| d.join("sub").exists(),
        ),
        (
            "rmdir",
            json!({ "op": "rmdir", "path": "/workspace/empty" }),
            |d| !d.join("empty").exists(),
        ),
        (
            "set_times",
            json!({ "op": "set_times", "path": "/workspace/file.txt", "modified_ms": 0 }),
            |d| {
                let modified = std::fs::metadata(d.join("file.txt"))
                    .unwrap()
                    .modified()
                    .unwrap();
                modified == std::time::UNIX_EPOCH
            },
        ),
    ]
}

#[tokio::test]
async fn a_validity_that_passes_mid_call_stops_every_filesystem_change() {
    for (name, mut args, happened) in changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file.txt"), "original").unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        // The guest waits in a host call past the validity, then tries;
        // the checks stop it, well before the lease's own wait for the
        // deadline would look again.
        args["delay_ms"] = json!(300);
        let valid = ValidUntil::for_next(Duration::from_secs(60));
        revoke_after(&valid, 100);
        let g = hostile(mounted(dir.path()), long_limits()).valid_until(valid);
        let started = std::time::Instant::now();
        let leased = invoke(&g, "fs", args.clone()).await;
        expired(&leased.result);
        assert!(started.elapsed() < Duration::from_millis(900), "{name}");
        assert!(
            !happened(dir.path()),
            "{name} happened after the validity passed"
        );
        // Without the validity, the same call makes the change: the check
        // above can fail.
        let unfenced = hostile(mounted(dir.path()), long_limits());
        args["delay_ms"] = json!(0);
        let leased = invoke(&unfenced, "fs", args).await;
        assert!(
            matches!(leased.result, Ok(Ok(_))),
            "{name}: {:?}",
            leased.result
        );
        assert!(
            happened(dir.path()),
            "{name} did not happen without a validity"
        );
    }
}

#[tokio::test]
async fn a_write_in_steps_stops_at_the_validity_and_writes_nothing_after() {
    let dir = tempfile::tempdir().unwrap();
    let valid = ValidUntil::for_next(Duration::from_millis(300));
    let g = hostile(mounted(dir.path()), long_limits()).valid_until(valid);
    let started = std::time::Instant::now();
    let leased = invoke(
        &g,
        "slow_append",
        json!({ "path": "/workspace/steps.log", "steps": 200, "step_ms": 10 }),
    )
    .await;
    expired(&leased.result);
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "stopped after {elapsed:?}"
    );
    let written = std::fs::read_to_string(dir.path().join("steps.log")).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    assert!(
        !lines.is_empty() && lines.len() < 200,
        "{} steps written",
        lines.len()
    );
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(*line, format!("step-{i}"), "{written:?}");
    }
    // Nothing more, later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read_to_string(dir.path().join("steps.log")).unwrap(),
        written
    );
}

#[tokio::test]
async fn a_validity_kept_extended_lets_the_write_finish() {
    let dir = tempfile::tempdir().unwrap();
    let valid = ValidUntil::for_next(Duration::from_millis(150));
    let renewer = {
        let valid = valid.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                valid.extend(Moment::now().after(Duration::from_millis(150)));
            }
        })
    };
    let g = hostile(mounted(dir.path()), long_limits()).valid_until(valid);
    let leased = invoke(
        &g,
        "slow_append",
        json!({ "path": "/workspace/steps.log", "steps": 60, "step_ms": 10 }),
    )
    .await;
    renewer.abort();
    assert!(matches!(leased.result, Ok(Ok(_))), "{:?}", leased.result);
    let written = std::fs::read_to_string(dir.path().join("steps.log")).unwrap();
    assert_eq!(written.lines().count(), 60);
}

#[tokio::test]
async fn a_compute_loop_is_trapped_when_the_validity_passes() {
    let started = std::time::Instant::now();
    let valid = ValidUntil::for_next(Duration::from_millis(200));
    let g = hostile(Capabilities::none(), long_limits()).valid_until(valid);
    let leased = invoke(&g, "spin", json!({})).await;
    expired(&leased.result);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(3),
        "stopped after {elapsed:?}"
    );
    assert!(leased.receipt.fuel_consumed > 0);
}

#[tokio::test]
async fn a_guest_waiting_in_a_host_call_is_stopped_when_the_validity_passes() {
    let valid = ValidUntil::for_next(Duration::from_millis(200));
    let g = hostile(Capabilities::none(), long_limits()).valid_until(valid);
    let started = std::time::Instant::now();
    let leased = invoke(&g, "sleep_forever", json!({})).await;
    expired(&leased.result);
    assert!(started.elapsed() < Duration::from_secs(3));
}

fn net_component() -> &'static PluginComponent {
    static COMPONENT: std::sync::OnceLock<PluginComponent> = std::sync::OnceLock::new();
    COMPONENT.get_or_init(|| load(guests::NET))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_leaves_once_the_validity_passes() {
    let server = TestServer::start().await;
    let caps = Capabilities::none().host(server.grant());
    // Requests one after another; the validity ends once a few were made.
    let valid = ValidUntil::for_next(Duration::from_secs(60));
    let at_revoke = tokio::spawn({
        let (valid, seen) = (valid.clone(), server.received_counter());
        async move {
            while seen() < 5 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            valid.revoke();
            seen()
        }
    });
    let g = sandbox()
        .grant(net_component(), caps.clone(), long_limits())
        .valid_until(valid);
    let leased = invoke(
        &g,
        "fetch",
        json!({ "url": server.url("/status/200"), "repeat": 200 }),
    )
    .await;
    expired(&leased.result);
    let at_revoke = at_revoke.await.unwrap();
    // At most the one request already past its check when the validity
    // ended arrives after it.
    let received = server.seen().len();
    assert!(
        received <= at_revoke + 1 && received < 200,
        "{received} requests received, {at_revoke} when the validity ended"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.seen().len(),
        received,
        "a request left after the lease"
    );

    // Started with a validity that passed, it reaches nothing.
    let connections = server.connections();
    let valid = ValidUntil::for_next(Duration::from_secs(60));
    valid.revoke();
    let g = sandbox()
        .grant(net_component(), caps, long_limits())
        .valid_until(valid);
    let leased = invoke(&g, "fetch", json!({ "url": server.url("/status/200") })).await;
    expired(&leased.result);
    assert_eq!(server.connections(), connections);
}

/// A `sleep` process held to a validity: killed when the validity passes
/// (here while this test's threads are busy elsewhere: the watchdog is a
/// process of its own), kept while it is extended, revoked at once, and
/// left alone once the fence is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_held_to_a_validity_is_killed_when_it_passes() {
    use std::os::unix::process::ExitStatusExt as _;
    let sleeper = || {
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap()
    };
    // Passes: killed by SIGKILL, though nothing here waits on it.
    let mut child = sleeper();
    let valid = ValidUntil::for_next(Duration::from_millis(300));
    let fence = valid.fence_process(child.id()).unwrap();
    // Block this thread past the deadline: only the watchdog can act.
    std::thread::sleep(Duration::from_millis(700));
    let status = child.try_wait().unwrap().expect("killed at the deadline");
    assert_eq!(status.signal(), Some(9), "{status:?}");
    drop(fence);

    // Extended past its first deadline, it lives; revoked, it dies at once.
    let mut child = sleeper();
    let valid = ValidUntil::for_next(Duration::from_millis(300));
    let fence = valid.fence_process(child.id()).unwrap();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(valid.extend(Moment::now().after(Duration::from_millis(300))));
    }
    assert!(child.try_wait().unwrap().is_none(), "killed while extended");
    let revoked = std::time::Instant::now();
    valid.revoke();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert!(revoked.elapsed() < Duration::from_secs(2));
    drop(fence);

    // A dropped fence leaves the process alone past the deadline.
    let mut child = sleeper();
    let valid = ValidUntil::for_next(Duration::from_millis(200));
    drop(valid.fence_process(child.id()).unwrap());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "killed after its fence was dropped"
    );
    child.kill().unwrap();
    let _ = child.wait();
}
