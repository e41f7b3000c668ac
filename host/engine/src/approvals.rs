//! Standing approval rules, as the engine reads them: what a rule matches
//! ([`RuleSpec`]: a plugin, a tool, argument patterns, and optionally one
//! run or one session), a stored rule read back ([`Rule`]), and whether it
//! approves a call ([`Rule::approves`]). The store keeps rules
//! (`warden_store::ApprovalRule`, its `spec` the JSON written here); the
//! runtime's verbs (`runtime/rules.rs`) create, list and revoke them, and
//! the step loop asks them before parking a call for a human and again
//! right before an approved call runs. Who may decide a call a served
//! client asked for ([`Approvers`], [`Approver`]) is checked here too, by
//! every surface that records such a decision.
//!
//! A rule approves a call only when everything it names matches: the
//! plugin key, the tool's name within its plugin, every argument pattern
//! (a glob over the argument's canonical text; a missing argument matches
//! nothing), the run and the session. A rule must name a plugin or a tool:
//! nothing approves every call.
//!
//! A string argument is matched as a path ([`canonical_path`]): `.`
//! segments and doubled slashes are dropped, and a string with a `..`
//! segment (also `\`-separated or percent-encoded) matches no rule at all,
//! so `notes/*` never approves `notes/../secret`. Any other value is
//! matched as canonical JSON. In a pattern ([`glob`]), `*` is any run of
//! characters within one path segment (it never crosses `/`), `**` any
//! run at all, and `?` one character other than `/`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::canonical::canonical_json;
use super::events::ToolRef;
use super::ids::{RunId, SessionId};
use warden_store::{ApprovalRule, Revocation, RuleStanding};

/// When a tool call needs a human's approval: an agent's `approval` setting
/// for a tool (a standing [`Rule`] can approve such a call ahead of time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NeedsApproval {
    /// Never.
    Never,
    /// Always.
    Always,
    /// When the tool's effective effect class is `write`. The default.
    #[default]
    Writes,
}

/// Who may decide a call that waits for approval when the one who asked
/// for it is a client Warden serves (`warden mcp serve`): an operator's
/// setting, checked by [`Approvers::admit`] before any decision of such a
/// run is recorded (the one gate; its surfaces ask it, never decide it).
///
/// Operators (the terminal's `warden runs approve|deny`, the console, the
/// API under an approver's token) may always decide. The client that asked
/// for the call may decide it only under [`Approvers::OperatorsAndClient`],
/// and is then recorded by the identity its transport authenticated, never
/// by a name it gave itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approvers {
    /// Operators only: the client is never asked, and its answer would not
    /// count.
    Operators,
    /// Operators, and the client that asked (by MCP elicitation).
    #[serde(rename = "client")]
    OperatorsAndClient,
}

impl Approvers {
    /// The setting's word (`operators`, `client`).
    pub fn as_str(self) -> &'static str {
        match self {
            Approvers::Operators => "operators",
            Approvers::OperatorsAndClient => "client",
        }
    }

    /// The setting named `text` (`operators`, `client`).
    pub fn parse(text: &str) -> Option<Approvers> {
        match text {
            "operators" => Some(Approvers::Operators),
            "client" => Some(Approvers::OperatorsAndClient),
            _ => None,
        }
    }

    /// Whether `approver` may decide a call of a run under this setting;
    /// `Ok` gives what the log records as the decision's `by`.
    pub fn admit(self, approver: &Approver) -> Result<&str, NotEntitled> {
        match (self, approver) {
            (_, Approver::Operator(by)) => Ok(by),
            (Approvers::OperatorsAndClient, Approver::Client { identity }) => Ok(identity),
            (Approvers::Operators, Approver::Client { identity }) => Err(NotEntitled {
                identity: identity.clone(),
            }),
        }
    }
}

/// Who is deciding a call that waits for approval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approver {
    /// An operator, or the operator's own server acting on its settings (a
    /// timeout's denial), as the log records them (`api:<token>`, a login
    /// name, `warden mcp serve`).
    Operator(String),
    /// The client that asked for the call, by the identity its transport
    /// authenticated (`mcp:stdio:<account>`, `mcp:token:<variable>`).
    Client {
        /// The authenticated identity, as the log records it.
        identity: String,
    },
}

