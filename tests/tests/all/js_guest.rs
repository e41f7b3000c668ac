//! A JavaScript tool plugin end to end, as its author gets it: `warden
//! plugin new --lang js`, `warden plugin build` (rolldown and
//! componentize-js, the versions the scaffold's npm files pin), the
//! scaffold's cases through `warden plugin test` (the sandbox's contract
//! among them: denials outside a mount and on a read-only mount, a fuel and
//! a memory limit), `plugin inspect`, `plugin call`, and the plugin used by
//! an agent in `warden run` (scripted model, offline).
//!
//! The build tools are `guest-sdk/js`'s npm packages, which `.ci/run`
//! installs into `target/js-tools` with `npm ci`; the new plugin's
//! `node_modules` is a link to them (what `npm ci` in the plugin would
//! install). Without them these tests fail, naming the command.

use std::path::{Path, PathBuf};
use std::process::Output;
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

/// `target/js-tools/node_modules`, installed by `.ci/run` from
/// `guest-sdk/js`'s lock file; a failure naming the command when missing or
/// installed from another lock file.
fn js_tools() -> PathBuf {
    // target/<profile>/deps/all-<hash> → target/
    let exe = std::env::current_exe().unwrap();
    let tools = exe.ancestors().nth(3).unwrap().join("js-tools");
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

#[test]
fn a_js_plugin_from_the_scaffold_builds_passes_its_cases_and_serves_an_agent() {
    let tools = js_tools();
    let root = tempfile::tempdir().unwrap();
    let run = |args: &[&str], dir: &Path| warden(args, dir).output().unwrap();
    let started = Instant::now();

    let created = ok(
        &run(
            &["plugin", "new", "js-greeter", "--lang", "js", "--json"],
            root.path(),
        ),
        "plugin new --lang js",
    );
    assert_eq!(created["lang"], "js");
    let dir = root.path().join("js-greeter");
    for file in [
        "plugin.toml",
        "app.js",
        "package.json",
        "package-lock.json",
        "tests/tool.toml",
    ] {
        assert!(dir.join(file).is_file(), "{file} is missing");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("package-lock.json"))
            .unwrap()
            .replace(
                "\"name\": \"js-greeter\"",
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
    let built_at = Instant::now();
    let built = ok(&run(&["plugin", "build", "--json"], &dir), "plugin build");
    let wasm = std::fs::read(dir.join("js-greeter.wasm")).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&wasm));
    assert_eq!(built["sha256"], sha.as_str());
    let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    assert!(
        manifest.contains(&format!("sha256 = \"{sha}\"")),
        "{manifest}"
    );
    eprintln!(
        "built js-greeter in {:.1?} ({} bytes)",
        built_at.elapsed(),
        wasm.len()
    );

    let tested_at = Instant::now();
    let report = ok(&run(&["plugin", "test", "--json"], &dir), "plugin test");
    assert_eq!(report["failed"], 0, "{report:#}");
    assert_eq!(report["passed"], 10, "{report:#}");
    eprintln!(
        "plugin test: {:.1?}; plugin new to a green plugin test: {:.1?}",
        tested_at.elapsed(),
        started.elapsed()
    );

    let inspected = ok(
        &run(&["plugin", "inspect", "plugin.toml", "--json"], &dir),
        "plugin inspect",
    );
    let names: Vec<&str> = inspected["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // In the order of the module's exports, which JavaScript sorts by name.
    assert_eq!(names, ["count_lines", "fetch_status", "greet", "save_note"]);
    let save = &inspected["tools"][3];
    assert_eq!(save["effect"], "write");
    assert_eq!(
        save["input_schema"],
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "A file, relative to the notes mount" },
                "text": { "type": "string", "description": "What to write" },
                "copies": { "type": "integer", "description": "How many times to repeat the text" },
            },
            "required": ["path", "text"],
            "additionalProperties": false,
        })
    );
    let imports = inspected["imports"].as_array().unwrap();
    assert!(
        !imports
            .iter()
            .any(|i| i.as_str().unwrap().starts_with("wasi:sockets")),
        "{imports:?}"
    );

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

    // An agent using it: the scripted model calls both read tools, the
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
        r#"
name = "greeting"
instructions = "Greet, then count."

[model]
provider = "scripted"
name = "script"
transcript = "transcript.toml"

[plugins.greeter]
source = "js-greeter/plugin.toml"
[plugins.greeter.grant.mounts.docs]
dir = "docs"
[plugins.greeter.grant.config]
salutation = "ahoy"
"#,
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
