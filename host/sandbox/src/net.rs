//! Outbound HTTP, the only network a plugin can have: `wasi:http` from
//! wasmtime-wasi-http with Warden's own connector behind its
//! `send_request` hook.
//!
//! - **Who gets it.** The `wasi:http` interfaces are in a second linker,
//!   used only for components that import them; every other component's
//!   leases carry no HTTP state at all. A component that imports `wasi:http`
//!   under a grant with no host still instantiates (its `describe` runs with
//!   no capabilities), and every request it makes is denied before anything
//!   leaves. `wasi:sockets` is never linked.
//! - **Before a request leaves**, its scheme, host and port must match a
//!   granted [`HostPattern`], its authority must carry no user info
//!   (`user:pw@host`, which would reach the server in the `host` header),
//!   and the lease must be under its request limit
//!   ([`Limits::http_requests`](super::Limits::http_requests)).
//! - **After name resolution** (done here, not by the guest), every
//!   resolved address must be public, or be an address the operator granted
//!   literally (`127.0.0.1:8080`); the connection goes to a checked address
//!   and the name is never resolved again, so DNS rebinding gains nothing.
//!   A `*` or a name pattern never allows a non-public address.
//! - **Limits**: response body bytes over the whole lease
//!   ([`Limits::http_response_bytes`](super::Limits::http_response_bytes)),
//!   one budget charged frame by frame, so concurrent requests share it;
//!   the lease deadline covers resolving, connecting and waiting, because
//!   the guest waits inside a host call the deadline wraps.
//! - **Validity**: once the lease's [`ValidUntil`](super::ValidUntil) has
//!   passed, no request leaves: it is refused before it is sent, again
//!   after connecting (which can take long), and every request body frame
//!   is checked before it goes (`validity.rs`); the refusal reaches the
//!   guest as `HTTP-request-denied` and ends the lease as expired.
//! - **Secrets**: after a request is admitted, the guest's secret handles
//!   in its headers are filled in for the secret's own hosts, and their
//!   headers removed for any other (`secrets.rs`).
//! - **Accounting**: every request, host contacted, byte in and out and
//!   denial goes into the lease's [`NetworkUsage`], which the receipt
//!   carries. A denial reaches the guest as a `wasi:http` error code
//!   (`HTTP-request-denied`, `destination-IP-prohibited` or
//!   `connection-limit-reached`) and is logged at debug with the plugin and
//!   the host.
//!
//! The connector never reads proxy settings or anything else from the host's
//! environment.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpHooks};

use super::capture::Redactor;
use super::secrets::LeaseSecrets;
use super::validity::LeaseFence;

/// Most denials a receipt lists; later ones are counted only.
const MAX_LISTED_DENIALS: usize = 32;

/// An outbound host pattern: `[scheme://]host[:port]`, where `host` may
/// start with `*.` to allow every subdomain of the rest, or be `*` alone to
/// allow any host (public addresses only). A host that is an IP address
/// (`127.0.0.1`, `[::1]`) also allows connecting to that address when it is
/// not public.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    /// `http` or `https`, or any when `None`.
    pub scheme: Option<String>,
    /// The host name or address, lowercase, without the `*.`; empty for `*`.
    pub host: String,
    /// Whether subdomains of `host` match (and `host` itself does not); with
    /// an empty `host`, whether every host matches.
    pub wildcard: bool,
    /// The port, or any when `None`.
    pub port: Option<u16>,
}

