//! A remote MCP server (`url = "https://…"`): the HTTP client under rmcp's
//! streamable-HTTP transport, Warden's own so that it keeps the rules a
//! plugin's outbound HTTP keeps (`warden_sandbox`'s `net.rs`):
//!
//! - **The host is a grant.** The URL's scheme, host and port must match
//!   one of the server's `hosts` patterns, or nothing is sent
//!   ([`McpServerError::HostNotGranted`]). Its name is resolved here, once
//!   per connection, and every address used must be public unless the
//!   operator granted that address literally (`127.0.0.1:8080`); the
//!   connection goes to a checked address. No proxy setting or anything
//!   else is read from Warden's environment.
//! - **Headers are secrets.** Each `header_env` value is read from its
//!   variable when the server is reached, sent marked sensitive, and never
//!   logged, recorded or put in an error.
//! - **Bounded.** Every response body (one JSON document, or the event
//!   stream answering one request) is counted as it arrives and cut at the
//!   server's `max_output` plus [`ENVELOPE`]: nothing unbounded is held in
//!   memory, and the call fails as over its output limit (the session's
//!   [`Meter`]).
//! - One connection per request (HTTP/1.1, TLS with rustls and the Mozilla
//!   roots); no server-initiated stream is opened (`GET`), since a tool
//!   call needs none.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use http::header::{ACCEPT, CONTENT_TYPE, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::{Sse, SseStream};
use warden_sandbox::{HostPattern, is_public};

use super::session::Meter;
use super::{McpServerError, RemoteServer};

/// Bytes a response may carry beyond `max_output`: the JSON-RPC envelope
/// and the event stream's framing around the tool's result.
pub const ENVELOPE: u64 = 64 << 10;

/// Most bytes of an error response kept for its message.
const MAX_ERROR_BODY: usize = 4 << 10;

/// Headers Warden's client sets itself: `header_env` may not name them.
pub const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "connection",
    "transfer-encoding",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// The transport's failure: a request that did not get through.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// Connecting, resolving or TLS failed.
    #[error("cannot reach {target}: {message}")]
    Connect {
        /// `host:port`.
        target: String,
        /// What failed.
        message: String,
    },
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(String),
    /// A response was over the limit.
    #[error("a response was over {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

impl From<RemoteError> for StreamableHttpError<RemoteError> {
    fn from(e: RemoteError) -> Self {
        StreamableHttpError::Client(e)
    }
}

/// The HTTP client of one remote server's session.
#[derive(Clone)]
pub struct RemoteClient {
    key: Arc<str>,
    /// `host:port` for connecting and the `Host` header.
    authority: Arc<str>,
    host: Arc<str>,
    port: u16,
    https: bool,
    /// The granted patterns that match the URL.
    patterns: Arc<[HostPattern]>,
    /// The operator's headers, values marked sensitive.
    headers: Arc<HeaderMap>,
    limit: u64,
    connect_timeout: Duration,
    meter: Arc<Meter>,
}

impl std::fmt::Debug for RemoteClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the header values.
        f.debug_struct("RemoteClient")
            .field("server", &self.key)
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

/// The scheme, host and port of `url`, checked: `http` or `https`, a host,
/// no user info.
pub fn url_parts(url: &str) -> Result<(bool, String, u16), String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("`{url}` is not an http:// or https:// URL")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`{url}` names no host"))?;
    if authority.as_str().contains('@') {
        return Err(format!(
            "`{url}` carries user info: put credentials in `header_env`, never in the URL"
        ));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok((https, host, port))
}

