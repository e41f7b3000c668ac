//! Untrusted text never crashes the host: agent files, plugin manifests,
//! stored events and guest output, each taken from a valid example and
//! mangled at random (bytes changed, inserted, removed, the text cut short),
//! parse to a value or to a typed error, never a panic.
//!
//! A short run of each is part of `cargo test`; set
//! `WARDEN_PROPTEST_CASES` (for example 20000) for a longer one.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use warden::engine::Agent;
use warden::engine::events::{decode, encode};
use warden::plugins::Manifest;

fn cases(default: u32) -> u32 {
    std::env::var("WARDEN_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// One change to a byte string: at a position (a fraction of its length),
/// replace, insert or remove a few bytes, or cut it there.
#[derive(Clone, Debug)]
enum Edit {
    Replace(f64, Vec<u8>),
    Insert(f64, Vec<u8>),
    Remove(f64, usize),
    Cut(f64),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bytes that matter to TOML and JSON, and any byte at all.
    let interesting = prop_oneof![
        proptest::sample::select(b"[]{}\"'\\=,:.#\n\r\t 0123456789-+eE_tfnu\xff\xc3\x80".to_vec()),
        any::<u8>(),
    ];
    let bytes = proptest::collection::vec(interesting, 1..6);
    let at = 0.0..1.0f64;
    prop_oneof![
        (at.clone(), bytes.clone()).prop_map(|(a, b)| Edit::Replace(a, b)),
        (at.clone(), bytes).prop_map(|(a, b)| Edit::Insert(a, b)),
        (at.clone(), 1usize..16).prop_map(|(a, n)| Edit::Remove(a, n)),
        at.prop_map(Edit::Cut),
    ]
}

fn apply(text: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = text.to_vec();
    for edit in edits {
        let pos = |f: f64| ((out.len() as f64) * f) as usize;
        match edit {
            Edit::Replace(f, bytes) => {
                let at = pos(*f);
                let end = (at + bytes.len()).min(out.len());
                out.splice(at..end, bytes.iter().copied());
            }
            Edit::Insert(f, bytes) => {
                let at = pos(*f);
                out.splice(at..at, bytes.iter().copied());
            }
            Edit::Remove(f, n) => {
                let at = pos(*f);
                let end = (at + n).min(out.len());
                out.drain(at..end);
            }
            Edit::Cut(f) => out.truncate(pos(*f)),
        }
    }
    out
}

fn mangled(text: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(edit(), 1..5).prop_map(move |edits| apply(text, &edits))
}

fn runner(default_cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(default_cases),
        failure_persistence: None,
        ..Config::default()
    })
}

const AGENT: &str = r#"
name = "notes"
instructions = "You keep the notes folder tidy."
labels = { team = "ops" }
output_schema = '{"type": "object", "properties": {"summary": {"type": "string"}}}'

[model]
provider = "scripted"
name = "demo"
transcript = "notes.transcript.toml"

[plugins.fs]
source = "builtin:fs"
approval = { read_file = "never", write_file = "always" }
[plugins.fs.grant.mounts.workspace]
dir = "notes"
access = "read-only"
[plugins.fs.grant.limits]
fuel = 1000000000
timeout = "5s"

[context.notes]
plugin = "fs"
when = "first_step"

[budgets]
max_steps = 10
max_tool_calls = 20
max_wall_time = "5m"
max_cost_usd = 0.5
"#;

const MANIFEST: &str = r#"
name = "greeter"
version = "0.1.0"
kind = "tool"
component = "greeter.wasm"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
env = ["API_TOKEN"]
hosts = ["api.example.com", "*.example.org:8443"]

[mounts.workspace]
access = "read-write"

[limits]
fuel = 2000000000
memory = "64MiB"
timeout = "10s"
output = "1MiB"
"#;

#[test]
fn mangled_agent_files_parse_or_fail_typed() {
    let dir = Path::new("/nonexistent-warden-parsing/agent.toml");
    runner(256)
        .run(&mangled(AGENT.as_bytes()), |bytes| {
            let text = String::from_utf8_lossy(&bytes);
            // Ok or a typed error; a panic fails the property.
            let _ = Agent::parse(&text, dir, None);
            Ok(())
        })
        .unwrap();
}

#[test]
fn mangled_manifests_parse_or_fail_typed() {
    let path = Path::new("/nonexistent-warden-parsing/plugin.toml");
    runner(256)
        .run(&mangled(MANIFEST.as_bytes()), |bytes| {
            let text = String::from_utf8_lossy(&bytes);
            let _ = Manifest::parse(&text, path, path.parent().unwrap());
            Ok(())
        })
        .unwrap();
}

#[test]
fn mangled_stored_events_decode_or_fail_typed_and_what_decodes_re_encodes_stably() {
    // A run's first event and a completed tool call: nested values, strings
    // with escapes, numbers, optional fields.
    let started = r#"{"v":1,"event":{"type":"run_started","agent":"notes","agent_digest":"sha256:00","input":{"a":[1,2.5,-3e7,"é\n\"x\""],"b":null},"labels":{"team":"ops"},"limits":{},"random_seed":7}}"#;
    let events: Vec<&'static [u8]> = vec![
        started.as_bytes(),
        br#"{"v":1,"event":{"type":"run_completed","output":{"summary":"done","n":[true,false,null]}}}"#,
        br#"{"v":1,"event":{"type":"run_failed","error":{"kind":"budget_exceeded","budget":"steps","used":11,"limit":10}}}"#,
    ];
    for text in events {
        runner(256)
            .run(&mangled(text), |bytes| {
                if let Ok(event) = decode(&bytes) {
                    let again = encode(&event);
                    prop_assert_eq!(decode(&again).unwrap(), event);
                }
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn guest_output_text_parses_bounded_or_fails_typed() {
    let samples: Vec<&'static [u8]> = vec![
        br#"{"content":"line\n","entries":[{"name":"a","size":1},{"name":"b","size":2}],"n":1.5e300}"#,
        b"[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]",
    ];
    for text in samples {
        runner(256)
            .run(&mangled(text), |bytes| {
                let text = String::from_utf8_lossy(&bytes);
                if let Ok(value) = warden::json_limits::parse(&text) {
                    prop_assert!(
                        warden::json_limits::depth(&value) <= warden::json_limits::MAX_DEPTH
                    );
                    let back: serde_json::Value = serde_json::from_str(&value.to_string()).unwrap();
                    prop_assert_eq!(back, value);
                }
                Ok(())
            })
            .unwrap();
    }
    // Deep text of any depth is measured, not parsed recursively.
    let deep = format!("{}{}", "[".repeat(1_000_000), "]".repeat(1_000_000));
    assert!(warden::json_limits::parse(&deep).is_err());
}
