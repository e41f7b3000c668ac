//! Plans: an orchestrated run's schedule, declared in a plan file next to
//! the agents it seats. A plan binds roles to agent files, runs phases of
//! those roles one after another or as a batch, repeats a phase until a
//! role's typed result satisfies a condition or a number of rounds is
//! reached, and ends with a typed result taken from a role's result.
//!
//! ```toml
//! name = "review"                          # like an agent's name
//! description = "Plans, works, reviews"    # optional
//! max_concurrent = 3                       # a batch's calls in flight at once; default 4
//!
//! [roles.planner]                          # a role: an agent file, called as a child run
//! agent = "planner.toml"                   # relative to this file
//! description = "Splits the task"          # optional
//! input_schema = '{"type": "object"}'      # optional; default: any object
//! budget = { max_steps = 3 }               # optional, per call, as [agents.<name>]
//!
//! [[phases]]
//! name = "plan"
//! roles = ["planner"]                      # sequential (default): one step per role
//! input = { task = "/input" }              # each value a JSON pointer into what the
//!                                          # plan knows: /input, /round, /item, /<role>
//! [[phases]]
//! name = "work"
//! roles = ["worker"]
//! for_each = "/planner/parts"              # one call per element (a batch): /item
//! input = { part = "/item" }
//! [[phases]]
//! name = "review"
//! roles = ["reviewer"]
//! batch = false                            # true: all the phase's roles in one step
//! input = { parts = "/worker" }
//! max_rounds = 3                           # repeat the phase at most this often; default 1
//! until = { role = "reviewer", pointer = "/approved", equals = true }
//!                                          # or not_equals, greater_than, at_least,
//!                                          # less_than, at_most (numbers)
//! [result]
//! role = "reviewer"                        # the run's output: this role's last result
//! pointer = "/summary"                     # optional: a part of it
//! # output_schema = '{"type": "object"}'   # optional (top level); default: the role's
//!
//! [budgets]                                # the run's, as an agent's; children's nest
//! max_steps = 40
//! ```
//!
//! A plan loads as an [`Agent`] (so every verb that takes an agent file
//! takes a plan): its roles are its `[agents.<role>]`, its budgets its
//! `[budgets]`, and its model is the [`PlanProvider`], which decides from
//! the plan and the results so far instead of a language model. Each
//! decision is therefore a recorded model call: its completion carries the
//! calls of the next step (a batch is one step with several calls) and a
//! [`Decision`] block naming the phase, the round and why earlier phases
//! ended; the calls are child runs. So an orchestrated run recovers,
//! replays, forks and is shown like any other run, and the plan decides
//! the same from the same results (it reads nothing else).
//!
//! Before anything runs, a plan is checked ([`PlanError`]): every role
//! named exists and its agent file loads; a phase reads only results that
//! exist by then (the plan's input, roles of earlier phases, earlier roles
//! of its own round, or, in a repeated phase, its own previous round: a
//! read of a later phase's result is a cycle, and so is a role bound to the
//! plan itself); a stopping rule names a role of its phase, one test, and
//! a number of rounds that bounds it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_providers::config::ProviderKind;
use warden_providers::{
    Message, ModelProvider, ModelRequest, ModelStream, ProviderError, ProviderEvent, RawBlock,
    StopReason, ToolCall,
};

use super::{Agent, AgentError, ModelDefaults};
use crate::canonical::canonical_json;
use crate::ids::AgentDigest;

/// The most rounds a repeated phase may run.
pub const MAX_ROUNDS: u32 = 100;
/// The most calls of a batch in flight at once a plan may ask for.
pub const MAX_CONCURRENT: u32 = 32;
/// A batch's calls in flight at once when the phase does not say.
pub const DEFAULT_MAX_CONCURRENT: u32 = 4;
/// The format of the raw block a decision is recorded in.
pub const DECISION_FORMAT: &str = "plan";
/// The provider's name, in the log and in errors.
pub const PROVIDER_NAME: &str = "plan";
/// The first tokens of a pointer that are not roles.
const RESERVED: [&str; 3] = ["input", "round", "item"];

/// Whether `text` (TOML) is a plan rather than an agent: it has `[[phases]]`.
pub(crate) fn is_plan(text: &str) -> bool {
    text.parse::<toml::Table>()
        .is_ok_and(|t| t.contains_key("phases"))
}

// ---- the file, as written ----

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_concurrent: Option<u32>,
    roles: BTreeMap<String, RoleEntry>,
    phases: Vec<PhaseEntry>,
    result: ResultEntry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budgets: Option<Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleEntry {
    agent: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseEntry {
    name: String,
    roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batch: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    for_each: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input: Option<InputEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_rounds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    until: Option<UntilEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum InputEntry {
    Whole(String),
    Fields(BTreeMap<String, String>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UntilEntry {
    role: String,
    #[serde(default)]
    pointer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    equals: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    not_equals: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    greater_than: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_least: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    less_than: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at_most: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultEntry {
    role: String,
    #[serde(default)]
    pointer: String,
}

// ---- the plan, checked ----

/// A checked plan: what the [`PlanProvider`] decides from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Its name (the run's agent name).
    pub name: String,
    /// A batch's calls in flight at once, at most.
    pub max_concurrent: u32,
    /// Its phases, in the order they run.
    pub phases: Vec<Phase>,
    /// Where the run's output comes from.
    pub result: Pick,
}

/// One phase: its roles, run one after another (one step each) or as a
/// batch (one step), repeated up to `max_rounds` rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Phase {
    /// Its name.
    pub name: String,
    /// The roles it calls each round, in order.
    pub roles: Vec<String>,
    /// Whether a round is one step with every call (a batch).
    pub batch: bool,
    /// One call per element of the array this pointer finds (a batch).
    pub for_each: Option<String>,
    /// Each call's input.
    pub input: Input,
    /// Rounds, at most.
    pub max_rounds: u32,
    /// What ends the repetition before `max_rounds`.
    pub until: Option<Condition>,
}

/// A call's input: the value one pointer finds, or an object of values.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Input {
    /// The value at this pointer.
    Whole(String),
    /// An object: each field the value at its pointer.
    Fields(BTreeMap<String, String>),
}

/// A stopping rule: a role's result, at a pointer, passing a test.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Condition {
    /// The role whose last result is read.
    pub role: String,
    /// Where in it ("" for all of it).
    pub pointer: String,
    /// The test.
    pub test: Test,
}

/// What a [`Condition`]'s value must be.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// Equal to this JSON value.
    Equals(Value),
    /// Not equal to it.
    NotEquals(Value),
    /// A number greater than this.
    GreaterThan(f64),
    /// A number at least this.
    AtLeast(f64),
    /// A number less than this.
    LessThan(f64),
    /// A number at most this.
    AtMost(f64),
}

