//! Event store benchmarks: durable SQLite appends (sequential, concurrent with
//! group commit, batched) with a real fsync on a file, and load + chain
//! verification of a 10,000-event run. Prints figures; run with
//! `cargo bench -p warden --bench store`. Set `WARDEN_BENCH_DIR` to put the
//! database on another filesystem (default: the system temp dir; a tmpfs
//! there would make fsync free and the figures meaningless).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use warden_store::{EventStore, ListingStatus, MemoryStore, RunId, RunMeta, SqliteStore};

/// A realistic event: about 300 bytes of JSON, like a tool completion.
fn event(run: usize, seq: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"v":1,"kind":"tool_call_completed","call_id":"call-{run:05}-{seq:06}","tool":"fs.read_file","output":{{"text":"{}"}},"usage":{{"fuel":123456,"memory_bytes":1048576,"duration_ms":12}},"at_ms":{}}}"#,
        "x".repeat(160),
        1_700_000_000_000u64 + seq
    ))
}

fn run_id(i: usize) -> RunId {
    RunId::new(format!("bench-{i:05}")).unwrap()
}

fn meta() -> RunMeta {
    RunMeta {
        agent: "bench".into(),
        labels: [("suite".to_owned(), "bench".to_owned())].into(),
        session: None,
        session_runs: None,
        history: Vec::new(),
        history_head: None,
        created_ms: 1_700_000_000_000,
    }
}

fn per_sec(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// The floor under one durable commit: write 4 KiB and fdatasync, in a loop.
fn raw_fsync(dir: &std::path::Path) -> Duration {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = [0u8; 4096];
    let rounds = 200;
    let start = Instant::now();
    for _ in 0..rounds {
        file.write_all(&block).unwrap();
        file.sync_data().unwrap();
    }
    let each = start.elapsed() / rounds;
    std::fs::remove_file(path).unwrap();
    each
}

async fn sequential(store: &SqliteStore) {
    let run = run_id(0);
    store
        .create(&run, meta(), event(0, 1), ListingStatus::RUNNING)
        .await
        .unwrap();
    let n = 1_000u64;
    let start = Instant::now();
    for seq in 1..=n {
        store
            .append(
                &run,
                seq,
                &[event(0, seq + 1)],
                ListingStatus::RUNNING.into(),
                seq as i64,
            )
            .await
            .unwrap();
    }
    let elapsed = start.elapsed();
    println!(
        "(a) one event per transaction, sequential: {n} appends in {elapsed:.2?}: {:.0} events/s, {:.0} µs per append",
        per_sec(n, elapsed),
        elapsed.as_micros() as f64 / n as f64
    );
}

async fn group_commit(store: Arc<SqliteStore>, runs: usize, steps: u64) {
    for i in 0..runs {
        store
            .create(
                &run_id(10_000 + i),
                meta(),
                event(i, 1),
                ListingStatus::RUNNING,
            )
            .await
            .unwrap();
    }
    let before = store.stats();
    let start = Instant::now();
    let tasks: Vec<_> = (0..runs)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let run = run_id(10_000 + i);
                for step in 1..=steps {
                    store
                        .append(
                            &run,
                            step,
                            &[event(i, step + 1)],
                            ListingStatus::RUNNING.into(),
                            step as i64,
                        )
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed();
    let after = store.stats();
    let events = after.events - before.events;
    let transactions = after.transactions - before.transactions;
    println!(
        "(b) one event per call, {runs} concurrent runs x {steps} steps: {events} events in {elapsed:.2?}: {:.0} events/s, {transactions} transactions ({:.0} appends per fsync)",
        per_sec(events, elapsed),
        events as f64 / transactions as f64
    );
}

async fn batched(store: &SqliteStore, batch: usize, total: usize) {
    let run = run_id(50_000 + batch);
    store
        .create(&run, meta(), event(0, 1), ListingStatus::RUNNING)
        .await
        .unwrap();
    let mut len = 1u64;
    let start = Instant::now();
    for _ in 0..total / batch {
        let events: Vec<Bytes> = (0..batch as u64)
            .map(|i| event(batch, len + 1 + i))
            .collect();
        let appended = store
            .append(
                &run,
                len,
                &events,
                ListingStatus::RUNNING.into(),
                len as i64,
            )
            .await
            .unwrap();
        len = appended.event_count;
    }
    let elapsed = start.elapsed();
    let events = (total / batch * batch) as u64;
    println!(
        "(c) batches of {batch:>4} events, sequential: {events} events in {elapsed:.2?}: {:.0} events/s",
        per_sec(events, elapsed)
    );
}

async fn load_10k(store: &dyn EventStore, label: &str) {
    let run = run_id(90_000);
    store
        .create(&run, meta(), event(0, 1), ListingStatus::RUNNING)
        .await
        .unwrap();
    let mut len = 1u64;
    while len < 10_000 {
        let n = (10_000 - len).min(1_000);
        let events: Vec<Bytes> = (0..n).map(|i| event(0, len + 1 + i)).collect();
        len = store
            .append(&run, len, &events, ListingStatus::RUNNING.into(), 0)
            .await
            .unwrap()
            .event_count;
    }
    let bytes: usize = store
        .load(&run)
        .await
        .unwrap()
        .iter()
        .map(|e| e.bytes.len())
        .sum();
    let mut loads = Vec::new();
    let mut verifies = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let log = store.load(&run).await.unwrap();
        loads.push(start.elapsed());
        assert_eq!(log.len(), 10_000);
        let start = Instant::now();
        assert!(store.verify(&run).await.unwrap().is_intact());
        verifies.push(start.elapsed());
    }
    println!(
        "(d) {label}: load + chain check of 10,000 events ({:.1} MB): median {:.2?}, best {:.2?}; full verify median {:.2?}",
        bytes as f64 / 1e6,
        median(loads.clone()),
        loads.iter().min().unwrap(),
        median(verifies)
    );
}

fn chain_only() {
    use sha2::{Digest, Sha256};
    let events: Vec<Bytes> = (0..10_000).map(|i| event(0, i)).collect();
    let start = Instant::now();
    let mut prev = [0u8; 32];
    for (seq, bytes) in events.iter().enumerate() {
        let mut h = Sha256::new();
        h.update(prev);
        h.update((seq as u64).to_be_bytes());
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
        prev = h.finalize().into();
    }
    std::hint::black_box(prev);
    println!(
        "    of which SHA-256 over the 10,000 events alone: {:.2?}",
        start.elapsed()
    );
}

fn main() {
    run();
}

/// Measures and prints (`warden-tests`' `all` bench runs it too).
pub(crate) fn run() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let base = std::env::var_os("WARDEN_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).unwrap();
    println!(
        "event store bench: SQLite WAL, synchronous=FULL, in {}",
        dir.path().display()
    );
    println!(
        "    raw write(4 KiB) + fdatasync on this filesystem: {:.0?} each",
        raw_fsync(dir.path())
    );

    runtime.block_on(async {
        let store = Arc::new(SqliteStore::open(dir.path().join("bench.db")).unwrap());
        sequential(&store).await;
        group_commit(Arc::clone(&store), 1_000, 10).await;
        for batch in [10, 100, 1_000] {
            batched(&store, batch, 50_000).await;
        }
        load_10k(&*store, "sqlite").await;
        chain_only();
        load_10k(&MemoryStore::new(), "memory").await;
        let stats = store.stats();
        println!(
            "    writer totals: {} transactions, {} requests, {} events, {} failed commits",
            stats.transactions, stats.requests, stats.events, stats.failed_commits
        );
    });
}
