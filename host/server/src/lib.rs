//! `warden serve`: Warden's HTTP control plane over a store. One server
//! sees every run of its store (SQLite, or PostgreSQL shared by many
//! workers), lets people watch them live and decide on them, and records
//! each decision under the token that made it (`api:<name>`).
//!
//! - `tokens.rs`: the token file (digests only) and roles;
//! - `agents.rs`: the agents the operator configured for the server, the
//!   runs it starts, submits and forks of them, and their plugins' grants;
//! - `guard.rs`: Host and Origin checks, failed-login limit, identity;
//! - `api.rs`: the JSON API under `/api/v1`; `stream.rs`: a run's events
//!   as server-sent events, resumable with `Last-Event-ID`;
//! - `error.rs`: the error envelope and codes, shared with the command
//!   line through its classifier; `contract.rs`: the JSON shapes the
//!   command line's `--json` and the API share;
//! - `console.rs`: the web console (a page, its scripts and the charting
//!   library it vendors, compiled in) and its login, a session cookie with
//!   a CSRF token; `overview.rs`: what its overview charts draw;
//! - `connections.rs`: the connection layer: header and idle timeouts, a
//!   connection cap, unauthenticated connections bounded first;
//! - `tls.rs`: HTTPS.
//!
//! The server fails closed: it does not start without tokens
//! ([`tokens::Tokens::read`]), and binds to a non-loopback address only
//! with TLS or an explicit opt-out ([`check_bind`]). It records decisions;
//! workers continue their runs, and a run no worker ever held (one that
//! `warden run` left parked, or one the server started or forked) the
//! server drives itself, as the command line's verbs would. It starts runs
//! only of the agents the operator configured for it ([`agents::Agents`]).

pub mod agents;
pub mod api;
pub mod connections;
pub mod console;
pub mod contract;
pub mod error;
pub mod guard;
pub mod overview;
pub mod stream;
pub mod tls;
pub mod tokens;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use serde_json::{Value, json};

use warden::engine::events::Event;
use warden::engine::worker::AgentLoader;
use warden::engine::{Agent, RunId, Runtime};

pub use connections::{ConnectionHandle, ConnectionLimits};
pub use error::{ApiError, Classify, ErrorReport};
pub use guard::Caller;
pub use tokens::{Role, TokenError, Tokens};

/// Paths served without a token (still Host- and Origin-checked).
pub(crate) const PUBLIC_PATHS: &[&str] = &["/api/v1/openapi.json"];

/// What the server needs besides the runtime.
pub struct ServeConfig {
    /// Who may call it.
    pub tokens: Tokens,
    /// Host names it answers as besides its bind address (and, on a
    /// loopback bind, `localhost`).
    pub allowed_hosts: Vec<String>,
    /// How library errors are reported (the command line's classifier).
    pub classify: Classify,
    /// How a run's recorded agent file is loaded (resume checks its input
    /// against the agent's limits).
    pub load_agent: AgentLoader,
    /// How often a live stream looks for events other processes appended.
    pub poll: Duration,
    /// Failed logins (no token, an unknown one) an address may make in a
    /// minute before it is refused until the minute is over.
    pub failed_logins_per_minute: u32,
    /// Whether it serves HTTPS (the console's cookie is then `Secure`).
    pub tls: bool,
    /// The proxies whose `X-Forwarded-For` names the client's address
    /// (for the failed-login limit and the logs).
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// The agents it starts runs of (`POST /api/v1/runs`) and forks into:
    /// the operator's choice, loaded and checked before it serves.
    pub agents: agents::Agents,
}

/// The handlers' shared state.
pub struct App {
    pub(crate) runtime: Runtime,
    pub(crate) classify: Classify,
    pub(crate) load_agent: AgentLoader,
    pub(crate) poll: Duration,
    pub(crate) agents: agents::Agents,
}

impl App {
    /// The time now, in ms since the epoch (the standing of a rule).
    pub(crate) fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }

    /// `error` as the API reports it.
    pub(crate) fn fail(&self, error: &(dyn std::error::Error + 'static)) -> ApiError {
        ApiError::from((self.classify)(error))
    }

    /// The run's event lines after `after`.
    pub(crate) async fn event_lines(
        &self,
        run: &RunId,
        after: u64,
    ) -> Result<Vec<Value>, ApiError> {
        let stored = self
            .runtime
            .store()
            .load_after(run, after)
            .await
            .map_err(|e| self.fail(&e))?;
        stored
            .iter()
            .map(|e| {
                contract::stored_line(e.seq, &e.bytes).map_err(|error| {
                    ApiError::new(
                        "log_unreadable",
                        format!("run {run}: event {} is not JSON: {error}", e.seq),
                    )
                    .with_details(json!({ "run_id": run, "seq": e.seq }))
                })
            })
            .collect()
    }

    /// Continues a run no worker ever held (one `warden run` started and
    /// left parked), as the command line's verbs do: nobody else would. A
    /// worker's run, or a queued one, is left to the workers.
    pub(crate) async fn continue_unleased(&self, run: &RunId) {
        let Ok(summary) = self.runtime.store().summary(run).await else {
            return;
        };
        if summary.claim_token > 0 || summary.status == warden::store::QUEUED {
            return;
        }
        let agent = match self.agent_of(run).await {
            Ok(agent) => agent,
            Err(error) => {
                tracing::warn!(%run, error = %error.report.message, "the run is left parked");
                return;
            }
        };
        self.drive(run, agent);
    }

    /// Drives `run` with `agent` in the background until it ends or parks:
    /// a run this server started, forked or continues.
    pub(crate) fn drive(&self, run: &RunId, agent: Agent) {
        let runtime = self.runtime.clone();
        let run = run.clone();
        tokio::spawn(async move {
            match runtime.drive(&run, &agent).await {
                Ok(status) => tracing::info!(%run, %status, "the server continued the run"),
                Err(error) => tracing::warn!(%run, %error, "the server could not continue the run"),
            }
        });
    }

    /// The agent the run goes on with, loaded from its recorded file: the
    /// one its latest `run_forked` names (a fork), else the one it started
    /// from.
    pub(crate) async fn agent_of(&self, run: &RunId) -> Result<Agent, ApiError> {
        let events = self.runtime.events(run).await.map_err(|e| self.fail(&e))?;
        let forked = events.iter().rev().find_map(|e| match e {
            Event::RunForked(f) => Some(f.agent_file.clone()),
            _ => None,
        });
        let file = match (forked, events.first()) {
            (Some(file), _) => file,
            (None, Some(Event::RunStarted(s))) => s.agent_file.clone(),
            _ => None,
        };
        let Some(file) = file else {
            return Err(ApiError::new(
                "agent_unknown",
                format!("run {run} does not record its agent file"),
            )
            .with_details(json!({ "run_id": run })));
        };
        (self.load_agent)(Path::new(&file)).map_err(|reason| {
            ApiError::new(
                "agent_unusable",
                format!("run {run}: its agent file `{file}` cannot be loaded: {reason}"),
            )
            .with_details(json!({ "run_id": run, "agent": file }))
        })
    }
}