/// A part of a role's last result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pick {
    /// The role.
    pub role: String,
    /// Where in its result ("" for all of it).
    pub pointer: String,
}

/// A plan the engine refuses, before anything is recorded: each names the
/// key that is wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A phase, a rule or the result names a role the plan does not have.
    #[error("key `{key}`: `{role}` is not a role of the plan (its roles: {known})")]
    UnknownRole {
        /// The key.
        key: String,
        /// The name.
        role: String,
        /// The roles there are, comma-separated.
        known: String,
    },
    /// A role's agent file does not exist or cannot be read.
    #[error("key `{key}`: role `{role}`: no agent file `{}`: {message}", agent.display())]
    UnknownAgent {
        /// The key.
        key: String,
        /// The role.
        role: String,
        /// The file, as resolved.
        agent: PathBuf,
        /// Why it cannot be read.
        message: String,
    },
    /// A phase reads a result that only a later phase makes, or a role is
    /// the plan itself.
    #[error("key `{key}`: a cycle: {message}")]
    Cycle {
        /// The key.
        key: String,
        /// What reads what.
        message: String,
    },
    /// A stopping rule that cannot be decided or does not stop.
    #[error("key `{key}`: {message}")]
    BadRule {
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// Any other value the plan file does not accept.
    #[error("key `{key}`: {message}")]
    Invalid {
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl PlanError {
    /// What kind of mistake it is (`details.problem` of the `plan_invalid`
    /// code).
    pub fn problem(&self) -> &'static str {
        match self {
            PlanError::UnknownRole { .. } => "unknown_role",
            PlanError::UnknownAgent { .. } => "unknown_agent",
            PlanError::Cycle { .. } => "cycle",
            PlanError::BadRule { .. } => "bad_rule",
            PlanError::Invalid { .. } => "invalid",
        }
    }

    /// The key that is wrong.
    pub fn key(&self) -> &str {
        match self {
            PlanError::UnknownRole { key, .. }
            | PlanError::UnknownAgent { key, .. }
            | PlanError::Cycle { key, .. }
            | PlanError::BadRule { key, .. }
            | PlanError::Invalid { key, .. } => key,
        }
    }
}

/// Parses and checks the plan `text` from `path`, then loads it as an
/// agent whose model is the plan.
pub(crate) fn parse(
    text: &str,
    path: &Path,
    defaults: Option<&ModelDefaults>,
) -> Result<Agent, AgentError> {
    let plan_error = |error: PlanError| AgentError::Plan {
        path: path.to_owned(),
        error,
    };
    let file: PlanFile = toml::from_str(text).map_err(|e| AgentError::Parse {
        path: path.to_owned(),
        message: warden_syntax::toml_errors::one_line(text, &e),
    })?;
    let plan = check(&file).map_err(plan_error)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let me = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    for (role, entry) in &file.roles {
        let key = format!("roles.{role}.agent");
        let file = base.join(&entry.agent);
        match std::fs::metadata(&file) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(plan_error(PlanError::UnknownAgent {
                    key,
                    role: role.clone(),
                    agent: file,
                    message: "not a file".into(),
                }));
            }
            Err(e) => {
                return Err(plan_error(PlanError::UnknownAgent {
                    key,
                    role: role.clone(),
                    agent: file,
                    message: e.to_string(),
                }));
            }
        }
        if std::fs::canonicalize(&file).is_ok_and(|f| f == me) {
            return Err(plan_error(PlanError::Cycle {
                key,
                message: format!("role `{role}` is this plan itself"),
            }));
        }
    }

    // The plan as an agent file: its roles are the agents it calls.
    let mut agents = serde_json::Map::new();
    for (role, entry) in &file.roles {
        let mut call = json!({
            "agent": entry.agent,
            "description": entry
                .description
                .clone()
                .unwrap_or_else(|| format!("Role `{role}` of plan `{}`", file.name)),
            "input_schema": entry
                .input_schema
                .clone()
                .unwrap_or_else(|| r#"{"type": "object"}"#.to_owned()),
        });
        if let Some(budget) = &entry.budget {
            call["budget"] = budget.clone();
        }
        agents.insert(role.clone(), call);
    }
    let mut value = json!({
        "name": file.name,
        "instructions": instructions(&plan),
        "model": {
            "provider": "scripted",
            "name": PROVIDER_NAME,
            "transcript": path.file_name().map(PathBuf::from).unwrap_or_default(),
        },
        "agents": agents,
        "labels": file.labels,
        // A plan's calls are made by the plan: one it makes wrong is the
        // plan's mistake, not something to try again.
        "max_invalid_tool_calls": 1,
        // A batch phase is one step of several child calls: the batch
        // executor runs them side by side up to the plan's bound.
        "max_parallel_calls": plan.max_concurrent,
    });
    if let Some(d) = &file.description {
        value["description"] = json!(d);
    }
    if let Some(b) = &file.budgets {
        value["budgets"] = b.clone();
    }
    if let Some(s) = &file.output_schema {
        value["output_schema"] = json!(s);
    }
    let mut agent = Agent::from_json(value, path, defaults).map_err(|e| match e {
        // The plan's keys as the plan file names them.
        AgentError::Invalid {
            path: p,
            key,
            message,
        } if p == path => AgentError::Invalid {
            path: p,
            key: key
                .strip_prefix("agents.")
                .map(|k| format!("roles.{k}"))
                .unwrap_or(key),
            message,
        },
        other => other,
    })?;
    if agent.output_schema.is_none() {
        let role = agent
            .agents
            .iter()
            .find(|a| a.name == plan.result.role)
            .expect("checked: the result's role is a role");
        // A role a `for_each` phase calls has the array of its results.
        let fanned = plan
            .phases
            .iter()
            .any(|p| p.for_each.is_some() && p.roles.contains(&plan.result.role));
        agent.output_schema = Some(
            match (&role.agent.output_schema, plan.result.pointer.as_str()) {
                (Some(schema), "") if fanned => json!({"type": "array", "items": schema}),
                (Some(schema), "") => schema.clone(),
                // Any JSON value: the output is typed either way.
                _ => json!({}),
            },
        );
    }
    // Labels are not part of a digest, as an agent's are not.
    let mut form = file.clone();
    form.labels.clear();
    let form = serde_json::to_value(&form).expect("a plan file serializes to JSON");
    let mut bytes = b"warden-plan-v1\n".to_vec();
    bytes.extend_from_slice(agent.digest.as_str().as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(canonical_json(&form).as_bytes());
    agent.digest = AgentDigest::of(&bytes);
    agent.model.provider = ProviderKind::Plan;
    agent.model.transcript = None;
    agent.model.plan = Some(Arc::new(plan));
    Ok(agent)
}

/// What the plan's model call sends as instructions: the plan, in words,
/// for anyone reading a recorded prompt.
fn instructions(plan: &Plan) -> String {
    let mut out = format!(
        "Plan `{}`, decided by the plan, not a model. Phases:",
        plan.name
    );
    for p in &plan.phases {
        let how = if p.batch { "a batch" } else { "in turn" };
        out.push_str(&format!("\n- {}: {} ({how})", p.name, p.roles.join(", ")));
        if let Some(f) = &p.for_each {
            out.push_str(&format!(", one call per element of {f}"));
        }
        if p.max_rounds > 1 {
            out.push_str(&format!(", at most {} rounds", p.max_rounds));
        }
    }
    out.push_str(&format!(
        "\nResult: role `{}` at `{}`.",
        plan.result.role, plan.result.pointer
    ));
    out
}

fn is_phase_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// A JSON pointer: "" or `/`-separated tokens.
fn check_pointer(key: &str, pointer: &str) -> Result<(), PlanError> {
    if pointer.is_empty() || pointer.starts_with('/') {
        Ok(())
    } else {
        Err(PlanError::Invalid {
            key: key.to_owned(),
            message: format!("`{pointer}` is not a JSON pointer (\"\" or starting with `/`)"),
        })
    }
}

/// The first token of a pointer into what the plan knows.
fn head_token(pointer: &str) -> &str {
    pointer
        .strip_prefix('/')
        .unwrap_or(pointer)
        .split('/')
        .next()
        .unwrap_or("")
}

/// Checks the plan's structure: names, roles, the reads of each phase
/// (no cycle), the stopping rules and the result.
fn check(file: &PlanFile) -> Result<Plan, PlanError> {
    let invalid = |key: &str, message: String| PlanError::Invalid {
        key: key.to_owned(),
        message,
    };
    if file.roles.is_empty() {
        return Err(invalid("roles", "a plan needs at least one role".into()));
    }
    if file.phases.is_empty() {
        return Err(invalid("phases", "a plan needs at least one phase".into()));
    }
    for role in file.roles.keys() {
        if !super::is_valid_human_tool_name(role) || RESERVED.contains(&role.as_str()) {
            return Err(invalid(
                &format!("roles.{role}"),
                format!(
                    "`{role}` is not a valid role name (use [a-z][a-z0-9_]*, at most 64 bytes, without `__`, and not {})",
                    RESERVED.join(", ")
                ),
            ));
        }
    }
    let known = file.roles.keys().cloned().collect::<Vec<_>>().join(", ");
    let role_named = |key: &str, role: &str| -> Result<(), PlanError> {
        if file.roles.contains_key(role) {
            Ok(())
        } else {
            Err(PlanError::UnknownRole {
                key: key.to_owned(),
                role: role.to_owned(),
                known: known.clone(),
            })
        }
    };
    // Which phase each role first runs in, to tell a read of an earlier
    // result from a read of a later one.
    let mut first_phase: BTreeMap<&str, usize> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for (i, p) in file.phases.iter().enumerate() {
        let at = |k: &str| format!("phases[{i}].{k}");
        if !is_phase_name(&p.name) {
            return Err(invalid(
                &at("name"),
                format!(
                    "`{}` is not a valid phase name (use [a-z][a-z0-9_-]*, at most 64 bytes)",
                    p.name
                ),
            ));
        }
        if !names.insert(p.name.as_str()) {
            return Err(invalid(
                &at("name"),
                format!("phase `{}` is named twice", p.name),
            ));
        }
        if p.roles.is_empty() {
            return Err(invalid(
                &at("roles"),
                "a phase needs at least one role".into(),
            ));
        }
        let mut seen = BTreeSet::new();
        for r in &p.roles {
            role_named(&at("roles"), r)?;
            if !seen.insert(r.as_str()) {
                return Err(invalid(
                    &at("roles"),
                    format!("role `{r}` is named twice in one phase"),
                ));
            }
            first_phase.entry(r.as_str()).or_insert(i);
        }
    }

    let mut phases = Vec::with_capacity(file.phases.len());
    for (i, p) in file.phases.iter().enumerate() {
        let at = |k: &str| format!("phases[{i}].{k}");
        let batch = p.batch.unwrap_or(false) || p.for_each.is_some();
        if p.batch == Some(false) && p.for_each.is_some() {
            return Err(invalid(
                &at("batch"),
                "a phase with `for_each` is a batch: its calls run in one step".into(),
            ));
        }
        if p.for_each.is_some() && p.roles.len() != 1 {
            return Err(invalid(
                &at("for_each"),
                "a phase with `for_each` calls exactly one role".into(),
            ));
        }
        let max_rounds = p.max_rounds.unwrap_or(1);
        if !(1..=MAX_ROUNDS).contains(&max_rounds) {
            return Err(PlanError::BadRule {
                key: at("max_rounds"),
                message: format!("must be between 1 and {MAX_ROUNDS}, got {max_rounds}"),
            });
        }
        // What a read in this phase may name: the roles of earlier phases;
        // in turn, the roles before it in its round; and in a repeated
        // phase, its own roles (their previous round's results).
        let reads = |key: &str, pointer: &str, for_role: Option<&str>| -> Result<(), PlanError> {
            check_pointer(key, pointer)?;
            if !pointer.starts_with('/') {
                return Err(invalid(
                    key,
                    "must name what it reads: /input, /round, /item or /<role>".into(),
                ));
            }
            let head = head_token(pointer);
            match head {
                "input" | "round" => return Ok(()),
                "item" if p.for_each.is_some() => return Ok(()),
                "item" => {
                    return Err(invalid(
                        key,
                        "`/item` is only known in a phase with `for_each`".into(),
                    ));
                }
                _ => {}
            }
            role_named(key, head)?;
            let Some(&first) = first_phase.get(head) else {
                return Err(invalid(key, format!("role `{head}` is called in no phase")));
            };
            let earlier_in_round = !batch
                && for_role.is_some_and(|r| {
                    let me = p.roles.iter().position(|x| x == r);
                    let other = p.roles.iter().position(|x| x == head);
                    matches!((me, other), (Some(m), Some(o)) if o < m)
                });
            let in_phase = p.roles.iter().any(|r| r == head);
            if first < i || earlier_in_round || (in_phase && max_rounds > 1) {
                Ok(())
            } else if in_phase {
                Err(PlanError::Cycle {
                    key: key.to_owned(),
                    message: format!(
                        "phase `{}` reads role `{head}`'s result in the same round it makes it",
                        p.name
                    ),
                })
            } else {
                Err(PlanError::Cycle {
                    key: key.to_owned(),
                    message: format!(
                        "phase `{}` reads role `{head}`'s result, which only phase `{}` after it makes",
                        p.name, file.phases[first].name
                    ),
                })
            }
        };
        if let Some(f) = &p.for_each {
            if head_token(f) == "item" {
                return Err(invalid(&at("for_each"), "cannot read `/item`".into()));
            }
            reads(&at("for_each"), f, None)?;
        }
        let default_input = if p.for_each.is_some() {
            "/item"
        } else {
            "/input"
        };
        let input = match &p.input {
            None => Input::Fields(BTreeMap::from([("task".into(), default_input.into())])),
            Some(InputEntry::Whole(pointer)) => Input::Whole(pointer.clone()),
            Some(InputEntry::Fields(fields)) => Input::Fields(fields.clone()),
        };
        // Every role of a phase gets the same input: checked for each.
        for role in &p.roles {
            match &input {
                Input::Whole(pointer) => reads(&at("input"), pointer, Some(role))?,
                Input::Fields(fields) => {
                    for (field, pointer) in fields {
                        reads(&at(&format!("input.{field}")), pointer, Some(role))?;
                    }
                }
            }
        }
        let until = match &p.until {
            None => None,
            Some(u) => {
                let key = at("until");
                if !p.roles.contains(&u.role) {
                    role_named(&format!("{key}.role"), &u.role)?;
                    return Err(PlanError::BadRule {
                        key: format!("{key}.role"),
                        message: format!(
                            "role `{}` is not called in phase `{}`: its result cannot end the phase",
                            u.role, p.name
                        ),
                    });
                }
                check_pointer(&format!("{key}.pointer"), &u.pointer).map_err(|e| match e {
                    PlanError::Invalid { key, message } => PlanError::BadRule { key, message },
                    other => other,
                })?;
                let mut tests = Vec::new();
                if let Some(v) = &u.equals {
                    tests.push(Test::Equals(v.clone()));
                }
                if let Some(v) = &u.not_equals {
                    tests.push(Test::NotEquals(v.clone()));
                }
                for (n, make) in [
                    (u.greater_than, Test::GreaterThan as fn(f64) -> Test),
                    (u.at_least, Test::AtLeast),
                    (u.less_than, Test::LessThan),
                    (u.at_most, Test::AtMost),
                ] {
                    if let Some(n) = n {
                        if !n.is_finite() {
                            return Err(PlanError::BadRule {
                                key: key.clone(),
                                message: format!("{n} is not a finite number"),
                            });
                        }
                        tests.push(make(n));
                    }
                }
                if tests.len() != 1 {
                    return Err(PlanError::BadRule {
                        key,
                        message: format!(
                            "needs exactly one test (equals, not_equals, greater_than, at_least, less_than, at_most), got {}",
                            tests.len()
                        ),
                    });
                }
                if max_rounds == 1 {
                    return Err(PlanError::BadRule {
                        key,
                        message:
                            "a stopping rule needs `max_rounds` above 1: it ends a repeated phase"
                                .into(),
                    });
                }
                Some(Condition {
                    role: u.role.clone(),
                    pointer: u.pointer.clone(),
                    test: tests.pop().expect("one test"),
                })
            }
        };
        phases.push(Phase {
            name: p.name.clone(),
            roles: p.roles.clone(),
            batch,
            for_each: p.for_each.clone(),
            input,
            max_rounds,
            until,
        });
    }
    role_named("result.role", &file.result.role)?;
    if !first_phase.contains_key(file.result.role.as_str()) {
        return Err(invalid(
            "result.role",
            format!("role `{}` is called in no phase", file.result.role),
        ));
    }
    check_pointer("result.pointer", &file.result.pointer)?;
    for role in file.roles.keys() {
        if !first_phase.contains_key(role.as_str()) {
            return Err(invalid(
                &format!("roles.{role}"),
                format!("role `{role}` is called in no phase"),
            ));
        }
    }
    let max_concurrent = file.max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT);
    if !(1..=MAX_CONCURRENT).contains(&max_concurrent) {
        return Err(invalid(
            "max_concurrent",
            format!("must be between 1 and {MAX_CONCURRENT}, got {max_concurrent}"),
        ));
    }
    Ok(Plan {
        name: file.name.clone(),
        max_concurrent,
        phases,
        result: Pick {
            role: file.result.role.clone(),
            pointer: file.result.pointer.clone(),
        },
    })
}

