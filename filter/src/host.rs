//! Host calls. Whatever status a host answers, none of them traps: the filter calls the ABI's
//! imports itself (`abi`), reads each status as a number, and a call that fails is an
//! absent value or a no-op (logged where that matters). (The proxy-wasm SDK's wrappers
//! `panic!` on any status they do not expect, and its context methods unwrap them: the
//! filter does without the SDK, see [`crate::exports`].)
//!
//! The calls out go through [`call`], which remembers each token with the context that
//! dispatched it ([`calling`], set by every callback), so that [`answered`] can tell
//! `proxy_on_http_call_response` whose answer it is. For `proxy_http_call`, Envoy's
//! `Context::httpCall` says `BadArgument` for an unknown cluster, a missing `:method`,
//! `:path` or `:authority` or a negative timeout and `InternalFailure` when the request
//! cannot start; ngx_wasm_module's `dispatch_http_call` says `InternalFailure` or traps.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ptr::{null, null_mut};
use std::time::Duration;

use crate::config::Check;
use crate::header_pairs::HeaderPairs;
use crate::identity::header_text;
use crate::proxy::{LogLevel, Proxy, SharedData};

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
        pub fn proxy_get_header_map_pairs(map: u32, ret_data: *mut *mut u8, ret_size: *mut usize) -> u32;
        pub fn proxy_add_header_map_value(
            map: u32,
            key: *const u8,
            key_size: usize,
            value: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_replace_header_map_value(
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
        pub fn proxy_http_call(
            upstream: *const u8,
            upstream_size: usize,
            headers: *const u8,
            headers_size: usize,
            body: *const u8,
            body_size: usize,
            trailers: *const u8,
            trailers_size: usize,
            timeout_ms: u32,
            ret_token: *mut u32,
        ) -> u32;
        pub fn proxy_set_effective_context(context: u32) -> u32;
        pub fn proxy_get_current_time_nanoseconds(ret_time: *mut u64) -> u32;
        pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
        pub fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, ret_id: *mut u32) -> u32;
        pub fn proxy_increment_metric(id: u32, offset: i64) -> u32;
        pub fn proxy_record_metric(id: u32, value: u64) -> u32;
        pub fn proxy_get_shared_data(
            key: *const u8,
            key_size: usize,
            ret_data: *mut *mut u8,
            ret_size: *mut usize,
            ret_cas: *mut u32,
        ) -> u32;
        pub fn proxy_set_shared_data(
            key: *const u8,
            key_size: usize,
            value: *const u8,
            value_size: usize,
            cas: u32,
        ) -> u32;
    }
}

/// The ABI's statuses the filter names: `Ok`, and the refusals of `proxy_http_call`.
const OK: u32 = 0;
const BAD_ARGUMENT: u32 = 2;
const INTERNAL_FAILURE: u32 = 10;

/// The ABI's header maps (`MapType`), buffers (`BufferType`) and streams (`StreamType`)
/// the filter uses.
const HTTP_REQUEST_HEADERS: u32 = 0;
const HTTP_RESPONSE_HEADERS: u32 = 2;
const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const HTTP_CALL_RESPONSE_BODY: u32 = 4;
const PLUGIN_CONFIGURATION: u32 = 7;
const HTTP_REQUEST: u32 = 0;

/// A metric's kind (the ABI's `MetricType`).
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum MetricType {
    Counter = 0,
    Histogram = 2,
}

/// Runs a host call that hands back bytes: `Some` on `Ok`, `None` on any other status.
fn take_bytes(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut::<u8>(), 0usize);
    LAST_ALLOCATION.set((null_mut(), 0));
    if call(&mut data, &mut size) != OK {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    let (allocated, capacity) = LAST_ALLOCATION.get();
    if size == 0 && data != allocated {
        return Some(Vec::new()); // nothing to read, and nothing of the module's to free
    }
    if data != allocated || size > capacity {
        // Not what the call had the module allocate: reading or freeing it would reach past
        // memory the module gave. Refused (and whatever was allocated is left, not freed
        // with a size it was not made with).
        log(
            LogLevel::Warn,
            &format!(
                "sluice-filter: the host answered {size} bytes at {data:?}, but had the module \
                 allocate {capacity} at {allocated:?}; the answer is refused"
            ),
        );
        return None;
    }
    // SAFETY: `data` is the allocation the host had `proxy_on_memory_allocate` make for this
    // call (`capacity` bytes of `u8`, checked above), it wrote `size` <= `capacity` of
    // them, and they are the module's to free.
    Some(unsafe { Vec::from_raw_parts(data, size, capacity) })
}

thread_local! {
    /// The latest allocation the host had the module make (`proxy_on_memory_allocate`): where,
    /// and how many bytes, so that [`take_bytes`] takes back exactly what was given.
    static LAST_ALLOCATION: Cell<(*mut u8, usize)> = const { Cell::new((null_mut(), 0)) };
}

