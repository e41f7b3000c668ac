//! `/metrics` as Prometheus scrapes it: `warden serve`'s (behind a token)
//! and `warden worker --metrics`'s (loopback only), on the quick start's
//! demo. Prometheus's own `promtool check metrics` (Debian's `prometheus`
//! package; `.ci/run` installs it with its Debian packages) accepts
//! the output, and the counters move as the run proceeds: the park for
//! approval, then the approved write. Without `promtool` the test fails
//! naming the step.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::serve::{Killed, add_token, demo, start_server, warden};

/// `GET /metrics` on `addr`, with `token` when given: status and body.
fn scrape(addr: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            out.push_str(&tail[..size]);
            rest = &tail[size + 2..];
        }
        out
    } else {
        body.to_owned()
    };
    (status, body)
}

/// `promtool check metrics` on `text`: passes, or the test fails with
/// what it said.
fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): bash .ci/run installs it with its Debian packages (apt-get install prometheus)"
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool refused the metrics:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the sample `series` (name and labels exactly as printed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_pass_promtool_and_move_as_a_run_proceeds() {
    let dir = demo();
    let store = dir.path().join("warden.db");
    let store = store.to_str().unwrap();
    let out = warden(dir.path(), store)
        .args(["run", "notes.toml", "Summarise my notes", "--run-id", "m-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "parked: {out:?}");
    let token = add_token(dir.path(), "prometheus", "viewer");
    let (_server, addr) = start_server(dir.path(), store);

    // A token is needed, as for the API.
    assert_eq!(scrape(&addr, None).0, 401);
    let (status, before) = scrape(&addr, Some(&token));
    assert_eq!(status, 200, "{before}");
    promtool_accepts(&before);
    assert_eq!(
        sample(&before, r#"warden_runs{status="awaiting_approval"}"#),
        Some(1.0),
        "{before}"
    );
    assert_eq!(
        sample(&before, r#"warden_parks_total{reason="approval"}"#),
        Some(1.0)
    );
    let write = r#"warden_tool_calls_total{plugin="fs",effect="write",outcome="ok"}"#;
    assert_eq!(sample(&before, write), None, "{before}");
    let reads = r#"warden_tool_calls_total{plugin="fs",effect="read",outcome="ok"}"#;
    assert!(sample(&before, reads).unwrap() >= 2.0, "{before}");
    assert!(sample(&before, r#"warden_model_tokens_total{direction="input"}"#).unwrap() > 0.0);
    assert!(sample(&before, "warden_lease_duration_seconds_count").unwrap() >= 2.0);

    // The write is approved: the counters move.
    let out = warden(dir.path(), store)
        .args(["runs", "approve", "m-1", "call-3-1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (_, after) = scrape(&addr, Some(&token));
    promtool_accepts(&after);
    assert_eq!(sample(&after, write), Some(1.0), "{after}");
    assert_eq!(
        sample(&after, r#"warden_runs{status="completed"}"#),
        Some(1.0)
    );
    assert!(
        sample(&after, "warden_steps_total").unwrap()
            > sample(&before, "warden_steps_total").unwrap()
    );

    // A worker serves the same on loopback, with its own append latency,
    // and refuses any other address.
    let refused = warden(dir.path(), store)
        .args(["worker", "--metrics", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let mut worker = warden(dir.path(), store)
        .args(["worker", "--metrics", "127.0.0.1:0", "--poll", "50ms"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until the end: a worker whose stderr closed would fail to log.
    let mut stderr = BufReader::new(worker.stderr.take().unwrap()).lines();
    let _worker = Killed::new(worker);
    let line = stderr
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.starts_with("worker metrics at "))
        .expect("the worker names its metrics address");
    let worker_addr = line
        .trim_start_matches("worker metrics at http://")
        .trim_end_matches("/metrics")
        .to_owned();
    let (status, text) = scrape(&worker_addr, None);
    assert_eq!(status, 200, "{text}");
    promtool_accepts(&text);
    assert_eq!(sample(&text, write), Some(1.0), "{text}");
    assert!(
        text.contains("warden_store_append_duration_seconds_count"),
        "{text}"
    );
}
