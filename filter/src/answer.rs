//! The check call's answer: a decision, or why there is none and whether that speaks of the
//! service's health.

use sluice_core::wire::CheckResponse;

use crate::host::{call_response_body, call_response_header};
use crate::identity::header_text;

/// The largest check answer read.
const MAX_BODY: usize = 64 * 1024;

/// Why a check call gave no decision.
pub enum Failure {
    /// The service is unwell or unreachable: no answer, a 5xx, a body that is not a check
    /// response. Counts towards the breaker.
    Service(String),
    /// The service answered 4xx: it refused this request, which says nothing of its health
    /// (the filter forwards only what the service accepts, so this is a version skew).
    Request(String),
}

/// The check call's answer, or why there is none.
pub fn read_answer() -> Result<CheckResponse, Failure> {
    match call_response_header(":status").as_deref() {
        None => Err(Failure::Service("no response (timeout or connection failure)".into())),
        Some(b"200") => CheckResponse::from_json(&call_response_body(MAX_BODY)).map_err(|e| Failure::Service(e.0)),
        Some(status) if status.starts_with(b"4") => Err(Failure::Request(format!(
            "status {}: the check service refused the request",
            header_text(status)
        ))),
        Some(status) => Err(Failure::Service(format!("status {}", header_text(status)))),
    }
}
