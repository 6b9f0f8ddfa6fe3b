//! The proxy-wasm ABI 0.2.1: the callbacks the host calls (each the no-op module's default
//! but where the priced calls are made) and the host functions priced.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::kind::{Kind, Phase};

mod host {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
        pub fn proxy_get_buffer_bytes(
            buffer: u32,
            start: usize,
            max: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
        pub fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
        pub fn proxy_get_header_map_value(
            map: u32,
            key: *const u8,
            key_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
        pub fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
        pub fn proxy_add_header_map_value(
            map: u32,
            key: *const u8,
            key_size: usize,
            value: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_get_property(path: *const u8, path_size: usize, data: *mut *mut u8, size: *mut usize) -> u32;
        pub fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
        pub fn proxy_increment_metric(id: u32, offset: i64) -> u32;
        pub fn proxy_get_shared_data(
            key: *const u8,
            key_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
            cas: *mut u32,
        ) -> u32;
        pub fn proxy_set_shared_data(key: *const u8, key_size: usize, value: *const u8, size: usize, cas: u32) -> u32;
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
            token: *mut u32,
        ) -> u32;
        pub fn proxy_set_effective_context(id: u32) -> u32;
        pub fn proxy_continue_stream(stream: u32) -> u32;
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
    }
}

/// `Continue` and `Pause` (the ABI's `Action`).
const CONTINUE: u32 = 0;
const PAUSE: u32 = 1;
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const HTTP_CALL_RESPONSE_BODY: u32 = 4;
const PLUGIN_CONFIGURATION: u32 = 7;
const LOG_DEBUG: u32 = 1;
const LOG_ERROR: u32 = 4;
const COUNTER: u32 = 0;

/// The configuration: the kind, K, and the counter `metric` increments.
static KIND: AtomicU32 = AtomicU32::new(0);
static COUNT: AtomicU32 = AtomicU32::new(0);
static METRIC: AtomicU32 = AtomicU32::new(0);

const SOURCE_ADDRESS: &[u8] = b"source\0address";
const JWT_CLAIM: &[u8] = b"metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0jwt_payload\0sub";
/// Under `sluice/`, as the filter's keys are: ngx_wasm_module keeps them in its `shm_kv
/// sluice` zone.
const SHARED_KEY: &[u8] = b"sluice/price";

/// What `compute` hashes, and where its result goes (so that it is not optimised away).
static INPUT: [u8; 64] = [0x5a; 64];
static SINK: AtomicU32 = AtomicU32::new(0);

/// FNV-1a over `bytes`, through a black box so that each round is really computed.
fn fnv1a(bytes: &[u8]) -> u32 {
    std::hint::black_box(bytes)
        .iter()
        .fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// Memory the host fills: `size` bytes, given back by [`free`].
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    match Layout::from_size_align(size.max(1), 1) {
        // SAFETY: the layout's size is not zero.
        Ok(layout) => unsafe { std::alloc::alloc(layout) },
        Err(_) => std::ptr::null_mut(),
    }
}

/// Gives back what the host handed over in memory from [`proxy_on_memory_allocate`].
fn free(data: *mut u8, size: usize) {
    if data.is_null() {
        return;
    }
    if let Ok(layout) = Layout::from_size_align(size.max(1), 1) {
        // SAFETY: `data` came from `proxy_on_memory_allocate(size)`, which used this layout.
        unsafe { std::alloc::dealloc(data, layout) }
    }
}

fn log(level: u32, message: &str) {
    // SAFETY: the message's pointer and length are valid for the call.
    unsafe { host::proxy_log(level, message.as_ptr(), message.len()) };
}

/// One call of `kind`.
fn call(kind: Kind) {
    let (mut data, mut size, mut cas) = (std::ptr::null_mut(), 0usize, 0u32);
    // SAFETY: every pointer is to a valid local or a constant, for the call's duration; what
    // the host returns in memory is freed below.
    unsafe {
        match kind {
            Kind::Clock => {
                let mut now = 0u64;
                host::proxy_get_current_time_nanoseconds(&mut now);
            }
            Kind::Header => {
                host::proxy_get_header_map_value(REQUEST_HEADERS, b":path".as_ptr(), 5, &mut data, &mut size);
            }
            Kind::HeaderMiss => {
                host::proxy_get_header_map_value(REQUEST_HEADERS, b"x-api-key".as_ptr(), 9, &mut data, &mut size);
            }
            Kind::HeaderMap => {
                host::proxy_get_header_map_pairs(REQUEST_HEADERS, &mut data, &mut size);
            }
            Kind::Property => {
                host::proxy_get_property(SOURCE_ADDRESS.as_ptr(), SOURCE_ADDRESS.len(), &mut data, &mut size);
            }
            Kind::PropertyMiss => {
                host::proxy_get_property(JWT_CLAIM.as_ptr(), JWT_CLAIM.len(), &mut data, &mut size);
            }
            Kind::Metric => {
                host::proxy_increment_metric(METRIC.load(Ordering::Relaxed), 1);
            }
            Kind::SharedGet => {
                host::proxy_get_shared_data(SHARED_KEY.as_ptr(), SHARED_KEY.len(), &mut data, &mut size, &mut cas);
            }
            Kind::SharedCas => {
                host::proxy_get_shared_data(SHARED_KEY.as_ptr(), SHARED_KEY.len(), &mut data, &mut size, &mut cas);
                let value = [7u8; 16];
                host::proxy_set_shared_data(SHARED_KEY.as_ptr(), SHARED_KEY.len(), value.as_ptr(), value.len(), cas);
            }
            Kind::AddHeader => {
                host::proxy_add_header_map_value(RESPONSE_HEADERS, b"x-price".as_ptr(), 7, b"1".as_ptr(), 1);
            }
            Kind::Log => log(LOG_DEBUG, "sluice-price"),
            Kind::LocalReply => {
                host::proxy_send_local_response(429, std::ptr::null(), 0, std::ptr::null(), 0, std::ptr::null(), 0, -1);
            }
            Kind::Compute => {
                SINK.fetch_xor(fnv1a(&INPUT), Ordering::Relaxed);
            }
            Kind::Copy => {
                let mut to = [0u8; 64];
                let len = std::hint::black_box(24usize).min(to.len());
                to[..len].copy_from_slice(&INPUT[..len]);
                SINK.fetch_xor(u32::from(std::hint::black_box(&to)[3]), Ordering::Relaxed);
            }
            Kind::LeasedPath | Kind::LeanPath | Kind::Call | Kind::CallCheck | Kind::CheckPath => {}
            Kind::ClockEach => call(Kind::Clock),
        }
    }
    free(data, size);
}

/// A host call that hands back `size` bytes at `data` on success, freed at once.
fn returned(call: impl FnOnce(&mut *mut u8, &mut usize) -> u32) {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    call(&mut data, &mut size);
    free(data, size);
}

/// A slot's update by compare-and-swap: read, then written back with a `len`-byte value.
fn slot_update(key: &[u8], len: usize) {
    let mut cas = 0u32;
    // SAFETY: pointers to valid locals and constants, for the calls' duration.
    returned(|data, size| unsafe { host::proxy_get_shared_data(key.as_ptr(), key.len(), data, size, &mut cas) });
    let value = [7u8; 185];
    let len = len.min(value.len());
    // SAFETY: as above.
    unsafe { host::proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), len, cas) };
}

