//! One MCP session: one Warden run, started at the session's first
//! `tools/call` and driven under a claim this server renews.
//!
//! A call is offered to the run's model (the client, `client_model.rs`)
//! and the run is driven until the engine asks the model again (the call
//! settled: its result is read from the events it recorded, `view.rs`) or the drive stops: at
//! an approval, which is asked of the client's user by elicitation when
//! the client declared it and the operator's [`Approvers`] setting lets the
//! client decide (recorded under the identity the transport authenticated),
//! else waited for from `warden runs approve` (or `deny`) until the
//! approval timeout, when this server denies it; or at anything else that
//! parks or ends the run (a budget, a dangling write), which the client
//! receives as a typed error.
//!
//! While a call waits (its turn, the run, an approval), a client that gave
//! a `progressToken` receives `notifications/progress` every
//! `progress_interval`, from the same waits that watch for cancellation:
//! clients whose request timeout progress resets keep waiting for a human.
//!
//! Calls of one session are made one at a time, in the order they arrive:
//! a run has one conversation. A client's bad arguments are answered to
//! that call before the run is offered it (the engine's own checks), so
//! they never count as the run's model's invalid calls. When the session
//! ends, its run is given the model's last answer and completes; a call
//! still waiting for approval, or one the client cancels, is denied first
//! (the one denial path a timeout takes), so it is never made.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, ErrorCode, ErrorData, GetTaskParams, GetTaskResult, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::{ElicitationError, ElicitationMode, RequestContext, ServiceError};
use rmcp::{Peer, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use warden::engine::StartOptions;
use warden::engine::approval_prompt::ApprovalPrompt;
use warden::engine::approvals::{Approver, Approvers};
use warden::engine::decide::call_mistake;
use warden::engine::events::ToolCallResult;
use warden::engine::state::{Parked, RunState, ToolCallProgress, ToolCallState, value_text};
use warden::engine::{ReplayOptions, RunStatus};
use warden::sandbox::{Moment, ValidUntil};
use warden::store::Claim;
use warden::{RunId, Runtime, RuntimeError};

use super::client_model::{ClientModel, Offered};
use super::tasks::{self, TaskId};
use super::view::RunView;
use super::{SESSION_LABEL, Served, now_ms};

/// The JSON-RPC error code of every refusal Warden makes (the range
/// JSON-RPC leaves to servers); `data.code` holds Warden's stable code.
const REFUSED: ErrorCode = ErrorCode(-32000);

/// How long a closing session waits for its run to finish.
const CLOSING_WAIT: Duration = Duration::from_secs(30);

/// Who the log records as having denied a call nobody decided in time, or
/// one withdrawn (a cancelled call or task, a session that ended).
pub(crate) const SERVER: &str = "warden mcp serve";

/// The transport a session came over, which decides who its client is.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    /// Standard input and output: the client started this server as the
    /// local account named here.
    Stdio {
        /// The account of the process's user id.
        account: String,
    },
    /// Streamable HTTP: the client is whoever a request's credentials
    /// identify ([`Authenticated`], set by the HTTP gate).
    Http,
}

/// The identity an HTTP request's credentials proved (the bearer token, by
/// the environment variable the operator keeps it in), put in the
/// request's extensions by the gate; a request without one is anonymous.
#[derive(Clone, Debug)]
pub(crate) struct Authenticated(pub(crate) String);

/// The handler of one MCP session (what rmcp serves). Dropping the last
/// clone ends the session.
#[derive(Clone)]
pub(crate) struct McpSession {
    session: Arc<Session>,
    _end: Arc<EndOnDrop>,
}

struct EndOnDrop(CancellationToken);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl McpSession {
    /// The token cancelled when the session ends: a transport that learns
    /// of the end first (stdio's EOF) cancels it at once, so a call parked
    /// for approval is withdrawn then, not after the transport's drain.
    pub(crate) fn ended(&self) -> CancellationToken {
        self.session.ended.clone()
    }

