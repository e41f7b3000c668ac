//! `warden plugin new` and `warden plugin build`: a plugin author's path from
//! nothing to a tested, pinned component.
//!
//! `new` writes a crate that builds and passes its tests without edits: the
//! guest SDK as its one Warden dependency, a manifest, one example tool (or
//! context source, channel or policy) with native unit tests, and
//! declarative cases (`tests/<kind>.toml`) that `warden plugin test` runs
//! against the built component in the real sandbox, so the author never
//! compiles wasmtime or Warden (the Rust testkit stays an opt-in
//! dev-dependency, in a comment of the crate's Cargo.toml). The dependency is
//! a path into a Warden checkout (and its `Cargo.lock` is copied, so the
//! crate builds with the versions Warden is tested with): `--warden-path`,
//! else the checkout the crate is created in. Outside a checkout and
//! without the flag a Rust plugin is refused, naming the flag: Warden
//! publishes no guest SDK release to depend on, and the checkout this
//! binary happened to be built from is no choice the author made.
//!
//! With `--lang python` it writes a Python tool instead (`python.rs`): an
//! `app.py` on the Python guest SDK, a manifest and cases; with `--lang js`
//! a JavaScript one (`js.rs`): an `app.js` on the JavaScript guest SDK, a
//! manifest, cases and the npm files pinning its build tools.
//!
//! `build` compiles the crate for `wasm32-wasip2` through
//! `warden-build-support` (the crate's `guest` profile), copies the
//! component next to `plugin.toml` as `<name>.wasm` and writes `component`
//! and `sha256` into the manifest, leaving the rest of the file as it was; a
//! directory with an `app.py` and no `Cargo.toml` is built with
//! componentize-py instead, one with an `app.js` or `app.ts` with
//! componentize-js.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::Context;
use super::errors::CliError;
use warden::plugins::manifest::{Manifest, is_valid_plugin_name};

mod js;
mod python;

/// `warden plugin new`.
#[derive(Debug, Args)]
pub(crate) struct NewArgs {
    /// The plugin's name: [a-z][a-z0-9-]*, also the crate's.
    name: String,
    /// What the plugin is.
    #[arg(long, value_enum, default_value = "tool")]
    kind: Kind,
    /// The language: a Rust crate, a Python module built with
    /// componentize-py (a tool), or a JavaScript module built with
    /// componentize-js (a tool).
    #[arg(long, value_enum, default_value = "rust")]
    lang: Lang,
    /// The directory to create (default: ./NAME).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The Warden checkout whose guest SDK a Rust plugin depends on by path
    /// (default: the checkout the new crate is created in). Outside a
    /// checkout it is required for a Rust plugin: Warden publishes no SDK
    /// release to depend on, and the checkout this binary was built from is
    /// never picked silently. Python and JavaScript plugins need none.
    #[arg(long, value_name = "DIR")]
    warden_path: Option<PathBuf>,
}

/// `warden plugin build`.
#[derive(Debug, Args)]
pub(crate) struct BuildArgs {
    /// The plugin crate (default: the working directory).
    #[arg(default_value = ".")]
    dir: PathBuf,
}

/// The kinds a new plugin can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Kind {
    /// Tools the agent may call.
    Tool,
    /// A context source for the model's prompt.
    Context,
    /// A channel that delivers results.
    Channel,
    /// A policy that steers or stops runs.
    Policy,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Context => "context",
            Kind::Channel => "channel",
            Kind::Policy => "policy",
        }
    }
}

/// The languages a new plugin can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Lang {
    /// A Rust crate on the guest SDK (`warden-guest`).
    Rust,
    /// A Python module on the Python guest SDK (`warden_guest`), built with
    /// componentize-py.
    Python,
    /// A JavaScript (or TypeScript) module on the JavaScript guest SDK
    /// (`warden-guest`), built with componentize-js.
    Js,
}

impl Lang {
    fn as_str(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        }
    }
}

/// How the new crate depends on Warden: the root of a checkout, as
/// written in Cargo.toml.
struct Dependency(String);

impl Dependency {
    fn sdk(&self) -> String {
        format!("{{ path = \"{}/guest-sdk\" }}", self.0)
    }

    fn host(&self) -> String {
        format!("{{ path = \"{}/host/warden\" }}", self.0)
    }
}

/// The Warden checkout `dir` is inside, if any: a directory holding both
/// `guest-sdk/` (the `warden-guest` crate) and `host/warden/` (the `warden`
/// crate).
fn enclosing_checkout(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| is_checkout(d)).map(Path::to_owned)
}

fn is_checkout(dir: &Path) -> bool {
    dir.join("host/warden/Cargo.toml").is_file()
        && std::fs::read_to_string(dir.join("guest-sdk/Cargo.toml"))
            .is_ok_and(|t| t.contains("name = \"warden-guest\""))
}

