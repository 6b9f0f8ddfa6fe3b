//! The filter's per-request cost in the harness (library mode, virtual clock): a whole
//! request on the check path (headers → check call → answer → response headers with the
//! rate-limit headers added → done) and on the local-deny path (the prefilter answers 429
//! without a call).
//!
//! `cargo bench -p sluice-filter --bench per_request`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use sluice_harness::{Flavor, Host, Outcome};

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
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
