//! Traces of checks (OpenTelemetry), off unless an OTLP endpoint is configured.
//!
//! One span per check, `check`, of kind server, child of the caller's W3C `traceparent`
//! (an HTTP header, or gRPC metadata) when it sends one. Its attributes: the API, the rule
//! whose answer was given (`sluice.rule`), the decision (`sluice.decision`: `allowed` or
//! `denied`) and the store's time (`sluice.store_us`, absent when no store call was made).
//! No identity is recorded: a trace backend is not the place for clients' addresses and keys.
//! The OpenTelemetry SDK batches the spans and exports them over OTLP/gRPC from a thread of
//! its own; when tracing is off, a check pays one branch.

use std::future::Future;
use std::time::Duration;

use opentelemetry::context::FutureExt;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

/// Where the spans of checks go: nowhere ([`Traces::off`], the default) or to an OTLP
/// endpoint ([`otlp`]).
#[derive(Debug, Clone, Default)]
pub struct Traces(Option<SdkTracer>);

/// The exporting half of [`otlp`]: flush and stop it when the node stops.
#[derive(Debug)]
pub struct Exporting(SdkTracerProvider);

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {reason} (give an OTLP/gRPC endpoint such as http://127.0.0.1:4317)")]
pub struct TraceError {
    endpoint: String,
    reason: String,
}

/// Traces exported in batches to the OTLP/gRPC `endpoint` (`http://host:4317`), each span
/// naming the service `sluice-service` and the node `node_name`. Must run inside the tokio
/// runtime that will carry the exports.
pub fn otlp(endpoint: &str, node_name: &str) -> Result<(Traces, Exporting), TraceError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| TraceError {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| TraceError {
        endpoint: endpoint.to_owned(),
        reason: e.to_string(),
    })?;
    let resource = Resource::builder()
        .with_service_name("sluice-service")
        .with_attribute(KeyValue::new("service.instance.id", node_name.to_owned()))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(OnRuntime {
            inner: exporter,
            runtime,
        })
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sluice-service");
    Ok((Traces(Some(tracer)), Exporting(provider)))
}

impl Traces {
    /// No tracing.
    pub fn off() -> Traces {
        Traces(None)
    }

    /// Whether checks are traced.
    pub fn on(&self) -> bool {
        self.0.is_some()
    }

    /// A check's span begun, as the child of the `traceparent` in `carrier` if any; `None`
    /// when tracing is off. Run the check [`within`] it, then [`finish`] it.
    pub fn start(&self, api: &'static str, carrier: &dyn Extractor) -> Option<Context> {
        let tracer = self.0.as_ref()?;
        let parent = TraceContextPropagator::new().extract(carrier);
        let span = tracer
            .span_builder("check")
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("sluice.api", api)])
            .start_with_context(tracer, &parent);
        Some(parent.with_span(span))
    }
}

/// `check` run with `span` as the current context (for [`store_time`]), or as it is when
/// tracing is off.
pub async fn within<F: Future>(span: Option<&Context>, check: F) -> F::Output {
    match span {
        Some(cx) => check.with_context(cx.clone()).await,
        None => check.await,
    }
}

/// Ends a check's span with the rule whose answer was given and the decision.
pub fn finish(span: Option<Context>, rule: Option<&str>, allowed: bool) {
    let Some(cx) = span else { return };
    let span = cx.span();
    if let Some(rule) = rule {
        span.set_attribute(KeyValue::new("sluice.rule", rule.to_owned()));
    }
    span.set_attribute(KeyValue::new(
        "sluice.decision",
        if allowed { "allowed" } else { "denied" },
    ));
    span.end();
}

/// Records the store's time on the current check's span, if it is traced.
pub fn store_time(elapsed: Duration) {
    let cx = Context::current();
    let span = cx.span();
    if span.is_recording() {
        let micros = i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX);
        span.set_attribute(KeyValue::new("sluice.store_us", micros));
    }
}

impl Exporting {
    /// Exports what is left and stops. Blocks until then (at most the export timeout).
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "traces not all exported at shutdown");
        }
    }
}

/// The OTLP exporter, run on the node's tokio runtime from the SDK's export thread (tonic
/// needs a runtime's reactor, which that plain thread lacks).
#[derive(Debug)]
struct OnRuntime {
    inner: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        // The SDK calls this from its own thread, never from the runtime's.
        std::future::ready(self.runtime.block_on(self.inner.export(batch)))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An HTTP request's headers, read for `traceparent`.
pub struct HttpHeaders<'a>(pub &'a axum::http::HeaderMap);

impl Extractor for HttpHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// A gRPC call's metadata, read for `traceparent`.
pub struct GrpcMetadata<'a>(pub &'a tonic::metadata::MetadataMap);

impl Extractor for GrpcMetadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
