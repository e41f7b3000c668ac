//! A plugin author's path, end to end with the real binary and cargo:
//! `warden plugin new` for each kind, `warden plugin build`, the scaffold's
//! declarative cases through `warden plugin test` (the component in the real
//! sandbox), `plugin inspect`, a call through the pinned manifest, and the
//! scaffold's native unit tests (`cargo test`), all without editing a file.
//! The scaffold depends on the guest SDK only: nothing here compiles
//! wasmtime or Warden for it.
//!
//! The crates are created under this workspace's target directory, so their
//! dependency is a path into this checkout, and they build in the
//! workspace's target directory (`CARGO_TARGET_DIR`), reusing what the
//! workspace's own build compiled (the built-in plugins' guest builds).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The workspace's target directory (`CARGO_TARGET_TMPDIR` is `<target>/tmp`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A command with the environment of a nested cargo: the outer build's
/// leaking variables removed, the shared target directory set.
fn command(program: impl AsRef<std::ffi::OsStr>, cwd: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in warden_build_support::LEAKING_ENV {
        cmd.env_remove(var);
    }
    cmd.current_dir(cwd)
        .env("CARGO_TARGET_DIR", target_dir())
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG");
    cmd
}

fn warden(args: &[&str], cwd: &Path) -> Output {
    command(env!("CARGO_BIN_EXE_warden"), cwd)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Scaffolds `name` of `kind` in `root`, builds it with `warden plugin
/// build`, checks the pin, and returns the crate's directory.
fn new_and_build(root: &Path, name: &str, kind: &str) -> PathBuf {
    // The checkout named explicitly: the target directory may be anywhere.
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap();
    let out = warden(
        &[
            "plugin",
            "new",
            name,
            "--kind",
            kind,
            "--warden-path",
            checkout.to_str().unwrap(),
        ],
        root,
    );
    assert_ok(&out, "plugin new");
    let dir = root.join(name);
    let cases = format!("tests/{kind}.toml");
    for file in [
        "Cargo.toml",
        "plugin.toml",
        "src/lib.rs",
        &cases,
        "Cargo.lock",
    ] {
        assert!(dir.join(file).is_file(), "{name}: {file} is missing");
    }
    let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("warden-guest = { path = \"") && cargo.contains("/guest-sdk\" }"),
        "{cargo}"
    );
    // No Rust dependency on Warden (the testkit is only suggested, in a
    // comment): the author never compiles wasmtime.
    assert!(!cargo.lines().any(|l| l.starts_with("warden =")), "{cargo}");

    let out = warden(&["plugin", "build", name, "--json"], root);
    assert_ok(&out, "plugin build");
    let built: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let wasm = std::fs::read(dir.join(format!("{name}.wasm"))).unwrap();
    let sha = hex::encode(Sha256::digest(&wasm));
    assert_eq!(built["sha256"], sha.as_str());
    let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    assert!(
        manifest.contains(&format!("sha256 = \"{sha}\"")),
        "{manifest}"
    );
    assert!(
        manifest.contains(&format!("component = \"{name}.wasm\"")),
        "{manifest}"
    );
    dir
}

/// Runs the crate's declarative cases with `warden plugin test`; returns
/// the JSON report.
fn plugin_test(dir: &Path) -> Value {
    let out = warden(&["plugin", "test", "--json"], dir);
    assert_ok(&out, &format!("plugin test in {}", dir.display()));
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(report["failed"], 0, "{report:#}");
    assert!(report["passed"].as_u64().unwrap() >= 2, "{report:#}");
    report
}

/// Runs the crate's own `cargo test` (its native unit tests); returns its
/// output.
fn cargo_test(dir: &Path) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = command(cargo, dir)
        .args(["test", "--quiet"])
        .output()
        .unwrap();
    assert_ok(&out, &format!("cargo test in {}", dir.display()));
    text(&out.stdout)
}

