//! Outbound HTTP for plugins: a small blocking client over
//! `wasi:http/outgoing-handler`, the only network a Warden plugin can have.
//!
//! The host checks every request against the hosts the operator granted the
//! plugin (scheme, host, port), resolves the name itself and refuses
//! addresses that are not public unless the operator granted that address;
//! a refused request comes back as [`HttpError::Denied`] naming the host.
//! A plugin that was granted no host gets a denial for every request. The
//! client never follows redirects: a plugin that wants to follow one sends a
//! new request (see [`Url::join`]), which the host checks like any other.
//!
//! ```no_run
//! use warden_guest::http::{self, Request};
//!
//! let response = http::send(&Request::get("https://api.example.com/v1/items")
//!     .header("accept", "application/json")
//!     .max_response_bytes(64 * 1024))?;
//! assert_eq!(response.status, 200);
//! # Ok::<(), warden_guest::http::HttpError>(())
//! ```
//!
//! Natively (unit tests) [`send`] calls the stand-in set with
//! [`testing::set_http`](crate::testing::set_http), so plugin logic around
//! HTTP is tested without a network.

use std::fmt;
use std::time::Duration;

/// Default for [`Request::max_response_bytes`]: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1 << 20;

/// An outbound request. Build it with [`Request::new`] or [`Request::get`]
/// and the setters; by default it has no headers, no body, no timeout of
/// its own (the lease's deadline still applies) and reads at most
/// [`DEFAULT_MAX_RESPONSE_BYTES`] of the response body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The method, uppercase, for example `GET`.
    pub method: String,
    /// The absolute `http` or `https` URL.
    pub url: String,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body; empty for none.
    pub body: Vec<u8>,
    /// Connect, first-byte and between-bytes timeout. Default: none.
    pub timeout: Option<Duration>,
    /// Most response body bytes read; the rest is dropped and
    /// [`Response::truncated`] is set. Default: 1 MiB.
    pub max_response_bytes: usize,
}

