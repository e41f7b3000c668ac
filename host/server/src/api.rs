//! The JSON API under `/api/v1`: runs (list, show, events), the verbs on a
//! run, sessions and idempotency keys. Each verb records one event through
//! the runtime, as the command line's verbs do: the worker holding the run
//! (or the next to claim it) picks the decision up, and a run no worker
//! ever held the server continues itself. Every decision records
//! `api:<token name>` as who made it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, FromRequest, FromRequestParts, State};
use serde::Deserialize;
use serde_json::{Value, json};

use warden::engine::approval_prompt::ApprovalPrompt;
use warden::engine::events::Event;
use warden::engine::state::ToolCallProgress;
use warden::engine::{
    ApprovalScope, BudgetKind, CallId, RuleSpec, RunId, RunState, RunStatus, SessionId, decode,
    fold,
};
use warden::store::{CommitmentFilter, RunFilter, RunPosition, RunSummary, StoredEvent};

use crate::App;
use crate::contract::{self, NextStep};
use crate::error::ApiError;
use crate::guard::Caller;
use crate::tokens::Role;

type Reply = Result<Json<Value>, ApiError>;

/// A JSON request body; a malformed one is a `usage` error in the envelope.
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Body<T>(pub T);

/// A request's query; a malformed one is a `usage` error in the envelope.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Params<T>(pub T);

/// A path segment; a malformed one is a `usage` error in the envelope.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Segment<T>(pub T);

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::new(text).map_err(|e| ApiError::new("invalid_run_id", e.to_string()))
}

fn session_id(text: &str) -> Result<SessionId, ApiError> {
    SessionId::new(text).map_err(|e| ApiError::new("invalid_session_id", e.to_string()))
}

/// `GET /api/v1/whoami`: the caller's token name and role.
pub async fn whoami(Extension(caller): Extension<Caller>) -> Json<Value> {
    Json(json!({ "v": contract::VERSION, "name": caller.name, "role": caller.role }))
}

/// The query of `GET /api/v1/runs`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    agent: Option<String>,
    /// One status, or several separated by commas.
    status: Option<String>,
    session: Option<String>,
    /// `KEY=VALUE`, several separated by commas.
    label: Option<String>,
    /// The start of the run's id.
    id_prefix: Option<String>,
    /// Created at or after (ms since the epoch).
    since_ms: Option<i64>,
    /// Created before (ms since the epoch).
    before_ms: Option<i64>,
    /// `newest` (the default) or `oldest` first.
    order: Option<String>,
    /// The `next` of the page before.
    cursor: Option<String>,
    limit: Option<usize>,
}

/// How many runs a page holds unless the request says.
pub const PAGE: usize = 50;
/// The most runs a page holds.
pub const MAX_PAGE: usize = 500;

