//! What the HTTP providers share: the process-wide [`HttpClient`] (HTTP/1.1
//! over TCP or rustls, idle connections pooled per origin), an endpoint's
//! settings ([`HttpConfig`], secrets as [`Secret`]), what an error response
//! says about trying again (its status, its error object, `Retry-After`),
//! and the one streaming call loop both wire formats run through
//! (`HttpModel`).
//!
//! One call is exactly one request: wait for a permit (a provider's cap on
//! concurrent calls), send the request, check the status, then read the
//! body (server-sent events, or one JSON document) through the wire
//! format's decoder. A failure ends the stream with a typed error that
//! says whether it is transient and what `Retry-After` asked for; the
//! engine records it and decides whether and when to try again (see
//! `engine::retry`: one retry layer, so `max_attempts` counts requests).
//! Each request is a tracing span (`model_http_request`, with `provider`,
//! `model` and `url`).
//!
//! Dropping the stream drops the response body; a body dropped before its
//! end aborts its connection's task, which closes the socket. Only a body
//! read to its end gives its connection back to the pool.
//!
//! Secrets (the API key, secret headers) travel only in header values
//! marked sensitive. They are never part of a URL, a log line or an error:
//! error bodies are scrubbed of them, and URLs in errors drop their query.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST, RETRY_AFTER, USER_AGENT};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;
use wasmtime_wasi_http::io::TokioIo;

use super::sse::{SseEvent, SseParser};
use super::{ModelRequest, ModelStream, ProviderError, ProviderEvent};

/// Most bytes of an error response kept in [`ProviderError::Http`].
pub const MAX_ERROR_BODY: usize = 16 * 1024;
/// Most bytes of one server-sent event, or of a whole JSON response.
pub const MAX_RESPONSE_EVENT: usize = 32 * 1024 * 1024;
/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections kept per origin.
pub const POOL_MAX_IDLE_PER_ORIGIN: usize = 32;

/// A secret value (an API key), read from the environment. Its `Debug`
/// does not show it, and nothing in Warden prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret from a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value of environment variable `var`, which must be set and not
    /// empty. The error names the variable, never a value.
    pub fn from_env(var: &str) -> Result<Secret, String> {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(Secret(v.trim().to_owned())),
            Ok(_) => Err(format!("environment variable `{var}` is empty")),
            Err(std::env::VarError::NotPresent) => {
                Err(format!("environment variable `{var}` is not set"))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("environment variable `{var}` is not valid UTF-8"))
            }
        }
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where and how an HTTP provider calls its API.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// The API's base URL, `http` or `https`, such as
    /// `https://api.openai.com/v1`; the wire format's path is appended
    /// (before any query). No default: each provider passes its own.
    pub base_url: String,
    /// The API key, sent the way the wire format wants it. Default: none.
    pub api_key: Option<Secret>,
    /// Extra headers, sent with every request. Default: none.
    pub headers: Vec<(String, String)>,
    /// Extra headers whose values are secrets (marked sensitive, scrubbed
    /// from errors). Default: none.
    pub secret_headers: Vec<(String, Secret)>,
    /// The most a call waits for a connection, for the response to start,
    /// and then between two pieces of the body. Default: 60 s.
    pub timeout: Duration,
    /// Calls in flight at once through this provider; more wait their turn.
    /// Default: 8.
    pub max_concurrent_calls: usize,
    /// Whether to ask for a streamed response (server-sent events). A
    /// server that answers with one JSON document anyway is understood.
    /// Default: true.
    pub stream: bool,
}

impl HttpConfig {
    /// Settings for `base_url` with every default.
    pub fn new(base_url: impl Into<String>) -> Self {
        HttpConfig {
            base_url: base_url.into(),
            api_key: None,
            headers: Vec::new(),
            secret_headers: Vec::new(),
            timeout: Duration::from_secs(60),
            max_concurrent_calls: 8,
            stream: true,
        }
    }
}

/// What `Retry-After` (or `retry-after-ms`, which some APIs send) asks for,
/// in milliseconds: seconds, fractional seconds, or an HTTP date (measured
/// from `now`). A response with neither is read for the same headers as a
/// proxy forwards them from the server behind it (LiteLLM's
/// `llm_provider-retry-after`).
pub fn retry_after_ms(headers: &HeaderMap, now: SystemTime) -> Option<u64> {
    retry_after_with(headers, now, "").or_else(|| retry_after_with(headers, now, "llm_provider-"))
}

