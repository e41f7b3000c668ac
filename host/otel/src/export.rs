//! The [`Exporter`]: follows a store, derives each run's spans from its log
//! and sends the ones not sent yet, remembering in the store how far it got
//! in each run (an export cursor, see `EventStore::export_cursors`).
//!
//! A run is exported in one step: load its log, derive its spans, send
//! those that close after the cursor, then move the cursor to the log's
//! length. The cursor moves only after the sink took the spans, so a crash
//! between the two sends them again, with the same ids (see `ids.rs`),
//! which a backend keeps once; it never loses one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TraceId;
use warden_engine::events::{self, Event};
use warden_store::{EventStore, RunFilter, RunId};

use crate::OtelError;
use crate::ids;
use crate::otlp::SpanSink;
use crate::spans::{self, Placement, SpanOptions};

/// The reader name the exporter's cursors are kept under by default.
pub const DEFAULT_READER: &str = "otel";

/// Which runs' message content goes into their spans. Default: none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ContentCapture {
    /// No run's.
    #[default]
    Off,
    /// The runs of these agents (by name).
    Agents(BTreeSet<String>),
}

/// What one pass exported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Runs whose cursor moved.
    pub runs: usize,
    /// Spans sent.
    pub spans: usize,
}

/// Exports runs' spans from a store to a sink.
pub struct Exporter {
    store: Arc<dyn EventStore>,
    sink: Arc<dyn SpanSink>,
    reader: String,
    content: ContentCapture,
    /// Each run's trace, once found (a child's is its root ancestor's).
    traces: HashMap<RunId, TraceId>,
}

impl Exporter {
    /// An exporter from `store` to `sink`, keeping its cursors as
    /// [`DEFAULT_READER`], capturing no content.
    pub fn new(store: Arc<dyn EventStore>, sink: Arc<dyn SpanSink>) -> Self {
        Exporter {
            store,
            sink,
            reader: DEFAULT_READER.to_owned(),
            content: ContentCapture::Off,
            traces: HashMap::new(),
        }
    }

    /// Keeps its cursors under `reader` (two exporters to two backends
    /// keep two sets). Default: [`DEFAULT_READER`].
    pub fn reader(mut self, reader: impl Into<String>) -> Self {
        self.reader = reader.into();
        self
    }

    /// Captures message content as `content` says. Default: off.
    pub fn content(mut self, content: ContentCapture) -> Self {
        self.content = content;
        self
    }

    /// Exports every run with events beyond its cursor.
    pub async fn export_all(&mut self) -> Result<ExportReport, OtelError> {
        let cursors = self.store.export_cursors(&self.reader).await?;
        let runs = self.store.list(&RunFilter::new()).await?;
        let mut report = ExportReport::default();
        for run in runs {
            let done = cursors.get(&run.run_id).copied().unwrap_or(0);
            if run.event_count > done {
                let sent = self.export_from(&run.run_id, done).await?;
                report.runs += 1;
                report.spans += sent;
            }
        }
        Ok(report)
    }

    /// Exports run `run` from its cursor; how many spans were sent.
    pub async fn export_run(&mut self, run: &RunId) -> Result<usize, OtelError> {
        let cursors = self.store.export_cursors(&self.reader).await?;
        let done = cursors.get(run).copied().unwrap_or(0);
        self.export_from(run, done).await
    }

    /// Exports every run with new events, every `interval`, until `stop`
    /// resolves; a failed pass is logged and tried again at the next tick
    /// (the cursors say where to resume).
    pub async fn follow(
        &mut self,
        interval: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> ExportReport {
        let mut total = ExportReport::default();
        tokio::pin!(stop);
        loop {
            match self.export_all().await {
                Ok(report) => {
                    total.runs += report.runs;
                    total.spans += report.spans;
                }
                Err(error) => tracing::warn!(%error, "exporting spans failed; trying again"),
            }
            tokio::select! {
                () = &mut stop => return total,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    async fn export_from(&mut self, run: &RunId, done: u64) -> Result<usize, OtelError> {
        let log = self.log(run).await?;
        let placement = self.placement(run, &log).await?;
        let options = SpanOptions {
            content: match (&self.content, log.first()) {
                (ContentCapture::Agents(agents), Some(Event::RunStarted(s))) => {
                    agents.contains(&s.agent)
                }
                _ => false,
            },
        };
        let spans: Vec<_> = spans::derive(run, &log, &placement, options)
            .into_iter()
            .filter(|s| s.end_seq > done)
            .map(|s| s.data)
            .collect();
        let sent = spans.len();
        if sent > 0 {
            self.sink.send(spans).await?;
        }
        self.store
            .advance_export_cursor(&self.reader, run, log.len() as u64)
            .await?;
        Ok(sent)
    }

    async fn log(&self, run: &RunId) -> Result<Vec<Event>, OtelError> {
        let stored = self.store.load(run).await?;
        stored
            .iter()
            .map(|e| {
                events::decode(&e.bytes).map_err(|error| OtelError::Decode {
                    run_id: run.clone(),
                    seq: e.seq,
                    reason: error.to_string(),
                })
            })
            .collect()
    }

    /// Where `run`'s spans go: a fork roots its own trace, linked to its
    /// source's run span; a child hangs under its parent's tool call, in
    /// its parent's trace; any other run roots its own.
    async fn placement(&mut self, run: &RunId, log: &[Event]) -> Result<Placement, OtelError> {
        if let Some((source, _)) = spans::fork_of(run, log) {
            let source_trace = self.trace_of(&source).await?;
            let mut placement = Placement::root(run);
            placement
                .links
                .push(spans::context(source_trace, ids::run_span(&source)));
            return Ok(placement);
        }
        match log.first() {
            Some(Event::RunStarted(s)) if s.parent.is_some() => {
                let parent = s.parent.as_ref().expect("checked");
                let parent_run = parent.run_id.clone();
                Ok(Placement {
                    trace_id: self.trace_of(&parent_run).await?,
                    parent: Some(ids::tool_span(&parent_run, parent.call_id.as_str())),
                    links: Vec::new(),
                })
            }
            _ => Ok(Placement::root(run)),
        }
    }

    /// The trace `run`'s spans are in: walks up its parents to the run that
    /// roots the trace (a run started on its own, or a fork).
    async fn trace_of(&mut self, run: &RunId) -> Result<TraceId, OtelError> {
        let mut walked = Vec::new();
        let mut current = run.clone();
        let trace = loop {
            if let Some(trace) = self.traces.get(&current) {
                break *trace;
            }
            walked.push(current.clone());
            let log = match self.log(&current).await {
                Ok(log) => log,
                // A pruned or missing ancestor: the run roots its own trace.
                Err(OtelError::Store { .. }) => break ids::trace_id(&current),
                Err(e) => return Err(e),
            };
            let parent = match (spans::fork_of(&current, &log), log.first()) {
                (Some(_), _) => None,
                (None, Some(Event::RunStarted(s))) => s.parent.as_ref().map(|p| p.run_id.clone()),
                _ => None,
            };
            match parent {
                Some(parent) if !walked.contains(&parent) => current = parent,
                _ => break ids::trace_id(&current),
            }
        };
        for run in walked {
            self.traces.insert(run, trace);
        }
        Ok(trace)
    }

    /// The cursors this exporter keeps, by run.
    pub async fn cursors(&self) -> Result<BTreeMap<RunId, u64>, OtelError> {
        Ok(self.store.export_cursors(&self.reader).await?)
    }
}