// ---- deciding ----

/// One scheduling decision, recorded with the plan's model call (a raw
/// block of format [`DECISION_FORMAT`]): the phases that ended since the
/// previous decision and why, then the next step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// The phases that ended since the previous decision, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended: Vec<PhaseEnded>,
    /// What happens next.
    pub next: Next,
}

/// A phase that ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseEnded {
    /// The phase.
    pub phase: String,
    /// The rounds it ran.
    pub rounds: u32,
    /// Why it ended.
    pub reason: EndReason,
    /// The value its stopping rule read last, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// Why a phase ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// It ran its rounds (it has no stopping rule).
    Rounds,
    /// Its stopping rule was met.
    Until,
    /// It ran `max_rounds` rounds without its stopping rule being met.
    MaxRounds,
}

/// The next step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Next {
    /// Call roles: one step with these calls.
    Calls {
        /// The phase.
        phase: String,
        /// Its index in the plan.
        phase_index: usize,
        /// The round, from 1.
        round: u32,
        /// In a phase run in turn, the role's index in the phase; 0 for a
        /// batch.
        position: usize,
        /// Whether the calls are a batch.
        batch: bool,
        /// A batch's calls in flight at once, at most.
        max_concurrent: u32,
        /// The calls, in order.
        calls: Vec<PlannedCall>,
    },
    /// The plan is done: its output is this part of a role's result.
    Finish(Pick),
}

