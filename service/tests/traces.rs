//! Traces of checks as a collector receives them: the `sluice-service` binary with
//! `--otlp-endpoint` sends its spans to an OTLP/gRPC receiver made here from the official
//! protos (opentelemetry-proto), which decodes them. One span per check, HTTP and gRPC, the
//! caller's `traceparent` its parent, with the rule, the decision and the store's time.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_service::grpc::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice_testkit::{free_port, wait_for_port, Child, ScratchDir};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_sluice-service");

/// The receiver: every export request, with the resource's `service.name`.
struct Receiver(mpsc::UnboundedSender<(String, Vec<Span>)>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            let attributes = resource_spans.resource.map(|r| r.attributes).unwrap_or_default();
            let service = text(&attributes, "service.name").unwrap_or_default();
            let spans = resource_spans.scope_spans.into_iter().flat_map(|s| s.spans).collect();
            let _ = self.0.send((service, spans));
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const RULES: &str =
    "[[rule]]\nname = \"per-ip\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n";
const DESCRIPTORS: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      name: per-address\n      unit: minute\n      requests_per_unit: 5\n";

/// Two HTTP checks (allowed, then denied) and a gRPC one, each with a `traceparent` of its
/// own, reach the receiver as three server spans of those traces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_is_one_span_with_its_rule_and_decision_under_the_callers_trace() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = collector.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(collector)),
    );

    let dir = ScratchDir::new("traces");
    std::fs::write(dir.join("rules.toml"), RULES).unwrap();
    std::fs::write(dir.join("edge.yaml"), DESCRIPTORS).unwrap();
    let (port, grpc_port) = (free_port(), free_port());
    let mut node = Child::spawn(
        "sluice-service",
        Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc_port}")])
            .arg("--rules")
            .arg(dir.join("rules.toml"))
            .arg("--descriptors")
            .arg(dir.join("edge.yaml"))
            .args(["--otlp-endpoint", &format!("http://{collector_addr}")])
            .env("OTEL_BSP_SCHEDULE_DELAY", "100"),
    );
    wait_for_port(port, Duration::from_secs(20));
    wait_for_port(grpc_port, Duration::from_secs(20));

    // trace ids: 0a…01 and 0a…02 over HTTP, 0b…03 over gRPC; the callers' span ids 0c…
    let parent = |trace: u8, span: u8| {
        format!(
            "00-{:032x}-{:016x}-01",
            0x0a00 + u32::from(trace),
            0x0c00 + u32::from(span)
        )
    };
    let http = reqwest::Client::new();
    let mut http_decisions = Vec::new();
    for n in 1..=2u8 {
        let answer: serde_json::Value = http
            .post(format!("http://127.0.0.1:{port}/v1/check"))
            .header("traceparent", parent(n, n))
            .body(r#"{"identities": {"ip": "198.51.100.1"}, "method": "GET", "path": "/"}"#)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        http_decisions.push(answer["allowed"].as_bool().unwrap());
    }
    assert_eq!(http_decisions, [true, false], "limit 1: the second check is refused");
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .unwrap();
    let mut call = tonic::Request::new(RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "198.51.100.1".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    });
    call.metadata_mut().insert("traceparent", parent(3, 3).parse().unwrap());
    let code = client.should_rate_limit(call).await.unwrap().into_inner().overall_code;
    assert_eq!(code, Code::Ok as i32);

    // Every span received, by trace id, until the three are in (batches every 100 ms).
    let mut spans: HashMap<String, (String, Span)> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while spans.len() < 3 {
        let (service, batch) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("the receiver got {} spans of 3 in 15 s", spans.len()))
            .unwrap();
        for span in batch {
            let trace = hex(&span.trace_id);
            assert!(
                spans.insert(trace.clone(), (service.clone(), span)).is_none(),
                "two spans of trace {trace}"
            );
        }
    }
    let expected = [
        (1, "http", "per-ip", "allowed"),
        (2, "http", "per-ip", "denied"),
        (3, "grpc", "per-address", "allowed"),
    ];
    for (n, api, rule, decision) in expected {
        let trace = format!("{:032x}", 0x0a00 + n);
        let (service, span) = spans
            .get(&trace)
            .unwrap_or_else(|| panic!("no span of trace {trace}: {spans:?}"));
        assert_eq!(service, "sluice-service");
        assert_eq!(span.name, "check");
        assert_eq!(span.kind, SpanKind::Server as i32);
        assert_eq!(
            hex(&span.parent_span_id),
            format!("{:016x}", 0x0c00 + n),
            "the caller's span is the parent"
        );
        assert_eq!(text(&span.attributes, "sluice.api").as_deref(), Some(api));
        assert_eq!(text(&span.attributes, "sluice.rule").as_deref(), Some(rule), "{trace}");
        assert_eq!(
            text(&span.attributes, "sluice.decision").as_deref(),
            Some(decision),
            "{trace}"
        );
        match attribute(&span.attributes, "sluice.store_us") {
            Some(AnyValue::IntValue(us)) => assert!((0..1_000_000).contains(us), "store time {us} µs"),
            other => panic!("no store time on {trace}: {other:?}"),
        }
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    }
    let stopped = node.stop(Duration::from_secs(5)).expect("the node was running");
    assert!(stopped.status.success() && !stopped.killed, "{stopped:?}");
}
