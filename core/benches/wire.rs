//! What the service spends reading a check and writing its answer with the one codec both
//! sides share (`sluice_core::json`), beside serde_json (its codec for these calls until
//! 2026-11-27) decoding the same body into the same shape and encoding the same answer,
//! measured in the same run.

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

use std::collections::BTreeMap;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_core::wire::{CheckRequest, CheckResponse, RuleResult};

/// The request as serde read it: the same fields, unknown ones refused (then validated, as
/// the service did).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SerdeRequest {
    identities: BTreeMap<String, String>,
    method: String,
    path: String,
    #[serde(default)]
    cost: Option<u64>,
    #[serde(default)]
    host: Option<String>,
}

/// The answer as serde wrote it.
#[derive(serde::Serialize)]
struct SerdeResponse<'a> {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    retry_after_ms: u64,
    reset_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a str>,
    window_ms: u64,
    rules: Vec<SerdeRule<'a>>,
    delay_ms: u64,
    degraded: bool,
}

#[derive(serde::Serialize)]
struct SerdeRule<'a> {
    name: &'a str,
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
}

const BODY: &[u8] = br#"{"identities":{"ip":"203.0.113.9","user":"42","tier":"free"},"method":"GET","path":"/api/v1/search/items","cost":1,"host":"api.example.com"}"#;

fn requests(c: &mut Criterion) {
    c.bench_function("check request/json (ours)", |b| {
        b.iter(|| CheckRequest::from_json(black_box(BODY)))
    });
    c.bench_function("check request/serde_json", |b| {
        b.iter(|| {
            let r = serde_json::from_slice::<SerdeRequest>(black_box(BODY)).ok()?;
            let r = CheckRequest {
                identities: r.identities,
                method: r.method,
                path: r.path,
                cost: r.cost.unwrap_or(1),
                host: r.host,
            };
            r.validate().ok().map(|()| r)
        })
    });
}

fn answers(c: &mut Criterion) {
    let rule = |name: &str| RuleResult {
        name: name.to_owned(),
        allowed: true,
        limit: 100,
        remaining: 57,
        reset_after_ms: 31_250,
    };
    let answer = CheckResponse {
        allowed: true,
        limit: 100,
        remaining: 57,
        reset_after_ms: 31_250,
        retry_after_ms: 0,
        reset_at: 1_790_000_031,
        policy: Some("per-user".to_owned()),
        window_ms: 60_000,
        rules: vec![rule("per-user"), rule("per-ip"), rule("burst")],
        delay_ms: 0,
        degraded: false,
        slots: Vec::new(),
    };
    c.bench_function("check answer/json (ours, three rules)", |b| {
        b.iter(|| black_box(&answer).to_json())
    });
    c.bench_function("check answer/serde_json (three rules)", |b| {
        b.iter(|| {
            let a = black_box(&answer);
            serde_json::to_string(&SerdeResponse {
                allowed: a.allowed,
                limit: a.limit,
                remaining: a.remaining,
                reset_after_ms: a.reset_after_ms,
                retry_after_ms: a.retry_after_ms,
                reset_at: a.reset_at,
                policy: a.policy.as_deref(),
                window_ms: a.window_ms,
                rules: a
                    .rules
                    .iter()
                    .map(|r| SerdeRule {
                        name: &r.name,
                        allowed: r.allowed,
                        limit: r.limit,
                        remaining: r.remaining,
                        reset_after_ms: r.reset_after_ms,
                    })
                    .collect(),
                delay_ms: a.delay_ms,
                degraded: a.degraded,
            })
            .ok()
        })
    });
}

criterion_group!(benches, requests, answers);
criterion_main!(benches);
