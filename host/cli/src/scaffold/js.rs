//! `warden plugin new --lang js` and the JavaScript side of `warden plugin
//! build`. The JavaScript guest SDK (`guest-sdk/js`), Warden's WIT and the
//! WASI interfaces the SDK's file helpers import are inside this binary; the
//! build tools are the plugin's own npm packages, pinned by the
//! `package.json` and `package-lock.json` the scaffold writes
//! (`@bytecodealliance/componentize-js` and `rolldown`), installed with
//! `npm ci`.
//!
//! A build bundles the app (`app.js` or `app.ts`: rolldown strips
//! TypeScript's types) with the SDK into one module whose `tool` export is
//! the SDK's dispatch over the app's exported tools, then componentize-js
//! turns that module into a component of the world `js-tool-plugin`: the
//! `tool-plugin` world plus the WASI filesystem the SDK reads mounts with.
//! Every import of the result is checked against the sandbox's allow-list
//! before it is written, so a refusal names the import at build time.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde_json::json;

use crate::errors::CliError;

/// The modules a JavaScript plugin's tools may be in, in the order tried.
pub(crate) const APPS: &[&str] = &["app.ts", "app.js"];

/// The app module in `dir`, if it holds one.
pub(crate) fn app(dir: &Path) -> Option<PathBuf> {
    APPS.iter().map(|a| dir.join(a)).find(|p| p.is_file())
}

/// The SDK, written under a build's temporary directory.
const SDK: &str = include_str!("../../../../guest-sdk/js/warden-guest/index.js");

/// The build tools, pinned: written into every new plugin.
const PACKAGE_JSON: &str = include_str!("../../../../guest-sdk/js/package.json");
const PACKAGE_LOCK: &str = include_str!("../../../../guest-sdk/js/package-lock.json");

/// The name the two npm files carry in the SDK's directory; a new plugin's
/// carry the plugin's.
const TOOLS_NAME: &str = "\"name\": \"warden-js-build-tools\"";

/// Warden's WIT, and the WASI packages the SDK imports (as `deps/`).
const WIT: &[(&str, &str)] = &[
    ("types.wit", include_str!("../../../../wit/types.wit")),
    ("worlds.wit", include_str!("../../../../wit/worlds.wit")),
    (
        "deps/io/io.wit",
        include_str!("../../../../guest-sdk/js/wit/io.wit"),
    ),
    (
        "deps/clocks/clocks.wit",
        include_str!("../../../../guest-sdk/js/wit/clocks.wit"),
    ),
    (
        "deps/filesystem/filesystem.wit",
        include_str!("../../../../guest-sdk/js/wit/filesystem.wit"),
    ),
    (
        "deps/cli/cli.wit",
        include_str!("../../../../guest-sdk/js/wit/cli.wit"),
    ),
];

/// The world a JavaScript tool is built as: the SDK reads mounts through
/// `wasi:filesystem` and the granted variables through
/// `wasi:cli/environment` (at the version componentize-js's engine imports,
/// so the two are one import), which the sandbox offers every plugin.
const WORLD: &str = "world js-tool-plugin {
    include tool-plugin;
    import wasi:filesystem/preopens@0.2.12;
    import wasi:filesystem/types@0.2.12;
    import wasi:cli/environment@0.2.12;
}
";

/// The entry module: the app's tools as the `warden:plugin/tool` export.
const ENTRY: &str = "import * as app from {app};
import { exportTools } from \"warden-guest\";
export const tool = exportTools(app);
";

