//! The one retry layer for model calls, through the engine against a fake
//! model API on loopback (`model_server`): requests counted at the server,
//! waits read from the recorded failures and the injected clock (a sleep
//! that moves it instead of waiting), never timed.
//!
//! - `max_attempts` is attempts per model call in total: a persistent 500
//!   gets exactly that many requests, on both wire formats;
//! - a 429's `Retry-After` is recorded with each failure and waited exactly,
//!   and a driver that recovers after a crash mid-wait waits only what is
//!   left of it;
//! - a wait longer than `max_retry_wait` parks the run (`waiting`, its
//!   wake-up time recorded and in the store's listing) instead of failing
//!   it or holding the driver; it is driven again once due, by a later
//!   drive or a worker, and never before;
//! - a real `warden worker` process parks a run on a long `Retry-After` and
//!   exits; the run stays waiting with nobody driving it, and another
//!   `warden worker` drives it to completion once it is due; `warden run`
//!   exits parked (4) on such a wait and `warden runs resume` finishes the
//!   run once due.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warden::engine::StartOptions;

use futures::future::BoxFuture;
use serde_json::json;
use warden::engine::events::{Event, ModelCallFailed, WaitStarted};
use warden::engine::{Agent, Clock, FixedRandom, RetrySleep, RunId, RunStatus, Runtime};
use warden::plugins::PluginHost;
use warden::store::{EventStore, MemoryStore, WAITING};
use warden::worker::Worker;

use crate::binary::warden_binary;
use crate::model_server::{FakeModel, Reply};
use crate::providers::{WIRES, Wire, ok_stream};
use crate::sandbox;
use crate::workers::PgSchema;

/// The injected clock's start: any fixed time.
const T0: u64 = 1_700_000_000_000;

/// A clock that stands still until a sleep or the test moves it.
#[derive(Debug)]
struct TestClock(AtomicU64);

impl TestClock {
    fn new() -> Arc<TestClock> {
        Arc::new(TestClock(AtomicU64::new(T0)))
    }

    fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A sleep that records each wait and moves the clock by it, at once.
struct ClockSleep {
    clock: Arc<TestClock>,
    waits: Mutex<Vec<Duration>>,
}

impl ClockSleep {
    fn waits(&self) -> Vec<Duration> {
        self.waits.lock().unwrap().clone()
    }
}

impl RetrySleep for ClockSleep {
    fn sleep(&self, delay: Duration) -> BoxFuture<'static, ()> {
        self.waits.lock().unwrap().push(delay);
        self.clock.advance(delay);
        Box::pin(async {})
    }
}

/// A sleep that never ends: a driver stuck in it is killed by the test.
struct Forever;

impl RetrySleep for Forever {
    fn sleep(&self, _: Duration) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

/// A runtime over `store` on the test clock, waiting with `sleep`.
fn runtime(
    store: Arc<dyn EventStore>,
    clock: &Arc<TestClock>,
    sleep: Arc<dyn RetrySleep>,
) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
        .with_hooks(
            Arc::clone(clock) as Arc<dyn Clock>,
            Arc::new(FixedRandom(7)),
        )
        .with_sleep(sleep)
}

/// An agent of `wire` at `server`, with `retry` keys in its `[model]`.
fn agent(dir: &Path, wire: Wire, server: &FakeModel, retry: &str) -> Agent {
    let base = match wire {
        Wire::OpenAi => server.url("/v1"),
        Wire::Anthropic => server.url(""),
    };
    let text = format!(
        "name = \"retrier\"\ninstructions = \"Answer briefly.\"\n\n[model]\nprovider = \"{}\"\nname = \"test-model\"\nbase_url = \"{base}\"\ntimeout = \"10s\"\n{retry}\n",
        wire.name()
    );
    let path = dir.join(format!("{}.toml", wire.name()));
    std::fs::write(&path, text).unwrap();
    Agent::load(&path, None).unwrap()
}

fn failures(events: &[Event]) -> Vec<ModelCallFailed> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ModelCallFailed(f) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

