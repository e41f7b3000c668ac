//! `warden mcp serve`: an agent's granted plugin tools served to any Model
//! Context Protocol client, over stdio or streamable HTTP, each call an
//! effect of a Warden run like any other.
//!
//! - [`Served`]: the agent being served, its tools and the options; it
//!   opens a session per MCP session and recovers the runs of sessions
//!   whose server died ([`Served::recover_orphans`]).
//! - `session.rs`: one MCP session is one Warden run. Its model is the
//!   client (`client_model.rs`): each `tools/call` becomes the answer of
//!   the run's next model call, so the engine records and performs it as
//!   `warden run` would (intent before, a fresh lease, completion with its
//!   receipt, approvals, budgets per session, a `write` never repeated).
//!   The run is held under a claim the server renews, as a worker's, so
//!   `warden runs approve` from another terminal records its decision and
//!   leaves the driving to the server. Who may approve a session's writes
//!   is the operator's [`Approvers`] setting, checked by the engine's gate:
//!   over HTTP operators only by default, over stdio the client too.
//! - `view.rs`: the session's run as its drive leaves it, kept from the
//!   runtime's updates, which a call's result is read from (never a
//!   reload of the whole log per call).
//! - `tools.rs`: effect classes as MCP annotations.
//! - `http.rs`: the streamable HTTP transport behind the Host and Origin
//!   checks of `warden serve` and an optional bearer token.
//!
//! Invariant: an MCP call is an effect like any other. Nothing here runs
//! a tool: every call goes through the engine's model-call and tool-call
//! paths, and what the client sees is read back from the run's log.

mod client_model;
mod http;
mod session;
mod tasks;
mod tools;
mod view;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

pub use warden::engine::approvals::Approvers;
use warden::engine::schema::CompiledSchemas;
use warden::engine::view::ToolTarget;
use warden::engine::{ReplayOptions, RunStatus};
use warden::sandbox::{Moment, ValidUntil};
use warden::store::{RunFilter, RunSummary};
use warden::{Agent, RunId, Runtime, RuntimeError};

pub use http::{HttpOptions, router};

/// The label every run of a served session carries (`mcp=serve`), with the
/// client's name under `mcp_client`.
pub const SESSION_LABEL: &str = "mcp";

/// Why serving cannot start or go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The agent has nothing to serve, or something that cannot be served.
    #[error("agent `{agent}` cannot be served over MCP: {reason}")]
    Unservable {
        /// The agent.
        agent: String,
        /// Why.
        reason: String,
    },
    /// An HTTP bind off loopback without a bearer token.
    #[error(
        "refusing to serve MCP on {addr} without a bearer token: anyone who can reach it could call the agent's tools; set the token's environment variable ({env}) or bind to a loopback address"
    )]
    Unprotected {
        /// The address.
        addr: SocketAddr,
        /// The environment variable the token is read from.
        env: String,
    },
    /// Client approvals over HTTP without a bearer token: the client's
    /// decisions could not be recorded as anyone's.
    #[error(
        "refusing to let HTTP clients approve without a bearer token: an approval must be recorded under an identity the transport authenticated; set the token's environment variable ({env}) or leave approvals to operators (`--approvals operators`)"
    )]
    AnonymousApprover {
        /// The environment variable the token is read from.
        env: String,
    },
    /// The transport failed (stdio closed badly, the HTTP listener).
    #[error("MCP transport failed: {message}")]
    Failed {
        /// What failed.
        message: String,
    },
    /// The engine refused (loading the agent's plugins, the store).
    #[error(transparent)]
    Runtime(Box<RuntimeError>),
}

impl From<RuntimeError> for McpError {
    fn from(error: RuntimeError) -> Self {
        McpError::Runtime(Box::new(error))
    }
}

impl McpError {
    /// The stable code (docs/json-output.md).
    pub fn code(&self) -> &'static str {
        match self {
            McpError::Unservable { .. } => "agent_unservable",
            McpError::Unprotected { .. } => "mcp_unprotected",
            McpError::AnonymousApprover { .. } => "mcp_anonymous_approver",
            McpError::Failed { .. } => "mcp_failed",
            McpError::Runtime(e) => warden::errors::code_of(&**e).0,
        }
    }

    /// The evidence: the agent, the address and the token's variable.
    pub fn details(&self) -> Value {
        match self {
            McpError::Unservable { agent, .. } => json!({ "agent": agent }),
            McpError::Unprotected { addr, env } => {
                json!({ "addr": addr.to_string(), "env": env })
            }
            McpError::AnonymousApprover { env } => json!({ "env": env }),
            McpError::Failed { .. } => json!({}),
            McpError::Runtime(e) => warden::errors::code_of(&**e).1,
        }
    }
}