    /// A new session of `served` over `transport`; its run starts at its
    /// first call.
    pub(crate) fn new(served: Arc<Served>, transport: Transport) -> McpSession {
        let ended = CancellationToken::new();
        let model = ClientModel::new(ended.clone());
        let runtime = served
            .runtime
            .clone()
            .with_provider(Arc::new(model.clone()));
        let approvers = served.options.approvers_over(&transport);
        let session = Arc::new(Session {
            served: Arc::clone(&served),
            transport,
            approvers,
            runtime,
            model,
            ended: ended.clone(),
            run: tokio::sync::Mutex::new(None),
            calls: AtomicU64::new(0),
        });
        let closing = Arc::clone(&session);
        let task = tokio::spawn(async move {
            closing.ended.cancelled().await;
            closing.close().await;
        });
        let mut closing = served.closing.lock().unwrap_or_else(|p| p.into_inner());
        // Over 2026-07-28's HTTP every request is a session: forget those
        // that are over, so the list stays as long as the open ones.
        closing.retain(|task| !task.is_finished());
        closing.push(task);
        drop(closing);
        McpSession {
            session,
            _end: Arc::new(EndOnDrop(ended)),
        }
    }
}

struct Session {
    served: Arc<Served>,
    transport: Transport,
    /// Who may decide this session's calls.
    approvers: Approvers,
    /// The runtime whose model is this session's client.
    runtime: Runtime,
    model: ClientModel,
    ended: CancellationToken,
    /// The session's run once started; locked for the whole of a call, so
    /// calls are made one at a time.
    run: tokio::sync::Mutex<Option<Active>>,
    calls: AtomicU64,
}

/// A session's run and this server's hold on it.
struct Active {
    run_id: RunId,
    claim: Claim,
    valid: ValidUntil,
    renewing: JoinHandle<()>,
    /// The drive in progress, if any (it waits in the model call between
    /// calls).
    drive: Option<JoinHandle<Result<RunStatus, RuntimeError>>>,
    /// The run's state as the drive leaves it, which results are read from.
    view: RunView,
    /// The key of the run's task handles (its digest is the run's
    /// `mcp_task_key` label).
    task_key: String,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.renewing.abort();
    }
}

/// What a user answers to an approval asked by elicitation.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct Approval {
    /// Approve this call?
    approve: bool,
    /// Why, when denying (recorded with the denial).
    #[serde(default)]
    reason: String,
}

rmcp::elicit_safe!(Approval);

/// The progress a waiting call sends its client: a beat every `every`
/// while it waits, each numbered one more than the last (MCP wants
/// progress to increase; the total is unknown), for the client's
/// `progressToken`. Without a token it never beats.
struct Heartbeat {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    every: Duration,
    next: tokio::time::Instant,
    beats: u32,
}

impl Heartbeat {
    fn new(peer: &Peer<RoleServer>, token: Option<ProgressToken>, every: Duration) -> Heartbeat {
        Heartbeat {
            peer: peer.clone(),
            token,
            every,
            next: tokio::time::Instant::now() + every,
            beats: 0,
        }
    }

    /// Sleeps until the next beat is due (for ever without a token); a
    /// wait selects on it beside what it waits for, then calls `beat`.
    fn due(&self) -> std::pin::Pin<Box<tokio::time::Sleep>> {
        let at = if self.token.is_some() {
            self.next
        } else {
            tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
        };
        Box::pin(tokio::time::sleep_until(at))
    }

    /// Sends a beat saying what the call waits for, if one is due. A beat
    /// that cannot be sent is dropped: the client left, and its
    /// cancellation is what ends the wait.
    async fn beat(&mut self, waiting: &str) {
        let Some(token) = &self.token else {
            return;
        };
        let now = tokio::time::Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + self.every;
        self.beats += 1;
        let progress = ProgressNotificationParam::new(token.clone(), f64::from(self.beats))
            .with_message(waiting);
        if let Err(error) = self.peer.notify_progress(progress).await {
            tracing::debug!(%error, "cannot send a waiting call's progress");
        }
    }
}

/// A refusal the client sees: Warden's stable code and the evidence.
pub(crate) fn refusal(code: &str, message: impl Into<String>, details: Value) -> ErrorData {
    let mut data = json!({ "code": code });
    if let (Some(data), Value::Object(details)) = (data.as_object_mut(), details) {
        data.extend(details);
    }
    ErrorData::new(REFUSED, message.into(), Some(data))
}

