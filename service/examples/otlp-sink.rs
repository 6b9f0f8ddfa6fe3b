//! An OTLP/gRPC trace receiver that counts the spans it gets and keeps none: the far end of
//! `--otlp-endpoint` for benchmarks (scripts/bench-compare's traced row).
//!
//!     cargo run --release -p sluice-service --example otlp-sink -- 127.0.0.1:4317
//!
//! Prints the spans received so far every 10 s while any arrive.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

struct Sink(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = (request.into_inner().resource_spans.iter())
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4317".into())
        .parse()?;
    let count = Arc::new(AtomicU64::new(0));
    let shown = count.clone();
    tokio::spawn(async move {
        let mut last = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let now = shown.load(Ordering::Relaxed);
            if now != last {
                println!("{now} spans received");
                last = now;
            }
        }
    });
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(Sink(count)))
        .serve(addr)
        .await?;
    Ok(())
}
