//! Agents as tools: an agent file's `[agents.<name>]` entries, each another
//! agent the model may call by name. A call is a child run (see
//! `runtime/children.rs`): its input is the call's arguments, its result the
//! child's output, its budget carved from what the caller has left.
//!
//! ```toml
//! [agents.worker]
//! agent = "worker.toml"                 # the child's agent file, relative to this one
//! description = "Does one part of the plan"   # what the model reads
//! input_schema = '{"type": "object"}'   # optional; default: {task: string}
//! budget = { max_steps = 4, max_tool_calls = 3 }   # optional, per call: what the
//!                                       # child may use at most (max_steps,
//!                                       # max_input_tokens, max_output_tokens,
//!                                       # max_tool_calls, max_fuel, max_cost);
//!                                       # unset: the child agent's own budgets
//! ```
//!
//! The child's file is loaded with its parent (so a broken child is an error
//! before anything runs), and its digest is part of the parent's: changing
//! a child changes the parent. An agent may not call itself, directly or
//! through others, and calls nest at most [`MAX_AGENT_DEPTH`] deep.
//!
//! Budgets nest ([`child_limits`]): for each budget, the child gets what the
//! call asks (or the child agent's own limit), capped by what the parent
//! has left; a budget the parent has used up parks the parent instead of
//! starting a child that could spend nothing.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Agent, AgentError, ModelDefaults};
use crate::budget::{BudgetKind, BudgetLimits, BudgetUsage, currency_to_nanos};
use crate::ids::{CallId, RunId};

/// How deep calls to agents nest: a root agent and at most this many
/// levels of children below it.
pub const MAX_AGENT_DEPTH: usize = 4;

/// `[agents.<name>]` as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentCallEntry {
    agent: PathBuf,
    description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_schema: Option<String>,
    #[serde(default, skip_serializing_if = "CallBudgetEntry::is_empty")]
    budget: CallBudgetEntry,
    /// The child agent's digest, set once it is loaded and never read from
    /// the file: it puts the child's definition into the parent's digest.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    child_digest: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBudgetEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tool_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_fuel: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_cost: Option<f64>,
}

impl CallBudgetEntry {
    fn is_empty(&self) -> bool {
        *self == CallBudgetEntry::default()
    }
}

/// Another agent an agent may call as a tool.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentCall {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of the call's arguments, which are the child run's
    /// input.
    pub input_schema: Value,
    /// What each call asks for the child, budget by budget; unset budgets
    /// are the child agent's own.
    pub budgets: BudgetLimits,
    /// The child's agent, loaded with its parent.
    pub agent: Arc<Agent>,
}

fn default_input_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {"task": {"type": "string", "description": "What to do"}},
        "required": ["task"],
    })
}

thread_local! {
    /// The agent files being loaded on this thread, outermost first: a
    /// file that appears twice calls itself.
    static LOADING: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
}

/// Loads the agents `entries` name, for the agent at `path` (relative
/// paths against `base`), and records each child's digest in its entry.
pub(crate) fn load_calls(
    entries: &mut BTreeMap<String, AgentCallEntry>,
    path: &Path,
    base: &Path,
    defaults: Option<&ModelDefaults>,
    json_object: &dyn Fn(&str, &str) -> Result<Value, AgentError>,
) -> Result<Vec<AgentCall>, AgentError> {
    let invalid = |key: &str, message: String| AgentError::Invalid {
        path: path.to_owned(),
        key: key.to_owned(),
        message,
    };
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    let me = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let depth = LOADING.with(|l| {
        let mut l = l.borrow_mut();
        if l.last() != Some(&me) {
            l.push(me.clone());
        }
        l.len()
    });
    let loaded = (|| {
        let mut calls = Vec::with_capacity(entries.len());
        for (name, entry) in entries.iter_mut() {
            let at = |k: &str| format!("agents.{name}.{k}");
            if !super::is_valid_human_tool_name(name) {
                return Err(invalid(
                    &format!("agents.{name}"),
                    "is not a valid tool name (use [a-z][a-z0-9_]*, at most 64 bytes, without `__`)"
                        .into(),
                ));
            }
            if entry.description.trim().is_empty() {
                return Err(invalid(&at("description"), "must not be empty".into()));
            }
            // The child's path as the file system names it: the verbs that
            // continue the child later read it from its `run_started`,
            // from any directory.
            let file = base.join(&entry.agent);
            let canonical = std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone());
            let file = canonical.clone();
            if LOADING.with(|l| l.borrow().contains(&canonical)) {
                return Err(invalid(
                    &at("agent"),
                    format!(
                        "`{}` calls itself (directly or through the agents it calls)",
                        entry.agent.display()
                    ),
                ));
            }
            if depth >= MAX_AGENT_DEPTH {
                return Err(invalid(
                    &at("agent"),
                    format!("agents nest at most {MAX_AGENT_DEPTH} deep"),
                ));
            }
            let agent = Agent::load(&file, defaults)?;
            let input_schema = match &entry.input_schema {
                Some(s) => json_object(&at("input_schema"), s)?,
                None => default_input_schema(),
            };
            let b = &entry.budget;
            for (key, value) in [
                ("max_steps", b.max_steps),
                ("max_input_tokens", b.max_input_tokens),
                ("max_output_tokens", b.max_output_tokens),
                ("max_tool_calls", b.max_tool_calls),
                ("max_fuel", b.max_fuel),
            ] {
                if value == Some(0) {
                    return Err(invalid(
                        &at(&format!("budget.{key}")),
                        "must be more than zero".into(),
                    ));
                }
            }
            let cost_nanos = match b.max_cost {
                None => None,
                Some(amount) => match currency_to_nanos(amount) {
                    Some(n) if n > 0 => Some(n),
                    _ => {
                        return Err(invalid(
                            &at("budget.max_cost"),
                            format!("must be a positive amount, got {amount}"),
                        ));
                    }
                },
            };
            entry.child_digest = Some(agent.digest.to_string());
            calls.push(AgentCall {
                name: name.clone(),
                description: entry.description.clone(),
                input_schema,
                budgets: BudgetLimits {
                    steps: b.max_steps,
                    input_tokens: b.max_input_tokens,
                    output_tokens: b.max_output_tokens,
                    cost_nanos,
                    tool_calls: b.max_tool_calls,
                    fuel: b.max_fuel,
                    wall_time_ms: None,
                },
                agent: Arc::new(agent),
            });
        }
        Ok(calls)
    })();
    LOADING.with(|l| {
        let mut l = l.borrow_mut();
        if l.len() == depth {
            l.pop();
        }
    });
    loaded
}