/// A page's `next`: where the next page starts, as text a client passes
/// back without reading (hex, so it is safe in a query as it is).
fn cursor(position: &RunPosition) -> String {
    format!("{}:{}", position.created_ms, position.run_id)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A cursor read back, or `usage` naming it.
fn position(cursor: &str) -> Result<RunPosition, ApiError> {
    let refused = || {
        ApiError::new(
            "usage",
            format!("cursor `{cursor}` is not one this server gave: pass a page's `next` as it is, or start again without one"),
        )
        .with_details(json!({ "cursor": cursor }))
    };
    let bytes = (0..cursor.len())
        .step_by(2)
        .map(|i| {
            cursor
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(refused)?;
    let text = String::from_utf8(bytes).map_err(|_| refused())?;
    let (created, run) = text.split_once(':').ok_or_else(refused)?;
    Ok(RunPosition {
        created_ms: created.parse().map_err(|_| refused())?,
        run_id: RunId::new(run).map_err(|_| refused())?,
    })
}

fn row(r: &RunSummary) -> Value {
    json!({
        "run_id": r.run_id,
        "agent": r.agent,
        "status": r.status,
        "labels": r.labels,
        "session": r.session,
        "created_ms": r.created_ms,
        "updated_ms": r.updated_ms,
        "events": r.event_count,
        "owes_deliveries": r.owes_deliveries,
        "wake_ms": r.wake_ms,
    })
}

/// `GET /api/v1/runs`: one page of the runs, filtered, newest first unless
/// asked otherwise, and `next`, the cursor of the page after (null on the
/// last page). Each page is one read of the store's listing index.
pub async fn list(State(app): State<Arc<App>>, Params(q): Params<ListQuery>) -> Reply {
    let mut filter = RunFilter::new();
    if let Some(statuses) = &q.status {
        for status in statuses.split(',').filter(|s| !s.is_empty()) {
            let known = status == warden::store::QUEUED
                || RunStatus::ALL.iter().any(|s| s.as_str() == status);
            if !known {
                return Err(ApiError::new("usage", format!("unknown status `{status}`"))
                    .with_details(json!({ "status": status })));
            }
            filter = filter.status(status);
        }
    }
    if let Some(agent) = q.agent {
        filter = filter.agent(agent);
    }
    if let Some(session) = &q.session {
        filter = filter.session(session_id(session)?.to_string());
    }
    if let Some(labels) = &q.label {
        for pair in labels.split(',').filter(|s| !s.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(ApiError::new(
                    "usage",
                    format!("label `{pair}`: expected KEY=VALUE"),
                ));
            };
            filter = filter.label(k, v);
        }
    }
    // A prefix of an id is an id itself (or empty: every run).
    if let Some(prefix) = q.id_prefix.filter(|p| !p.is_empty()) {
        filter = filter.id_prefix(run_id(&prefix)?.as_str());
    }
    if let Some(since) = q.since_ms {
        filter = filter.created_since(since);
    }
    if let Some(before) = q.before_ms {
        filter = filter.created_before(before);
    }
    match q.order.as_deref() {
        None | Some("newest") => filter = filter.newest_first(),
        Some("oldest") => {}
        Some(other) => {
            return Err(ApiError::new(
                "usage",
                format!("order `{other}`: expected `newest` or `oldest`"),
            )
            .with_details(json!({ "order": other })));
        }
    }
    if let Some(cursor) = &q.cursor {
        filter = filter.after(position(cursor)?);
    }
    let limit = q.limit.unwrap_or(PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::new(
            "usage",
            format!("limit {limit}: a page holds 1 to {MAX_PAGE} runs; follow `next` for more"),
        )
        .with_details(json!({ "limit": limit, "max": MAX_PAGE })));
    }
    // One more than the page says whether there is a next page.
    let mut runs = app
        .runtime
        .store()
        .list(&filter.limit(limit + 1))
        .await
        .map_err(|e| app.fail(&e))?;
    let next = if runs.len() > limit {
        runs.truncate(limit);
        runs.last().map(|r| cursor(&RunPosition::of(r)))
    } else {
        None
    };
    Ok(Json(json!({
        "v": contract::VERSION,
        "runs": runs.iter().map(row).collect::<Vec<_>>(),
        "next": next,
    })))
}

/// A run's log, decoded and folded.
async fn load(app: &App, run: &RunId) -> Result<(Vec<(u64, Event)>, RunState), ApiError> {
    let stored = app
        .runtime
        .store()
        .load(run)
        .await
        .map_err(|e| app.fail(&e))?;
    decode_log(app, run, &stored).await
}

/// A stored log, decoded and folded (its session history resolved for
/// the fold; the events are as recorded).
async fn decode_log(
    app: &App,
    run: &RunId,
    stored: &[StoredEvent],
) -> Result<(Vec<(u64, Event)>, RunState), ApiError> {
    let mut events = Vec::with_capacity(stored.len());
    for s in stored {
        let event = decode(&s.bytes).map_err(|error| {
            app.fail(&warden::engine::RuntimeError::Log {
                run_id: run.clone(),
                seq: s.seq,
                error,
            })
        })?;
        events.push((s.seq, event));
    }
    let mut plain: Vec<Event> = events.iter().map(|(_, e)| e.clone()).collect();
    warden::engine::resolve_history(app.runtime.store().as_ref(), &mut plain)
        .await
        .map_err(|e| app.fail(&e))?;
    let state = fold(&plain).map_err(|error| {
        app.fail(&warden::engine::RuntimeError::Fold {
            run_id: run.clone(),
            error,
        })
    })?;
    Ok((events, state))
}

/// What can be done about the run through the API, as run-summary `next`
/// steps whose `command` is the request.
fn next_steps(run: &RunId, state: &RunState, pending: Option<&str>) -> Vec<NextStep> {
    let verb = |action: &'static str, path: &str, body: &str| NextStep {
        action,
        command: format!("POST /api/v1/runs/{run}/{path} {body}"),
    };
    match state.status() {
        RunStatus::AwaitingApproval => {
            let call = pending.unwrap_or("<call>");
            vec![
                verb(
                    "approve",
                    "approve",
                    &format!("{{\"call_id\": \"{call}\"}}"),
                ),
                verb(
                    "deny",
                    "deny",
                    &format!("{{\"call_id\": \"{call}\", \"reason\": \"…\"}}"),
                ),
            ]
        }
        RunStatus::Suspended => vec![verb("answer", "resume", "{\"input\": …}")],
        RunStatus::BudgetExceeded => vec![verb("extend", "resume", "{\"input\": {…}}")],
        RunStatus::NeedsReconciliation => vec![
            verb("resolve", "resolve", "{\"output\": …}"),
            verb("abandon", "abandon", "{\"reason\": \"…\"}"),
        ],
        _ => Vec::new(),
    }
}

