//! The request's way through the filter, natively, over a recording fake proxy: no wasm build,
//! no host. (The filter in a host, built for wasm: `filter/tests/`.)

use std::collections::HashMap;

use sluice_core::Micros;

use super::Flow;
use crate::config::{Check, Config};
use crate::header_pairs::HeaderPairs;
use crate::metrics::Metrics;
use crate::proxy::{Action, LogLevel, Proxy, SharedData};
use crate::shared::Shared;

/// A local response: status, headers, body.
type Local = (u32, Vec<(String, String)>, String);

/// A proxy that serves a request's headers and a call's answer, and records what the filter
/// did: local answers, calls, added headers, counts.
#[derive(Default)]
struct Fake {
    request: HashMap<String, String>,
    response: HashMap<String, String>,
    /// The answered call: its status (`None`: no response) and body.
    answer: Option<(String, String)>,
    /// Calls refuse to go out.
    refuse_calls: bool,
    calls: Vec<(String, String, Vec<u8>)>,
    responded: Vec<Local>,
    added: Vec<(String, String)>,
    counts: HashMap<u32, u64>,
}

impl Proxy for Fake {
    fn request_header(&self, name: &str) -> Option<String> {
        self.request.get(name).cloned()
    }

    fn request_header_pairs(&self) -> HeaderPairs {
        let pairs: Vec<(&str, &str)> = self.request.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        HeaderPairs::of(&pairs)
    }

    fn response_header(&self, name: &str) -> Option<String> {
        self.response.get(name).cloned()
    }

    fn property(&self, segments: &[&str]) -> Option<String> {
        (segments == ["source", "address"]).then(|| "192.0.2.7:40000".to_owned())
    }

    fn add_response_header(&mut self, name: &str, value: &str) {
        self.added.push((name.to_owned(), value.to_owned()));
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        self.response.insert(name.to_owned(), value.to_owned());
    }

    fn respond(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) {
        let headers = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.responded
            .push((status, headers, String::from_utf8_lossy(body).into_owned()));
    }

    fn call(
        &mut self,
        _service: &Check,
        (method, path): (&str, &str),
        body: Option<&[u8]>,
        _extra: &[(&str, &str)],
        _timeout_ms: u64,
    ) -> Result<u32, String> {
        if self.refuse_calls {
            return Err("dispatch refused: BadArgument".into());
        }
        self.calls
            .push((method.to_owned(), path.to_owned(), body.unwrap_or_default().to_vec()));
        u32::try_from(self.calls.len()).map_err(|e| e.to_string())
    }

    fn call_header(&self, name: &str) -> Option<Vec<u8>> {
        let (status, _) = self.answer.as_ref()?;
        (name == ":status").then(|| status.clone().into_bytes())
    }

    fn call_body(&self, max: usize) -> Vec<u8> {
        let body = self.answer.as_ref().map(|(_, b)| b.as_bytes()).unwrap_or_default();
        body[..body.len().min(max)].to_vec()
    }

    fn log(&self, _level: LogLevel, _msg: &str) {}

    fn count(&mut self, id: u32, n: u64) {
        *self.counts.entry(id).or_default() += n;
    }

    fn record(&mut self, _id: u32, _value: u64) {}
}

thread_local! {
    /// The process's shared data: every request's fake of a test (its thread) sees it.
    static SHARED: std::cell::RefCell<HashMap<String, (Vec<u8>, u32)>> = Default::default();
}

impl SharedData for Fake {
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        SHARED.with_borrow(|m| m.get(key).cloned())
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> bool {
        SHARED.with_borrow_mut(|m| {
            let current = m.get(key).map_or(0, |(_, c)| *c);
            if cas != 0 && cas != current {
                return false;
            }
            m.insert(key.to_owned(), (value.to_vec(), current + 1));
            true
        })
    }
}

/// Distinct ids for the metrics a test reads.
fn metrics() -> Metrics {
    Metrics {
        allowed: 1,
        denied_local: 2,
        denied_global: 3,
        failed_open: 4,
        failed_closed: 5,
        checked: 6,
        check_retries: 7,
        denied_in_flight: 8,
        in_flight_ended: 9,
        ..Metrics::default()
    }
}

fn shared(config: &str) -> Shared {
    let config = Config::parse(config.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let shared = Shared::new(config, metrics(), "sluice/test/").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shared.create(&mut Fake::default()), 0);
    shared
}

const CHECKED: &str = r#"{"check": {"cluster": "sluice", "timeout_ms": 1000},
  "identities": {"ip": {}, "api_key": {"header": "x-api-key"}}}"#;

fn get(path: &str) -> Fake {
    let mut p = Fake::default();
    p.request.insert(":method".into(), "GET".into());
    p.request.insert(":path".into(), path.into());
    p.request.insert(":authority".into(), "api.example.com".into());
    p.request.insert("x-api-key".into(), "k1".into());
    p
}

const DENIED: &str = r#"{"allowed": false, "limit": 5, "remaining": 0, "reset_after_ms": 4000,
  "retry_after_ms": 2000, "reset_at": 0, "policy": "per-key", "window_ms": 10000}"#;
