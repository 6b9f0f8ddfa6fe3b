//! Host calls. Whatever status a host answers, none of them traps: the filter calls the ABI's
//! imports itself (`abi`), reads each status as a number, and a call that fails is an
//! absent value or a no-op (logged where that matters). The proxy-wasm SDK's wrappers
//! (`hostcalls::*`) `panic!` on any status they do not expect (its `Status` enum has no
//! `Unimplemented` at all), its context methods unwrap them, and its header reads unwrap the
//! value's UTF-8.
//!
//! One SDK wrapper stays, `dispatch_http_call` ([`call`]): only it registers the call's token
//! with the SDK's dispatcher, whose `proxy_on_http_call_response` panics on a token it does
//! not know. It expects `Ok`, `BadArgument` and `InternalFailure`, and those are all the real
//! hosts answer: Envoy's `Context::httpCall` says `BadArgument` for an unknown cluster, a
//! missing `:method`, `:path` or `:authority` or a negative timeout and `InternalFailure`
//! when the request cannot start; ngx_wasm_module's `dispatch_http_call` says
//! `InternalFailure` or traps; proxy-wasm-cpp-host adds `InvalidMemoryAccess` only for a
//! pointer out of the module's memory, which the SDK never passes.

use std::ptr::{null, null_mut};
use std::time::Duration;

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, StreamType};

use crate::config::Check;
use crate::identity::header_text;
use crate::proxy::Proxy;

/// The ABI 0.2.1 imports the filter calls itself, as the SDK declares them but with the
/// status as a plain number, so that no status a host answers is out of range.
mod abi {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
        pub fn proxy_get_header_map_value(
            map: u32,
            key: *const u8,
            key_size: usize,
            ret_data: *mut *mut u8,
            ret_size: *mut usize,
        ) -> u32;
        pub fn proxy_add_header_map_value(
            map: u32,
            key: *const u8,
            key_size: usize,
            value: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_get_buffer_bytes(
            buffer: u32,
            start: usize,
            max_size: usize,
            ret_data: *mut *mut u8,
            ret_size: *mut usize,
        ) -> u32;
        pub fn proxy_get_property(
            path: *const u8,
            path_size: usize,
            ret_data: *mut *mut u8,
            ret_size: *mut usize,
        ) -> u32;
        pub fn proxy_send_local_response(
            status: u32,
            details: *const u8,
            details_size: usize,
            body: *const u8,
            body_size: usize,
            headers: *const u8,
            headers_size: usize,
            grpc_status: i32,
        ) -> u32;
        pub fn proxy_continue_stream(stream: u32) -> u32;
        pub fn proxy_get_current_time_nanoseconds(ret_time: *mut u64) -> u32;
        pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
        pub fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, ret_id: *mut u32) -> u32;
        pub fn proxy_increment_metric(id: u32, offset: i64) -> u32;
        pub fn proxy_record_metric(id: u32, value: u64) -> u32;
    }
}

/// The ABI's `Ok`.
const OK: u32 = 0;

/// Runs a host call that hands back bytes: `Some` on `Ok`, `None` on any other status.
fn take_bytes(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut::<u8>(), 0usize);
    if call(&mut data, &mut size) != OK {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: on `Ok` the host allocated `size` bytes at `data` with the module's
    // `proxy_on_memory_allocate` (the SDK's: a boxed slice of exactly `size`), and they are
    // the module's to free, as the SDK's wrappers take them.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// Logs that the host refused `what` (status `status`), unless it answered `Ok`.
fn check(what: &str, status: u32) {
    if status != OK {
        log(
            LogLevel::Warn,
            &format!("sluice-filter: the host refused {what} (status {status})"),
        );
    }
}

/// Logs `msg` at `level`.
pub fn log(level: LogLevel, msg: &str) {
    // SAFETY: a pointer and length of a live string.
    unsafe { abi::proxy_log(level as u32, msg.as_ptr(), msg.len()) };
}

fn map_value(map: MapType, name: &str) -> Option<Vec<u8>> {
    // SAFETY: `name` is live; the return pointers are `take_bytes`'s locals.
    take_bytes(|data, size| unsafe {
        abi::proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), data, size)
    })
}

/// Request header `name` as text ([`header_text`]); `None` when absent.
pub fn request_header(name: &str) -> Option<String> {
    map_value(MapType::HttpRequestHeaders, name).map(|raw| header_text(&raw).into_owned())
}

/// Response header `name` as text ([`header_text`]); `None` when absent.
pub fn response_header(name: &str) -> Option<String> {
    map_value(MapType::HttpResponseHeaders, name).map(|raw| header_text(&raw).into_owned())
}