/// Rolldown's configuration: the SDK under its import name, the host's
/// interfaces left for componentize-js, one ES module out.
const BUNDLE: &str = "export default {
  input: {entry},
  external: [/^warden:/, /^wasi:/],
  resolve: { alias: { \"warden-guest\": {sdk} } },
  output: { file: {bundle}, format: \"esm\" },
};
";

/// A string as a JavaScript literal (JSON's string syntax is JavaScript's).
fn literal(path: &Path) -> String {
    serde_json::to_string(&path.to_string_lossy()).expect("a string serializes")
}

/// A build tool of the plugin's npm packages, or the refusal naming how to
/// install them.
fn tool(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let bin = dir.join("node_modules/.bin").join(name);
    if bin.is_file() {
        return Ok(bin);
    }
    Err(CliError::new(
        "build_failed",
        format!(
            "cannot build `{}`: its build tools are not installed (no node_modules/.bin/{name}): \
             run `npm ci` there (package.json pins them; needs Node.js 20 or later)",
            dir.display()
        ),
    )
    .with_details(json!({ "dir": dir, "missing": name }))
    .into())
}

/// Runs `cmd`; its stderr (or stdout) on failure, as one line.
fn run(mut cmd: Command, what: &str, dir: &Path) -> anyhow::Result<()> {
    let failed = |message: String| {
        anyhow::Error::from(
            CliError::new("build_failed", message).with_details(json!({ "dir": dir })),
        )
    };
    let out = cmd.output().map_err(|e| {
        failed(format!(
            "cannot build `{}`: cannot run {what} ({e}); install Node.js 20 or later",
            dir.display()
        ))
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let reason = if stderr.trim().is_empty() {
            stdout
        } else {
            stderr
        };
        // The first lines say what is wrong; a stack trace follows.
        let reason: Vec<&str> = reason
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("at ") && !l.starts_with("Node.js v"))
            .take(6)
            .collect();
        return Err(failed(format!(
            "cannot build `{}`: {what} failed: {}",
            dir.display(),
            reason.join(" ")
        )));
    }
    Ok(())
}

/// The component of the JavaScript plugin in `dir`.
pub(crate) fn build(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let app = app(dir).ok_or_else(|| {
        CliError::new(
            "usage",
            format!("`{}` has no app.js or app.ts", dir.display()),
        )
    })?;
    let rolldown = tool(dir, "rolldown")?;
    let componentize = tool(dir, "componentize-js")?;
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let w = work.path();
    for (path, text) in WIT {
        let path = w.join("wit").join(path);
        std::fs::create_dir_all(path.parent().expect("a file has a parent"))?;
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
    }
    std::fs::write(w.join("wit/js.wit"), WORLD)?;
    std::fs::create_dir_all(w.join("sdk"))?;
    std::fs::write(w.join("sdk/index.js"), SDK)?;
    let entry = w.join("entry.js");
    let bundle = w.join("bundle.js");
    std::fs::write(&entry, ENTRY.replace("{app}", &literal(&app)))?;
    let config = w.join("rolldown.config.mjs");
    std::fs::write(
        &config,
        BUNDLE
            .replace("{entry}", &literal(&entry))
            .replace("{sdk}", &literal(&w.join("sdk/index.js")))
            .replace("{bundle}", &literal(&bundle)),
    )?;

    // The plugin's directory is the working directory: the app's own npm
    // dependencies resolve from its node_modules.
    let mut bundling = Command::new(&rolldown);
    bundling.arg("-c").arg(&config).current_dir(dir);
    run(bundling, "bundling (rolldown)", dir)?;
    let output = w.join("component.wasm");
    let mut componentizing = Command::new(&componentize);
    componentizing
        .arg(&bundle)
        .arg("--wit")
        .arg(w.join("wit"))
        .args(["-n", "js-tool-plugin", "-o"])
        .arg(&output)
        .current_dir(w);
    run(componentizing, "componentize-js", dir)?;
    let wasm =
        std::fs::read(&output).with_context(|| format!("cannot read `{}`", output.display()))?;
    let refused = warden::sandbox::refused_imports(&wasm).map_err(|e| {
        CliError::new(
            "build_failed",
            format!("componentize-js wrote an unreadable component: {e}"),
        )
    })?;
    if !refused.is_empty() {
        return Err(CliError::new(
            "build_failed",
            format!(
                "cannot build `{}`: the component imports what the Warden sandbox does not offer: {}",
                dir.display(),
                refused.join(", ")
            ),
        )
        .with_details(json!({ "dir": dir, "imports": refused }))
        .into());
    }
    Ok(wasm)
}

/// The files of a new JavaScript tool plugin, as (path, text).
pub(crate) fn files(name: &str) -> Vec<(String, String)> {
    let fill = |t: &str| t.replace("{name}", name);
    let named = |t: &str| t.replace(TOOLS_NAME, &format!("\"name\": \"{name}\""));
    let mut files = vec![
        (
            "plugin.toml".into(),
            fill(MANIFEST).replace("{requests}", super::TOOL_MANIFEST_EXTRA),
        ),
        ("app.js".into(), fill(APP_JS)),
        ("package.json".into(), named(PACKAGE_JSON)),
        ("package-lock.json".into(), named(PACKAGE_LOCK)),
    ];
    files.extend(
        super::TOOL_CASES
            .iter()
            .map(|(p, t)| ((*p).to_owned(), fill(t))),
    );
    files.push((".gitignore".into(), "node_modules/\n".into()));
    files
}

const MANIFEST: &str = r##"name = "{name}"
version = "0.1.0"
kind = "tool"
description = "An example tool plugin in JavaScript"
# `warden plugin build` writes `component` and `sha256` here.
{requests}
[limits]
# A call runs a SpiderMonkey interpreter inside the component: it costs
# millions of instructions where the same tool in Rust costs thousands.
fuel = 2_000_000_000
memory = "64MiB"
timeout = "10s"
output = "256KiB"
stdio = "16KiB"
"##;

const APP_JS: &str = include_str!("js/app.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_parses() {
        let dir = tempfile::tempdir().unwrap();
        let files = files("my-tool");
        let manifest = &files.iter().find(|(p, _)| p == "plugin.toml").unwrap().1;
        std::fs::write(dir.path().join("plugin.toml"), manifest).unwrap();
        let m = warden::plugins::manifest::Manifest::load(&dir.path().join("plugin.toml")).unwrap();
        assert_eq!(m.name, "my-tool");
    }

    /// The npm files carry the plugin's name, and still pin the tools.
    #[test]
    fn the_package_files_name_the_plugin() {
        let files = files("my-tool");
        for file in ["package.json", "package-lock.json"] {
            let text = &files.iter().find(|(p, _)| p == file).unwrap().1;
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(value["name"], "my-tool", "{file}");
            assert!(!text.contains("warden-js-build-tools"), "{file}");
        }
        let package: serde_json::Value = serde_json::from_str(PACKAGE_JSON).unwrap();
        for (tool, version) in package["devDependencies"].as_object().unwrap() {
            let version = version.as_str().unwrap();
            assert!(
                version.chars().all(|c| c.is_ascii_digit() || c == '.'),
                "{tool} is pinned to an exact version, not `{version}`"
            );
        }
    }
}
