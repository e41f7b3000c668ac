//! OpenTelemetry traces and Prometheus metrics derived from Warden's run
//! logs.
//!
//! A run's log is its truth, so its trace is read from the log, never from
//! live code paths: exporting costs a run nothing, a crash loses no span,
//! and any host can export any run. Where to look:
//! - [`spans`]: the spans of one log (pure): which spans, their GenAI
//!   attributes, where each closes;
//! - `ids.rs`: trace and span ids derived from the run id and the log's
//!   positions and call ids, so a run exported twice, after a crash or from
//!   another host has the same ids;
//! - [`Exporter`]: follows a store and sends each run's new spans, keeping
//!   how far it got in the store (`EventStore::export_cursors`);
//! - [`OtlpSink`]: OTLP over HTTP (protobuf) through the official
//!   OpenTelemetry exporter, configured by the standard
//!   `OTEL_EXPORTER_OTLP_*` variables.
//!
//! - [`metrics`]: Prometheus metrics read from the store the same way,
//!   rendered for a `/metrics` endpoint, and the store wrapper that
//!   measures append latency.
//!
//! Message content is off by default and captured only for the agents the
//! operator names ([`ContentCapture`]).

mod export;
pub mod ids;
pub mod metrics;
mod otlp;
pub mod spans;

pub use export::{ContentCapture, DEFAULT_READER, ExportReport, Exporter};
pub use otlp::{OtlpSink, SpanSink};
pub use spans::{DerivedSpan, Placement, SpanOptions};

use warden_store::{RunId, StoreError};

/// Exporting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// The store failed (reading a log or a cursor, or moving one).
    #[error("{error}")]
    Store {
        /// The store's error.
        error: StoreError,
    },
    /// An event of a run cannot be read.
    #[error("run {run_id}: event {seq} cannot be read: {reason}")]
    Decode {
        /// The run.
        run_id: RunId,
        /// The event's position.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// The exporter's configuration (the `OTEL_EXPORTER_OTLP_*` variables)
    /// is not usable.
    #[error(
        "the OTLP exporter cannot be configured: {reason}; check the OTEL_EXPORTER_OTLP_* variables"
    )]
    Config {
        /// Why.
        reason: String,
    },
    /// The collector did not take the spans; nothing was marked exported,
    /// so the next pass sends them again.
    #[error(
        "sending {spans} spans failed: {reason}; check that the collector at OTEL_EXPORTER_OTLP_ENDPOINT is up"
    )]
    Send {
        /// How many.
        spans: usize,
        /// Why.
        reason: String,
    },
}

impl From<StoreError> for OtelError {
    fn from(error: StoreError) -> Self {
        OtelError::Store { error }
    }
}
