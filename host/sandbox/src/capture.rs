//! Guest stdout, stderr and host-log capture under one byte budget per lease,
//! and redaction of granted secrets from anything the host passes on.
//!
//! Guest output never reaches the host's own stdio: it is kept in memory up
//! to [`Limits::stdio_bytes`](super::Limits::stdio_bytes), the excess is
//! dropped and counted (the guest keeps running), and when the lease ends the
//! kept bytes go to `tracing`, one event per line, tagged with the plugin.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Which guest stream a capture sink receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Default)]
struct Buffers {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    remaining: u64,
    stdout_total: u64,
    stderr_total: u64,
    log_total: u64,
    dropped: u64,
}

/// The capture of one lease: stdout and stderr buffers sharing one budget.
#[derive(Clone, Debug)]
pub(crate) struct Capture {
    buffers: Arc<Mutex<Buffers>>,
}

/// What a lease's guest wrote, after the lease.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) stdout_bytes: u64,
    pub(crate) stderr_bytes: u64,
    pub(crate) log_bytes: u64,
    pub(crate) dropped_bytes: u64,
}

impl Capture {
    pub(crate) fn new(budget: u64) -> Self {
        Capture {
            buffers: Arc::new(Mutex::new(Buffers {
                remaining: budget,
                ..Buffers::default()
            })),
        }
    }

    /// A sink for one of the guest's streams.
    pub(crate) fn sink(&self, stream: Stream) -> CaptureSink {
        CaptureSink {
            stream,
            capture: self.clone(),
        }
    }

    fn write(&self, stream: Stream, bytes: &[u8]) {
        let mut b = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let len = bytes.len() as u64;
        let keep = len.min(b.remaining) as usize;
        b.remaining -= keep as u64;
        b.dropped += len - keep as u64;
        match stream {
            Stream::Stdout => {
                b.stdout_total += len;
                b.stdout.extend_from_slice(&bytes[..keep]);
            }
            Stream::Stderr => {
                b.stderr_total += len;
                b.stderr.extend_from_slice(&bytes[..keep]);
            }
        }
    }

    /// Charges a host-log message to the budget; returns whether it fits.
    pub(crate) fn charge_log(&self, len: usize) -> bool {
        let mut b = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let len = len as u64;
        b.log_total += len;
        if len <= b.remaining {
            b.remaining -= len;
            true
        } else {
            b.dropped += len;
            false
        }
    }

    /// Takes what was captured so far.
    pub(crate) fn take(&self) -> Captured {
        let mut b = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        Captured {
            stdout: std::mem::take(&mut b.stdout),
            stderr: std::mem::take(&mut b.stderr),
            stdout_bytes: b.stdout_total,
            stderr_bytes: b.stderr_total,
            log_bytes: b.log_total,
            dropped_bytes: b.dropped,
        }
    }
}

/// One guest stream writing into a [`Capture`]. Always ready, never fails:
/// bytes past the budget are dropped, so a chatty guest is not killed for it.
#[derive(Clone, Debug)]
pub(crate) struct CaptureSink {
    stream: Stream,
    capture: Capture,
}

/// How much a guest may write per `check-write` permit.
const PERMIT: usize = 64 << 10;

