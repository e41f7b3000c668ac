//! The run list a page at a time, as the console and `GET /api/v1/runs`
//! ask for it, on both persistent stores: the first page, newest first,
//! timed with 1,000 runs (the baseline, in the same run) and again with
//! 100,000, then the other pages and filters the console offers, and the
//! whole unpaged list for comparison. A page read from the listing index
//! costs what the page holds, so the two first-page figures should be
//! close. Prints figures; run with
//! `cargo bench -p warden-store --bench listing` (PostgreSQL at
//! `WARDEN_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/test`,
//! in a schema of its own dropped at the end; `WARDEN_BENCH_RUNS` sets the
//! large count, default 100,000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use warden_store::{
    EventStore, ListingStatus, PostgresStore, RunFilter, RunId, RunMeta, RunPosition, SqliteStore,
};

/// The small store's size: the baseline's.
const BASELINE_RUNS: usize = 1_000;
/// Runs on a page.
const PAGE: usize = 50;
/// Creates in flight at once while seeding (group commits).
const IN_FLIGHT: usize = 64;

fn run_id(i: usize) -> RunId {
    RunId::new(format!("run-{i:08x}")).unwrap()
}

/// The `i`th run: one of five agents and four teams, created a second
/// after the one before, mostly completed, some failed, some parked.
fn seed_one(i: usize) -> (RunId, RunMeta, ListingStatus) {
    let meta = RunMeta {
        agent: format!("agent-{}", i % 5),
        labels: [("team".to_owned(), format!("team-{}", i % 4))].into(),
        session: None,
        session_runs: None,
        history: Vec::new(),
        history_head: None,
        created_ms: 1_700_000_000_000 + i as i64 * 1_000,
    };
    let status = match i % 20 {
        0 => ListingStatus::FAILED,
        1 => ListingStatus::parked("awaiting_approval"),
        2 => ListingStatus::WAITING,
        _ => ListingStatus::COMPLETED,
    };
    (run_id(i), meta, status)
}

/// Creates runs `from..to`, `IN_FLIGHT` at a time.
async fn seed(store: &Arc<dyn EventStore>, from: usize, to: usize) -> Duration {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in from..to {
        if tasks.len() >= IN_FLIGHT {
            tasks.join_next().await.unwrap().unwrap();
        }
        let store = Arc::clone(store);
        tasks.spawn(async move {
            let (run, meta, status) = seed_one(i);
            let event = Bytes::from(format!(
                r#"{{"v":1,"event":{{"type":"run_started","n":{i}}}}}"#
            ));
            store.create(&run, meta, event, status).await.unwrap();
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    start.elapsed()
}

/// The median and best of `rounds` listings with `filter`, and how many
/// runs the listing returned.
async fn time(
    store: &dyn EventStore,
    filter: &RunFilter,
    rounds: usize,
) -> (Duration, Duration, usize) {
    let mut samples = Vec::with_capacity(rounds);
    let mut found = 0;
    for _ in 0..rounds {
        let start = Instant::now();
        found = store.list(filter).await.unwrap().len();
        samples.push(start.elapsed());
    }
    samples.sort();
    (samples[samples.len() / 2], samples[0], found)
}

fn first_page() -> RunFilter {
    RunFilter::new().newest_first().limit(PAGE)
}

async fn measure(name: &str, store: Arc<dyn EventStore>, large: usize) {
    println!("{name}:");
    let seeded = seed(&store, 0, BASELINE_RUNS).await;
    println!("    seeded {BASELINE_RUNS} runs in {seeded:.2?}");
    let (baseline, best, n) = time(&*store, &first_page(), 200).await;
    assert_eq!(n, PAGE);
    println!(
        "    first page ({PAGE} newest) of {BASELINE_RUNS} runs: median {baseline:.2?}, best {best:.2?}  (the baseline)"
    );
    let seeded = seed(&store, BASELINE_RUNS, large).await;
    println!(
        "    seeded {} more runs in {seeded:.2?} ({:.0} runs/s)",
        large - BASELINE_RUNS,
        (large - BASELINE_RUNS) as f64 / seeded.as_secs_f64()
    );
    let (page, best, n) = time(&*store, &first_page(), 200).await;
    assert_eq!(n, PAGE);
    println!(
        "    first page ({PAGE} newest) of {large} runs: median {page:.2?}, best {best:.2?}  ({:.2}x the baseline)",
        page.as_secs_f64() / baseline.as_secs_f64()
    );
    let middle = seed_one(large / 2);
    let deep = first_page().after(RunPosition {
        created_ms: middle.1.created_ms,
        run_id: middle.0,
    });
    let cases: [(&str, RunFilter); 6] = [
        ("a page from the middle (cursor)", deep),
        (
            "first page, one label",
            first_page().label("team", "team-2"),
        ),
        ("first page, one agent", first_page().agent("agent-3")),
        (
            "first page, parked statuses",
            first_page().status("awaiting_approval").status("waiting"),
        ),
        (
            "first page, id prefix (one run)",
            first_page().id_prefix(format!("run-{:08x}", large / 3)),
        ),
        (
            "first page, last hour",
            first_page().created_since(1_700_000_000_000 + (large as i64 - 3_600) * 1_000),
        ),
    ];
    for (what, filter) in cases {
        let (median, best, n) = time(&*store, &filter, 100).await;
        println!("    {what}: median {median:.2?}, best {best:.2?} ({n} runs)");
    }
    let (all, best, n) = time(&*store, &RunFilter::new(), 3).await;
    assert_eq!(n, large);
    println!(
        "    for comparison, every run unpaged (the old console): median {all:.2?}, best {best:.2?} ({n} runs)"
    );
}

fn main() {
    let large = std::env::var("WARDEN_BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000usize)
        .max(BASELINE_RUNS * 2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let sqlite = SqliteStore::open(dir.path().join("listing.db")).unwrap();
        measure("SQLite (WAL, synchronous=FULL)", Arc::new(sqlite), large).await;

        let base = std::env::var("WARDEN_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let schema = format!("warden_bench_listing_{}", std::process::id());
        let store = PostgresStore::builder(&base)
            .schema(&schema)
            .open()
            .await
            .unwrap_or_else(|e| {
                panic!("no PostgreSQL at {base} ({e}): start it as .ci/run's \"PostgreSQL\" step does, or point WARDEN_TEST_POSTGRES at one")
            });
        measure("PostgreSQL", Arc::new(store), large).await;
        let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}
