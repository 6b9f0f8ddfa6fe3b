//! Parsing a typical response's rate-limit headers and formatting a full set.

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_core::headers::{
    denial_body, format_headers, write_denial_body, write_headers, HeaderBuf, HeaderMode, Quota,
};
use sluice_pace::headers::parse_headers;

/// A benchmark's name, the response status and its header lines.
type Case<'a> = (&'a str, u16, &'a [(&'a str, &'a str)]);

fn headers(c: &mut Criterion) {
    let now_ms = 1_774_312_813_000;
    let cases: [Case<'_>; 5] = [
        // What the filter sends on an allowed response, among a few ordinary headers.
        (
            "parse/typical (sluice, 8 headers)",
            200,
            &[
                ("Content-Type", "application/json"),
                ("Content-Length", "1532"),
                ("Date", "Tue, 24 Mar 2026 00:40:13 GMT"),
                ("X-RateLimit-Limit", "100"),
                ("X-RateLimit-Remaining", "47"),
                ("X-RateLimit-Reset", "1774312860"),
                ("RateLimit-Policy", "\"search-per-user\";q=100;w=60"),
                ("RateLimit", "\"search-per-user\";r=47;t=47"),
            ],
        ),
        (
            "parse/ietf only",
            200,
            &[
                ("RateLimit-Policy", "\"search-per-user\";q=100;w=60"),
                ("RateLimit", "\"search-per-user\";r=47;t=47"),
            ],
        ),
        (
            "parse/no quota",
            200,
            &[
                ("Content-Type", "application/json"),
                ("Content-Length", "1532"),
                ("Date", "Tue, 24 Mar 2026 00:40:13 GMT"),
            ],
        ),
        (
            "parse/x-ratelimit only (github)",
            200,
            &[
                ("Content-Type", "application/json"),
                ("x-ratelimit-limit", "5000"),
                ("x-ratelimit-remaining", "4999"),
                ("x-ratelimit-reset", "1774316400"),
                ("x-ratelimit-used", "1"),
                ("x-ratelimit-resource", "core"),
            ],
        ),
        (
            "parse/429 two policies + http-date",
            429,
            &[
                ("RateLimit-Policy", "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400"),
                ("RateLimit", "\"burst\";r=0;t=5, \"daily\";r=900;t=3600"),
                ("Retry-After", "Tue, 24 Mar 2026 00:42:00 GMT"),
            ],
        ),
    ];
    for (name, status, headers) in cases {
        c.bench_function(name, |b| {
            b.iter(|| parse_headers(status, black_box(headers).iter().copied(), now_ms))
        });
    }

    let quota = Quota {
        policy: "search-per-user",
        limit: 100,
        remaining: 0,
        reset_after_ms: 47_000,
        window_ms: 60_000,
        retry_after_ms: Some(47_000),
        now_ms,
    };
    let mut buf = HeaderBuf::new();
    c.bench_function("format/write_headers all (reused HeaderBuf)", |b| {
        b.iter(|| {
            write_headers(black_box(&quota), HeaderMode::All, &mut buf);
            black_box(buf.len())
        })
    });
    let mut body = String::with_capacity(128);
    c.bench_function("format/write_headers all + 429 body (reused)", |b| {
        b.iter(|| {
            write_headers(black_box(&quota), HeaderMode::All, &mut buf);
            body.clear();
            write_denial_body(black_box(47_000), &mut body);
            black_box(body.len())
        })
    });
    let mut out = Vec::with_capacity(8);
    c.bench_function("format/format_headers all + denial_body (owned)", |b| {
        b.iter(|| {
            out.clear();
            format_headers(black_box(&quota), HeaderMode::All, &mut out);
            black_box(denial_body(47_000))
        })
    });
}

criterion_group!(benches, headers);
criterion_main!(benches);