impl HostPattern {
    /// Parses a pattern.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let bad = |why: &str| {
            format!(
                "`{text}` is not a host pattern: {why} (use host, host:port, *.domain, * or https://host)"
            )
        };
        let (scheme, rest) = match text.split_once("://") {
            Some((s, rest)) => {
                let s = s.to_ascii_lowercase();
                if s != "http" && s != "https" {
                    return Err(bad("the scheme must be http or https"));
                }
                (Some(s), rest)
            }
            None => (None, text),
        };
        if rest.contains('/') || rest.contains('@') || rest.contains('?') {
            return Err(bad("no paths, users or queries"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.starts_with('[') => {
                let port: u16 = p.parse().map_err(|_| bad("the port must be a number"))?;
                (h, Some(port))
            }
            _ => (rest, None),
        };
        if host == "*" {
            return Ok(HostPattern {
                scheme,
                host: String::new(),
                wildcard: true,
                port,
            });
        }
        let (wildcard, host) = match host.strip_prefix("*.") {
            Some(h) => (true, h),
            None => (false, host),
        };
        let host = host.to_ascii_lowercase();
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
            && !host.starts_with('.')
            && !host.ends_with('.');
        if !valid {
            return Err(bad("invalid host name"));
        }
        if host.starts_with('[') != host.ends_with(']')
            || (host.starts_with('[') && strip_brackets(&host).parse::<Ipv6Addr>().is_err())
        {
            return Err(bad("invalid IPv6 address"));
        }
        Ok(HostPattern {
            scheme,
            host,
            wildcard,
            port,
        })
    }

    /// Whether a request to `scheme://host:port` matches.
    pub fn matches(&self, scheme: &str, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        self.host_matches(&host) && self.scheme_and_port_match(scheme, port)
    }

    fn host_matches(&self, host: &str) -> bool {
        if self.wildcard && self.host.is_empty() {
            return true;
        }
        if self.wildcard {
            host.len() > self.host.len()
                && host.ends_with(&self.host)
                && host.as_bytes()[host.len() - self.host.len() - 1] == b'.'
        } else {
            host == self.host
        }
    }

    fn scheme_and_port_match(&self, scheme: &str, port: u16) -> bool {
        self.scheme.as_deref().is_none_or(|s| s == scheme) && self.port.is_none_or(|p| p == port)
    }

    /// The address this pattern names literally, if its host is an IP
    /// address.
    pub fn address(&self) -> Option<IpAddr> {
        if self.wildcard {
            return None;
        }
        strip_brackets(&self.host).parse().ok()
    }

    /// Whether every request `other` matches is also matched by `self`.
    pub fn covers(&self, other: &HostPattern) -> bool {
        let scheme_ok = match (&self.scheme, &other.scheme) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let port_ok = match (self.port, other.port) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let host_ok = match (self.wildcard, other.wildcard) {
            (true, _) if self.host.is_empty() => true,
            (false, false) => self.host == other.host,
            (false, true) => false,
            (true, _) => {
                !other.host.is_empty()
                    && (other.host.len() > self.host.len()
                        && other.host.ends_with(&self.host)
                        && other.host.as_bytes()[other.host.len() - self.host.len() - 1] == b'.'
                        || (other.wildcard && other.host == self.host))
            }
        };
        scheme_ok && port_ok && host_ok
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(s) = &self.scheme {
            write!(f, "{s}://")?;
        }
        match (self.wildcard, self.host.is_empty()) {
            (true, true) => f.write_str("*")?,
            (true, false) => write!(f, "*.{}", self.host)?,
            _ => f.write_str(&self.host)?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

fn strip_brackets(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Whether `ip` is a public unicast address: not loopback, private,
/// link-local, shared (CGNAT), unspecified, multicast, broadcast,
/// documentation, benchmarking or reserved. IPv4-mapped IPv6 addresses are
/// judged as their IPv4 address; NAT64, 6to4 and Teredo prefixes, which
/// embed IPv4 addresses, are not public.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            let non_public = v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x2001 && s[1] == 0) // Teredo
                || s[0] == 0x2002 // 6to4
                || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64
                || (s[0] == 0x100 && s[1] == 0 && s[2] == 0 && s[3] == 0) // discard
                || s[..6].iter().all(|&x| x == 0); // IPv4-compatible
            !non_public
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let non_public = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (b & 0xc0) == 64) // shared address space 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b & 0xfe) == 18) // benchmarking 198.18/15
        || a >= 240; // reserved
    !non_public
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DenialReason {
    /// No granted host pattern matches the scheme, host and port.
    NotGranted,
    /// The name resolved only to addresses that are neither public nor
    /// granted literally.
    AddressNotAllowed {
        /// The addresses it resolved to.
        addresses: Vec<IpAddr>,
    },
    /// The request's authority carries user info (`user:pw@host`).
    UserInfo,
    /// The lease had already sent [`Limits::http_requests`](super::Limits::http_requests)
    /// requests.
    RequestLimit {
        /// The limit.
        limit: u64,
    },
}

impl std::fmt::Display for DenialReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DenialReason::NotGranted => f.write_str("not among the granted hosts"),
            DenialReason::UserInfo => f.write_str("user info in the authority is refused"),
            DenialReason::AddressNotAllowed { addresses } => {
                let list: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
                write!(
                    f,
                    "resolves to {}, not public and not granted",
                    list.join(", ")
                )
            }
            DenialReason::RequestLimit { limit } => {
                write!(f, "over the request limit of {limit}")
            }
        }
    }
}