/// The id of the child run a call starts: derived from the parent's run id
/// and the call id alone, so every attempt at starting it (after any crash)
/// names the same run and the store refuses a second one. Readable
/// (`<parent>.<call>`) when that fits a run id, else a digest of both.
pub fn child_run_id(parent: &RunId, call_id: &CallId) -> RunId {
    RunId::new(format!("{parent}.{call_id}")).unwrap_or_else(|_| {
        let mut h = Sha256::new();
        h.update(b"warden-child-run-v1\0");
        h.update(parent.as_str().as_bytes());
        h.update(b"\0");
        h.update(call_id.as_str().as_bytes());
        RunId::new(format!("child-{}", &hex::encode(h.finalize())[..40]))
            .expect("a hex digest is a valid run id")
    })
}

/// What a child is granted: for each budget, what the call asks (`asked`,
/// else the child agent's own `own`), capped by what the parent has left
/// of its `limits` after `used` (the call itself counted as one tool
/// call). Returns the granted limits and the budgets that were capped.
///
/// `Err` names a budget the parent has used up: no child starts then.
pub fn child_limits(
    asked: &BudgetLimits,
    own: &BudgetLimits,
    limits: &BudgetLimits,
    used: &BudgetUsage,
) -> Result<(BudgetLimits, Vec<BudgetKind>), BudgetKind> {
    let mut granted = BudgetLimits::default();
    let mut capped = Vec::new();
    for kind in BudgetKind::ORDER {
        let wanted = asked.get(kind).or(own.get(kind));
        let spent = used.get(kind) + u64::from(kind == BudgetKind::ToolCalls);
        let left = limits.get(kind).map(|l| l.saturating_sub(spent));
        if left == Some(0) && kind != BudgetKind::ToolCalls {
            return Err(kind);
        }
        let give = match (wanted, left) {
            (Some(w), Some(l)) => Some(w.min(l)),
            (w, l) => w.or(l),
        };
        if give != wanted {
            capped.push(kind);
        }
        granted.set(kind, give);
    }
    Ok((granted, capped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_gets_what_it_asks_capped_by_what_the_parent_has_left() {
        let limits = BudgetLimits {
            steps: Some(10),
            tool_calls: Some(5),
            ..BudgetLimits::default()
        };
        let used = BudgetUsage {
            steps: 7,
            tool_calls: 1,
            ..BudgetUsage::default()
        };
        let asked = BudgetLimits {
            steps: Some(5),
            tool_calls: Some(2),
            ..BudgetLimits::default()
        };
        let own = BudgetLimits {
            fuel: Some(100),
            ..BudgetLimits::default()
        };
        let (granted, capped) = child_limits(&asked, &own, &limits, &used).unwrap();
        // 3 steps left; 5 - 1 - this call = 3 tool calls left, 2 asked.
        assert_eq!(
            granted,
            BudgetLimits {
                steps: Some(3),
                tool_calls: Some(2),
                fuel: Some(100),
                ..BudgetLimits::default()
            }
        );
        assert_eq!(capped, [BudgetKind::Steps]);
        // An unlimited child under a limited parent gets what is left.
        let (granted, capped) =
            child_limits(&BudgetLimits::default(), &own, &limits, &used).unwrap();
        assert_eq!(granted.steps, Some(3));
        assert_eq!(capped, [BudgetKind::Steps, BudgetKind::ToolCalls]);
        // A budget used up starts no child.
        let spent = BudgetUsage { steps: 10, ..used };
        assert_eq!(
            child_limits(&asked, &own, &limits, &spent),
            Err(BudgetKind::Steps)
        );
    }

    #[test]
    fn child_ids_are_derived_from_the_parent_and_the_call() {
        let parent = RunId::new("plan-1").unwrap();
        let call = CallId::new(2, 1);
        assert_eq!(child_run_id(&parent, &call).as_str(), "plan-1.call-2-1");
        let long = RunId::new("x".repeat(128)).unwrap();
        let a = child_run_id(&long, &call);
        assert_eq!(a, child_run_id(&long, &call));
        assert_ne!(a, child_run_id(&long, &CallId::new(2, 2)));
        assert!(a.as_str().starts_with("child-"));
    }
}
