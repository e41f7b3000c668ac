//! The `--json` contract (docs/json-output.md) on the real binary, store
//! and plugins: every line each command prints with `--json` is one of the
//! documented shapes (an event line, a run summary, an error envelope,
//! each with `v`), the same in every command; and the documented error
//! codes are exactly those the code can report, so a new code cannot go
//! undocumented.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{STATUSES, demo, stderr, stdout, warden};
use serde_json::Value;

/// The documented shapes.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Shape {
    Event,
    Summary,
    Error,
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
    names.iter().copied().collect()
}

/// `{"code", "message", "details"}`, as in an envelope and a failed run.
fn check_error(e: &Value) {
    assert_eq!(keys(e), set(&["code", "message", "details"]), "{e}");
    let code = e["code"].as_str().unwrap();
    assert!(is_code(code), "{e}");
    assert!(e["message"].is_string(), "{e}");
    assert!(e["details"].is_object(), "{e}");
}

/// `{"v", "run_id", "status", "next", "output"?, "error"?}`; with `extra`,
/// the fields `runs show` adds may be there too.
fn check_summary(line: &Value, extra: bool) {
    let k = keys(line);
    for field in ["v", "run_id", "status", "next"] {
        assert!(k.contains(field), "no `{field}`: {line}");
    }
    if !extra {
        assert!(
            k.is_subset(&set(&[
                "v", "run_id", "status", "next", "output", "error", "session"
            ])),
            "{line}"
        );
    }
    let status = line["status"].as_str().unwrap();
    assert!(STATUSES.contains(&status), "{line}");
    for step in line["next"].as_array().unwrap() {
        assert_eq!(keys(step), set(&["action", "command"]), "{line}");
        assert!(
            step["command"].as_str().unwrap().starts_with("warden "),
            "{line}"
        );
    }
    assert_eq!(k.contains("error"), status == "failed", "{line}");
    if let Some(e) = line.get("error") {
        check_error(e);
    }
}

/// Which shape `line` is, checking every field it must have.
fn shape(line: &Value) -> Shape {
    assert_eq!(line["v"], 1, "no version: {line}");
    let k = keys(line);
    if k == set(&["v", "seq", "event"]) {
        assert!(line["seq"].as_u64().unwrap() >= 1, "{line}");
        assert!(line["event"]["type"].is_string(), "{line}");
        return Shape::Event;
    }
    if k == set(&["v", "error"]) {
        check_error(&line["error"]);
        return Shape::Error;
    }
    check_summary(line, false);
    Shape::Summary
}

/// The JSON lines of a command's stdout, each with its shape.
fn lines(out: &std::process::Output) -> Vec<(Shape, Value)> {
    let text = stdout(out);
    assert!(!text.is_empty(), "nothing on stdout: {}", stderr(out));
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not one JSON value per line ({e}): {l}"));
            (shape(&v), v)
        })
        .collect()
}

/// A driving command's lines: events with rising seqs, then one summary.
fn driven(out: &std::process::Output) -> Value {
    let lines = lines(out);
    let (last, events) = lines.split_last().unwrap();
    assert_eq!(last.0, Shape::Summary, "{lines:?}");
    let mut seq = 0;
    for (shape, line) in events {
        assert_eq!(*shape, Shape::Event, "{line}");
        let s = line["seq"].as_u64().unwrap();
        assert!(s > seq, "{lines:?}");
        seq = s;
    }
    last.1.clone()
}

fn error_of(out: &std::process::Output) -> Value {
    let lines = lines(out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, Shape::Error, "{lines:?}");
    lines[0].1["error"].clone()
}

