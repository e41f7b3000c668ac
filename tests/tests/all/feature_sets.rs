//! Building the Python package alone reuses the default members' build.
//! `maturin develop` builds `warden-python` on its own, and cargo resolves
//! each dependency's features over the packages a command builds: a shared
//! dependency resolved with other features there is another compile unit,
//! and so is everything above it (a changed `serde` or a proc macro's
//! `anyhow` compiles wasmtime again: about 15 minutes on 2 cores, in CI and
//! for anyone building the package after `cargo build`). The package's
//! manifest names crates only for this unification; this finds the unit it
//! would be missing. Read from `cargo tree`, which resolves as a build does.

use std::collections::BTreeSet;
use std::process::Command;

/// Each unit (`name version|features`) a build of `packages` compiles for
/// this machine, as `cargo tree` resolves it: normal and build
/// dependencies, host and target units alike.
fn units(packages: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let host = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("cannot run rustc -vV");
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names no host");
    let mut cmd = Command::new(cargo);
    cmd.args(["tree", "--edges", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}|{f}", "--target", &host])
        // From the workspace root, where no `--package` means the default
        // members (in tests/ it would mean this package alone).
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for package in packages {
        cmd.args(["--package", package]);
    }
    let out = cmd.output().expect("cannot run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches(" (*)").replace(" (proc-macro)", ""))
        // A workspace package's path differs between checkouts; its name
        // and version are enough here.
        .map(|l| match (l.find(" ("), l.find('|')) {
            (Some(open), Some(bar)) if open < bar => format!("{}{}", &l[..open], &l[bar..]),
            _ => l,
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// The units a build of `packages` needs that the default members' build
/// (`cargo build`, `cargo run`, `cargo test`) does not have, leaving out
/// those of crates only `packages` use.
fn missing_from_default_build(packages: &[&str], own: &[&str]) -> Vec<String> {
    let default = units(&[]);
    units(packages)
        .into_iter()
        .filter(|unit| !default.contains(unit))
        .filter(|unit| {
            let name = unit.split(' ').next().unwrap_or_default();
            !own.contains(&name)
        })
        .collect()
}

#[test]
fn the_python_package_alone_needs_no_unit_the_default_build_lacks() {
    let missing = missing_from_default_build(
        &["warden-python"],
        &[
            "warden-python",
            "pyo3",
            "pyo3-build-config",
            "pyo3-ffi",
            "pyo3-macros",
            "pyo3-macros-backend",
        ],
    );
    assert!(
        missing.is_empty(),
        "building warden-python alone (maturin develop) would compile these units again, \
         each with features the default build does not give it; add the dependency \
         that enables them to host/python/Cargo.toml's unification section: {missing:#?}"
    );
}

#[test]
fn the_check_sees_a_package_whose_features_differ() {
    // `warden-syntax` on its own leaves out features the default build
    // enables in the crates it shares (serde's `rc`, for one).
    let missing = missing_from_default_build(&["warden-syntax"], &["warden-syntax"]);
    assert!(
        missing.iter().any(|unit| unit.starts_with("serde")),
        "expected warden-syntax alone to resolve serde's features differently: {missing:#?}"
    );
}
