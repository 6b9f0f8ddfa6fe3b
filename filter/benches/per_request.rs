//! The filter's per-request cost in the harness (library mode, virtual clock): a whole
//! request on the check path (headers → check call → answer → response headers with the
//! rate-limit headers added → done), on the local-deny path (the prefilter answers 429
//! without a call), and on the leased path (a lease held in the filter admits it, headers
//! added, no call).
//!
//! `cargo bench -p sluice-filter --bench per_request`; with `SLUICE_FILTER_WASM=old.wasm`
//! it measures that module instead (an earlier build, for a before and after in one sitting).

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use sluice_harness::{CallResponse, Flavor, Host, Outcome};

const RESPONSE: [(&str, &str); 2] = [(":status", "200"), ("content-length", "2")];

fn check_path(host: &mut Host, ip: &str) {
    let (s, outcome) = common::request(host, ip, "/api/search", &[("x-user-id", "42")]);
    assert_eq!(outcome, Outcome::Pause);
    let token = host.pending_calls()[0].token;
    host.respond_call(token, common::answer(true, 99, 600, 0)).unwrap();
    host.response_headers(s, &RESPONSE, false).unwrap();
    host.finish_stream(s).unwrap();
    // The prefilter refills 200 tokens/s: 5 ms of virtual time per request keeps it allowing.
    host.advance(Duration::from_millis(5)).unwrap();
}

fn local_deny(host: &mut Host, ip: &str) {
    let (s, outcome) = common::request(host, ip, "/api/search", &[]);
    assert!(matches!(outcome, Outcome::LocalResponse(ref r) if r.status == 429));
    host.finish_stream(s).unwrap();
}

fn leased(host: &mut Host, ip: &str) {
    let (s, outcome) = common::request(host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Continue, "decided by the lease");
    host.response_headers(s, &RESPONSE, false).unwrap();
    host.finish_stream(s).unwrap();
}

/// A host leasing a rule of 50 million a minute per IP, holding a lease of `ip`'s quota that
/// lasts the whole benchmark (the virtual clock does not move).
fn leasing_host(ip: &str) -> Host {
    let mut config = common::config();
    config["lease"] = json!({"tick_ms": 50, "poll_ms": 60_000});
    config["local"] = serde_json::Value::Null; // the clock stands still: no refill
    let mut host = common::host_with(&config, Flavor::Envoy);
    host.advance(Duration::from_millis(50)).unwrap();
    let rules = r#"{"rule": [{"name": "per-ip", "by": "ip", "algorithm": "token_bucket",
        "limit": 50000000, "window": "1m", "lease": true, "lease_ttl": "60s"}]}"#;
    let token = host.pending_calls()[0].token;
    host.respond_call(token, CallResponse::new(200, rules)).unwrap();
    let (_, outcome) = common::request(&mut host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Pause, "no lease yet: checked");
    let token = host.pending_calls()[0].token;
    host.respond_call(token, common::answer(true, 99, 600, 0)).unwrap();
    host.advance(Duration::from_millis(50)).unwrap();
    let call = host.pending_calls()[0].clone();
    let grant = json!({"rules_version": 1, "returned": [], "grants": [{"lease": 1, "units": 100_000_000u64,
        "expires_in_ms": 60_000, "limit": 50_000_000u64, "remaining": 40_000_000u64,
        "reset_after_ms": 6_000, "window_ms": 60_000}]});
    host.respond_call(call.token, CallResponse::new(200, grant.to_string()))
        .unwrap();
    host
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("filter");

    let mut host = common::host();
    g.bench_function("check_path_allowed", |b| {
        b.iter(|| check_path(&mut host, "203.0.113.9"))
    });

    // A local bucket of one token that never refills: every request after the first is
    // denied by the prefilter.
    let mut config = common::config();
    config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": 1, "max_keys": 1000});
    let mut host = common::host_with(&config, Flavor::Envoy);
    check_path(&mut host, "198.51.100.1");
    g.bench_function("local_deny_429", |b| b.iter(|| local_deny(&mut host, "198.51.100.1")));

    let mut host = leasing_host("203.0.113.7");
    g.bench_function("leased_allowed", |b| b.iter(|| leased(&mut host, "203.0.113.7")));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
