//! The engine's top-level modules depend on each other one way only, in the
//! order [`ENGINE_LAYERS`] declares: identifiers, the recorded vocabulary
//! (events and the payload types below them), the agent file, the folded
//! state, deciding, replay, then the runtime. Cargo only enforces this
//! between crates; inside one crate any module may name any other, so the
//! order is checked here from the source.
//!
//! A module "names" another when its code (comments and its `#[cfg(test)]
//! mod tests` left out) has a path through the crate root to it:
//! `crate::m`, `super::m` from a top-level file, `super::super::m` one
//! level down, and every item of a `use crate::{...}` group.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The engine's top-level modules, lowest first: each may name only the
/// modules before it.
const ENGINE_LAYERS: &[&str] = &[
    // Identifiers, digests and the run's status.
    "canonical",
    "ids",
    "request_hash",
    "status",
    "schema",
    "tool_errors",
    "keys",
    "start",
    "witness",
    // Settings and payloads the events carry.
    "refusal",
    "output",
    "compaction",
    "ceilings",
    "budget",
    "policy_hooks",
    // The log's vocabulary.
    "events",
    "approvals",
    "batch",
    "retry",
    "context",
    "channels",
    "mcp_servers",
    // The agent file (plans and agents called as tools are part of it).
    "agent",
    // The run folded from its log, and the agent as deciding sees it.
    "state",
    "view",
    "prompt",
    "approval_prompt",
    // Deciding, then checking a log against what deciding would do.
    "decide",
    "replay",
    // Effects: policy plugins, the runtime and its verbs, workers.
    "policy_plugin",
    "runtime",
    "turn",
    "worker",
    "codes",
];

/// Files that are not part of the layered code: the crate root, the
/// engine's own test module and its data.
const NOT_LAYERED: &[&str] = &["lib", "tests", "testdata"];

fn engine_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/engine/src")
}

/// Every `.rs` file under `dir`, with its module path relative to `src`.
fn sources(src: &Path, dir: &Path, out: &mut Vec<(Vec<String>, PathBuf)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let module: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push((module, path));
        }
    }
}

/// `text` without comments and without a trailing `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..cut]
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .map(|line| match line.find(" // ") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first identifiers of the top-level items of the group that opens
/// `text` right after its `{`.
fn group_heads(text: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut start = true;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && (c.is_alphanumeric() || c == '_') => {
                heads.push(ident_at(&text[at..]));
                start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The top-level modules `code`, in the module at `path` (from the crate
/// root, e.g. `["runtime", "fork"]`), names through the crate root.
fn named_modules(path: &[String], code: &str) -> BTreeSet<String> {
    // From a module `path.len()` levels down, that many `super::` reach the
    // crate root.
    let to_root = "super::".repeat(path.len());
    let mut named = BTreeSet::new();
    for prefix in ["crate::", to_root.as_str()] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + prefix.len()..];
            // `super::super::x` must not be read as `super::x` too.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                named.extend(group_heads(group).into_iter().map(str::to_owned));
            } else {
                named.insert(ident_at(rest).to_owned());
            }
        }
    }
    named
}

/// Each top-level module and the top-level modules it names.
fn engine_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = engine_src();
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in files {
        let top = module[0].clone();
        if NOT_LAYERED.contains(&top.as_str()) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let named = named_modules(&module, &code);
        let entry = graph.entry(top.clone()).or_default();
        entry.extend(named.into_iter().filter(|m| *m != top));
    }
    graph
}

/// The references in `graph` that go up or sideways in [`ENGINE_LAYERS`].
fn upward(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let rank = |m: &str| ENGINE_LAYERS.iter().position(|l| *l == m);
    let mut found = BTreeSet::new();
    for (module, named) in graph {
        let Some(own) = rank(module) else {
            found.insert(format!("`{module}` is not in ENGINE_LAYERS: place it"));
            continue;
        };
        for other in named {
            match rank(other) {
                Some(theirs) if theirs < own => {}
                Some(_) => {
                    found.insert(format!("`{module}` names `{other}`, above it"));
                }
                // Not a module: a crate-root item such as a macro.
                None if !graph.contains_key(other) => {}
                None => {
                    found.insert(format!("`{other}` is not in ENGINE_LAYERS: place it"));
                }
            }
        }
    }
    found
}

#[test]
fn every_engine_module_names_only_the_modules_below_it() {
    let graph = engine_graph();
    let mut found: Vec<String> = ENGINE_LAYERS
        .iter()
        .filter(|layer| !graph.contains_key(**layer))
        .map(|layer| format!("ENGINE_LAYERS lists `{layer}`, which host/engine/src does not have"))
        .collect();
    found.extend(upward(&graph));
    assert!(
        found.is_empty(),
        "the engine's modules must depend one way (see ARCHITECTURE.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_module_check_sees_every_form_of_path() {
    let top = |m: &str| vec![m.to_owned()];
    let fork = ["runtime".to_owned(), "fork".to_owned()];
    let code = code_of(
        "use super::events::Event;\n\
         use crate::{state::{RunState, fold}, decide};\n\
         // use super::replay::replay;\n\
         fn f() { super::prompt::build(); } // crate::runtime\n\
         #[cfg(test)]\nmod tests { use super::runtime::Runtime; }\n",
    );
    assert_eq!(
        named_modules(&top("view"), &code),
        ["decide", "events", "prompt", "state"]
            .map(str::to_owned)
            .into()
    );
    // One level down, `super::` is the parent module, not the root.
    assert_eq!(
        named_modules(&fork, "use super::Runtime;\nuse super::super::ids::RunId;"),
        ["ids"].map(str::to_owned).into()
    );
    let mut graph = BTreeMap::new();
    graph.insert("events".to_owned(), ["decide".to_owned()].into());
    graph.insert("decide".to_owned(), ["events".to_owned()].into());
    assert_eq!(
        upward(&graph),
        ["`events` names `decide`, above it".to_owned()].into()
    );
}
