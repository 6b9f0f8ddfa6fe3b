//! What the filter's decisions ask of the proxy that runs them: the request's headers and
//! properties, local answers, calls to the check service and their answers, metrics.
//!
//! The wasm build answers over the proxy-wasm ABI ([`crate::host::Abi`]); the decisions'
//! unit tests over a recording fake, natively, without a wasm build or a host.

use crate::config::Check;
use crate::header_pairs::HeaderPairs;

/// A log line's level (the ABI's `LogLevel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum LogLevel {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

/// What a stream's callback tells the host (the ABI's `Action`): go on, or hold the stream
/// until the filter resumes it or answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    Continue = 0,
    Pause = 1,
}

/// The proxy, as a stream's or the root's decisions see it.
pub trait Proxy: SharedData {
    /// Request header `name` as text; `None` when absent.
    fn request_header(&self, name: &str) -> Option<String>;
    /// The request's headers, read in one call: where a request needs several that are
    /// there, cheaper than a read each.
    fn request_header_pairs(&self) -> HeaderPairs;
    /// Response header `name` as text; `None` when absent.
    fn response_header(&self, name: &str) -> Option<String>;
    /// Property `segments` as text; `None` when absent or empty.
    fn property(&self, segments: &[&str]) -> Option<String>;
    /// Adds a header to the upstream's response.
    fn add_response_header(&mut self, name: &str, value: &str);
    /// Sets a header of the upstream's response, in place of any it had.
    fn set_response_header(&mut self, name: &str, value: &str);
    /// Answers the stream with a local response.
    fn respond(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]);
    /// Dispatches `method path` (with a JSON `body`, the credential and `extra` headers) to
    /// the check `service`; the call's token, or why it did not go out.
    fn call(
        &mut self,
        service: &Check,
        request: (&str, &str),
        body: Option<&[u8]>,
        extra: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, String>;
    /// Header `name` of the answered call's response, as bytes.
    fn call_header(&self, name: &str) -> Option<Vec<u8>>;
    /// The answered call's response body, at most `max` bytes.
    fn call_body(&self, max: usize) -> Vec<u8>;
    /// Logs `msg` at `level`.
    fn log(&self, level: LogLevel, msg: &str);
    /// Adds `n` to counter `id` (0: undefined, skipped).
    fn count(&mut self, id: u32, n: u64);
    /// Records `value` in histogram `id` (0: undefined, skipped).
    fn record(&mut self, id: u32, value: u64);
}

/// The process's shared data, every worker's (see [`crate::slots`]).
pub trait SharedData {
    /// Key `key`'s value and CAS; `None` when absent or the host refuses.
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Sets `key` to `value` if its CAS is still `cas`; whether it was written. A CAS of 0
    /// sets whatever is there in Envoy, and only an absent key in ngx_wasm_module.
    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> bool;
}