/// A client's decision the operator's [`Approvers`] setting does not let
/// it make.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{identity}` asked for this call and may not decide it: approvals here are for operators only (`warden runs approve` or `deny`, the console, the API)"
)]
pub struct NotEntitled {
    /// The client's authenticated identity.
    pub identity: String,
}

/// What a rule approves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The plugin key (`fs`), if the rule is about one plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The tool's name within its plugin (`write_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Argument name → glob its text must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
    /// Only calls of this run (`runs approve --scope run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunId>,
    /// Only calls of runs in this session (`runs approve --scope session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionId>,
}

/// A rule that cannot be made or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// It names neither a plugin nor a tool.
    #[error("an approval rule must name a plugin or a tool: none approves every call")]
    TooBroad,
    /// A model name given as the tool names another plugin than `plugin`.
    #[error("tool `{tool}` is not a tool of plugin `{plugin}`")]
    PluginMismatch {
        /// The tool as given.
        tool: String,
        /// The plugin as given.
        plugin: String,
    },
    /// A plugin or tool given as empty text: it could match no call.
    #[error("an approval rule's `{field}` is empty: name one, or leave it out")]
    EmptyName {
        /// `plugin` or `tool`.
        field: &'static str,
    },
    /// An argument pattern with an empty name.
    #[error("an argument pattern needs a name: `NAME=GLOB`")]
    EmptyArgument,
    /// An argument pattern that climbs out of its directory.
    #[error(
        "argument pattern `{name}={pattern}` has a `..` segment: a rule never matches a path that climbs"
    )]
    ClimbingPattern {
        /// The argument.
        name: String,
        /// The pattern.
        pattern: String,
    },
    /// Its expiry is not after its creation.
    #[error("the rule would expire at {expires_ms}, not after its creation at {created_ms}")]
    AlreadyExpired {
        /// When it was made.
        created_ms: i64,
        /// When it would expire.
        expires_ms: i64,
    },
    /// A session-wide approval for a run outside any session.
    #[error("run `{run_id}` is in no session: approve it for the run, or for the call")]
    NoSession {
        /// The run.
        run_id: RunId,
    },
    /// The stored spec is not one this engine reads.
    #[error("approval rule `{id}` cannot be read: {reason}")]
    Unreadable {
        /// The rule.
        id: String,
        /// Why.
        reason: String,
    },
}

impl RuleSpec {
    /// The spec for `tool`, which is either a tool's name within `plugin`
    /// or a model name (`fs__write_file`) that names its plugin itself.
    pub fn for_tool(plugin: Option<&str>, tool: Option<&str>) -> Result<RuleSpec, RuleError> {
        let (plugin, tool) = match (plugin, tool.map(|t| (t, t.split_once("__")))) {
            (p, Some((_, Some((from, name))))) => {
                if let Some(p) = p
                    && p != from
                {
                    return Err(RuleError::PluginMismatch {
                        tool: tool.unwrap_or_default().to_owned(),
                        plugin: p.to_owned(),
                    });
                }
                (Some(from.to_owned()), Some(name.to_owned()))
            }
            (p, Some((t, None))) => (p.map(str::to_owned), Some(t.to_owned())),
            (p, None) => (p.map(str::to_owned), None),
        };
        let spec = RuleSpec {
            plugin,
            tool,
            ..RuleSpec::default()
        };
        spec.check()?;
        Ok(spec)
    }

    /// Refuses a spec that approves too much or cannot match.
    pub fn check(&self) -> Result<(), RuleError> {
        if self.plugin.is_none() && self.tool.is_none() {
            return Err(RuleError::TooBroad);
        }
        for (field, name) in [("plugin", &self.plugin), ("tool", &self.tool)] {
            if name.as_deref().is_some_and(|n| n.trim().is_empty()) {
                return Err(RuleError::EmptyName { field });
            }
        }
        if self.arguments.keys().any(|k| k.trim().is_empty()) {
            return Err(RuleError::EmptyArgument);
        }
        if let Some((name, pattern)) = self
            .arguments
            .iter()
            .find(|(_, pattern)| canonical_path(pattern).is_none())
        {
            return Err(RuleError::ClimbingPattern {
                name: name.clone(),
                pattern: pattern.clone(),
            });
        }
        Ok(())
    }

