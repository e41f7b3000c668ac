//! A small HTTP/1.1 server on loopback for the network tests: one
//! connection per request (`connection: close`), a few routes, and a count
//! of every connection it accepted, so a test can show that a refused
//! request never reached it.
//!
//! A connection that opens with a TLS handshake is closed at once.
//!
//! Routes: `/status/N` answers N; `/slow` answers after 30 s; `/big/N`
//! answers N bytes; `/redirect?to=URL` answers 302 to URL; `/echo` answers
//! the request as JSON; `/hang-once/KEY` answers after 30 s the first time
//! a server is asked for KEY and at once after that; anything else is 404.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request the server received.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub method: String,
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
}

/// A server running on the test's runtime until the test ends.
pub(crate) struct TestServer {
    pub port: u16,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TestServer {
    /// Starts a server on `127.0.0.1`, on a free port.
    pub(crate) async fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (c, s) = (Arc::clone(&connections), Arc::clone(&seen));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, Arc::clone(&s)));
            }
        });
        TestServer {
            port,
            connections,
            seen,
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `127.0.0.1:PORT`, as a host grant.
    pub(crate) fn grant(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Requests received so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests were received so far, for another task to watch.
    pub(crate) fn received_counter(&self) -> impl Fn() -> usize + Send + 'static {
        let seen = Arc::clone(&self.seen);
        move || seen.lock().unwrap().len()
    }
}

async fn serve(mut stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    seen.lock().unwrap().push(request.clone());
    let (path, query) = request
        .path
        .split_once('?')
        .unwrap_or((request.path.as_str(), ""));
    let (status, headers, body): (u16, Vec<(&str, String)>, Vec<u8>) = match path {
        p if p.starts_with("/status/") => {
            let code: u16 = p["/status/".len()..].parse().unwrap_or(500);
            (code, vec![], format!("status {code}").into_bytes())
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            (200, vec![], b"late".to_vec())
        }
        p if p.starts_with("/hang-once/") => {
            let first = {
                let seen = seen.lock().unwrap();
                seen.iter().filter(|s| s.path == request.path).count() == 1
            };
            if first {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            (200, vec![], b"answered".to_vec())
        }
        p if p.starts_with("/big/") => {
            let n: usize = p["/big/".len()..].parse().unwrap_or(0);
            (200, vec![], vec![b'x'; n])
        }
        "/redirect" => {
            let to = query.strip_prefix("to=").unwrap_or("/").to_owned();
            (302, vec![("location", to)], Vec::new())
        }
        "/echo" => {
            let body = json!({
                "method": request.method,
                "path": request.path,
                "headers": request.headers,
                "body": String::from_utf8_lossy(&request.body),
            });
            (
                200,
                vec![("content-type", "application/json".into())],
                body.to_string().into_bytes(),
            )
        }
        _ => (404, vec![], b"not found".to_vec()),
    };
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
}

async fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        // A TLS handshake (record type 22): this server speaks plain HTTP.
        if buf.first() == Some(&0x16) {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
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
    let mut body = buf[end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}