/// `to` written relative to `from` (both absolute, `from` a directory).
pub(crate) fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

pub(crate) fn new(args: NewArgs, ctx: &Context) -> anyhow::Result<()> {
    if !is_valid_plugin_name(&args.name) {
        return Err(CliError::new(
            "usage",
            format!(
                "`{}` is not a valid plugin name (use [a-z][a-z0-9-]*, at most 64 bytes)",
                args.name
            ),
        )
        .into());
    }
    if args.lang != Lang::Rust && args.kind != Kind::Tool {
        return Err(CliError::new(
            "usage",
            format!(
                "a {lang} plugin is a tool: the {lang} guest SDK has no {} yet (use --lang rust)",
                args.kind.as_str(),
                lang = args.lang.name(),
            ),
        )
        .into());
    }
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let dir = cwd.join(
        args.dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&args.name)),
    );
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(CliError::new(
            "usage",
            format!(
                "`{}` already exists and is not empty: choose another --dir",
                dir.display()
            ),
        )
        .with_details(json!({ "dir": dir }))
        .into());
    }
    let parent = dir.parent().unwrap_or(&cwd).to_owned();
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create `{}`", parent.display()))?;
    let parent = parent.canonicalize().unwrap_or(parent);
    let dir = parent.join(dir.file_name().unwrap_or_default());
    let checkout = match &args.warden_path {
        // A Python or JavaScript plugin needs no checkout: the SDK is
        // inside this binary.
        _ if args.lang != Lang::Rust => None,
        Some(path) => {
            let path = cwd.join(path);
            if !is_checkout(&path) {
                return Err(CliError::new(
                    "usage",
                    format!(
                        "--warden-path `{}` is not a Warden checkout (no guest-sdk/ and host/warden/)",
                        path.display()
                    ),
                )
                .into());
            }
            Some(path.canonicalize().unwrap_or(path))
        }
        None => match enclosing_checkout(&parent) {
            Some(root) => Some(root),
            None => {
                return Err(CliError::new(
                    "usage",
                    format!(
                        "`{}` is in no Warden checkout: a Rust plugin depends on Warden's guest SDK by path, so give --warden-path DIR (a Warden checkout) or create it inside one",
                        dir.display()
                    ),
                )
                .with_details(json!({ "dir": dir, "flag": "--warden-path" }))
                .into());
            }
        },
    };

    let mut files = match args.lang {
        Lang::Rust => {
            let root = checkout.as_deref().expect("a Rust plugin has a checkout");
            // Relative inside the checkout (the two move together), else
            // absolute.
            let root = if dir.starts_with(root) {
                relative(&dir, root)
            } else {
                root.to_owned()
            };
            let dependency = Dependency(root.to_string_lossy().replace('\\', "/"));
            files(&args.name, args.kind, &dependency)
        }
        Lang::Python => python::files(&args.name),
        Lang::Js => js::files(&args.name),
    };
    // A Rust crate on a checkout builds in that checkout's target
    // directory, where building Warden compiled the built-in plugins: the
    // guest SDK's dependencies for wasm32-wasip2 (same lock file, same
    // `guest` profile) are reused, and the first build compiles little more
    // than the crate.
    if args.lang == Lang::Rust
        && let Some(root) = &checkout
        && root.join("target").is_dir()
    {
        files.push((
            ".cargo/config.toml".into(),
            shared_target(&root.join("target")),
        ));
    }
    for (path, text) in &files {
        let path = dir.join(path);
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create `{}`", d.display()))?;
        }
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
    }
    // The checkout's lock file: the crate builds with the versions Warden is
    // tested with, and a shared target directory reuses their builds.
    if let Some(root) = &checkout
        && root.join("Cargo.lock").is_file()
    {
        std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))
            .with_context(|| format!("cannot copy `{}`", root.join("Cargo.lock").display()))?;
    }
    if ctx.json {
        println!(
            "{}",
            json!({
                "dir": dir,
                "name": args.name,
                "kind": args.kind.as_str(),
                "lang": args.lang.as_str(),
                "files": files.iter().map(|(p, _)| p).collect::<Vec<_>>(),
                "warden": checkout,
            })
        );
    } else {
        println!(
            "created {} {} plugin `{}` in {}",
            args.lang.as_str(),
            args.kind.as_str(),
            args.name,
            dir.display()
        );
        for (path, _) in &files {
            println!("  {path}");
        }
        // Every hint after the `cd` runs inside the crate.
        let shown = relative(&cwd, &dir);
        println!("next:");
        println!("  cd {}", shown.display());
        if args.lang == Lang::Js {
            println!("  npm ci                        # the build tools package.json pins");
        }
        println!("  warden plugin build           # component + sha256 into plugin.toml");
        println!(
            "  warden plugin test            # tests/*.toml against the component, in the sandbox"
        );
        if args.lang == Lang::Rust {
            println!("  cargo test                    # the native unit tests");
        }
        println!("  warden plugin inspect plugin.toml");
    }
    Ok(())
}