/// Refuses an HTTP bind off loopback without a token, and client
/// approvals over HTTP without one (nobody the client could be recorded
/// as).
pub fn check_bind(
    addr: SocketAddr,
    has_token: bool,
    env: &str,
    options: &ServeOptions,
) -> Result<(), McpError> {
    if !(addr.ip().is_loopback() || has_token) {
        return Err(McpError::Unprotected {
            addr,
            env: env.to_owned(),
        });
    }
    if !has_token && options.approvers == Some(Approvers::OperatorsAndClient) {
        return Err(McpError::AnonymousApprover {
            env: env.to_owned(),
        });
    }
    Ok(())
}

/// How sessions are served. Every setter says its default.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    approval_timeout: Duration,
    claim_ttl: Duration,
    poll: Duration,
    progress_interval: Duration,
    owner: String,
    approvers: Option<Approvers>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            approval_timeout: Duration::from_secs(300),
            claim_ttl: Duration::from_secs(15),
            poll: Duration::from_millis(200),
            progress_interval: Duration::from_secs(10),
            owner: format!("mcp:{}:{:08x}", std::process::id(), rand::random::<u32>()),
            approvers: None,
        }
    }
}

impl ServeOptions {
    /// How long a call that needs approval waits for it (elicitation, or
    /// `warden runs approve` from elsewhere) before it is denied as timed
    /// out. Default: 5 minutes.
    pub fn approval_timeout(mut self, timeout: Duration) -> Self {
        self.approval_timeout = timeout;
        self
    }

    /// How long a session's claim on its run lasts unless renewed (every
    /// third of it): after a crash, the run is another driver's to recover
    /// once it ran out. Default: 15 s.
    pub fn claim_ttl(mut self, ttl: Duration) -> Self {
        self.claim_ttl = ttl.max(Duration::from_millis(300));
        self
    }

    /// How often a call waiting for an approval made elsewhere reads the
    /// log. Default: 200 ms.
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How often a call still waiting (for approval, or for the run to
    /// reach it) sends `notifications/progress`, when its client gave a
    /// `progressToken`: clients whose request timeout progress resets
    /// (the TypeScript SDK's `resetTimeoutOnProgress`) then wait as long as
    /// a human takes. Default: 10 s (under the SDKs' 60 s timeouts).
    pub fn progress_interval(mut self, interval: Duration) -> Self {
        self.progress_interval = interval.max(Duration::from_millis(100));
        self
    }

    /// Who may approve or deny a session's calls besides operators
    /// (`warden runs approve|deny`, the console, the API). Default: over
    /// HTTP [`Approvers::Operators`] (a client that can reach the endpoint
    /// is a program holding a token, often the agent host that asked for
    /// the write: it must not approve its own writes); over stdio
    /// [`Approvers::OperatorsAndClient`] (the client was started by, and
    /// answers to, the local account that could run `warden runs approve`
    /// on the same store anyway).
    pub fn approvers(mut self, approvers: Approvers) -> Self {
        self.approvers = Some(approvers);
        self
    }

    /// The setting for a session over `transport`.
    fn approvers_over(&self, transport: &session::Transport) -> Approvers {
        self.approvers.unwrap_or(match transport {
            session::Transport::Stdio { .. } => Approvers::OperatorsAndClient,
            session::Transport::Http => Approvers::Operators,
        })
    }

    /// The owner its claims record. Default: `mcp:<pid>:<random>`.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// How long after the start of a claim or renewal it is taken to hold:
    /// four fifths of the time to live, as a worker's.
    fn valid_for(&self) -> Duration {
        self.claim_ttl - self.claim_ttl / 5
    }
}

/// An agent being served: its runtime, tools and options.
pub struct Served {
    runtime: Runtime,
    agent: Arc<Agent>,
    tools: Vec<tools::ServedTool>,
    options: ServeOptions,
    /// The served tools' input schemas, compiled once each.
    schemas: CompiledSchemas,
    /// Sessions winding down (their runs finishing) and tasks' runs being
    /// recovered, awaited on shutdown.
    closing: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("agent", &self.agent.name)
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

impl Served {
    /// Serves `agent` over `runtime` (its store holds the sessions' runs).
    /// Its plugins are loaded now; refused when it has no plugin tool, or
    /// a tool of another kind (human, external, agent), which a session
    /// cannot answer.
    pub async fn new(
        runtime: Runtime,
        agent: Agent,
        options: ServeOptions,
    ) -> Result<Arc<Served>, McpError> {
        let listed = runtime.tools(&agent).await?;
        let unservable = |reason: String| McpError::Unservable {
            agent: agent.name.clone(),
            reason,
        };
        if let Some(other) = listed
            .iter()
            .find(|t| !matches!(t.target, ToolTarget::Plugin { .. }))
        {
            return Err(unservable(format!(
                "tool `{}` is not a plugin's tool (a human, external or agent tool): only plugin tools are served",
                other.name
            )));
        }
        let tools: Vec<_> = listed.iter().filter_map(tools::served).collect();
        if tools.is_empty() {
            return Err(unservable("it grants no plugin tool".to_owned()));
        }
        Ok(Arc::new(Served {
            runtime,
            agent: Arc::new(agent),
            tools,
            options,
            schemas: CompiledSchemas::default(),
            closing: Mutex::default(),
        }))
    }

