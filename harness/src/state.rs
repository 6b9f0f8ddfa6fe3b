//! What the host keeps between calls: streams, calls, metrics, shared data, logs.

use std::collections::{BTreeMap, HashMap, VecDeque};

use wasmtime_wasi::p1::WasiP1Ctx;

use crate::abi::{LogLevel, MetricType};
use crate::HostOptions;

/// A response the module sent with `proxy_send_local_response`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status.
    pub status: u16,
    /// Status details (Envoy's response code details).
    pub details: String,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl LocalResponse {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A header map as the ABI carries it: lower-case names, values as bytes. Values are bytes
/// on the wire (a proxy passes obs-text, 0x80–0xFF, on to the module), so the host keeps
/// them as they came.
pub type HeaderMap = Vec<(String, Vec<u8>)>;

/// One HTTP stream's data as the module sees and changes it.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    /// Request headers (after the module's changes).
    pub request_headers: HeaderMap,
    /// Request body.
    pub request_body: Vec<u8>,
    /// Request trailers.
    pub request_trailers: HeaderMap,
    /// Response headers (after the module's changes).
    pub response_headers: HeaderMap,
    /// Response body.
    pub response_body: Vec<u8>,
    /// Response trailers.
    pub response_trailers: HeaderMap,
    /// The local response, once the module sent one; the stream then ends.
    pub local_response: Option<LocalResponse>,
    /// `proxy_continue_stream(request)` calls so far.
    pub request_resumes: u32,
    /// `proxy_continue_stream(response)` calls so far.
    pub response_resumes: u32,
    /// Properties of this stream, by dotted path (`source.address`).
    pub properties: HashMap<String, Vec<u8>>,
    /// Whether `proxy_close_stream` was called.
    pub closed: bool,
}

/// An HTTP call the module dispatched, waiting for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCall {
    /// The token the module got.
    pub token: u32,
    /// The context that dispatched it.
    pub context_id: u32,
    /// The upstream: an Envoy cluster name, or `host:port` for Nginx.
    pub upstream: String,
    /// Request headers, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// Request body.
    pub body: Vec<u8>,
    /// Timeout in milliseconds.
    pub timeout_ms: u32,
    /// Host clock (ns) when dispatched.
    pub dispatched_at_ns: u64,
}

impl PendingCall {
    /// The first header named `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The answer to an HTTP call, as delivered to the module.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallReply {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
}

/// One log line the module wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Level.
    pub level: LogLevel,
    /// The effective context when logged.
    pub context_id: u32,
    /// Message.
    pub message: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Metric {
    pub name: String,
    pub kind: MetricType,
    pub value: i64,
    pub records: Vec<u64>,
}

/// The wasmtime store's data.
pub(crate) struct HostState {
    pub wasi: WasiP1Ctx,
    pub options: HostOptions,
    pub clock_ns: u64,
    pub tick_period_ms: u32,
    pub next_tick_ns: u64,
    pub vm_config: Vec<u8>,
    pub plugin_config: Vec<u8>,
    pub root_id: u32,
    pub next_context: u32,
    pub current: u32,
    /// The stream callback running, if one is (`proxy_on_response_headers`...).
    pub hook: Option<&'static str>,
    pub streams: HashMap<u32, Stream>,
    pub calls: BTreeMap<u32, PendingCall>,
    pub next_token: u32,
    pub call_reply: Option<CallReply>,
    pub metrics: Vec<Metric>,
    pub queues: Vec<(String, VecDeque<Vec<u8>>)>,
    pub logs: Vec<LogRecord>,
    pub unimplemented: Vec<String>,
    pub root_properties: HashMap<String, Vec<u8>>,
    /// A trap the Nginx flavor raised on purpose, for the error message.
    pub nginx_trap: Option<String>,
    /// What the host itself logged as an error about the module's calls (ngx_wasm_module's
    /// `[error] [wasm] …` lines, as the Nginx flavor models them).
    pub host_errors: Vec<String>,
    /// The module's memory and allocator, looked up once after instantiation (host
    /// functions use them on every call).
    pub memory: Option<wasmtime::Memory>,
    pub allocate: Option<wasmtime::TypedFunc<i32, i32>>,
    /// Calls the module made into the host (every import, WASI's included).
    pub host_calls: u64,
}