const ALLOWED: &str = r#"{"allowed": true, "limit": 5, "remaining": 4, "reset_after_ms": 4000,
  "retry_after_ms": 0, "reset_at": 0, "policy": "per-key", "window_ms": 10000}"#;

#[test]
fn a_request_is_sent_to_the_check_with_its_identities_canonical_path_and_host() {
    let (mut s, mut p, mut flow) = (shared(CHECKED), get("/api/./x?q=1"), Flow::default());
    assert!(matches!(
        flow.on_request_headers(&mut s, &mut p, Micros::SECOND),
        Action::Pause
    ));
    assert_eq!(p.calls.len(), 1);
    let (method, path, body) = &p.calls[0];
    assert_eq!((method.as_str(), path.as_str()), ("POST", "/v1/check"));
    let body: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    assert_eq!(body["path"], "/api/x");
    assert_eq!(body["host"], "api.example.com");
    assert_eq!(body["identities"]["api_key"], "k1");
    assert_eq!(body["identities"]["ip"], "192.0.2.7");
    assert_eq!(p.counts.get(&metrics().checked), Some(&1));
}

fn has(headers: &[(String, String)], name: &str, value: &str) -> bool {
    headers.iter().any(|(k, v)| k.eq_ignore_ascii_case(name) && v == value)
}

#[test]
fn a_refusal_answers_429_with_the_quota_and_an_admission_adds_its_headers() {
    let (mut s, mut flow) = (shared(CHECKED), Flow::default());
    let mut p = get("/api");
    flow.on_request_headers(&mut s, &mut p, Micros::SECOND);
    p.answer = Some(("200".into(), DENIED.into()));
    assert!(
        !flow.on_call_response(&mut s, &mut p, Micros::new(1_010_000)),
        "a refused request stays paused"
    );
    let (status, headers, _) = &p.responded[0];
    assert_eq!(*status, 429);
    assert!(has(headers, "retry-after", "2"), "{headers:?}");

    let (mut flow, mut p) = (Flow::default(), get("/api"));
    flow.on_request_headers(&mut s, &mut p, Micros::from_secs(2));
    p.answer = Some(("200".into(), ALLOWED.into()));
    assert!(
        flow.on_call_response(&mut s, &mut p, Micros::new(2_010_000)),
        "an admitted request goes on"
    );
    assert!(p.responded.is_empty());
    flow.on_response_headers(&mut s, &mut p);
    assert!(has(&p.added, "x-ratelimit-remaining", "4"), "{:?}", p.added);
}

#[test]
fn a_client_over_its_local_bucket_is_answered_at_once_without_a_call() {
    let config = r#"{"check": {"cluster": "sluice"}, "identities": {"ip": {}},
      "local": {"by": "ip", "rate_per_s": 1, "burst": 2}}"#;
    let mut s = shared(config);
    let mut p = get("/");
    for _ in 0..2 {
        Flow::default().on_request_headers(&mut s, &mut p, Micros::SECOND);
    }
    assert_eq!(p.calls.len(), 2);
    let action = Flow::default().on_request_headers(&mut s, &mut p, Micros::SECOND);
    assert!(matches!(action, Action::Pause));
    assert_eq!(p.calls.len(), 2, "no call for a local denial");
    assert_eq!(p.responded[0].0, 429);
    assert_eq!(p.counts.get(&metrics().denied_local), Some(&1));
}

#[test]
fn a_client_over_its_requests_in_flight_is_answered_at_once_and_a_stream_end_frees_one() {
    let config = r#"{"check": {"cluster": "sluice"}, "identities": {"ip": {}, "api_key": {"header": "x-api-key"}},
      "share": "process", "concurrency": {"local": {"by": "api_key", "limit": 2}}}"#;
    let mut s = shared(config);
    let mut p = get("/");
    let mut running: Vec<Flow> = (0..2).map(|_| Flow::default()).collect();
    for flow in &mut running {
        flow.on_request_headers(&mut s, &mut p, Micros::SECOND);
    }
    assert_eq!(p.calls.len(), 2, "two in flight, each checked");
    let action = Flow::default().on_request_headers(&mut s, &mut p, Micros::SECOND);
    assert!(matches!(action, Action::Pause));
    assert_eq!(p.calls.len(), 2, "no call for the third");
    let (status, headers, _) = &p.responded[0];
    assert_eq!(*status, 429);
    assert!(has(headers, "retry-after", "1"), "{headers:?}");
    let policy = r#""in_flight";q=2;qu="concurrent-requests""#;
    assert!(has(headers, "ratelimit-policy", policy), "no window: {headers:?}");
    assert_eq!(p.counts.get(&metrics().denied_in_flight), Some(&1));
    // A stream that ends, however it ends, gives its slot back at once.
    running[0].on_log(&mut s, &mut p, Micros::new(1_100_000));
    assert_eq!(p.counts.get(&metrics().in_flight_ended), Some(&1));
    Flow::default().on_request_headers(&mut s, &mut p, Micros::new(1_200_000));
    assert_eq!(p.calls.len(), 3, "its slot freed");
}

