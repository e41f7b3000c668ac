//! The web console: a small page, its scripts and its style, compiled into
//! the binary (no build step; the one third-party file is the charting
//! library, vendored with its licence and pinned version), and the login
//! that turns a token into a browser session.
//!
//! A browser never holds the token after logging in: `POST
//! /console/login` checks it (failures count against the address like any
//! failed login) and answers with an `HttpOnly`, `SameSite=Strict` session
//! cookie and a CSRF token bound to that session. A request that
//! authenticates by the cookie and changes anything (any method but GET
//! and HEAD) must carry that CSRF token in `X-Warden-CSRF`: a token from
//! another session, or one whose session logged out or expired, is
//! refused (`csrf_refused`). Sessions live in this process only and end
//! after [`SESSION_TTL`], when their token expires, or at logout; a
//! restart logs everyone out.
//!
//! Every page is served with a strict Content-Security-Policy (scripts,
//! styles and connections from this origin only, no inline script, no
//! framing), so markup injected through a run's recorded text cannot run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::api::Body;
use crate::error::ApiError;
use crate::guard::{Caller, Guard, Peer};

/// How long a console session lasts after login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 60 * 60);

/// The most sessions kept at once; beyond it the oldest are dropped.
const MAX_SESSIONS: usize = 1_000;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "warden_console";

/// The paths the console serves without a session (they hold no data).
/// The files of [`ASSETS`] are public too.
pub(crate) const PUBLIC_PATHS: &[&str] = &[
    "/",
    "/console",
    "/console/",
    "/console/login",
    "/console/session",
];

/// Whether `path` is served without a session.
pub(crate) fn is_public(path: &str) -> bool {
    PUBLIC_PATHS.contains(&path) || ASSETS.iter().any(|(p, _, _)| *p == path)
}

/// The policy every console response carries.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// One browser's login.
#[derive(Debug)]
struct Session {
    caller: Caller,
    csrf: String,
    until: Instant,
}

/// The console's live sessions, by the digest of their cookie (the cookie
/// itself is not kept, so a memory dump does not hand out sessions).
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<[u8; 32], Session>>,
}

/// How a request authenticated by a session cookie stands.
pub(crate) enum CookieAuth {
    /// The session is live: its caller and CSRF token.
    Live { caller: Caller, csrf: String },
    /// No such session (never made, logged out or expired).
    Unknown,
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares without leaking, through timing, how much of a guess matched.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    digest(a) == digest(b)
}

impl Sessions {
    /// A new session for `caller`, lasting `ttl`: its cookie value and
    /// CSRF token.
    fn open(&self, caller: Caller, ttl: Duration) -> (String, String) {
        let cookie = random_hex();
        let csrf = random_hex();
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        live.retain(|_, s| s.until > now);
        if live.len() >= MAX_SESSIONS
            && let Some(oldest) = live.iter().min_by_key(|(_, s)| s.until).map(|(k, _)| *k)
        {
            live.remove(&oldest);
        }
        live.insert(
            digest(&cookie),
            Session {
                caller,
                csrf: csrf.clone(),
                until: now + ttl,
            },
        );
        (cookie, csrf)
    }

    /// The session a cookie value names.
    pub(crate) fn find(&self, cookie: &str) -> CookieAuth {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get(&digest(cookie)) {
            Some(s) if s.until > Instant::now() => CookieAuth::Live {
                caller: s.caller.clone(),
                csrf: s.csrf.clone(),
            },
            _ => CookieAuth::Unknown,
        }
    }

    fn close(&self, cookie: &str) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.remove(&digest(cookie));
    }
}

/// The session cookie's value in `headers`, if any.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    secured(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// `GET /`: the console.
pub async fn root() -> Redirect {
    Redirect::to("/console/")
}

/// `GET /console/`: the page.
pub async fn page() -> Response {
    asset(
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
    )
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The console's files but the page, by path: its modules, its style, and
/// the charting library it draws with (uPlot, vendored with its licence
/// and pinned version: `console/vendor/uplot/README.md`).
pub const ASSETS: &[(&str, &str, &str)] = &[
    ("/console/app.js", JS, include_str!("console/app.js")),
    ("/console/format.js", JS, include_str!("console/format.js")),
    ("/console/charts.js", JS, include_str!("console/charts.js")),
    ("/console/app.css", CSS, include_str!("console/app.css")),
    (
        "/console/vendor/uplot/uPlot.esm.js",
        JS,
        include_str!("console/vendor/uplot/uPlot.esm.js"),
    ),
    (
        "/console/vendor/uplot/uPlot.min.css",
        CSS,
        include_str!("console/vendor/uplot/uPlot.min.css"),
    ),
];

/// `GET` of one of [`ASSETS`].
pub fn serve_asset(content_type: &'static str, body: &'static str) -> Response {
    asset(content_type, body)
}

/// The body of a login.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    token: String,
}

fn session_cookie(value: &str, max_age: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .expect("a cookie of hex digits is a valid header")
}

/// `POST /console/login`: a token for a session cookie and a CSRF token.
pub async fn login(
    State(guard): State<Arc<Guard>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    Body(body): Body<Login>,
) -> Result<Response, ApiError> {
    let client = guard.client(peer.ip(), &headers);
    let (caller, expires_ms) = guard.login(body.token.trim(), client)?;
    // A session never outlives its token.
    let ttl = match expires_ms {
        Some(at) => SESSION_TTL.min(Duration::from_millis(
            u64::try_from(at - crate::guard::now_ms()).unwrap_or(0),
        )),
        None => SESSION_TTL,
    };
    let (cookie, csrf) = guard.sessions().open(caller.clone(), ttl);
    tracing::info!(token = caller.name, %peer, "console login");
    let mut response = Json(json!({
        "v": crate::contract::VERSION,
        "name": caller.name,
        "role": caller.role,
        "csrf": csrf,
    }))
    .into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(&cookie, ttl.as_secs(), guard.tls()),
    );
    Ok(secured(response))
}

/// `GET /console/session`: who the session cookie logs in as, and its
/// CSRF token (so a reloaded page need not log in again). Same-origin
/// only: the guard refuses other origins, and no CORS header lets another
/// site's script read the answer.
pub async fn session(
    State(guard): State<Arc<Guard>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let live = cookie(&headers).map(|c| guard.sessions().find(c));
    match live {
        Some(CookieAuth::Live { caller, csrf }) => Ok(secured(
            Json(json!({
                "v": crate::contract::VERSION,
                "name": caller.name,
                "role": caller.role,
                "csrf": csrf,
            }))
            .into_response(),
        )),
        _ => Err(ApiError::new("unauthenticated", "not logged in")),
    }
}

/// `POST /console/logout`: ends the session (the guard has checked its
/// CSRF token).
pub async fn logout(State(guard): State<Arc<Guard>>, headers: HeaderMap) -> Response {
    if let Some(c) = cookie(&headers) {
        guard.sessions().close(c);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie("", 0, guard.tls()));
    secured(response)
}