/// A request the host refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkDenial {
    /// `scheme://host:port` asked for.
    pub target: String,
    /// Why.
    #[serde(flatten)]
    pub reason: DenialReason,
}

/// What one lease did on the network. In the receipt only when the lease
/// attempted at least one request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkUsage {
    /// Requests that passed the checks and were sent (or tried to connect).
    pub requests: u64,
    /// `host:port` of each host connected to, in first-contact order.
    pub hosts: Vec<String>,
    /// Request body bytes sent.
    pub bytes_out: u64,
    /// Response body bytes received.
    pub bytes_in: u64,
    /// Requests refused: the first 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<NetworkDenial>,
    /// All requests refused, listed or not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub denied: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The network grant of one plugin, built once per grant.
#[derive(Debug, Default)]
pub(crate) struct NetGrant {
    patterns: Vec<HostPattern>,
}

impl NetGrant {
    /// The grant of host pattern texts. A pattern that does not
    /// parse grants nothing (the grant module validates grants before they
    /// get here).
    pub(crate) fn new(plugin: &str, hosts: &[String]) -> Self {
        let patterns = hosts
            .iter()
            .filter_map(|h| match HostPattern::parse(h) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(plugin, "ignoring invalid host grant: {e}");
                    None
                }
            })
            .collect();
        NetGrant { patterns }
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.patterns.iter().any(|p| p.matches(scheme, host, port))
    }

    fn allows_address(&self, scheme: &str, port: u16, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        is_public(ip)
            || self
                .patterns
                .iter()
                .any(|p| p.address() == Some(ip) && p.scheme_and_port_match(scheme, port))
    }
}

/// Accounting shared between a lease's hooks and the tasks that carry its
/// requests.
#[derive(Debug, Default)]
struct Meter {
    usage: NetworkUsage,
    attempted: bool,
}

type SharedMeter = Arc<Mutex<Meter>>;

fn lock(m: &SharedMeter) -> std::sync::MutexGuard<'_, Meter> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The HTTP state of one lease whose component imports `wasi:http`.
pub(crate) struct NetLease {
    pub(crate) ctx: WasiHttpCtx,
    pub(crate) hooks: NetHooks,
}

impl NetLease {
    pub(crate) fn new(
        plugin: Arc<str>,
        grant: Arc<NetGrant>,
        redactor: Arc<Redactor>,
        max_requests: u64,
        max_response_bytes: u64,
        fence: LeaseFence,
        secrets: Arc<LeaseSecrets>,
    ) -> Self {
        NetLease {
            ctx: WasiHttpCtx::new(),
            hooks: NetHooks {
                plugin,
                grant,
                redactor,
                max_requests,
                max_response_bytes,
                meter: SharedMeter::default(),
                fence,
                secrets,
            },
        }
    }