#[test]
fn every_command_prints_the_documented_shapes() {
    let dir = demo();
    let d = dir.path();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "a", "--json"], d);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let parked = driven(&out);
    assert_eq!(parked["status"], "awaiting_approval");
    let actions: Vec<&str> = parked["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["approve", "deny"]);
    assert_eq!(
        parked["next"][0]["command"],
        "warden runs approve a call-3-1"
    );

    let out = warden(&["runs", "approve", "a", "call-3-1", "--json"], d);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = driven(&out);
    assert_eq!(done["status"], "completed");
    assert!(done["output"].is_string(), "{done}");
    assert_eq!(done["next"], serde_json::json!([]));

    // The log: the same event lines with or without --json, seq 1..n.
    let plain = warden(&["runs", "events", "a"], d);
    let json = warden(&["runs", "events", "a", "--json"], d);
    assert_eq!(stdout(&plain), stdout(&json));
    let events = lines(&json);
    assert!(events.iter().all(|(s, _)| *s == Shape::Event));
    let seqs: Vec<u64> = events
        .iter()
        .map(|(_, l)| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // `runs show`: a run summary with more fields, its events as lines.
    let shown: Value =
        serde_json::from_str(&stdout(&warden(&["runs", "show", "a", "--json"], d))).unwrap();
    assert_eq!(shown["v"], 1);
    check_summary(&shown, true);
    let embedded: Vec<Value> = shown["events"].as_array().unwrap().clone();
    assert_eq!(embedded.len(), events.len());
    for (line, (_, logged)) in embedded.iter().zip(&events) {
        assert_eq!(shape(line), Shape::Event);
        assert_eq!(line, logged);
    }

    // Recorded, not driven: a summary saying what drives it.
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            "q",
            "--detach",
            "--json",
        ],
        d,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let queued = driven(&out);
    assert_eq!(queued["status"], "queued");
    assert_eq!(queued["next"][0]["action"], "resume");
    let out = warden(&["runs", "cancel", "q", "--json"], d);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(driven(&out)["status"], "cancelled");
    let out = warden(&["run", "notes.toml", "go", "--run-id", "b", "--json"], d);
    assert_eq!(out.status.code(), Some(4));
    let out = warden(&["runs", "abandon", "b", "--reason", "no", "--json"], d);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(driven(&out)["status"], "abandoned");

    // Failures, from the command line's checks, the runtime, the store and
    // clap: one envelope each.
    for (args, code) in [
        (vec!["runs", "show", "nosuch", "--json"], "unknown_run"),
        (
            vec!["runs", "approve", "a", "call-3-1", "--json"],
            "run_terminal",
        ),
        (
            vec!["runs", "list", "--status", "sleeping", "--json"],
            "usage",
        ),
        (vec!["runs", "list", "--no-such-flag", "--json"], "usage"),
        (vec!["runs", "resume", "b", "--json"], "run_terminal"),
    ] {
        let out = warden(&args, d);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(error_of(&out)["code"], code, "{args:?}");
    }
}

#[test]
fn a_failed_run_says_why_in_its_summary() {
    let dir = demo();
    let d = dir.path();
    // A transcript that runs out after one turn: the second model call
    // fails for good, and so does the run.
    std::fs::write(
        d.join("short.transcript.toml"),
        "[[turns]]\ntext = \"Looking.\"\n[[turns.tool_calls]]\nname = \"fs__list_dir\"\n",
    )
    .unwrap();
    let agent = std::fs::read_to_string(d.join("notes.toml"))
        .unwrap()
        .replace("notes.transcript.toml", "short.transcript.toml");
    std::fs::write(d.join("short.toml"), agent).unwrap();
    let out = warden(&["run", "short.toml", "go", "--run-id", "f", "--json"], d);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let failed = driven(&out);
    assert_eq!(failed["status"], "failed");
    let error = &failed["error"];
    assert_eq!(error["code"], "model_call_failed", "{failed}");
    assert!(
        error["message"].as_str().unwrap().contains("step 2"),
        "{failed}"
    );
    let shown: Value =
        serde_json::from_str(&stdout(&warden(&["runs", "show", "f", "--json"], d))).unwrap();
    check_summary(&shown, true);
    assert_eq!(shown["error"], *error);
}

/// Every `.rs` file under a `src/` of the workspace (not `target/`, not
/// the tests).
fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&path, into);
            }
        } else if name.ends_with(".rs") && path.components().any(|c| c.as_os_str() == "src") {
            into.push(path);
        }
    }
}

/// The string literal at the start of `text` (after blanks), if any.
fn literal(text: &str) -> Option<&str> {
    let text = text.trim_start().strip_prefix('"')?;
    let end = text.find('"')?;
    Some(&text[..end])
}