    /// Whether a call to `tool` with `arguments`, made by run `run` (in
    /// `session`, if any), is one this spec approves.
    pub fn matches(
        &self,
        tool: &ToolRef,
        arguments: &Value,
        run: &RunId,
        session: Option<&SessionId>,
    ) -> bool {
        self.plugin.as_ref().is_none_or(|p| *p == tool.plugin)
            && self.tool.as_ref().is_none_or(|t| *t == tool.tool)
            && self.run.as_ref().is_none_or(|r| r == run)
            && self
                .session
                .as_ref()
                .is_none_or(|s| session.is_some_and(|own| own == s))
            && self.arguments.iter().all(|(name, pattern)| {
                let Some(pattern) = canonical_path(pattern) else {
                    return false;
                };
                arguments.get(name).is_some_and(|value| {
                    let text = match value {
                        Value::String(s) => canonical_path(s),
                        other => Some(canonical_json(other)),
                    };
                    text.is_some_and(|text| glob(&pattern, &text))
                })
            })
    }
}

/// A standing rule read back from the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// Its id.
    pub id: String,
    /// What it approves.
    pub spec: RuleSpec,
    /// Who created it.
    pub created_by: String,
    /// When.
    pub created_ms: i64,
    /// When it stops approving, if ever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
    /// Its revocation, once revoked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Revocation>,
}

impl Rule {
    /// The rule the store keeps as `stored`.
    pub fn from_stored(stored: &ApprovalRule) -> Result<Rule, RuleError> {
        let spec: RuleSpec =
            serde_json::from_str(&stored.spec).map_err(|e| RuleError::Unreadable {
                id: stored.id.clone(),
                reason: e.to_string(),
            })?;
        Ok(Rule {
            id: stored.id.clone(),
            spec,
            created_by: stored.created_by.clone(),
            created_ms: stored.created_ms,
            expires_ms: stored.expires_ms,
            revoked: stored.revoked.clone(),
        })
    }

    /// Its standing at `now_ms`.
    pub fn standing(&self, now_ms: i64) -> RuleStanding {
        RuleStanding::at(self.revoked.is_some(), self.expires_ms, now_ms)
    }

    /// Whether it approves the call at `now_ms`: live, and matching.
    pub fn approves(
        &self,
        now_ms: i64,
        tool: &ToolRef,
        arguments: &Value,
        run: &RunId,
        session: Option<&SessionId>,
    ) -> bool {
        self.standing(now_ms) == RuleStanding::Live
            && self.spec.check().is_ok()
            && self.spec.matches(tool, arguments, run, session)
    }
}

/// `text` as a rule matches it: a path in canonical form, its `.`
/// segments and doubled slashes dropped (a leading `/`, a trailing one and
/// the `//` after a URL's scheme kept); `None` when any segment climbs
/// (`..`, split at `/` or `\\`, or percent-encoded), which no rule matches.
pub fn canonical_path(text: &str) -> Option<String> {
    let climbs = |segment: &str| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == ".."
    };
    if text.split(['/', '\\']).any(climbs) {
        return None;
    }
    let segments: Vec<&str> = text.split('/').collect();
    let last = segments.len() - 1;
    let mut kept: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." if segments.len() > 1 => {}
            "" if i == 0 || i == last || kept.last().is_some_and(|p| p.ends_with(':')) => {
                kept.push("")
            }
            "" => {}
            other => kept.push(other),
        }
    }
    Some(kept.join("/"))
}

