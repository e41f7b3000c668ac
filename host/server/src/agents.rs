//! The agents a server starts runs of, and what it shows of them: only the
//! agent files the operator configured for the server (`warden serve
//! --agent FILE`, `--agents DIR`, `[serve] agents` in `warden.toml`),
//! loaded and checked when it starts, each named by its `name`. A request
//! names an agent, never a path, so a token cannot make the server read or
//! run a file the operator did not choose.
//!
//! - `GET /agents`: the configured agents;
//! - `POST /runs` (operator): start a run of one (the server drives it,
//!   like `warden run`) or submit it (queued for workers, like `warden
//!   submit`); the run is labelled with who started it
//!   ([`STARTED_BY_LABEL`]);
//! - `POST /runs/{run}/fork` (operator): fork a run at a position, going on
//!   with its own agent or a configured one (`warden runs fork`); the
//!   server drives the fork, as nobody else would;
//! - `GET /plugins`: each configured agent's plugins and the grants the
//!   operator gave them, read-only, config values left out (they may be
//!   secrets).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use warden::engine::budget::parse_extension;
use warden::engine::{Agent, BudgetLimits, ForkOptions, RunId, SessionId, StartOptions};
use warden::plugins::PluginSource;

use crate::App;
use crate::api::{Body, Segment};
use crate::contract;
use crate::error::ApiError;
use crate::guard::Caller;
use crate::tokens::Role;

/// The label a run started through the API carries: `api:<token name>`,
/// who started it (a run's start records no `by` of its own).
pub const STARTED_BY_LABEL: &str = "warden.started_by";

/// The agents a server serves, by name.
#[derive(Clone, Debug, Default)]
pub struct Agents {
    by_name: BTreeMap<String, Agent>,
}

/// Two configured agent files with one name: a request could not say which.
#[derive(Debug, thiserror::Error)]
#[error(
    "agents `{first}` and `{second}` are both named `{name}`: a request names an agent by its name, so each served agent needs its own"
)]
pub struct DuplicateAgent {
    /// The name.
    pub name: String,
    /// The first file.
    pub first: String,
    /// The second file.
    pub second: String,
}

impl Agents {
    /// The agents `agents`, refused when two share a name.
    pub fn new(agents: Vec<Agent>) -> Result<Agents, DuplicateAgent> {
        let mut by_name = BTreeMap::new();
        for agent in agents {
            if let Some(first) = by_name.get(&agent.name) {
                let first: &Agent = first;
                return Err(DuplicateAgent {
                    name: agent.name.clone(),
                    first: first.path.display().to_string(),
                    second: agent.path.display().to_string(),
                });
            }
            by_name.insert(agent.name.clone(), agent);
        }
        Ok(Agents { by_name })
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&Agent> {
        self.by_name.get(name)
    }

    /// Every agent, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Agent> {
        self.by_name.values()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The agent named `name`, or `agent_not_served`.
    fn served(&self, name: &str) -> Result<&Agent, ApiError> {
        self.get(name).ok_or_else(|| {
            let served: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
            ApiError::new(
                "agent_not_served",
                if served.is_empty() {
                    format!(
                        "this server serves no agent, so none named `{name}`: start it with `--agent FILE` or `--agents DIR`"
                    )
                } else {
                    format!(
                        "this server serves no agent named `{name}` (it serves {})",
                        served.join(", ")
                    )
                },
            )
            .with_details(json!({ "agent": name, "served": served }))
        })
    }
}

fn source_text(source: &PluginSource) -> String {
    match source {
        PluginSource::Manifest(path) => path.display().to_string(),
        PluginSource::Builtin(name) => format!("builtin:{name}"),
    }
}

/// `GET /api/v1/agents` (viewer): the agents this server starts runs of.
pub async fn list(State(app): State<Arc<App>>) -> Json<Value> {
    let agents: Vec<Value> = app
        .agents
        .iter()
        .map(|a| {
            json!({
                "name": a.name,
                "description": a.description,
                "file": a.path.display().to_string(),
                "model": { "provider": a.model.provider, "name": a.model.name },
                "plugins": a.plugins.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(),
                "labels": a.labels,
                "digest": a.digest,
            })
        })
        .collect();
    Json(json!({ "v": contract::VERSION, "agents": agents }))
}

/// The body of `POST /api/v1/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRun {
    /// A configured agent's name.
    agent: String,
    /// The run's input (default: the empty string, as `warden run`).
    #[serde(default)]
    input: Option<Value>,
    /// Labels of the run's own.
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// The session the run joins.
    #[serde(default)]
    session: Option<String>,
    /// The run's id (default: random).
    #[serde(default)]
    run_id: Option<String>,
    /// Queue it for workers instead of driving it here.
    #[serde(default)]
    submit: bool,
}

