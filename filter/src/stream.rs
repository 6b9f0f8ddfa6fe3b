//! One HTTP stream: identities, local bucket, check call, answer.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};
use sluice_core::headers::{denial_body, format_headers, Quota};
use sluice_core::wire::{check_method, CheckRequest, CheckResponse, MAX_HOLD_MS};
use sluice_core::{Decision, Micros};

use crate::breaker::State;
use crate::config::{FailureMode, IpSource};
use crate::identity::{bounded, client_ip, header_text, source_ip};
use crate::root::{now_us, Metrics, Shared};

const UNAVAILABLE: &str =
    r#"{"status":"error","code":503,"message":"Rate limit service unavailable. Please retry later."}"#;

/// The HTTP context of one stream.
pub struct Stream {
    shared: Rc<RefCell<Shared>>,
    identities: BTreeMap<String, String>,
    /// The key of the local and fallback buckets.
    bucket_key: Option<String>,
    /// When the check call went out.
    called_at: Micros,
    /// The call out is the half-open breaker's probe.
    probe: bool,
    /// The call out is the wait call holding a shaped request.
    holding: bool,
    /// Headers to add to the upstream's response.
    response_headers: Vec<(&'static str, String)>,
}

fn ms(us: Micros) -> u64 {
    us.div_ceil(1_000)
}

// Host calls on the traffic path: a failing host call is an absent value or a no-op, never
// a trap (the SDK's context methods unwrap their results; header reads there also unwrap
// the value's UTF-8).

/// Request header `name` as text ([`header_text`]); `None` when absent.
fn request_header(name: &str) -> Option<String> {
    let raw = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name).ok()??;
    Some(header_text(&raw).into_owned())
}

/// Header `name` of the check call's response, as bytes.
fn call_response_header(name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, name).ok()?
}

/// The check call's response body, at most `max` bytes.
fn call_response_body(max: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, max)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Why a check call gave no decision.
enum Failure {
    /// The service is unwell or unreachable: no answer, a 5xx, a body that is not a check
    /// response. Counts towards the breaker.
    Service(String),
    /// The service answered 4xx: it refused this request, which says nothing of its health
    /// (the filter forwards only what the service accepts, so this is a version skew).
    Request(String),
}

/// The check call's answer, or why there is none.
fn read_answer() -> Result<CheckResponse, Failure> {
    match call_response_header(":status").as_deref() {
        None => Err(Failure::Service("no response (timeout or connection failure)".into())),
        Some(b"200") => CheckResponse::from_json(&call_response_body(64 * 1024)).map_err(|e| Failure::Service(e.0)),
        Some(status) if status.starts_with(b"4") => Err(Failure::Request(format!(
            "status {}: the check service refused the request",
            header_text(status)
        ))),
        Some(status) => Err(Failure::Service(format!("status {}", header_text(status)))),
    }
}

/// The client IP: from the forwarding header with trusted hops, else the connection's.
fn request_ip(source: &IpSource) -> Option<IpAddr> {
    let forwarded = request_header(&source.header);
    client_ip(forwarded.as_deref(), source.trusted_hops).or_else(|| {
        let raw = hostcalls::get_property(vec!["source", "address"]).ok()??;
        source_ip(std::str::from_utf8(&raw).ok()?)
    })
}

/// Answers the stream with a local response (the host ends it).
fn respond(status: u32, headers: Vec<(&str, &str)>, body: &[u8]) {
    let _ = hostcalls::send_http_response(status, headers, Some(body));
}

impl Stream {
    pub fn new(shared: Rc<RefCell<Shared>>) -> Stream {
        Stream {
            shared,
            identities: BTreeMap::new(),
            bucket_key: None,
            called_at: 0,
            probe: false,
            holding: false,
            response_headers: Vec::new(),
        }
    }

