//! What a request's path and identities cost before a check goes out, in the filter and
//! again in the service: the canonical path, the IP key, the digest of a long value — each
//! beside what it replaced (the query cut off and a byte cut), measured in the same run.

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

use std::net::IpAddr;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_core::identity::{bounded, ip_key};
use sluice_core::path::canonical;
use sluice_core::text::truncate;

fn paths(c: &mut Criterion) {
    for (name, path) in [
        ("plain", "/api/v1/search/items?q=rust&page=2"),
        ("dotted", "/api//v1/./search/x/../items?q=rust&page=2"),
        ("escaped", "/api/v1/%73earch/items%2Fall?q=rust"),
    ] {
        c.bench_function(&format!("path/before: query cut ({name})"), |b| {
            b.iter(|| truncate(black_box(path).split('?').next().unwrap_or("/"), 4096).to_owned())
        });
        c.bench_function(&format!("path/canonical ({name})"), |b| {
            b.iter(|| truncate(&canonical(black_box(path)), 4096).to_owned())
        });
    }
}

fn identities(c: &mut Criterion) {
    let v4: IpAddr = "203.0.113.9".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let v6: IpAddr = "2001:db8:1:2:aaaa:bbbb:cccc:dddd".parse().unwrap_or(v4);
    c.bench_function("ip/before: to_string (v4)", |b| b.iter(|| black_box(v4).to_string()));
    c.bench_function("ip/key (v4)", |b| b.iter(|| ip_key(black_box(v4), 64)));
    c.bench_function("ip/before: to_string (v6)", |b| b.iter(|| black_box(v6).to_string()));
    c.bench_function("ip/key (v6 /64)", |b| b.iter(|| ip_key(black_box(v6), 64)));
    let key = "sk-live-0123456789abcdef0123456789abcdef";
    let long = "k".repeat(1_000);
    c.bench_function("value/before: cut (40 B)", |b| {
        b.iter(|| truncate(black_box(key), 256).to_owned())
    });
    c.bench_function("value/bounded (40 B)", |b| {
        b.iter(|| bounded(black_box(key)).into_owned())
    });
    c.bench_function("value/before: cut (1,000 B)", |b| {
        b.iter(|| truncate(black_box(&long), 256).to_owned())
    });
    c.bench_function("value/bounded (1,000 B: digest)", |b| {
        b.iter(|| bounded(black_box(&long)).into_owned())
    });
}

criterion_group!(benches, paths, identities);
criterion_main!(benches);