impl Request {
    /// A request with `method` (uppercased) to `url`.
    pub fn new(method: &str, url: impl Into<String>) -> Self {
        Request {
            method: method.to_ascii_uppercase(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// A `GET` of `url`.
    pub fn get(url: impl Into<String>) -> Self {
        Request::new("GET", url)
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets the connect, first-byte and between-bytes timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the most response body bytes read.
    pub fn max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
        self
    }
}

/// A response, with its body read up to the request's cap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, at most [`Request::max_response_bytes`].
    pub body: Vec<u8>,
    /// Whether the body went on past the cap.
    pub truncated: bool,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Whether the status is a redirect with a `location`.
    pub fn redirect_location(&self) -> Option<&str> {
        matches!(self.status, 301 | 302 | 303 | 307 | 308)
            .then(|| self.header("location"))
            .flatten()
    }
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpError {
    /// The URL is not an absolute `http` or `https` URL this client accepts.
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The method or a header was refused before anything was sent.
    InvalidRequest {
        /// What was refused.
        reason: String,
    },
    /// The host's network policy refused the request.
    Denied {
        /// `host:port` asked for.
        host: String,
        /// Why, for example "not among the hosts granted to this plugin".
        reason: String,
    },
    /// A timeout passed: connecting, waiting for the response, or between
    /// bytes of the body.
    Timeout {
        /// `host:port` asked for.
        host: String,
    },
    /// The response body went past the lease's response byte limit.
    TooLarge {
        /// `host:port` asked for.
        host: String,
        /// The limit, if the host said.
        limit: Option<u64>,
    },
    /// Anything else: DNS, connection, TLS or protocol errors.
    Failed {
        /// `host:port` asked for.
        host: String,
        /// The `wasi:http` error code, or what went wrong.
        reason: String,
    },
}

impl HttpError {
    /// Whether trying again later may succeed (timeouts and transport
    /// failures).
    pub fn is_retryable(&self) -> bool {
        matches!(self, HttpError::Timeout { .. } | HttpError::Failed { .. })
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::InvalidUrl { url, reason } => write!(f, "invalid URL `{url}`: {reason}"),
            HttpError::InvalidRequest { reason } => write!(f, "invalid request: {reason}"),
            HttpError::Denied { host, reason } => {
                write!(f, "request to `{host}` denied: {reason}")
            }
            HttpError::Timeout { host } => write!(f, "request to `{host}` timed out"),
            HttpError::TooLarge {
                host,
                limit: Some(limit),
            } => write!(
                f,
                "response from `{host}` is over the response limit of {limit} bytes"
            ),
            HttpError::TooLarge { host, limit: None } => {
                write!(f, "response from `{host}` is over the response limit")
            }
            HttpError::Failed { host, reason } => {
                write!(f, "request to `{host}` failed: {reason}")
            }
        }
    }
}

impl std::error::Error for HttpError {}

/// An absolute `http` or `https` URL, split the way `wasi:http` wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `http` or `https`.
    pub scheme: String,
    /// The host, lowercase; an IPv6 address keeps its brackets.
    pub host: String,
    /// The port, explicit or the scheme's default.
    pub port: u16,
    /// Whether the port was written in the URL.
    pub explicit_port: bool,
    /// The path and query, starting with `/`; the fragment is dropped.
    pub path_with_query: String,
}

impl Url {
    /// Parses an absolute URL. User info (`user@host`) is refused: it would
    /// hide which host a request goes to.
    pub fn parse(url: &str) -> Result<Url, HttpError> {
        let bad = |reason: &str| HttpError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected an absolute URL such as https://host/path"))?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let rest = rest.split('#').next().unwrap_or_default();
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        if authority.contains('@') {
            return Err(bad("user info (`user@`) is not allowed"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.ends_with(']') => {
                let port = p.parse::<u16>().map_err(|_| bad("invalid port"))?;
                (h, Some(port))
            }
            _ => (authority, None),
        };
        let valid = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
        if !valid {
            return Err(bad("invalid host"));
        }
        let path_with_query = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        if path_with_query
            .chars()
            .any(|c| c.is_ascii_control() || c == ' ')
        {
            return Err(bad("the path has spaces or control characters"));
        }
        Ok(Url {
            scheme,
            host: host.to_ascii_lowercase(),
            port: port.unwrap_or(default_port),
            explicit_port: port.is_some(),
            path_with_query,
        })
    }

    /// `host:port`, as the host's policy and errors name it.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The authority to send: `host` or `host:port` as written.
    pub fn authority(&self) -> String {
        if self.explicit_port {
            self.host_port()
        } else {
            self.host.clone()
        }
    }

    /// Resolves `reference` (for example a redirect's `location`) against
    /// this URL: absolute URLs, `//host/path`, `/path` and relative paths.
    pub fn join(&self, reference: &str) -> Result<Url, HttpError> {
        if reference.contains("://") {
            return Url::parse(reference);
        }
        if let Some(rest) = reference.strip_prefix("//") {
            return Url::parse(&format!("{}://{rest}", self.scheme));
        }
        let path = if reference.starts_with('/') {
            reference.to_owned()
        } else {
            let base = self.path_with_query.split('?').next().unwrap_or("/");
            let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
            format!("{}{reference}", if dir.is_empty() { "/" } else { dir })
        };
        Url::parse(&format!("{}://{}{path}", self.scheme, self.authority()))
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme,
            self.authority(),
            self.path_with_query
        )
    }
}

/// Sends `request` and reads the response, its body up to
/// [`Request::max_response_bytes`]. Blocks until the response is read or
/// fails.
///
/// # Errors
/// [`HttpError`], naming the host.
pub fn send(request: &Request) -> Result<Response, HttpError> {
    let url = Url::parse(&request.url)?;
    imp::send(request, &url)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{HttpError, Request, Response, Url};
    use crate::bindings::http_client::wasi::http::outgoing_handler;
    use crate::bindings::http_client::wasi::http::types::{
        ErrorCode, Fields, HeaderError, IncomingBody, Method, OutgoingBody, OutgoingRequest,
        RequestOptions, Scheme,
    };
    use crate::bindings::http_client::wasi::io::streams::StreamError;

    /// Largest write `blocking-write-and-flush` takes.
    const WRITE_CHUNK: usize = 4096;
    /// Largest read asked of the body stream at once.
    const READ_CHUNK: u64 = 64 * 1024;

    pub(super) fn send(request: &Request, url: &Url) -> Result<Response, HttpError> {
        let host = url.host_port();
        let invalid = |reason: String| HttpError::InvalidRequest { reason };
        let mut entries: Vec<(String, Vec<u8>)> = request
            .headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.as_bytes().to_vec()))
            .collect();
        // A body of known length is sent with `content-length`, not chunked.
        if !request.body.is_empty() && !entries.iter().any(|(n, _)| n == "content-length") {
            entries.push((
                "content-length".into(),
                request.body.len().to_string().into_bytes(),
            ));
        }
        let headers = Fields::from_list(&entries).map_err(|e| {
            invalid(match e {
                HeaderError::Forbidden => {
                    "a header is one the host sets itself (host, connection, ...)".into()
                }
                HeaderError::InvalidSyntax => "a header name or value is invalid".into(),
                HeaderError::Immutable => "headers are immutable".into(),
            })
        })?;
        let outgoing = OutgoingRequest::new(headers);
        outgoing
            .set_method(&method(&request.method))
            .map_err(|()| invalid(format!("invalid method `{}`", request.method)))?;
        let scheme = if url.scheme == "https" {
            Scheme::Https
        } else {
            Scheme::Http
        };
        outgoing
            .set_scheme(Some(&scheme))
            .and_then(|()| outgoing.set_authority(Some(&url.authority())))
            .and_then(|()| outgoing.set_path_with_query(Some(&url.path_with_query)))
            .map_err(|()| invalid(format!("the host refused the URL `{url}`")))?;
        let body = outgoing
            .body()
            .map_err(|()| invalid("the request body was already taken".into()))?;
        let options = request.timeout.map(|t| {
            let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
            let options = RequestOptions::new();
            // A host may not support every timeout; the lease deadline
            // applies regardless.
            let _ = options.set_connect_timeout(Some(ns));
            let _ = options.set_first_byte_timeout(Some(ns));
            let _ = options.set_between_bytes_timeout(Some(ns));
            options
        });
        let future =
            outgoing_handler::handle(outgoing, options).map_err(|code| from_code(code, &host))?;
        if !request.body.is_empty() {
            let stream = body
                .write()
                .map_err(|()| invalid("the request body stream was already taken".into()))?;
            for chunk in request.body.chunks(WRITE_CHUNK) {
                if let Err(e) = stream.blocking_write_and_flush(chunk) {
                    drop(stream);
                    // The response future carries the reason.
                    return Err(match wait(&future) {
                        Err(e) => e,
                        Ok(_) => stream_error(e, &host),
                    }
                    .with_host(&host));
                }
            }
        }
        OutgoingBody::finish(body, None).map_err(|code| from_code(code, &host))?;
        let response = wait(&future).map_err(|e| e.with_host(&host))?;
        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| (n, String::from_utf8_lossy(&v).into_owned()))
            .collect();
        let incoming = response
            .consume()
            .map_err(|()| invalid("the response body was already taken".into()))?;
        let (body, truncated) = read_body(&incoming, request.max_response_bytes, &host)?;
        drop(incoming);
        Ok(Response {
            status,
            headers,
            body,
            truncated,
        })
    }

    fn wait(
        future: &crate::bindings::http_client::wasi::http::types::FutureIncomingResponse,
    ) -> Result<crate::bindings::http_client::wasi::http::types::IncomingResponse, HttpError> {
        future.subscribe().block();
        match future.get() {
            Some(Ok(Ok(response))) => Ok(response),
            Some(Ok(Err(code))) => Err(from_code(code, "")),
            Some(Err(())) | None => Err(HttpError::Failed {
                host: String::new(),
                reason: "the response was already taken".into(),
            }),
        }
    }

    fn read_body(
        incoming: &IncomingBody,
        max: usize,
        host: &str,
    ) -> Result<(Vec<u8>, bool), HttpError> {
        let stream = incoming.stream().map_err(|()| HttpError::Failed {
            host: host.to_owned(),
            reason: "the response body stream was already taken".into(),
        })?;
        let mut body = Vec::new();
        loop {
            let want = (max + 1 - body.len()).min(READ_CHUNK as usize) as u64;
            match stream.blocking_read(want) {
                Ok(bytes) => {
                    body.extend_from_slice(&bytes);
                    if body.len() > max {
                        body.truncate(max);
                        return Ok((body, true));
                    }
                }
                Err(StreamError::Closed) => return Ok((body, false)),
                Err(e) => return Err(stream_error(e, host)),
            }
        }
    }

    fn stream_error(e: StreamError, host: &str) -> HttpError {
        use crate::bindings::http_client::wasi::http::types::http_error_code;
        match e {
            StreamError::Closed => HttpError::Failed {
                host: host.to_owned(),
                reason: "the connection was closed".into(),
            },
            StreamError::LastOperationFailed(error) => match http_error_code(&error) {
                Some(code) => from_code(code, host),
                // wasmtime-wasi-http 48 hands errors of a response body's
                // stream to the guest without their error code; the host's
                // response limit is recognised by its message.
                None => {
                    let reason = error.to_debug_string();
                    if reason.contains("response body size exceeds limit") {
                        HttpError::TooLarge {
                            host: host.to_owned(),
                            limit: reason
                                .rsplit(": ")
                                .next()
                                .and_then(|n| n.trim_end_matches(" bytes").parse().ok()),
                        }
                    } else {
                        HttpError::Failed {
                            host: host.to_owned(),
                            reason,
                        }
                    }
                }
            },
        }
    }

    fn method(name: &str) -> Method {
        match name {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_owned()),
        }
    }

    fn from_code(code: ErrorCode, host: &str) -> HttpError {
        let host = host.to_owned();
        match code {
            ErrorCode::HttpRequestDenied => HttpError::Denied {
                host,
                reason: "not among the hosts granted to this plugin".into(),
            },
            ErrorCode::DestinationIpProhibited => HttpError::Denied {
                host,
                reason: "it resolves to an address that is not public and not granted".into(),
            },
            ErrorCode::ConnectionLimitReached => HttpError::Denied {
                host,
                reason: "the lease's request limit is reached".into(),
            },
            ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout
            | ErrorCode::DnsTimeout => HttpError::Timeout { host },
            ErrorCode::HttpResponseBodySize(limit) => HttpError::TooLarge { host, limit },
            other => HttpError::Failed {
                host,
                reason: reason(&other),
            },
        }
    }

    /// A failure in words, never the bindings' debug text.
    fn reason(code: &ErrorCode) -> String {
        let or = |text: &Option<String>, default: &str| {
            text.clone()
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        match code {
            ErrorCode::DnsError(p) => format!(
                "the name does not resolve ({})",
                or(&p.rcode, "no detail given")
            ),
            ErrorCode::DestinationNotFound => "the name resolves to no address".into(),
            ErrorCode::DestinationUnavailable => "the server is unavailable".into(),
            ErrorCode::DestinationIpUnroutable => "the address is unroutable".into(),
            ErrorCode::ConnectionRefused => "the connection was refused".into(),
            ErrorCode::ConnectionTerminated => "the connection was closed early".into(),
            ErrorCode::TlsProtocolError => "TLS failed".into(),
            ErrorCode::TlsCertificateError => "the server's TLS certificate is not valid".into(),
            ErrorCode::TlsAlertReceived(p) => format!(
                "the server ended TLS ({})",
                or(&p.alert_message, "an alert")
            ),
            ErrorCode::HttpRequestUriInvalid => "the URL is not valid".into(),
            ErrorCode::HttpResponseIncomplete => "the response ended early".into(),
            ErrorCode::HttpProtocolError => "the server broke the HTTP protocol".into(),
            ErrorCode::InternalError(text) => or(text, "an internal error"),
            // The rest are rare; their names read well enough in lower case.
            other => {
                let name = format!("{other:?}");
                let name = name.split('(').next().unwrap_or_default();
                let mut words = String::new();
                for c in name.chars() {
                    if c.is_uppercase() && !words.is_empty() {
                        words.push(' ');
                    }
                    words.extend(c.to_lowercase());
                }
                words
            }
        }
    }

    impl HttpError {
        /// Fills in the host of an error made where it was not known.
        fn with_host(mut self, host: &str) -> Self {
            match &mut self {
                HttpError::Denied { host: h, .. }
                | HttpError::Timeout { host: h }
                | HttpError::TooLarge { host: h, .. }
                | HttpError::Failed { host: h, .. }
                    if h.is_empty() =>
                {
                    *h = host.to_owned()
                }
                _ => {}
            }
            self
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    pub(super) use crate::testing::native_http as send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_the_way_wasi_http_wants() {
        let cases = [
            (
                "https://Api.Example.com/v1?q=1#frag",
                "https",
                "api.example.com",
                443,
                false,
                "/v1?q=1",
            ),
            (
                "http://127.0.0.1:8080",
                "http",
                "127.0.0.1",
                8080,
                true,
                "/",
            ),
            ("http://[::1]:9/x", "http", "[::1]", 9, true, "/x"),
            ("HTTP://h?x", "http", "h", 80, false, "/?x"),
        ];
        for (text, scheme, host, port, explicit, path) in cases {
            let url = Url::parse(text).unwrap();
            assert_eq!(
                (
                    url.scheme.as_str(),
                    url.host.as_str(),
                    url.port,
                    url.explicit_port,
                    url.path_with_query.as_str()
                ),
                (scheme, host, port, explicit, path),
                "{text}"
            );
        }
        for bad in [
            "ftp://h/",
            "h/path",
            "http://user@evil.example/",
            "http://granted.example@evil.example/",
            "http://h:port/",
            "http:///path",
            "http://h/a b",
        ] {
            assert!(
                matches!(Url::parse(bad), Err(HttpError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn redirect_locations_resolve_against_the_request() {
        let base = Url::parse("http://a.example:8080/dir/page?q=1").unwrap();
        let cases = [
            ("https://b.example/x", "https://b.example/x"),
            ("//c.example/y", "http://c.example/y"),
            ("/root", "http://a.example:8080/root"),
            ("next", "http://a.example:8080/dir/next"),
        ];
        for (reference, expected) in cases {
            assert_eq!(
                base.join(reference).unwrap().to_string(),
                expected,
                "{reference}"
            );
        }
    }

    #[test]
    fn errors_name_the_host() {
        let e = HttpError::Denied {
            host: "evil.example:443".into(),
            reason: "not among the hosts granted to this plugin".into(),
        };
        assert_eq!(
            e.to_string(),
            "request to `evil.example:443` denied: not among the hosts granted to this plugin"
        );
        assert!(!e.is_retryable());
        assert!(HttpError::Timeout { host: "h:1".into() }.is_retryable());
    }

    #[test]
    fn natively_send_calls_the_stand_in() {
        crate::testing::set_http(|request| {
            Ok(Response {
                status: 201,
                headers: vec![("location".into(), request.url.clone())],
                body: request.body.clone(),
                truncated: false,
            })
        });
        let response = send(&Request::new("post", "http://h/x").body("hi")).unwrap();
        assert_eq!(response.status, 201);
        assert_eq!(response.body, b"hi");
        assert_eq!(response.header("Location"), Some("http://h/x"));
        crate::testing::clear_http();
        assert!(matches!(
            send(&Request::get("http://h/")),
            Err(HttpError::Failed { .. })
        ));
    }
}