/// `GET /api/v1/runs/{run}`: a run summary with its state, budgets, the
/// call awaiting a decision, its receipts and its events.
pub async fn show(State(app): State<Arc<App>>, Segment(run): Segment<String>) -> Reply {
    let run = run_id(&run)?;
    let summary = app
        .runtime
        .store()
        .summary(&run)
        .await
        .map_err(|e| app.fail(&e))?;
    let stored = app
        .runtime
        .store()
        .load(&run)
        .await
        .map_err(|e| app.fail(&e))?;
    let (events, state) = decode_log(&app, &run, &stored).await?;
    let mut body = detail(&run, &summary, &events, &state);
    body["children"] = json!(children(&app, &events).await);
    Ok(Json(body))
}

/// The run's child runs (agents it called), each with its listed status.
async fn children(app: &App, events: &[(u64, Event)]) -> Vec<Value> {
    let mut children = Vec::new();
    for (_, event) in events {
        if let Event::ChildStarted(c) = event {
            let status = app
                .runtime
                .store()
                .summary(&c.child_run)
                .await
                .ok()
                .map(|s| s.status);
            children.push(json!({
                "call_id": c.call_id,
                "run_id": c.child_run,
                "agent": c.agent,
                "status": status,
            }));
        }
    }
    children
}

/// The approval prompt for `call_id`, as text.
fn approval_prompt(events: &[(u64, Event)], state: &RunState, call_id: &CallId) -> Option<String> {
    events.iter().rev().find_map(|(_, event)| match event {
        Event::ApprovalRequested(a) if &a.call_id == call_id => {
            Some(ApprovalPrompt::new(a, Some(state)).text())
        }
        _ => None,
    })
}

