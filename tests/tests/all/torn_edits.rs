//! The real fs plugin's `edit_file` under SIGKILL: `warden run` (and then
//! `warden runs recover`) or `warden worker` drives one run that edits three
//! 3 MiB files, 45 edits in all, and is killed at random moments, on
//! SQLite and on PostgreSQL. After every kill each file must be whole (its
//! beginning intact, then edit lines, then the end marker); a write left
//! dangling is resolved as an operator would, by looking at the file. At the
//! end each file holds exactly the edits the log records as made, in order,
//! none twice.
//!
//! A plain truncate-and-write fails this test: a kill in the write leaves
//! the file cut short.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use warden::engine::RunId;
use warden::engine::events::{Event, ToolCallResult, decode};
use warden::store::{EventStore, SqliteStore};

use super::kill::warden;
use super::workers::PgSchema;

const FILES: usize = 3;
const TURNS: usize = 45;
/// Lines of filler before the edits: about 3 MiB per file, so that a write
/// takes long enough for kills to land in it.
const FILLER_LINES: usize = 60_000;
const END: &str = "<<END>>\n";
const RUN: &str = "edited";

/// The part of file `f` no edit touches.
fn prefix(f: usize) -> String {
    let mut text = format!("# file {f}\n");
    for i in 0..FILLER_LINES {
        text.push_str(&format!("filler line {i:06} of file {f}, never edited\n"));
    }
    text
}

fn file_of(turn: usize) -> usize {
    turn % FILES
}

fn transcript() -> String {
    let mut t = String::new();
    for turn in 1..=TURNS {
        let f = file_of(turn);
        t.push_str(&format!(
            "[[turns]]\ntext = \"Edit {turn}.\"\n[[turns.tool_calls]]\nname = \"files__edit_file\"\narguments = {{ path = \"file-{f}.txt\", old = \"<<END>>\", new = \"edit-{turn}\\n<<END>>\" }}\n\n"
        ));
    }
    t.push_str("[[turns]]\ntext = \"Edited.\"\n");
    t
}

/// A directory with the files and an agent whose only plugin is the
/// built-in fs plugin over `work/`, its edits needing no approval.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    for f in 0..FILES {
        std::fs::write(
            dir.path().join(format!("work/file-{f}.txt")),
            format!("{}{END}", prefix(f)),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("transcript.toml"), transcript()).unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        r#"
name = "editor"
instructions = "Edit the files."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.files]
source = "builtin:fs"
approval = { edit_file = "never" }
[plugins.files.grant.mounts.workspace]
dir = "work"
"#,
    )
    .unwrap();
    dir
}

/// The turns whose edits file `f` holds, in order; an error says how the
/// file is torn.
fn edits_in(dir: &Path, f: usize) -> Result<Vec<usize>, String> {
    let bytes = std::fs::read(dir.join(format!("work/file-{f}.txt"))).map_err(|e| e.to_string())?;
    let len = bytes.len();
    let text = String::from_utf8(bytes).map_err(|_| format!("{len} bytes, not utf-8"))?;
    let rest = text
        .strip_prefix(&prefix(f))
        .ok_or_else(|| format!("{len} bytes: its beginning is not intact"))?;
    let body = rest
        .strip_suffix(END)
        .ok_or_else(|| format!("{len} bytes: it does not end with the marker"))?;
    body.lines()
        .map(|line| {
            line.strip_prefix("edit-")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|turn| file_of(*turn) == f)
                .ok_or_else(|| format!("{len} bytes: a stray line {line:?}"))
        })
        .collect()
}

/// Asserts that every file is whole; returns the temporary files an
/// interrupted write left beside them.
fn assert_whole(dir: &Path, when: &str) -> usize {
    for f in 0..FILES {
        if let Err(torn) = edits_in(dir, f) {
            panic!("{when}: file-{f}.txt is torn: {torn}");
        }
    }
    std::fs::read_dir(dir.join("work"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".warden-tmp")
        })
        .count()
}

/// What the log says of the edits: the turns made per file (by the tool, or
/// resolved by hand as applied), and the turn of a write without outcome.
#[derive(Debug, Default)]
struct Recorded {
    made: BTreeMap<usize, Vec<usize>>,
    dangling: Option<usize>,
}

