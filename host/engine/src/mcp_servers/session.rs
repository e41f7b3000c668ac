//! One MCP session with a server, whichever its transport: a local server's
//! process in its sandbox over stdio (`process.rs`), or a remote server over
//! streamable HTTP (`remote.rs`). Both give the same [`Session`]: the
//! handshake within the start's deadline, the tool listing, one call at a
//! time, and [`kill`](Session::kill) at a deadline. Both bound what a
//! response may hold to the server's `max_output` plus the protocol's
//! envelope as it arrives, and the [`Meter`] tells the waiting call when one
//! was cut.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::FixedInterval;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::Value;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

use super::remote::{ENVELOPE, RemoteClient};
use super::{McpServer, McpServerError, McpTransport, process};

/// Whether a session's responses stayed under its limit, shared by what
/// reads them and the call waiting on them.
#[derive(Debug, Default)]
pub struct Meter {
    /// The size a response had reached when it was cut; 0 while none was.
    over: AtomicU64,
    notify: Notify,
}

impl Meter {
    /// Records a response cut at `bytes`, waking the call waiting on it.
    pub fn exceeded(&self, bytes: u64) {
        self.over.fetch_max(bytes, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// The size a response had when it was cut, if one was.
    pub fn cut(&self) -> Option<u64> {
        Some(self.over.load(Ordering::SeqCst)).filter(|n| *n > 0)
    }

    /// Resolves once a response was over the limit, with its size then.
    pub async fn wait(&self) -> u64 {
        loop {
            let notified = self.notify.notified();
            let over = self.over.load(Ordering::SeqCst);
            if over > 0 {
                return over;
            }
            notified.await;
        }
    }
}

/// A local server's stdout, one JSON-RPC message a line, cut when a line
/// grows past `limit`: the codec above never buffers more.
struct LineLimit<R> {
    inner: R,
    limit: u64,
    line: u64,
    meter: Arc<Meter>,
}

impl<R: AsyncRead + Unpin> AsyncRead for LineLimit<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        for &b in &buf.filled()[before..] {
            if b == b'\n' {
                this.line = 0;
            } else {
                this.line += 1;
                if this.line > this.limit {
                    this.meter.exceeded(this.line);
                    return Poll::Ready(Err(std::io::Error::other(format!(
                        "a message over {} bytes",
                        this.limit
                    ))));
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Why a local server that failed its start stopped (`; ` and the
/// report), killed first when `kill` (it missed its deadline), else after
/// if it still runs; empty for a remote one.
async fn stopped(child: Option<(tokio::process::Child, process::Stderr)>, kill: bool) -> String {
    let Some((mut child, mut stderr)) = child else {
        return String::new();
    };
    if kill {
        let _ = child.start_kill();
    }
    let why = process::stopped(&mut child, &mut stderr).await;
    let _ = child.start_kill();
    format!("; {why}")
}

/// One session with a running (or reached) server.
pub struct Session {
    key: String,
    start_timeout: Duration,
    /// A local server's process (its sandbox) and its stderr; `None` for a
    /// remote one.
    child: Option<(tokio::process::Child, process::Stderr)>,
    meter: Arc<Meter>,
    client: RunningService<RoleClient, ()>,
}

impl Session {
    /// Starts `server` in its sandbox, or reaches it, and makes the MCP
    /// handshake, within its start's deadline.
    pub async fn start(server: &McpServer) -> Result<Session, McpServerError> {
        let failed = |message: String| McpServerError::Failed {
            server: server.key.clone(),
            message,
        };
        let start_timeout = server.timeout.max(super::MIN_START_TIMEOUT);
        let limit = server.max_output.saturating_add(ENVELOPE);
        let (child, meter, handshake) = match &server.transport {
            McpTransport::Local(local) => {
                let (child, stdout, stdin, stderr) = process::spawn(&server.key, local)?;
                let meter = Arc::new(Meter::default());
                let stdout = LineLimit {
                    inner: stdout,
                    limit,
                    line: 0,
                    meter: Arc::clone(&meter),
                };
                let handshake = tokio::time::timeout(start_timeout, ().serve((stdout, stdin)))
                    .await
                    .map(|r| r.map_err(|e| e.to_string()));
                (Some((child, stderr)), meter, handshake)
            }
            McpTransport::Remote(remote) => {
                let client =
                    RemoteClient::new(&server.key, remote, server.max_output, start_timeout)?;
                client.check().await?;
                let meter = client.meter();
                let mut config = StreamableHttpClientTransportConfig::with_uri(remote.url.clone());
                // A broken stream is not resumed and an expired session is
                // not re-made behind the call's back: what the server did
                // is not known, so the call fails and the engine's retry
                // rules decide.
                let mut never = FixedInterval::default();
                never.max_times = Some(0);
                config.retry_config = Arc::new(never);
                config.reinit_on_expired_session = false;
                config.max_concurrent_requests = 1;
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                config.max_json_response_size = limit;
                config.max_sse_event_size = limit;
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let handshake = tokio::time::timeout(start_timeout, ().serve(transport))
                    .await
                    .map(|r| r.map_err(|e| e.to_string()));
                (None, meter, handshake)
            }
        };
        let local = child.is_some();
        let client = match handshake {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                let why = stopped(child, false).await;
                return Err(failed(format!("the MCP handshake failed: {e}{why}")));
            }
            Err(_) => {
                let why = stopped(child, true).await;
                return Err(failed(format!(
                    "no MCP handshake within {start_timeout:?}: {}{why}",
                    if local { "killed" } else { "given up" }
                )));
            }
        };
        Ok(Session {
            key: server.key.clone(),
            start_timeout,
            child,
            meter,
            client,
        })
    }

    /// Its tools, each as the server lists it (JSON), by name.
    pub async fn list_tools(&mut self) -> Result<BTreeMap<String, Value>, McpServerError> {
        let key = self.key.clone();
        let failed = move |message: String| McpServerError::Failed {
            server: key.clone(),
            message,
        };
        let tools =
            match tokio::time::timeout(self.start_timeout, self.client.list_all_tools()).await {
                Err(_) => {
                    return Err(failed(format!(
                        "no tool list within {:?}",
                        self.start_timeout
                    )));
                }
                Ok(Err(e)) => {
                    let why = self.why_stopped().await;
                    return Err(failed(format!("cannot list its tools: {e}{why}")));
                }
                Ok(Ok(tools)) => tools,
            };
        Ok(tools
            .into_iter()
            .map(|t| {
                let name = t.name.to_string();
                (name, serde_json::to_value(&t).expect("a tool serializes"))
            })
            .collect())
    }

    /// Calls `tool`; the result as JSON.
    pub async fn call_tool(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> Result<Value, String> {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result = self
            .client
            .call_tool(params)
            .await
            .map_err(|e| e.to_string())?;
        Ok(serde_json::to_value(&result).expect("a tool result serializes"))
    }

    /// Resolves once a response of this session was cut at its limit, with
    /// its size then.
    pub async fn over_limit(&self) -> u64 {
        self.meter.wait().await
    }

    /// The size a response of this session had when it was cut, if one
    /// was: a call that failed because its transport was cut failed for
    /// that.
    pub fn cut(&self) -> Option<u64> {
        self.meter.cut()
    }

    /// A local server's process id (its sandbox's), while it has not been
    /// waited for; `None` for a remote server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|(child, _)| child.id())
    }

    /// Whether a local server's process still runs (a remote server is
    /// taken to): one its watchdog killed between calls is started again
    /// rather than called dead.
    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some((child, _)) => matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Why a local server's connection broke, for the error that says so:
    /// `; ` and its exit status and the end of its stderr (see
    /// [`process::stopped`]); empty for a remote server.
    pub async fn why_stopped(&mut self) -> String {
        match &mut self.child {
            Some((child, stderr)) => format!("; {}", process::stopped(child, stderr).await),
            None => String::new(),
        }
    }

    /// Ends the session: kills a local server (and its sandbox) and waits
    /// for it, briefly; a remote one's session is closed, briefly.
    pub async fn kill(mut self) {
        if let Some((child, _)) = &mut self.child {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            drop(self.client);
        } else {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.client.cancel()).await;
        }
    }
}