    /// The served tools' names.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.tool.name.to_string()).collect()
    }

    fn tool(&self, name: &str) -> Option<&tools::ServedTool> {
        self.tools.iter().find(|t| t.tool.name == name)
    }

    /// Serves one session over stdin and stdout until the client closes
    /// it, then lets its run finish. `account` is the local account this
    /// process runs as (by its user id, not an environment the client
    /// chose): the client's identity when it may approve.
    pub async fn serve_stdio(self: &Arc<Self>, account: String) -> Result<(), McpError> {
        use rmcp::ServiceExt as _;
        let session =
            session::McpSession::new(Arc::clone(self), session::Transport::Stdio { account });
        let stdin = EndsSession {
            inner: tokio::io::stdin(),
            ended: session.ended(),
        };
        let running = session
            .serve((stdin, tokio::io::stdout()))
            .await
            .map_err(|e| McpError::Failed {
                message: e.to_string(),
            })?;
        let quit = running.waiting().await;
        self.closed().await;
        quit.map(|_| ()).map_err(|e| McpError::Failed {
            message: e.to_string(),
        })
    }

    /// Waits until every ended session's run has finished (bounded by each
    /// session).
    pub async fn closed(&self) {
        loop {
            let pending: Vec<_> =
                std::mem::take(&mut *self.closing.lock().unwrap_or_else(|p| p.into_inner()));
            if pending.is_empty() {
                return;
            }
            for task in pending {
                let _ = task.await;
            }
        }
    }

    /// Recovers the runs of this agent's sessions nobody drives: those
    /// whose server died (their claim ran out while they were still
    /// running), and those handed over as tasks whose call was decided
    /// since (released, and running again). The session is over, so the
    /// model's next call answers that and the run completes, after an
    /// approved call is made; a `write` whose outcome was not recorded is
    /// never run again, and the run parks as `needs_reconciliation`, as
    /// every recovery does. Runs another live server or worker holds are
    /// left alone. Returns each run recovered and the status it reached.
    pub async fn recover_orphans(&self) -> Result<Vec<(RunId, RunStatus)>, McpError> {
        let runs = self
            .runtime
            .store()
            .list(
                &RunFilter::new()
                    .agent(self.agent.name.clone())
                    .label(SESSION_LABEL, "serve"),
            )
            .await
            .map_err(RuntimeError::from)?;
        let mut recovered = Vec::new();
        for run in runs {
            if !orphaned(&run, now_ms()) {
                continue;
            }
            if let Some(status) = self.recover(&run).await {
                recovered.push((run.run_id, status));
            }
        }
        Ok(recovered)
    }

