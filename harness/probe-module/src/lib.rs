//! A proxy-wasm module for the harness's tests, written with the proxy-wasm Rust SDK.
//!
//! The request header `x-probe` picks what a stream does, so one module covers every host
//! function the harness supports; results come back as request headers (which the test
//! reads from the stream or the upstream sees) or as local responses.
//!
//! Plugin configuration: empty, `fail` (configure returns false), `tick=<ms>`, or
//! `tick-twice=<ms>` (sets the tick period twice).
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType, Status};

/// The module's `_initialize`. (In a module of its own: the `pub fn` the SDK's macro writes
/// is not the crate's API.)
mod start {
    use super::{LogLevel, ProbeRoot, RootContext};

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Trace);
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(ProbeRoot) });
    }}
}

thread_local! {
    /// Streams held by `x-probe: pause`, resumed by the next tick.
    static PAUSED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Metric ids, defined at configure time.
    static METRICS: RefCell<Option<Metrics>> = const { RefCell::new(None) };
}

#[derive(Clone, Copy)]
struct Metrics {
    requests: u32,
    ticks: u32,
    gauge: u32,
    sizes: u32,
}

fn log(level: LogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

fn metrics() -> Option<Metrics> {
    METRICS.with(|m| *m.borrow())
}

/// An import the harness does not provide: it must answer `Unimplemented`, not trap.
#[cfg(target_arch = "wasm32")]
mod missing {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_probe_missing_function(value: u32) -> u32;
    }
}

/// A gRPC host call, raw (the SDK's wrapper panics on a status it does not expect).
#[cfg(target_arch = "wasm32")]
mod grpc {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_grpc_cancel(token: u32) -> u32;
    }
}

// `unsafe` is denied in the workspace but for proxy-wasm imports: this test module calls
// one the SDK's wrapper would panic on, and one the harness does not provide.
#[allow(unsafe_code)]
fn call_grpc_cancel() -> u32 {
    #[cfg(target_arch = "wasm32")]
    // SAFETY: an import without pointer arguments; the host answers a status.
    return unsafe { grpc::proxy_grpc_cancel(1) };
    #[cfg(not(target_arch = "wasm32"))]
    return u32::MAX;
}

// `unsafe` is denied in the workspace but for proxy-wasm imports: this test module calls
// one the SDK's wrapper would panic on, and one the harness does not provide.
#[allow(unsafe_code)]
fn call_missing_function() -> u32 {
    #[cfg(target_arch = "wasm32")]
    // SAFETY: an import without pointer arguments; the host answers a status.
    return unsafe { missing::proxy_probe_missing_function(7) };
    // Natively (clippy, `cargo test --workspace`) there is no host to ask.
    #[cfg(not(target_arch = "wasm32"))]
    return u32::MAX;
}

struct ProbeRoot;

impl Context for ProbeRoot {}

impl RootContext for ProbeRoot {
    fn on_vm_start(&mut self, size: usize) -> bool {
        let config = self.get_vm_configuration().unwrap_or_default();
        log(
            LogLevel::Info,
            &format!("probe vm started ({size} bytes): {}", String::from_utf8_lossy(&config)),
        );
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let config = String::from_utf8_lossy(&config).into_owned();
        log(LogLevel::Info, &format!("probe configured: {config}"));
        if config == "fail" {
            log(LogLevel::Error, "probe refuses its configuration");
            return false;
        }
        if let Some(ms) = config.strip_prefix("tick=").and_then(|ms| ms.parse().ok()) {
            self.set_tick_period(Duration::from_millis(ms));
        }
        if let Some(ms) = config.strip_prefix("tick-twice=").and_then(|ms| ms.parse().ok()) {
            let _ = hostcalls::set_tick_period(Duration::from_millis(ms));
            let _ = hostcalls::set_tick_period(Duration::from_millis(ms));
        }
        let defined = (|| {
            Ok::<_, Status>(Metrics {
                requests: hostcalls::define_metric(MetricType::Counter, "probe_requests")?,
                ticks: hostcalls::define_metric(MetricType::Counter, "probe_ticks")?,
                gauge: hostcalls::define_metric(MetricType::Gauge, "probe_gauge")?,
                sizes: hostcalls::define_metric(MetricType::Histogram, "probe_header_count")?,
            })
        })();
        match defined {
            Ok(m) => METRICS.with(|slot| *slot.borrow_mut() = Some(m)),
            Err(e) => log(LogLevel::Error, &format!("cannot define metrics: {e:?}")),
        }
        true
    }