/// What `show` answers about a run (but its children), from its listing
/// and its decoded log: the inbox builds the same from one batch load.
fn detail(run: &RunId, summary: &RunSummary, events: &[(u64, Event)], state: &RunState) -> Value {
    let status = state.status();
    let pending = state.next_call().and_then(|call| match &call.progress {
        ToolCallProgress::AwaitingApproval => Some(json!({
            "call_id": call.call_id,
            "tool": call.call.name,
            "arguments": call.call.arguments,
            "digest": call.digest(),
            "awaiting": "approval",
            // What a person is shown (the one prompt every surface shows):
            // Warden's line, the frozen arguments, then the plugin's
            // preview framed as its words, all made safe to show.
            "prompt": approval_prompt(events, state, &call.call_id),
        })),
        ToolCallProgress::Suspended { reason, schema } => Some(json!({
            "call_id": call.call_id,
            "tool": call.call.name,
            "awaiting": "input",
            "reason": reason,
            "schema": schema,
        })),
        _ => None,
    });
    let pending_call = pending
        .as_ref()
        .and_then(|p| p["call_id"].as_str().map(str::to_owned));
    let limits = state.effective_limits(&Default::default());
    let budget: serde_json::Map<String, Value> = BudgetKind::ORDER
        .iter()
        .map(|k| {
            (
                k.as_str().to_owned(),
                json!({ "used": state.usage.get(*k), "limit": limits.get(*k) }),
            )
        })
        .collect();
    let receipts: Vec<Value> = events
        .iter()
        .filter_map(|(seq, e)| match e {
            Event::ToolCallCompleted(c) => {
                Some(json!({ "seq": seq, "call_id": c.call_id, "receipt": c.receipt }))
            }
            _ => None,
        })
        .collect();
    let plain: Vec<Event> = events.iter().map(|(_, e)| e.clone()).collect();
    let parent = match plain.first() {
        Some(Event::RunStarted(s)) => s.parent.clone(),
        _ => None,
    };
    let next = next_steps(run, state, pending_call.as_deref());
    // Queued runs are listed so before their log says more.
    let shown = if summary.status == warden::store::QUEUED {
        warden::store::QUEUED
    } else {
        status.as_str()
    };
    let mut body = contract::summary(run, shown, &plain, state.output(), &next);
    let more = json!({
        "agent": state.agent,
        "labels": state.labels,
        "session": summary.session,
        "input": state.input,
        "created_ms": summary.created_ms,
        "updated_ms": summary.updated_ms,
        "budget": budget,
        "pending": pending,
        "receipts": receipts,
        "owes_deliveries": summary.owes_deliveries,
        "wake_ms": state.waiting().map(|w| w.until_ms),
        "parent": parent,
        "children": [],
        "events": events.iter().map(|(seq, e)| contract::event_line(*seq, e)).collect::<Vec<_>>(),
    });
    for (key, value) in more.as_object().expect("an object") {
        body[key] = value.clone();
    }
    body
}

/// The statuses in which a run waits for a person: what the inbox lists.
pub const WAITING_FOR_A_PERSON: &[RunStatus] = &[
    RunStatus::AwaitingApproval,
    RunStatus::Suspended,
    RunStatus::BudgetExceeded,
    RunStatus::NeedsReconciliation,
];

/// `GET /api/v1/inbox`: every run waiting for a person (an approval, an
/// input, a budget, a reconciliation), across every worker, each as `show`
/// describes it (without children), oldest first. One listing and one
/// batch load ([`load_many`](warden::store::EventStore::load_many)),
/// however many runs wait: the console polls it.
pub async fn inbox(State(app): State<Arc<App>>) -> Reply {
    let mut filter = RunFilter::new();
    for status in WAITING_FOR_A_PERSON {
        filter = filter.status(status.as_str());
    }
    let store = app.runtime.store();
    let listed = store.list(&filter).await.map_err(|e| app.fail(&e))?;
    let ids: Vec<RunId> = listed.iter().map(|r| r.run_id.clone()).collect();
    let logs = store.load_many(&ids).await.map_err(|e| app.fail(&e))?;
    let mut runs = Vec::with_capacity(logs.len());
    for (run, stored) in &logs {
        let Some(summary) = listed.iter().find(|r| r.run_id == *run) else {
            continue;
        };
        let (events, state) = decode_log(&app, run, stored).await?;
        // The listing is a step behind a decision made meanwhile: the log
        // says whether the run still waits.
        if WAITING_FOR_A_PERSON.contains(&state.status()) {
            runs.push(detail(run, summary, &events, &state));
        }
    }
    Ok(Json(json!({ "v": contract::VERSION, "runs": runs })))
}

/// The query of `GET /api/v1/runs/{run}/events`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only the events after this position.
    after: Option<u64>,
}