/// `POST /api/v1/runs` (operator): starts a run of a configured agent and
/// drives it here, or with `"submit": true` queues it for workers.
/// Answers 201 with the run summary.
pub async fn start(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Body(body): Body<NewRun>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Role::Operator)?;
    let agent = app.agents.served(&body.agent)?.clone();
    let run_id = match &body.run_id {
        Some(id) => {
            RunId::new(id.as_str()).map_err(|e| ApiError::new("invalid_run_id", e.to_string()))?
        }
        None => RunId::from_random(rand::random()),
    };
    let session = body
        .session
        .as_deref()
        .map(|s| SessionId::new(s).map_err(|e| ApiError::new("invalid_session_id", e.to_string())))
        .transpose()?;
    if body.labels.contains_key(STARTED_BY_LABEL) {
        return Err(ApiError::new(
            "usage",
            format!("label `{STARTED_BY_LABEL}` is the server's: it records who started the run"),
        ));
    }
    let mut labels = body.labels;
    labels.insert(STARTED_BY_LABEL.into(), caller.by());
    let mut options = StartOptions::new().id(run_id.clone()).labels(labels);
    if let Some(session) = &session {
        options = options.session(session.clone());
    }
    let input = body.input.unwrap_or_else(|| Value::String(String::new()));
    let status = if body.submit {
        app.runtime
            .submit(&agent, input, options)
            .await
            .map_err(|e| app.fail(&e))?;
        warden::store::QUEUED
    } else {
        app.runtime
            .start(&agent, input, options)
            .await
            .map_err(|e| app.fail(&e))?;
        app.drive(&run_id, agent);
        warden::engine::RunStatus::Running.as_str()
    };
    let mut reply = contract::summary(&run_id, status, &[], None, &[]);
    reply["agent"] = json!(body.agent);
    if let Some(session) = &session {
        reply["session"] = json!(session);
    }
    Ok((StatusCode::CREATED, Json(reply)))
}

/// The body of `POST /api/v1/runs/{run}/fork`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewFork {
    /// The last position the fork inherits (1 keeps only the start).
    at: u64,
    /// A configured agent to go on with (default: the run's own).
    #[serde(default)]
    agent: Option<String>,
    /// Budgets replacing those in force, as the agent file writes them:
    /// `{"max_steps": 20, "max_wall_time": "10m"}`.
    #[serde(default)]
    budgets: Option<Value>,
    /// The fork's id (default: random).
    #[serde(default)]
    run_id: Option<String>,
}

/// `POST /api/v1/runs/{run}/fork` (operator): forks the run at `at` and
/// drives the fork here. Answers 201 with the fork's run summary and
/// `forked_from`.
pub async fn fork(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<NewFork>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(Role::Operator)?;
    let run =
        RunId::new(run.as_str()).map_err(|e| ApiError::new("invalid_run_id", e.to_string()))?;
    let fork_id = body
        .run_id
        .as_deref()
        .map(|id| RunId::new(id).map_err(|e| ApiError::new("invalid_run_id", e.to_string())))
        .transpose()?;
    let budgets = match &body.budgets {
        Some(budgets) => parse_extension(budgets).map_err(|e| {
            ApiError::new("usage", format!("budgets: {e}"))
                .with_details(json!({ "budgets": budgets }))
        })?,
        None => BudgetLimits::default(),
    };
    // The source's own agent, from the file its log records, names what
    // the fork changes; a configured agent may replace it.
    let source_agent = app.agent_of(&run).await;
    let (agent, source_agent) = match &body.agent {
        Some(name) => (app.agents.served(name)?.clone(), source_agent.ok()),
        None => {
            let agent = source_agent?;
            (agent.clone(), Some(agent))
        }
    };
    let fork = app
        .runtime
        .fork(
            &run,
            body.at,
            ForkOptions {
                agent: &agent,
                source_agent: source_agent.as_ref(),
                budgets,
                run_id: fork_id,
                by: caller.by(),
            },
        )
        .await
        .map_err(|e| app.fail(&e))?;
    let status = app
        .runtime
        .state(&fork)
        .await
        .map_err(|e| app.fail(&e))?
        .status();
    if status == warden::engine::RunStatus::Running {
        app.drive(&fork, agent);
    }
    let mut reply = contract::summary(&fork, status.as_str(), &[], None, &[]);
    reply["forked_from"] = json!({ "run_id": run, "at": body.at });
    Ok((StatusCode::CREATED, Json(reply)))
}

/// `GET /api/v1/plugins` (viewer): each configured agent's plugins and
/// what the operator granted them: mounts (directory, access,
/// exclusions), the names of the environment variables passed, outbound
/// hosts, limits, tool overrides, approval rules, and the names (not the
/// values) of config entries.
pub async fn plugins(State(app): State<Arc<App>>) -> Json<Value> {
    let plugins: Vec<Value> = app
        .agents
        .iter()
        .flat_map(|agent| {
            agent.plugins.iter().map(move |p| {
                let g = &p.grant;
                let mounts: serde_json::Map<String, Value> = g
                    .mounts
                    .iter()
                    .map(|(name, m)| {
                        let dir = if m.dir.is_absolute() {
                            m.dir.clone()
                        } else {
                            p.grant_base.join(&m.dir)
                        };
                        (
                            name.clone(),
                            json!({
                                "dir": dir.display().to_string(),
                                "access": m.access,
                                "exclude": m.exclude,
                            }),
                        )
                    })
                    .collect();
                let approval: serde_json::Map<String, Value> = p
                    .approval
                    .iter()
                    .map(|(tool, rule)| (tool.clone(), json!(rule)))
                    .collect();
                json!({
                    "agent": agent.name,
                    "key": p.key,
                    "source": source_text(&p.source),
                    "grant": {
                        "mounts": mounts,
                        "env": g.env,
                        "hosts": g.hosts,
                        "limits": g.limits,
                        "config_keys": g.config.keys().collect::<Vec<_>>(),
                        "tools": g.tools,
                        "widened": g.widened,
                    },
                    "approval": approval,
                })
            })
        })
        .collect();
    Json(json!({ "v": contract::VERSION, "plugins": plugins }))
}
