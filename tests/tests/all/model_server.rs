//! A fake model API on loopback for the provider tests: HTTP/1.1 with
//! keep-alive, each request answered by a handler the test gives, the
//! answer written in the pieces the handler chose (each piece its own
//! write, `TCP_NODELAY` on, so a piece boundary can fall inside a line, a
//! field or a UTF-8 character), chunked.
//!
//! It counts connections, requests in flight (and the most at once), and
//! connections the client closed while an answer was still going: the
//! proof that cancelling a call reaches the socket. A `gate` holds answers
//! back until the test opens it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};

/// A request the server received.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// The first value of header `name`.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// What happens after an answer's pieces are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    /// The body ends properly; the connection stays open for more.
    End,
    /// The connection is dropped without ending the body.
    Cut,
    /// Nothing more is sent; the server waits for the client to close.
    Hang,
}

/// An answer.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub pieces: Vec<Vec<u8>>,
    pub after: After,
    /// Wait this long before the status line.
    pub delay: Duration,
    /// The pieces are a whole recorded response (status line, headers,
    /// framing and body), written as they are; the connection is closed
    /// after them, as the recording's `Connection: close` says.
    pub raw: bool,
}

impl Reply {
    /// A recorded response (see `tests/fixtures/providers/corpus`), its
    /// bytes written exactly, in `pieces`.
    pub(crate) fn raw(pieces: Vec<Vec<u8>>) -> Reply {
        Reply {
            status: 0,
            headers: Vec::new(),
            pieces,
            after: After::Cut,
            delay: Duration::ZERO,
            raw: true,
        }
    }

    /// A `text/event-stream` answer written in `pieces`.
    pub(crate) fn sse(pieces: Vec<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            pieces,
            after: After::End,
            delay: Duration::ZERO,
            raw: false,
        }
    }

    /// A JSON answer.
    pub(crate) fn json(status: u16, body: &Value) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            pieces: vec![body.to_string().into_bytes()],
            after: After::End,
            delay: Duration::ZERO,
            raw: false,
        }
    }

    /// This answer with a header added.
    pub(crate) fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// This answer ending with `after`.
    pub(crate) fn then(mut self, after: After) -> Reply {
        self.after = after;
        self
    }
}

/// `bytes` cut into pieces of 1, 2, 3, 5, 7, 11 and 13 bytes, over and
/// over: boundaries land inside `data:`, inside JSON, between `\r` and
/// `\n`, and inside multi-byte characters.
pub(crate) fn awkward_pieces(bytes: &[u8]) -> Vec<Vec<u8>> {
    const SIZES: [usize; 7] = [1, 2, 3, 5, 7, 11, 13];
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let end = (at + SIZES[i % SIZES.len()]).min(bytes.len());
        pieces.push(bytes[at..end].to_vec());
        at = end;
        i += 1;
    }
    pieces
}

type Handler = dyn Fn(&Seen, usize) -> Reply + Send + Sync;

struct State {
    handler: Box<Handler>,
    seen: Mutex<Vec<Seen>>,
    connections: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    closed_by_client: AtomicUsize,
    changed: Notify,
    gate: Option<Arc<Semaphore>>,
}

/// A fake model API running until the test's runtime ends.
pub(crate) struct FakeModel {
    pub port: u16,
    state: Arc<State>,
}

impl FakeModel {
    /// Starts a server answering request `n` (from 0) with `handler`.
    pub(crate) async fn start(
        handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self::start_gated(handler, None).await
    }

    /// Starts a server whose answers each wait for a permit of `gate`.
    pub(crate) async fn start_gated(
        handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
        gate: Option<Arc<Semaphore>>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            handler: Box::new(handler),
            seen: Mutex::default(),
            connections: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            closed_by_client: AtomicUsize::new(0),
            changed: Notify::new(),
            gate,
        });
        let s = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                s.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, Arc::clone(&s)));
            }
        });
        FakeModel { port, state }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Requests received so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The most requests that were in flight at once.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Connections the client closed before the answer was over.
    pub(crate) fn closed_by_client(&self) -> usize {
        self.state.closed_by_client.load(Ordering::SeqCst)
    }

    /// Waits until `done` holds, checking whenever the server's counts
    /// change; panics after 30 s (a hang, not a measurement).
    pub(crate) async fn wait_for(&self, what: &str, done: impl Fn(&FakeModel) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let changed = self.state.changed.notified();
            if done(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("the fake model server never saw {what}");
            }
        }
    }
}

async fn serve(mut stream: TcpStream, state: Arc<State>) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let n = {
            let mut seen = state.seen.lock().unwrap();
            seen.push(request.clone());
            seen.len() - 1
        };
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        state.changed.notify_waiters();
        let reply = (state.handler)(&request, n);
        let _permit = match &state.gate {
            Some(gate) => Some(gate.acquire().await.unwrap()),
            None => None,
        };
        let keep = answer(&mut stream, &reply, &state).await;
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        state.changed.notify_waiters();
        if !keep {
            return;
        }
    }
}

/// Writes `reply`; returns whether the connection can take another request.
async fn answer(stream: &mut TcpStream, reply: &Reply, state: &State) -> bool {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    if reply.raw {
        for piece in &reply.pieces {
            if stream.write_all(piece).await.is_err() || stream.flush().await.is_err() {
                state.closed_by_client.fetch_add(1, Ordering::SeqCst);
                return false;
            }
            tokio::task::yield_now().await;
        }
        let _ = stream.shutdown().await;
        return false;
    }
    let mut head = format!(
        "HTTP/1.1 {} X\r\ntransfer-encoding: chunked\r\n",
        reply.status
    );
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for piece in &reply.pieces {
        if piece.is_empty() {
            continue;
        }
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        if stream.write_all(&chunk).await.is_err() || stream.flush().await.is_err() {
            state.closed_by_client.fetch_add(1, Ordering::SeqCst);
            return false;
        }
        tokio::task::yield_now().await;
    }
    match reply.after {
        After::End => stream.write_all(b"0\r\n\r\n").await.is_ok(),
        After::Cut => false,
        After::Hang => {
            // The client sends nothing more on this connection: a read
            // ends only when it closes.
            let mut byte = [0u8; 1];
            let _ = stream.read(&mut byte).await;
            state.closed_by_client.fetch_add(1, Ordering::SeqCst);
            false
        }
    }
}

async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let _method = first.next()?;
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    buf.drain(..end + 4);
    while buf.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body: Vec<u8> = buf.drain(..length).collect();
    Some(Seen {
        path,
        headers,
        body,
    })
}