/// One call a decision makes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedCall {
    /// The call's id in the model's answer.
    pub id: String,
    /// The role called.
    pub role: String,
    /// For `for_each`, the element's index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
}

/// Why a plan cannot go on: the plan's model call fails with it, so the
/// run fails naming it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
struct Stuck(String);

/// A recorded decision and the results of its calls, as the request
/// shows them.
struct Taken {
    decision: Decision,
    results: BTreeMap<String, (String, Result<Value, String>)>,
}

/// A decision with the arguments of its calls (in order) or, when it
/// finishes, the plan's output.
struct Decided {
    decision: Decision,
    arguments: Vec<Value>,
    output: Option<Value>,
}

/// Where a plan is: a phase, a round and a position in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct At {
    phase: usize,
    round: u32,
    position: usize,
}

/// What the plan knows: its input, and each role's last result.
struct Known {
    input: Value,
    results: BTreeMap<String, Value>,
}

impl Known {
    fn scope(&self, round: u32, item: Option<&Value>) -> Value {
        let mut scope = serde_json::Map::new();
        scope.insert("input".into(), self.input.clone());
        scope.insert("round".into(), json!(round));
        if let Some(item) = item {
            scope.insert("item".into(), item.clone());
        }
        for (role, result) in &self.results {
            scope.insert(role.clone(), result.clone());
        }
        Value::Object(scope)
    }
}

