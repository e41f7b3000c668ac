//! What the CLI test binaries share: running the real `warden` binary
//! hermetically, reading its output, and the quick start's demo directory.
//! Each test binary uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Every status, in the order of docs/operating-runs.md's table.
pub(crate) const STATUSES: [&str; 13] = [
    "queued",
    "running",
    "awaiting_approval",
    "suspended",
    "awaiting_external",
    "awaiting_child",
    "budget_exceeded",
    "waiting",
    "needs_reconciliation",
    "completed",
    "failed",
    "cancelled",
    "abandoned",
];

/// Runs the binary in `cwd` with a shared plugin cache and none of the
/// caller's log or store settings.
pub(crate) fn warden(args: &[&str], cwd: &Path) -> Output {
    command(args, cwd).output().unwrap()
}

/// The command [`warden`] runs, to spawn it instead.
pub(crate) fn command(args: &[&str], cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden"));
    cmd.args(args)
        .current_dir(cwd)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_STORE");
    cmd
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output as one JSON value, or a panic showing both streams.
pub(crate) fn json_out(o: &Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}

/// A copy of the quick start's demo (notes agent, transcript, notes
/// folder, and the `out/` its channel delivers to) in a fresh directory.
pub(crate) fn demo() -> tempfile::TempDir {
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