#[test]
fn a_new_plugin_of_each_kind_builds_and_passes_its_tests_without_edits() {
    let root =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("scaffold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();

    // A tool: called through its pinned manifest, then its own tests.
    let tool = new_and_build(&root, "greeter", "tool");
    let out = warden(
        &[
            "plugin",
            "call",
            "greeter/plugin.toml",
            "greet",
            r#"{"name": "ada"}"#,
            "--config",
            "salutation=hi",
            "--json",
        ],
        &root,
    );
    assert_ok(&out, "plugin call");
    let called: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(called["output"]["text"], "hi, ada");
    assert_eq!(called["effect"], "read");
    plugin_test(&tool);
    let out = warden(
        &["plugin", "inspect", "greeter/plugin.toml", "--json"],
        &root,
    );
    assert_ok(&out, "plugin inspect");
    let inspected: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(inspected["tools"][0]["name"], "greet");
    let tested = cargo_test(&tool);
    assert!(
        tested.contains("test result: ok. 3 passed"),
        "the unit tests ran:\n{tested}"
    );

    // A context source and a channel, through the shell and their tests.
    let context = new_and_build(&root, "notes-context", "context");
    let out = warden(
        &[
            "plugin",
            "resolve",
            "notes-context/plugin.toml",
            r#"{"upper": true}"#,
            "--config",
            "note=hello",
        ],
        &root,
    );
    assert_ok(&out, "plugin resolve");
    let items: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(items[0]["content"], "HELLO");
    plugin_test(&context);
    cargo_test(&context);

    let channel = new_and_build(&root, "outbox", "channel");
    std::fs::create_dir(root.join("out")).unwrap();
    let out = warden(
        &[
            "plugin",
            "deliver",
            "outbox/plugin.toml",
            "completed",
            r#"{"summary": "done"}"#,
            "--mount",
            "outbox=out",
        ],
        &root,
    );
    assert_ok(&out, "plugin deliver");
    let delivered: Vec<_> = std::fs::read_dir(root.join("out")).unwrap().collect();
    assert_eq!(delivered.len(), 1);
    plugin_test(&channel);
    cargo_test(&channel);

    // A policy: a denial and an allow through the pinned manifest, then its
    // tests.
    let policy = new_and_build(&root, "guard", "policy");
    let decide = |tool: &str, json: bool| {
        let subject = format!(r#"{{"call_id": "call-1-1", "tool": "{tool}", "arguments": {{}}}}"#);
        let mut args = vec![
            "plugin",
            "decide",
            "guard/plugin.toml",
            "before_tool_call",
            &subject,
            "--config",
            "deny=fs__write_file",
        ];
        if json {
            args.push("--json");
        }
        let out = warden(&args, &root);
        assert_ok(&out, "plugin decide");
        text(&out.stdout)
    };
    let denied: Value = serde_json::from_str(&decide("fs__write_file", true)).unwrap();
    assert_eq!(denied["decision"], "deny", "{denied}");
    assert_eq!(
        denied["reason"],
        "tool `fs__write_file` is denied by policy `guard`"
    );
    assert_eq!(decide("fs__read_file", false).trim(), "allow");
    plugin_test(&policy);
    let tested = cargo_test(&policy);
    assert!(
        tested.contains("test result: ok. 2 passed"),
        "the unit tests ran:\n{tested}"
    );

    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn plugin_new_and_build_refuse_bad_input_with_one_line() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("taken")).unwrap();
    std::fs::write(root.path().join("taken/file"), "x").unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["plugin", "new", "Bad_Name"],
            "`Bad_Name` is not a valid plugin name",
        ),
        (
            &["plugin", "new", "taken"],
            "already exists and is not empty",
        ),
        (
            &["plugin", "new", "x", "--warden-path", "."],
            "is not a Warden checkout",
        ),
        // Outside a checkout, a Rust plugin needs the flag: the checkout
        // this binary was built from is never picked silently.
        (
            &["plugin", "new", "x"],
            "is in no Warden checkout: a Rust plugin depends on Warden's guest SDK by path, so give --warden-path DIR",
        ),
        (
            &["plugin", "new", "x", "--lang", "python", "--kind", "policy"],
            "a Python plugin is a tool",
        ),
        (
            &["plugin", "new", "x", "--lang", "js", "--kind", "channel"],
            "a JavaScript plugin is a tool: the JavaScript guest SDK has no channel yet",
        ),
        (&["plugin", "build", "taken"], "plugin.toml"),
    ];
    for (args, expected) in cases {
        let out = warden(args, root.path());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?}: expected `{expected}` in {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(!root.path().join("x").exists());
    let out = warden(&["plugin", "new", "--help"], root.path());
    let help = text(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("Outside a checkout it is required for a Rust plugin"),
        "{help}"
    );
}
