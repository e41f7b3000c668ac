//! `GET /api/v1/runs/{run}/stream`: a run's events as server-sent events,
//! each with its `seq` as the SSE `id` and the event line (`{"v", "seq",
//! "event"}`) as its data. A client that reconnects with `Last-Event-ID:
//! N` (browsers do it themselves) gets every event after N, so nothing is
//! missed or repeated across a dropped connection.
//!
//! The store is the truth: the stream loads what it has not sent from the
//! store, woken by the runtime's subscription when this process appends
//! (a decision made through the API reaches its clients at once) and by a
//! timer for what other processes append (workers, the command line).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use serde_json::Value;

use warden::engine::{RunId, RunUpdates};

use crate::App;
use crate::api::{Params, Segment};
use crate::error::ApiError;

/// The query of the stream.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Start after this position (`Last-Event-ID` wins when both are given).
    after: Option<u64>,
}

struct Cursor {
    app: Arc<App>,
    run: RunId,
    after: u64,
    updates: RunUpdates,
    ready: VecDeque<(u64, Value)>,
    poll: Duration,
    failed: bool,
}

/// The handler.
pub async fn stream(
    State(app): State<Arc<App>>,
    Segment(run): Segment<String>,
    Params(q): Params<StreamQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let run = RunId::new(run).map_err(|e| ApiError::new("invalid_run_id", e.to_string()))?;
    let resume_from = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                ApiError::new(
                    "usage",
                    format!("Last-Event-ID `{v}` is not an event position"),
                )
            })
        })
        .transpose()?;
    let after = resume_from.or(q.after).unwrap_or(0);
    // Subscribed before the first load: nothing appended in between is
    // missed. The run must exist.
    let updates = app.runtime.subscribe(&run);
    app.runtime
        .store()
        .summary(&run)
        .await
        .map_err(|e| app.fail(&e))?;
    let poll = app.poll;
    let cursor = Cursor {
        app,
        run,
        after,
        updates,
        ready: VecDeque::new(),
        poll,
        failed: false,
    };
    let events = futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some((seq, line)) = c.ready.pop_front() {
                let event = SseEvent::default()
                    .id(seq.to_string())
                    .event("event")
                    .data(line.to_string());
                return Some((Ok(event), c));
            }
            if c.failed {
                return None;
            }
            match c.app.event_lines(&c.run, c.after).await {
                Ok(lines) => {
                    for line in lines {
                        let seq = line["seq"].as_u64().unwrap_or(c.after + 1);
                        c.after = seq;
                        c.ready.push_back((seq, line));
                    }
                }
                Err(error) => {
                    // The error is the stream's last event.
                    c.failed = true;
                    let event = SseEvent::default()
                        .event("error")
                        .data(serde_json::to_string(&error.report.details).unwrap_or_default())
                        .comment(error.report.message);
                    return Some((Ok(event), c));
                }
            }
            if !c.ready.is_empty() {
                continue;
            }
            // Woken by an append here, or after the poll interval for
            // appends elsewhere; a runtime that is gone ends the stream.
            if let Ok(None) = tokio::time::timeout(c.poll, c.updates.next()).await {
                return None;
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
