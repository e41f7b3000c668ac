//! One representative call of each first-party plugin, through the plugin
//! host and a fresh lease each time, as `warden plugin call` would make it:
//! prints the component size, the median and p99 lease time (the receipt's
//! wall time), the median the caller waited (hand-over to the lease's
//! thread and back included), and that median over a no-op tool call's
//! through a fresh lease, measured first in the same run: with no mount
//! (the lease bench's call), and with a mount (a lease with mounts runs on
//! a lease thread of its own, so this is the hand-over's cost).
//!
//! `cargo bench -p warden-tests --bench plugins`. Set `PLUGIN_BENCH_ITERS`
//! to change the number of measured calls (default 500 per plugin, after 50
//! warm-up calls). HTTP calls go to a small server on loopback, granted by
//! address.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden::grant::{Grant, MountGrant};
use warden::plugins::{LoadedPlugin, PluginHost, PluginSource, builtin};
use warden::sandbox::{Access, Capabilities, Limits, Sandbox, SandboxConfig, UsageReceipt, wit};
use warden_tests::guests;

#[path = "table.rs"]
mod table;
use crate::table::Row;

fn main() {
    run();
}

/// Measures and prints; returns each plugin's median for the table.
pub(crate) fn run() -> Vec<Row> {
    let iters: usize = std::env::var("PLUGIN_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(measure(iters))
}

async fn measure(iters: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let cache = tempfile::tempdir().unwrap();
    let host = PluginHost::new(
        Sandbox::new(SandboxConfig {
            cache_dir: Some(cache.path().to_owned()),
            ..SandboxConfig::default()
        })
        .unwrap(),
    );
    let port = hello_server().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.md"), "# Notes\n".repeat(200)).unwrap();
    let mount = |name: &str| {
        let mut g = Grant::default();
        g.mounts.insert(
            name.into(),
            MountGrant {
                dir: dir.path().to_owned(),
                access: None,
                exclude: Vec::new(),
            },
        );
        g
    };
    let mut http = Grant::default();
    http.hosts.push(format!("127.0.0.1:{port}"));
    let mut webhook = http.clone();
    webhook
        .config
        .insert("url".into(), format!("http://127.0.0.1:{port}/hook"));
    let url = format!("http://127.0.0.1:{port}/");

    let noop = noop_leases(host.sandbox(), dir.path(), iters).await;
    println!(
        "  no-op tool call, fresh lease: no mount median {:>8.1} µs; with a mount median {:>8.1} µs",
        noop.0, noop.1
    );
    rows.push(Row::new(
        "plugins",
        "no-op call through a fresh lease with a mount, median".to_owned(),
        format!("{:.1} µs", noop.1),
        "",
        None,
    ));
    println!("one representative call per first-party plugin, fresh lease each ({iters} calls):");
    let call = |tool: &str, args: serde_json::Value| Op::Call(tool.into(), args.to_string());
    let cases: Vec<(&str, Grant, Op)> = vec![
        (
            "fs",
            mount("workspace"),
            call("read_file", json!({"path": "notes.md"})),
        ),
        ("http", http, call("http_get", json!({"url": url}))),
        (
            "files-context",
            mount("files"),
            Op::Resolve(r#"{"paths": ["*.md"]}"#.into()),
        ),
        (
            "notes-memory",
            mount("notes"),
            call("remember", json!({"text": "tea, not coffee"})),
        ),
        ("jsonl-channel", mount("outbox"), Op::Deliver),
        ("webhook-channel", webhook, Op::Deliver),
    ];
    for (name, grant, op) in cases {
        let plugin = host
            .load(&PluginSource::Builtin(name.into()), &grant, Path::new("."))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for _ in 0..50 {
            op.run(&plugin).await;
        }
        let mut times: Vec<u64> = Vec::with_capacity(iters);
        let mut waited: Vec<f64> = Vec::with_capacity(iters);
        for _ in 0..iters {
            let started = std::time::Instant::now();
            times.push(op.run(&plugin).await.wall_time_us);
            waited.push(started.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_unstable();
        let waited = median(waited);
        let size = builtin::find(name).unwrap().wasm.len();
        println!(
            "  {name:<16} {:>6} KiB  {:<26} median {:>8.1} µs  p99 {:>8.1} µs  waited {:>8.1} µs  {:>5.1}× no-op",
            size / 1024,
            op.describe(),
            times[times.len() / 2] as f64,
            times[(times.len() * 99 / 100).min(times.len() - 1)] as f64,
            waited,
            waited / noop.0,
        );
        rows.push(Row::new(
            "plugins",
            format!("{name} {}, fresh lease, median", op.describe()),
            format!("{} µs", times[times.len() / 2]),
            "",
            None,
        ));
    }
    rows
}

/// The median of `samples`.
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The no-op tool call through a fresh lease, as the caller waits for it:
/// the median with no mount, and with `dir` mounted (read-only).
async fn noop_leases(sandbox: &Sandbox, dir: &Path, iters: usize) -> (f64, f64) {
    let wasm = std::fs::read(guests::NOOP).unwrap();
    let component = sandbox.load("noop", &wasm, None).unwrap();
    let call = wit::Call {
        id: "c".into(),
        run_id: "r".into(),
        tool: "noop".into(),
        arguments: "{}".into(),
        idempotency_key: "k".into(),
    };
    let mounted = Capabilities::none()
        .mount("workspace", dir, Access::ReadOnly)
        .unwrap();
    let mut medians = [0.0; 2];
    for (at, capabilities) in [Capabilities::none(), mounted].into_iter().enumerate() {
        let granted = sandbox.grant(&component, capabilities, Limits::default());
        for _ in 0..200 {
            granted.invoke(&call, None).await.result.unwrap().unwrap();
        }
        let mut waited = Vec::with_capacity(iters);
        for _ in 0..iters {
            let started = std::time::Instant::now();
            granted.invoke(&call, None).await.result.unwrap().unwrap();
            waited.push(started.elapsed().as_secs_f64() * 1e6);
        }
        medians[at] = median(waited);
    }
    (medians[0], medians[1])
}

enum Op {
    Call(String, String),
    Resolve(String),
    Deliver,
}

impl Op {
    fn describe(&self) -> String {
        match self {
            Op::Call(tool, _) => format!("call {tool}"),
            Op::Resolve(_) => "resolve".into(),
            Op::Deliver => "deliver".into(),
        }
    }

    async fn run(&self, plugin: &LoadedPlugin) -> UsageReceipt {
        match self {
            Op::Call(tool, arguments) => {
                let call = wit::Call {
                    id: "bench".into(),
                    run_id: "bench".into(),
                    tool: tool.clone(),
                    arguments: arguments.clone(),
                    idempotency_key: "bench-key".into(),
                };
                let leased = plugin.invoke(&call, None).await.unwrap();
                assert!(matches!(leased.result, Ok(Ok(_))), "{:?}", leased.result);
                leased.receipt
            }
            Op::Resolve(query) => {
                let request = wit::ContextRequest {
                    run_id: "bench".into(),
                    query: query.clone(),
                };
                let leased = plugin.resolve(&request, None).await.unwrap();
                assert!(matches!(leased.result, Ok(Ok(_))), "{:?}", leased.result);
                leased.receipt
            }
            Op::Deliver => {
                let delivery = wit::Delivery {
                    id: "bench".into(),
                    run_id: "bench".into(),
                    kind: "completed".into(),
                    payload: r#"{"summary": "done"}"#.into(),
                };
                let leased = plugin.deliver(&delivery, None).await.unwrap();
                assert!(matches!(leased.result, Ok(Ok(()))), "{:?}", leased.result);
                leased.receipt
            }
        }
    }
}

/// A loopback server answering every request with `200 hello`.
async fn hello_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut seen = Vec::new();
                loop {
                    let Ok(n) = stream.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
            });
        }
    });
    port
}