    fn on_tick(&mut self) {
        if let Some(m) = metrics() {
            let _ = hostcalls::increment_metric(m.ticks, 1);
        }
        for id in PAUSED.with(|p| std::mem::take(&mut *p.borrow_mut())) {
            if hostcalls::set_effective_context(id).is_ok() {
                let _ = hostcalls::resume_http_request();
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Probe {
            id: context_id,
            mode: String::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One stream.
struct Probe {
    id: u32,
    mode: String,
}

impl Probe {
    fn mark(&self, name: &str, value: &str) {
        self.add_http_request_header(name, value);
    }

    fn shared_increment(&self) -> Result<u64, Status> {
        loop {
            let (value, cas) = self.get_shared_data("probe_counter");
            let n = value
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            match self.set_shared_data("probe_counter", Some(n.to_string().as_bytes()), cas) {
                Ok(()) => return Ok(n),
                Err(Status::CasMismatch) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn queue_round_trip(&self) -> Result<String, Status> {
        let id = hostcalls::register_shared_queue("probe_queue")?;
        hostcalls::enqueue_shared_queue(id, Some(format!("hello from {}", self.id).as_bytes()))?;
        let resolved = hostcalls::resolve_shared_queue("", "probe_queue")?.ok_or(Status::NotFound)?;
        let item = hostcalls::dequeue_shared_queue(resolved)?.unwrap_or_default();
        Ok(format!("{}:{}", resolved == id, String::from_utf8_lossy(&item)))
    }
}

impl Context for Probe {
    fn on_http_call_response(&mut self, _token: u32, headers: usize, body_size: usize, _trailers: usize) {
        let status = self.get_http_call_response_header(":status");
        match status {
            None => self.send_http_response(504, vec![("x-probe", "call-timeout")], Some(b"call timed out")),
            Some(status) => {
                let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
                self.mark("x-call-status", &status);
                self.mark("x-call-headers", &headers.to_string());
                self.mark("x-call-body", &String::from_utf8_lossy(&body));
                self.resume_http_request();
            }
        }
    }
}

impl HttpContext for Probe {
    fn on_http_request_headers(&mut self, count: usize, end_of_stream: bool) -> Action {
        self.mode = self.get_http_request_header("x-probe").unwrap_or_default();
        self.mark("x-context-id", &self.id.to_string());
        match self.mode.as_str() {
            "add" => {
                let headers = self.get_http_request_headers();
                self.mark("x-probe-count", &headers.len().to_string());
            }
            "headers" => {
                let got = self
                    .get_http_request_header("x-get")
                    .unwrap_or_else(|| "missing".into());
                self.set_http_request_header("x-replace", Some("replaced"));
                self.set_http_request_header("x-remove", None);
                self.mark("x-got", &got);
                self.mark("x-end-of-stream", &end_of_stream.to_string());
                self.mark("x-count-arg", &count.to_string());
            }
            "set-all" => {
                let mut all = self.get_http_request_headers();
                all.retain(|(k, _)| k != "x-drop");
                all.push(("x-set-all".into(), "yes".into()));
                let pairs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                self.set_http_request_headers(pairs);
            }
            "respond" => {
                self.send_http_response(418, vec![("x-probe", "teapot")], Some(b"short and stout"));
                return Action::Pause;
            }
            "call" => {
                let timeout = self
                    .get_http_request_header("x-timeout-ms")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(100);
                let path = self
                    .get_http_request_header("x-call-path")
                    .unwrap_or_else(|| "/probe".into());
                let headers = vec![(":method", "POST"), (":path", path.as_str()), (":authority", "backend")];
                match self.dispatch_http_call(
                    "backend",
                    headers,
                    Some(b"ping"),
                    vec![],
                    Duration::from_millis(timeout),
                ) {
                    Ok(_) => return Action::Pause,
                    Err(e) => self.mark("x-call-error", &format!("{e:?}")),
                }
            }
            "bad-cluster" => {
                let headers = vec![(":method", "GET"), (":path", "/"), (":authority", "nowhere")];
                match self.dispatch_http_call("nowhere", headers, None, vec![], Duration::from_millis(10)) {
                    Ok(token) => self.mark("x-call-error", &format!("dispatched {token}")),
                    Err(e) => self.mark("x-call-error", &format!("{e:?}")),
                }
            }
            "tick-here" => {
                let result = hostcalls::set_tick_period(Duration::from_millis(10));
                self.mark("x-tick", &format!("{result:?}"));
            }
            "dispatch-to" => {
                let upstream = self.get_http_request_header("x-upstream").unwrap_or_default();
                let omit = self.get_http_request_header("x-omit").unwrap_or_default();
                let headers: Vec<(&str, &str)> = [(":method", "GET"), (":path", "/"), (":authority", "a")]
                    .into_iter()
                    .filter(|(k, _)| *k != omit)
                    .collect();
                match self.dispatch_http_call(&upstream, headers, None, vec![], Duration::from_millis(10)) {
                    Ok(_) => return Action::Pause,
                    Err(e) => self.mark("x-call-error", &format!("{e:?}")),
                }
            }
            "grpc" => {
                let status = call_grpc_cancel();
                self.mark("x-status", &status.to_string());
            }
            // Calls ngx_wasm_module traps on, one mode each; the result in `x-status`.
            "log-level" => self.mark("x-status", &format!("{:?}", hostcalls::get_log_level())),
            "done" => self.mark("x-status", &format!("{:?}", hostcalls::done())),
            "close-stream" => self.mark("x-status", &format!("{:?}", hostcalls::reset_http_request())),
            "get-status" => self.mark("x-status", &format!("{:?}", hostcalls::get_grpc_status())),
            "resolve-queue" => {
                let resolved = hostcalls::resolve_shared_queue("", "probe_queue");
                self.mark("x-status", &format!("{resolved:?}"));
            }
            "pause" => {
                PAUSED.with(|p| p.borrow_mut().push(self.id));
                return Action::Pause;
            }
            "time" => {
                let ns = self
                    .get_current_time()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                self.mark("x-now-ns", &ns.to_string());
            }
            "props" => {
                let prop = |path: Vec<&str>| {
                    self.get_property(path)
                        .map_or_else(|| "none".to_owned(), |v| String::from_utf8_lossy(&v).into_owned())
                };
                self.set_property(vec!["probe", "mark"], Some(b"set by the module"));
                let (source, path, method, mark) = (
                    prop(vec!["source", "address"]),
                    prop(vec!["request", "path"]),
                    prop(vec!["request", "method"]),
                    prop(vec!["probe", "mark"]),
                );
                self.mark("x-source", &source);
                self.mark("x-path", &path);
                self.mark("x-method", &method);
                self.mark("x-mark", &mark);
                let level = hostcalls::get_log_level().map_or_else(|e| format!("{e:?}"), |l| format!("{l:?}"));
                self.mark("x-log-level", &level);
            }
            "shared" => match self.shared_increment() {
                Ok(n) => self.mark("x-shared", &n.to_string()),
                Err(e) => self.mark("x-shared", &format!("{e:?}")),
            },
            "queue" => match self.queue_round_trip() {
                Ok(s) => self.mark("x-queue", &s),
                Err(e) => self.mark("x-queue", &format!("{e:?}")),
            },
            "metrics" => {
                if let Some(m) = metrics() {
                    let _ = hostcalls::increment_metric(m.requests, 1);
                    let _ = hostcalls::record_metric(m.gauge, 42);
                    let _ = hostcalls::record_metric(m.sizes, count as u64);
                    let value = hostcalls::get_metric(m.requests).map_or_else(|e| format!("{e:?}"), |v| v.to_string());
                    self.mark("x-metric", &value);
                }
            }
            "unimplemented" => {
                let status = call_missing_function();
                self.mark("x-status", &status.to_string());
            }
            "log" => log(LogLevel::Warn, &format!("probe stream {} says hello", self.id)),
            _ => {}
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode != "body" {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, size).unwrap_or_default();
        self.set_http_request_body(0, size, &body.to_ascii_uppercase());
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _count: usize) -> Action {
        self.add_http_request_trailer("x-probe-trailer", "seen");
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _count: usize, _end_of_stream: bool) -> Action {
        let status = self.get_http_response_header(":status").unwrap_or_default();
        self.add_http_response_header("x-probe-response", &format!("{} {status}", self.mode));
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode == "body" && end_of_stream {
            let body = self.get_http_response_body(0, size).unwrap_or_default();
            self.set_http_response_body(0, size, &body.to_ascii_lowercase());
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        log(LogLevel::Debug, &format!("probe stream {} done", self.id));
    }
}