/// The module's linear memory, in bytes (0 off wasm: the filter's unit tests).
pub fn memory_bytes() -> usize {
    #[cfg(target_arch = "wasm32")]
    return core::arch::wasm32::memory_size(0) * 65_536;
    #[cfg(not(target_arch = "wasm32"))]
    0
}

/// The host had the module allocate `size` bytes at `data` (null: none could be).
pub fn allocated(data: *mut u8, size: usize) {
    LAST_ALLOCATION.set((data, size));
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

fn map_value(map: u32, name: &str) -> Option<Vec<u8>> {
    // SAFETY: `name` is live; the return pointers are `take_bytes`'s locals.
    take_bytes(|data, size| unsafe { abi::proxy_get_header_map_value(map, name.as_ptr(), name.len(), data, size) })
}

/// Request header `name` as text ([`header_text`]); `None` when absent.
pub fn request_header(name: &str) -> Option<String> {
    map_value(HTTP_REQUEST_HEADERS, name).map(|raw| header_text(&raw).into_owned())
}

/// The request's headers, all of them in one call (an empty map when the host gives none).
pub fn request_header_pairs() -> HeaderPairs {
    // SAFETY: the return pointers are `take_bytes`'s locals.
    let bytes = take_bytes(|data, size| unsafe { abi::proxy_get_header_map_pairs(HTTP_REQUEST_HEADERS, data, size) });
    HeaderPairs::from_bytes(bytes.unwrap_or_default())
}

/// Response header `name` as text ([`header_text`]); `None` when absent.
pub fn response_header(name: &str) -> Option<String> {
    map_value(HTTP_RESPONSE_HEADERS, name).map(|raw| header_text(&raw).into_owned())
}

/// Adds a header to the upstream's response.
/// Sets response header `name` to `value`, in place of any it had (added if it had none).
pub fn set_response_header(name: &str, value: &str) {
    let map = HTTP_RESPONSE_HEADERS;
    // SAFETY: pointers and lengths of live strings.
    let status =
        unsafe { abi::proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
    check("a response header", status);
}

pub fn add_response_header(name: &str, value: &str) {
    let map = HTTP_RESPONSE_HEADERS;
    // SAFETY: pointers and lengths of live strings.
    let status =
        unsafe { abi::proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
    check("a response header", status);
}

/// Header `name` of a call's response, as bytes.
pub fn call_response_header(name: &str) -> Option<Vec<u8>> {
    map_value(HTTP_CALL_RESPONSE_HEADERS, name)
}

fn buffer(kind: u32, max: usize) -> Option<Vec<u8>> {
    // SAFETY: the return pointers are `take_bytes`'s locals.
    take_bytes(|data, size| unsafe { abi::proxy_get_buffer_bytes(kind, 0, max, data, size) })
}

/// A call's response body, at most `max` bytes.
pub fn call_response_body(max: usize) -> Vec<u8> {
    buffer(HTTP_CALL_RESPONSE_BODY, max).unwrap_or_default()
}

/// The plugin's configuration, if the host gives one.
pub fn plugin_configuration() -> Option<Vec<u8>> {
    buffer(PLUGIN_CONFIGURATION, usize::MAX)
}

/// Property `path` (NUL-separated segments) as the host gives it; `None` when the host
/// has no such property or refuses.
fn property_bytes(path: &[u8]) -> Option<Vec<u8>> {
    // SAFETY: `path` is live; the return pointers are `take_bytes`'s locals.
    take_bytes(|data, size| unsafe { abi::proxy_get_property(path.as_ptr(), path.len(), data, size) })
}

/// Whether the host is ngx_wasm_module, asked without a sound in either host's log: its
/// `plugin_root_id` is the context's number ("0" for a root), where Envoy's is the
/// plugin's `root_id` name (the examples' "sluice"). Any other property would do worse:
/// ngx_wasm_module logs an `[error]` for a dotted one outside a request and an `[alert]`
/// for `plugin_vm_id`.
pub fn is_ngx_wasm_module() -> bool {
    property(&["plugin_root_id"]).is_some_and(|id| id.bytes().all(|b| b.is_ascii_digit()))
}

/// Property `segments` as text ([`header_text`]): Envoy's dynamic metadata (a string comes
/// as its bytes), an Nginx variable (`["ngx", NAME]`). `None` when absent or empty.
pub fn property(segments: &[&str]) -> Option<String> {
    let path = segments.join("\0");
    let raw = property_bytes(path.as_bytes())?;
    (!raw.is_empty()).then(|| header_text(&raw).into_owned())
}

/// Answers the stream with a local response (the host ends it).
pub fn respond(status: u32, headers: &[(&str, &str)], body: &[u8]) {
    let map = HeaderPairs::of(headers);
    // SAFETY: pointers and lengths of live buffers; no details (null, 0), no gRPC status (-1).
    let result = unsafe {
        abi::proxy_send_local_response(
            status,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            map.bytes().as_ptr(),
            map.bytes().len(),
            -1,
        )
    };
    check("a local response", result);
}

thread_local! {
    /// The context being called back now: the one a call it dispatches answers.
    static CALLING: Cell<u32> = const { Cell::new(0) };
    /// The calls out in flight: each token with the context that dispatched it.
    static CALLS: Cell<BTreeMap<u32, u32>> = const { Cell::new(BTreeMap::new()) };
}

/// Context `id` is being called back: the calls it dispatches are its own.
pub fn calling(id: u32) {
    CALLING.set(id);
}

/// Context `id` is gone: the host cancels its calls (Envoy's context does as it is
/// destroyed) and never answers them, so their tokens are forgotten here too. Else every
/// stream reset while its check is out (a client sending HEADERS then RST_STREAM, in a
/// loop) would leave a token behind, and memory would grow with what clients send.
pub fn forget_calls_of(id: u32) {
    let mut calls = CALLS.take();
    calls.retain(|_, context| *context != id);
    CALLS.set(calls);
}

/// The context whose call `token` was answered, no longer in flight; `None` for a token
/// this module did not dispatch.
pub fn answered(token: u32) -> Option<u32> {
    let mut calls = CALLS.take();
    let context = calls.remove(&token);
    CALLS.set(calls);
    context
}

/// Dispatches `method path` (with a JSON `body`, its credential and `extra` headers) to
/// the check `service` from the context being called, whose callback gets the answer; the
/// call's token, or why it did not go out.
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
    let (headers, trailers) = (HeaderPairs::of(&headers), HeaderPairs::of(&[]));
    let (headers, trailers) = (headers.bytes(), trailers.bytes());
    let upstream = &service.cluster;
    let (body, body_size) = body.map_or((null(), 0), |b| (b.as_ptr(), b.len()));
    let timeout_ms = u32::try_from(timeout_ms).unwrap_or(u32::MAX);
    let mut token = 0u32;
    // SAFETY: pointers and lengths of live buffers; `token` is a live local.
    let status = unsafe {
        abi::proxy_http_call(
            upstream.as_ptr(),
            upstream.len(),
            headers.as_ptr(),
            headers.len(),
            body,
            body_size,
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms,
            &mut token,
        )
    };
    match status {
        OK => {
            let mut calls = CALLS.take();
            calls.insert(token, CALLING.get());
            CALLS.set(calls);
            Ok(token)
        }
        BAD_ARGUMENT => Err("dispatch refused: BadArgument".into()),
        INTERNAL_FAILURE => Err("dispatch refused: InternalFailure".into()),
        other => Err(format!("dispatch refused: status {other}")),
    }
}

/// Tells the host that what the module does next is context `id`'s (a call's answer comes
/// to the module, not to a context); whether the host took it.
pub fn set_effective_context(id: u32) -> bool {
    // SAFETY: no pointers.
    let status = unsafe { abi::proxy_set_effective_context(id) };
    check("the effective context", status);
    status == OK
}

/// Lets a paused request go on.
pub fn resume_request() {
    // SAFETY: no pointers.
    check("resuming the request", unsafe {
        abi::proxy_continue_stream(HTTP_REQUEST)
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

/// Shared data `key` and its CAS; `None` when absent (`NotFound`) or refused.
pub fn shared_get(key: &str) -> Option<(Vec<u8>, u32)> {
    let mut cas = 0u32;
    // SAFETY: `key` is live; the return pointers are `take_bytes`'s locals and `cas` a live
    // local.
    let value =
        take_bytes(|data, size| unsafe { abi::proxy_get_shared_data(key.as_ptr(), key.len(), data, size, &mut cas) })?;
    Some((value, cas))
}

/// Sets shared data `key` to `value` if its CAS is still `cas`; whether the host wrote it
/// (`CasMismatch`, or any refusal, is not).
pub fn shared_set(key: &str, value: &[u8], cas: u32) -> bool {
    // SAFETY: pointers and lengths of live buffers.
    let status = unsafe { abi::proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) };
    status == OK
}

/// The proxy over the proxy-wasm ABI: the context being called is the one answering.
pub struct Abi;

impl Proxy for Abi {
    fn request_header(&self, name: &str) -> Option<String> {
        request_header(name)
    }

    fn request_header_pairs(&self) -> HeaderPairs {
        request_header_pairs()
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

    fn set_response_header(&mut self, name: &str, value: &str) {
        set_response_header(name, value);
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

impl SharedData for Abi {
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        shared_get(key)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> bool {
        shared_set(key, value, cas)
    }
}