/// An engine error as the client sees it: its stable code.
pub(crate) fn engine_refusal(error: &RuntimeError) -> ErrorData {
    let (code, details) = warden::errors::code_of(error);
    refusal(code, error.to_string(), details)
}

impl Session {
    /// The name the client gives itself: at `initialize`, or (2026-07-28)
    /// in the request's `_meta`.
    fn client(context: &RequestContext<RoleServer>) -> String {
        context
            .client_info()
            .map(|info| info.name)
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "client".to_owned())
    }

    /// The client of a request as an approver: by the identity its
    /// transport authenticated; `None` for an anonymous HTTP request (no
    /// token set), which may decide nothing.
    fn approver(&self, context: &RequestContext<RoleServer>) -> Option<Approver> {
        let identity = match &self.transport {
            Transport::Stdio { account } => format!("mcp:stdio:{account}"),
            Transport::Http => {
                let parts = context.extensions.get::<axum::http::request::Parts>()?;
                parts.extensions.get::<Authenticated>()?.0.clone()
            }
        };
        Some(Approver::Client { identity })
    }

    /// Starts the session's run and claims it.
    async fn begin(&self, client: &str) -> Result<Active, ErrorData> {
        let client = client.to_owned();
        let (task_key, task_digest) = tasks::new_key();
        let options = StartOptions::new()
            .label(SESSION_LABEL, "serve")
            .label("mcp_client", client.clone())
            .label("mcp_approvers", self.approvers.as_str())
            .label(tasks::TASK_KEY_LABEL, task_digest);
        let input = Value::String(format!("An MCP session of `{client}`."));
        let run_id = self
            .runtime
            .start(&self.served.agent, input, options)
            .await
            .map_err(|e| engine_refusal(&e))?;
        let options = &self.served.options;
        let store = Arc::clone(self.runtime.store());
        let started = Moment::now();
        let claim = store
            .acquire_claim(
                &run_id,
                &options.owner,
                now_ms(),
                options.claim_ttl.as_millis() as i64,
            )
            .await
            .map_err(|e| engine_refusal(&RuntimeError::from(e)))?;
        let valid = ValidUntil::at(started.after(options.valid_for()));
        // Before the drive starts, so the view misses nothing it records.
        let view = RunView::load(&self.runtime, &run_id)
            .await
            .map_err(|e| engine_refusal(&e))?;
        tracing::info!(%run_id, client, "MCP session started its run");
        eprintln!("warden mcp serve: session of `{client}` is run {run_id}");
        let renewing = tokio::spawn(renew(
            store,
            claim.clone(),
            valid.clone(),
            options.claim_ttl,
            options.valid_for(),
        ));
        Ok(Active {
            run_id,
            claim,
            valid,
            renewing,
            drive: None,
            view,
            task_key,
        })
    }

    fn drive(&self, active: &Active) -> JoinHandle<Result<RunStatus, RuntimeError>> {
        let runtime = self.runtime.clone();
        let agent = Arc::clone(&self.served.agent);
        let (claim, valid) = (active.claim.clone(), active.valid.clone());
        tokio::spawn(async move {
            runtime
                .recover_claimed(&agent, ReplayOptions::default(), claim, valid)
                .await
        })
    }

    /// One `tools/call`; `cancelled` is the request's token, cancelled when
    /// the client cancels the call (`notifications/cancelled`) or the
    /// session ends (stdio EOF, HTTP `DELETE`). With `tasks` (the client
    /// declared the tasks extension on the request), a call that parks for
    /// approval is answered with a task handle at once (`hand_over`).
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        name: &str,
        arguments: Value,
        peer: &Peer<RoleServer>,
        cancelled: &CancellationToken,
        progress: Option<ProgressToken>,
        client: Option<&Approver>,
        client_name: &str,
        tasks: bool,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = self.served.tool(name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "no tool `{name}` here (tools: {})",
                    self.served.tool_names().join(", ")
                ),
                None,
            ));
        };
        // The client's mistake is this call's error (as MCP wants input
        // errors: a tool result with `isError`), found by the checks the
        // engine rejects a model's call with. It never reaches the run, so
        // it is not counted as the run's model's invalid calls: the client
        // is not a model looping on a tool, and its session goes on.
        if let Some(mistake) = call_mistake(&tool.agent_tool, &self.served.schemas, &arguments) {
            return Ok(CallToolResult::error(vec![ContentBlock::text(mistake.to_string())]).into());
        }
        let mut heartbeat = Heartbeat::new(peer, progress, self.served.options.progress_interval);
        // A call cancelled while it waits its turn is never made. The lock
        // is one future for the whole wait: tokio's mutex is fair, and a
        // new one would lose the call's place.
        let mut lock = std::pin::pin!(self.run.lock());
        let mut run = loop {
            tokio::select! {
                run = &mut lock => break run,
                () = cancelled.cancelled() => {
                    return Err(refusal("cancelled", "the call was cancelled before it was made", json!({})));
                }
                () = heartbeat.due() => heartbeat.beat("waiting for the session's previous call").await,
            }
        };
        if self.ended.is_cancelled() || cancelled.is_cancelled() {
            return Err(refusal("session_ended", "the MCP session ended", json!({})));
        }
        if run.is_none() {
            *run = Some(self.begin(client_name).await?);
        }
        let active = run.as_mut().expect("started above");
        let id = format!("mcp-{}", self.calls.fetch_add(1, Ordering::Relaxed) + 1);
        let (settled, mut told) = oneshot::channel();
        self.model.offer(Offered {
            id: id.clone(),
            name: name.to_owned(),
            arguments,
            settled,
        });
        // The code of a denial this server recorded itself (a timeout).
        let mut denial = None;
        let mut parked = false;
        let stopped = loop {
            if active.drive.is_none() {
                active.drive = Some(self.drive(active));
            }
            let drive = active.drive.as_mut().expect("set above");
            tokio::select! {
                _ = &mut told => break None,
                () = heartbeat.due() => heartbeat.beat("running").await,
                joined = drive => {
                    active.drive = None;
                    let ended = match joined {
                        Ok(ended) => ended,
                        Err(e) => Err(RuntimeError::Agent {
                            agent: self.served.agent.name.clone(),
                            message: format!("the session's drive stopped: {e}"),
                        }),
                    };
                    match ended {
                        // A client that takes tasks gets the parked call as
                        // one: it waits in the store, not in this request.
                        Ok(RunStatus::AwaitingApproval) if tasks => {
                            parked = true;
                            break None;
                        }
                        Ok(RunStatus::AwaitingApproval) => {
                            denial = self
                                .decide(&active.run_id, peer, client, cancelled, &mut heartbeat)
                                .await?;
                        }
                        other => break Some(other),
                    }
                }
            }
        };
        self.model.withdraw();
        if parked {
            let active = run.take().expect("started above");
            return self.hand_over(active, &id).await;
        }
        // The call may have settled even when the drive then stopped (a
        // budget reached before the next model call).
        if let Some(result) = self.result(&mut active.view, &id, denial).await? {
            return result.map(Into::into);
        }
        Err(match stopped {
            Some(Ok(status)) => refusal(
                status.as_str(),
                format!(
                    "run {}: the session's run is {status}; see `warden runs show {}`",
                    active.run_id, active.run_id
                ),
                json!({ "run_id": active.run_id, "status": status.as_str() }),
            ),
            Some(Err(error)) => engine_refusal(&error),
            None => refusal(
                "mcp_failed",
                format!("run {}: the call has no recorded result", active.run_id),
                json!({ "run_id": active.run_id }),
            ),
        })
    }

    /// The settled call `id`'s result as the client receives it; `None`
    /// while it has none. Read from the session's view of its run; the log
    /// is read again only when the view has no result for the call (one
    /// recorded by another process with nothing after it here).
    async fn result(
        &self,
        view: &mut RunView,
        id: &str,
        denial: Option<&'static str>,
    ) -> Result<Option<Result<CallToolResult, ErrorData>>, ErrorData> {
        let run_id = view.run_id().clone();
        let mut state = view
            .current(&self.runtime)
            .await
            .map_err(|e| engine_refusal(&e))?;
        if settled(state, id).is_none() {
            state = view
                .reload(&self.runtime)
                .await
                .map_err(|e| engine_refusal(&e))?;
        }
        let Some(call) = settled(state, id) else {
            return Ok(None);
        };
        Ok(outcome(&run_id, call, denial))
    }

    /// Answers a call that parked for approval with a task handle: the
    /// session hands the run over (its claim released, the call still
    /// parked and recorded), so the call waits in the store rather than in
    /// this request, and survives the client leaving and this server
    /// stopping. It is never withdrawn for the session's end: only its
    /// denial, or the client's `tasks/cancel`, is. Whoever approves it, the
    /// next driver of the run (this server's sweep, another `warden mcp
    /// serve` of the agent, a worker) performs it once and the run
    /// completes; the session's next call starts a new run.
    async fn hand_over(&self, active: Active, id: &str) -> Result<CallToolResponse, ErrorData> {
        let run_id = active.run_id.clone();
        let state = self
            .runtime
            .state(&run_id)
            .await
            .map_err(|e| engine_refusal(&e))?;
        let call = match state.parked() {
            Some(Parked::Approval { call }) if call.call.id == id => call,
            _ => {
                return Err(refusal(
                    "mcp_failed",
                    format!("run {run_id}: the call did not park where it was expected"),
                    json!({ "run_id": run_id }),
                ));
            }
        };
        let task = TaskId::new(
            run_id.clone(),
            call.call_id.clone(),
            active.task_key.clone(),
        );
        let claim = active.claim.clone();
        // Stops renewing before releasing, so no renewal follows it.
        drop(active);
        let store = self.runtime.store();
        if let Err(error) = store.release_claim(&claim, None).await {
            tracing::warn!(%run_id, %error, "cannot release a task's run");
        }
        let summary = store
            .summary(&run_id)
            .await
            .map_err(|e| engine_refusal(&RuntimeError::from(e)))?;
        tracing::info!(%run_id, call_id = %call.call_id, "a parked call became a task");
        eprintln!(
            "warden mcp serve: call {} ({}) waits for approval as a task: warden runs approve {run_id} {} (or deny)",
            call.call_id, call.call.name, call.call_id
        );
        Ok(CallToolResponse::Task(CreateTaskResult::new(tasks::seed(
            &task, &summary,
        ))))
    }

    /// Gets the parked call approved or denied; returns the code of a
    /// denial this server recorded itself. A call the client cancels (or
    /// whose session ends) while it waits is denied by this server, by the
    /// engine's one denial path: recorded, and never made later, whoever
    /// approves it afterwards.
    async fn decide(
        &self,
        run_id: &RunId,
        peer: &Peer<RoleServer>,
        client: Option<&Approver>,
        cancelled: &CancellationToken,
        heartbeat: &mut Heartbeat,
    ) -> Result<Option<&'static str>, ErrorData> {
        let events = self
            .runtime
            .events(run_id)
            .await
            .map_err(|e| engine_refusal(&e))?;
        let state = self
            .runtime
            .state(run_id)
            .await
            .map_err(|e| engine_refusal(&e))?;
        let Some(Parked::Approval { call }) = state.parked() else {
            return Ok(None);
        };
        let call_id = call.call_id.clone();
        // Warden's account first, then the frozen arguments, the plugin's
        // preview last and framed as its words (one prompt for every
        // surface that asks).
        let prompt = ApprovalPrompt::find(&events, &state, &call_id)
            .map(|prompt| prompt.text())
            .unwrap_or_else(|| {
                format!(
                    "? {call_id} {} needs approval",
                    warden::untrusted::line(&call.call.name, warden::untrusted::LINE_BYTES)
                )
            });
        let message = format!("Warden: run {run_id} asks for approval\n{prompt}");
        let timeout = self.served.options.approval_timeout;
        let deadline = Instant::now() + timeout;
        let waiting = format!(
            "waiting for approval of call {call_id} ({})",
            call.call.name
        );
        // The client is asked only when the operator's setting lets it
        // decide (the gate every decision below passes again).
        let entitled = match client {
            Some(client) => match self.approvers.admit(client) {
                Ok(_) => Some(client),
                Err(refused) => {
                    tracing::info!(%run_id, %call_id, %refused, "not asking the client");
                    None
                }
            },
            None => {
                tracing::info!(%run_id, %call_id, "not asking an anonymous client");
                None
            }
        };
        if let Some(client) = entitled
            && peer
                .supported_elicitation_modes()
                .contains(&ElicitationMode::Form)
        {
            let mut asked = std::pin::pin!(
                peer.elicit_with_timeout::<Approval>(message.clone(), Some(timeout))
            );
            let answer = loop {
                tokio::select! {
                    answer = &mut asked => break answer,
                    () = cancelled.cancelled() => return self.withdraw(run_id, &call_id).await,
                    () = heartbeat.due() => heartbeat.beat(&waiting).await,
                }
            };
            let denied = |reason: &str| {
                if reason.is_empty() {
                    "denied by the client's user".to_owned()
                } else {
                    reason.to_owned()
                }
            };
            match answer {
                Ok(Some(Approval { approve: true, .. })) => {
                    return self.record(run_id, &call_id, client, None).await;
                }
                Ok(Some(Approval { reason, .. })) => {
                    return self
                        .record(run_id, &call_id, client, Some(&denied(&reason)))
                        .await;
                }
                Ok(None)
                | Err(ElicitationError::UserDeclined | ElicitationError::UserCancelled) => {
                    return self
                        .record(run_id, &call_id, client, Some(&denied("")))
                        .await;
                }
                Err(ElicitationError::Service(ServiceError::Timeout { .. })) => {}
                Err(error) => {
                    // The client could not answer: an approval from another
                    // terminal still can, until the deadline.
                    tracing::warn!(%run_id, %call_id, %error, "elicitation failed; waiting for `warden runs approve`");
                }
            }
        }
        eprintln!(
            "warden mcp serve: call {call_id} ({}) waits for approval: warden runs approve {run_id} {call_id} (or deny), within {}s",
            call.call.name,
            deadline.saturating_duration_since(Instant::now()).as_secs()
        );
        while Instant::now() < deadline {
            tokio::select! {
                () = tokio::time::sleep(
                    self.served
                        .options
                        .poll
                        .min(deadline.saturating_duration_since(Instant::now())),
                ) => {}
                () = cancelled.cancelled() => return self.withdraw(run_id, &call_id).await,
            }
            heartbeat.beat(&waiting).await;
            let state = self
                .runtime
                .state(run_id)
                .await
                .map_err(|e| engine_refusal(&e))?;
            if !matches!(state.parked(), Some(Parked::Approval { call }) if call.call_id == call_id)
            {
                return Ok(None);
            }
        }
        let reason = format!("no approval within {} s", timeout.as_secs_f64());
        self.record(run_id, &call_id, &server(), Some(&reason))
            .await
            .map(|recorded| recorded.map(|_| "approval_timeout"))
    }

    /// Denies a parked call its client cancelled, or whose session ended.
    async fn withdraw(
        &self,
        run_id: &RunId,
        call_id: &warden::engine::CallId,
    ) -> Result<Option<&'static str>, ErrorData> {
        // rmcp cancels the request's token for a `notifications/cancelled`
        // and when its transport closed (an HTTP `DELETE`) alike.
        let reason = if self.ended.is_cancelled() {
            "the MCP session ended"
        } else {
            "the client cancelled the call or ended the session"
        };
        match self.served.withdraw(run_id, call_id, reason).await {
            Ok(withdrawn) => Ok(withdrawn.then_some("cancelled")),
            Err(error) => Err(engine_refusal(&error)),
        }
    }

    /// Records `approver`'s approval (`denial` none) or denial, once the
    /// operator's setting admits `approver`; returns the code of the
    /// denial when it was recorded. A decision someone else recorded first
    /// stands.
    async fn record(
        &self,
        run_id: &RunId,
        call_id: &warden::engine::CallId,
        approver: &Approver,
        denial: Option<&str>,
    ) -> Result<Option<&'static str>, ErrorData> {
        let by = self.approvers.admit(approver).map_err(|refused| {
            refusal(
                "not_entitled",
                refused.to_string(),
                json!({ "run_id": run_id, "call_id": call_id }),
            )
        })?;
        let recorded = match denial {
            None => self.runtime.approve(run_id, call_id, by).await,
            Some(reason) => self.runtime.deny(run_id, call_id, by, reason).await,
        };
        match recorded {
            Ok(()) => Ok(denial.map(|_| "approval_denied")),
            Err(RuntimeError::NotAwaitingApproval { .. } | RuntimeError::Conflict { .. }) => {
                Ok(None)
            }
            Err(error) => Err(engine_refusal(&error)),
        }
    }

    /// The session ended: the run gets the model's last answer and
    /// completes (a call still awaiting approval is denied first); the
    /// claim is released.
    async fn close(&self) {
        let Some(mut active) = self.run.lock().await.take() else {
            return;
        };
        let run_id = active.run_id.clone();
        let finish = async {
            loop {
                let drive = match active.drive.take() {
                    Some(drive) => drive,
                    None => {
                        let state = self.runtime.state(&run_id).await?;
                        match state.parked() {
                            Some(Parked::Approval { call }) => {
                                let call_id = call.call_id.clone();
                                self.served
                                    .withdraw(&run_id, &call_id, "the MCP session ended")
                                    .await?;
                            }
                            // Parked for a human otherwise (a budget, a
                            // dangling write): it stays so.
                            Some(_) => return Ok(state.status()),
                            None if state.status().is_terminal() => return Ok(state.status()),
                            None => {}
                        }
                        self.drive(&active)
                    }
                };
                match drive.await {
                    Ok(Ok(RunStatus::AwaitingApproval)) => continue,
                    Ok(result) => return result,
                    Err(error) => {
                        return Err(RuntimeError::Agent {
                            agent: self.served.agent.name.clone(),
                            message: format!("the session's drive stopped: {error}"),
                        });
                    }
                }
            }
        };
        let status = match tokio::time::timeout(CLOSING_WAIT, finish).await {
            Ok(Ok(status)) => Some(status),
            Ok(Err(RuntimeError::NeedsReconciliation { .. })) => {
                Some(RunStatus::NeedsReconciliation)
            }
            Ok(Err(error)) => {
                tracing::warn!(%run_id, %error, "a closing session's run did not finish");
                None
            }
            Err(_) => {
                tracing::warn!(%run_id, "a closing session's run did not finish in time");
                None
            }
        };
        let listed = status
            .filter(|s| *s == RunStatus::NeedsReconciliation)
            .map(RunStatus::listing);
        if let Err(error) = self
            .runtime
            .store()
            .release_claim(&active.claim, listed)
            .await
        {
            tracing::warn!(%run_id, %error, "cannot release a closed session's claim");
        }
        tracing::info!(%run_id, status = ?status, "MCP session closed");
    }
}