pub(crate) async fn build(args: BuildArgs, ctx: &Context) -> anyhow::Result<()> {
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("cannot read plugin crate `{}`", args.dir.display()))?;
    let manifest_path = dir.join("plugin.toml");
    let manifest = Manifest::load(&manifest_path)?;
    let wasm = if dir.join("Cargo.toml").is_file() {
        build_rust(&dir).await?
    } else if dir.join(python::APP).is_file() {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || python::build(&dir))
            .await
            .context("the build task panicked")??
    } else if js::app(&dir).is_some() {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || js::build(&dir))
            .await
            .context("the build task panicked")??
    } else {
        return Err(CliError::new(
            "usage",
            format!(
                "`{}` has neither a Cargo.toml (Rust), an {} (Python) nor an {} (JavaScript): \
                 not a plugin to build",
                dir.display(),
                python::APP,
                js::APPS.join(" or ")
            ),
        )
        .into());
    };
    let sha256 = hex::encode(Sha256::digest(&wasm));
    let file_name = format!("{}.wasm", manifest.name);
    let dest = dir.join(&file_name);
    std::fs::write(&dest, &wasm).with_context(|| format!("cannot write `{}`", dest.display()))?;
    pin_manifest(&manifest_path, &dir, &file_name, &sha256)?;
    if ctx.json {
        println!(
            "{}",
            json!({
                "plugin": manifest.name,
                "component": dest,
                "sha256": sha256,
                "bytes": wasm.len(),
                "manifest": manifest_path,
            })
        );
    } else {
        println!(
            "built {} ({} bytes), sha256 {sha256}",
            dest.display(),
            wasm.len()
        );
        println!("pinned in {}", manifest_path.display());
    }
    Ok(())
}

/// The component of the Rust crate in `dir`, built for wasm32-wasip2.
async fn build_rust(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let built = tokio::task::spawn_blocking({
        let dir = dir.to_owned();
        move || {
            warden_build_support::GuestBuild::new()
                .manifest_path(dir.join("Cargo.toml"))
                .emit_rerun_if_changed(false)
                .build()
        }
    })
    .await
    .context("the build task panicked")?
    .map_err(|e| {
        CliError::new(
            "build_failed",
            format!("cannot build `{}`: {e}", dir.display()),
        )
        .with_details(json!({ "dir": dir }))
    })?;
    let component = built.first().ok_or_else(|| {
        CliError::new(
            "build_failed",
            format!("building `{}` produced no component", dir.display()),
        )
    })?;
    std::fs::read(&component.path)
        .with_context(|| format!("cannot read `{}`", component.path.display()))
}

/// Writes `component` and `sha256` into the manifest at `manifest_path`,
/// checking first that the edited file still parses and pins what was built.
fn pin_manifest(
    manifest_path: &Path,
    dir: &Path,
    file_name: &str,
    sha256: &str,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(manifest_path)
        .with_context(|| format!("cannot read `{}`", manifest_path.display()))?;
    let pinned = pin(&text, file_name, sha256);
    // Check before replacing: the edited file must still be a manifest, and
    // say what was just built.
    let staged = dir.join(".plugin.toml.pinning");
    std::fs::write(&staged, &pinned)
        .with_context(|| format!("cannot write `{}`", staged.display()))?;
    let reread = Manifest::load(&staged);
    let refuse = |message: String| {
        let _ = std::fs::remove_file(&staged);
        anyhow::Error::from(CliError::new("manifest_invalid", message))
    };
    match reread {
        Err(e) => {
            return Err(refuse(format!(
                "cannot pin `{}`: the edited manifest does not parse: {e}",
                manifest_path.display()
            )));
        }
        Ok(m) if m.sha256.as_deref() != Some(sha256) => {
            return Err(refuse(format!(
                "cannot pin `{}`: its `sha256` is not a top-level key this command can rewrite",
                manifest_path.display()
            )));
        }
        Ok(_) => {}
    }
    std::fs::rename(&staged, manifest_path)
        .with_context(|| format!("cannot write `{}`", manifest_path.display()))?;
    Ok(())
}