/// The value `pointer` finds in `scope`: a role that has not run yet reads
/// as null (a repeated phase's first round); anything else missing is an
/// error naming it.
fn read(scope: &Value, pointer: &str, what: &str) -> Result<Value, Stuck> {
    let head = head_token(pointer);
    if scope.get(head).is_none() {
        return Ok(Value::Null);
    }
    scope
        .pointer(pointer)
        .cloned()
        .ok_or_else(|| Stuck(format!("{what}: `{pointer}` finds nothing")))
}

impl Plan {
    /// The next decision, from the input and the decisions taken so far
    /// with their results: deterministic, so recovery decides the same.
    fn decide(&self, input: Value, taken: &[Taken]) -> Result<Decided, Stuck> {
        let mut known = Known {
            input,
            results: BTreeMap::new(),
        };
        let mut at = At {
            phase: 0,
            round: 1,
            position: 0,
        };
        let mut fresh = true;
        for (n, t) in taken.iter().enumerate() {
            let Next::Calls {
                phase_index,
                round,
                position,
                calls,
                ..
            } = &t.decision.next
            else {
                return Err(Stuck(
                    "the plan's result was refused (see the output rejection in the log)".into(),
                ));
            };
            let phase = self.phases.get(*phase_index).ok_or_else(|| {
                Stuck(format!(
                    "decision {} names phase {phase_index}, which the plan does not have",
                    n + 1
                ))
            })?;
            let mut by_role: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
            for call in calls {
                match t.results.get(&call.id) {
                    Some((_, Ok(v))) => by_role.entry(&call.role).or_default().push(v.clone()),
                    Some((_, Err(e))) => {
                        return Err(Stuck(format!(
                            "role `{}` failed in phase `{}`, round {round}: {e}",
                            call.role, phase.name
                        )));
                    }
                    None => {
                        return Err(Stuck(format!(
                            "role `{}`'s call `{}` has no result",
                            call.role, call.id
                        )));
                    }
                }
            }
            for role in &phase.roles {
                if let Some(mut values) = by_role.remove(role.as_str()) {
                    let value = if phase.for_each.is_some() {
                        Value::Array(values)
                    } else {
                        values.pop().unwrap_or(Value::Null)
                    };
                    known.results.insert(role.clone(), value);
                }
            }
            if phase.for_each.is_some() && calls.is_empty() {
                known.results.insert(phase.roles[0].clone(), json!([]));
            }
            at = At {
                phase: *phase_index,
                round: *round,
                position: *position,
            };
            fresh = false;
        }
        let mut ended = Vec::new();
        if !fresh {
            at = self.advance(at, &known, &mut ended)?;
        }
        loop {
            let Some(phase) = self.phases.get(at.phase) else {
                return Ok(Decided {
                    output: Some(self.output(&known.results)?),
                    decision: Decision {
                        ended,
                        next: Next::Finish(self.result.clone()),
                    },
                    arguments: Vec::new(),
                });
            };
            let calls = self.calls(phase, at, &known, taken.len() + 1)?;
            if !calls.is_empty() {
                let (calls, arguments) = calls.into_iter().unzip();
                return Ok(Decided {
                    decision: Decision {
                        ended,
                        next: Next::Calls {
                            phase: phase.name.clone(),
                            phase_index: at.phase,
                            round: at.round,
                            position: at.position,
                            batch: phase.batch,
                            max_concurrent: if phase.batch { self.max_concurrent } else { 1 },
                            calls,
                        },
                    },
                    arguments,
                    output: None,
                });
            }
            // A `for_each` over an empty array: the round calls nobody.
            known.results.insert(phase.roles[0].clone(), json!([]));
            at = self.advance(at, &known, &mut ended)?;
        }
    }