/// A settled call's result as the client receives it (a task's too);
/// `None` while it is not settled. `denial` is the code of a denial this
/// server recorded itself.
pub(crate) fn outcome(
    run_id: &RunId,
    call: &ToolCallState,
    denial: Option<&'static str>,
) -> Option<Result<CallToolResult, ErrorData>> {
    let details = json!({ "run_id": run_id, "call_id": call.call_id });
    let output = |value: &Value| {
        let mut result = CallToolResult::success(vec![ContentBlock::text(value_text(value))]);
        if value.is_object() {
            result.structured_content = Some(value.clone());
        }
        Ok(result)
    };
    Some(match &call.progress {
        ToolCallProgress::Completed(ToolCallResult::Output(value))
        | ToolCallProgress::Deduplicated {
            result: ToolCallResult::Output(value),
            ..
        }
        | ToolCallProgress::Resolved { output: value, .. } => output(value),
        ToolCallProgress::Completed(ToolCallResult::Error(error))
        | ToolCallProgress::Deduplicated {
            result: ToolCallResult::Error(error),
            ..
        }
        | ToolCallProgress::Rejected(error) => Ok(CallToolResult::error(vec![ContentBlock::text(
            error.to_string(),
        )])),
        ToolCallProgress::Denied { by, reason } => Err(refusal(
            denial.unwrap_or("approval_denied"),
            format!("call {} was denied by {by}: {reason}", call.call_id),
            details,
        )),
        ToolCallProgress::PolicyDenied { policy, reason } => Err(refusal(
            "policy_denied",
            format!(
                "call {} was denied by policy `{policy}`: {reason}",
                call.call_id
            ),
            details,
        )),
        _ => return None,
    })
}

