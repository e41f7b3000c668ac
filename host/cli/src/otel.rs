//! `warden otel export [RUN] [--follow]`: each run's trace, derived from
//! its log by `warden-otel`, sent to an OpenTelemetry collector over
//! OTLP/HTTP (the standard `OTEL_EXPORTER_OTLP_*` variables say where).
//! How far the export got in each run is kept in the store, so a
//! restarted export, or one on another host sharing the store, sends each
//! span once and misses none.
//!
//! Also `warden worker --metrics ADDR`'s endpoint ([`serve_metrics`]):
//! Prometheus text on loopback (`warden serve` serves the same at
//! `/metrics` behind its tokens).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde_json::json;

use super::Context;
use super::errors::CliError;
use super::runs::run_id;
use super::store::Access;
use warden_otel::metrics::{self, Metrics};
use warden_otel::{ContentCapture, DEFAULT_READER, Exporter, OtlpSink};

#[derive(Debug, Subcommand)]
pub(crate) enum OtelCommand {
    /// Send runs' traces to an OpenTelemetry collector (OTLP over HTTP,
    /// protobuf): every run with events not sent yet, or one run; with
    /// --follow, keep sending new events as runs record them. The endpoint
    /// and headers come from OTEL_EXPORTER_OTLP_ENDPOINT (or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and OTEL_EXPORTER_OTLP_HEADERS.
    Export(ExportArgs),
}

/// `warden otel export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Only this run (default: every run with events not sent yet).
    run: Option<String>,
    /// Keep following the store, sending new spans as runs record them,
    /// until SIGTERM or SIGINT.
    #[arg(long, conflicts_with = "run")]
    follow: bool,
    /// With --follow: how often to look for new events.
    #[arg(long, default_value = "1s")]
    interval: String,
    /// The name the export's progress is kept under in the store: one per
    /// backend you send the same runs to.
    #[arg(long, default_value = DEFAULT_READER)]
    reader: String,
    /// Put message content (inputs, prompts the log recorded, answers, tool
    /// arguments and results) into the spans of this agent's runs
    /// (repeatable). Off by default: content can hold anything a model or
    /// tool saw.
    #[arg(long = "content", value_name = "AGENT")]
    content: Vec<String>,
}

pub(crate) async fn run(cmd: OtelCommand, ctx: &Context) -> anyhow::Result<()> {
    let OtelCommand::Export(args) = cmd;
    let stop = if args.follow {
        Some(super::worker::shutdown_signal()?)
    } else {
        None
    };
    let store = super::store::open(&ctx.settings, Access::Write).await?;
    let sink = OtlpSink::from_env().map_err(|e| CliError::new("usage", e.to_string()))?;
    let content = if args.content.is_empty() {
        ContentCapture::Off
    } else {
        ContentCapture::Agents(args.content.into_iter().collect::<BTreeSet<_>>())
    };
    let mut exporter = Exporter::new(store, Arc::new(sink))
        .reader(args.reader)
        .content(content);
    let (runs, spans) = match (&args.run, stop) {
        (Some(run), _) => {
            let run = run_id(run)?;
            (1, exporter.export_run(&run).await?)
        }
        (None, Some(stop)) => {
            let interval = warden::units::parse_duration(&args.interval)
                .map_err(|e| CliError::new("usage", format!("--interval: {e}")))?;
            let report = exporter.follow(interval, stop).await;
            (report.runs, report.spans)
        }
        (None, None) => {
            let report = exporter.export_all().await?;
            (report.runs, report.spans)
        }
    };
    if ctx.json {
        println!("{}", json!({ "runs": runs, "spans": spans }));
    } else if !super::quiet() {
        eprintln!("exported {spans} spans of {runs} runs");
    }
    Ok(())
}

/// Serves `metrics` as `GET /metrics` on `addr` in the background; the
/// address it listens on. Only on loopback: the endpoint has no token
/// (put a proxy with authentication in front of it to reach it from
/// elsewhere, or scrape `warden serve`'s, which checks tokens). Through
/// `warden serve`'s connection layer and `[serve]` limits, so a client
/// that opens connections and sends nothing cannot hold the worker's
/// descriptors.
pub(crate) async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    limits: warden_server::ConnectionLimits,
) -> anyhow::Result<SocketAddr> {
    if !addr.ip().is_loopback() {
        return Err(CliError::new(
            "usage",
            format!(
                "--metrics {addr}: the worker's metrics endpoint has no token, so it listens only on loopback (127.0.0.1 or ::1)"
            ),
        )
        .into());
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::new("io_failed", format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                use axum::response::IntoResponse as _;
                match metrics.render().await {
                    Ok(text) => (
                        [(axum::http::header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
                        text,
                    )
                        .into_response(),
                    Err(error) => (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        format!("cannot read the metrics: {error}\n"),
                    )
                        .into_response(),
                }
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(error) =
            warden_server::serve(listener, app, limits, std::future::pending()).await
        {
            tracing::warn!(%error, "the metrics endpoint stopped");
        }
    });
    Ok(local)
}