#[test]
fn no_answer_is_retried_once_then_the_failure_policy_decides() {
    let closed = r#"{"check": {"cluster": "sluice", "timeout_ms": 1000}, "failure": {"mode": "closed"}}"#;
    let (mut s, mut p, mut flow) = (shared(closed), get("/"), Flow::default());
    flow.on_request_headers(&mut s, &mut p, Micros::SECOND);
    // No response at all, 10 ms later: sent again, still paused.
    assert!(!flow.on_call_response(&mut s, &mut p, Micros::new(1_010_000)));
    assert_eq!(p.calls.len(), 2);
    assert_eq!(p.calls[0].2, p.calls[1].2, "the same check, again");
    assert!(!flow.on_call_response(&mut s, &mut p, Micros::new(1_020_000)));
    assert_eq!(p.calls.len(), 2, "retried once only");
    assert_eq!(p.responded[0].0, 503);
    assert_eq!(p.counts.get(&metrics().check_retries), Some(&1));
    assert_eq!(p.counts.get(&metrics().failed_closed), Some(&1));
}

#[test]
fn failing_open_admits_within_the_fallback_bucket_and_the_breaker_stops_calling() {
    let open = r#"{"check": {"cluster": "sluice"}, "failure": {"mode": "open",
      "fallback": {"rate_per_s": 1, "burst": 3}, "breaker": {"failures": 2, "cooldown_ms": 5000}}}"#;
    let mut s = shared(open);
    let mut p = get("/");
    p.refuse_calls = true;
    let actions: Vec<bool> = (0..4)
        .map(|_| {
            matches!(
                Flow::default().on_request_headers(&mut s, &mut p, Micros::SECOND),
                Action::Continue
            )
        })
        .collect();
    assert_eq!(
        actions,
        [true, true, true, false],
        "the fallback's burst of 3, then 429"
    );
    assert_eq!(p.responded[0].0, 429);
    // Two refused calls opened the breaker: no call is even tried until it cools down.
    p.refuse_calls = false;
    Flow::default().on_request_headers(&mut s, &mut p, Micros::from_secs(2));
    assert!(p.calls.is_empty(), "the breaker is open");
    Flow::default().on_request_headers(&mut s, &mut p, Micros::from_secs(7));
    assert_eq!(p.calls.len(), 1, "after the cooldown, a probe");
}

/// Issue 66: a page on another origin sees only the response headers
/// `Access-Control-Expose-Headers` names. A request with `Origin` gets the filter's headers
/// named there, merged with what the response named; a 429 names its own; a request without
/// `Origin`, or a configuration with `"cors_expose": false`, gets no such header.
#[test]
fn a_cors_request_is_told_which_headers_it_may_read() {
    let cors = |p: &mut Fake| {
        p.request.insert("origin".into(), "https://app.example".into());
    };
    let (mut s, mut flow, mut p) = (shared(CHECKED), Flow::default(), get("/api"));
    cors(&mut p);
    flow.on_request_headers(&mut s, &mut p, Micros::SECOND);
    p.answer = Some(("200".into(), DENIED.into()));
    flow.on_call_response(&mut s, &mut p, Micros::new(1_010_000));
    let (_, headers, _) = &p.responded[0];
    let exposed =
        "X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, RateLimit-Policy, RateLimit, Retry-After";
    assert!(has(headers, "access-control-expose-headers", exposed), "{headers:?}");

    let (mut flow, mut p) = (Flow::default(), get("/api"));
    cors(&mut p);
    p.response
        .insert("access-control-expose-headers".into(), "ETag, ratelimit".into());
    flow.on_request_headers(&mut s, &mut p, Micros::from_secs(2));
    p.answer = Some(("200".into(), ALLOWED.into()));
    flow.on_call_response(&mut s, &mut p, Micros::new(2_010_000));
    flow.on_response_headers(&mut s, &mut p);
    assert_eq!(
        p.response.get("access-control-expose-headers").map(String::as_str),
        Some("ETag, ratelimit, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, RateLimit-Policy")
    );
    assert!(has(&p.added, "x-ratelimit-limit", "5"), "{:?}", p.added);

    // Not a CORS request: nothing exposed.
    let (mut flow, mut p) = (Flow::default(), get("/api"));
    flow.on_request_headers(&mut s, &mut p, Micros::from_secs(3));
    p.answer = Some(("200".into(), ALLOWED.into()));
    flow.on_call_response(&mut s, &mut p, Micros::new(3_010_000));
    flow.on_response_headers(&mut s, &mut p);
    assert_eq!(p.response.get("access-control-expose-headers"), None);

    // Turned off.
    let off = CHECKED.replacen('{', r#"{"cors_expose": false, "#, 1);
    let (mut s, mut flow, mut p) = (shared(&off), Flow::default(), get("/api"));
    cors(&mut p);
    flow.on_request_headers(&mut s, &mut p, Micros::SECOND);
    p.answer = Some(("200".into(), DENIED.into()));
    flow.on_call_response(&mut s, &mut p, Micros::new(1_010_000));
    let (_, headers, _) = &p.responded[0];
    assert!(
        !headers.iter().any(|(k, _)| k == "access-control-expose-headers"),
        "{headers:?}"
    );
}