/// The prefilter's update of a client's two slots (filter/src/slots.rs): both read, then both
/// written with their CAS.
fn pair_update(a: &[u8], b: &[u8], len: usize) {
    let (mut cas_a, mut cas_b) = (0u32, 0u32);
    // SAFETY: pointers to valid locals and constants, for the calls' duration.
    returned(|data, size| unsafe { host::proxy_get_shared_data(a.as_ptr(), a.len(), data, size, &mut cas_a) });
    // SAFETY: as above.
    returned(|data, size| unsafe { host::proxy_get_shared_data(b.as_ptr(), b.len(), data, size, &mut cas_b) });
    let value = [7u8; 64];
    let len = len.min(value.len());
    for (key, cas) in [(a, cas_a), (b, cas_b)] {
        // SAFETY: as above.
        unsafe { host::proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), len, cas) };
    }
}

/// The filter's leased request, its request headers' calls (`docs/filter.md`, "Host calls a
/// request costs"): the clock, the client's address, two JWT claims and the API key that
/// are not there, `origin` (not there either), the quota's slot read and written, three
/// counters. The local prefilter's token is in hand (no call); the rule names no method,
/// path or host (none read).
fn leased_request() {
    example_identities();
    lean_tail();
}

/// What every request of the example's begins with: the clock, the client's address, two
/// JWT claims and the API key that are not there, `origin` (not there either).
fn example_identities() {
    call(Kind::Clock);
    call(Kind::Property);
    call(Kind::PropertyMiss);
    call(Kind::PropertyMiss);
    call(Kind::HeaderMiss);
    call(Kind::HeaderMiss);
}

