//! Where spans go: a [`SpanSink`], and the one that sends them over
//! OTLP/HTTP with protobuf bodies ([`OtlpSink`]) through the official
//! exporter, configured by the standard `OTEL_EXPORTER_OTLP_*` variables
//! and sent on the host's one HTTP client (the providers'), so TLS is the
//! host's TLS.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use crate::OtelError;

/// Takes spans. [`Exporter`](crate::Exporter) moves a run's cursor on
/// only once `send` returned `Ok`.
#[async_trait]
pub trait SpanSink: Send + Sync {
    /// Sends `spans`, all or nothing as far as the sink can tell.
    async fn send(&self, spans: Vec<SpanData>) -> Result<(), OtelError>;
}

/// How long one OTLP request may take unless `OTEL_EXPORTER_OTLP_TIMEOUT`
/// says otherwise (the exporter reads it; this bounds the socket too).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of a collector's answer read.
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// The providers' pooled HTTP client, as the OTLP exporter's client.
#[derive(Debug, Default)]
struct HostHttp {
    client: warden_providers::HttpClient,
}

#[async_trait]
impl HttpClient for HostHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .client
            .post_whole(
                &parts.uri,
                &parts.headers,
                body,
                REQUEST_TIMEOUT,
                MAX_RESPONSE,
            )
            .await?;
        Ok(response)
    }
}

/// Spans sent over OTLP/HTTP (protobuf) to the endpoint the standard
/// variables name: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces`, else
/// `http://localhost:4318/v1/traces`; headers from
/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS`;
/// the resource from `OTEL_SERVICE_NAME` (default `warden`) and
/// `OTEL_RESOURCE_ATTRIBUTES`.
#[derive(Debug)]
pub struct OtlpSink {
    exporter: opentelemetry_otlp::SpanExporter,
}

impl OtlpSink {
    /// The sink the environment configures.
    pub fn from_env() -> Result<Self, OtelError> {
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(HostHttp::default())
            .build()
            .map_err(|e| OtelError::Config {
                reason: e.to_string(),
            })?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("warden");
        }
        exporter.set_resource(&resource.build());
        Ok(OtlpSink { exporter })
    }
}

#[async_trait]
impl SpanSink for OtlpSink {
    async fn send(&self, spans: Vec<SpanData>) -> Result<(), OtelError> {
        let count = spans.len();
        self.exporter
            .export(spans)
            .await
            .map_err(|e| OtelError::Send {
                spans: count,
                reason: e.to_string(),
            })
    }
}
