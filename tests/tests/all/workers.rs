//! Many hosts on one store: run claims with fencing through the real
//! engine, and `warden worker` processes killed with SIGKILL at random
//! moments while they share 200 runs on PostgreSQL, idempotency
//! commitments across a takeover in the middle of a call, and a worker
//! dying between a run's terminal event and its delivery (another worker
//! makes it, once).
//!
//! The PostgreSQL tests use the server at `WARDEN_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`), each in a fresh schema that
//! is dropped afterwards. Where no server is reachable they fail, unless
//! `WARDEN_SKIP_POSTGRES=1` is set by hand: then they say so loudly on
//! stderr and test nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use warden::engine::StartOptions;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::json;
use warden::engine::events::Event;
use warden::engine::{Agent, ReplayOptions, RunId, RunStatus, Runtime, RuntimeError};
use warden::plugins::PluginHost;
use warden::sandbox::ValidUntil;
use warden::store::{EventStore, ListingStatus, PostgresStore, RunFilter, SqliteStore, StoreError};
use warden::worker::Worker;

use super::engine::Fixture;
use crate::binary::warden_binary;
use crate::sandbox;
use warden::store::testing::{AppendVia, BeforeAppend, Hooks, Intercepted};

/// A fresh schema in the test database, dropped on drop.
pub(crate) struct PgSchema {
    pub(crate) url: String,
}

impl PgSchema {
    /// A fresh schema; an unreachable server fails the test, unless
    /// `WARDEN_SKIP_POSTGRES=1` was set by hand (then `None`, said loudly).
    pub(crate) async fn new(name: &str) -> Option<PgSchema> {
        let base = std::env::var("WARDEN_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        if let Err(error) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await {
            if std::env::var_os("WARDEN_SKIP_POSTGRES").is_some_and(|v| v == "1") {
                eprintln!(
                    "\n*** SKIPPED {name} (WARDEN_SKIP_POSTGRES=1): no PostgreSQL at {base} ({error}) ***\n"
                );
                return None;
            }
            panic!(
                "PostgreSQL at {base} is unreachable: {error}. Start it (see .ci/run), point \
                 WARDEN_TEST_POSTGRES at one, or set WARDEN_SKIP_POSTGRES=1 to skip these tests"
            );
        }
        let schema = format!("warden_{name}_{}_{:08x}", std::process::id(), rand_u32());
        let sep = if base.contains('?') { '&' } else { '?' };
        Some(PgSchema {
            url: format!("{base}{sep}schema={schema}"),
        })
    }

    fn schema(&self) -> &str {
        self.url.rsplit("schema=").next().unwrap()
    }

