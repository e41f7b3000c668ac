//! End-to-end tests of how the `warden` binary opens, backs up, restores
//! and checks its store: the real executable on real SQLite files (on real
//! tmpfs mounts where a full disk or a read-only mount is needed; mounting
//! needs root, and a failed mount fails the test).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn warden(args: &[&str], cwd: &Path) -> Output {
    warden_env(args, cwd, &[])
}

fn warden_env(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden"));
    cmd.args(args)
        .current_dir(cwd)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_STORE")
        .env_remove("WARDEN_CONFIG")
        .env_remove("WARDEN_CHAIN_KEY")
        .env_remove("WARDEN_WITNESS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_out(o: &Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}

/// A copy of the notes demo agent in a fresh directory.
fn demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    for file in ["notes.toml", "notes.transcript.toml"] {
        std::fs::copy(examples.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("notes")).unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    for entry in std::fs::read_dir(examples.join("notes")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dir.path().join("notes").join(entry.file_name()),
        )
        .unwrap();
    }
    dir
}

/// In the demo, with `store` (a `--store` value): run `done` completed,
/// run `parked` awaiting approval.
fn two_runs(dir: &Path, store: &str) {
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            "done",
            "--store",
            store,
        ],
        dir,
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(
        &["runs", "approve", "done", "call-3-1", "--store", store],
        dir,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_file(dir.join("notes/SUMMARY.md")).unwrap();
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            "parked",
            "--store",
            store,
        ],
        dir,
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}