/// `GET /api/v1/runs/{run}/events`: the run's event lines, after `after`.
pub async fn events(
    State(app): State<Arc<App>>,
    Segment(run): Segment<String>,
    Params(q): Params<EventsQuery>,
) -> Reply {
    let run = run_id(&run)?;
    let lines = app.event_lines(&run, q.after.unwrap_or(0)).await?;
    Ok(Json(json!({ "v": contract::VERSION, "events": lines })))
}

/// The body of approve.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approve {
    call_id: String,
    /// When given, the approval is refused (`digest_mismatch`) unless the
    /// call's digest is this one: the approver approves what they saw.
    #[serde(default)]
    digest: Option<String>,
    /// `call` (default), `run` or `session`: a wider scope is a standing
    /// rule, which only an operator may make.
    #[serde(default)]
    scope: Option<String>,
    /// With a wider scope, when the rule expires (ms since the epoch).
    #[serde(default)]
    expires_ms: Option<i64>,
}

/// The body of deny.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deny {
    call_id: String,
    reason: String,
}

/// The body of resume.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    input: Value,
}

/// The body of resolve.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resolve {
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    note: Option<String>,
}

/// The body of cancel and abandon.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    #[serde(default)]
    reason: Option<String>,
}

/// The run summary after a verb.
async fn after_verb(app: &App, run: &RunId) -> Reply {
    let (events, state) = load(app, run).await?;
    let plain: Vec<Event> = events.into_iter().map(|(_, e)| e).collect();
    let pending = state.next_call().map(|c| c.call_id.to_string());
    let next = next_steps(run, &state, pending.as_deref());
    Ok(Json(contract::summary(
        run,
        state.status().as_str(),
        &plain,
        state.output(),
        &next,
    )))
}

/// `POST /api/v1/runs/{run}/approve` (approver).
pub async fn approve(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<Approve>,
) -> Reply {
    caller.require(Role::Approver)?;
    let run = run_id(&run)?;
    let scope = match body.scope.as_deref() {
        None | Some("call") => ApprovalScope::Call,
        Some("run") => ApprovalScope::Run,
        Some("session") => ApprovalScope::Session,
        Some(other) => {
            return Err(ApiError::new(
                "usage",
                format!("scope `{other}`: use call, run or session"),
            ));
        }
    };
    if scope != ApprovalScope::Call {
        // A wider approval is a standing rule.
        caller.require(Role::Operator)?;
    } else if body.expires_ms.is_some() {
        return Err(ApiError::new(
            "usage",
            "expires_ms applies to a run or session scope only",
        ));
    }
    app.runtime
        .approve_scoped(
            &run,
            &CallId::from_text(body.call_id),
            &caller.by(),
            body.digest.as_deref(),
            scope,
            body.expires_ms,
        )
        .await
        .map_err(|e| app.fail(&e))?;
    app.continue_unleased(&run).await;
    after_verb(&app, &run).await
}

/// `POST /api/v1/runs/{run}/deny` (approver).
pub async fn deny(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<Deny>,
) -> Reply {
    caller.require(Role::Approver)?;
    let run = run_id(&run)?;
    if body.reason.trim().is_empty() {
        return Err(ApiError::new("usage", "a denial needs a reason"));
    }
    app.runtime
        .deny(
            &run,
            &CallId::from_text(body.call_id),
            &caller.by(),
            &body.reason,
        )
        .await
        .map_err(|e| app.fail(&e))?;
    app.continue_unleased(&run).await;
    after_verb(&app, &run).await
}

/// `POST /api/v1/runs/{run}/resume` (operator): the input of a suspended
/// run, checked against the schema its log records, or a budget
/// extension.
pub async fn resume(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<Resume>,
) -> Reply {
    caller.require(Role::Operator)?;
    let run = run_id(&run)?;
    let agent = app.agent_of(&run).await?;
    app.runtime
        .resume(&run, &agent, body.input, Some(caller.by()))
        .await
        .map_err(|e| app.fail(&e))?;
    app.continue_unleased(&run).await;
    after_verb(&app, &run).await
}