    /// Recovers the runs [`recover_orphans`](Self::recover_orphans) would,
    /// every third of the claim's time to live, until the returned task is
    /// aborted or this server dropped: a task's call approved while no
    /// client polls is made, and a crashed server's sessions end, without
    /// waiting for the next start.
    pub fn sweep(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let served = Arc::downgrade(self);
        let every = self.options.claim_ttl / 3;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(served) = served.upgrade() else {
                    return;
                };
                match served.recover_orphans().await {
                    Ok(recovered) => {
                        for (run, status) in recovered {
                            eprintln!("warden mcp serve: recovered run {run}: {status}");
                        }
                    }
                    Err(error) => tracing::warn!(%error, "cannot sweep the sessions' runs"),
                }
            }
        })
    }

    /// Recovers `run` in the background (a task's run its client polls or
    /// cancelled), awaited like a closing session before this server
    /// exits.
    fn recover_soon(self: &Arc<Self>, run: RunSummary) {
        let served = Arc::clone(self);
        let task = tokio::spawn(async move {
            if let Some(status) = served.recover(&run).await {
                tracing::info!(run_id = %run.run_id, %status, "recovered a task's run");
            }
        });
        let mut closing = self.closing.lock().unwrap_or_else(|p| p.into_inner());
        closing.retain(|task| !task.is_finished());
        closing.push(task);
    }

    /// Claims and drives one orphaned run to its end as a session that is
    /// over; `None` when another driver claimed it first or it failed.
    async fn recover(&self, run: &RunSummary) -> Option<RunStatus> {
        let store = Arc::clone(self.runtime.store());
        let runtime = self
            .runtime
            .clone()
            .with_provider(Arc::new(client_model::ClientModel::ended()));
        let started = Moment::now();
        let claim = match store
            .acquire_claim(
                &run.run_id,
                &self.options.owner,
                now_ms(),
                self.options.claim_ttl.as_millis() as i64,
            )
            .await
        {
            Ok(claim) => claim,
            // Another server or worker took it first.
            Err(error) => {
                tracing::info!(run_id = %run.run_id, %error, "not recovering a session's run");
                return None;
            }
        };
        let valid = ValidUntil::at(started.after(self.options.valid_for()));
        // Renewed while it runs: an approved call may take longer than
        // the claim lives.
        let renewing = tokio::spawn(session::renew(
            Arc::clone(&store),
            claim.clone(),
            valid.clone(),
            self.options.claim_ttl,
            self.options.valid_for(),
        ));
        let status = match runtime
            .recover_claimed(&self.agent, ReplayOptions::default(), claim.clone(), valid)
            .await
        {
            Ok(status) => Some(status),
            Err(RuntimeError::NeedsReconciliation { .. }) => Some(RunStatus::NeedsReconciliation),
            Err(error) => {
                tracing::warn!(run_id = %run.run_id, %error, "cannot recover a session's run");
                None
            }
        };
        renewing.abort();
        let listed = (status == Some(RunStatus::NeedsReconciliation))
            .then_some(RunStatus::NeedsReconciliation.listing());
        if let Err(error) = store.release_claim(&claim, listed).await {
            tracing::warn!(run_id = %run.run_id, %error, "cannot release a recovered run's claim");
        }
        status
    }

    /// Denies a call parked for approval on this server's behalf: a
    /// synchronous call its client cancelled, one whose session ended, a
    /// task its client cancelled. The engine's one denial path, so the call
    /// is never made, whoever approves it afterwards; `false` when it was
    /// no longer waiting (decided meanwhile: that decision stands).
    async fn withdraw(
        &self,
        run_id: &RunId,
        call_id: &warden::engine::CallId,
        reason: &str,
    ) -> Result<bool, RuntimeError> {
        tracing::info!(%run_id, %call_id, reason, "withdrawing a parked call");
        match self
            .runtime
            .deny(run_id, call_id, session::SERVER, reason)
            .await
        {
            Ok(()) => Ok(true),
            Err(RuntimeError::NotAwaitingApproval { .. } | RuntimeError::Conflict { .. }) => {
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }
}

/// Whether nobody drives `run`, a session's run: it can go on (listed as
/// running) and was claimed before (by a session), and its claim was
/// released (a task handed over, then decided) or ran out (its server
/// died). A run being started has never been claimed yet.
fn orphaned(run: &RunSummary, now_ms: i64) -> bool {
    run.status == RunStatus::Running.as_str()
        && run.claim_token > 0
        && run
            .claim
            .as_ref()
            .is_none_or(|claim| claim.is_expired(now_ms))
}

/// Stdin that ends its session at EOF: the client closed the connection,
/// so a call parked for approval is withdrawn at once (rmcp would first
/// wait for in-flight calls, and a client's stdio library kills a server
/// that does not exit within seconds).
struct EndsSession<R> {
    inner: R,
    ended: tokio_util::sync::CancellationToken,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EndsSession<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if room && matches!(polled, std::task::Poll::Ready(Ok(()))) && buf.filled().len() == before
        {
            self.ended.cancel();
        }
        polled
    }
}

/// Milliseconds since the Unix epoch, as claims are stamped.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
