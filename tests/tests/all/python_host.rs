//! The Python package (`host/python`, the `warden` module): its pytest
//! suite (`host/python/tests`) drives the real runtime through the
//! bindings on SQLite and PostgreSQL: the notes demo parked for approval
//! and approved from Python, a Python process SIGKILLed mid-run and
//! recovered by another without repeating a write, Python policies and
//! external tools recorded as native ones (failing closed with the
//! traceback), live turns streamed and cancelled, and bad input raising
//! the exception that carries the engine's code.
//!
//! The package must be installed in the virtual environment
//! `target/py-venv` (`.ci/run` creates it, installs maturin and pytest at
//! pinned versions, and builds the package into it); a missing environment
//! or package, or a native module older than the crate's sources, fails
//! this test naming the command that fixes it. It never skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// How to (re)build the package, as .ci/run does.
const REBUILD: &str = "bash .ci/run's \"Python package\" step, or: \
    python3 -m venv target/py-venv && target/py-venv/bin/pip install maturin==1.16.0 pytest==9.2.0 \
    && VIRTUAL_ENV=$PWD/target/py-venv target/py-venv/bin/maturin develop -q -m host/python/Cargo.toml";

/// The newest modification time of a file under `dir`.
fn newest(dir: &Path) -> SystemTime {
    let mut latest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let time = if path.is_dir() {
            newest(&path)
        } else {
            path.metadata().unwrap().modified().unwrap()
        };
        latest = latest.max(time);
    }
    latest
}

#[test]
fn the_python_packages_tests_pass_against_the_real_runtime() {
    let repo = repo();
    let python = repo.join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "no virtual environment at {}: {REBUILD}",
        python.display()
    );
    let found = Command::new(&python)
        .args(["-c", "import warden._native as n; print(n.__file__)"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "the `warden` package is not installed in target/py-venv ({}): {REBUILD}",
        String::from_utf8_lossy(&found.stderr).trim()
    );
    let module = PathBuf::from(String::from_utf8(found.stdout).unwrap().trim());
    let built = module.metadata().unwrap().modified().unwrap();
    let sources = newest(&repo.join("host/python/src"));
    assert!(
        built >= sources,
        "the installed native module {} is older than host/python/src: {REBUILD}",
        module.display()
    );

    let started = Instant::now();
    let status = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            // No cache or bytecode left in the source tree.
            "-p",
            "no:cacheprovider",
            "host/python/tests",
        ])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&repo)
        .status()
        .unwrap();
    eprintln!("pytest took {:.1}s", started.elapsed().as_secs_f64());
    assert!(status.success(), "the Python package's tests failed");
}