impl RemoteClient {
    /// The client for `server` (its key `key`), bounded to `max_output`
    /// per result: refused when the URL's host is not granted or a
    /// header's variable is not set.
    pub fn new(
        key: &str,
        server: &RemoteServer,
        max_output: u64,
        connect_timeout: Duration,
    ) -> Result<RemoteClient, McpServerError> {
        let failed = |message: String| McpServerError::Failed {
            server: key.to_owned(),
            message,
        };
        let (https, host, port) = url_parts(&server.url).map_err(failed)?;
        let scheme = if https { "https" } else { "http" };
        // Patterns write an IPv6 address in brackets.
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let patterns: Vec<HostPattern> = server
            .hosts
            .iter()
            .filter_map(|h| HostPattern::parse(h).ok())
            .filter(|p| p.matches(scheme, &bracketed, port))
            .collect();
        if patterns.is_empty() {
            tracing::debug!(server = key, %host, port, "MCP server's host is not granted");
            return Err(McpServerError::HostNotGranted {
                server: key.to_owned(),
                host: format!("{host}:{port}"),
                granted: server.hosts.clone(),
            });
        }
        let mut headers = HeaderMap::new();
        for (name, var) in &server.header_env {
            let value = std::env::var(var).map_err(|_| McpServerError::HeaderEnvMissing {
                server: key.to_owned(),
                header: name.clone(),
                var: var.clone(),
            })?;
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| failed(format!("`{name}` is not a header name")))?;
            // The error would not say why, and must not show the value.
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                failed(format!(
                    "the value of `{var}` cannot be an HTTP header value (header `{name}`)"
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(RemoteClient {
            key: key.into(),
            authority: authority.into(),
            host: host.into(),
            port,
            https,
            patterns: patterns.into(),
            headers: Arc::new(headers),
            limit: max_output.saturating_add(ENVELOPE),
            connect_timeout,
            meter: Arc::new(Meter::default()),
        })
    }

    /// What this session's responses measured against the limit.
    pub fn meter(&self) -> Arc<Meter> {
        Arc::clone(&self.meter)
    }

    /// Resolves the host and checks that an address of it may be used,
    /// before anything is sent.
    pub async fn check(&self) -> Result<(), McpServerError> {
        self.address()
            .await
            .map(|_| ())
            .map_err(|e| McpServerError::Failed {
                server: self.key.to_string(),
                message: e.to_string(),
            })
    }

    /// An address of the host that the grant allows: a public one, or one
    /// a pattern names literally.
    async fn address(&self) -> Result<SocketAddr, RemoteError> {
        let unreachable = |message: String| RemoteError::Connect {
            target: self.authority.to_string(),
            message,
        };
        let found: Vec<SocketAddr> = tokio::net::lookup_host((&*self.host, self.port))
            .await
            .map_err(|e| unreachable(format!("cannot resolve it: {e}")))?
            .collect();
        let allowed = |ip: IpAddr| {
            let ip = match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            };
            is_public(ip) || self.patterns.iter().any(|p| p.address() == Some(ip))
        };
        found
            .iter()
            .copied()
            .find(|a| allowed(a.ip()))
            .ok_or_else(|| {
                tracing::debug!(server = %self.key, host = %self.host, ?found, "MCP server resolves only to addresses not granted");
                unreachable(format!(
                    "it resolves only to addresses that are not public ({found:?}): grant the address itself (for example `{}`) to reach it",
                    found.first().map_or_else(|| self.authority.to_string(), |a| a.to_string())
                ))
            })
    }

    /// Sends `request` on a new connection to a checked address.
    async fn send(
        &self,
        mut request: Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, RemoteError> {
        let headers = request.headers_mut();
        for (name, value) in self.headers.iter() {
            headers.insert(name.clone(), value.clone());
        }
        headers.insert(
            HOST,
            HeaderValue::from_str(&self.authority).map_err(|e| RemoteError::Http(e.to_string()))?,
        );
        let connect = async {
            let address = self.address().await?;
            let unreachable = |message: String| RemoteError::Connect {
                target: self.authority.to_string(),
                message,
            };
            let tcp = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let _ = tcp.set_nodelay(true);
            let sender = if self.https {
                let name = server_name(&self.host).map_err(unreachable)?;
                let tls = tokio_rustls::TlsConnector::from(warden_tls::client_config())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| unreachable(format!("TLS: {e}")))?;
                let (sender, conn) = hyper::client::conn::http1::handshake(
                    wasmtime_wasi_http::io::TokioIo::new(tls),
                )
                .await
                .map_err(|e| RemoteError::Http(e.to_string()))?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                sender
            } else {
                let (sender, conn) = hyper::client::conn::http1::handshake(
                    wasmtime_wasi_http::io::TokioIo::new(tcp),
                )
                .await
                .map_err(|e| RemoteError::Http(e.to_string()))?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                sender
            };
            Ok::<_, RemoteError>(sender)
        };
        let mut sender = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| RemoteError::Connect {
                target: self.authority.to_string(),
                message: format!("no connection within {:?}", self.connect_timeout),
            })??;
        sender
            .send_request(request)
            .await
            .map_err(|e| RemoteError::Http(e.to_string()))
    }

