//! The check call's answer: a decision, or why there is none and whether that speaks of the
//! service's health.

use sluice_core::wire::CheckResponse;

use crate::identity::header_text;
use crate::proxy::Proxy;

/// The largest check answer read.
const MAX_BODY: usize = 64 * 1024;

/// How Envoy's 503 for a call that reached no node begins (Envoy 1.40): a connection
/// refused or reset before headers, or a cluster with no healthy endpoint.
const ENVOY_NO_ANSWER: [&str; 2] = ["upstream connect error", "no healthy upstream"];

/// Why a check call gave no decision.
pub enum Failure {
    /// No node answered: no response at all (a refused or reset connection, or a timeout),
    /// or Envoy's own 503 for a connection refused or reset before the node's headers. Counts
    /// towards the breaker; retried once when it came at once (see `Stream::retry`).
    NoAnswer(String),
    /// The service is unwell or unreachable: no answer, a 5xx, a body that is not a check
    /// response. Counts towards the breaker.
    Service(String),
    /// The service answered 4xx: it refused this request, which says nothing of its health
    /// (the filter forwards only what the service accepts, so this is a version skew).
    Request(String),
}

/// The check call's answer, or why there is none.
pub fn read_answer(proxy: &impl Proxy) -> Result<CheckResponse, Failure> {
    match proxy.call_header(":status").as_deref() {
        None => Err(Failure::NoAnswer("no response (timeout or connection failure)".into())),
        Some(b"503") => {
            let body = proxy.call_body(MAX_BODY);
            let text = header_text(&body);
            if ENVOY_NO_ANSWER.iter().any(|p| text.starts_with(p)) {
                Err(Failure::NoAnswer(format!("no answer from the cluster: {text}")))
            } else {
                Err(Failure::Service("status 503".into()))
            }
        }
        Some(b"200") => CheckResponse::from_json(&proxy.call_body(MAX_BODY)).map_err(|e| Failure::Service(e.0)),
        Some(status) if status.starts_with(b"4") => Err(Failure::Request(format!(
            "status {}: the check service refused the request",
            header_text(status)
        ))),
        Some(status) => Err(Failure::Service(format!("status {}", header_text(status)))),
    }
}
