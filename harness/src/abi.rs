//! Numbers of the proxy-wasm ABI 0.2.1: statuses, actions, map and buffer types.

/// Status codes returned by host functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The key or item does not exist.
    NotFound = 1,
    /// An argument is invalid.
    BadArgument = 2,
    /// Data could not be serialized.
    SerializationFailure = 3,
    /// Data could not be parsed.
    ParseFailure = 4,
    /// A queue or buffer is empty.
    Empty = 7,
    /// Shared data changed since it was read.
    CasMismatch = 8,
    /// The host failed internally.
    InternalFailure = 10,
    /// The host does not implement this function.
    Unimplemented = 12,
}

/// What a stream callback asks the host to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Go on with the stream.
    Continue,
    /// Hold the stream until `proxy_continue_stream` or a local response.
    Pause,
}

impl Action {
    pub(crate) fn from_raw(v: i32) -> Action {
        if v == 1 {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}

/// Header maps (`MapType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    /// Request headers.
    RequestHeaders,
    /// Request trailers.
    RequestTrailers,
    /// Response headers.
    ResponseHeaders,
    /// Response trailers.
    ResponseTrailers,
    /// Headers of an HTTP call's response.
    CallResponseHeaders,
    /// Trailers of an HTTP call's response.
    CallResponseTrailers,
}

impl MapType {
    pub(crate) fn from_raw(v: i32) -> Option<MapType> {
        Some(match v {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            6 => MapType::CallResponseHeaders,
            7 => MapType::CallResponseTrailers,
            _ => return None,
        })
    }
}

/// Buffers (`BufferType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferType {
    /// Request body.
    RequestBody,
    /// Response body.
    ResponseBody,
    /// Body of an HTTP call's response.
    CallResponseBody,
    /// The VM configuration.
    VmConfiguration,
    /// The plugin configuration.
    PluginConfiguration,
}

impl BufferType {
    pub(crate) fn from_raw(v: i32) -> Option<BufferType> {
        Some(match v {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            4 => BufferType::CallResponseBody,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            _ => return None,
        })
    }
}

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Trace.
    Trace,
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warn.
    Warn,
    /// Error.
    Error,
    /// Critical.
    Critical,
}

impl LogLevel {
    pub(crate) fn from_raw(v: i32) -> LogLevel {
        match v {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            _ => LogLevel::Critical,
        }
    }
}

/// Metric kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Monotonic counter.
    Counter,
    /// Gauge.
    Gauge,
    /// Histogram (the harness keeps the recorded values).
    Histogram,
}