    pub(crate) async fn store(&self) -> PostgresStore {
        PostgresStore::open(&self.url).await.unwrap()
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let base = self
            .url
            .split("schema=")
            .next()
            .unwrap()
            .trim_end_matches(['?', '&'])
            .to_owned();
        let schema = self.schema().to_owned();
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((client, connection)) =
                    tokio_postgres::connect(&base, tokio_postgres::NoTls).await
                {
                    tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish() as u32
}

/// One write per run, naming the run's job, then a final answer.
fn job_transcript(job: &str) -> String {
    format!(
        r#"
[[turns]]
text = "Recording {job}."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = {{ op = "append", path = "/workspace/effects.log", content = "{job}\n" }}

[[turns]]
text = "Done with {job}."
"#
    )
}

/// An agent file `agents/<job>.toml` in the fixture whose one write appends
/// `<job>` to `work/effects.log` (the side-effect counter).
fn job_agent(fx: &Fixture, job: &str) -> Agent {
    let dir = fx.dir.path().join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{job}.transcript.toml")),
        job_transcript(job),
    )
    .unwrap();
    let text = format!(
        r#"
name = "job"
instructions = "Record the job."

[model]
provider = "scripted"
name = "script"
transcript = "{job}.transcript.toml"

[plugins.hostile]
source = "../hostile.toml"
approval = {{ fs = "never" }}
[plugins.hostile.grant.mounts.workspace]
dir = "../work"
"#
    );
    let path = dir.join(format!("{job}.toml"));
    std::fs::write(&path, text).unwrap();
    Agent::load(&path.canonicalize().unwrap(), None).unwrap()
}

/// A driver's own view of its claim in these tests: good for a minute, so
/// that only the store's fencing token decides (a stalled driver's clock
/// may well say its claim is fine).
fn valid() -> ValidUntil {
    ValidUntil::for_next(Duration::from_secs(60))
}

fn runtime(store: Arc<dyn EventStore>) -> Runtime {
    Runtime::new(store, PluginHost::new(sandbox().clone()))
}

fn effects(fx: &Fixture) -> Vec<String> {
    std::fs::read_to_string(fx.dir.path().join("work/effects.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Two drivers race for one run: exactly one gets the claim; once the
/// winner's claim expires the other takes over with a higher token, and the
/// first, waking up, has every append refused and writes nothing.
async fn racing_drivers(store: Arc<dyn EventStore>, fx: &Fixture) {
    let agent = job_agent(fx, "race");
    let a = runtime(store.clone());
    let b = runtime(store.clone());
    let run = RunId::new("raced").unwrap();
    a.submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    let (first, second) = tokio::join!(
        store.acquire_claim(&run, "driver-a", 1_000, 5_000),
        store.acquire_claim(&run, "driver-b", 1_000, 5_000),
    );
    let (winner, loser_owner) = match (first, second) {
        (Ok(claim), Err(StoreError::Claimed { .. })) => (claim, "driver-b"),
        (Err(StoreError::Claimed { .. }), Ok(claim)) => (claim, "driver-a"),
        other => panic!("expected exactly one claim, got {other:?}"),
    };
    // The winner stalls past its expiry; the loser takes the run over.
    let takeover = store
        .acquire_claim(&run, loser_owner, winner.expires_ms, 5_000)
        .await
        .unwrap();
    assert_eq!((winner.token, takeover.token), (1, 2));
    // The stalled winner wakes up and drives: refused at its first append.
    let driver = if winner.owner == "driver-a" { &a } else { &b };
    let err = driver
        .recover_claimed(&agent, ReplayOptions::default(), winner.clone(), valid())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Fenced {
                token: 1,
                current: 2,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.load(&run).await.unwrap().len(), 1, "nothing written");
    // The new owner drives the run to its end; its write ran once.
    let owner = if winner.owner == "driver-a" { &b } else { &a };
    let status = owner
        .recover_claimed(&agent, ReplayOptions::default(), takeover.clone(), valid())
        .await
        .unwrap();
    assert_eq!(status, RunStatus::Completed);
    store.release_claim(&takeover, None).await.unwrap();
    assert_eq!(effects(fx), ["race"]);
    let summary = store.summary(&run).await.unwrap();
    assert_eq!(
        (summary.status.as_str(), summary.claim_token),
        ("completed", 2)
    );
    assert!(summary.claim.is_none());
    assert!(store.verify(&run).await.unwrap().is_intact());
}

#[tokio::test]
async fn racing_drivers_on_postgres_have_one_winner_and_the_replaced_one_is_fenced() {
    let Some(pg) = PgSchema::new("race").await else {
        return;
    };
    let fx = Fixture::new();
    racing_drivers(Arc::new(pg.store().await), &fx).await;
}

#[tokio::test]
async fn racing_drivers_on_sqlite_have_one_winner_and_the_replaced_one_is_fenced() {
    let fx = Fixture::new();
    let store = SqliteStore::open(fx.dir.path().join("runs.db")).unwrap();
    racing_drivers(Arc::new(store), &fx).await;
}

// ---- a takeover in the middle of a keyed call ------------------------------

/// An agent whose one call is `block_once`, keyed by `claim_id`, with the
/// effect class the operator gives it; then a final answer.
fn keyed_agent(fx: &Fixture, name: &str, effect: &str) -> Agent {
    let dir = fx.dir.path().join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.transcript.toml")),
        r#"
[[turns]]
text = "Paying."
[[turns.tool_calls]]
name = "hostile__block_once"
arguments = { path = "/workspace/effects.log", content = "paid\n", claim_id = "claim-7" }

[[turns]]
text = "Paid."
"#,
    )
    .unwrap();
    let text = format!(
        r#"
name = "{name}"
instructions = "Pay the claim."

[model]
provider = "scripted"
name = "script"
transcript = "{name}.transcript.toml"

[plugins.hostile]
source = "../hostile.toml"
approval = {{ block_once = "never" }}
[plugins.hostile.grant.mounts.workspace]
dir = "../work"
[plugins.hostile.grant.tools.block_once]
effect = "{effect}"
idempotency_key = "claim_id"
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    Agent::load(&path.canonicalize().unwrap(), None).unwrap()
}

/// Driver A takes the run and dies in the middle of its keyed call: its task
/// is dropped while the guest blocks, after the effect happened and with
/// the commitment claimed and the intent recorded, but no completion. Once
/// A's claim expires driver B takes the run over. Returns B's runtime, the
/// run, B's claim and what B's recovery said.
async fn die_mid_call(
    store: Arc<dyn EventStore>,
    fx: &Fixture,
    agent: &Agent,
) -> (
    Runtime,
    RunId,
    warden::store::Claim,
    Result<RunStatus, RuntimeError>,
) {
    let run = RunId::new("mid-call").unwrap();
    let a = runtime(store.clone());
    a.submit(agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    let claim_a = store
        .acquire_claim(&run, "driver-a", now_ms(), 60_000)
        .await
        .unwrap();
    let driving = tokio::spawn({
        let (agent, claim) = (agent.clone(), claim_a.clone());
        async move {
            a.recover_claimed(&agent, ReplayOptions::default(), claim, valid())
                .await
        }
    });
    let blocked = fx.dir.path().join("work/effects.log.blocked");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !blocked.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    driving.abort();
    assert!(driving.await.unwrap_err().is_cancelled());
    assert_eq!(effects(fx), ["paid"], "the effect happened once");
    let events = store.load(&run).await.unwrap();
    let last = warden::engine::decode(&events.last().unwrap().bytes).unwrap();
    assert!(
        matches!(last, Event::ToolCallIntent(_)),
        "driver A died between intent and completion, got {last:?}"
    );

    let b = runtime(store.clone()).with_commitment_wait(Duration::from_millis(200));
    let claim_b = store
        .acquire_claim(&run, "driver-b", claim_a.expires_ms, 60_000)
        .await
        .unwrap();
    assert_eq!((claim_a.token, claim_b.token), (1, 2));
    let outcome = b
        .recover_claimed(agent, ReplayOptions::default(), claim_b.clone(), valid())
        .await;
    (b, run, claim_b, outcome)
}

/// The keys the plugin was handed, one line per execution.
fn keys_seen(fx: &Fixture) -> Vec<String> {
    std::fs::read_to_string(fx.dir.path().join("work/effects.log.keys"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Another run making the same keyed call, driven to its end: it must get
/// the taken-over run's result without executing.
async fn same_claim_elsewhere(rt: &Runtime, agent: &Agent, origin: &RunId) {
    let other = rt
        .start(agent, json!("again"), StartOptions::new())
        .await
        .unwrap();
    assert_eq!(rt.drive(&other, agent).await.unwrap(), RunStatus::Completed);
    let dedup = rt
        .events(&other)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e {
            Event::ToolCallDeduplicated(d) => Some(d),
            _ => None,
        })
        .expect("the second run was deduplicated");
    assert_eq!(&dedup.origin_run, origin);
}

/// An idempotent keyed call: the new driver retries it with the same key
/// (the commitment is still the run's own), settles it, and a later run
/// with the same key gets that result without executing.
async fn idempotent_call_across_a_takeover(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let agent = keyed_agent(&fx, "idempotent-pay", "idempotent");
    let (b, run, claim_b, outcome) = die_mid_call(store.clone(), &fx, &agent).await;
    assert_eq!(outcome.unwrap(), RunStatus::Completed);
    store.release_claim(&claim_b, None).await.unwrap();
    let keys = keys_seen(&fx);
    assert_eq!(keys.len(), 2, "executed by A, then retried by B: {keys:?}");
    assert_eq!(keys[0], keys[1], "the retry carried the same key");
    let intent_key = b
        .events(&run)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e {
            Event::ToolCallIntent(i) => Some(i.idempotency_key),
            _ => None,
        })
        .unwrap();
    assert_eq!(keys[0], intent_key);

    same_claim_elsewhere(&b, &agent, &run).await;
    assert_eq!(keys_seen(&fx).len(), 2, "the other run executed nothing");
    assert!(store.verify(&run).await.unwrap().is_intact());
}

/// A keyed write: the new driver must not run it again; the run needs
/// reconciliation and keeps the commitment, so another run with the same
/// key is told who holds it; once an operator resolves the write, that run
/// gets the resolved result. The effect happened exactly once.
async fn write_across_a_takeover(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let agent = keyed_agent(&fx, "write-pay", "write");
    let (b, run, claim_b, outcome) = die_mid_call(store.clone(), &fx, &agent).await;
    assert!(
        matches!(outcome, Err(RuntimeError::NeedsReconciliation { .. })),
        "{outcome:?}"
    );
    store
        .release_claim(&claim_b, Some(RunStatus::NeedsReconciliation.listing()))
        .await
        .unwrap();
    assert_eq!(keys_seen(&fx).len(), 1, "the write did not run again");

    let other = b
        .start(&agent, json!("again"), StartOptions::new())
        .await
        .unwrap();
    match b.drive(&other, &agent).await {
        Err(RuntimeError::CommitmentHeld { holder, .. }) => assert_eq!(holder.run_id, run),
        other => panic!("expected the commitment to be held, got {other:?}"),
    }
    b.resolve(
        &run,
        json!({"paid": true}),
        "ops",
        Some("seen in the ledger".into()),
    )
    .await
    .unwrap();
    assert_eq!(b.drive(&run, &agent).await.unwrap(), RunStatus::Completed);
    assert_eq!(b.drive(&other, &agent).await.unwrap(), RunStatus::Completed);
    same_claim_elsewhere(&b, &agent, &run).await;
    assert_eq!(keys_seen(&fx).len(), 1, "paid exactly once");
    assert_eq!(effects(&fx), ["paid"]);
}

#[tokio::test]
async fn an_idempotent_call_survives_a_takeover_mid_call_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    idempotent_call_across_a_takeover(Arc::new(store)).await;
}

#[tokio::test]
async fn an_idempotent_call_survives_a_takeover_mid_call_on_postgres() {
    let Some(pg) = PgSchema::new("midcall_idem").await else {
        return;
    };
    idempotent_call_across_a_takeover(Arc::new(pg.store().await)).await;
}

#[tokio::test]
async fn a_write_is_not_repeated_after_a_takeover_mid_call_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    write_across_a_takeover(Arc::new(store)).await;
}

#[tokio::test]
async fn a_write_is_not_repeated_after_a_takeover_mid_call_on_postgres() {
    let Some(pg) = PgSchema::new("midcall_write").await else {
        return;
    };
    write_across_a_takeover(Arc::new(pg.store().await)).await;
}

// ---- the takeover test ------------------------------------------------------

const RUNS: usize = 200;
const WORKERS: usize = 3;

/// A worker and the file its stderr goes to.
struct Running {
    child: Child,
    log: std::path::PathBuf,
}

fn start_worker(dir: &Path, url: &str, n: usize, generation: usize) -> Running {
    let log = dir.join(format!("worker-{n}-{generation}.log"));
    let child = Command::new(warden_binary())
        .args([
            "worker",
            "--concurrency",
            "4",
            "--claim-ttl",
            "2s",
            "--poll",
            "50ms",
            "--grace",
            "5s",
            "--id",
            &format!("worker-{n}"),
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
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Running { child, log }
}

/// A small deterministic generator, so a failure can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_at_random_moments_finish_every_run_and_repeat_no_write() {
    let Some(pg) = PgSchema::new("takeover").await else {
        return;
    };
    let fx = Fixture::new();
    let dir = fx.dir.path();
    let store: Arc<dyn EventStore> = Arc::new(pg.store().await);
    let rt = runtime(store.clone());
    // One run through `warden submit`, the rest through the library.
    let jobs: Vec<String> = (0..RUNS).map(|i| format!("job-{i:03}")).collect();
    let agents: Vec<Agent> = jobs.iter().map(|job| job_agent(&fx, job)).collect();
    let out = Command::new(warden_binary())
        .args(["submit", "agents/job-000.toml", "go", "--run-id", "job-000"])
        .env("WARDEN_STORE", &pg.url)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "job-000");
    for (job, agent) in jobs.iter().zip(&agents).skip(1) {
        rt.submit(
            agent,
            json!("go"),
            StartOptions::new().id(RunId::new(job.as_str()).unwrap()),
        )
        .await
        .unwrap();
    }
    let queued = store
        .list(&RunFilter::new().status("queued"))
        .await
        .unwrap();
    assert_eq!(queued.len(), RUNS);

    let mut started = 0;
    let mut workers: Vec<Option<Running>> = (0..WORKERS)
        .map(|n| {
            started += 1;
            Some(start_worker(dir, &pg.url, n, started))
        })
        .collect();
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let (mut kills, mut resolved, mut rounds) = (0, 0, 0);
    loop {
        rounds += 1;
        assert!(
            rounds <= 3_000,
            "runs did not finish: {:?}",
            status_counts(&*store).await
        );
        let runs = store.list(&RunFilter::new()).await.unwrap();
        let done = runs.iter().filter(|r| r.status == "completed").count();
        if done == RUNS {
            break;
        }
        // The operator reconciles writes left without an outcome. A run
        // lists as needs_reconciliation while its write is in flight too:
        // only one whose driver is gone (claim released or expired) is
        // dangling. If the job's line is in the counter the write happened;
        // if not, the operator performs it by hand after recording so.
        // Either way it happens once.
        let now = now_ms();
        for r in runs.iter().filter(|r| {
            r.status == "needs_reconciliation" && r.claim.as_ref().is_none_or(|l| l.is_expired(now))
        }) {
            let job = r.run_id.as_str();
            let happened = effects(&fx).iter().any(|l| l == job);
            let recorded = rt
                .resolve(
                    &r.run_id,
                    json!({ "appended": true, "by_hand": !happened }),
                    "test-operator",
                    Some("checked effects.log".into()),
                )
                .await;
            match recorded {
                Ok(()) => resolved += 1,
                // Its driver was slow, not dead, and recorded the outcome.
                Err(RuntimeError::NotReconcilable { .. } | RuntimeError::Conflict { .. }) => {
                    continue;
                }
                Err(other) => panic!("resolving {job}: {other}"),
            }
            if !happened {
                use std::io::Write as _;
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(dir.join("work/effects.log"))
                    .unwrap();
                writeln!(f, "{job}").unwrap();
            }
        }
        // Restart dead workers; now and then kill one at random.
        for (n, slot) in workers.iter_mut().enumerate() {
            if slot.is_none() {
                started += 1;
                *slot = Some(start_worker(dir, &pg.url, n, started));
            }
        }
        if kills < 60 && rng.next().is_multiple_of(2) {
            let n = (rng.next() % WORKERS as u64) as usize;
            if let Some(mut worker) = workers[n].take() {
                worker.child.kill().unwrap(); // SIGKILL
                worker.child.wait().unwrap();
                kills += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(10 + rng.next() % 120)).await;
    }
    // A graceful stop: SIGTERM once each worker said it is ready (its
    // handlers are installed before that line), and each exits 0.
    for worker in workers.iter_mut().flatten() {
        let mut waited = 0;
        while !std::fs::read_to_string(&worker.log)
            .unwrap_or_default()
            .contains("runs at once")
        {
            waited += 1;
            assert!(waited < 3_000, "a worker never became ready");
            assert!(
                worker.child.try_wait().unwrap().is_none(),
                "a worker died starting"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pid = worker.child.id().to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(term.success());
    }
    for worker in workers.iter_mut().flatten() {
        let status = worker.child.wait().unwrap();
        assert!(
            status.success(),
            "a worker stopped with {status}: {}",
            std::fs::read_to_string(&worker.log).unwrap_or_default()
        );
    }

    // Every run completed, its log gap-free and its chain intact.
    let mut taken_over = 0;
    for job in &jobs {
        let run = RunId::new(job.as_str()).unwrap();
        let s = store.summary(&run).await.unwrap();
        assert_eq!(s.status, "completed", "{job}");
        // Every run was driven under a claim (a worker killed after the
        // last append leaves its expired claim on the finished run).
        assert!(s.claim_token >= 1, "{job} was never claimed");
        if s.claim_token > 1 {
            taken_over += 1;
        }
        let log = store.load(&run).await.unwrap();
        let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=s.event_count).collect::<Vec<_>>(), "{job}");
        assert!(store.verify(&run).await.unwrap().is_intact(), "{job}");
        assert_eq!(
            rt.state(&run).await.unwrap().status(),
            RunStatus::Completed,
            "{job}"
        );
    }
    // Each job's write happened exactly once (by its tool, or by the
    // operator for a write that never ran).
    let lines = effects(&fx);
    for job in &jobs {
        let n = lines.iter().filter(|l| *l == job).count();
        assert_eq!(n, 1, "{job}'s write happened {n} times");
    }
    assert_eq!(lines.len(), RUNS);
    eprintln!(
        "takeover test: {kills} SIGKILLs, {taken_over} runs taken over by another worker, {resolved} writes reconciled"
    );
    assert!(kills >= 1, "no worker was killed: the test tested nothing");
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn status_counts(store: &dyn EventStore) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in store.list(&RunFilter::new()).await.unwrap() {
        *counts.entry(r.status).or_default() += 1;
    }
    counts
}

// ---- a worker dies between a run's terminal event and its delivery ----------

/// Makes a store's fenced append of a delivery's intent never return
/// (raising `stalled` first): the worker driving through it stops between
/// the run's terminal event and its delivery, as if it died there (its task
/// is then aborted, and its claim left to expire).
struct StallAtDelivery {
    stalled: Arc<AtomicBool>,
}

#[async_trait]
impl Hooks for StallAtDelivery {
    async fn before_append(&self, via: AppendVia, _: &RunId, events: &[Bytes]) -> BeforeAppend {
        let delivers = events.iter().any(|e| {
            warden::engine::decode(e).is_ok_and(|e| matches!(e, Event::DeliveryIntent(_)))
        });
        if via == AppendVia::Fenced && delivers {
            self.stalled.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        BeforeAppend::Write
    }
}

/// An agent file in `dir` that answers at once and whose channel `notify`
/// (`builtin:jsonl-channel`) writes the output to `outbox/results.jsonl`.
fn delivering_agent(dir: &Path) -> Agent {
    std::fs::create_dir_all(dir.join("outbox")).unwrap();
    std::fs::write(
        dir.join("transcript.toml"),
        "[[turns]]\ntext = \"The answer is 42.\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("agent.toml"),
        r#"
name = "notifier"
instructions = "Answer; the channel tells people."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.jsonl]
source = "builtin:jsonl-channel"
[plugins.jsonl.grant.mounts.outbox]
dir = "outbox"
[plugins.jsonl.grant.config]
file = "results.jsonl"

[channels.notify]
plugin = "jsonl"
"#,
    )
    .unwrap();
    Agent::load(&dir.join("agent.toml").canonicalize().unwrap(), None).unwrap()
}

fn delivered(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("outbox/results.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Polls `done` every 20 ms for up to 60 s; panics with `what` after.
pub(crate) async fn wait_for<F: AsyncFnMut() -> bool>(what: &str, mut done: F) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn quick_worker(rt: Runtime, owner: &str) -> Worker {
    Worker::builder(rt)
        .owner(owner)
        .claim_ttl(Duration::from_millis(300))
        .poll(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// Worker A completes a submitted run and dies before its delivery: the run
/// is listed `completed`, owing one delivery, under A's dead claim. Worker
/// B claims it once the claim expires, makes the delivery exactly once
/// (one line in the file, with the stable id), releases the run and never
/// claims it again; A's claim is fenced.
async fn a_dead_workers_delivery_is_made_by_another(store: Arc<dyn EventStore>, dir: &Path) {
    let agent = delivering_agent(dir);
    let run = RunId::new("owed").unwrap();
    let stalled = Arc::new(AtomicBool::new(false));
    let rt_a = runtime(Arc::new(Intercepted {
        inner: store.clone(),
        hooks: StallAtDelivery {
            stalled: stalled.clone(),
        },
    }));
    rt_a.submit(&agent, json!("go"), StartOptions::new().id(run.clone()))
        .await
        .unwrap();
    let worker_a = quick_worker(rt_a, "worker-a");
    let a = tokio::spawn(async move { worker_a.run(std::future::pending()).await });
    wait_for("worker A never reached the delivery", async || {
        stalled.load(Ordering::SeqCst)
    })
    .await;
    a.abort();
    assert!(a.await.unwrap_err().is_cancelled());

    let summary = store.summary(&run).await.unwrap();
    assert_eq!(
        (summary.status.as_str(), summary.owes_deliveries),
        ("completed", 1),
        "the finished run is listed as owing its delivery"
    );
    let claim_a = summary.claim.clone().expect("worker A's claim is left");
    assert_eq!((claim_a.owner.as_str(), claim_a.token), ("worker-a", 1));
    let events = runtime(store.clone()).events(&run).await.unwrap();
    assert!(
        matches!(events.last(), Some(Event::RunCompleted(_))),
        "worker A died right after the terminal event: {events:?}"
    );
    let completed_at = events.len() - 1;
    assert!(delivered(dir).is_empty());

    let worker_b = quick_worker(runtime(store.clone()), "worker-b");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let b = tokio::spawn(async move {
        worker_b
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    wait_for(
        "worker B never made the delivery a dead worker owed",
        async || {
            let s = store.summary(&run).await.unwrap();
            s.owes_deliveries == 0 && s.claim.is_none()
        },
    )
    .await;
    // Polling on, B finds nothing more to do with the run.
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.send(()).unwrap();
    let report = b.await.unwrap();
    assert_eq!((report.claimed, report.settled), (1, 1), "{report:?}");

    let lines = delivered(dir);
    assert_eq!(lines.len(), 1, "delivered exactly once: {lines:?}");
    assert_eq!(lines[0]["id"], format!("{run}/notify/{completed_at}"));
    let events = runtime(store.clone()).events(&run).await.unwrap();
    let kinds: Vec<&str> = events[completed_at + 1..]
        .iter()
        .map(|e| e.kind().as_str())
        .collect();
    assert_eq!(kinds, ["delivery_intent", "delivery_completed"]);
    let summary = store.summary(&run).await.unwrap();
    assert_eq!(
        (
            summary.status.as_str(),
            summary.owes_deliveries,
            summary.claim_token
        ),
        ("completed", 0, 2)
    );
    let err = store
        .append_fenced(
            &claim_a,
            events.len() as u64,
            &[Bytes::from_static(b"{}")],
            ListingStatus::COMPLETED.into(),
            0,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced {
                token: 1,
                current: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(store.verify(&run).await.unwrap().is_intact());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_owed_delivery_is_made_once_by_another_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    a_dead_workers_delivery_is_made_by_another(Arc::new(store), dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_owed_delivery_is_made_once_by_another_on_postgres() {
    let Some(pg) = PgSchema::new("owed").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    a_dead_workers_delivery_is_made_by_another(Arc::new(pg.store().await), dir.path()).await;
}

// ---- a worker stays responsive while runs are stuck --------------------------

/// A run whose first tool call reads a FIFO in its mount (a read that, run
/// inline on a runtime thread, never returns) and whose second blocks in a
/// host call until its lease deadline.
fn stuck_agent(fx: &Fixture, name: &str) -> Agent {
    let dir = fx.dir.path().join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.transcript.toml")),
        r#"
[[turns]]
text = "Reading the pipe."
[[turns.tool_calls]]
name = "hostile__fs"
arguments = { op = "read", path = "/workspace/pipe" }

[[turns]]
text = "Waiting."
[[turns.tool_calls]]
name = "hostile__sleep_forever"
arguments = {}

[[turns]]
text = "Done waiting."
"#,
    )
    .unwrap();
    let text = format!(
        r#"
name = "{name}"
instructions = "Get stuck."

[model]
provider = "scripted"
name = "script"
transcript = "{name}.transcript.toml"

[plugins.hostile]
source = "../hostile.toml"
approval = {{ fs = "never", sleep_forever = "never" }}
[plugins.hostile.grant.mounts.workspace]
dir = "../work"
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    Agent::load(&path.canonicalize().unwrap(), None).unwrap()
}

/// Kills the worker if the test fails before it stops.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A `warden worker` with two runtime threads drives two runs that get
/// stuck (a FIFO read, then a host call that lasts until the lease
/// deadline, a minute away), still drives a third run to completion, and on
/// SIGTERM stops within its one-second grace, releasing the two stuck runs:
/// a stuck lease holds no runtime thread and delays neither another run nor
/// a shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_two_stuck_runs_drives_a_third_and_stops_on_sigterm() {
    let Some(pg) = PgSchema::new("stuck").await else {
        return;
    };
    let fx = Fixture::new();
    let dir = fx.dir.path();
    let fifo = dir.join("work/pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let store: Arc<dyn EventStore> = Arc::new(pg.store().await);
    let rt = runtime(store.clone());
    let stuck = ["stuck-a", "stuck-b"].map(|name| RunId::new(name).unwrap());
    for run in &stuck {
        rt.submit(
            &stuck_agent(&fx, run.as_str()),
            json!("go"),
            StartOptions::new().id(run.clone()),
        )
        .await
        .unwrap();
    }
    let out = dir.join("worker.out");
    let log = dir.join("worker.log");
    let child = Command::new(warden_binary())
        .args([
            "--json",
            "worker",
            "--concurrency",
            "3",
            "--claim-ttl",
            "2s",
            "--poll",
            "50ms",
            "--grace",
            "1s",
            "--id",
            "stuck-worker",
        ])
        .env("WARDEN_STORE", &pg.url)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        // As many runtime threads as stuck runs: one held by a stuck call
        // would leave none for the third run or the signal.
        .env("TOKIO_WORKER_THREADS", "2")
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut worker = KillOnDrop(child);

    // Both stuck runs got past the FIFO (the host refused it) and are now
    // in the call that waits for its deadline.
    for run in &stuck {
        wait_for(&format!("{run} never got past the FIFO"), async || {
            let events = rt.events(run).await.unwrap_or_default();
            format!("{events:?}").contains("sleep_forever")
        })
        .await;
    }
    let events = rt.events(&stuck[0]).await.unwrap();
    assert!(
        format!("{events:?}").contains("Unsupported"),
        "the FIFO read was refused as unsupported: {events:?}"
    );

    // A third run is driven to completion meanwhile.
    let free = RunId::new("free").unwrap();
    rt.submit(
        &job_agent(&fx, "free"),
        json!("go"),
        StartOptions::new().id(free.clone()),
    )
    .await
    .unwrap();
    wait_for("the third run was not driven", async || {
        store
            .summary(&free)
            .await
            .is_ok_and(|s| s.status == "completed")
    })
    .await;
    // Still stuck, in their write, under the worker's claim.
    for run in &stuck {
        let s = store.summary(run).await.unwrap();
        assert_eq!(s.status, "needs_reconciliation", "{run}: {s:?}");
        assert!(s.claim.is_some(), "{run}: {s:?}");
    }

    // SIGTERM: the worker stops within its grace, long before the stuck
    // calls' deadline, and releases their runs.
    let pid = worker.0.id().to_string();
    let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(term.success());
    let mut status = None;
    wait_for("the worker did not stop on SIGTERM", async || {
        status = worker.0.try_wait().unwrap();
        status.is_some()
    })
    .await;
    let status = status.unwrap();
    assert!(
        status.success(),
        "the worker stopped with {status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let report: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    assert_eq!(
        (&report["claimed"], &report["settled"], &report["released"]),
        (&json!(3), &json!(1), &json!(2)),
        "{report}"
    );
    for run in &stuck {
        let s = store.summary(run).await.unwrap();
        assert!(s.claim.is_none(), "{run}'s claim was not released: {s:?}");
    }
}

/// A worker whose drive of a run failed (here the run's agent file cannot
/// be loaded on its machine) leaves the claim to expire while it runs, as a
/// back-off; stopped, it hands the claim back, and a worker that can load
/// the agent drives the run at once instead of one time to live later
/// (a minute here).
async fn a_stopping_worker_hands_back_what_failed(store: Arc<dyn EventStore>) {
    let fx = Fixture::new();
    let rt = runtime(store.clone());
    let run = RunId::new("failed-here").unwrap();
    rt.submit(
        &job_agent(&fx, "failed-here"),
        json!("go"),
        StartOptions::new().id(run.clone()),
    )
    .await
    .unwrap();
    let tried = Arc::new(AtomicBool::new(false));
    let worker = Worker::builder(rt)
        .owner("without-the-agent")
        .claim_ttl(Duration::from_secs(60))
        .poll(Duration::from_millis(20))
        .agent_loader(Arc::new({
            let tried = tried.clone();
            move |path: &Path| {
                tried.store(true, Ordering::SeqCst);
                Err(format!("{} is not on this machine", path.display()))
            }
        }))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    wait_for("the worker never tried the run", async || {
        tried.load(Ordering::SeqCst)
    })
    .await;
    // While it runs, the failed drive's claim stays (the back-off).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = store.summary(&run).await.unwrap();
    assert_eq!(
        held.claim.as_ref().map(|c| c.owner.as_str()),
        Some("without-the-agent"),
        "{held:?}"
    );
    stop.send(()).unwrap();
    let report = running.await.unwrap();
    assert_eq!((report.claimed, report.failed), (1, 1), "{report:?}");
    let left = store.summary(&run).await.unwrap();
    assert!(
        left.claim.is_none(),
        "the stopped worker kept its failed drive's claim: {left:?}"
    );

    // Another worker takes it at once (its claim lasts a minute too) and
    // completes it, making its write once.
    let other = Worker::builder(runtime(store.clone()))
        .owner("with-the-agent")
        .claim_ttl(Duration::from_secs(60))
        .poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        other
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    wait_for("the other worker never completed the run", async || {
        store
            .summary(&run)
            .await
            .is_ok_and(|s| s.status == "completed" && s.claim.is_none())
    })
    .await;
    stop.send(()).unwrap();
    let report = running.await.unwrap();
    assert_eq!((report.claimed, report.settled), (1, 1), "{report:?}");
    assert_eq!(effects(&fx), ["failed-here"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_hands_back_the_claim_of_a_failed_drive_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    a_stopping_worker_hands_back_what_failed(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_hands_back_the_claim_of_a_failed_drive_on_postgres() {
    let Some(pg) = PgSchema::new("handback").await else {
        return;
    };
    a_stopping_worker_hands_back_what_failed(Arc::new(pg.store().await)).await;
}

// ---- a stopping worker claims nothing more ------------------------------------

/// Hands out one run per claim, and fires the worker's shutdown at the
/// first claim that granted one (a SIGTERM arriving while it claims).
struct StopAtFirstClaim {
    stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

#[async_trait]
impl Hooks for StopAtFirstClaim {
    fn claim_limit(&self, _: usize) -> usize {
        1
    }

    fn after_claim(&self, claims: &[warden::store::Claim]) {
        if !claims.is_empty()
            && let Some(stop) = self.stop.lock().unwrap().take()
        {
            let _ = stop.send(());
        }
    }
}

/// A worker with room for four runs and four queued, told to stop while
/// its first claim is under way: it takes that one run, which it finishes
/// within its grace, and claims no other; the three are left queued for
/// another worker. A worker told to stop before it starts claims nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_told_to_stop_while_it_claims_takes_no_further_run() {
    let fx = Fixture::new();
    let store: Arc<dyn EventStore> =
        Arc::new(SqliteStore::open(fx.dir.path().join("runs.db")).unwrap());
    let rt = runtime(store.clone());
    for i in 0..4 {
        let job = format!("stop-{i}");
        rt.submit(
            &job_agent(&fx, &job),
            json!("go"),
            StartOptions::new().id(RunId::new(job).unwrap()),
        )
        .await
        .unwrap();
    }

    let already = Worker::builder(runtime(store.clone()))
        .owner("stopped-before-it-began")
        .concurrency(4)
        .build()
        .unwrap();
    let report = already.run(std::future::ready(())).await;
    assert_eq!(report.claimed, 0, "{report:?}");

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let hooked: Arc<dyn EventStore> = Arc::new(Intercepted {
        inner: store.clone(),
        hooks: StopAtFirstClaim {
            stop: std::sync::Mutex::new(Some(stop)),
        },
    });
    let worker = Worker::builder(runtime(hooked))
        .owner("stopping")
        .concurrency(4)
        .poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let report = worker
        .run(async {
            let _ = stopped.await;
        })
        .await;
    assert_eq!((report.claimed, report.settled), (1, 1), "{report:?}");
    let counts = status_counts(store.as_ref()).await;
    assert_eq!(
        (counts.get("completed"), counts.get("queued")),
        (Some(&1), Some(&3)),
        "{counts:?}"
    );
    assert_eq!(effects(&fx), ["stop-0"]);
}