    /// Where the plan goes after the step at `at`: the next role of the
    /// round, the next round, or the next phase (recording why the phase
    /// ended).
    fn advance(&self, at: At, known: &Known, ended: &mut Vec<PhaseEnded>) -> Result<At, Stuck> {
        let phase = &self.phases[at.phase];
        if !phase.batch && at.position + 1 < phase.roles.len() {
            return Ok(At {
                position: at.position + 1,
                ..at
            });
        }
        let (reason, value) = match &phase.until {
            None => (
                (at.round >= phase.max_rounds).then_some(EndReason::Rounds),
                None,
            ),
            Some(c) => {
                let result = known.results.get(&c.role).cloned().unwrap_or(Value::Null);
                let what = format!(
                    "the stopping rule of phase `{}` (role `{}`)",
                    phase.name, c.role
                );
                let value = result
                    .pointer(&c.pointer)
                    .cloned()
                    .ok_or_else(|| Stuck(format!("{what}: `{}` finds nothing", c.pointer)))?;
                let met = c
                    .test
                    .passes(&value)
                    .map_err(|e| Stuck(format!("{what}: {e}")))?;
                let reason = if met {
                    Some(EndReason::Until)
                } else if at.round >= phase.max_rounds {
                    Some(EndReason::MaxRounds)
                } else {
                    None
                };
                (reason, Some(value))
            }
        };
        match reason {
            None => Ok(At {
                round: at.round + 1,
                position: 0,
                ..at
            }),
            Some(reason) => {
                ended.push(PhaseEnded {
                    phase: phase.name.clone(),
                    rounds: at.round,
                    reason,
                    value,
                });
                Ok(At {
                    phase: at.phase + 1,
                    round: 1,
                    position: 0,
                })
            }
        }
    }

    /// The calls of the step at `at`, each with its input (none for a
    /// `for_each` over an empty array); `decision` numbers their ids.
    fn calls(
        &self,
        phase: &Phase,
        at: At,
        known: &Known,
        decision: usize,
    ) -> Result<Vec<(PlannedCall, Value)>, Stuck> {
        let what = |role: &str| format!("the input of role `{role}` in phase `{}`", phase.name);
        let input_of = |role: &str, scope: &Value| -> Result<Value, Stuck> {
            match &phase.input {
                Input::Whole(p) => read(scope, p, &what(role)),
                Input::Fields(fields) => {
                    let mut object = serde_json::Map::new();
                    for (field, p) in fields {
                        object.insert(field.clone(), read(scope, p, &what(role))?);
                    }
                    Ok(Value::Object(object))
                }
            }
        };
        let mut out = Vec::new();
        let id = |n: usize| format!("plan-{decision}-{n}");
        if let Some(f) = &phase.for_each {
            let scope = known.scope(at.round, None);
            let items = match read(&scope, f, &format!("`for_each` of phase `{}`", phase.name))? {
                Value::Array(items) => items,
                Value::Null => Vec::new(),
                other => {
                    return Err(Stuck(format!(
                        "`for_each` of phase `{}`: `{f}` is not an array but {other}",
                        phase.name
                    )));
                }
            };
            let role = &phase.roles[0];
            for (i, item) in items.iter().enumerate() {
                let scope = known.scope(at.round, Some(item));
                let call = PlannedCall {
                    id: id(i + 1),
                    role: role.clone(),
                    item: Some(i),
                };
                out.push((call, input_of(role, &scope)?));
            }
        } else {
            let scope = known.scope(at.round, None);
            let roles = if phase.batch {
                &phase.roles[..]
            } else {
                &phase.roles[at.position..=at.position]
            };
            for (i, role) in roles.iter().enumerate() {
                let call = PlannedCall {
                    id: id(i + 1),
                    role: role.clone(),
                    item: None,
                };
                out.push((call, input_of(role, &scope)?));
            }
        }
        Ok(out)
    }

    /// The final output: the picked part of the picked role's last result.
    fn output(&self, known_results: &BTreeMap<String, Value>) -> Result<Value, Stuck> {
        let result = known_results.get(&self.result.role).ok_or_else(|| {
            Stuck(format!(
                "role `{}` made no result for the plan's output",
                self.result.role
            ))
        })?;
        result
            .pointer(&self.result.pointer)
            .cloned()
            .ok_or_else(|| {
                Stuck(format!(
                    "the plan's result: `{}` finds nothing in role `{}`'s result",
                    self.result.pointer, self.result.role
                ))
            })
    }
}