/// The leanest leased request's calls: the clock, the client's address, `origin`, then what
/// every leased request ends with.
fn lean_request() {
    call(Kind::Clock);
    call(Kind::Property);
    call(Kind::HeaderMiss);
    lean_tail();
}

/// The quota's slot read and written, and three counters (allowed, leased, units spent).
fn lean_tail() {
    slot_update(b"sluice/price-q", 185);
    for _ in 0..3 {
        call(Kind::Metric);
    }
}

/// The filter's leased request, its response headers' calls: five headers added.
fn leased_response() {
    let headers: [(&[u8], &[u8]); 5] = [
        (b"x-ratelimit-limit", b"50000000"),
        (b"x-ratelimit-remaining", b"49999999"),
        (b"x-ratelimit-reset", b"60"),
        (b"ratelimit-policy", b"\"per-ip\";q=50000000;w=60"),
        (b"ratelimit", b"\"per-ip\";r=49999999;t=60"),
    ];
    for (name, value) in headers {
        // SAFETY: pointers to valid constants, for the call's duration.
        unsafe {
            host::proxy_add_header_map_value(RESPONSE_HEADERS, name.as_ptr(), name.len(), value.as_ptr(), value.len())
        };
    }
}

/// The filter's checked request, its request headers' calls before the check goes out: the
/// clock, the client's address, two JWT claims, the API key and `origin` that are not there,
/// the prefilter's two slots read and written (no tokens in hand), the breaker's slot read, then
/// the request's headers in one map for its method, path and host.
fn check_request() {
    example_identities();
    pair_update(b"sluice/price-b0", b"sluice/price-b1", 40);
    call(Kind::SharedGet);
    call(Kind::HeaderMap);
}

/// The configured calls, if `phase` is where they are made; whether a local reply was sent.
fn calls_in(phase: Phase) -> bool {
    let kind = Kind::from_index(KIND.load(Ordering::Relaxed));
    let count = COUNT.load(Ordering::Relaxed);
    if !kind.calls_in(phase) {
        return false;
    }
    for _ in 0..count {
        match (kind, phase) {
            (Kind::LeasedPath, Phase::Request) => leased_request(),
            (Kind::LeasedPath, Phase::Response) => leased_response(),
            (Kind::LeanPath, Phase::Request) => lean_request(),
            (Kind::LeanPath, Phase::Response) => {}
            // The check's call and its answer's calls are made around them.
            (Kind::CheckPath, Phase::Request) => check_request(),
            (Kind::CheckPath, Phase::Response) => leased_response(),
            _ => call(kind),
        }
    }
    kind == Kind::LocalReply && count > 0
}

/// The module's start (a WASI reactor's): its static constructors.
#[no_mangle]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    {
        extern "C" {
            fn __wasm_call_ctors();
        }
        // SAFETY: the linker's function, called once, first, as a reactor's `_initialize` does.
        unsafe { __wasm_call_ctors() }
    }
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_id: u32, _root_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_id: u32, _vm_configuration_size: usize) -> bool {
    true
}

