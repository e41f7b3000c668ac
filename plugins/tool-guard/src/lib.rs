//! `tool-guard`: a first-party policy that denies tool calls before they run,
//! by rules the operator sets in the grant's config (each optional, a
//! comma-separated list):
//!
//! - `deny_tools`: globs over tool names as the model sees them
//!   (`fs__delete_*`, `http__*`);
//! - `deny_effects`: effect classes (`read`, `idempotent`, `write`), after
//!   the operator's overrides; `write` makes the agent read-only;
//! - `deny_paths`: globs over the calls' path arguments (`secrets/**`,
//!   `*.pem`): every string argument named `path` or ending in `_path`, and
//!   every string in an array argument named `paths`. A path is normalized
//!   lexically first (`./`, a leading `/`, `.` and `..` segments), so
//!   `notes/../secrets/key` is `secrets/key`; a path that climbs above its
//!   root is denied outright.
//!
//! It acts at `before_tool_call` only and allows at every other hook, so an
//! agent should enable it there alone (`hooks = ["before_tool_call"]`). A
//! config value it cannot read (a bad glob, an unknown effect) is an error,
//! and the host fails the run closed: a guard that is misconfigured never
//! silently allows.

use serde_json::Value;
use warden_guest::glob::Glob;
use warden_guest::{Decision, PolicyError, PolicyPlugin, PolicyRequest, SourceSpec, Subject};

/// The policy, exported as the `policy-plugin` world.
pub struct ToolGuard;

impl PolicyPlugin for ToolGuard {
    fn describe() -> SourceSpec {
        SourceSpec::new(
            "tool-guard",
            "Denies tool calls by tool name, effect class or path argument",
        )
    }

    fn decide(request: PolicyRequest) -> Result<Decision, PolicyError> {
        let rules = Rules::from_config(warden_guest::config)?;
        match request.subject()? {
            Subject::BeforeToolCall {
                tool,
                arguments,
                effect,
                ..
            } => Ok(rules.check(&tool, effect.map(|e| e.as_str()), &arguments)),
            _ => Ok(Decision::Allow),
        }
    }
}

warden_guest::export_policy_plugin!(ToolGuard);

/// The operator's rules, read from config on every call (a lease is fresh
/// each time, so nothing is cached).
#[derive(Debug, Default)]
struct Rules {
    tools: Vec<(String, Glob)>,
    effects: Vec<String>,
    paths: Vec<(String, Glob)>,
}

const EFFECTS: [&str; 3] = ["read", "idempotent", "write"];

impl Rules {
    fn from_config(config: impl Fn(&str) -> Option<String>) -> Result<Rules, PolicyError> {
        let list = |key: &str| -> Vec<String> {
            config(key)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let globs = |key: &str| -> Result<Vec<(String, Glob)>, PolicyError> {
            list(key)
                .into_iter()
                .map(|g| match Glob::new(&g) {
                    Ok(glob) => Ok((g, glob)),
                    Err(e) => Err(PolicyError::failed(format!("config `{key}`: {e}"))),
                })
                .collect()
        };
        let effects = list("deny_effects");
        if let Some(bad) = effects.iter().find(|e| !EFFECTS.contains(&e.as_str())) {
            return Err(PolicyError::failed(format!(
                "config `deny_effects`: `{bad}` is not an effect class (read, idempotent, write)"
            )));
        }
        Ok(Rules {
            tools: globs("deny_tools")?,
            effects,
            paths: globs("deny_paths")?,
        })
    }

    /// The decision about a call of `tool` with `effect` and `arguments`.
    fn check(&self, tool: &str, effect: Option<&str>, arguments: &Value) -> Decision {
        if let Some((pattern, _)) = self.tools.iter().find(|(_, g)| g.matches(tool)) {
            return Decision::deny(format!(
                "tool `{tool}` is denied by the operator (deny_tools `{pattern}`)"
            ));
        }
        if let Some(effect) = effect.filter(|e| self.effects.iter().any(|d| d == e)) {
            return Decision::deny(format!(
                "tool `{tool}` has effect `{effect}`, which the operator denies (deny_effects)"
            ));
        }
        if self.paths.is_empty() {
            return Decision::Allow;
        }
        for path in path_arguments(arguments) {
            let Some(normal) = normalize(path) else {
                return Decision::deny(format!(
                    "path `{path}` climbs above its root, which the operator denies (deny_paths)"
                ));
            };
            if let Some((pattern, _)) = self.paths.iter().find(|(_, g)| g.matches(&normal)) {
                return Decision::deny(format!(
                    "path `{path}` is denied by the operator (deny_paths `{pattern}`)"
                ));
            }
        }
        Decision::Allow
    }
}

/// The path arguments of a call: string fields named `path` or ending in
/// `_path`, and the strings of an array field named `paths`.
fn path_arguments(arguments: &Value) -> Vec<&str> {
    let Value::Object(fields) = arguments else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    for (key, value) in fields {
        match value {
            Value::String(s) if key == "path" || key.ends_with("_path") => paths.push(s.as_str()),
            Value::Array(items) if key == "paths" => {
                paths.extend(items.iter().filter_map(Value::as_str));
            }
            _ => {}
        }
    }
    paths
}

/// `path` with `.` and `..` segments resolved and leading `/` or `./`
/// dropped; `None` if it climbs above its root.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use warden_guest::testing::policy_request;

