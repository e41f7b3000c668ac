//! A real kill: the `warden` binary drives a run on the SQLite store and is
//! killed with SIGKILL at pseudo-random moments, a few dozen times; each
//! time the run is recovered by a new process. No event the dead process
//! had acknowledged may be missing, the database must pass SQLite's
//! integrity check, and no write may run twice.
//!
//! The binary is `target/<profile>/warden`, built by the workspace's
//! `cargo test` (the host crate's own tests need it).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use warden::engine::RunId;
use warden::store::{EventStore, SqliteStore};

use super::engine::Fixture;
use crate::binary::warden_binary;

/// How many turns the scripted agent takes; each reads a file and appends
/// one line naming its turn (a write). Enough that the run outlives a few
/// dozen kills (a debug build records about one event per millisecond).
const TURNS: usize = 120;

fn transcript() -> String {
    let mut t = String::new();
    for turn in 1..=TURNS {
        t.push_str(&format!(
            "[[turns]]\ntext = \"Turn {turn}.\"\n[[turns.tool_calls]]\nname = \"files__read_file\"\narguments = {{ path = \"input.txt\" }}\n[[turns.tool_calls]]\nname = \"hostile__fs\"\narguments = {{ op = \"append\", path = \"/workspace/effects.log\", content = \"turn-{turn}\\n\" }}\n\n"
        ));
    }
    t.push_str("[[turns]]\ntext = \"Finished.\"\n");
    t
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

/// The `warden` binary running `args` in `dir`, with the tests' component
/// cache and no `RUST_LOG`.
pub(crate) fn warden(args: &[&str], dir: &Path) -> Command {
    let mut cmd = Command::new(warden_binary());
    cmd.args(args)
        .current_dir(dir)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-tests-components"),
        )
        .env_remove("RUST_LOG");
    cmd
}

/// Runs `args` and kills the process after `delay`; returns the sequence
/// numbers it printed (each printed only after the store acknowledged it).
fn run_and_kill(args: &[&str], dir: &Path, delay: Duration) -> Vec<u64> {
    let mut child = warden(args, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut seqs = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(seq) = v["seq"].as_u64()
            {
                seqs.push(seq);
            }
        }
        seqs
    });
    std::thread::sleep(delay);
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap()
}

async fn status(db: &Path, run: &RunId) -> Option<(String, u64)> {
    let store = SqliteStore::open(db).unwrap();
    match store.summary(run).await {
        Ok(s) => {
            // Every load checks the chain end to end.
            let events = store.load(run).await.unwrap();
            assert_eq!(events.len() as u64, s.event_count);
            Some((s.status, s.event_count))
        }
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_binary_at_random_moments_loses_nothing_and_repeats_no_write() {
    let fx = Fixture::new();
    let agent = fx.agent(&transcript(), "");
    drop(agent);
    let dir = fx.dir.path();
    let db = dir.join("runs.db");
    let run = RunId::new("killed").unwrap();
    let (start, recover) = (
        [
            "run",
            "agent.toml",
            "go",
            "--run-id",
            "killed",
            "--json",
            "--store",
            "runs.db",
        ],
        ["runs", "recover", "killed", "--json", "--store", "runs.db"],
    );
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut kills = 0;
    let mut resolved = 0;
    // On a loaded machine the binary may not get as far as recording the
    // start within the random delays: each start killed before that waits
    // longer next time, so the kills still land inside the run.
    let mut start_floor_ms = 0;
    for _ in 0..60 {
        let exists = status(&db, &run).await.is_some();
        let args: &[&str] = if exists { &recover } else { &start };
        let floor = if exists { 0 } else { start_floor_ms };
        let delay = Duration::from_millis(floor + 3 + rng.next() % 50);
        let acknowledged = run_and_kill(args, dir, delay);
        kills += 1;
        let Some((state, count)) = status(&db, &run).await else {
            assert!(
                acknowledged.is_empty(),
                "acknowledged events of a run that does not exist"
            );
            start_floor_ms += 25;
            continue;
        };
        if let Some(last) = acknowledged.iter().max() {
            assert!(
                *last <= count,
                "event {last} was acknowledged but the store holds {count}"
            );
        }
        match state.as_str() {
            "completed" => break,
            "needs_reconciliation" => {
                // The operator checks the side-effect log and records what
                // happened, as `warden runs resolve` asks.
                let done =
                    std::fs::read_to_string(dir.join("work/effects.log")).unwrap_or_default();
                let out = warden(
                    &[
                        "runs",
                        "resolve",
                        "killed",
                        "--output",
                        &format!(
                            "{{\"appended\": {}, \"lines_seen\": {}}}",
                            0,
                            done.lines().count()
                        ),
                        "--note",
                        "checked effects.log",
                        "--store",
                        "runs.db",
                    ],
                    dir,
                )
                .output()
                .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                resolved += 1;
            }
            _ => {}
        }
    }
    // Finish without interruption.
    loop {
        let Some((state, _)) = status(&db, &run).await else {
            // Every start was killed before it was recorded: start it now.
            let out = warden(&start, dir).output().unwrap();
            assert!(
                matches!(out.status.code(), Some(0) | Some(5)),
                "exit {:?}: {}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            continue;
        };
        match state.as_str() {
            "completed" => break,
            "needs_reconciliation" => {
                let out = warden(
                    &[
                        "runs", "resolve", "killed", "--output", "{}", "--store", "runs.db",
                    ],
                    dir,
                )
                .output()
                .unwrap();
                assert!(out.status.success());
                resolved += 1;
            }
            _ => {
                let out = warden(&recover, dir).output().unwrap();
                assert!(
                    matches!(out.status.code(), Some(0) | Some(5)),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }

    // No write ran twice: each turn's line appears at most once.
    let effects = std::fs::read_to_string(dir.join("work/effects.log")).unwrap_or_default();
    for turn in 1..=TURNS {
        let n = effects
            .lines()
            .filter(|l| *l == format!("turn-{turn}"))
            .count();
        assert!(n <= 1, "turn {turn}'s write ran {n} times");
    }
    // Writes not resolved by hand all ran exactly once.
    assert!(
        effects.lines().count() + resolved >= TURNS,
        "{} writes ran and {resolved} were resolved by hand, of {TURNS}",
        effects.lines().count()
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let store = SqliteStore::open(&db).unwrap();
    assert!(store.verify(&run).await.unwrap().is_intact());
    eprintln!(
        "kill test: {kills} kills, {resolved} writes resolved by hand, {} writes ran",
        effects.lines().count()
    );
    assert!(
        kills >= 20,
        "only {kills} kills: the run finished too soon to test much"
    );
}