    /// A lease state that denies every request: what a `wasi:http` call
    /// finds if the lease was set up without network state.
    pub(crate) fn deny_all(plugin: Arc<str>) -> Self {
        let secrets = Arc::new(LeaseSecrets::new(Arc::clone(&plugin), Arc::default()));
        NetLease::new(
            plugin,
            Arc::default(),
            Arc::default(),
            0,
            0,
            LeaseFence::default(),
            secrets,
        )
    }

    /// What the lease did, if it attempted any request.
    pub(crate) fn usage(&self) -> Option<NetworkUsage> {
        let meter = lock(&self.hooks.meter);
        meter.attempted.then(|| meter.usage.clone())
    }
}

/// The `WasiHttpHooks` of one lease.
pub(crate) struct NetHooks {
    plugin: Arc<str>,
    grant: Arc<NetGrant>,
    /// For the targets logged: what the guest asks for may hold a secret.
    redactor: Arc<Redactor>,
    max_requests: u64,
    max_response_bytes: u64,
    meter: SharedMeter,
    fence: LeaseFence,
    /// Fills the guest's secret handles into an admitted request's headers.
    secrets: Arc<LeaseSecrets>,
}

/// Where an admitted request goes.
struct Target {
    https: bool,
    scheme: &'static str,
    /// As in the URI; IPv6 in brackets.
    host: String,
    port: u16,
}

impl Target {
    fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn url(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.host, self.port)
    }
}

impl NetHooks {
    fn deny(&self, target: String, reason: DenialReason) {
        tracing::debug!(plugin = &*self.plugin, target = %self.redactor.redacted(&target), %reason, "outbound request denied");
        let mut meter = lock(&self.meter);
        meter.attempted = true;
        meter.usage.denied += 1;
        if meter.usage.denials.len() < MAX_LISTED_DENIALS {
            meter.usage.denials.push(NetworkDenial { target, reason });
        }
    }