fn retry_after_with(headers: &HeaderMap, now: SystemTime, prefix: &str) -> Option<u64> {
    let text = |name: &str| {
        headers
            .get(format!("{prefix}{name}").as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let millis =
        |secs: f64| (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).ceil() as u64);
    if let Some(ms) = text("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| millis(ms / 1000.0))
    {
        return Some(ms);
    }
    let value = text(RETRY_AFTER.as_str())?;
    if let Ok(secs) = value.parse::<u64>() {
        return Some(secs.saturating_mul(1000));
    }
    if let Some(ms) = value.parse::<f64>().ok().and_then(millis) {
        return Some(ms);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map_or(0, |d| d.as_millis() as u64))
}

/// Error types the OpenAI and Anthropic APIs (and the servers that speak
/// them) document as worth trying again.
const TRANSIENT_TYPES: &[&str] = &[
    "server_error",
    "api_error",
    "overloaded_error",
    "rate_limit_error",
    "rate_limit_exceeded",
    "timeout_error",
    "timeout",
    "service_unavailable",
    "service_unavailable_error",
];
/// Error types that say the same request can never succeed.
const PERMANENT_TYPES: &[&str] = &[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "billing_error",
    "insufficient_quota",
    "invalid_api_key",
    "context_length_exceeded",
    "model_not_found",
    "unsupported_country_region_territory",
];

/// Whether an HTTP status says trying again later may succeed: 408, 409,
/// 429, 529 and 5xx.
pub fn status_is_transient(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 529) || (500..600).contains(&status)
}

/// Whether an API's error object (`{"type", "code", "message", …}`) says
/// trying again may succeed. By its `type` when the type is one the APIs
/// document; else by its `code` (a number, or a string of digits, is read
/// as an HTTP status, as proxies send it; a documented name as a type);
/// else by `status` (the response's HTTP status, or the object's own
/// `status` field). With none of them known, it is permanent.
pub fn error_is_transient(error: &Value, status: Option<u16>) -> bool {
    let known = |name: &str| {
        if TRANSIENT_TYPES.contains(&name) {
            Some(true)
        } else if PERMANENT_TYPES.contains(&name) {
            Some(false)
        } else {
            None
        }
    };
    if let Some(verdict) = error.get("type").and_then(Value::as_str).and_then(known) {
        return verdict;
    }
    let code = error.get("code");
    let numeric = code.and_then(|c| {
        c.as_u64()
            .or_else(|| c.as_str().and_then(|s| s.trim().parse::<u64>().ok()))
    });
    if let Some(n) = numeric.and_then(|n| u16::try_from(n).ok()) {
        return status_is_transient(n);
    }
    if let Some(verdict) = code.and_then(Value::as_str).and_then(known) {
        return verdict;
    }
    let own = error
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|n| u16::try_from(n).ok());
    own.or(status).is_some_and(status_is_transient)
}

/// The error object of an error response body: OpenAI's `{"error": {…}}`,
/// Anthropic's `{"type": "error", "error": {…}}`, or `None` when the body
/// is not such JSON.
pub fn error_object(body: &str) -> Option<Value> {
    let value: Value = serde_json::from_str(body).ok()?;
    match value.get("error") {
        Some(e @ Value::Object(_)) => Some(e.clone()),
        _ => None,
    }
}

/// A URL as errors and logs show it: no user info, and a query reduced to
/// `?…` (it may hold a key).
pub fn display_url(uri: &Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = uri.host().unwrap_or("");
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    let query = if uri.query().is_some() { "?…" } else { "" };
    format!("{scheme}://{host}{port}{}{query}", uri.path())
}

/// Checks a base URL as [`HttpConfig::base_url`] takes it: `http` or
/// `https`, a host, no credentials. The error does not repeat a URL that
/// carries credentials.
pub fn check_base_url(base: &str) -> Result<(), String> {
    join_url(base, "").map(|_| ())
}