/// `POST /api/v1/runs/{run}/resolve` (operator): the outcome of a write
/// that has none recorded, as a human found it.
pub async fn resolve(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<Resolve>,
) -> Reply {
    caller.require(Role::Operator)?;
    let run = run_id(&run)?;
    let output = match body.output {
        Some(output) => output,
        None => {
            let held = app
                .runtime
                .state(&run)
                .await
                .map_err(|e| app.fail(&e))?
                .held()
                .is_some();
            if !held {
                return Err(ApiError::new(
                    "usage",
                    format!(
                        "run {run}: resolving a write takes `output`, the write's output as JSON"
                    ),
                ));
            }
            Value::Null
        }
    };
    app.runtime
        .resolve(&run, output, &caller.by(), body.note)
        .await
        .map_err(|e| app.fail(&e))?;
    app.continue_unleased(&run).await;
    after_verb(&app, &run).await
}

/// `POST /api/v1/runs/{run}/cancel` (operator).
pub async fn cancel(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<Reason>,
) -> Reply {
    caller.require(Role::Operator)?;
    let run = run_id(&run)?;
    let reason = body.reason;
    app.runtime
        .cancel(&run, Some(&caller.by()), reason)
        .await
        .map_err(|e| app.fail(&e))?;
    after_verb(&app, &run).await
}

/// `POST /api/v1/runs/{run}/abandon` (operator).
pub async fn abandon(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(run): Segment<String>,
    Body(body): Body<Reason>,
) -> Reply {
    caller.require(Role::Operator)?;
    let run = run_id(&run)?;
    let Some(reason) = body.reason.filter(|r| !r.trim().is_empty()) else {
        return Err(ApiError::new("usage", "abandoning a run needs a reason"));
    };
    app.runtime
        .abandon(&run, &caller.by(), &reason)
        .await
        .map_err(|e| app.fail(&e))?;
    after_verb(&app, &run).await
}

/// `GET /api/v1/sessions`: the sessions the store's runs belong to.
pub async fn sessions(State(app): State<Arc<App>>) -> Reply {
    let sessions = app.runtime.sessions().await.map_err(|e| app.fail(&e))?;
    Ok(Json(
        json!({ "v": contract::VERSION, "sessions": sessions }),
    ))
}

/// `GET /api/v1/sessions/{session}`: the session's runs, oldest first.
pub async fn session(State(app): State<Arc<App>>, Segment(session): Segment<String>) -> Reply {
    let session = session_id(&session)?;
    let runs = app
        .runtime
        .session_runs(&session)
        .await
        .map_err(|e| app.fail(&e))?;
    if runs.is_empty() {
        return Err(
            ApiError::new("unknown_session", format!("no run of session `{session}`"))
                .with_details(json!({ "session": session })),
        );
    }
    Ok(Json(
        json!({ "v": contract::VERSION, "session": session, "runs": runs }),
    ))
}

/// The query of `GET /api/v1/audit`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Look at this many runs, most recently updated first (default 50,
    /// at most 1,000).
    runs: Option<usize>,
}

