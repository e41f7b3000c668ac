//! The host's crates depend on each other one way only. Cargo already
//! refuses a cycle; this pins the direction: each host crate may reach
//! (directly or through another workspace crate, by any kind of
//! dependency) only the crates below it, so the sandbox, the store and the
//! providers never come to depend on the engine, the plugins or the CLI.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Each host crate and the workspace crates it may reach.
const LAYERS: &[(&str, &[&str])] = &[
    ("warden-syntax", &[]),
    ("warden-tls", &[]),
    ("warden-sandbox", &["warden-syntax", "warden-tls"]),
    ("warden-store", &[]),
    ("warden-providers", &["warden-syntax", "warden-tls"]),
    (
        "warden-plugins",
        &[
            "warden-sandbox",
            "warden-syntax",
            "warden-tls",
            "warden-build-support",
        ],
    ),
    (
        "warden-engine",
        &[
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-build-support",
        ],
    ),
    (
        "warden-testkit",
        &[
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-engine",
            "warden-build-support",
        ],
    ),
    // Traces derived from run logs: reads the store and the engine's
    // events, sends on the providers' HTTP client; nothing below knows it.
    (
        "warden-otel",
        &[
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-engine",
            "warden-build-support",
        ],
    ),
    (
        "warden",
        &[
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-engine",
            "warden-testkit",
            "warden-build-support",
        ],
    ),
    // The Python package sits beside the command line, on the facade; it
    // names the server and MCP crates only so that a build of it alone
    // resolves features as the command line's does (`all::feature_sets`).
    (
        "warden-python",
        &[
            "warden",
            "warden-server",
            "warden-mcp",
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-engine",
            "warden-testkit",
            "warden-otel",
            "warden-build-support",
        ],
    ),
    // The HTTP control plane: over the engine (through the `warden` crate
    // that re-exports it), below the command line that serves it.
    (
        "warden-server",
        &[
            "warden",
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-engine",
            "warden-testkit",
            "warden-otel",
            "warden-build-support",
        ],
    ),
    // `warden mcp serve`: over the engine (through the facade), reusing
    // the control plane's Host and Origin checks, below the command line.
    (
        "warden-mcp",
        &[
            "warden",
            "warden-server",
            "warden-syntax",
            "warden-tls",
            "warden-sandbox",
            "warden-store",
            "warden-providers",
            "warden-plugins",
            "warden-engine",
            "warden-testkit",
            "warden-otel",
            "warden-build-support",
        ],
    ),
];

/// The workspace's packages and the workspace packages each depends on
/// directly, by any kind of dependency, from `cargo metadata`.
fn workspace_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .expect("cannot run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|d| names.contains(d))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

/// Every workspace package `name` reaches.
fn reach(graph: &BTreeMap<String, BTreeSet<String>>, name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut next = vec![name.to_owned()];
    while let Some(package) = next.pop() {
        for dep in graph.get(&package).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                next.push(dep.clone());
            }
        }
    }
    seen
}

#[test]
fn every_host_crate_reaches_only_the_crates_below_it() {
    let graph = workspace_dependencies();
    for (name, allowed) in LAYERS {
        assert!(graph.contains_key(*name), "no workspace package `{name}`");
        let beyond: Vec<String> = reach(&graph, name)
            .into_iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        assert!(
            beyond.is_empty(),
            "`{name}` depends on {beyond:?}, above its layer (see ARCHITECTURE.md)"
        );
    }
}

#[test]
fn the_check_sees_a_dependency_that_goes_up() {
    let mut graph = workspace_dependencies();
    graph
        .get_mut("warden-providers")
        .unwrap()
        .insert("warden-engine".into());
    assert!(reach(&graph, "warden-providers").contains("warden-engine"));
    assert!(reach(&graph, "warden-providers").contains("warden-plugins"));
}