/// Whether `text` matches `pattern`: `*` is any run of characters but `/`,
/// `**` any run of characters, `?` any one character but `/` (no escapes,
/// no classes: a pattern an operator can read at a glance).
pub fn glob(pattern: &str, text: &str) -> bool {
    enum Token {
        Char(char),
        One,
        Segment,
        Any,
    }
    let mut tokens = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        tokens.push(match c {
            '*' if chars.peek() == Some(&'*') => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                Token::Any
            }
            '*' => Token::Segment,
            '?' => Token::One,
            c => Token::Char(c),
        });
    }
    // Which prefixes of the pattern match the text read so far: one row
    // per character, so time is pattern × text and never exponential.
    let mut row = vec![false; tokens.len() + 1];
    row[0] = true;
    let close = |row: &mut Vec<bool>| {
        for (i, token) in tokens.iter().enumerate() {
            if row[i] && matches!(token, Token::Segment | Token::Any) {
                row[i + 1] = true;
            }
        }
    };
    close(&mut row);
    for c in text.chars() {
        let mut next = vec![false; tokens.len() + 1];
        for (i, token) in tokens.iter().enumerate() {
            let star_repeats = row[i + 1] && matches!(token, Token::Segment | Token::Any);
            if !row[i] && !star_repeats {
                continue;
            }
            match token {
                Token::Char(p) if row[i] && *p == c => next[i + 1] = true,
                Token::One if row[i] && c != '/' => next[i + 1] = true,
                Token::Segment if c != '/' => next[i + 1] |= row[i] || row[i + 1],
                Token::Any => next[i + 1] |= row[i] || row[i + 1],
                _ => {}
            }
        }
        close(&mut next);
        row = next;
        if !row.iter().any(|m| *m) {
            return false;
        }
    }
    row[tokens.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fs(tool: &str) -> ToolRef {
        ToolRef {
            plugin: "fs".into(),
            tool: tool.into(),
        }
    }

    #[test]
    fn only_operators_decide_unless_the_setting_lets_the_client() {
        let operator = Approver::Operator("alice".into());
        let client = Approver::Client {
            identity: "mcp:token:WARDEN_MCP_TOKEN".into(),
        };
        assert_eq!(Approvers::Operators.admit(&operator), Ok("alice"));
        assert_eq!(
            Approvers::Operators.admit(&client),
            Err(NotEntitled {
                identity: "mcp:token:WARDEN_MCP_TOKEN".into()
            })
        );
        assert_eq!(
            Approvers::OperatorsAndClient.admit(&client),
            Ok("mcp:token:WARDEN_MCP_TOKEN")
        );
        assert_eq!(Approvers::OperatorsAndClient.admit(&operator), Ok("alice"));
        for setting in [Approvers::Operators, Approvers::OperatorsAndClient] {
            assert_eq!(Approvers::parse(setting.as_str()), Some(setting));
        }
        assert_eq!(Approvers::parse("anyone"), None);
    }

    #[test]
    fn globs() {
        for (pattern, text, matches) in [
            ("notes/*", "notes/a.md", true),
            ("notes/*", "notes/", true),
            ("notes/*", "other/a.md", false),
            ("*.md", "a/b/c.md", false),
            ("**.md", "a/b/c.md", true),
            ("notes/**", "notes/a/b.md", true),
            ("notes/*", "notes/a/b.md", false),
            ("a?c", "a/c", false),
            (
                "https://api.example.com/**",
                "https://api.example.com/v1/x",
                true,
            ),
            ("*.md", "a.mdx", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*", "", true),
            ("", "", true),
            ("", "x", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("é*", "été", true),
        ] {
            assert_eq!(glob(pattern, text), matches, "{pattern} {text}");
        }
    }

    #[test]
    fn paths_are_matched_in_canonical_form_and_climbing_ones_never() {
        for (text, canonical) in [
            ("notes/a.md", Some("notes/a.md")),
            ("./notes/a.md", Some("notes/a.md")),
            ("notes//a.md", Some("notes/a.md")),
            ("notes/./a.md", Some("notes/a.md")),
            ("/notes/a.md", Some("/notes/a.md")),
            ("notes/", Some("notes/")),
            (".", Some(".")),
            ("https://a.example/x//y", Some("https://a.example/x/y")),
            ("notes/../secret", None),
            ("..", None),
            ("notes\\..\\secret", None),
            ("notes/%2E%2e/secret", None),
            ("notes/.%2e/secret", None),
            ("notes/..a/b", Some("notes/..a/b")),
        ] {
            assert_eq!(canonical_path(text).as_deref(), canonical, "{text}");
        }
        let climbing = RuleSpec {
            arguments: BTreeMap::from([("path".to_owned(), "notes/../*".to_owned())]),
            ..RuleSpec::for_tool(Some("fs"), None).unwrap()
        };
        assert!(matches!(
            climbing.check(),
            Err(RuleError::ClimbingPattern { .. })
        ));
    }

    #[test]
    fn a_spec_matches_what_it_names_and_nothing_else() {
        let run = RunId::new("r1").unwrap();
        let session = SessionId::new("s1").unwrap();
        let spec = RuleSpec {
            arguments: BTreeMap::from([("path".to_owned(), "notes/*".to_owned())]),
            ..RuleSpec::for_tool(None, Some("fs__write_file")).unwrap()
        };
        assert_eq!(spec.plugin.as_deref(), Some("fs"));
        let args = json!({"path": "notes/a.md", "content": "x"});
        assert!(spec.matches(&fs("write_file"), &args, &run, None));
        assert!(!spec.matches(&fs("delete_file"), &args, &run, None));
        assert!(!spec.matches(
            &fs("write_file"),
            &json!({"path": "etc/passwd"}),
            &run,
            None
        ));
        assert!(!spec.matches(&fs("write_file"), &json!({"content": "x"}), &run, None));
        // Scoped to a run or a session.
        let in_run = RuleSpec {
            run: Some(run.clone()),
            ..spec.clone()
        };
        assert!(in_run.matches(&fs("write_file"), &args, &run, None));
        assert!(!in_run.matches(&fs("write_file"), &args, &RunId::new("r2").unwrap(), None));
        let in_session = RuleSpec {
            session: Some(session.clone()),
            ..spec.clone()
        };
        assert!(in_session.matches(&fs("write_file"), &args, &run, Some(&session)));
        assert!(!in_session.matches(&fs("write_file"), &args, &run, None));
        // Non-string arguments match by their canonical JSON.
        let count = RuleSpec {
            arguments: BTreeMap::from([("n".to_owned(), "[1,*]".to_owned())]),
            ..RuleSpec::for_tool(Some("fs"), None).unwrap()
        };
        assert!(count.matches(&fs("x"), &json!({"n": [1, 2]}), &run, None));
    }

    #[test]
    fn too_broad_or_contradictory_specs_are_refused() {
        assert!(matches!(
            RuleSpec::for_tool(None, None),
            Err(RuleError::TooBroad)
        ));
        assert!(matches!(
            RuleSpec::for_tool(Some("http"), Some("fs__write_file")),
            Err(RuleError::PluginMismatch { .. })
        ));
        let spec = RuleSpec::for_tool(Some("fs"), Some("write_file")).unwrap();
        assert_eq!(
            (spec.plugin.as_deref(), spec.tool.as_deref()),
            (Some("fs"), Some("write_file"))
        );
        let unnamed = RuleSpec {
            arguments: BTreeMap::from([(" ".to_owned(), "*".to_owned())]),
            ..spec
        };
        assert!(matches!(unnamed.check(), Err(RuleError::EmptyArgument)));
        // An empty name could match no call: refused, not stored dead.
        for (plugin, tool, field) in [
            (Some(""), None, "plugin"),
            (Some(" "), Some("write_file"), "plugin"),
            (Some("fs"), Some(""), "tool"),
            (None, Some("fs__"), "tool"),
        ] {
            assert!(
                matches!(
                    RuleSpec::for_tool(plugin, tool),
                    Err(RuleError::EmptyName { field: f }) if f == field
                ),
                "{plugin:?} {tool:?}"
            );
        }
    }

    #[test]
    fn a_rule_approves_only_while_live() {
        let stored = ApprovalRule {
            id: "rule-1".into(),
            spec: r#"{"plugin":"fs","tool":"write_file"}"#.into(),
            created_by: "api:ops".into(),
            created_ms: 0,
            expires_ms: Some(100),
            revoked: None,
        };
        let rule = Rule::from_stored(&stored).unwrap();
        let run = RunId::new("r").unwrap();
        assert!(rule.approves(99, &fs("write_file"), &json!({}), &run, None));
        assert!(!rule.approves(100, &fs("write_file"), &json!({}), &run, None));
        let revoked = Rule {
            revoked: Some(Revocation {
                by: "x".into(),
                at_ms: 1,
            }),
            ..rule
        };
        assert!(!revoked.approves(50, &fs("write_file"), &json!({}), &run, None));
        let unreadable = ApprovalRule {
            spec: "{\"everything\":true}".into(),
            ..stored
        };
        assert!(matches!(
            Rule::from_stored(&unreadable),
            Err(RuleError::Unreadable { .. })
        ));
    }
}