impl Test {
    /// Whether `value` passes; an error when a number was needed.
    fn passes(&self, value: &Value) -> Result<bool, String> {
        let number = |bound: f64| {
            value
                .as_f64()
                .ok_or_else(|| format!("{value} is not a number to compare with {bound}"))
        };
        Ok(match self {
            Test::Equals(v) => value == v,
            Test::NotEquals(v) => value != v,
            Test::GreaterThan(b) => number(*b)? > *b,
            Test::AtLeast(b) => number(*b)? >= *b,
            Test::LessThan(b) => number(*b)? < *b,
            Test::AtMost(b) => number(*b)? <= *b,
        })
    }
}

// ---- the provider ----

/// The plan as a model: reads the run's input and the results of the
/// calls it made from the request, and answers with the next step's calls
/// (and its [`Decision`] as a raw block), or with the final output. It
/// reads nothing but the request, so the same log decides the same.
#[derive(Debug)]
pub struct PlanProvider {
    plan: Arc<Plan>,
}

impl PlanProvider {
    /// The provider of `plan`.
    pub fn new(plan: Arc<Plan>) -> Self {
        PlanProvider { plan }
    }

    fn answer(&self, request: &ModelRequest) -> Result<Vec<ProviderEvent>, Stuck> {
        let (input, taken) = history(&request.messages)?;
        let Decided {
            decision,
            arguments,
            output,
        } = self.plan.decide(input, &taken)?;
        let mut events = Vec::new();
        match (&decision.next, output) {
            (
                Next::Calls {
                    phase,
                    round,
                    batch,
                    max_concurrent,
                    calls,
                    ..
                },
                _,
            ) => {
                let roles: Vec<&str> = calls.iter().map(|c| c.role.as_str()).collect();
                let how = if *batch {
                    format!(
                        "{} call{} at once, at most {max_concurrent} in flight",
                        calls.len(),
                        if calls.len() == 1 { "" } else { "s" }
                    )
                } else {
                    "in turn".to_owned()
                };
                events.push(ProviderEvent::TextDelta(format!(
                    "{}phase `{phase}`, round {round}: {} ({how})",
                    ended_text(&decision.ended),
                    roles.join(", ")
                )));
                for (call, arguments) in calls.iter().zip(arguments) {
                    events.push(ProviderEvent::ToolCall(ToolCall {
                        id: call.id.clone(),
                        name: call.role.clone(),
                        arguments,
                    }));
                }
                events.push(block(&decision));
                events.push(ProviderEvent::Stop(StopReason::ToolUse));
            }
            (Next::Finish(_), output) => {
                let output = output.expect("a finish carries the output");
                events.push(ProviderEvent::TextDelta(output.to_string()));
                events.push(block(&decision));
                events.push(ProviderEvent::Stop(StopReason::EndTurn));
            }
        }
        Ok(events)
    }
}

fn block(decision: &Decision) -> ProviderEvent {
    ProviderEvent::Block(RawBlock {
        format: DECISION_FORMAT.into(),
        index: 0,
        block: json!({ "decision": decision }),
    })
}

fn ended_text(ended: &[PhaseEnded]) -> String {
    ended
        .iter()
        .map(|e| {
            let why = match e.reason {
                EndReason::Rounds => "ran its rounds",
                EndReason::Until => "its stopping rule was met",
                EndReason::MaxRounds => "reached max_rounds",
            };
            format!(
                "phase `{}` ended after {} round{}: {why}; ",
                e.phase,
                e.rounds,
                if e.rounds == 1 { "" } else { "s" }
            )
        })
        .collect()
}

/// The run's input and the decisions taken, with their calls' results,
/// from a request's messages.
fn history(messages: &[Message]) -> Result<(Value, Vec<Taken>), Stuck> {
    let mut input = None;
    let mut taken: Vec<Taken> = Vec::new();
    for message in messages {
        match message {
            Message::User { content } if taken.is_empty() => {
                input = Some(match serde_json::from_str::<Value>(content) {
                    Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
                    _ => Value::String(content.clone()),
                });
            }
            Message::User { .. } => {}
            Message::Assistant { blocks, .. } => {
                let Some(b) = blocks.iter().find(|b| b.format == DECISION_FORMAT) else {
                    return Err(Stuck(
                        "a model answer in this run was not the plan's".into(),
                    ));
                };
                let decision: Decision =
                    serde_json::from_value(b.block.get("decision").cloned().unwrap_or(Value::Null))
                        .map_err(|e| Stuck(format!("a recorded decision is unreadable: {e}")))?;
                taken.push(Taken {
                    decision,
                    results: BTreeMap::new(),
                });
            }
            Message::Tool {
                call_id,
                name,
                content,
                is_error,
            } => {
                let Some(t) = taken.last_mut() else {
                    continue;
                };
                let result = if *is_error {
                    Err(content.clone())
                } else {
                    Ok(serde_json::from_str::<Value>(content)
                        .unwrap_or_else(|_| Value::String(content.clone())))
                };
                t.results.insert(call_id.clone(), (name.clone(), result));
            }
        }
    }
    let input = input.ok_or_else(|| Stuck("the request has no input".into()))?;
    Ok((input, taken))
}