async fn recorded(store: &dyn EventStore, run: &RunId) -> Recorded {
    let mut intents: BTreeMap<String, usize> = BTreeMap::new();
    let mut settled: BTreeMap<String, bool> = BTreeMap::new();
    for stored in store.load(run).await.unwrap() {
        match decode(&stored.bytes).unwrap() {
            Event::ToolCallIntent(i) if i.tool.tool == "edit_file" => {
                let new = i.arguments["new"].as_str().unwrap();
                let turn = new
                    .strip_prefix("edit-")
                    .and_then(|s| s.split('\n').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap();
                intents.insert(i.call_id.to_string(), turn);
            }
            Event::ToolCallCompleted(c) => {
                let made = matches!(c.result, ToolCallResult::Output(_));
                settled.insert(c.call_id.to_string(), made);
            }
            Event::ToolCallResolved(r) => {
                let made = r.output["applied"] == Value::Bool(true);
                settled.insert(r.call_id.to_string(), made);
            }
            _ => {}
        }
    }
    let mut out = Recorded::default();
    for (call, turn) in intents {
        match settled.get(&call) {
            Some(true) => out.made.entry(file_of(turn)).or_default().push(turn),
            Some(false) => {}
            None => out.dangling = Some(turn),
        }
    }
    for turns in out.made.values_mut() {
        turns.sort();
    }
    out
}

/// The store under test, and how the binary names it.
enum Store {
    Sqlite(PathBuf),
    Postgres(PgSchema),
}

impl Store {
    fn location(&self) -> String {
        match self {
            Store::Sqlite(path) => path.display().to_string(),
            Store::Postgres(pg) => pg.url.clone(),
        }
    }

    async fn open(&self) -> Option<Arc<dyn EventStore>> {
        match self {
            Store::Sqlite(path) if !path.exists() => None,
            Store::Sqlite(path) => Some(Arc::new(SqliteStore::open(path).unwrap())),
            Store::Postgres(pg) => Some(Arc::new(pg.store().await)),
        }
    }

    /// The run's listed status, if the run exists.
    async fn status(&self, run: &RunId) -> Option<String> {
        let store = self.open().await?;
        store.summary(run).await.ok().map(|s| s.status)
    }

    fn command(&self, args: &[&str], dir: &Path) -> std::process::Command {
        let mut cmd = warden(args, dir);
        cmd.env("WARDEN_STORE", self.location());
        cmd
    }
}

/// The operator's part: a write without outcome (its driver is dead) is
/// resolved by looking at its file. Returns whether one was.
async fn settle(store: &Store, dir: &Path, run: &RunId) -> bool {
    if store.status(run).await.as_deref() != Some("needs_reconciliation") {
        return false;
    }
    let handle = store.open().await.unwrap();
    let Some(turn) = recorded(&*handle, run).await.dangling else {
        return false;
    };
    let applied = edits_in(dir, file_of(turn)).unwrap().contains(&turn);
    let out = store
        .command(
            &[
                "runs",
                "resolve",
                RUN,
                "--output",
                &format!("{{\"applied\": {applied}}}"),
                "--note",
                "looked at the file",
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
    true
}

/// Waits until no live claim covers `run`. A killed worker's claim outlives
/// it: resolving is refused while a claim covers the run (it could be a
/// paused worker, still writing), and a successor cannot claim it either,
/// so the operator and the next worker both wait for it to run out.
async fn wait_for_the_claim_to_run_out(store: &Store, run: &RunId) {
    let Some(handle) = store.open().await else {
        return;
    };
    let mut polls = 0;
    while handle
        .summary(run)
        .await
        .is_ok_and(|s| s.claim.is_some_and(|l| !l.is_expired(now_ms())))
    {
        polls += 1;
        assert!(polls < 1_000, "the dead worker's claim never ran out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    /// `warden run`, then `warden runs recover`.
    Run,
    /// `warden worker` processes, one at a time, on a submitted run.
    Worker,
}

/// The claim a worker takes: how long it outlives a killed worker.
const WORKER_TTL_MS: u64 = 1_000;

fn spawn(store: &Store, dir: &Path, driver: Driver, exists: bool) -> Child {
    let ttl = format!("{WORKER_TTL_MS}ms");
    let args: Vec<&str> = match (driver, exists) {
        (Driver::Run, false) => vec!["run", "agent.toml", "go", "--run-id", RUN],
        (Driver::Run, true) => vec!["runs", "recover", RUN],
        (Driver::Worker, _) => vec!["worker", "--claim-ttl", &ttl, "--poll", "20ms"],
    };
    store
        .command(&args, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn edits_survive_kills(store: Store, driver: Driver, kills: usize, seed: u64) {
    let work = workspace();
    let dir = work.path();
    let run = RunId::new(RUN).unwrap();
    if driver == Driver::Worker {
        let out = store
            .command(&["submit", "agent.toml", "go", "--run-id", RUN], dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut rng = XorShift(seed);
    let (mut killed, mut resolved, mut debris) = (0, 0, 0);
    // A process killed before it got anywhere waits longer next time, so
    // the kills land inside the run on a slow machine too.
    let mut floor_ms = 50;
    let mut events_before = 0;
    while killed < kills {
        let exists = store.status(&run).await.is_some();
        let mut child = spawn(&store, dir, driver, exists);
        std::thread::sleep(Duration::from_millis(floor_ms + rng.next() % 200));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        killed += 1;
        wait_for_the_claim_to_run_out(&store, &run).await;
        debris = assert_whole(dir, &format!("after kill {killed}"));
        if settle(&store, dir, &run).await {
            resolved += 1;
        }
        match store.status(&run).await.as_deref() {
            Some("completed") => break,
            None => floor_ms += 50,
            Some(_) => {
                let events = store.open().await.unwrap().load(&run).await.unwrap().len();
                if events == events_before {
                    floor_ms += 50;
                }
                events_before = events;
            }
        }
    }
    // Then to the end, uninterrupted.
    loop {
        let status = store.status(&run).await;
        match status.as_deref() {
            Some("completed") => break,
            Some("needs_reconciliation") if settle(&store, dir, &run).await => resolved += 1,
            _ => {
                let mut child = spawn(&store, dir, driver, status.is_some());
                match driver {
                    Driver::Run => {
                        child.wait().unwrap();
                    }
                    Driver::Worker => {
                        // Until it parks or completes the run, then stop it.
                        let mut polls = 0;
                        while !matches!(
                            store.status(&run).await.as_deref(),
                            Some("completed" | "needs_reconciliation")
                        ) || store
                            .open()
                            .await
                            .unwrap()
                            .summary(&run)
                            .await
                            .unwrap()
                            .claim
                            .is_some_and(|l| !l.is_expired(now_ms()))
                        {
                            polls += 1;
                            assert!(polls < 3_000, "the worker never finished the run");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
            }
        }
    }
    assert_whole(dir, "at the end");
    let handle = store.open().await.unwrap();
    let log = recorded(&*handle, &run).await;
    assert_eq!(log.dangling, None);
    for f in 0..FILES {
        let held = edits_in(dir, f).unwrap();
        let made = log.made.get(&f).cloned().unwrap_or_default();
        assert_eq!(
            held, made,
            "file-{f}.txt holds these edits, the log records those as made"
        );
    }
    assert!(handle.verify(&run).await.unwrap().is_intact());
    eprintln!(
        "torn edits ({driver:?}, {}): {killed} kills, {resolved} writes resolved by hand, \
         {debris} temporary files left by interrupted writes",
        match store {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    );
    assert!(
        killed >= 3,
        "only {killed} kills: the run finished too soon"
    );
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_survive_sigkill_of_warden_run_on_sqlite() {
    let db = tempfile::tempdir().unwrap();
    let store = Store::Sqlite(db.path().join("runs.db"));
    edits_survive_kills(store, Driver::Run, 12, 0x9e37_79b9_7f4a_7c15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_survive_sigkill_of_warden_run_on_postgres() {
    let Some(pg) = PgSchema::new("torn_run").await else {
        return;
    };
    edits_survive_kills(Store::Postgres(pg), Driver::Run, 12, 0x2545_f491_4f6c_dd1d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_survive_sigkill_of_warden_worker_on_sqlite() {
    let db = tempfile::tempdir().unwrap();
    let store = Store::Sqlite(db.path().join("runs.db"));
    edits_survive_kills(store, Driver::Worker, 8, 0xdead_beef_cafe_f00d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_survive_sigkill_of_warden_worker_on_postgres() {
    let Some(pg) = PgSchema::new("torn_worker").await else {
        return;
    };
    edits_survive_kills(
        Store::Postgres(pg),
        Driver::Worker,
        8,
        0x0123_4567_89ab_cdef,
    )
    .await;
}