/// `base` with `path` appended to its path, its query kept.
fn join_url(base: &str, path: &str) -> Result<Uri, String> {
    let authority = base
        .split_once("://")
        .map_or(base, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("");
    if authority.contains('@') {
        return Err(
            "the URL must not carry credentials: put the key in an environment variable".into(),
        );
    }
    let lower = base.to_ascii_lowercase();
    if !lower.starts_with("http://") && !lower.starts_with("https://") {
        return Err(format!("`{base}` must start with http:// or https://"));
    }
    let (base, query) = match base.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (base, None),
    };
    let mut url = format!("{}{path}", base.trim_end_matches('/'));
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("`{}` is not a valid URL: {e}", base))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{base}` has no host"));
    }
    Ok(uri)
}

// ---------------------------------------------------------------------------
// The client.

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Origin {
    https: bool,
    host: String,
    port: u16,
}

impl Origin {
    fn of(uri: &Uri) -> Origin {
        let https = uri.scheme_str() == Some("https");
        Origin {
            https,
            host: uri
                .host()
                .unwrap_or("")
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: uri.port_u16().unwrap_or(if https { 443 } else { 80 }),
        }
    }
}

/// A connection: the handle to send on and its task, which owns the socket.
struct Conn {
    origin: Origin,
    sender: SendRequest<Full<Bytes>>,
    task: tokio::task::AbortHandle,
    idle_since: Instant,
}

impl Conn {
    fn close(self) {
        self.task.abort();
    }
}

#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Origin, Vec<Conn>>>,
}

impl Pool {
    fn take(&self, origin: &Origin) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(origin)?;
        while let Some(conn) = list.pop() {
            if conn.sender.is_closed() || conn.idle_since.elapsed() > POOL_IDLE_TIMEOUT {
                conn.close();
                continue;
            }
            return Some(conn);
        }
        None
    }

    fn put(&self, mut conn: Conn) {
        if conn.sender.is_closed() {
            return conn.close();
        }
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(conn.origin.clone()).or_default();
        list.retain(|c| !c.sender.is_closed());
        if list.len() >= POOL_MAX_IDLE_PER_ORIGIN {
            return conn.close();
        }
        list.push(conn);
    }
}

/// The HTTP client every provider shares: HTTP/1.1 over TCP or TLS
/// (rustls, the Mozilla roots from `webpki-roots`), idle connections
/// pooled per origin. Cheap to clone.
#[derive(Clone, Default)]
pub struct HttpClient {
    pool: Arc<Pool>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("cannot connect to {host}:{port}: {error}")]
    Connect {
        host: String,
        port: u16,
        error: std::io::Error,
    },
    #[error("TLS handshake with {host} failed: {error}")]
    Tls { host: String, error: std::io::Error },
    #[error("`{host}` is not a valid TLS server name")]
    ServerName { host: String },
    #[error("no connection within {0:?}")]
    ConnectTimeout(Duration),
    #[error("no response within {0:?}")]
    ResponseTimeout(Duration),
    #[error("{0}")]
    Http(hyper::Error),
}

/// A response body. Dropped before its end, it closes its connection;
/// read to its end, it gives the connection back to the pool.
pub(crate) struct ResponseBody {
    incoming: Incoming,
    conn: Option<Conn>,
    pool: Weak<Pool>,
    ended: bool,
}

impl ResponseBody {
    /// The next piece of data, or `None` at the end.
    async fn chunk(&mut self) -> Result<Option<Bytes>, hyper::Error> {
        if self.ended {
            return Ok(None);
        }
        loop {
            match self.incoming.frame().await {
                None => {
                    self.ended = true;
                    if let (Some(conn), Some(pool)) = (self.conn.take(), self.pool.upgrade()) {
                        pool.put(conn);
                    }
                    return Ok(None);
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
    }
}

impl HttpClient {
    /// A client with its own pool.
    pub fn new() -> Self {
        HttpClient::default()
    }

    /// The process-wide client.
    pub fn shared() -> HttpClient {
        static SHARED: OnceLock<HttpClient> = OnceLock::new();
        SHARED.get_or_init(HttpClient::new).clone()
    }

    /// Idle pooled connections, over every origin.
    pub fn idle_connections(&self) -> usize {
        let idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.values()
            .map(|l| l.iter().filter(|c| !c.sender.is_closed()).count())
            .sum()
    }

    async fn connect(&self, origin: &Origin, timeout: Duration) -> Result<Conn, SendError> {
        let connect = async {
            let tcp = tokio::net::TcpStream::connect((origin.host.as_str(), origin.port))
                .await
                .map_err(|error| SendError::Connect {
                    host: origin.host.clone(),
                    port: origin.port,
                    error,
                })?;
            let _ = tcp.set_nodelay(true);
            let (sender, conn) = if origin.https {
                let name = server_name(&origin.host)?;
                let tls = tokio_rustls::TlsConnector::from(warden_tls::client_config())
                    .connect(name, tcp)
                    .await
                    .map_err(|error| SendError::Tls {
                        host: origin.host.clone(),
                        error,
                    })?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .map_err(SendError::Http)?;
                let task = tokio::spawn(async move {
                    let _ = conn.await;
                });
                (sender, task.abort_handle())
            } else {
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(SendError::Http)?;
                let task = tokio::spawn(async move {
                    let _ = conn.await;
                });
                (sender, task.abort_handle())
            };
            Ok(Conn {
                origin: origin.clone(),
                sender,
                task: conn,
                idle_since: Instant::now(),
            })
        };
        tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| SendError::ConnectTimeout(timeout))?
    }

    /// POSTs `body` to `url` with `headers` on a pooled or new connection
    /// and waits up to `timeout` for the response to start.
    async fn post(
        &self,
        url: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(http::response::Parts, ResponseBody), SendError> {
        let origin = Origin::of(url);
        // The request line carries only the path and query.
        let target = origin_form(url);
        loop {
            let (mut conn, pooled) = match self.pool.take(&origin) {
                Some(conn) => (conn, true),
                None => (self.connect(&origin, timeout).await?, false),
            };
            match tokio::time::timeout(timeout, conn.sender.ready()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) if pooled => {
                    conn.close();
                    continue;
                }
                Ok(Err(e)) => {
                    conn.close();
                    return Err(SendError::Http(e));
                }
                Err(_) => {
                    conn.close();
                    return Err(SendError::ResponseTimeout(timeout));
                }
            }
            let mut request = Request::new(Full::new(body.clone()));
            *request.method_mut() = Method::POST;
            *request.uri_mut() = target.clone();
            *request.headers_mut() = headers.clone();
            let sent = tokio::time::timeout(timeout, conn.sender.send_request(request));
            match sent.await {
                Err(_) => {
                    conn.close();
                    return Err(SendError::ResponseTimeout(timeout));
                }
                // A pooled connection the server closed before taking the
                // request: it was not sent, so sending it on another
                // connection cannot duplicate it.
                Ok(Err(e)) if pooled && e.is_canceled() => {
                    conn.close();
                    continue;
                }
                Ok(Err(e)) => {
                    conn.close();
                    return Err(SendError::Http(e));
                }
                Ok(Ok(response)) => {
                    let (parts, incoming) = response.into_parts();
                    return Ok((
                        parts,
                        ResponseBody {
                            incoming,
                            conn: Some(conn),
                            pool: Arc::downgrade(&self.pool),
                            ended: false,
                        },
                    ));
                }
            }
        }
    }
}

impl HttpClient {
    /// POSTs `body` to `url` with `headers` (and `Host`, when they do not
    /// name it) and reads the response whole: for senders other
    /// than the model providers (the OpenTelemetry exporter) that want one
    /// request on the same pooled connections and TLS configuration. Waits
    /// up to `timeout` for the response to start and again for its body; a
    /// body longer than `limit` bytes is an error.
    pub async fn post_whole(
        &self,
        url: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        timeout: Duration,
        limit: usize,
    ) -> Result<http::Response<Bytes>, PostError> {
        let failed = |reason: String| PostError {
            url: display_url(url),
            reason,
        };
        let mut headers = headers.clone();
        if !headers.contains_key(HOST)
            && let Some(authority) = url.authority()
        {
            let host = HeaderValue::from_str(authority.as_str())
                .map_err(|_| failed(format!("`{authority}` is not a valid host")))?;
            headers.insert(HOST, host);
        }
        let (parts, mut response) = self
            .post(url, &headers, body, timeout)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let read = async {
            let mut whole = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
                if whole.len() + chunk.len() > limit {
                    return Err(format!("the response is longer than {limit} bytes"));
                }
                whole.extend_from_slice(&chunk);
            }
            Ok(whole)
        };
        let whole = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| failed(format!("no whole response within {timeout:?}")))?
            .map_err(failed)?;
        Ok(http::Response::from_parts(parts, Bytes::from(whole)))
    }
}

/// A request of [`HttpClient::post_whole`] got no whole response.
#[derive(Debug, thiserror::Error)]
#[error("POST {url} failed: {reason}")]
pub struct PostError {
    /// The URL, without its query.
    url: String,
    /// What went wrong.
    reason: String,
}

fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, SendError> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(rustls::pki_types::ServerName::from(ip));
    }
    rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|_| SendError::ServerName {
        host: host.to_owned(),
    })
}

// ---------------------------------------------------------------------------
// Wire formats and the call loop.

/// Why a response cannot be decoded.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// It is malformed: a permanent protocol error naming what.
    Malformed(String),
    /// It stopped before its end: transient, as for a dropped connection.
    Incomplete(String),
    /// The model reported an error in the stream.
    Remote {
        /// The error's type, as the API named it.
        kind: String,
        /// Its message.
        message: String,
        /// Whether it is worth trying again.
        transient: bool,
    },
}

/// Decodes one streamed response.
pub(crate) trait StreamDecoder: Send + Sync {
    /// The events one server-sent event adds.
    fn event(&mut self, event: &SseEvent) -> Result<Vec<ProviderEvent>, DecodeError>;
    /// Whether the response's last event arrived.
    fn is_complete(&self) -> bool;
    /// The body ended: what remains, or why the response is not complete.
    fn end(&mut self) -> Result<Vec<ProviderEvent>, DecodeError>;
}

/// A wire format: how a [`ModelRequest`] becomes an HTTP request, and a
/// response becomes [`ProviderEvent`]s.
pub(crate) trait WireFormat: Send + Sync + 'static {
    /// The provider's name, as in agent files.
    fn name(&self) -> &'static str;
    /// The path appended to the base URL.
    fn path(&self) -> &'static str;
    /// Headers the format needs (authentication, version).
    fn headers(&self, api_key: Option<&Secret>) -> Result<HeaderMap, String>;
    /// The request body.
    fn body(&self, request: &ModelRequest, stream: bool) -> serde_json::Value;
    /// A decoder for one streamed response.
    fn decoder(&self) -> Box<dyn StreamDecoder>;
    /// The events of a whole (not streamed) response.
    fn whole(&self, body: &[u8]) -> Result<Vec<ProviderEvent>, DecodeError>;
}

/// A model behind an HTTP API: the endpoint's settings, its client, its
/// concurrency cap, and a wire format.
#[derive(Clone)]
pub(crate) struct HttpModel {
    inner: Arc<Endpoint>,
}

struct Endpoint {
    wire: Box<dyn WireFormat>,
    client: HttpClient,
    url: Uri,
    display_url: String,
    headers: HeaderMap,
    secrets: Vec<String>,
    timeout: Duration,
    stream: bool,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for HttpModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.inner;
        f.debug_struct("HttpModel")
            .field("provider", &e.wire.name())
            .field("url", &e.display_url)
            .field("timeout", &e.timeout)
            .field("stream", &e.stream)
            .finish_non_exhaustive()
    }
}

/// Header names that the client or the wire format sets: refused as extra
/// headers.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "accept",
];

impl HttpModel {
    /// Checks `config` and sets up the endpoint.
    pub(crate) fn new(
        wire: Box<dyn WireFormat>,
        config: HttpConfig,
        client: HttpClient,
    ) -> Result<HttpModel, ProviderError> {
        let provider = wire.name();
        let invalid = |message: String| ProviderError::InvalidRequest {
            provider: provider.into(),
            message,
        };
        let url = join_url(&config.base_url, wire.path())
            .map_err(|m| invalid(format!("base URL: {m}")))?;
        if config.max_concurrent_calls == 0 {
            return Err(invalid("max_concurrent_calls must be at least 1".into()));
        }
        if config.timeout.is_zero() {
            return Err(invalid("the timeout must be more than zero".into()));
        }
        let mut headers = wire.headers(config.api_key.as_ref()).map_err(invalid)?;
        let mut secrets: Vec<String> = config
            .api_key
            .iter()
            .map(|k| k.expose().to_owned())
            .collect();
        let values = config
            .headers
            .iter()
            .map(|(n, v)| (n, v.as_str(), false))
            .chain(
                config
                    .secret_headers
                    .iter()
                    .map(|(n, v)| (n, v.expose(), true)),
            );
        for (name, value, secret) in values {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("`{name}` is not a valid header name")))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(invalid(format!("header `{name}` is set by Warden")));
            }
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                invalid(format!(
                    "header `{name}` has a value that is not valid in a header"
                ))
            })?;
            if secret {
                value.set_sensitive(true);
                secrets.push(value.to_str().unwrap_or_default().to_owned());
            }
            headers.insert(header, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("warden/", env!("CARGO_PKG_VERSION"))),
        );
        headers.insert(
            ACCEPT,
            HeaderValue::from_static(if config.stream {
                "text/event-stream"
            } else {
                "application/json"
            }),
        );
        let authority = url
            .authority()
            .expect("checked: the URL has a host")
            .as_str();
        headers.insert(
            HOST,
            HeaderValue::from_str(authority)
                .map_err(|_| invalid(format!("`{authority}` is not a valid host")))?,
        );
        secrets.retain(|s| !s.is_empty());
        Ok(HttpModel {
            inner: Arc::new(Endpoint {
                display_url: display_url(&url),
                url,
                headers,
                secrets,
                timeout: config.timeout,
                stream: config.stream,
                permits: Arc::new(Semaphore::new(config.max_concurrent_calls)),
                wire,
                client,
            }),
        })
    }

    /// The provider's name.
    pub(crate) fn name(&self) -> &'static str {
        self.inner.wire.name()
    }

    /// The URL calls go to, as errors show it.
    pub(crate) fn url(&self) -> &str {
        &self.inner.display_url
    }

    /// Starts one call.
    pub(crate) fn stream(&self, request: &ModelRequest) -> ModelStream {
        let endpoint = Arc::clone(&self.inner);
        let body = Bytes::from(
            serde_json::to_vec(&endpoint.wire.body(request, endpoint.stream))
                .expect("a JSON value serializes"),
        );
        let call = Call {
            endpoint,
            body,
            model: request.model.clone(),
            pending: VecDeque::new(),
            open: None,
            finished: false,
        };
        Box::pin(futures::stream::unfold(call, |mut call| async move {
            let item = call.next().await?;
            Some((item, call))
        }))
    }
}

/// One call in progress.
struct Call {
    endpoint: Arc<Endpoint>,
    body: Bytes,
    model: String,
    pending: VecDeque<ProviderEvent>,
    open: Option<Open>,
    finished: bool,
}

/// A streamed response being read.
struct Open {
    body: ResponseBody,
    sse: SseParser,
    /// Events read but not yet decoded: one is decoded per step, so what
    /// came before an error is handed out before the error is seen.
    queued: VecDeque<SseEvent>,
    decoder: Box<dyn StreamDecoder>,
    /// The event stream cannot be read past this point (bytes that are not
    /// UTF-8, an oversized event): an error once `queued` is used up,
    /// unless the response was complete by then.
    broken: Option<ProviderError>,
    span: tracing::Span,
    _permit: OwnedSemaphorePermit,
}

impl Call {
    async fn next(&mut self) -> Option<Result<ProviderEvent, ProviderError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.finished {
                return None;
            }
            let result = match self.open.take() {
                None => {
                    let span = tracing::info_span!(
                        "model_http_request",
                        provider = self.endpoint.wire.name(),
                        model = %self.model,
                        url = %self.endpoint.display_url,
                    );
                    self.start(span.clone()).instrument(span).await
                }
                Some(mut open) => {
                    let span = open.span.clone();
                    let result = self.read(&mut open).instrument(span).await;
                    if result.is_ok() && !self.finished {
                        self.open = Some(open);
                    }
                    result
                }
            };
            let Err(error) = result else { continue };
            // Events decoded but never handed out go with the request; the
            // engine records the failure and decides about another attempt.
            self.pending.clear();
            self.finished = true;
            return Some(Err(error));
        }
    }

    fn transport(&self, message: impl std::fmt::Display) -> ProviderError {
        ProviderError::Transport {
            provider: self.endpoint.wire.name().into(),
            message: scrub(
                &format!("POST {}: {message}", self.endpoint.display_url),
                &self.endpoint.secrets,
            ),
        }
    }

    fn decode_error(&self, error: DecodeError) -> ProviderError {
        let provider = self.endpoint.wire.name().to_owned();
        let secrets = &self.endpoint.secrets;
        match error {
            DecodeError::Malformed(message) => ProviderError::Protocol {
                provider,
                message: scrub(&message, secrets),
            },
            DecodeError::Incomplete(message) => self.transport(message),
            DecodeError::Remote {
                kind,
                message,
                transient,
            } => ProviderError::Remote {
                provider,
                kind,
                message: scrub(&message, secrets),
                transient,
            },
        }
    }

    /// The request, up to the start of its body.
    async fn start(&mut self, span: tracing::Span) -> Result<(), ProviderError> {
        let e = Arc::clone(&self.endpoint);
        let permit = match Arc::clone(&e.permits).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                tracing::debug!("waiting for a free call slot");
                Arc::clone(&e.permits)
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed")
            }
        };
        tracing::debug!("sending");
        let (parts, mut body) = e
            .client
            .post(&e.url, &e.headers, self.body.clone(), e.timeout)
            .await
            .map_err(|err| self.transport(err))?;
        if !parts.status.is_success() {
            let retry_after_ms = retry_after_ms(&parts.headers, SystemTime::now());
            let text = read_error_body(&mut body, e.timeout).await;
            let status = parts.status.as_u16();
            let transient = error_object(&text).map_or(status_is_transient(status), |error| {
                error_is_transient(&error, Some(status))
            });
            return Err(ProviderError::Http {
                provider: e.wire.name().into(),
                status,
                url: e.display_url.clone(),
                body: scrub(&text, &e.secrets),
                retry_after_ms,
                transient,
            });
        }
        let json = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if json || !e.stream {
            let bytes = self.read_whole(&mut body).await?;
            drop(permit);
            let events = e.wire.whole(&bytes).map_err(|err| self.decode_error(err))?;
            self.pending.extend(events);
            self.finished = true;
            return Ok(());
        }
        self.open = Some(Open {
            body,
            sse: SseParser::new(MAX_RESPONSE_EVENT),
            queued: VecDeque::new(),
            decoder: e.wire.decoder(),
            broken: None,
            span,
            _permit: permit,
        });
        Ok(())
    }

    async fn read_whole(&self, body: &mut ResponseBody) -> Result<Vec<u8>, ProviderError> {
        let timeout = self.endpoint.timeout;
        let mut bytes = Vec::new();
        loop {
            match tokio::time::timeout(timeout, body.chunk()).await {
                Err(_) => return Err(self.transport(format!("no data for {timeout:?}"))),
                Ok(Err(err)) => {
                    return Err(self.transport(format!("the response broke off: {err}")));
                }
                Ok(Ok(None)) => return Ok(bytes),
                Ok(Ok(Some(chunk))) => {
                    if bytes.len() + chunk.len() > MAX_RESPONSE_EVENT {
                        return Err(ProviderError::Protocol {
                            provider: self.endpoint.wire.name().into(),
                            message: format!(
                                "the response is longer than {MAX_RESPONSE_EVENT} bytes"
                            ),
                        });
                    }
                    bytes.extend_from_slice(&chunk);
                }
            }
        }
    }

    /// Decodes the next event of a streamed body into `pending`, reading
    /// more of the body when none is queued.
    async fn read(&mut self, open: &mut Open) -> Result<(), ProviderError> {
        let timeout = self.endpoint.timeout;
        if !open.decoder.is_complete()
            && let Some(event) = open.queued.pop_front()
        {
            let decoded = open
                .decoder
                .event(&event)
                .map_err(|e| self.decode_error(e))?;
            self.pending.extend(decoded);
            return Ok(());
        }
        if !open.decoder.is_complete()
            && let Some(error) = open.broken.take()
        {
            return Err(error);
        }
        if open.decoder.is_complete() {
            if open.broken.is_some() {
                // The stream broke after the response's end: the
                // connection is not worth pooling.
                self.finished = true;
                return Ok(());
            }
            // Everything was decoded; read on to the body's end so the
            // connection can be pooled, but never fail the call for it.
            let drain = async { while let Ok(Some(_)) = open.body.chunk().await {} };
            let _ = tokio::time::timeout(timeout.min(Duration::from_secs(1)), drain).await;
            self.finished = true;
            return Ok(());
        }
        let chunk = match tokio::time::timeout(timeout, open.body.chunk()).await {
            Err(_) => return Err(self.transport(format!("no data for {timeout:?} mid-stream"))),
            Ok(Err(err)) => return Err(self.transport(format!("the stream broke off: {err}"))),
            Ok(Ok(chunk)) => chunk,
        };
        let Some(chunk) = chunk else {
            let events = open.decoder.end().map_err(|e| self.decode_error(e))?;
            self.pending.extend(events);
            self.finished = true;
            return Ok(());
        };
        let mut events = Vec::new();
        let pushed = open.sse.push_into(&chunk, &mut events);
        open.queued.extend(events);
        if let Err(e) = pushed {
            // Raised only if the events before it leave the response
            // incomplete: bytes after its end are not part of it.
            open.broken = Some(ProviderError::Protocol {
                provider: self.endpoint.wire.name().into(),
                message: e.to_string(),
            });
        }
        Ok(())
    }
}

/// The path and query of `url`: what an HTTP/1.1 request line carries.
fn origin_form(url: &Uri) -> Uri {
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    path.parse().expect("a path and query parse as a URI")
}

/// Up to [`MAX_ERROR_BODY`] bytes of an error response, as text.
async fn read_error_body(body: &mut ResponseBody, timeout: Duration) -> String {
    let mut bytes = Vec::new();
    let mut truncated = false;
    let read = async {
        while let Ok(Some(chunk)) = body.chunk().await {
            let room = MAX_ERROR_BODY - bytes.len();
            if chunk.len() > room {
                bytes.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if truncated {
        text.push_str(&format!(" … (cut at {MAX_ERROR_BODY} bytes)"));
    }
    text
}

/// `text` with every secret replaced by `[redacted]`.
fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_owned();
    for s in secrets {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "[redacted]");
        }
    }
    text
}

/// A short, single-line preview of `text` for error messages.
pub(crate) fn preview(text: &str) -> String {
    const MAX: usize = 200;
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.len() <= MAX {
        return one_line;
    }
    let mut end = MAX;
    while !one_line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &one_line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shapes_are_classified_by_type_then_code_then_status() {
        use serde_json::json;
        let cases = [
            // OpenAI, Anthropic, and their documented types.
            (json!({"type": "server_error", "code": null}), None, true),
            (json!({"type": "overloaded_error"}), None, true),
            (json!({"type": "invalid_request_error"}), Some(500), false),
            // A 429 that no wait cures.
            (
                json!({"type": "insufficient_quota", "code": "insufficient_quota"}),
                Some(429),
                false,
            ),
            // A proxy: no type, the status as the code, as text or a number.
            (
                json!({"message": "x", "type": null, "code": "500"}),
                None,
                true,
            ),
            (
                json!({"type": "throttling_error", "code": "429"}),
                None,
                true,
            ),
            (json!({"type": null, "code": 503}), None, true),
            (json!({"type": null, "code": "400"}), Some(500), false),
            // A documented code, then the object's status, then the response's.
            (json!({"code": "rate_limit_exceeded"}), None, true),
            (json!({"message": "x", "status": 502}), None, true),
            (json!({"message": "x"}), Some(503), true),
            (json!({"message": "x"}), Some(404), false),
            (json!({"message": "x"}), None, false),
        ];
        for (error, status, transient) in cases {
            assert_eq!(
                error_is_transient(&error, status),
                transient,
                "{error} {status:?}"
            );
        }
        assert_eq!(
            error_object(r#"{"type":"error","error":{"type":"api_error"}}"#),
            Some(json!({"type": "api_error"}))
        );
        assert_eq!(error_object("<html>"), None);
    }

    #[test]
    fn retry_after_reads_seconds_fractions_dates_and_milliseconds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        type Headers<'a> = Vec<(&'a str, &'a str)>;
        let cases: Vec<(Headers<'_>, Option<u64>)> = vec![
            (vec![("retry-after", "7")], Some(7_000)),
            (vec![("retry-after", " 1.5 ")], Some(1_500)),
            (vec![("retry-after", "-1")], None),
            (vec![("retry-after", "soon")], None),
            (
                vec![("retry-after-ms", "250"), ("retry-after", "9")],
                Some(250),
            ),
            (
                vec![("retry-after-ms", "x"), ("retry-after", "9")],
                Some(9_000),
            ),
            (vec![("retry-after", &later)], Some(30_000)),
            (vec![("retry-after", &earlier)], Some(0)),
            // What a proxy forwards from the server behind it.
            (vec![("llm_provider-retry-after", "120")], Some(120_000)),
            (
                vec![("llm_provider-retry-after", "120"), ("retry-after", "2")],
                Some(2_000),
            ),
            (vec![], None),
        ];
        for (pairs, expected) in cases {
            let mut headers = HeaderMap::new();
            for (k, v) in &pairs {
                headers.insert(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            assert_eq!(retry_after_ms(&headers, now), expected, "{pairs:?}");
        }
    }

    #[test]
    fn urls_are_joined_checked_and_shown_without_secrets() {
        let u = join_url("https://api.example.com/v1/", "/chat/completions").unwrap();
        assert_eq!(u.to_string(), "https://api.example.com/v1/chat/completions");
        let azure = join_url(
            "https://x.openai.azure.com/openai/deployments/d?api-version=2024-10-21&key=s3cret",
            "/chat/completions",
        )
        .unwrap();
        assert_eq!(
            azure.path_and_query().unwrap().as_str(),
            "/openai/deployments/d/chat/completions?api-version=2024-10-21&key=s3cret"
        );
        assert_eq!(
            display_url(&azure),
            "https://x.openai.azure.com/openai/deployments/d/chat/completions?…"
        );
        let local = join_url("http://[::1]:11434/v1", "/chat/completions").unwrap();
        assert_eq!(
            display_url(&local),
            "http://[::1]:11434/v1/chat/completions"
        );
        assert_eq!(Origin::of(&local).host, "::1");
        for (base, error) in [
            ("ftp://example.com", "must start with http:// or https://"),
            ("example.com/v1", "must start with http:// or https://"),
            (
                "https://user:sk-123@example.com",
                "must not carry credentials",
            ),
            ("https://exa mple.com", "is not a valid URL"),
        ] {
            let e = join_url(base, "/x").unwrap_err();
            assert!(e.contains(error), "{base}: {e}");
            assert!(!e.contains("sk-123"), "{e}");
        }
    }

    #[test]
    fn secrets_are_scrubbed_and_never_debug_printed() {
        let secrets = vec!["sk-live-123".to_owned()];
        assert_eq!(
            scrub("bad key sk-live-123 (sk-live-123)", &secrets),
            "bad key [redacted] ([redacted])"
        );
        assert_eq!(format!("{:?}", Secret::new("sk-live-123")), "Secret(..)");
        let config = HttpConfig {
            api_key: Some(Secret::new("sk-live-123")),
            ..HttpConfig::new("https://api.example.com")
        };
        assert!(!format!("{config:?}").contains("sk-live"));
        assert_eq!(
            Secret::from_env("WARDEN_TEST_SURELY_UNSET_VARIABLE").unwrap_err(),
            "environment variable `WARDEN_TEST_SURELY_UNSET_VARIABLE` is not set"
        );
    }

    #[test]
    fn previews_are_one_line_and_short() {
        assert_eq!(preview("a\nb"), "a b");
        let long = "é".repeat(300);
        let p = preview(&long);
        assert!(p.ends_with('…') && p.len() <= 204, "{}", p.len());
    }
}