    /// The checks made before anything leaves: scheme, host and port
    /// against the grant, and the request limit.
    fn admit(&self, request: &http::Request<WasiBody>) -> Result<Target, Error> {
        let uri = request.uri();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let scheme = if https { "https" } else { "http" };
        let Some(host) = uri.host().map(str::to_ascii_lowercase) else {
            return Err(Error::HttpRequestUriInvalid);
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let target = Target {
            https,
            scheme,
            host,
            port,
        };
        // User info would be sent on in the `host` header (`user:pw@host`),
        // naming to the server something the grant never checked.
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            self.deny(target.url(), DenialReason::UserInfo);
            return Err(Error::HttpRequestDenied);
        }
        if !self.grant.allows(scheme, &target.host, port) {
            self.deny(target.url(), DenialReason::NotGranted);
            return Err(Error::HttpRequestDenied);
        }
        {
            let mut meter = lock(&self.meter);
            if meter.usage.requests >= self.max_requests {
                drop(meter);
                self.deny(
                    target.url(),
                    DenialReason::RequestLimit {
                        limit: self.max_requests,
                    },
                );
                return Err(Error::ConnectionLimitReached);
            }
            meter.attempted = true;
            meter.usage.requests += 1;
        }
        Ok(target)
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;
type SendFuture =
    Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send>;

impl WasiHttpHooks for NetHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        if self.fence.check().is_err() {
            tracing::debug!(
                plugin = &*self.plugin,
                "outbound request refused: the lease's validity has ended"
            );
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        let target = match self.admit(&request) {
            Ok(target) => target,
            Err(e) => return Box::new(async move { Err(e) }),
        };
        // Only now, with the request out of the guest's hands and its
        // target admitted: handles become values for the secret's own
        // hosts, and their headers are removed for any other.
        let mut request = request;
        self.secrets.substitute(
            request.headers_mut(),
            target.scheme,
            &target.host,
            target.port,
        );
        let connection = Connection {
            plugin: Arc::clone(&self.plugin),
            grant: Arc::clone(&self.grant),
            redactor: Arc::clone(&self.redactor),
            meter: Arc::clone(&self.meter),
            max_response_bytes: self.max_response_bytes,
            fence: self.fence.clone(),
        };
        Box::new(connection.send(target, request, options.unwrap_or_default()))
    }
}

/// What a request's task needs once it left the store.
struct Connection {
    plugin: Arc<str>,
    grant: Arc<NetGrant>,
    redactor: Arc<Redactor>,
    meter: SharedMeter,
    max_response_bytes: u64,
    fence: LeaseFence,
}

impl Connection {
    async fn send(
        self,
        target: Target,
        mut request: http::Request<WasiBody>,
        options: RequestOptions,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let stream = self.connect(&target, options.connect_timeout).await?;
        let stream: Box<dyn Stream> = if target.https {
            let name = server_name(&target.host)?;
            let tls = tokio_rustls::TlsConnector::from(warden_tls::client_config())
                .connect(name, stream)
                .await
                .map_err(Error::Tls)?;
            Box::new(tls)
        } else {
            Box::new(stream)
        };
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        // Resolving and connecting can outlast the validity.
        if self.fence.check().is_err() {
            tracing::debug!(
                plugin = &*self.plugin,
                "outbound request refused after connecting: the lease's validity has ended"
            );
            return Err(Error::HttpRequestDenied);
        }
        // The request line carries only the path: the authority went into
        // the connection and the `host` header.
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        *request.uri_mut() = http::Uri::builder()
            .path_and_query(path)
            .build()
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        let request = request.map(|body| {
            Metered::new(body, Arc::clone(&self.meter), Direction::Out, None)
                .fenced(self.fence.clone())
                .boxed_unsync()
        });

        let mut conn = Box::pin(conn);
        let sent = sender.send_request(request);
        let first_byte = async {
            match options.first_byte_timeout {
                Some(t) => tokio::time::timeout(t, sent)
                    .await
                    .map_err(|_| Error::ConnectionReadTimeout)?
                    .map_err(Error::from),
                None => sent.await.map_err(Error::from),
            }
        };
        // Drive the connection while waiting for the response head.
        let mut first_byte = Box::pin(first_byte);
        let mut conn_done = false;
        let response = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = first_byte.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
            if !conn_done && let Poll::Ready(r) = conn.as_mut().poll(cx) {
                conn_done = true;
                if let Err(e) = r {
                    return Poll::Ready(Err(Error::from(e)));
                }
                return first_byte.as_mut().poll(cx);
            }
            Poll::Pending
        })
        .await?;
        let between = options.between_bytes_timeout;
        let response = response.map(|incoming| {
            Metered::new(
                incoming,
                Arc::clone(&self.meter),
                Direction::In,
                Some(self.max_response_bytes),
            )
            .with_idle_timeout(between)
            .boxed_unsync()
        });
        let io: IoFuture = Box::new(async move {
            if conn_done {
                return Ok(());
            }
            conn.await.map_err(Error::from)
        });
        Ok((response, io))
    }

    /// Resolves the target, keeps the addresses the grant allows, and
    /// connects to the first that answers.
    async fn connect(
        &self,
        target: &Target,
        timeout: Option<Duration>,
    ) -> Result<TcpStream, Error> {
        let bare = strip_brackets(&target.host);
        let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, target.port)],
            Err(_) => tokio::net::lookup_host((bare, target.port))
                .await
                .map_err(|e| Error::DnsError {
                    rcode: Some(e.to_string()),
                    info_code: None,
                })?
                .collect(),
        };
        if addresses.is_empty() {
            return Err(Error::DestinationNotFound);
        }
        let allowed: Vec<SocketAddr> = addresses
            .iter()
            .copied()
            .filter(|a| {
                self.grant
                    .allows_address(target.scheme, target.port, a.ip())
            })
            .collect();
        if allowed.is_empty() {
            let mut ips: Vec<IpAddr> = addresses.iter().map(SocketAddr::ip).collect();
            ips.dedup();
            let reason = DenialReason::AddressNotAllowed { addresses: ips };
            tracing::debug!(plugin = &*self.plugin, target = %self.redactor.redacted(&target.url()), %reason, "outbound request denied");
            let mut meter = lock(&self.meter);
            // It was admitted and counted as a request; it is a denial now.
            meter.usage.requests = meter.usage.requests.saturating_sub(1);
            meter.usage.denied += 1;
            if meter.usage.denials.len() < MAX_LISTED_DENIALS {
                meter.usage.denials.push(NetworkDenial {
                    target: target.url(),
                    reason,
                });
            }
            return Err(Error::DestinationIpProhibited);
        }
        let mut last = None;
        for address in allowed {
            let attempt = TcpStream::connect(address);
            let result = match timeout {
                Some(t) => match tokio::time::timeout(t, attempt).await {
                    Ok(r) => r,
                    Err(_) => {
                        last = Some(Error::ConnectionTimeout);
                        continue;
                    }
                },
                None => attempt.await,
            };
            match result {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let host = target.host_port();
                    let mut meter = lock(&self.meter);
                    if !meter.usage.hosts.contains(&host) {
                        meter.usage.hosts.push(host);
                    }
                    return Ok(stream);
                }
                Err(e) => last = Some(Error::Connect(e)),
            }
        }
        Err(last.unwrap_or(Error::ConnectionRefused))
    }
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T> Stream for T where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static
{
}

fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, Error> {
    let bare = strip_brackets(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(rustls::pki_types::ServerName::from(ip));
    }
    rustls::pki_types::ServerName::try_from(bare.to_owned()).map_err(|_| Error::DnsError {
        rcode: Some(format!("invalid DNS name `{bare}`")),
        info_code: None,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    In,
    Out,
}

/// A body that counts its data bytes into the lease's meter and, for
/// responses, charges each frame to the lease's one response byte budget,
/// shared by all its requests, however many are in flight at once.
struct Metered<B> {
    inner: B,
    meter: SharedMeter,
    direction: Direction,
    /// The lease's response byte limit, for responses.
    limit: Option<u64>,
    idle: Option<Duration>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// For request bodies: no frame goes once the validity has passed.
    fence: Option<LeaseFence>,
}

impl<B> Metered<B> {
    fn new(inner: B, meter: SharedMeter, direction: Direction, limit: Option<u64>) -> Self {
        Metered {
            inner,
            meter,
            direction,
            limit,
            idle: None,
            sleep: None,
            fence: None,
        }
    }

    fn fenced(mut self, fence: LeaseFence) -> Self {
        self.fence = Some(fence);
        self
    }

    fn with_idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.idle = idle;
        self
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Error>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if this.fence.as_ref().is_some_and(|f| f.check().is_err()) {
                    return Poll::Ready(Some(Err(Error::HttpRequestDenied)));
                }
                this.sleep = None;
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    // Checked and charged under one lock: concurrent
                    // responses draw on the same budget.
                    let mut meter = lock(&this.meter);
                    match this.direction {
                        Direction::In => {
                            if let Some(limit) = this.limit
                                && meter.usage.bytes_in.saturating_add(n) > limit
                            {
                                return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(
                                    limit,
                                )))));
                            }
                            meter.usage.bytes_in += n;
                        }
                        Direction::Out => meter.usage.bytes_out += n,
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if let Some(idle) = this.idle {
                    let sleep = this
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Some(Err(Error::ConnectionReadTimeout)));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        let cases: &[(&str, bool)] = &[
            ("93.184.216.34", true),
            ("1.1.1.1", true),
            ("2606:4700:4700::1111", true),
            ("127.0.0.1", false),
            ("127.8.9.10", false),
            ("10.1.2.3", false),
            ("172.16.0.1", false),
            ("172.31.255.255", false),
            ("172.32.0.1", true),
            ("192.168.1.1", false),
            ("169.254.169.254", false), // cloud metadata
            ("100.64.0.1", false),
            ("100.128.0.1", true),
            ("0.0.0.0", false),
            ("0.1.2.3", false),
            ("224.0.0.1", false),
            ("255.255.255.255", false),
            ("240.0.0.1", false),
            ("192.0.2.1", false),
            ("198.18.0.1", false),
            ("192.0.0.8", false),
            ("::1", false),
            ("::", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:93.184.216.34", true),
            ("fc00::1", false),
            ("fd12:3456::1", false),
            ("fe80::1", false),
            ("ff02::1", false),
            ("2001:db8::1", false),
            ("64:ff9b::7f00:1", false),
            ("2002:7f00:1::", false),
            ("2001::1", false),
            ("::127.0.0.1", false),
        ];
        for (ip, public) in cases {
            assert_eq!(is_public(ip.parse().unwrap()), *public, "{ip}");
        }
    }

    #[test]
    fn host_patterns_match_scheme_host_and_port() {
        let p = HostPattern::parse("*.example.com").unwrap();
        assert!(p.matches("https", "api.example.com", 443));
        assert!(p.matches("http", "a.b.example.com", 80));
        assert!(!p.matches("https", "example.com", 443));
        assert!(!p.matches("https", "badexample.com", 443));
        let p = HostPattern::parse("https://api.example.com:8443").unwrap();
        assert!(p.matches("https", "API.example.com", 8443));
        assert!(!p.matches("http", "api.example.com", 8443));
        assert!(!p.matches("https", "api.example.com", 443));
        let p = HostPattern::parse("127.0.0.1:8080").unwrap();
        assert!(p.matches("http", "127.0.0.1", 8080));
        assert_eq!(p.address(), Some("127.0.0.1".parse().unwrap()));
        let any = HostPattern::parse("*").unwrap();
        assert!(any.matches("https", "anything.example", 1));
        assert_eq!(any.address(), None);
        assert_eq!(any.to_string(), "*");
        let v6 = HostPattern::parse("[::1]:9").unwrap();
        assert!(v6.matches("http", "[::1]", 9));
        assert_eq!(v6.address(), Some("::1".parse().unwrap()));
        for bad in [
            "",
            "ftp://x",
            "x/y",
            "user@x",
            "x:port",
            "*.",
            ".x",
            "exa mple.com",
            "[zz]:1",
            "*:x",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn coverage_between_patterns() {
        let p = |s: &str| HostPattern::parse(s).unwrap();
        let cases = [
            ("*", "api.example.com", true),
            ("*", "*.example.com", true),
            ("*", "*", true),
            ("*.example.com", "*", false),
            ("*.example.com", "a.example.com:443", true),
            ("*.example.com", "*.a.example.com", true),
            ("*.example.com", "example.com", false),
            ("https://a.com:443", "a.com", false),
            ("https://a.com:443", "https://a.com:443", true),
            ("localhost", "localhost:8080", true),
            ("a.com", "b.com", false),
        ];
        for (outer, inner, expected) in cases {
            assert_eq!(
                p(outer).covers(&p(inner)),
                expected,
                "{outer} covers {inner}"
            );
        }
    }

    #[test]
    fn non_public_addresses_need_a_literal_grant() {
        let grant = NetGrant::new(
            "p",
            &[
                "localhost:8080".into(),
                "*".into(),
                "http://127.0.0.1:9000".into(),
            ],
        );
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        // A name or `*` never allows a loopback address ...
        assert!(!grant.allows_address("http", 8080, lo));
        // ... a literal grant does, for its scheme and port only.
        assert!(grant.allows_address("http", 9000, lo));
        assert!(grant.allows_address("http", 9000, "::ffff:127.0.0.1".parse().unwrap()));
        assert!(!grant.allows_address("https", 9000, lo));
        assert!(!grant.allows_address("http", 9001, lo));
        assert!(grant.allows_address("https", 443, "93.184.216.34".parse().unwrap()));
        // Nothing granted, nothing allowed by name.
        let none = NetGrant::new("p", &[]);
        assert!(!none.allows("https", "example.com", 443));
    }
}
