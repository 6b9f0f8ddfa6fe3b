//! Parsing a typical response's rate-limit headers and formatting a full set.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_core::headers::{denial_body, format_headers, parse_headers, HeaderMode, Quota};

fn headers(c: &mut Criterion) {
    let response = [
        ("Content-Type", "application/json"),
        ("X-RateLimit-Limit", "100"),
        ("X-RateLimit-Remaining", "47"),
        ("X-RateLimit-Reset", "1774312860"),
        ("RateLimit-Policy", "\"search-per-user\";q=100;w=60"),
        ("RateLimit", "\"search-per-user\";r=47;t=47"),
    ];
    c.bench_function("parse/typical", |b| {
        b.iter(|| parse_headers(200, black_box(response), 1_774_312_813_000))
    });
    let quota = Quota {
        policy: "search-per-user",
        limit: 100,
        remaining: 0,
        reset_after_ms: 47_000,
        window_ms: 60_000,
        retry_after_ms: Some(47_000),
        now_ms: 1_774_312_813_000,
    };
    let mut out = Vec::with_capacity(8);
    c.bench_function("format/all+429", |b| {
        b.iter(|| {
            out.clear();
            format_headers(black_box(&quota), HeaderMode::All, &mut out);
            black_box(denial_body(47_000))
        })
    });
}

criterion_group!(benches, headers);
criterion_main!(benches);
