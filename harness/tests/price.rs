//! The price module (harness/price-module) makes exactly K calls of its kind a request, and
//! nothing else the no-op module does not: what `scripts/bench-envoy`'s `price:KIND:K` cases
//! rest on. Counted by the harness, every import.

use std::sync::OnceLock;

use sluice_harness::{Host, HostOptions, Outcome, Plugin};
use sluice_testkit::wasm_module_bytes;

fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| Plugin::compile(&wasm_module_bytes("sluice-price-module")).expect("compiles"))
}

/// The host calls of one request, its response included, with `config`; and how the request
/// went.
fn one_request(config: &str) -> (u64, Outcome) {
    let mut host = Host::from_plugin(plugin(), HostOptions::default()).expect("loads");
    host.start(b"", config.as_bytes()).expect("starts");
    let before = host.host_calls();
    let s = host.new_stream().expect("stream");
    host.set_property(s, "source.address", "192.0.2.7:4242");
    let headers = [(":method", "GET"), (":path", "/x"), (":authority", "example.test")];
    let outcome = host.request_headers(s, &headers, true).expect("request headers");
    if outcome == Outcome::Continue {
        host.response_headers(s, &[(":status", "200")], true)
            .expect("response headers");
    }
    host.finish_stream(s).expect("ends");
    (host.host_calls() - before, outcome)
}

#[test]
fn each_kind_makes_k_calls_a_request_and_nothing_else() {
    for (kind, calls_each) in [
        ("clock", 1),
        ("header", 1),
        ("header-miss", 1),
        ("header-map", 1),
        ("property", 1),
        ("property-miss", 1),
        ("metric", 1),
        ("shared-get", 1),
        ("shared-cas", 2),
        ("add-header", 1),
        ("log", 1),
        ("compute", 0),
        ("copy", 0),
        ("clock-each", 3),
        // The filter's leased request (`share: process`, the local prefilter's token in
        // hand, every header; docs/filter.md): 11 calls for its request headers, 5 headers
        // added to the response. The leanest: 8.
        ("leased-path", 16),
        ("lean-path", 8),
    ] {
        let (none, outcome) = one_request(&format!("{kind} 0"));
        assert_eq!((none, outcome), (0, Outcome::Continue), "{kind} 0: no call at all");
        let (five, outcome) = one_request(&format!("{kind} 5"));
        assert_eq!(outcome, Outcome::Continue, "{kind}");
        assert_eq!(five, 5 * calls_each, "{kind} 5");
    }
    let (calls, outcome) = one_request("local-reply 1");
    assert_eq!(calls, 1);
    assert!(
        matches!(outcome, Outcome::LocalResponse(ref r) if r.status == 429),
        "{outcome:?}"
    );
}

/// `call 1`: the request waits for its call (one host call), and its answer costs four: the
/// status and the body read, the stream made current and resumed.
#[test]
fn a_call_pauses_the_request_until_its_answer_resumes_it() {
    let mut host = Host::from_plugin(plugin(), HostOptions::default()).expect("loads");
    host.start(b"", b"call 1").expect("starts");
    let before = host.host_calls();
    let s = host.new_stream().expect("stream");
    let headers = [(":method", "GET"), (":path", "/x"), (":authority", "example.test")];
    let outcome = host.request_headers(s, &headers, true).expect("request headers");
    assert_eq!(outcome, Outcome::Pause);
    let calls = host.pending_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].header(":path"), Some("/healthz"));
    assert_eq!(host.host_calls() - before, 1);
    host.respond_call(calls[0].token, sluice_harness::CallResponse::new(200, "ok"))
        .expect("answered");
    assert_eq!(host.host_calls() - before, 5);
    assert_eq!(
        host.stream(s).map(|st| st.request_resumes),
        Some(1),
        "the request went on"
    );
}

/// `check-path 1 TOKEN`: the filter's checked request's calls around its call (docs/filter.md):
/// 12 before it and a counter after, 7 for its answer (the clock, the status and the body,
/// a latency and a counter, the stream made current and resumed), 5 response headers.
#[test]
fn the_check_path_makes_the_filters_calls_around_its_check() {
    let mut host = Host::from_plugin(plugin(), HostOptions::default()).expect("loads");
    host.start(b"", b"check-path 1 t0k").expect("starts");
    let before = host.host_calls();
    let s = host.new_stream().expect("stream");
    host.set_property(s, "source.address", "192.0.2.7:4242");
    let headers = [(":method", "GET"), (":path", "/x"), (":authority", "example.test")];
    let outcome = host.request_headers(s, &headers, true).expect("request headers");
    assert_eq!(outcome, Outcome::Pause);
    assert_eq!(host.host_calls() - before, 14, "the request's calls");
    let calls = host.pending_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].header(":path"), Some("/v1/check"));
    assert_eq!(calls[0].header("authorization"), Some("Bearer t0k"));
    host.respond_call(
        calls[0].token,
        sluice_harness::CallResponse::new(200, r#"{"allowed":true}"#),
    )
    .expect("answered");
    assert_eq!(host.host_calls() - before, 21, "the answer's calls");
    assert_eq!(host.stream(s).map(|st| st.request_resumes), Some(1), "resumed");
    host.response_headers(s, &[(":status", "200")], true)
        .expect("response headers");
    host.finish_stream(s).expect("ends");
    assert_eq!(host.host_calls() - before, 26, "the response's headers");
}

#[test]
fn a_configuration_it_cannot_read_fails_the_plugin() {
    for bad in [
        "",
        "clock",
        "clocks 3",
        "local-reply 2",
        "call 2",
        "check-path 2 t",
        "check-path 1",
    ] {
        let mut host = Host::from_plugin(plugin(), HostOptions::default()).expect("loads");
        assert!(host.start(b"", bad.as_bytes()).is_err(), "{bad:?} was taken");
    }
}