    /// `body` as a stream of chunks cut at the limit, which the meter
    /// records.
    fn bounded(&self, body: Incoming) -> BoxStream<'static, Result<Bytes, RemoteError>> {
        let limit = self.limit;
        let meter = Arc::clone(&self.meter);
        let mut seen = 0u64;
        let mut cut = false;
        body.into_data_stream()
            .map(move |chunk| {
                if cut {
                    return Err(RemoteError::TooLarge { limit });
                }
                let chunk = chunk.map_err(|e| RemoteError::Http(e.to_string()))?;
                seen = seen.saturating_add(chunk.len() as u64);
                if seen > limit {
                    cut = true;
                    meter.exceeded(seen);
                    return Err(RemoteError::TooLarge { limit });
                }
                Ok(chunk)
            })
            .boxed()
    }

    /// The whole of `body`, bounded.
    async fn read(&self, body: Incoming) -> Result<Vec<u8>, RemoteError> {
        let mut stream = self.bounded(body);
        let mut out = Vec::new();
        while let Some(chunk) = stream.try_next().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn request(
        &self,
        method: Method,
        uri: &str,
        session_id: Option<&str>,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, RemoteError> {
        // The request line carries only the path and query (origin form);
        // the authority goes in `Host`.
        let target = uri
            .parse::<Uri>()
            .ok()
            .and_then(|u| u.path_and_query().map(|p| p.as_str().to_owned()))
            .unwrap_or_else(|| "/".to_owned());
        let mut builder = Request::builder().method(method).uri(target);
        if let Some(id) = session_id {
            builder = builder.header("mcp-session-id", id);
        }
        builder
            .body(Full::new(body))
            .map_err(|e| RemoteError::Http(e.to_string()))
    }
}

/// `custom` (the protocol's own headers, from rmcp) onto `request`; the
/// operator's and Warden's are set by [`RemoteClient::send`].
fn with_headers(
    mut request: Request<Full<Bytes>>,
    custom: HashMap<HeaderName, HeaderValue>,
) -> Request<Full<Bytes>> {
    for (name, value) in custom {
        request.headers_mut().insert(name, value);
    }
    request
}

fn is_media(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(expected))
}

impl StreamableHttpClient for RemoteClient {
    type Error = RemoteError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<RemoteError>> {
        let body = serde_json::to_vec(&message)?;
        let mut request = self.request(Method::POST, &uri, session_id.as_deref(), body.into())?;
        request = with_headers(request, custom_headers);
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let response = self.send(request).await?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let awaits_nothing = !matches!(message, ClientJsonRpcMessage::Request(_));
        if !status.is_success() {
            let json = is_media(response.headers(), "application/json");
            let body = self.read(response.into_body()).await.unwrap_or_default();
            if json
                && let Ok(error @ ServerJsonRpcMessage::Error(_)) =
                    serde_json::from_slice::<ServerJsonRpcMessage>(&body)
            {
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)]);
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {}", text.trim()),
            )));
        }
        if is_media(response.headers(), "text/event-stream") {
            let bytes = self.bounded(response.into_body());
            return Ok(StreamableHttpPostResponse::Sse(
                SseStream::from_bytes_stream(bytes).boxed(),
                session,
            ));
        }
        if is_media(response.headers(), "application/json") {
            let body = self.read(response.into_body()).await?;
            if body.is_empty() && awaits_nothing {
                return Ok(StreamableHttpPostResponse::Accepted);
            }
            return match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                Ok(message) => Ok(StreamableHttpPostResponse::Json(message, session)),
                Err(_) if awaits_nothing => Ok(StreamableHttpPostResponse::Accepted),
                Err(e) => Err(e.into()),
            };
        }
        if awaits_nothing {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(
            response
                .headers()
                .get(CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        ))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<RemoteError>> {
        let request = self.request(Method::DELETE, &uri, Some(&session_id), Bytes::new())?;
        let response = self.send(with_headers(request, custom_headers)).await?;
        if response.status().is_success() || response.status() == StatusCode::METHOD_NOT_ALLOWED {
            Ok(())
        } else {
            Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("ending the session: HTTP {}", response.status()),
            )))
        }
    }

    async fn get_stream(
        &self,
        _uri: Arc<str>,
        _session_id: Option<Arc<str>>,
        _last_event_id: Option<String>,
        _auth_header: Option<String>,
        _custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<RemoteError>> {
        // No server-initiated stream: a tool call needs none, and a broken
        // response stream is not resumed (what the server did is not
        // known: the call fails).
        Err(StreamableHttpError::ServerDoesNotSupportSse)
    }
}

fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(rustls::pki_types::ServerName::from(ip));
    }
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|_| format!("`{host}` is not a TLS server name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_http_or_https_with_a_host_and_no_user_info() {
        assert_eq!(
            url_parts("https://MCP.example.com/mcp").unwrap(),
            (true, "mcp.example.com".into(), 443)
        );
        assert_eq!(
            url_parts("http://127.0.0.1:8123/mcp").unwrap(),
            (false, "127.0.0.1".into(), 8123)
        );
        assert_eq!(
            url_parts("http://[::1]:9/mcp").unwrap(),
            (false, "::1".into(), 9)
        );
        for bad in [
            "ftp://example.com/",
            "/mcp",
            "https://user:pw@example.com/mcp",
        ] {
            assert!(url_parts(bad).is_err(), "{bad}");
        }
    }
}
