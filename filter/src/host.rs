//! Host calls on the traffic path: a failing host call is an absent value or a no-op, never
//! a trap (the SDK's context methods unwrap their results; header reads there also unwrap
//! the value's UTF-8).

use std::net::IpAddr;

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::Context;
use proxy_wasm::types::{BufferType, LogLevel, MapType};

use crate::config::IpSource;
use crate::identity::{client_ip, header_text, source_ip};

/// Logs `msg` at `level`.
pub fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// Request header `name` as text ([`header_text`]); `None` when absent.
pub fn request_header(name: &str) -> Option<String> {
    let raw = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name).ok()??;
    Some(header_text(&raw).into_owned())
}

/// Adds a header to the upstream's response.
pub fn add_response_header(name: &str, value: &str) {
    let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value);
}

/// Header `name` of a call's response, as bytes.
pub fn call_response_header(name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, name).ok()?
}

/// A call's response body, at most `max` bytes.
pub fn call_response_body(max: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, max)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The client IP: from the forwarding header with trusted hops, else the connection's.
pub fn request_ip(source: &IpSource) -> Option<IpAddr> {
    let forwarded = request_header(&source.header);
    client_ip(forwarded.as_deref(), source.trusted_hops).or_else(|| {
        let raw = hostcalls::get_property(vec!["source", "address"]).ok()??;
        source_ip(std::str::from_utf8(&raw).ok()?)
    })
}

/// Answers the stream with a local response (the host ends it).
pub fn respond(status: u32, headers: Vec<(&str, &str)>, body: &[u8]) {
    let _ = hostcalls::send_http_response(status, headers, Some(body));
}

/// Dispatches `method path` (with a JSON `body`, and `extra` headers) to the check
/// service's `cluster` from context `ctx`, whose callback gets the answer; the call's token,
/// or why it did not go out.
pub fn call<C: Context + ?Sized>(
    ctx: &C,
    (cluster, authority): (&str, &str),
    (method, path): (&str, &str),
    body: Option<&[u8]>,
    extra: &[(&str, &str)],
    timeout_ms: u64,
) -> Result<u32, String> {
    let mut headers = vec![(":method", method), (":path", path), (":authority", authority)];
    if body.is_some() {
        headers.push(("content-type", "application/json"));
    }
    headers.extend_from_slice(extra);
    ctx.dispatch_http_call(cluster, headers, body, vec![], Duration::from_millis(timeout_ms))
        .map_err(|status| format!("dispatch refused: {status:?}"))
}

/// Lets a paused request go on.
pub fn resume_request() {
    let _ = hostcalls::resume_http_request();
}
