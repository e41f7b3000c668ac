//! What every request passes before a handler sees it, in this order:
//!
//! 1. **Host**: the `Host` header names this server (its bind address, or
//!    `localhost`/`127.0.0.1`/`[::1]` at its port on a loopback bind, or a
//!    host the operator allowed). A page on another site that rebinds its
//!    DNS name to 127.0.0.1 sends its own name and is refused.
//! 2. **Origin**: a request a browser marks as coming from a page (an
//!    `Origin` header, or `Sec-Fetch-Site: cross-site`) must come from
//!    this server's own origin.
//! 3. **Identity**: a bearer token from the token file ([`Tokens`]), or a
//!    console session's cookie (`console.rs`; then anything but GET and
//!    HEAD must also carry the session's CSRF token); a request without
//!    either, or with an unknown one, is refused (and counted as a failed
//!    login). The handler gets the [`Caller`], and the connection is
//!    marked authenticated (`connections.rs`: it is never closed for room).
//! 4. **Failed-login limit**: an address with too many failed logins in
//!    the last minute has its next failures refused as `rate_limited`,
//!    without being looked at further. A valid token or a live session
//!    passes whatever its address did: the limit bounds the work failures
//!    cost, and never locks out a good token (tokens are 256-bit random:
//!    guessing one is not a threat a limit needs to slow).
//!
//! The client's address is the connection's, unless the connection comes
//! from a trusted proxy (`--trusted-proxy`, `[serve] trusted_proxies`):
//! then it is the last address in `X-Forwarded-For` that is not itself a
//! trusted proxy.
//!
//! Nothing passes unauthenticated but the OpenAPI document and the
//! console's page, script, style and login.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use crate::connections::ConnectionHandle;
use crate::console::{self, CookieAuth, Sessions};
use crate::error::ApiError;
use crate::tokens::{Role, Tokens};

/// Who made a request: a token's name and role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Caller {
    /// Refused unless the caller's role is `role` or above.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            return Ok(());
        }
        Err(ApiError::new(
            "forbidden",
            format!(
                "token `{}` is a {}: this needs a {} or above",
                self.name,
                self.role.as_str(),
                role.as_str()
            ),
        )
        .with_details(json!({ "token": self.name, "role": self.role, "needed": role })))
    }

    /// How the log records a decision this caller made: `api:<name>`.
    pub fn by(&self) -> String {
        format!("api:{}", self.name)
    }
}

/// The address a connection comes from (over plain TCP or TLS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// The window failed logins are counted in.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The guard's state: tokens, the hosts this server answers as, and the
/// failed logins per address.
#[derive(Debug)]
pub struct Guard {
    tokens: Tokens,
    origins: SameOrigin,
    failures_allowed: u32,
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    sessions: Sessions,
    tls: bool,
    trusted_proxies: Vec<IpAddr>,
}

/// Checks 1 and 2 alone (Host and Origin, against DNS rebinding), for a
/// server with an identity check of its own (`warden mcp serve`).
#[derive(Clone, Debug)]
pub struct SameOrigin {
    hosts: Vec<String>,
}

impl SameOrigin {
    /// The checks for a server bound at `bind` that also answers as
    /// `extra_hosts` (each `name` or `name:port`); on a loopback bind it
    /// answers as `localhost`, `127.0.0.1` and `[::1]` at its port too.
    pub fn new(bind: SocketAddr, extra_hosts: &[String]) -> SameOrigin {
        let port = bind.port();
        let mut hosts = vec![match bind.ip() {
            IpAddr::V4(ip) => format!("{ip}:{port}"),
            IpAddr::V6(ip) => format!("[{ip}]:{port}"),
        }];
        if bind.ip().is_loopback() {
            for name in ["localhost", "127.0.0.1", "[::1]"] {
                hosts.push(format!("{name}:{port}"));
            }
        }
        for host in extra_hosts {
            let host = host.to_ascii_lowercase();
            if host.contains(':') && !host.ends_with(']') {
                hosts.push(host);
            } else {
                hosts.push(format!("{host}:{port}"));
                hosts.push(host);
            }
        }
        SameOrigin { hosts }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.hosts.contains(&host)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        ["http://", "https://"].iter().any(|scheme| {
            origin
                .strip_prefix(scheme)
                .is_some_and(|host| self.host_allowed(host))
        })
    }

