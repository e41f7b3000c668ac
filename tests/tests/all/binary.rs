//! The `warden` binary the CLI tests drive. It belongs to another package
//! (`warden-cli`), so `cargo test -p warden-tests` does not build it and
//! Cargo gives this package no `CARGO_BIN_EXE_warden`: the first caller
//! builds it with the Cargo running the tests (a no-op when it is fresh),
//! so a test never drives a stale binary left by an earlier build.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The freshly built `warden` binary next to this test binary.
pub(crate) fn warden_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/all-<hash> → target/<profile>
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "warden-cli", "--bin", "warden"]);
    // What cargo set for this test's own crate is not the nested build's:
    // build scripts that watch these (ring's watches CARGO_MANIFEST_DIR and
    // CARGO_PKG_NAME) would run again here and again at the next top-level
    // `cargo test`, rebuilding everything above them each time.
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if name == "OUT_DIR"
            || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&name.as_ref())
        {
            build.env_remove(&var);
        }
    }
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        build.arg("--release");
    }
    let out = build.output().expect("cannot run cargo to build `warden`");
    assert!(
        out.status.success(),
        "cargo could not build the `warden` binary:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = profile_dir.join("warden");
    assert!(bin.is_file(), "cargo built no {}", bin.display());
    bin
}
