//! The price module's calls in wasmtime, in library mode (one stream's hooks, no sockets):
//! `KIND 0` against `KIND K`, whose difference over K is one call's price here, beside the
//! price `scripts/bench-envoy`'s `price:KIND:K` cases find in Envoy's V8.
//!
//! `cargo bench -p sluice-harness --bench price`

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use sluice_harness::{Host, HostOptions, Plugin};
use sluice_testkit::wasm_module_bytes;

const HEADERS: [(&str, &str); 4] = [
    (":method", "GET"),
    (":path", "/api/hello"),
    (":authority", "api.example.test"),
    ("x-forwarded-for", "203.0.113.9"),
];

fn prices(c: &mut Criterion) {
    let plugin = Plugin::compile(&wasm_module_bytes("sluice-price-module")).unwrap();
    let mut g = c.benchmark_group("price_in_wasmtime");
    for config in [
        "compute 0",
        "compute 1000",
        "header 0",
        "header 64",
        "property 64",
        "add-header 64",
    ] {
        let mut host = Host::from_plugin(&plugin, HostOptions::default()).unwrap();
        host.start(b"", config.as_bytes()).unwrap();
        g.bench_function(config, |b| {
            b.iter(|| {
                let s = host.new_stream().unwrap();
                host.set_property(s, "source.address", "203.0.113.9:4242");
                host.request_headers(s, &HEADERS, true).unwrap();
                host.response_headers(s, &[(":status", "200")], true).unwrap();
                host.finish_stream(s).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, prices);
criterion_main!(benches);