/// `text` (a manifest) with its top-level `component` and `sha256` set:
/// existing lines are replaced in place, missing ones inserted before the
/// first table header. Everything else, comments included, is kept.
fn pin(text: &str, component: &str, sha256: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let first_table = lines
        .iter()
        .position(|l| l.trim_start().starts_with('['))
        .unwrap_or(lines.len());
    let set = |key: &str, value: &str, lines: &mut Vec<String>, end: &mut usize| {
        let line = format!("{key} = \"{value}\"");
        let found = lines[..*end].iter().position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        });
        match found {
            Some(i) => lines[i] = line,
            None => {
                let mut at = *end;
                while at > 0 && lines[at - 1].trim().is_empty() {
                    at -= 1;
                }
                lines.insert(at, line);
                *end += 1;
            }
        }
    };
    let mut end = first_table;
    set("component", component, &mut lines, &mut end);
    set("sha256", sha256, &mut lines, &mut end);
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// The cargo configuration pointing a new crate's builds at `target`.
fn shared_target(target: &Path) -> String {
    format!(
        "# Builds share the target directory of the Warden checkout this crate\n\
         # depends on: building Warden compiled the guest SDK's dependencies\n\
         # there (the built-in plugins), with the lock file copied here, so the\n\
         # first build reuses them. Remove this file for a target/ of its own.\n\
         [build]\n\
         target-dir = {}\n",
        toml::Value::String(target.to_string_lossy().into_owned())
    )
}

/// The files of a new plugin crate, as (path, text).
fn files(name: &str, kind: Kind, dependency: &Dependency) -> Vec<(String, String)> {
    let ident = name.replace('-', "_");
    let cargo = CARGO_TOML
        .replace("{name}", name)
        .replace("{sdk}", &dependency.sdk())
        .replace("{host}", &dependency.host())
        .replace(
            "{dependency_note}",
            "# A path into a Warden checkout (`warden plugin new --warden-path` picks another).",
        );
    let (lib, tests, manifest_extra, description): (_, &[(&str, &str)], _, _) = match kind {
        Kind::Tool => (
            TOOL_LIB,
            TOOL_CASES,
            TOOL_MANIFEST_EXTRA,
            "An example tool plugin",
        ),
        Kind::Context => (
            CONTEXT_LIB,
            &[("tests/context.toml", CONTEXT_TEST)],
            "",
            "An example context source",
        ),
        Kind::Channel => (
            CHANNEL_LIB,
            &[("tests/channel.toml", CHANNEL_TEST)],
            "\n[mounts.outbox]                     # seen by the component at /outbox\naccess = \"read-write\"\ndescription = \"The directory deliveries are written to\"\n",
            "An example channel",
        ),
        Kind::Policy => (
            POLICY_LIB,
            &[("tests/policy.toml", POLICY_TEST)],
            "",
            "An example policy",
        ),
    };
    let manifest = MANIFEST
        .replace("{name}", name)
        .replace("{kind}", kind.as_str())
        .replace("{description}", description)
        .replace("{extra}", manifest_extra);
    let fill = |t: &str| t.replace("{name}", name).replace("{ident}", &ident);
    let mut files = vec![
        ("Cargo.toml".into(), cargo),
        ("plugin.toml".into(), manifest),
        ("src/lib.rs".into(), fill(lib)),
    ];
    files.extend(tests.iter().map(|(p, t)| ((*p).to_owned(), fill(t))));
    // The built `<name>.wasm` is what plugin.toml pins: it is kept with the
    // crate, not ignored.
    files.push((".gitignore".into(), "/target\n".into()));
    files
}

/// The test cases of a new tool plugin, the same files in every language:
/// what the example tools do (`tool.toml`), and the sandbox's contract
/// (`sandbox.toml`: denials outside a mount and on a read-only one, a
/// variable and a host not granted, the fuel, memory, time and output
/// limits), so that a plugin of each language runs one case set and the
/// SDKs cannot drift apart.
pub(crate) const TOOL_CASES: &[(&str, &str)] = &[
    ("tests/tool.toml", include_str!("scaffold/cases/tool.toml")),
    (
        "tests/sandbox.toml",
        include_str!("scaffold/cases/sandbox.toml"),
    ),
];

/// What a tool's manifest requests in every language: the two mounts, the
/// variable and (none) the hosts the example tools and the cases use.
pub(crate) const TOOL_MANIFEST_EXTRA: &str = r##"env = ["GREETER_TOKEN"]                 # granted or not by the operator; `has_env` looks
hosts = []                              # outbound hosts asked for, e.g. "api.example.com"

[mounts.docs]                           # seen by the component at /docs
access = "read-only"
description = "The text files `count_lines` reads"

[mounts.notes]                          # seen by the component at /notes
access = "read-write"
description = "Where `save_note` writes"
"##;

const CARGO_TOML: &str = r##"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the WebAssembly component; rlib: native unit tests.
crate-type = ["cdylib", "rlib"]

{dependency_note}
[dependencies]
warden-guest = {sdk}
serde = { version = "1", features = ["derive"] }
serde_json = "1"
schemars = "1"

[dev-dependencies]
tempfile = "3"

