//! The server's connections: how long a client has to send a request, how
//! many connections are held, and which one goes when the server is full.
//!
//! - **Header and idle timeout.** A connection has
//!   [`ConnectionLimits::header_timeout`] to send each request's head: the
//!   first one, and each next one on a kept-alive connection, so a
//!   connection idle between requests is closed after the same time. A
//!   response being streamed (a live event stream) is not idle.
//! - **Connection cap.** At most [`ConnectionLimits::max_connections`]
//!   connections are held.
//! - **Unauthenticated work is bounded first.** A connection is
//!   unauthenticated until one of its requests passes the guard's identity
//!   check (a valid token or console session). At most
//!   [`ConnectionLimits::max_unauthenticated`] such connections are held;
//!   when a new connection arrives past either bound, the oldest
//!   unauthenticated connection is closed to make room. A flood of
//!   half-sent or unauthenticated requests therefore only ever displaces
//!   itself: an authenticated connection is never closed for room, and a
//!   new connection is refused only when every one held is authenticated.
//!
//! The guard marks a connection authenticated through the
//! [`ConnectionHandle`] each request carries.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tower::ServiceExt as _;

use crate::guard::Peer;

/// The bounds on the server's connections (`[serve]` in warden.toml).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client has to send a request's head, and how long a
    /// kept-alive connection may wait idle for its next request.
    pub header_timeout: Duration,
    /// The most connections held at once.
    pub max_connections: usize,
    /// The most connections held before any request on them authenticated.
    pub max_unauthenticated: usize,
}

impl ConnectionLimits {
    /// The defaults: 10 s for a request's head, 1,024 connections, 256 of
    /// them unauthenticated.
    pub const DEFAULT: ConnectionLimits = ConnectionLimits {
        header_timeout: Duration::from_secs(10),
        max_connections: 1024,
        max_unauthenticated: 256,
    };
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits::DEFAULT
    }
}

/// One held connection.
#[derive(Debug)]
struct Held {
    authenticated: bool,
    task: Option<tokio::task::AbortHandle>,
}

/// The held connections, oldest first (ids are given in accept order).
#[derive(Debug)]
pub(crate) struct Registry {
    limits: ConnectionLimits,
    held: Mutex<(u64, BTreeMap<u64, Held>)>,
}

/// Which connection a request came on; the guard marks it authenticated.
#[derive(Clone, Debug)]
pub struct ConnectionHandle {
    registry: Arc<Registry>,
    id: u64,
}

impl ConnectionHandle {
    /// Marks the connection authenticated: it is never closed for room.
    pub fn authenticated(&self) {
        let mut held = self.registry.lock();
        if let Some(entry) = held.1.get_mut(&self.id) {
            entry.authenticated = true;
        }
    }
}

impl Registry {
    fn new(limits: ConnectionLimits) -> Registry {
        Registry {
            limits,
            held: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, BTreeMap<u64, Held>)> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes room for a new connection and holds it, or `None` when every
    /// held connection is authenticated and the server is full.
    fn admit(&self) -> Option<u64> {
        let mut guard = self.lock();
        let (next, held) = &mut *guard;
        let mut unauthenticated = held.values().filter(|h| !h.authenticated).count();
        while held.len() >= self.limits.max_connections
            || unauthenticated >= self.limits.max_unauthenticated
        {
            let oldest = held
                .iter()
                .find(|(_, h)| !h.authenticated)
                .map(|(id, _)| *id)?;
            if let Some(task) = held.remove(&oldest).and_then(|h| h.task) {
                task.abort();
            }
            unauthenticated -= 1;
            tracing::debug!(
                connection = oldest,
                "closed the oldest unauthenticated connection for room"
            );
        }
        let id = *next;
        *next += 1;
        held.insert(
            id,
            Held {
                authenticated: false,
                task: None,
            },
        );
        Some(id)
    }

    /// Closes the oldest unauthenticated connection; `false` when there is
    /// none.
    fn evict_oldest_unauthenticated(&self) -> bool {
        let mut guard = self.lock();
        let oldest = guard
            .1
            .iter()
            .find(|(_, h)| !h.authenticated)
            .map(|(id, _)| *id);
        let Some(oldest) = oldest else {
            return false;
        };
        if let Some(task) = guard.1.remove(&oldest).and_then(|h| h.task) {
            task.abort();
        }
        true
    }

    /// Records the task serving `id`, unless it already ended.
    fn serving(&self, id: u64, task: tokio::task::AbortHandle) {
        if let Some(entry) = self.lock().1.get_mut(&id) {
            entry.task = Some(task);
        }
    }

    fn release(&self, id: u64) {
        self.lock().1.remove(&id);
    }

    /// How many connections are held.
    fn len(&self) -> usize {
        self.lock().1.len()
    }
}

/// Something that hands out connections: plain TCP, or TLS once a
/// handshake is done.
pub(crate) trait Accept {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    async fn next(&mut self) -> std::io::Result<(Self::Io, SocketAddr)>;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn next(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        self.accept().await
    }
}

/// Serves `router` on the connections `listener` hands out, within
/// `limits`, until `shutdown` completes; then stops accepting, asks every
/// connection to finish its request in flight, and waits at most
/// `grace` for them.
pub(crate) async fn serve<L: Accept>(
    mut listener: L,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let registry = Arc::new(Registry::new(limits));
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.next() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors (or a connection reset before
                    // it was accepted): the oldest unauthenticated
                    // connection makes room, as it would past the cap.
                    tracing::warn!(%error, "accept failed");
                    if !registry.evict_oldest_unauthenticated() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
        };
        let Some(id) = registry.admit() else {
            tracing::warn!(%peer, "refused a connection: every held connection is authenticated and the server is full");
            drop(io);
            continue;
        };
        let handle = ConnectionHandle {
            registry: Arc::clone(&registry),
            id,
        };
        let service =
            router
                .clone()
                .map_request(move |mut request: axum::http::Request<Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(Peer(peer)));
                    request.extensions_mut().insert(handle.clone());
                    request
                });
        let mut stopping = stopping.clone();
        let done = Arc::clone(&registry);
        let task = tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let connection = builder
                .serve_connection(TokioIo::new(io), TowerToHyperService::new(service))
                .with_upgrades();
            tokio::pin!(connection);
            let stopped = tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "connection ended");
                    }
                    false
                }
                _ = stopping.wait_for(|stop| *stop) => true,
            };
            if stopped {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
            done.release(id);
        });
        registry.serving(id, task.abort_handle());
    }
    let _ = stop.send(true);
    // A live stream never ends by itself: the grace bounds the wait.
    let grace = tokio::time::Instant::now() + Duration::from_secs(5);
    while registry.len() > 0 && tokio::time::Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