/// The call the client's request `id` became, in the run's last turn.
fn settled<'a>(state: &'a RunState, id: &str) -> Option<&'a ToolCallState> {
    state
        .last_turn()
        .and_then(|turn| turn.calls.iter().find(|c| c.call.id == id))
}

/// This server, deciding on the operator's settings (a timeout, a
/// withdrawn call).
fn server() -> Approver {
    Approver::Operator(SERVER.to_owned())
}

/// Renews `claim` every third of `ttl`, moving `valid` on from the start
/// of each renewal that succeeds, until it is fenced (another driver took
/// the run) or the session drops it.
pub(crate) async fn renew(
    store: Arc<dyn warden::EventStore>,
    claim: Claim,
    valid: ValidUntil,
    ttl: Duration,
    valid_for: Duration,
) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let started = Moment::now();
        match store
            .renew_claim(&claim, now_ms(), ttl.as_millis() as i64)
            .await
        {
            Ok(_) => {
                valid.extend(started.after(valid_for));
            }
            Err(warden::store::StoreError::Fenced { .. }) => {
                tracing::warn!(run_id = %claim.run_id, "the session's run was taken over");
                valid.revoke();
                return;
            }
            Err(error) => {
                tracing::warn!(run_id = %claim.run_id, %error, "cannot renew the session's claim; retrying");
            }
        }
    }
}