# The component is tested by `warden plugin test` (tests/*.toml), which
# needs no Rust dependency on Warden. For assertions in Rust against the
# real sandbox, add Warden's testkit (it compiles wasmtime and Warden: minutes
# the first time) and write tests/sandbox.rs with `warden::testkit`:
#   warden = {host}
#   tokio = { version = "1", features = ["macros", "rt-multi-thread"] }

# A workspace of its own, even when created inside another one.
[workspace]

# The profile `warden plugin build` (and the testkit) build the component with.
[profile.guest]
inherits = "release"
opt-level = "s"
lto = true
codegen-units = 1
debug = false
strip = "debuginfo"
"##;

const MANIFEST: &str = r##"name = "{name}"
version = "0.1.0"
kind = "{kind}"
description = "{description}"
# `warden plugin build` writes `component` and `sha256` here.
{extra}
[limits]
fuel = 1_000_000_000
memory = "32MiB"
timeout = "5s"
output = "256KiB"
stdio = "16KiB"
"##;

const TOOL_LIB: &str = r##"//! `{name}`: a Warden tool plugin with example tools.
//!
//! Each tool is a typed function: its argument type derives `Deserialize`
//! and `JsonSchema` (the schema the model sees), its output is any
//! `Serialize` value. Arguments that do not fit are refused before the
//! function runs, naming the field.
//!
//! Each example tool shows one thing the sandbox grants or limits: config,
//! the files of a mount (read-only and read-write), an environment variable,
//! outbound HTTP, CPU time and memory, and the size of an answer.
#![forbid(unsafe_code)]

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_guest::{Call, Effect, Tool, ToolError, ToolPlugin, Toolbox, fs, http};

/// Arguments of `greet`. Doc comments become the schema's descriptions.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GreetArgs {
    /// Who to greet.
    pub name: String,
}

/// What `greet` returns.
#[derive(Serialize)]
pub struct Greeting {
    /// The greeting.
    pub text: String,
}

/// Greets someone, with the operator's config value `salutation` (default
/// `hello`).
pub fn greet(args: GreetArgs, _call: &Call) -> Result<Greeting, ToolError> {
    if args.name.trim().is_empty() {
        return Err(ToolError::invalid_arguments("`name` is empty"));
    }
    let salutation = warden_guest::config("salutation").unwrap_or_else(|| "hello".into());
    Ok(Greeting {
        text: format!("{salutation}, {}", args.name),
    })
}

/// Arguments of `count_lines`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    /// A file, relative to the docs mount.
    pub path: String,
}

/// Counts the lines of a text file in the `docs` mount (`/docs`).
pub fn count_lines(args: PathArgs, _call: &Call) -> Result<Value, ToolError> {
    // `read_to_string` refuses absolute paths and `..` as `denied` before
    // opening anything, and turns a file error into a typed tool error.
    let text = fs::read_to_string("docs", &args.path)?;
    Ok(json!({ "path": args.path, "lines": text.lines().count() }))
}

/// Arguments of `save_note`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteArgs {
    /// A file, relative to the notes mount.
    pub path: String,
    /// What to write.
    pub text: String,
}

/// Writes a note into the `notes` mount (`/notes`).
pub fn save_note(args: NoteArgs, _call: &Call) -> Result<Value, ToolError> {
    let full = fs::in_mount("notes", &args.path)?;
    // On a mount the operator granted read-only, the sandbox refuses the
    // write; `file_error` makes that a `denied` tool error.
    std::fs::write(&full, &args.text).map_err(|e| fs::file_error(&e, &args.path))?;
    Ok(json!({ "path": args.path, "bytes": args.text.len() }))
}

/// Arguments of `fetch_status`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UrlArgs {
    /// An http or https URL.
    pub url: String,
}

/// Requests a URL and returns its HTTP status.
pub fn fetch_status(args: UrlArgs, _call: &Call) -> Result<Value, ToolError> {
    // A host the operator did not grant is refused before anything is sent
    // (`HttpError::Denied`), and the call's receipt counts the denial.
    let response = http::send(&http::Request::get(&args.url))
        .map_err(|e| ToolError::failed(format!("cannot fetch {}: {e}", args.url)))?;
    Ok(json!({ "url": args.url, "status": response.status }))
}

/// Arguments of `has_env`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvArgs {
    /// An environment variable's name.
    pub name: String,
}

/// Says whether an environment variable is visible (only those the
/// operator grants are).
pub fn has_env(args: EnvArgs, _call: &Call) -> Result<Value, ToolError> {
    let visible = std::env::var_os(&args.name).is_some();
    Ok(json!({ "name": args.name, "visible": visible }))
}

/// Arguments of `count_primes`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrimesArgs {
    /// Count the primes below this.
    pub below: u64,
}