impl OutputStream for CaptureSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.capture.write(self.stream, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CaptureSink {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CaptureSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.capture.write(self.stream, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CaptureSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CaptureSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Secrets shorter than this are not redacted: replacing every `1` or `ab`
/// in a plugin's output would corrupt it while protecting nothing.
pub const MIN_REDACTED_LEN: usize = 4;

/// Replaces the values of granted environment variables with
/// `[redacted:NAME]`: as raw text, in their JSON-escaped form, and after the
/// host's own decoding: a text that is JSON is parsed and every string and
/// key redacted as the host will read it, so `\u` escapes do not carry a
/// secret past it. Encodings a plugin applies itself (base64, reversal,
/// splitting) are beyond any redactor; see docs/security.md.
#[derive(Clone, Debug, Default)]
pub(crate) struct Redactor {
    /// (needle, replacement), longest needle first.
    needles: Vec<(String, String)>,
}

impl Redactor {
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut needles = Vec::new();
        for (name, value) in secrets {
            if value.len() < MIN_REDACTED_LEN {
                continue;
            }
            let replacement = format!("[redacted:{name}]");
            let escaped = serde_json::to_string(value).unwrap_or_default();
            let escaped = &escaped[1..escaped.len().saturating_sub(1).max(1)];
            if escaped != value {
                needles.push((escaped.to_owned(), replacement.clone()));
            }
            needles.push((value.to_owned(), replacement));
        }
        needles.sort_by_key(|(needle, _)| std::cmp::Reverse(needle.len()));
        Redactor { needles }
    }

    /// This redactor and `secrets` too, for a lease that learned of forms
    /// of its secrets the grant could not know (a basic-auth encoding).
    pub(crate) fn with<'a>(&self, secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut needles = self.needles.clone();
        needles.extend(Redactor::new(secrets).needles);
        needles.sort_by_key(|(needle, _)| std::cmp::Reverse(needle.len()));
        needles.dedup();
        Redactor { needles }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Redacts `text` in place: the raw text, then, if it is JSON, what
    /// decoding it yields (re-encoded only when that held a secret).
    pub(crate) fn redact(&self, text: &mut String) {
        if self.needles.is_empty() {
            return;
        }
        self.redact_raw(text);
        let starts_like_json = text.trim_start().starts_with(['{', '[', '"']);
        if starts_like_json
            && let Ok(mut value) = serde_json::from_str::<serde_json::Value>(text)
            && self.redact_value(&mut value)
        {
            *text = value.to_string();
        }
    }

    /// Replaces every needle in `text`; returns whether any was there.
    fn redact_raw(&self, text: &mut String) -> bool {
        let mut changed = false;
        for (needle, replacement) in &self.needles {
            if text.contains(needle.as_str()) {
                *text = text.replace(needle.as_str(), replacement);
                changed = true;
            }
        }
        changed
    }

    /// Redacts every string and key of a decoded value; returns whether
    /// any held a secret.
    fn redact_value(&self, value: &mut serde_json::Value) -> bool {
        use serde_json::Value;
        match value {
            Value::String(s) => self.redact_raw(s),
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |changed, v| self.redact_value(v) | changed),
            Value::Object(map) => {
                let mut changed = false;
                for (mut key, mut v) in std::mem::take(map) {
                    changed |= self.redact_raw(&mut key);
                    changed |= self.redact_value(&mut v);
                    map.insert(key, v);
                }
                changed
            }
            _ => false,
        }
    }

    /// Cuts a trailing beginning of a secret off `text`: what is left when
    /// a secret was cut by a byte budget after redaction could not see it
    /// whole.
    pub(crate) fn cut_partial_tail(&self, text: &mut String) {
        for (needle, _) in &self.needles {
            let longest = needle.len().saturating_sub(1).min(text.len());
            for len in (1..=longest).rev() {
                if needle.is_char_boundary(len) && text.ends_with(&needle[..len]) {
                    text.truncate(text.len() - len);
                    return;
                }
            }
        }
    }

    /// Redacts a copy of `text`.
    pub(crate) fn redacted(&self, text: &str) -> String {
        let mut text = text.to_owned();
        self.redact(&mut text);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_the_budget_and_counts_the_rest() {
        let capture = Capture::new(10);
        let mut out = capture.sink(Stream::Stdout);
        let mut err = capture.sink(Stream::Stderr);
        out.write(Bytes::from_static(b"hello ")).unwrap();
        err.write(Bytes::from_static(b"world!!")).unwrap();
        assert!(!capture.charge_log(5));
        let captured = capture.take();
        assert_eq!(captured.stdout, b"hello ");
        assert_eq!(captured.stderr, b"worl");
        assert_eq!(captured.stdout_bytes, 6);
        assert_eq!(captured.stderr_bytes, 7);
        assert_eq!(captured.log_bytes, 5);
        assert_eq!(captured.dropped_bytes, 3 + 5);
    }

    #[test]
    fn redaction_covers_raw_and_json_escaped_values() {
        let redactor = Redactor::new([("TOKEN", "s3cr\"et"), ("SHORT", "ab")]);
        let mut raw = String::from("token=s3cr\"et ab");
        redactor.redact(&mut raw);
        assert_eq!(raw, "token=[redacted:TOKEN] ab");
        let json = serde_json::json!({ "t": "s3cr\"et" }).to_string();
        assert_eq!(redactor.redacted(&json), r#"{"t":"[redacted:TOKEN]"}"#);
    }

    #[test]
    fn redaction_sees_what_json_decoding_yields_in_strings_and_keys() {
        let redactor = Redactor::new([("TOKEN", "sk-live-0123")]);
        // `\u0073` is `s`: the raw text holds no secret, its decoding does.
        let escaped =
            r#"{"note":"\u0073k-live-0123","\u0073k-live-0123":[1,"x\u0073k-live-0123"]}"#;
        let redacted = redactor.redacted(escaped);
        let value: serde_json::Value = serde_json::from_str(&redacted).unwrap();
        assert!(!value.to_string().contains("sk-live-0123"), "{value}");
        assert_eq!(value["note"], "[redacted:TOKEN]");
        assert_eq!(value["[redacted:TOKEN]"][1], "x[redacted:TOKEN]");
        // JSON without a secret keeps its bytes.
        let clean = r#"{ "b": 1,  "a": "\u0041" }"#;
        assert_eq!(redactor.redacted(clean), clean);
    }

    #[test]
    fn a_secret_cut_at_the_end_leaves_no_prefix() {
        let redactor = Redactor::new([("TOKEN", "abcdefgh")]);
        let mut text = String::from("log: abcdefg");
        redactor.cut_partial_tail(&mut text);
        assert_eq!(text, "log: ");
        let mut text = String::from("log: done");
        redactor.cut_partial_tail(&mut text);
        assert_eq!(text, "log: done");
    }
}
