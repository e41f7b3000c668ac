//! The streamable HTTP transport: rmcp's service at `/mcp`, behind the
//! Host and Origin checks `warden serve` makes (DNS rebinding: a page on
//! another site that points its name at 127.0.0.1 is refused) and, when a
//! token is set, `Authorization: Bearer <token>`. A request that passes
//! marks its connection authenticated for `warden serve`'s connection layer,
//! which the command line serves it through, and carries the identity the
//! token proved (`mcp:token:<variable>`), the one a client's approval is
//! recorded under. Each MCP session the service opens is a
//! `session::McpSession`: one run.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use warden_server::guard::SameOrigin;
use warden_server::tokens::{TokenEntry, digest};
use warden_server::{ApiError, ConnectionHandle, Role, Tokens};

use super::Served;
use super::session::{Authenticated, McpSession, Transport};

/// What the HTTP transport checks besides the MCP protocol.
#[derive(Clone, Debug, Default)]
pub struct HttpOptions {
    /// The bearer token every request must carry; `None` on loopback
    /// only (see [`check_bind`](super::check_bind)).
    pub token: Option<String>,
    /// The environment variable the token was read from: what a request
    /// carrying it is recorded as (`mcp:token:<variable>`).
    pub token_env: String,
    /// Host names it also answers as (its `Host` and `Origin`), as NAME or
    /// NAME:PORT.
    pub allowed_hosts: Vec<String>,
    /// Cancelled to close every session (at shutdown).
    pub shutdown: CancellationToken,
}

struct Gate {
    origins: SameOrigin,
    tokens: Option<Tokens>,
}

/// The routes of `served` for a server bound at `bind`: `POST`, `GET` and
/// `DELETE /mcp`.
pub fn router(served: Arc<Served>, bind: SocketAddr, options: HttpOptions) -> Router {
    let gate = Arc::new(Gate {
        origins: SameOrigin::new(bind, &options.allowed_hosts),
        tokens: options.token.as_deref().map(|token| {
            Tokens::from_entries(vec![TokenEntry {
                name: format!("mcp:token:{}", options.token_env),
                role: Role::Operator,
                sha256: digest(token),
                expires_ms: None,
            }])
        }),
    });
    // Host and Origin are checked by the gate, with the operator's
    // --allow-host, the same way as `warden serve`.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_cancellation_token(options.shutdown);
    let service = StreamableHttpService::new(
        move || Ok(McpSession::new(Arc::clone(&served), Transport::Http)),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .route_service("/mcp", service)
        .fallback(|| async { ApiError::new("not_found", "no such endpoint: MCP is at /mcp") })
        .layer(axum::middleware::from_fn_with_state(gate, check))
}

async fn check(State(gate): State<Arc<Gate>>, mut request: Request, next: Next) -> Response {
    match admit(&gate, &request) {
        Ok(identity) => {
            if let Some(identity) = identity {
                request.extensions_mut().insert(Authenticated(identity));
            }
            served(request, next).await
        }
        Err(error) => error.into_refusal(),
    }
}

/// Whether `request` passes the Host/Origin checks and carries the token;
/// `Ok` gives the identity the token proved (none without a token).
fn admit(gate: &Gate, request: &Request) -> Result<Option<String>, ApiError> {
    gate.origins.check(request.headers())?;
    let mut identity = None;
    if let Some(tokens) = &gate.tokens {
        let presented = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match presented {
            None => {
                return Err(ApiError::new(
                    "unauthenticated",
                    "no token: send `Authorization: Bearer <token>`",
                ));
            }
            Some(token) => match tokens.identify(token) {
                None => return Err(ApiError::new("unauthenticated", "unknown token")),
                Some(entry) => identity = Some(entry.name.clone()),
            },
        }
    }
    // Past the token: the connection layer never closes it for room.
    if let Some(connection) = request.extensions().get::<ConnectionHandle>() {
        connection.authenticated();
    }
    Ok(identity)
}

async fn served(request: Request, next: Next) -> Response {
    let ends_session = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    // rmcp answers a session's DELETE with 202; MCP clients (the Python
    // SDK among them) take 200 or 204 as "terminated".
    if ends_session && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    response
}