impl ModelProvider for PlanProvider {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    fn stream(&self, request: &ModelRequest) -> ModelStream {
        let items: Vec<Result<ProviderEvent, ProviderError>> = match self.answer(request) {
            Ok(events) => events.into_iter().map(Ok).collect(),
            Err(Stuck(message)) => vec![Err(ProviderError::Remote {
                provider: PROVIDER_NAME.into(),
                kind: "plan_stuck".into(),
                message,
                transient: false,
            })],
        };
        Box::pin(futures::stream::iter(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> Result<Plan, PlanError> {
        check(&toml::from_str(text).unwrap())
    }

    const ROLES: &str = r#"
name = "p"
max_concurrent = 2
[roles.planner]
agent = "planner.toml"
[roles.worker]
agent = "worker.toml"
[roles.reviewer]
agent = "reviewer.toml"
[result]
role = "reviewer"
"#;

    #[test]
    fn a_read_of_a_later_phase_is_a_cycle() {
        let text = format!(
            "{ROLES}\n[[phases]]\nname = \"plan\"\nroles = [\"planner\"]\ninput = {{ notes = \"/reviewer/notes\" }}\n[[phases]]\nname = \"work\"\nroles = [\"worker\", \"reviewer\"]\n"
        );
        match plan(&text).unwrap_err() {
            PlanError::Cycle { key, message } => {
                assert_eq!(key, "phases[0].input.notes");
                assert!(
                    message.contains("only phase `work` after it makes"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_repeated_phase_reads_its_own_previous_round() {
        let text = format!(
            "{ROLES}\n[[phases]]\nname = \"plan\"\nroles = [\"planner\"]\n[[phases]]\nname = \"work\"\nroles = [\"worker\", \"reviewer\"]\ninput = {{ plan = \"/planner\", feedback = \"/reviewer/notes\" }}\nmax_rounds = 3\nuntil = {{ role = \"reviewer\", pointer = \"/ok\", equals = true }}\n"
        );
        let p = plan(&text).unwrap();
        assert_eq!(p.phases[1].max_rounds, 3);
        // Without the repetition, the worker would read a result its own
        // round makes after it.
        let once = text.replace(
            "max_rounds = 3\nuntil = { role = \"reviewer\", pointer = \"/ok\", equals = true }\n",
            "",
        );
        assert!(matches!(plan(&once), Err(PlanError::Cycle { .. })));
    }

    #[test]
    fn rules_must_stop_and_test_one_thing() {
        let base = format!(
            "{ROLES}\n[[phases]]\nname = \"plan\"\nroles = [\"planner\", \"worker\", \"reviewer\"]\n"
        );
        for (rule, key) in [
            (
                "until = { role = \"reviewer\", pointer = \"/ok\", equals = true }\n",
                "phases[0].until",
            ),
            (
                "max_rounds = 2\nuntil = { role = \"reviewer\", pointer = \"/ok\" }\n",
                "phases[0].until",
            ),
            (
                "max_rounds = 2\nuntil = { role = \"reviewer\", pointer = \"/n\", at_least = 1, at_most = 3 }\n",
                "phases[0].until",
            ),
            (
                "max_rounds = 2\nuntil = { role = \"reviewer\", pointer = \"n\", equals = 1 }\n",
                "phases[0].until.pointer",
            ),
            ("max_rounds = 0\n", "phases[0].max_rounds"),
        ] {
            match plan(&format!("{base}{rule}")) {
                Err(PlanError::BadRule { key: k, .. }) => assert_eq!(k, key, "{rule}"),
                other => panic!("{rule}: {other:?}"),
            }
        }
    }

    fn taken(decision: Decision, results: &[(&str, Value)]) -> Taken {
        Taken {
            decision,
            results: results
                .iter()
                .map(|(id, v)| ((*id).to_owned(), (String::new(), Ok(v.clone()))))
                .collect(),
        }
    }

    #[test]
    fn decisions_follow_phases_rounds_and_rules() {
        let text = format!(
            "{ROLES}\n[[phases]]\nname = \"plan\"\nroles = [\"planner\"]\n[[phases]]\nname = \"work\"\nroles = [\"worker\"]\nfor_each = \"/planner/parts\"\n[[phases]]\nname = \"review\"\nroles = [\"reviewer\"]\ninput = {{ work = \"/worker\", round = \"/round\" }}\nmax_rounds = 3\nuntil = {{ role = \"reviewer\", pointer = \"/score\", at_least = 2 }}\n"
        );
        let p = plan(&text).unwrap();
        let mut log = Vec::new();
        let first = p.decide(json!("go"), &log).unwrap().decision;
        assert!(
            matches!(&first.next, Next::Calls { phase, calls, .. } if phase == "plan" && calls.len() == 1)
        );
        log.push(taken(
            first,
            &[("plan-1-1", json!({"parts": ["a", "b", "c"]}))],
        ));
        let second = p.decide(json!("go"), &log).unwrap().decision;
        match &second.next {
            Next::Calls {
                phase,
                calls,
                batch,
                max_concurrent,
                ..
            } => {
                assert_eq!(phase, "work");
                assert!(*batch);
                assert_eq!(*max_concurrent, 2);
                assert_eq!(calls.len(), 3);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(second.ended[0].reason, EndReason::Rounds);
        log.push(taken(
            second,
            &[
                ("plan-2-1", json!(1)),
                ("plan-2-2", json!(2)),
                ("plan-2-3", json!(3)),
            ],
        ));
        // The reviewer scores 1, then 2: the rule ends the phase at round 2.
        for (n, score) in [(3, 1), (4, 2)] {
            let d = p.decide(json!("go"), &log).unwrap().decision;
            assert!(
                matches!(&d.next, Next::Calls { phase, round, .. } if phase == "review" && *round == n - 2)
            );
            log.push(taken(
                d,
                &[(&format!("plan-{n}-1"), json!({"score": score}))],
            ));
        }
        let decided = p.decide(json!("go"), &log).unwrap();
        assert_eq!(decided.output, Some(json!({"score": 2})));
        let last = decided.decision;
        assert_eq!(
            last.next,
            Next::Finish(Pick {
                role: "reviewer".into(),
                pointer: String::new()
            })
        );
        assert_eq!(last.ended[0].reason, EndReason::Until);
        assert_eq!(last.ended[0].rounds, 2);
        assert_eq!(last.ended[0].value, Some(json!(2)));
    }
}