/// `GET /api/v1/audit`: every decision a person (or a token, or a rule)
/// made on the most recently updated runs, newest first: each event that
/// records who made it (`by`), with its run, position and reason.
pub async fn audit(State(app): State<Arc<App>>, Params(q): Params<AuditQuery>) -> Reply {
    let limit = q.runs.unwrap_or(50).min(1_000);
    let runs = app
        .runtime
        .store()
        .list(&RunFilter::new())
        .await
        .map_err(|e| app.fail(&e))?;
    let mut recent: Vec<&RunSummary> = runs.iter().collect();
    recent.sort_by_key(|r| std::cmp::Reverse(r.updated_ms));
    recent.truncate(limit);
    let ids: Vec<RunId> = recent.iter().map(|r| r.run_id.clone()).collect();
    // One batch load for all of them, not one load per run.
    let logs = app
        .runtime
        .store()
        .load_many(&ids)
        .await
        .map_err(|e| app.fail(&e))?;
    let mut decisions = Vec::new();
    for (run_id, stored) in &logs {
        let agent = recent
            .iter()
            .find(|r| r.run_id == *run_id)
            .map(|r| r.agent.as_str());
        for e in stored {
            let line = contract::stored_line(e.seq, &e.bytes).map_err(|error| {
                ApiError::new(
                    "log_unreadable",
                    format!("run {run_id}: event {} is not JSON: {error}", e.seq),
                )
                .with_details(json!({ "run_id": run_id, "seq": e.seq }))
            })?;
            let event = &line["event"];
            let Some(by) = event["by"].as_str() else {
                continue;
            };
            decisions.push(json!({
                "run_id": run_id,
                "agent": agent,
                "seq": line["seq"],
                "type": event["type"],
                "by": by,
                "at_ms": event["at_ms"],
                "call_id": event["call_id"],
                "reason": event.get("reason").or_else(|| event.get("note")).cloned().unwrap_or(Value::Null),
            }));
        }
    }
    decisions.sort_by_key(|d| std::cmp::Reverse(d["at_ms"].as_u64().unwrap_or(0)));
    Ok(Json(
        json!({ "v": contract::VERSION, "decisions": decisions }),
    ))
}

/// `GET /api/v1/keys`: the idempotency keys and who holds them.
pub async fn keys(State(app): State<Arc<App>>) -> Reply {
    let keys = app
        .runtime
        .keys(&CommitmentFilter::new())
        .await
        .map_err(|e| app.fail(&e))?;
    Ok(Json(json!({ "v": contract::VERSION, "keys": keys })))
}

/// `GET /api/v1/keys/{key}`.
pub async fn key(State(app): State<Arc<App>>, Segment(key): Segment<String>) -> Reply {
    let info = app.runtime.key(&key).await.map_err(|e| app.fail(&e))?;
    Ok(Json(json!({ "v": contract::VERSION, "key": info })))
}

/// `GET /api/v1/approvals/rules` (viewer): every standing approval rule,
/// oldest first, with its standing.
pub async fn rules(State(app): State<Arc<App>>) -> Reply {
    let rules = app.runtime.rules().await.map_err(|e| app.fail(&e))?;
    let now = app.now_ms();
    let rules: Vec<Value> = rules.iter().map(|r| contract::rule(r, now)).collect();
    Ok(Json(json!({ "v": contract::VERSION, "rules": rules })))
}

/// The body of a new rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRule {
    #[serde(default)]
    plugin: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    arguments: BTreeMap<String, String>,
    #[serde(default)]
    run: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    expires_ms: Option<i64>,
}

/// `POST /api/v1/approvals/rules` (operator): a standing rule, recorded
/// as made by the caller.
pub async fn add_rule(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Body(body): Body<NewRule>,
) -> Reply {
    caller.require(Role::Operator)?;
    let mut spec = RuleSpec::for_tool(body.plugin.as_deref(), body.tool.as_deref())
        .map_err(|e| app.fail(&warden::engine::RuntimeError::Rule(e)))?;
    spec.arguments = body.arguments;
    spec.run = body.run.as_deref().map(run_id).transpose()?;
    spec.session = body.session.as_deref().map(session_id).transpose()?;
    let rule = app
        .runtime
        .add_rule(spec, &caller.by(), body.expires_ms)
        .await
        .map_err(|e| app.fail(&e))?;
    Ok(Json(
        json!({ "v": contract::VERSION, "rule": contract::rule(&rule, app.now_ms()) }),
    ))
}

/// `POST /api/v1/approvals/rules/{rule}/revoke` (operator): the rule
/// approves nothing from now on, on every host.
pub async fn revoke_rule(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Segment(rule): Segment<String>,
) -> Reply {
    caller.require(Role::Operator)?;
    let rule = app
        .runtime
        .revoke_rule(&rule, &caller.by())
        .await
        .map_err(|e| app.fail(&e))?;
    Ok(Json(
        json!({ "v": contract::VERSION, "rule": contract::rule(&rule, app.now_ms()) }),
    ))
}