    fn read_identities(&mut self) {
        let shared = self.shared.clone();
        let s = shared.borrow();
        let ids = &s.config.identities;
        if let Some(ip) = ids.ip.as_ref().and_then(request_ip) {
            self.identities.insert("ip".into(), ip.to_string());
        }
        for (name, src) in [("user", &ids.user), ("api_key", &ids.api_key), ("tier", &ids.tier)] {
            let value = src.as_ref().and_then(|src| request_header(&src.header));
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                self.identities.insert(name.into(), bounded(&v).to_owned());
            }
        }
        let by = s.config.local.as_ref().map_or("ip", |l| l.by.as_str());
        self.bucket_key = self.identities.get(by).or_else(|| self.identities.get("ip")).cloned();
    }

    /// Answers 429 with headers describing `quota`.
    fn deny(&self, quota: &Quota<'_>) {
        let mode = self.shared.borrow().config.headers;
        let mut headers = Vec::with_capacity(8);
        format_headers(quota, mode, &mut headers);
        headers.push(("content-type", "application/json".into()));
        let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = denial_body(quota.retry_after_ms.unwrap_or(1_000));
        respond(429, pairs, body.as_bytes());
    }

    fn local_quota(d: &Decision, policy: &'static str, now: Micros) -> Quota<'static> {
        Quota {
            policy,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_ms: ms(d.reset_after),
            window_ms: 1_000,
            retry_after_ms: (!d.allowed).then(|| ms(d.retry_after)),
            now_ms: now / 1_000,
        }
    }

    /// The check service failed (or the breaker is open): apply the failure policy.
    /// Returns whether the stream may go on.
    fn fail(&mut self, now: Micros, why: &str) -> bool {
        let mut s = self.shared.borrow_mut();
        let metrics = s.metrics;
        let _ = hostcalls::log(
            LogLevel::Debug,
            &format!(
                "sluice-filter: check failed ({why}); failing {:?}",
                s.config.failure.mode
            ),
        );
        if s.config.failure.mode == FailureMode::Closed {
            drop(s);
            Metrics::bump(metrics.failed_closed);
            let headers = vec![("content-type", "application/json"), ("retry-after", "1")];
            respond(503, headers, UNAVAILABLE.as_bytes());
            return false;
        }
        let key = self.bucket_key.clone().unwrap_or_else(|| "-".into());
        let d = s.fallback.take(&key, now);
        drop(s);
        Metrics::bump(metrics.failed_open);
        if d.allowed {
            return true;
        }
        self.deny(&Self::local_quota(&d, "fallback", now));
        false
    }

    fn on_check_answer(&mut self, now: Micros) -> bool {
        let metrics = self.shared.borrow().metrics;
        self.probe = false;
        let answer = match read_answer() {
            Ok(a) => {
                self.shared.borrow_mut().breaker.success();
                a
            }
            Err(Failure::Service(why)) => {
                self.shared.borrow_mut().breaker.failure(now);
                return self.fail(now, &why);
            }
            Err(Failure::Request(why)) => {
                self.shared.borrow_mut().breaker.release_probe(now);
                return self.fail(now, &why);
            }
        };
        if metrics.check_latency_ms != 0 {
            let _ = hostcalls::record_metric(metrics.check_latency_ms, now.saturating_sub(self.called_at) / 1_000);
        }
        let quota = answer.policy.as_deref().map(|policy| Quota {
            policy,
            limit: answer.limit,
            remaining: answer.remaining,
            reset_after_ms: answer.reset_after_ms,
            window_ms: answer.window_ms,
            retry_after_ms: (!answer.allowed).then_some(answer.retry_after_ms),
            now_ms: now / 1_000,
        });
        if !answer.allowed {
            Metrics::bump(metrics.denied_global);
            let fallback = Quota {
                policy: "",
                limit: 0,
                remaining: 0,
                reset_after_ms: 0,
                window_ms: 0,
                retry_after_ms: Some(answer.retry_after_ms),
                now_ms: now / 1_000,
            };
            self.deny(quota.as_ref().unwrap_or(&fallback));
            return false;
        }
        if let Some(q) = &quota {
            let mode = self.shared.borrow().config.headers;
            format_headers(q, mode, &mut self.response_headers);
        }
        Metrics::bump(metrics.allowed);
        if answer.delay_ms > 0 {
            Metrics::bump(metrics.delayed);
            return !self.hold(answer.delay_ms);
        }
        true
    }

    /// Dispatches a call to the check service's cluster; whether it went out.
    fn call(&mut self, method: &str, path: &str, body: Option<&[u8]>, timeout_ms: u64) -> Result<u32, String> {
        let (cluster, authority) = {
            let s = self.shared.borrow();
            (s.config.check.cluster.clone(), s.config.check.authority.clone())
        };
        let mut headers = vec![(":method", method), (":path", path), (":authority", authority.as_str())];
        if body.is_some() {
            headers.push(("content-type", "application/json"));
        }
        self.dispatch_http_call(&cluster, headers, body, vec![], Duration::from_millis(timeout_ms))
            .map_err(|status| format!("dispatch refused: {status:?}"))
    }

    /// Holds the request `delay_ms` on the service's wait endpoint: the stream stays paused
    /// and the call's answer (or its failure, at the latest `delay_ms + timeout_ms` later)
    /// resumes it, so no host needs to resume a stream from a timer (ngx_wasm_module cannot).
    /// Returns whether the call went out; if not, the request goes on at once: the check
    /// already admitted it, shaping only spaces requests out.
    fn hold(&mut self, delay_ms: u64) -> bool {
        let delay_ms = delay_ms.min(MAX_HOLD_MS);
        let (wait_path, timeout) = {
            let s = self.shared.borrow();
            (s.config.check.wait_path.clone(), s.config.check.timeout_ms)
        };
        let path = format!("{wait_path}?ms={delay_ms}");
        match self.call("GET", &path, None, delay_ms + u64::from(timeout)) {
            Ok(_) => {
                self.holding = true;
                true
            }
            Err(why) => {
                let _ = hostcalls::log(
                    LogLevel::Warn,
                    &format!("sluice-filter: cannot hold the request ({why})"),
                );
                false
            }
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, _body: usize, _trailers: usize) {
        let now = now_us();
        if std::mem::take(&mut self.holding) || self.on_check_answer(now) {
            let _ = hostcalls::resume_http_request();
        }
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let now = now_us();
        self.read_identities();
        let metrics = self.shared.borrow().metrics;

        // Local prefilter: a client over its local rate is answered here, at once.
        let local = {
            let mut s = self.shared.borrow_mut();
            match (&mut s.local, &self.bucket_key) {
                (Some(b), Some(key)) => Some(b.take(key, now)),
                _ => None,
            }
        };
        if let Some(d) = local.filter(|d| !d.allowed) {
            Metrics::bump(metrics.denied_local);
            self.deny(&Self::local_quota(&d, "local", now));
            return Action::Pause;
        }

        let (allowed, state) = {
            let breaker = &mut self.shared.borrow_mut().breaker;
            (breaker.allow(now), breaker.state())
        };
        if !allowed {
            return if self.fail(now, "circuit breaker open") {
                Action::Continue
            } else {
                Action::Pause
            };
        }
        self.probe = state == State::HalfOpen;
        let method = request_header(":method");
        let request = CheckRequest {
            identities: std::mem::take(&mut self.identities),
            method: check_method(method.as_deref().unwrap_or("GET")).to_owned(),
            path: request_header(":path")
                .map(|p| bounded_path(&p))
                .unwrap_or_else(|| "/".into()),
            cost: 1,
        };
        let Ok(body) = serde_json::to_vec(&request) else {
            return if self.fail(now, "cannot encode the check") {
                Action::Continue
            } else {
                Action::Pause
            };
        };
        let (path, timeout) = {
            let c = &self.shared.borrow().config.check;
            (c.path.clone(), c.timeout_ms)
        };
        match self.call("POST", &path, Some(&body), u64::from(timeout)) {
            Ok(_) => {
                self.called_at = now;
                Action::Pause
            }
            Err(why) => {
                self.probe = false;
                self.shared.borrow_mut().breaker.failure(now);
                if self.fail(now, &why) {
                    Action::Continue
                } else {
                    Action::Pause
                }
            }
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in std::mem::take(&mut self.response_headers) {
            let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, &value);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.probe {
            let mut s = self.shared.borrow_mut();
            s.breaker.release_probe(now_us()); // ended before its probe's answer
        }
    }
}

/// The path without its query, at most 4 KiB (the wire limit).
fn bounded_path(p: &str) -> String {
    let path = p.split('?').next().unwrap_or("/");
    let mut end = path.len().min(4096);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        "/".into()
    } else {
        path[..end].to_owned()
    }
}