    /// Refuses a request whose `Host` is not this server's, or that a
    /// browser marks as coming from another origin (`host_refused`,
    /// `origin_refused`).
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let Some(host) = header("host") else {
            return Err(ApiError::new("host_refused", "the request names no Host"));
        };
        if !self.host_allowed(host) {
            return Err(ApiError::new(
                "host_refused",
                format!("this server does not answer as `{host}` (allow it with --allow-host)"),
            )
            .with_details(json!({ "host": host })));
        }
        if let Some(origin) = header("origin")
            && !self.origin_allowed(origin)
        {
            return Err(ApiError::new(
                "origin_refused",
                format!(
                    "requests from `{origin}` are refused: only this server's own pages may call it"
                ),
            )
            .with_details(json!({ "origin": origin })));
        }
        if header("sec-fetch-site") == Some("cross-site") {
            return Err(ApiError::new(
                "origin_refused",
                "a cross-site request is refused",
            ));
        }
        Ok(())
    }
}

impl Guard {
    /// A guard for a server bound at `bind` that accepts `tokens`, also
    /// answers as `extra_hosts` (each `name` or `name:port`), and refuses
    /// an address once it failed `failures_allowed` logins in a minute.
    /// `tls`: the server speaks HTTPS (console cookies are then `Secure`).
    /// `trusted_proxies`: the addresses whose `X-Forwarded-For` names the
    /// client.
    pub fn new(
        tokens: Tokens,
        bind: SocketAddr,
        extra_hosts: &[String],
        failures_allowed: u32,
        tls: bool,
        trusted_proxies: Vec<IpAddr>,
    ) -> Guard {
        Guard {
            tokens,
            origins: SameOrigin::new(bind, extra_hosts),
            failures_allowed,
            failures: Mutex::default(),
            sessions: Sessions::default(),
            tls,
            trusted_proxies,
        }
    }