/// Counts the primes below a number, by trial division: CPU time to spend.
pub fn count_primes(args: PrimesArgs, _call: &Call) -> Result<Value, ToolError> {
    let is_prime = |n: u64| (2..).take_while(|d| d * d <= n).all(|d| n % d != 0);
    let primes = (2..args.below).filter(|n| is_prime(*n)).count();
    Ok(json!({ "below": args.below, "primes": primes }))
}

/// Arguments of `repeat`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepeatArgs {
    /// The text to repeat.
    pub text: String,
    /// How many times.
    pub times: usize,
}

/// Returns the text repeated: memory to take, and an answer to make big.
pub fn repeat(args: RepeatArgs, _call: &Call) -> Result<Value, ToolError> {
    Ok(json!({ "text": args.text.repeat(args.times) }))
}

/// The plugin as the component exports it.
pub struct Plugin;

impl ToolPlugin for Plugin {
    fn toolbox() -> Toolbox {
        // `read`: safe to repeat. A tool with side effects is `idempotent`
        // (safe to repeat with `call.idempotency_key`) or `write` (never
        // twice; give it a preview with `.with_preflight`).
        Toolbox::new()
            .tool(Tool::new("greet", "Greets someone by name", Effect::Read, greet))
            .tool(Tool::new(
                "count_lines",
                "Counts the lines of a text file in the docs mount",
                Effect::Read,
                count_lines,
            ))
            .tool(Tool::new(
                "save_note",
                "Writes a note into the notes mount",
                Effect::Write,
                save_note,
            ))
            .tool(Tool::new(
                "fetch_status",
                "Requests a URL and returns its HTTP status",
                Effect::Read,
                fetch_status,
            ))
            .tool(Tool::new(
                "has_env",
                "Says whether an environment variable is visible (only those the operator grants are)",
                Effect::Read,
                has_env,
            ))
            .tool(Tool::new(
                "count_primes",
                "Counts the primes below a number, by trial division: CPU time to spend",
                Effect::Read,
                count_primes,
            ))
            .tool(Tool::new(
                "repeat",
                "Returns the text repeated: memory to take, and an answer to make big",
                Effect::Read,
                repeat,
            ))
    }
}

warden_guest::export_tool_plugin!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use warden_guest::testing;

    #[test]
    fn greets_with_the_configured_salutation() {
        testing::set_config("salutation", "ahoy");
        let out = Plugin::toolbox()
            .invoke(&testing::call("greet", json!({ "name": "ada" })))
            .unwrap();
        assert_eq!(out.content, r#"{"text":"ahoy, ada"}"#);
    }

    #[test]
    fn refuses_an_empty_name() {
        let err = Plugin::toolbox()
            .invoke(&testing::call("greet", json!({ "name": " " })))
            .unwrap_err();
        assert_eq!(err.message(), "`name` is empty");
    }

    #[test]
    fn counts_the_primes_below_a_number() {
        let out = Plugin::toolbox()
            .invoke(&testing::call("count_primes", json!({ "below": 100 })))
            .unwrap();
        assert_eq!(out.content, r#"{"below":100,"primes":25}"#);
    }
}
"##;

const CONTEXT_LIB: &str = r##"//! `{name}`: a Warden context source. It answers every request with one
//! item: the operator's config value `note` (default: a placeholder), so
//! the model sees it as quoted, non-authoritative context.
//!
//! A query may be blank or a JSON object `{"upper": true}`.
#![forbid(unsafe_code)]

use serde::Deserialize;
use warden_guest::{ContextError, ContextItem, ContextPlugin, ContextRequest, SourceSpec};

/// What a request may ask.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Upper-case the note.
    #[serde(default)]
    pub upper: bool,
}

/// The items for `request`.
pub fn items(request: &ContextRequest) -> Result<Vec<ContextItem>, ContextError> {
    let query: Query = request.query_as()?;
    let note = warden_guest::config("note").unwrap_or_else(|| "nothing noted yet".into());
    let content = if query.upper { note.to_uppercase() } else { note };
    Ok(vec![ContextItem::new("note", content)])
}

/// The plugin as the component exports it.
pub struct Plugin;

impl ContextPlugin for Plugin {
    fn describe() -> SourceSpec {
        SourceSpec::new("{name}", "The operator's note")
    }

    fn resolve(request: ContextRequest) -> Result<Vec<ContextItem>, ContextError> {
        items(&request)
    }
}