/// Reads `KIND K`; a configuration it cannot read fails the plugin, with the reason logged.
#[no_mangle]
pub extern "C" fn proxy_on_configure(_id: u32, size: usize) -> bool {
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the out-pointers are valid locals; the host fills them with memory from
    // `proxy_on_memory_allocate`, read here then freed.
    let text = unsafe {
        host::proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, size, &mut data, &mut len);
        if data.is_null() {
            String::new()
        } else {
            String::from_utf8_lossy(std::slice::from_raw_parts(data, len)).into_owned()
        }
    };
    free(data, len);
    match Kind::parse(&text) {
        Ok((kind, count, token)) => {
            TOKEN.with(|t| *t.borrow_mut() = token);
            KIND.store(kind.index(), Ordering::Relaxed);
            COUNT.store(count, Ordering::Relaxed);
            let mut id = 0u32;
            let name = b"sluice_price_calls";
            // SAFETY: the name and the out-pointer are valid for the call.
            unsafe { host::proxy_define_metric(COUNTER, name.as_ptr(), name.len(), &mut id) };
            METRIC.store(id, Ordering::Relaxed);
            true
        }
        Err(e) => {
            log(LOG_ERROR, &format!("sluice-price-module: {e}"));
            false
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _headers: usize, _end_of_stream: bool) -> u32 {
    let kind = Kind::from_index(KIND.load(Ordering::Relaxed));
    let replied = calls_in(Phase::Request);
    let call_out = kind.calls_out() && COUNT.load(Ordering::Relaxed) > 0 && dispatch(id, kind);
    if kind == Kind::CheckPath && call_out {
        call(Kind::Metric); // checked
    }
    if replied || call_out {
        PAUSE
    } else {
        CONTINUE
    }
}

thread_local! {
    /// `call-check`'s data token.
    static TOKEN: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// The stream each call in flight was made for, by token.
    static CALLS: std::cell::RefCell<std::collections::BTreeMap<u32, u32>> = const {
        std::cell::RefCell::new(std::collections::BTreeMap::new())
    };
}

/// `GET /healthz` (`call`) or a check (`call-check`) to the example's check cluster for
/// stream `id`; whether it went out.
fn dispatch(id: u32, kind: Kind) -> bool {
    const CLUSTER: &[u8] = b"sluice_check";
    const CHECK: &[u8] = br#"{"identities":{"ip":"10.0.0.1"},"method":"GET","path":"/api/hello","cost":1}"#;
    let bearer = TOKEN.with(|t| format!("Bearer {}", t.borrow().as_deref().unwrap_or_default()));
    let (headers, body) = if kind.checks() {
        let headers: [(&[u8], &[u8]); 6] = [
            (b":method", b"POST"),
            (b":path", b"/v1/check"),
            (b":authority", b"sluice-check"),
            (b"content-type", b"application/json"),
            (b"authorization", bearer.as_bytes()),
            (b"prefer", b"return=minimal"),
        ];
        (pairs(&headers), CHECK)
    } else {
        let headers: [(&[u8], &[u8]); 3] = [
            (b":method", b"GET"),
            (b":path", b"/healthz"),
            (b":authority", b"sluice-check"),
        ];
        (pairs(&headers), &b""[..])
    };
    let mut token = 0u32;
    // SAFETY: pointers to valid constants and locals, for the call's duration.
    let status = unsafe {
        host::proxy_http_call(
            CLUSTER.as_ptr(),
            CLUSTER.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            std::ptr::null(),
            0,
            1_000,
            &mut token,
        )
    };
    if status != 0 {
        log(
            LOG_ERROR,
            &format!("sluice-price-module: the call was refused ({status})"),
        );
        return false;
    }
    CALLS.with(|c| c.borrow_mut().insert(token, id));
    true
}

/// Header pairs as the ABI passes them: their count, each name's and value's length, then
/// each name and value followed by a 0.
fn pairs(headers: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = (headers.len() as u32).to_le_bytes().to_vec();
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in headers {
        for part in [name, value] {
            out.extend_from_slice(part);
            out.push(0);
        }
    }
    out
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_id: u32, _body_size: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(_id: u32, _trailers: usize) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(_id: u32, _headers: usize, _end_of_stream: bool) -> u32 {
    calls_in(Phase::Response);
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(_id: u32, _body_size: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(_id: u32, _trailers: usize) -> u32 {
    CONTINUE
}

/// The answer to stream's call: its status and body read (and freed), the stream resumed;
/// for `check-path`, with the filter's answer's calls: the clock first, then a latency and a
/// counter (a clean breaker's answer reads nothing more).
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(_id: u32, token: u32, _headers: usize, body: usize, _trailers: usize) {
    let Some(id) = CALLS.with(|c| c.borrow_mut().remove(&token)) else {
        return;
    };
    let check_path = Kind::from_index(KIND.load(Ordering::Relaxed)) == Kind::CheckPath;
    if check_path {
        call(Kind::Clock);
    }
    // SAFETY: pointers to valid constants and locals, for the calls' duration; what the host
    // hands back is freed.
    unsafe {
        returned(|data, size| {
            host::proxy_get_header_map_value(HTTP_CALL_RESPONSE_HEADERS, b":status".as_ptr(), 7, data, size)
        });
        returned(|data, size| host::proxy_get_buffer_bytes(HTTP_CALL_RESPONSE_BODY, 0, body, data, size));
        if check_path {
            call(Kind::Metric);
            call(Kind::Metric);
        }
        host::proxy_set_effective_context(id);
        host::proxy_continue_stream(0);
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_id: u32) {
    // Each callback's clock (the filter's stream end reads none unless it gives something
    // back, a leased request's never).
    if Kind::from_index(KIND.load(Ordering::Relaxed)) == Kind::ClockEach {
        for _ in 0..COUNT.load(Ordering::Relaxed) {
            call(Kind::Clock);
        }
    }
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_id: u32) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(id: u32) {
    CALLS.with(|c| c.borrow_mut().retain(|_, stream| *stream != id));
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(_id: u32, _queue_id: u32) {}