fn busy(status: u16) -> Reply {
    Reply::json(
        status,
        &json!({"error": {"type": "server_error", "message": "upstream is down"}}),
    )
}

fn rate_limited(retry_after: &str) -> Reply {
    Reply::json(
        429,
        &json!({"error": {"type": "rate_limit_error", "message": "slow down"}}),
    )
    .header("retry-after", retry_after)
}

#[tokio::test]
async fn a_persistent_500_gets_exactly_max_attempts_requests() {
    let dir = tempfile::tempdir().unwrap();
    for wire in WIRES {
        for max_attempts in [3, 4, 1] {
            let server = FakeModel::start(|_, _| busy(500)).await;
            let agent = agent(
                dir.path(),
                wire,
                &server,
                &format!("max_attempts = {max_attempts}"),
            );
            let clock = TestClock::new();
            let sleep = Arc::new(ClockSleep {
                clock: Arc::clone(&clock),
                waits: Mutex::default(),
            });
            let rt = runtime(Arc::new(MemoryStore::new()), &clock, sleep.clone());
            let run = rt
                .start(&agent, json!("hi"), StartOptions::new())
                .await
                .unwrap();
            let status = rt.drive(&run, &agent).await.unwrap();
            assert_eq!(status, RunStatus::Failed, "{wire:?}");
            assert_eq!(
                server.seen().len(),
                max_attempts as usize,
                "{wire:?}: max_attempts = {max_attempts} means that many requests"
            );
            // Each attempt's failure is an event: transient, with its status;
            // all but the last say when the next is due, and that wait is
            // what the driver slept.
            let events = rt.events(&run).await.unwrap();
            let failed = failures(&events);
            assert_eq!(failed.len(), max_attempts as usize, "{wire:?}");
            assert!(
                failed
                    .iter()
                    .all(|f| f.error.transient && f.error.status == Some(500)),
                "{failed:?}"
            );
            let (last, earlier) = failed.split_last().unwrap();
            assert_eq!(last.retry_at_ms, None, "no attempt after the last");
            let planned: Vec<Duration> = earlier
                .iter()
                .map(|f| Duration::from_millis(f.retry_at_ms.unwrap() - f.at_ms.unwrap()))
                .collect();
            assert_eq!(sleep.waits(), planned, "{wire:?}");
            // Backoff doubles from 500 ms, half of it jittered.
            for (i, wait) in planned.iter().enumerate() {
                let base = 500u128 << i;
                assert!(
                    (base / 2..=base).contains(&wait.as_millis()),
                    "{wire:?}: attempt {}: {wait:?}",
                    i + 1
                );
            }
            match events.last() {
                Some(Event::RunFailed(f)) => assert!(
                    f.error
                        .to_string()
                        .contains(&format!("failed {max_attempts} times")),
                    "{}",
                    f.error
                ),
                other => panic!("{other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn a_permanent_error_is_one_request() {
    let dir = tempfile::tempdir().unwrap();
    for wire in WIRES {
        let server = FakeModel::start(|_, _| {
            Reply::json(
                401,
                &json!({"error": {"type": "authentication_error", "message": "bad key"}}),
            )
        })
        .await;
        let agent = agent(dir.path(), wire, &server, "max_attempts = 5");
        let clock = TestClock::new();
        let rt = runtime(Arc::new(MemoryStore::new()), &clock, Arc::new(Forever));
        let run = rt
            .start(&agent, json!("hi"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Failed);
        assert_eq!(server.seen().len(), 1, "{wire:?}");
        let failed = failures(&rt.events(&run).await.unwrap());
        assert_eq!(failed.len(), 1);
        assert!(!failed[0].error.transient);
        assert_eq!(failed[0].retry_at_ms, None);
    }
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_exactly_by_the_injected_clock() {
    let dir = tempfile::tempdir().unwrap();
    for wire in WIRES {
        let ok = ok_stream(wire);
        let server = FakeModel::start(move |_, n| match n {
            0 => rate_limited("2"),
            _ => Reply::sse(vec![ok.clone()]),
        })
        .await;
        let agent = agent(dir.path(), wire, &server, "");
        let clock = TestClock::new();
        let sleep = Arc::new(ClockSleep {
            clock: Arc::clone(&clock),
            waits: Mutex::default(),
        });
        let rt = runtime(Arc::new(MemoryStore::new()), &clock, sleep.clone());
        let run = rt
            .start(&agent, json!("hi"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        assert_eq!(server.seen().len(), 2, "{wire:?}");
        let events = rt.events(&run).await.unwrap();
        let failed = failures(&events);
        assert_eq!(failed.len(), 1);
        let f = &failed[0];
        assert_eq!(
            (f.error.status, f.error.retry_after_ms, f.error.transient),
            (Some(429), Some(2_000), true)
        );
        assert_eq!(f.at_ms, Some(T0));
        assert_eq!(f.retry_at_ms, Some(T0 + 2_000));
        assert_eq!(sleep.waits(), [Duration::from_secs(2)], "{wire:?}");
        // The second attempt's answer arrived at the due time.
        let answered = events.iter().find_map(|e| match e {
            Event::ModelCallCompleted(c) => c.at_ms,
            _ => None,
        });
        assert_eq!(answered, Some(T0 + 2_000));
    }
}

#[tokio::test]
async fn a_driver_recovering_mid_wait_waits_only_what_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let ok = ok_stream(Wire::OpenAi);
    let server = FakeModel::start(move |_, n| match n {
        0 => rate_limited("2"),
        _ => Reply::sse(vec![ok.clone()]),
    })
    .await;
    let agent = agent(dir.path(), Wire::OpenAi, &server, "");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::new();
    // The first driver fails, then dies in its wait.
    let first = runtime(Arc::clone(&store), &clock, Arc::new(Forever));
    let run = first
        .start(&agent, json!("hi"), StartOptions::new())
        .await
        .unwrap();
    let driving = tokio::spawn({
        let (first, run, agent) = (first.clone(), run.clone(), agent.clone());
        async move { first.drive(&run, &agent).await }
    });
    server
        .wait_for("the first attempt", |s| s.seen().len() == 1)
        .await;
    let recorded = async {
        loop {
            let events = store.load(&run).await.unwrap();
            if events.len() >= 3 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), recorded)
        .await
        .expect("the failure is recorded");
    driving.abort();
    let _ = driving.await;
    // 1.5 s later a new driver recovers the run: it waits the 0.5 s left.
    clock.advance(Duration::from_millis(1_500));
    let sleep = Arc::new(ClockSleep {
        clock: Arc::clone(&clock),
        waits: Mutex::default(),
    });
    let second = runtime(Arc::clone(&store), &clock, sleep.clone());
    let status = second
        .recover(&run, &agent, Default::default())
        .await
        .unwrap();
    assert_eq!(status, RunStatus::Completed);
    assert_eq!(sleep.waits(), [Duration::from_millis(500)]);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_parks_the_run_until_it_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(180));
    // In seconds, and as an HTTP date (measured from the server's now).
    for (wire, retry_after) in [
        (Wire::OpenAi, "120".to_owned()),
        (Wire::Anthropic, "120".to_owned()),
        (Wire::OpenAi, later),
    ] {
        let ok = ok_stream(wire);
        let header = retry_after.clone();
        let server = FakeModel::start(move |_, n| match n {
            0 => rate_limited(&header),
            _ => Reply::sse(vec![ok.clone()]),
        })
        .await;
        let agent = agent(dir.path(), wire, &server, "max_retry_wait = \"60s\"");
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
        let clock = TestClock::new();
        // A driver that tried to sleep through the wait would hang here.
        let rt = runtime(Arc::clone(&store), &clock, Arc::new(Forever));
        let run = rt
            .start(&agent, json!("hi"), StartOptions::new())
            .await
            .unwrap();
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Waiting);
        assert_eq!(server.seen().len(), 1);
        let events = rt.events(&run).await.unwrap();
        let f = failures(&events).remove(0);
        let asked = f.error.retry_after_ms.unwrap();
        assert!(
            (60_001..=180_000).contains(&asked),
            "{retry_after}: {asked} ms"
        );
        let due = f.retry_at_ms.unwrap();
        assert_eq!(due, T0 + asked);
        assert_eq!(
            events.last(),
            Some(&Event::WaitStarted(WaitStarted {
                step: 1,
                since_ms: T0,
                until_ms: due,
            }))
        );
        // The wake-up time is in the listing, for workers.
        let summary = store.summary(&run).await.unwrap();
        assert_eq!(
            (summary.status.as_str(), summary.wake_ms),
            (WAITING, Some(due as i64))
        );
        // Driven again before it is due: nothing happens.
        clock.set(due - 1);
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Waiting);
        assert_eq!(rt.events(&run).await.unwrap().len(), events.len());
        assert_eq!(server.seen().len(), 1);
        // Once due: the wait ends, the second attempt is made, at once.
        clock.set(due);
        assert_eq!(rt.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
        assert_eq!(server.seen().len(), 2, "{retry_after}");
        let events = rt.events(&run).await.unwrap();
        assert!(
            events.contains(&Event::WaitEnded(warden::engine::events::WaitEnded {
                at_ms: due
            }))
        );
        assert_eq!(store.summary(&run).await.unwrap().wake_ms, None);
        // The park is a parked interval: its two minutes are not wall time.
        let state = rt.state(&run).await.unwrap();
        assert_eq!(state.usage.wall_time_ms, 0, "{retry_after}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_claims_a_waiting_run_only_once_it_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let ok = ok_stream(Wire::OpenAi);
    let server = FakeModel::start(move |_, n| match n {
        0 => rate_limited("120"),
        _ => Reply::sse(vec![ok.clone()]),
    })
    .await;
    let agent = agent(dir.path(), Wire::OpenAi, &server, "");
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::new();
    let rt = runtime(Arc::clone(&store), &clock, Arc::new(Forever));
    let run = rt
        .submit(
            &agent,
            json!("hi"),
            StartOptions::new().id(RunId::new("parked").unwrap()),
        )
        .await
        .unwrap();
    let worker = Worker::builder(rt.clone())
        .owner("w1")
        .poll(Duration::from_millis(10))
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let working = tokio::spawn({
        let worker = worker.clone();
        async move {
            worker
                .run(async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    let until = |want: &'static str| {
        let store = Arc::clone(&store);
        let run = run.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let s = store.summary(&run).await.unwrap();
                if s.status == want && s.claim.is_none() {
                    return s;
                }
                assert!(std::time::Instant::now() < deadline, "never {want}: {s:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let parked = until(WAITING).await;
    let due = parked.wake_ms.unwrap();
    assert_eq!(due as u64, T0 + 120_000);
    // The worker polls on: nothing is claimed while the run is not due.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.seen().len(), 1);
    assert_eq!(store.summary(&run).await.unwrap().claim_token, 1);
    clock.set(due as u64);
    until("completed").await;
    assert_eq!(server.seen().len(), 2);
    assert_eq!(store.summary(&run).await.unwrap().claim_token, 2);
    let _ = stop.send(());
    let report = working.await.unwrap();
    assert_eq!((report.claimed, report.settled), (2, 2));
}

// ---------------------------------------------------------------------------
// A real `warden worker` process exits while its run waits.

fn start_worker(dir: &Path, url: &str, name: &str) -> Child {
    Command::new(warden_binary())
        .args([
            "worker",
            "--claim-ttl",
            "2s",
            "--poll",
            "50ms",
            "--grace",
            "1s",
            "--id",
            name,
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
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .spawn()
        .unwrap()
}

fn warden(dir: &Path, url: &str, args: &[&str]) -> std::process::Output {
    Command::new(warden_binary())
        .args(args)
        .env("WARDEN_STORE", url)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_parked_on_a_long_retry_after_survives_its_worker_and_is_driven_when_due() {
    let Some(pg) = PgSchema::new("retry_wait").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ok = ok_stream(Wire::OpenAi);
    // Retry-After 3 s over a cap of 1 s: the first worker parks the run.
    let server = FakeModel::start(move |_, n| match n {
        0 => rate_limited("3"),
        _ => Reply::sse(vec![ok.clone()]),
    })
    .await;
    agent(dir.path(), Wire::OpenAi, &server, "max_retry_wait = \"1s\"");
    let out = warden(
        dir.path(),
        &pg.url,
        &["submit", "openai.toml", "hi", "--run-id", "r1"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = pg.store().await;
    let run = RunId::new("r1").unwrap();

    let mut first = start_worker(dir.path(), &pg.url, "first");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let parked = loop {
        let s = store.summary(&run).await.unwrap();
        if s.status == WAITING {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "never parked: {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The process exits (killed) while the run waits.
    first.kill().unwrap();
    first.wait().unwrap();
    let due = parked.wake_ms.unwrap();
    assert_eq!(server.seen().len(), 1);
    let events = Runtime::new(
        Arc::new(pg.store().await),
        PluginHost::new(sandbox().clone()),
    )
    .events(&run)
    .await
    .unwrap();
    let f = failures(&events).remove(0);
    assert_eq!(f.error.retry_after_ms, Some(3_000));
    assert_eq!(f.retry_at_ms, Some(due as u64));
    assert!(matches!(events.last(), Some(Event::WaitStarted(w)) if w.until_ms == due as u64));
    // `runs show` says until when it waits.
    let show = warden(dir.path(), &pg.url, &["runs", "show", "r1"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains(&format!("waiting until {}", warden::units::utc_text(due))),
        "{text}"
    );
    // Past its wake-up time nobody drives it: no process is left.
    while crate::workers::now_ms() < due + 300 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let still = store.summary(&run).await.unwrap();
    assert_eq!((still.status.as_str(), server.seen().len()), (WAITING, 1));

    // Another worker takes it up and drives it to the end.
    let mut second = start_worker(dir.path(), &pg.url, "second");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = store.summary(&run).await.unwrap();
        if s.status == "completed" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never completed: {s:?}: {}",
            std::fs::read_to_string(dir.path().join("second.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(server.seen().len(), 2);
    let events = Runtime::new(
        Arc::new(pg.store().await),
        PluginHost::new(sandbox().clone()),
    )
    .events(&run)
    .await
    .unwrap();
    let woke = events.iter().find_map(|e| match e {
        Event::WaitEnded(w) => Some(w.at_ms),
        _ => None,
    });
    assert!(woke.is_some_and(|at| at >= due as u64), "{woke:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warden_run_exits_parked_on_a_long_wait_and_runs_resume_drives_it_once_due() {
    let dir = tempfile::tempdir().unwrap();
    let ok = ok_stream(Wire::Anthropic);
    let server = FakeModel::start(move |_, n| match n {
        0 => rate_limited("2"),
        _ => Reply::sse(vec![ok.clone()]),
    })
    .await;
    agent(
        dir.path(),
        Wire::Anthropic,
        &server,
        "max_retry_wait = \"1s\"",
    );
    let store = dir.path().join("runs.db");
    let store = store.to_str().unwrap();
    let ran = warden(
        dir.path(),
        store,
        &["run", "anthropic.toml", "hi", "--run-id", "r1"],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    // Exit 4: parked, with when it continues and how.
    assert_eq!(ran.status.code(), Some(4), "{text}");
    assert!(
        text.contains("next attempt in 2s (Retry-After: 2s)"),
        "{text}"
    );
    assert!(text.contains("run r1: waiting"), "{text}");
    assert!(text.contains("warden runs resume r1"), "{text}");
    assert_eq!(server.seen().len(), 1);
    let listed = warden(dir.path(), store, &["runs", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["status"], json!("waiting"));
    let due = listed[0]["wake_ms"].as_i64().unwrap();
    while crate::workers::now_ms() < due {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resumed = warden(dir.path(), store, &["runs", "resume", "r1"]);
    let text = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        resumed.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert!(text.contains("run r1: completed"), "{text}");
    assert_eq!(server.seen().len(), 2);
}