warden_guest::export_context_plugin!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use warden_guest::testing;

    #[test]
    fn the_note_is_one_item() {
        testing::set_config("note", "deploys freeze on friday");
        let items = items(&testing::request(r#"{"upper": true}"#)).unwrap();
        assert_eq!(items[0].source, "note");
        assert_eq!(items[0].content, "DEPLOYS FREEZE ON FRIDAY");
    }

    #[test]
    fn a_bad_query_names_the_field() {
        let err = items(&testing::request(r#"{"lower": 1}"#)).unwrap_err();
        assert!(err.message().contains("lower"), "{}", err.message());
    }
}
"##;

const CONTEXT_TEST: &str = r##"# Test cases for `warden plugin test`: each runs the built component in the
# real sandbox, in a fresh instance, under the grant and limits it writes.
# The format: docs/writing-plugins.md#test-cases in Warden's repository.

[[case]]
name = "the note is one item"
resolve = { upper = true }
config = { note = "hello from the operator" }
expect.output_includes = [{ source = "note", content = "HELLO FROM THE OPERATOR" }]

[[case]]
name = "a bad query names the field"
resolve = { lower = 1 }
expect = { error = "invalid_request", message = "lower" }
"##;

const CHANNEL_LIB: &str = r##"//! `{name}`: a Warden channel. Each delivery is written as one JSON file,
//! `<delivery id>.json`, into the read-write mount `outbox` (seen at
//! `/outbox`).
#![forbid(unsafe_code)]

use std::path::Path;

use warden_guest::{ChannelPlugin, Delivery, DeliveryError, SourceSpec};

/// Writes `delivery` into `root`.
pub fn write(root: &Path, delivery: &Delivery) -> Result<(), DeliveryError> {
    if delivery.id.is_empty()
        || !delivery
            .id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(DeliveryError::invalid_delivery(format!(
            "delivery id `{}` cannot name a file",
            delivery.id
        )));
    }
    let payload: serde_json::Value = delivery.payload_as()?;
    let body = serde_json::json!({ "kind": delivery.kind, "run_id": delivery.run_id, "payload": payload });
    std::fs::write(root.join(format!("{}.json", delivery.id)), body.to_string()).map_err(|e| {
        let message = format!("cannot write delivery `{}`: {e}", delivery.id);
        match e.kind() {
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                DeliveryError::denied(message)
            }
            _ => DeliveryError::retryable(message),
        }
    })
}

/// The plugin as the component exports it.
pub struct Plugin;

impl ChannelPlugin for Plugin {
    fn describe() -> SourceSpec {
        SourceSpec::new("{name}", "Writes each delivery as a JSON file")
    }

    fn deliver(delivery: Delivery) -> Result<(), DeliveryError> {
        write(Path::new("/outbox"), &delivery)
    }
}

warden_guest::export_channel_plugin!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use warden_guest::testing;

    #[test]
    fn each_delivery_is_one_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &testing::delivery("completed", json!({ "summary": "done" }))).unwrap();
        let text = std::fs::read_to_string(dir.path().join("test-delivery.json")).unwrap();
        assert!(text.contains(r#""summary":"done""#), "{text}");
    }
}
"##;

const CHANNEL_TEST: &str = r##"# Test cases for `warden plugin test`: each runs the built component in the
# real sandbox, in a fresh instance, under the grant and limits it writes.
# The format: docs/writing-plugins.md#test-cases in Warden's repository.

# Each case's mounts are fresh temporary directories; `expect.files` looks
# at them after the call, as MOUNT/PATH.

[[case]]
name = "a delivery is one file in the outbox"
deliver = "completed"
payload = { summary = "done" }
mounts.outbox = {}
expect.files = { "outbox/test-delivery.json" = { contains = '"summary":"done"' } }

[[case]]
name = "a read-only outbox is a denial"
deliver = "completed"
mounts.outbox = { access = "read-only" }
expect.denied = true
expect.files = { "outbox/test-delivery.json" = { absent = true } }
"##;

const POLICY_LIB: &str = r##"//! `{name}`: a Warden policy. At `before_tool_call` it denies the tools the
//! operator lists in the config value `deny` (comma-separated model names,
//! `<plugin>__<tool>`, such as `fs__write_file`); the model sees the reason as
//! the call's result, and the tool never runs. Everything else is allowed.
//!
//! An agent enables it with `[policies.{name}] plugin = "{name}"`. If it
//! errors, panics or runs out of fuel, memory or time, the run fails: policies
//! fail closed.
#![forbid(unsafe_code)]

use warden_guest::{Decision, PolicyError, PolicyPlugin, PolicyRequest, SourceSpec, Subject};

/// Whether `tool` is one of the comma-separated names in `denied`.
pub fn is_denied(tool: &str, denied: &str) -> bool {
    denied.split(',').any(|name| name.trim() == tool)
}

/// The decision for `request`.
pub fn decide(request: &PolicyRequest) -> Result<Decision, PolicyError> {
    match request.subject()? {
        Subject::BeforeToolCall { tool, .. } => {
            let denied = warden_guest::config("deny").unwrap_or_default();
            if is_denied(&tool, &denied) {
                return Ok(Decision::deny(format!(
                    "tool `{tool}` is denied by policy `{}`",
                    request.policy
                )));
            }
            Ok(Decision::Allow)
        }
        // `run_start`, `after_response`, `before_finish`. At `before_finish` a
        // policy may also answer `Decision::feedback(..)`: the model gets the
        // message and is asked again (anywhere else feedback is a failure).
        _ => Ok(Decision::Allow),
    }
}

