//! The `warden` binary the CLI tests drive. The `warden` target belongs to
//! another package (`warden-cli`), for which Cargo gives this package no
//! path; this package builds the same `main` as `warden-under-test`
//! (tests/src/bin/), which Cargo builds before these tests with the test
//! run's features, so a test never drives a stale or separately built binary.

use std::path::PathBuf;

/// The `warden` binary built for this test run.
pub(crate) fn warden_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warden-under-test"))
}