impl ServerHandler for McpSession {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
            .with_server_info(Implementation::new("warden", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The tools of Warden agent `{}`. Each call is recorded in a Warden run; a write waits for a human's approval.",
                self.session.served.agent.name
            ))
    }

    /// The revisions with sessions (the `initialize` handshake, up to
    /// 2025-11-25), and 2026-07-28, which has none: over stdio its
    /// connection is the session, over HTTP each request is one.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    /// A served tool, for the transport's checks of 2026-07-28's
    /// standard headers against its schema.
    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.session.served.tool(name).map(|t| t.tool.clone())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.session.served.get_task(&request.task_id).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.session.served.cancel_task(&request.task_id).await
    }

    /// The client's answer to the approval its task asked for (under
    /// `--approvals client`), recorded under its transport's identity.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let client = self.session.approver(&context);
        self.session
            .served
            .update_task(&request.task_id, &request.input_responses, client.as_ref())
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.session
                .served
                .tools
                .iter()
                .map(|t| t.tool.clone())
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let client = self.session.approver(&context);
        let client_name = Session::client(&context);
        // The extension declared on this request (or at `initialize`): the
        // only clients that may be answered with a task handle.
        let tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        // Cancelled by the client's `notifications/cancelled` or the end of
        // the transport (rmcp's token), or the end of the session.
        let stop = self.session.ended.child_token();
        let link = tokio::spawn({
            let (request, stop) = (context.ct.clone(), stop.clone());
            async move {
                request.cancelled().await;
                stop.cancel();
            }
        });
        let result = self
            .session
            .call(
                &request.name,
                arguments,
                &context.peer,
                &stop,
                context.meta.get_progress_token(),
                client.as_ref(),
                &client_name,
                tasks,
            )
            .await;
        link.abort();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_the_code_and_the_evidence() {
        let error = refusal("approval_timeout", "no", json!({ "run_id": "r" }));
        assert_eq!(error.code, REFUSED);
        assert_eq!(
            error.data,
            Some(json!({ "code": "approval_timeout", "run_id": "r" }))
        );
    }
}