/// The plugin as the component exports it.
pub struct Plugin;

impl PolicyPlugin for Plugin {
    fn describe() -> SourceSpec {
        SourceSpec::new("{name}", "Denies the tools the operator lists in `deny`")
    }

    fn decide(request: PolicyRequest) -> Result<Decision, PolicyError> {
        decide(&request)
    }
}

warden_guest::export_policy_plugin!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use warden_guest::testing;

    fn tool_call(tool: &str) -> PolicyRequest {
        testing::policy_request(json!({
            "hook": "before_tool_call",
            "call_id": "call-1-1",
            "tool": tool,
            "arguments": { "path": "notes.md" },
            "effect": "write",
        }))
    }

    #[test]
    fn denies_the_configured_tools_only() {
        testing::set_config("deny", "fs__write_file, fs__delete");
        assert_eq!(
            decide(&tool_call("fs__write_file")).unwrap(),
            Decision::deny("tool `fs__write_file` is denied by policy `test-policy`")
        );
        assert_eq!(decide(&tool_call("fs__read_file")).unwrap(), Decision::Allow);
        let finish = testing::policy_request(json!({
            "hook": "before_finish", "step": 1, "output": "done",
        }));
        assert_eq!(decide(&finish).unwrap(), Decision::Allow);
    }

    #[test]
    fn a_bad_subject_names_the_field() {
        let err = decide(&testing::policy_request(json!({
            "hook": "before_tool_call", "call_id": "call-1-1", "arguments": {},
        })))
        .unwrap_err();
        assert!(err.message().contains("missing field `tool`"), "{}", err.message());
    }
}
"##;

const POLICY_TEST: &str = r##"# Test cases for `warden plugin test`: each runs the built component in the
# real sandbox, in a fresh instance, under the grant and limits it writes.
# The format: docs/writing-plugins.md#test-cases in Warden's repository.

[defaults]
config = { deny = "fs__write_file" }

[[case]]
name = "a configured tool is denied"
decide = "before_tool_call"
subject = { call_id = "call-1-1", tool = "fs__write_file", arguments = { path = "notes.md" } }
expect = { denied = true, message = "tool `fs__write_file` is denied by policy `{name}`" }

[[case]]
name = "another tool is allowed"
decide = "before_tool_call"
subject = { call_id = "call-1-1", tool = "fs__read_file", arguments = { path = "notes.md" } }
expect.output = { decision = "allow" }

[[case]]
name = "the end of a run is allowed"
decide = "before_finish"
subject = { step = 1, output = "done" }
expect.output = { decision = "allow" }
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_replaces_or_inserts_top_level_keys_and_keeps_the_rest() {
        let text = "name = \"p\"\n# keep me\nkind = \"tool\"\n\n[limits]\nfuel = 1\n";
        let once = pin(text, "p.wasm", "aa");
        assert_eq!(
            once,
            "name = \"p\"\n# keep me\nkind = \"tool\"\ncomponent = \"p.wasm\"\nsha256 = \"aa\"\n\n[limits]\nfuel = 1\n"
        );
        let twice = pin(&once, "p.wasm", "bb");
        assert_eq!(twice, once.replace("\"aa\"", "\"bb\""));
        assert_eq!(
            pin("name = \"p\"\n", "p.wasm", "cc"),
            "name = \"p\"\ncomponent = \"p.wasm\"\nsha256 = \"cc\"\n"
        );
    }

    #[test]
    fn paths_are_written_relative() {
        assert_eq!(
            relative(Path::new("/a/b/target/tmp/x"), Path::new("/a/b")),
            PathBuf::from("../../..")
        );
        assert_eq!(
            relative(Path::new("/a/b"), Path::new("/a/c/d")),
            PathBuf::from("../c/d")
        );
    }

    #[test]
    fn every_kind_has_a_manifest_that_parses() {
        for kind in [Kind::Tool, Kind::Context, Kind::Channel, Kind::Policy] {
            let files = files("my-plugin", kind, &Dependency("..".into()));
            let manifest = &files.iter().find(|(p, _)| p == "plugin.toml").unwrap().1;
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("plugin.toml"), manifest).unwrap();
            let m = Manifest::load(&dir.path().join("plugin.toml")).unwrap();
            assert_eq!(m.name, "my-plugin");
            assert_eq!(m.kind.to_string(), kind.as_str());
            let cargo = &files.iter().find(|(p, _)| p == "Cargo.toml").unwrap().1;
            let parsed: toml::Table = toml::from_str(cargo).unwrap();
            assert_eq!(parsed["package"]["name"].as_str(), Some("my-plugin"));
        }
    }
}