/// A tmpfs mounted on a fresh directory for the test's lifetime. The tests
/// run as root here; a machine where mounting fails fails the test.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a tmpfs failed (these tests need root): {}",
            stderr(&out)
        );
        Tmpfs(at.to_owned())
    }

    fn remount_read_only(&self) {
        let out = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// Fills the mount until writing fails with "no space left".
    fn fill(&self) {
        use std::io::Write as _;
        let mut filler = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        let error = loop {
            if let Err(e) = filler.write_all(&block).and_then(|()| filler.sync_all()) {
                break e;
            }
        };
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The store's bytes, and whether its write-ahead log holds any, to show
/// that nothing was written (a reader may leave an empty `-wal` and a
/// `-shm` index behind: they hold no data).
fn snapshot(store: &Path) -> (Vec<u8>, bool) {
    let wal = std::fs::metadata(format!("{}-wal", store.display())).map_or(0, |m| m.len());
    (std::fs::read(store).unwrap(), wal > 0)
}

/// The read-only commands, each expected to succeed on `store`.
fn read_only_commands_succeed(dir: &Path, store: &str, backup: &str) {
    let runs = json_out(&warden(&["runs", "list", "--json", "--store", store], dir));
    assert_eq!(runs.as_array().unwrap().len(), 2, "{runs}");
    for args in [
        vec!["runs", "verify"],
        vec!["runs", "show", "done"],
        vec!["runs", "events", "parked"],
        vec!["store", "backup", backup],
    ] {
        let mut args = args.clone();
        args.extend(["--store", store]);
        let out = warden(&args, dir);
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    let out = warden(&["runs", "verify", "--store", backup], dir);
    assert!(stdout(&out).contains("parked: intact"), "{}", stdout(&out));
}

#[test]
fn read_only_commands_work_on_a_full_disk_a_read_only_mount_and_under_a_held_write_lock() {
    let dir = demo();
    let mnt = Tmpfs::mount(&dir.path().join("mnt"), "2m");
    let store = "mnt/warden.db";
    two_runs(dir.path(), store);

    // A full disk: every read-only command works, and writes nothing.
    mnt.fill();
    let before = snapshot(&dir.path().join(store));
    assert!(
        !before.1,
        "every commit is in the file once its writers exited"
    );
    read_only_commands_succeed(dir.path(), store, "full.db");
    assert!(
        snapshot(&dir.path().join(store)) == before,
        "a read-only command wrote"
    );

    // A read-only mount.
    mnt.remount_read_only();
    read_only_commands_succeed(dir.path(), store, "ro.db");

    // Another process holds the write lock (its transaction stays open
    // while the commands run): they neither wait for it nor fail.
    let path = dir.path().join("local.db");
    std::fs::copy(dir.path().join("full.db"), &path).unwrap();
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder
        .execute_batch("BEGIN IMMEDIATE; UPDATE runs SET agent = agent;")
        .unwrap();
    read_only_commands_succeed(dir.path(), "local.db", "locked.db");
    holder.execute_batch("ROLLBACK").unwrap();
}

/// Asserts that `args` fails with exit 2 and `code`, its message naming
/// `looked_at`, and returns the message.
fn refused(dir: &Path, args: &[&str], code: &str, looked_at: &str) -> String {
    let out = warden(args, dir);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(looked_at),
        "{args:?}: `{looked_at}` not in: {err}"
    );
    let mut json = args.to_vec();
    json.push("--json");
    let out = warden(&json, dir);
    assert_eq!(out.status.code(), Some(2), "{json:?}");
    let envelope = json_out(&out);
    assert_eq!(envelope["error"]["code"], code, "{envelope}");
    err
}

#[test]
fn a_missing_or_empty_store_is_refused_naming_the_path_and_nothing_is_created() {
    let dir = demo();
    let default = dir.path().join(".warden/warden.db");
    let default = default.to_str().unwrap();
    // No store yet: commands that do not start runs refuse, naming the
    // file they looked for, and create nothing.
    for args in [
        &["runs", "list"][..],
        &["runs", "verify"],
        &["runs", "show", "r1"],
        &["runs", "events", "r1"],
        &["runs", "approve", "r1", "call-1"],
        &["runs", "abandon", "r1", "--reason", "x"],
        &["sessions", "show", "s1"],
        &["store", "backup", "b.db"],
        &["worker"],
    ] {
        let err = refused(dir.path(), args, "store_missing", default);
        assert!(err.contains("no such file"), "{err}");
        assert!(
            !dir.path().join(".warden").exists(),
            "{args:?} created the store"
        );
    }
    // A mistyped --store: named, not created; verify does not exit 0.
    let err = refused(
        dir.path(),
        &["runs", "verify", "--store", "typo.db"],
        "store_missing",
        "typo.db",
    );
    assert!(err.contains("no such file"), "{err}");
    assert!(!dir.path().join("typo.db").exists());
    // A 0-byte file is never taken for a new store, not even by `run`.
    std::fs::write(dir.path().join("empty.db"), b"").unwrap();
    for args in [
        &["runs", "verify", "--store", "empty.db"][..],
        &["runs", "list", "--store", "empty.db"],
        &["run", "notes.toml", "go", "--store", "empty.db"],
    ] {
        let err = refused(dir.path(), args, "store_missing", "empty.db");
        assert!(err.contains("the file is empty (0 bytes)"), "{err}");
    }
    assert_eq!(
        std::fs::metadata(dir.path().join("empty.db"))
            .unwrap()
            .len(),
        0
    );
    // Another application's SQLite file is not a Warden store either.
    rusqlite::Connection::open(dir.path().join("other.db"))
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let err = refused(
        dir.path(),
        &["runs", "list", "--store", "other.db"],
        "store_missing",
        "other.db",
    );
    assert!(err.contains("without Warden's tables"), "{err}");

    // A command that starts a run creates the store.
    let out = warden(&["run", "notes.toml", "go", "--run-id", "r1"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(Path::new(default).is_file());
}

#[test]
fn the_store_is_found_where_the_settings_say_and_errors_name_it() {
    let dir = demo();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "r1"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let store = dir.path().join(".warden/warden.db");
    let store = store.to_str().unwrap();

    // "run X does not exist" says which store was checked.
    let err = refused(
        dir.path(),
        &["runs", "show", "nosuch"],
        "unknown_run",
        &format!("run nosuch does not exist in the store sqlite:{store}"),
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    refused(
        dir.path(),
        &["runs", "approve", "nosuch", "call-1"],
        "unknown_run",
        &format!("unknown run `nosuch` in the store sqlite:{store}"),
    );

    // From a subdirectory, the default store is the subdirectory's: none
    // is there, none is created, and the error points at the parent's.
    let sub = dir.path().join("notes");
    let err = refused(
        &sub,
        &["runs", "list"],
        "store_missing",
        "notes/.warden/warden.db",
    );
    assert!(
        err.contains(&format!("a parent directory holds `{store}`")),
        "{err}"
    );
    assert!(!sub.join(".warden").exists());
    // Named explicitly, it is found from anywhere.
    let out = warden(&["runs", "list", "--json", "--store", store], &sub);
    assert_eq!(json_out(&out)[0]["run_id"], "r1");
}

#[test]
fn a_restore_marks_unfinished_runs_so_a_write_made_after_the_backup_is_not_made_again() {
    let dir = demo();
    two_runs(dir.path(), ".warden/warden.db");
    let out = warden(&["store", "backup", "backup.db"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    // After the backup, the parked run's write is approved and made.
    let out = warden(&["runs", "approve", "parked", "call-3-1"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = dir.path().join("notes/SUMMARY.md");
    assert!(summary.is_file());
    std::fs::remove_file(&summary).unwrap();

    // The README's restore: the unfinished run is marked, with the
    // backup's time; the finished one is not.
    let out = warden(&["store", "restore", "backup.db", "--json"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let restored = json_out(&out);
    assert_eq!(
        restored["marked"],
        serde_json::json!(["parked"]),
        "{restored}"
    );
    let taken_ms = restored["taken_ms"].as_i64().unwrap();
    let kept = restored["replaced_store_kept_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let statuses = json_out(&warden(&["runs", "list", "--json"], dir.path()));
    let status = |id: &str| {
        statuses
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == id)
            .map(|r| r["status"].as_str().unwrap().to_owned())
    };
    assert_eq!(status("parked").as_deref(), Some("needs_reconciliation"));
    assert_eq!(status("done").as_deref(), Some("completed"));

    // Nothing continues it until a human says what happened: the write is
    // not made a second time.
    for args in [
        &["runs", "resume", "parked"][..],
        &["runs", "recover", "parked"],
    ] {
        let out = warden(args, dir.path());
        assert_eq!(out.status.code(), Some(5), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("restored from a backup taken at"), "{err}");
        assert!(err.contains("warden runs resolve parked --note"), "{err}");
    }
    let out = warden(&["runs", "approve", "parked", "call-3-1"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!summary.exists(), "the write was made again");
    let out = warden(&["runs", "resume", "parked", "--json"], dir.path());
    let envelope = json_out(&out);
    assert_eq!(envelope["error"]["code"], "needs_reconciliation");
    assert_eq!(envelope["error"]["details"]["since_ms"], taken_ms);
    let out = warden(&["runs", "show", "parked"], dir.path());
    assert!(
        stdout(&out).contains("! needs reconciliation"),
        "{}",
        stdout(&out)
    );

    // The replaced store still holds what happened after the backup.
    let out = warden(&["runs", "list", "--json", "--store", &kept], dir.path());
    assert_eq!(json_out(&out)[1]["status"], "completed", "{}", stdout(&out));

    // The operator checked (the summary was written after the backup) and
    // lets the run go on from its log: it waits for approval, as it did.
    let out = warden(
        &[
            "runs",
            "resolve",
            "parked",
            "--note",
            "summary written after the backup",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden(&["runs", "show", "parked", "--json"], dir.path());
    assert!(
        stdout(&out).contains("awaiting_approval"),
        "{}",
        stdout(&out)
    );

    // Restoring again with --no-reconcile marks nothing.
    let out = warden(&["store", "backup", "second.db"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden(
        &["store", "restore", "second.db", "--no-reconcile", "--json"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_out(&out)["marked"], serde_json::json!([]));
    // A copy that does not record its time needs --taken-at.
    std::fs::copy(
        dir.path().join(".warden/warden.db"),
        dir.path().join("raw.db"),
    )
    .unwrap();
    rusqlite::Connection::open(dir.path().join("raw.db"))
        .unwrap()
        .execute("DELETE FROM store_meta WHERE key = 'backup_taken_ms'", [])
        .unwrap();
    let out = warden(&["store", "restore", "raw.db"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("pass --taken-at"), "{}", stderr(&out));
}

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// Rolls run `run` of `dir`'s store back to its first `keep` events as an
/// attacker with the database would: the tail cut, the row rewound to a
/// copied head (no hashing), so the chain still checks out.
fn roll_back(dir: &Path, run: &str, keep: i64) {
    let db = rusqlite::Connection::open(dir.join(".warden/warden.db")).unwrap();
    let pk: i64 = db
        .query_row("SELECT pk FROM runs WHERE id = ?1", [run], |r| r.get(0))
        .unwrap();
    db.execute_batch(&format!(
        "DELETE FROM events WHERE run_pk = {pk} AND seq > {keep};
         UPDATE runs SET event_count = {keep}, status = 'running',
             head_hash = (SELECT hash FROM events WHERE run_pk = {pk} AND seq = {keep})
         WHERE pk = {pk};"
    ))
    .unwrap();
}

/// Issue 36: with `WARDEN_WITNESS` set, every verb that drives or records
/// on a run checks the witness, not only `verify` and `recover`: a run
/// rolled back to before its approved write is refused by `runs resume`,
/// and one rolled back to its approval request by `runs approve` and
/// `runs fork`; nothing is recorded and the write is not made again.
#[test]
fn a_rolled_back_run_is_refused_by_every_driving_verb_under_warden_witness() {
    let dir = demo();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "done"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&["runs", "approve", "done", "call-3-1"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_file(dir.path().join("notes/SUMMARY.md")).unwrap();
    let out = warden(&["store", "witness", "witness.json"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let events = stdout(&warden(&["runs", "events", "done"], dir.path()));
    let seq_of = |kind: &str| {
        events
            .lines()
            .position(|l| l.contains(&format!("\"type\":\"{kind}\"")))
            .unwrap_or_else(|| panic!("no {kind} in {events}")) as i64
            + 1
    };
    let (requested, granted) = (seq_of("approval_requested"), seq_of("approval_granted"));
    let witnessed =
        |args: &[&str]| warden_env(args, dir.path(), &[("WARDEN_WITNESS", "witness.json")]);

    // Rolled back to just after the approval: the write is next.
    roll_back(dir.path(), "done", granted);
    let before = stdout(&warden(&["runs", "events", "done"], dir.path()));
    let out = witnessed(&["runs", "resume", "done", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let envelope = json_out(&out);
    assert_eq!(envelope["error"]["code"], "rolled_back", "{envelope}");
    assert_eq!(envelope["error"]["details"]["run_id"], "done");
    assert_eq!(
        stdout(&warden(&["runs", "events", "done"], dir.path())),
        before
    );
    assert!(
        !dir.path().join("notes/SUMMARY.md").exists(),
        "the write ran again"
    );

    // Rolled back to its approval request: approving and forking refused.
    roll_back(dir.path(), "done", requested);
    let before = stdout(&warden(&["runs", "events", "done"], dir.path()));
    for args in [
        vec!["runs", "approve", "done", "call-3-1", "--json"],
        vec![
            "runs", "deny", "done", "call-3-1", "--reason", "no", "--json",
        ],
        vec!["runs", "fork", "done", "--at", "2", "--json"],
    ] {
        let out = witnessed(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert_eq!(json_out(&out)["error"]["code"], "rolled_back", "{args:?}");
    }
    assert_eq!(
        stdout(&warden(&["runs", "events", "done"], dir.path())),
        before
    );
    assert!(
        !dir.path().join("notes/SUMMARY.md").exists(),
        "the write ran again"
    );
    // Without the witness, nothing tells: the run would be driven again.
    let out = warden(&["runs", "verify", "done"], dir.path());
    assert!(out.status.success(), "{}", stdout(&out));
}

#[test]
fn a_rolled_back_run_fails_verify_against_its_witness_and_recover_refuses_it() {
    let dir = demo();
    let keyed = |args: &[&str]| warden_env(args, dir.path(), &[("WARDEN_CHAIN_KEY", KEY)]);
    let out = keyed(&["run", "notes.toml", "go", "--run-id", "done"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = keyed(&["runs", "approve", "done", "call-3-1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_file(dir.path().join("notes/SUMMARY.md")).unwrap();
    let out = keyed(&["run", "notes.toml", "go", "--run-id", "parked"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    // The key comes from the environment: the store refuses to open without.
    let out = warden(&["runs", "list"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // ... and never from the configuration file.
    std::fs::write(
        dir.path().join("warden.toml"),
        format!("chain_key = \"{KEY}\"\n"),
    )
    .unwrap();
    let out = keyed(&["runs", "list"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("chain_key"), "{}", stderr(&out));
    std::fs::remove_file(dir.path().join("warden.toml")).unwrap();

    std::fs::create_dir(dir.path().join("witnesses")).unwrap();
    let out = keyed(&["store", "witness", "witnesses", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written = json_out(&out);
    assert_eq!(
        (written["runs"].as_u64(), written["keyed"].as_bool()),
        (Some(2), Some(true))
    );
    let out = keyed(&["runs", "verify", "--witness", "witnesses"]);
    assert!(out.status.success(), "{}", stdout(&out));

    // An attacker with the database cuts the completed run's tail and
    // rewinds its row to an earlier, self-consistent state: no hash is
    // computed, a stored one is copied, so the chain still checks out.
    let db = rusqlite::Connection::open(dir.path().join(".warden/warden.db")).unwrap();
    let (pk, count): (i64, i64) = db
        .query_row(
            "SELECT pk, event_count FROM runs WHERE id = 'done'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let keep = count - 4;
    db.execute_batch(&format!(
        "DELETE FROM events WHERE run_pk = {pk} AND seq > {keep};
         UPDATE runs SET event_count = {keep}, status = 'running',
             head_hash = (SELECT hash FROM events WHERE run_pk = {pk} AND seq = {keep})
         WHERE pk = {pk};"
    ))
    .unwrap();
    drop(db);
    let out = keyed(&["runs", "verify"]);
    assert!(
        out.status.success(),
        "the plain check cannot tell: {}",
        stdout(&out)
    );
    let out = keyed(&["runs", "verify", "--witness", "witnesses"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "done: BROKEN\n   rolled back: the log holds {keep} events, the witness saw {count}"
        )),
        "{text}"
    );
    assert!(text.contains("parked: intact"), "{text}");
    let before = keyed(&["runs", "events", "done"]);
    let out = keyed(&[
        "runs",
        "recover",
        "done",
        "--witness",
        "witnesses",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert_eq!(json_out(&out)["error"]["code"], "rolled_back");
    assert_eq!(stdout(&keyed(&["runs", "events", "done"])), stdout(&before));
    assert!(
        !dir.path().join("notes/SUMMARY.md").exists(),
        "the write ran again"
    );

    // A run whose id was made invalid does not vanish from verify or list.
    let db = rusqlite::Connection::open(dir.path().join(".warden/warden.db")).unwrap();
    db.execute("UPDATE runs SET id = 'parked/x' WHERE id = 'parked'", [])
        .unwrap();
    drop(db);
    let out = keyed(&["runs", "verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("parked/x: BROKEN\n   the stored run id is not a valid run id"),
        "{}",
        stdout(&out)
    );
    let out = keyed(&["runs", "verify", "--witness", "witnesses"]);
    assert!(
        stdout(&out).contains("parked: BROKEN\n   the run is gone, but the witness saw"),
        "{}",
        stdout(&out)
    );
    let out = keyed(&["runs", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`parked/x` is not a valid run id"),
        "{}",
        stderr(&out)
    );
    // The store's own warning is there too, without colour codes: stderr
    // is a pipe here, not a terminal.
    assert!(stderr(&out).contains("WARN"), "{}", stderr(&out));
    assert!(!stderr(&out).contains('\u{1b}'), "{:?}", stderr(&out));
    // A tampered witness is refused.
    let file = std::fs::read_dir(dir.path().join("witnesses"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace(&format!("\"event_count\": {count}"), "\"event_count\": 3"),
    )
    .unwrap();
    let out = keyed(&["runs", "verify", "--witness", "witnesses"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("it was altered"), "{}", stderr(&out));
}

#[test]
fn a_tampered_run_exits_1_as_readme_says_and_verify_reports_every_run() {
    let dir = demo();
    two_runs(dir.path(), ".warden/warden.db");
    let db = rusqlite::Connection::open(dir.path().join(".warden/warden.db")).unwrap();
    db.execute(
        "UPDATE events SET bytes = CAST('{}' AS BLOB) WHERE seq = 2 AND run_pk = (SELECT pk FROM runs WHERE id = 'done')",
        [],
    )
    .unwrap();
    drop(db);
    let out = warden(&["runs", "show", "done"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = warden(&["runs", "show", "done", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_out(&out)["error"]["code"], "tampered");
    let out = warden(&["runs", "verify"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("done: BROKEN") && text.contains("parked: intact"),
        "{text}"
    );
}