    /// The client's address: `peer`'s, or, when `peer` is a trusted proxy,
    /// the last address in `X-Forwarded-For` that is not a trusted proxy
    /// (an address a client wrote further left is its own claim, never
    /// believed).
    pub(crate) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusted_proxies.contains(&peer) {
            return peer;
        }
        let forwarded: Vec<IpAddr> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map_while(|a| a.trim().parse::<IpAddr>().ok())
            .collect();
        forwarded
            .into_iter()
            .rev()
            .find(|a| !self.trusted_proxies.contains(a))
            .unwrap_or(peer)
    }

    /// The console's sessions.
    pub(crate) fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Whether the server speaks HTTPS.
    pub(crate) fn tls(&self) -> bool {
        self.tls
    }

    /// The caller `token` names, for a console login from `ip`, and when
    /// the token expires: refused and counted like any failed login when
    /// it names none or an expired one.
    pub(crate) fn login(&self, token: &str, ip: IpAddr) -> Result<(Caller, Option<i64>), ApiError> {
        self.identify(token, ip)
    }

    /// The caller a bearer token names, and when it expires. A failure is
    /// counted against `ip`, or, once `ip` is over its limit, refused as
    /// `rate_limited`.
    fn identify(&self, token: &str, ip: IpAddr) -> Result<(Caller, Option<i64>), ApiError> {
        match self.tokens.identify(token) {
            Some(entry) if entry.is_expired(now_ms()) => {
                // Counted like an unknown token: an old one is no key.
                self.failed(ip)?;
                Err(ApiError::new(
                    "token_expired",
                    format!(
                        "token `{}` expired at {}: make a new one with `warden serve tokens add`",
                        entry.name,
                        warden::units::utc_text(entry.expires_ms.unwrap_or_default())
                    ),
                ))
            }
            Some(entry) => Ok((
                Caller {
                    name: entry.name.clone(),
                    role: entry.role,
                },
                entry.expires_ms,
            )),
            None => {
                self.failed(ip)?;
                Err(ApiError::new("unauthenticated", "unknown token"))
            }
        }
    }

    fn limited(&self, ip: IpAddr) -> bool {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.get(&ip).is_some_and(|(since, n)| {
            since.elapsed() < FAILURE_WINDOW && *n >= self.failures_allowed
        })
    }

    /// Counts a failed login from `ip`; refused as `rate_limited` instead
    /// once `ip` is over its limit.
    fn failed(&self, ip: IpAddr) -> Result<(), ApiError> {
        if self.limited(ip) {
            return Err(rate_limited(ip));
        }
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a flood from many addresses forgets the oldest window.
        if failures.len() > 10_000 {
            failures.retain(|_, (since, _)| since.elapsed() < FAILURE_WINDOW);
        }
        let entry = failures.entry(ip).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILURE_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
        Ok(())
    }

    /// The request's caller, or why it is refused.
    fn check(
        &self,
        method: &Method,
        headers: &HeaderMap,
        ip: IpAddr,
        path: &str,
    ) -> Result<Option<Caller>, ApiError> {
        self.origins.check(headers)?;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if crate::PUBLIC_PATHS.contains(&path) || console::is_public(path) {
            return Ok(None);
        }
        let token = header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(token) = token else {
            return self.by_cookie(method, headers, ip);
        };
        self.identify(token, ip).map(|(caller, _)| Some(caller))
    }
}

impl Guard {
    /// The caller of a request without a bearer token: a live console
    /// session, with its CSRF token on anything that changes state.
    fn by_cookie(
        &self,
        method: &Method,
        headers: &HeaderMap,
        ip: IpAddr,
    ) -> Result<Option<Caller>, ApiError> {
        let Some(cookie) = console::cookie(headers) else {
            self.failed(ip)?;
            return Err(ApiError::new(
                "unauthenticated",
                "no token: send `Authorization: Bearer <token>`, or log in to the console",
            ));
        };
        let CookieAuth::Live { caller, csrf } = self.sessions.find(cookie) else {
            self.failed(ip)?;
            return Err(ApiError::new(
                "unauthenticated",
                "the console session ended (logged out, expired, or the server restarted): log in again",
            ));
        };
        if method != Method::GET && method != Method::HEAD {
            let sent = headers
                .get("x-warden-csrf")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if !console::same_secret(sent, &csrf) {
                return Err(ApiError::new(
                    "csrf_refused",
                    "this request needs the console session's CSRF token in X-Warden-CSRF",
                ));
            }
        }
        Ok(Some(caller))
    }
}

/// The wall clock, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn rate_limited(ip: IpAddr) -> ApiError {
    ApiError::new(
        "rate_limited",
        format!("too many failed logins from {ip}: try again in a minute"),
    )
}

/// The middleware: refuses what [`Guard`] refuses, and hands the handler
/// its [`Caller`] as an extension.
pub async fn guard(
    State(guard): State<Arc<Guard>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let client = guard.client(peer.ip(), request.headers());
    match guard.check(request.method(), request.headers(), client, &path) {
        Ok(Some(caller)) => {
            if let Some(connection) = request.extensions().get::<ConnectionHandle>() {
                connection.authenticated();
            }
            request.extensions_mut().insert(caller);
        }
        Ok(None) => {}
        Err(error) => {
            tracing::info!(code = error.report.code, %peer, %client, path, "request refused");
            return error.into_refusal();
        }
    }
    next.run(request).await
}