/// Adds a header to the upstream's response.
pub fn add_response_header(name: &str, value: &str) {
    let map = MapType::HttpResponseHeaders as u32;
    // SAFETY: pointers and lengths of live strings.
    let status =
        unsafe { abi::proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
    check("a response header", status);
}

/// Header `name` of a call's response, as bytes.
pub fn call_response_header(name: &str) -> Option<Vec<u8>> {
    map_value(MapType::HttpCallResponseHeaders, name)
}

fn buffer(kind: BufferType, max: usize) -> Option<Vec<u8>> {
    // SAFETY: the return pointers are `take_bytes`'s locals.
    take_bytes(|data, size| unsafe { abi::proxy_get_buffer_bytes(kind as u32, 0, max, data, size) })
}

/// A call's response body, at most `max` bytes.
pub fn call_response_body(max: usize) -> Vec<u8> {
    buffer(BufferType::HttpCallResponseBody, max).unwrap_or_default()
}

/// The plugin's configuration, if the host gives one.
pub fn plugin_configuration() -> Option<Vec<u8>> {
    buffer(BufferType::PluginConfiguration, usize::MAX)
}

/// Property `path` (NUL-separated segments) as the host gives it; `None` when the host
/// has no such property or refuses.
fn property_bytes(path: &[u8]) -> Option<Vec<u8>> {
    // SAFETY: `path` is live; the return pointers are `take_bytes`'s locals.
    take_bytes(|data, size| unsafe { abi::proxy_get_property(path.as_ptr(), path.len(), data, size) })
}

/// Property `segments` as text ([`header_text`]): Envoy's dynamic metadata (a string comes
/// as its bytes), an Nginx variable (`["ngx", NAME]`). `None` when absent or empty.
pub fn property(segments: &[&str]) -> Option<String> {
    let path = segments.join("\0");
    let raw = property_bytes(path.as_bytes())?;
    (!raw.is_empty()).then(|| header_text(&raw).into_owned())
}

/// `pairs` as the ABI's header map: their count, each name's and value's size, then each
/// name and value followed by a NUL.
fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let size = |s: &str| (s.len() as u32).to_le_bytes();
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (name, value) in pairs {
        out.extend_from_slice(&size(name));
        out.extend_from_slice(&size(value));
    }
    for (name, value) in pairs {
        for s in [name, value] {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
    }
    out
}

/// Answers the stream with a local response (the host ends it).
pub fn respond(status: u32, headers: &[(&str, &str)], body: &[u8]) {
    let map = serialize_map(headers);
    // SAFETY: pointers and lengths of live buffers; no details (null, 0), no gRPC status (-1).
    let result = unsafe {
        abi::proxy_send_local_response(
            status,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    };
    check("a local response", result);
}

/// Dispatches `method path` (with a JSON `body`, its credential and `extra` headers) to
/// the check `service` from the context being called, whose callback gets the answer; the call's token,
/// or why it did not go out. The SDK's call: see the module's documentation.
pub fn call(
    service: &Check,
    (method, path): (&str, &str),
    body: Option<&[u8]>,
    extra: &[(&str, &str)],
    timeout_ms: u64,
) -> Result<u32, String> {
    let mut headers = vec![(":method", method), (":path", path), (":authority", &service.authority)];
    if body.is_some() {
        headers.push(("content-type", "application/json"));
    }
    let credential = service.credential();
    if let Some((name, value)) = &credential {
        headers.push((name, value));
    }
    headers.extend_from_slice(extra);
    proxy_wasm::hostcalls::dispatch_http_call(
        &service.cluster,
        headers,
        body,
        vec![],
        Duration::from_millis(timeout_ms),
    )
    .map_err(|status| format!("dispatch refused: {status:?}"))
}

/// Lets a paused request go on.
pub fn resume_request() {
    // SAFETY: no pointers.
    check("resuming the request", unsafe {
        abi::proxy_continue_stream(StreamType::HttpRequest as u32)
    });
}

/// The host clock in ns since the unix epoch, if the host gives it.
pub fn now_ns() -> Option<u64> {
    let mut ns = 0u64;
    // SAFETY: `ns` is a live local.
    (unsafe { abi::proxy_get_current_time_nanoseconds(&mut ns) } == OK).then_some(ns)
}

/// Asks for the root's `on_tick` every `period` (root context only on ngx_wasm_module).
pub fn set_tick_period(period: Duration) {
    let ms = u32::try_from(period.as_millis()).unwrap_or(u32::MAX);
    // SAFETY: no pointers.
    check("the tick period", unsafe {
        abi::proxy_set_tick_period_milliseconds(ms)
    });
}

/// Defines a metric; its id, or 0 when the host refuses.
pub fn define_metric(kind: MetricType, name: &str) -> u32 {
    let mut id = 0u32;
    // SAFETY: `name` is live; `id` is a live local.
    let status = unsafe { abi::proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) };
    if status == OK {
        id
    } else {
        0
    }
}

/// Adds `offset` to counter `id`; a refusal is ignored (metrics never fail a request).
pub fn increment_metric(id: u32, offset: i64) {
    // SAFETY: no pointers.
    unsafe { abi::proxy_increment_metric(id, offset) };
}

/// Records `value` in histogram `id`; a refusal is ignored.
pub fn record_metric(id: u32, value: u64) {
    // SAFETY: no pointers.
    unsafe { abi::proxy_record_metric(id, value) };
}

/// The proxy over the proxy-wasm ABI: the context being called is the one answering.
pub struct Abi;

impl Proxy for Abi {
    fn request_header(&self, name: &str) -> Option<String> {
        request_header(name)
    }

    fn response_header(&self, name: &str) -> Option<String> {
        response_header(name)
    }

    fn property(&self, segments: &[&str]) -> Option<String> {
        property(segments)
    }

    fn add_response_header(&mut self, name: &str, value: &str) {
        add_response_header(name, value);
    }

    fn respond(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) {
        respond(status, headers, body);
    }

    fn call(
        &mut self,
        service: &Check,
        request: (&str, &str),
        body: Option<&[u8]>,
        extra: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, String> {
        call(service, request, body, extra, timeout_ms)
    }

    fn call_header(&self, name: &str) -> Option<Vec<u8>> {
        call_response_header(name)
    }

    fn call_body(&self, max: usize) -> Vec<u8> {
        call_response_body(max)
    }

    fn log(&self, level: LogLevel, msg: &str) {
        log(level, msg);
    }

    fn count(&mut self, id: u32, n: u64) {
        if id != 0 && n > 0 {
            increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn record(&mut self, id: u32, value: u64) {
        if id != 0 {
            record_metric(id, value);
        }
    }
}