fn is_code(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The error codes the code can report: each `CliError::new("code", …)`;
/// in the files that build those, each `("code", …)` a match arm or a
/// `Some(…)` returns (the classification of typed errors) and each
/// `code: "code"` of a report built by hand.
fn codes_in_code(workspace: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    sources(workspace, &mut files);
    let mut codes = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let cli = text.contains("CliError") || text.contains("ApiError");
        for (at, _) in text.match_indices('(') {
            let before = text[..at].trim_end();
            let Some(code) = literal(&text[at + 1..]) else {
                continue;
            };
            if before.ends_with("CliError::new") || before.ends_with("ApiError::new") {
                codes.insert(code.to_owned());
                continue;
            }
            let arm = before.ends_with("=>")
                || before.ends_with("Some(")
                || before
                    .strip_suffix('{')
                    .is_some_and(|b| b.trim_end().ends_with("=>"));
            let rest = text[at + 1..].trim_start();
            let then = rest[code.len() + 2..].trim_start();
            if cli && arm && is_code(code) && then.starts_with(',') {
                codes.insert(code.to_owned());
            }
        }
        // A typed error's own `code()`: every code literal its arms return.
        for (at, _) in text.match_indices("fn code(&self) -> &'static str {") {
            let body = &text[at..];
            let body = &body[..body.find("\n    }\n").unwrap_or(body.len())];
            for (arm, _) in body.match_indices("=> \"") {
                if let Some(code) = literal(&body[arm + 2..]).filter(|c| is_code(c)) {
                    codes.insert(code.to_owned());
                }
            }
        }
        if cli {
            for (at, _) in text.match_indices("code: \"") {
                if let Some(code) = literal(&text[at + "code: ".len()..]).filter(|c| is_code(c)) {
                    codes.insert(code.to_owned());
                }
            }
        }
    }
    codes
}

/// The kinds of `RunError` (a failed run's `error.code`): its variants in
/// snake_case.
fn run_error_kinds(workspace: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    sources(workspace, &mut files);
    let mut kinds = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let Some(at) = text.find("pub enum RunError {") else {
            continue;
        };
        let body = &text[at..];
        let body = &body[..body.find("\n}").unwrap()];
        for line in body.lines().skip(1) {
            // A variant: four spaces, then its name.
            let Some(rest) = line.strip_prefix("    ") else {
                continue;
            };
            if rest.starts_with(' ') || !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            let mut snake = String::new();
            for (i, c) in name.chars().enumerate() {
                if c.is_ascii_uppercase() {
                    if i > 0 {
                        snake.push('_');
                    }
                    snake.push(c.to_ascii_lowercase());
                } else {
                    snake.push(c);
                }
            }
            kinds.insert(snake);
        }
    }
    assert!(!kinds.is_empty(), "RunError not found");
    kinds
}

/// The codes in the first column of the table under `heading` in the
/// JSON page, each in backticks (several to a row allowed).
fn documented(page: &str, heading: &str) -> BTreeSet<String> {
    let at = page
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}` in docs/json-output.md"));
    let mut codes = BTreeSet::new();
    let mut seen_table = false;
    for line in page[at + heading.len()..].lines().skip(1) {
        if line.starts_with('#') {
            break;
        }
        let Some(row) = line.strip_prefix('|') else {
            if seen_table {
                break;
            }
            continue;
        };
        seen_table = true;
        let first = row.split('|').next().unwrap_or_default();
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 && is_code(part) {
                codes.insert(part.to_owned());
            }
        }
    }
    codes
}

#[test]
fn the_documented_error_codes_are_exactly_those_the_code_reports() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(workspace.join("docs/json-output.md")).unwrap();
    let reported = codes_in_code(&workspace);
    // The scan finds what it must (a broken scan would pass vacuously).
    for known in [
        "usage",
        "unknown_run",
        "external_mismatch",
        "agent_changed",
        "invalid",
    ] {
        assert!(
            reported.contains(known),
            "the scan missed `{known}`: {reported:?}"
        );
    }
    let listed = documented(&page, "## Error codes");
    assert_eq!(
        listed.difference(&reported).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented but never reported"
    );
    assert_eq!(
        reported.difference(&listed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "reported but not documented in docs/json-output.md"
    );
    let kinds = run_error_kinds(&workspace);
    assert!(kinds.contains("model_call_failed"), "{kinds:?}");
    assert_eq!(documented(&page, "## Run error codes"), kinds);
}
