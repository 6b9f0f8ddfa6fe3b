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
        // The filter's leased request (`share: process`, the local prefilter, every
        // header), as Envoy's trace log shows it: 17 calls for its request headers, 5
        // headers added to the response, the clock as it ends.
        ("leased-path", 23),
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

#[test]
fn a_configuration_it_cannot_read_fails_the_plugin() {
    for bad in ["", "clock", "clocks 3", "local-reply 2"] {
        let mut host = Host::from_plugin(plugin(), HostOptions::default()).expect("loads");
        assert!(host.start(b"", bad.as_bytes()).is_err(), "{bad:?} was taken");
    }
}