/// The server's routes over `runtime`, for a server bound at `bind`.
pub fn router(runtime: Runtime, config: ServeConfig, bind: SocketAddr) -> Router {
    let guard = Arc::new(guard::Guard::new(
        config.tokens,
        bind,
        &config.allowed_hosts,
        config.failed_logins_per_minute,
        config.tls,
        config.trusted_proxies,
    ));
    let app = Arc::new(App {
        runtime,
        classify: config.classify,
        load_agent: config.load_agent,
        poll: config.poll,
        agents: config.agents,
    });
    let api = Router::new()
        .route("/whoami", get(api::whoami))
        .route("/agents", get(agents::list))
        .route("/plugins", get(agents::plugins))
        .route("/inbox", get(api::inbox))
        .route("/overview", get(overview::overview))
        .route("/runs", get(api::list).post(agents::start))
        .route("/runs/{run}/fork", post(agents::fork))
        .route("/runs/{run}", get(api::show))
        .route("/runs/{run}/events", get(api::events))
        .route("/runs/{run}/stream", get(stream::stream))
        .route("/runs/{run}/approve", post(api::approve))
        .route("/runs/{run}/deny", post(api::deny))
        .route("/runs/{run}/resume", post(api::resume))
        .route("/runs/{run}/resolve", post(api::resolve))
        .route("/runs/{run}/cancel", post(api::cancel))
        .route("/runs/{run}/abandon", post(api::abandon))
        .route("/sessions", get(api::sessions))
        .route("/sessions/{session}", get(api::session))
        .route("/audit", get(api::audit))
        .route("/keys", get(api::keys))
        .route("/keys/{key}", get(api::key))
        .route("/approvals/rules", get(api::rules).post(api::add_rule))
        .route("/approvals/rules/{rule}/revoke", post(api::revoke_rule))
        .route("/openapi.json", get(openapi))
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        .with_state(app);
    let mut console = Router::new()
        .route("/", get(console::root))
        .route("/console", get(console::root))
        .route("/console/", get(console::page))
        .route("/console/login", post(console::login))
        .route("/console/session", get(console::session))
        .route("/console/logout", post(console::logout));
    for &(path, content_type, body) in console::ASSETS {
        console = console.route(
            path,
            get(move || async move { console::serve_asset(content_type, body) }),
        );
    }
    let console = console.with_state(Arc::clone(&guard));
    Router::new()
        .nest("/api/v1", api)
        .merge(console)
        .fallback(|| async { ApiError::new("not_found", "no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(guard, guard::guard))
}

/// The OpenAPI document of the API (`GET /api/v1/openapi.json`).
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

/// A bind the server refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// A non-loopback address without TLS, not opted out.
    #[error(
        "refusing to serve on {addr} without TLS: tokens would cross the network in clear; give --tls-cert and --tls-key, bind to a loopback address, or pass --insecure-no-tls (behind a proxy that terminates TLS)"
    )]
    NeedsTls {
        /// The address.
        addr: SocketAddr,
    },
}

impl BindError {
    /// The stable code (docs/json-output.md).
    pub fn code(&self) -> &'static str {
        match self {
            BindError::NeedsTls { .. } => "tls_required",
        }
    }
}

/// Checks that serving on `addr` is allowed: a loopback address always; any
/// other only with TLS or when `insecure` opts out.
pub fn check_bind(addr: SocketAddr, tls: bool, insecure: bool) -> Result<(), BindError> {
    if addr.ip().is_loopback() || tls || insecure {
        Ok(())
    } else {
        Err(BindError::NeedsTls { addr })
    }
}

/// Serves `router` on `listener` (plain HTTP) within `limits` until
/// `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: connections::ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    connections::serve(listener, router, limits, shutdown).await
}

/// Serves `router` over TLS on `listener` within `limits` until
/// `shutdown` completes.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    router: Router,
    limits: connections::ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tls::TlsListener::new(listener, tls);
    connections::serve(listener, router, limits, shutdown).await
}