    fn rules(pairs: &[(&str, &str)]) -> Result<Rules, PolicyError> {
        Rules::from_config(|key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    fn reason(decision: Decision) -> String {
        match decision {
            Decision::Deny(reason) => reason,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn tools_are_denied_by_glob() {
        let r = rules(&[("deny_tools", "fs__delete_*, http__*")]).unwrap();
        assert_eq!(
            reason(r.check("fs__delete_file", Some("write"), &json!({}))),
            "tool `fs__delete_file` is denied by the operator (deny_tools `fs__delete_*`)"
        );
        assert_eq!(
            reason(r.check("http__get", Some("read"), &json!({}))),
            "tool `http__get` is denied by the operator (deny_tools `http__*`)"
        );
        assert_eq!(
            r.check("fs__read_file", Some("read"), &json!({})),
            Decision::Allow
        );
    }

    #[test]
    fn effects_are_denied_by_class_and_unknown_classes_are_errors() {
        let r = rules(&[("deny_effects", "write")]).unwrap();
        assert_eq!(
            reason(r.check("fs__write_file", Some("write"), &json!({}))),
            "tool `fs__write_file` has effect `write`, which the operator denies (deny_effects)"
        );
        assert_eq!(
            r.check("fs__read_file", Some("read"), &json!({})),
            Decision::Allow
        );
        assert_eq!(
            r.check("ask_operator", None, &json!({})),
            Decision::Allow,
            "a human tool has no effect class"
        );
        let err = rules(&[("deny_effects", "wrte")]).unwrap_err();
        assert_eq!(
            err.message(),
            "config `deny_effects`: `wrte` is not an effect class (read, idempotent, write)"
        );
    }

    #[test]
    fn paths_are_normalized_before_they_are_matched() {
        let r = rules(&[("deny_paths", "secrets/**, *.pem")]).unwrap();
        for path in [
            "secrets/key",
            "/secrets/key",
            "./secrets/a/b",
            "notes/../secrets/key",
            "notes/./../secrets/key",
        ] {
            let why = reason(r.check("fs__read_file", Some("read"), &json!({ "path": path })));
            assert_eq!(
                why,
                format!("path `{path}` is denied by the operator (deny_paths `secrets/**`)")
            );
        }
        assert!(
            reason(r.check("fs__read_file", None, &json!({ "path": "keys/server.pem" })))
                .contains("deny_paths `*.pem`")
        );
        assert!(
            reason(r.check("x__y", None, &json!({ "source_path": "../../etc/passwd" })))
                .contains("climbs above its root")
        );
        assert!(
            reason(r.check("x__y", None, &json!({ "paths": ["a.md", "secrets/k"] })))
                .contains("`secrets/k`")
        );
        assert_eq!(
            r.check(
                "fs__read_file",
                None,
                &json!({ "path": "notes/secrets.md" })
            ),
            Decision::Allow
        );
        assert_eq!(
            r.check("fs__search", None, &json!({ "pattern": "secrets/**" })),
            Decision::Allow,
            "only path arguments are paths"
        );
    }

    #[test]
    fn a_bad_glob_is_an_error_naming_the_key() {
        let err = rules(&[("deny_paths", "a/[b")]).unwrap_err();
        assert!(
            err.message()
                .starts_with("config `deny_paths`: invalid glob `a/[b`"),
            "{err:?}"
        );
    }

    #[test]
    fn other_hooks_are_allowed_and_a_bad_subject_is_an_invalid_request() {
        let start = policy_request(json!({"hook": "run_start", "input": "go"}));
        assert_eq!(ToolGuard::decide(start).unwrap(), Decision::Allow);
        let bad = policy_request(json!({"hook": "before_tool_call", "tool": 3}));
        assert!(matches!(
            ToolGuard::decide(bad),
            Err(PolicyError::InvalidRequest(_))
        ));
    }
}
