//! Answers written out here as literal header lines, not formatted by `sluice-core` (whose
//! formatter the other tests' server uses): what the client reads from them, and how it
//! paces and retries by them. Every time is compared with a baseline of the same run.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Scripted;
use sluice_client::{default_backoff, BackoffPolicy, Client, Cost, RateLimitInfo};

const X_SPENT: &[&[&str]] = &[&[
    "HTTP/1.1 200 OK",
    "X-RateLimit-Limit: 10",
    "X-RateLimit-Remaining: 0",
    "X-RateLimit-Reset: 1",
]];

const X_LEFT: &[&[&str]] = &[&[
    "HTTP/1.1 200 OK",
    "X-RateLimit-Limit: 10",
    "X-RateLimit-Remaining: 9",
    "X-RateLimit-Reset: 1",
]];

const IETF_SPENT: &[&[&str]] = &[&[
    "HTTP/1.1 200 OK",
    r#"RateLimit-Policy: "p";q=10;w=1"#,
    r#"RateLimit: "p";r=0;t=1"#,
]];

const DENIED_FOR_1S: &[&[&str]] = &[
    &["HTTP/1.1 429 Too Many Requests", "Retry-After: 1"],
    &["HTTP/1.1 200 OK"],
];

const DENIED_FOR_0S: &[&[&str]] = &[
    &["HTTP/1.1 429 Too Many Requests", "Retry-After: 0"],
    &["HTTP/1.1 200 OK"],
];

/// Discord (discord.com/developers/docs/topics/rate-limits): routes `/a` and `/b` answer
/// with their own `X-RateLimit-Bucket`, then `/a` is refused, by the global limit here
/// ("Example Exceeded Global Rate Limit Response") and by a shared resource's limit in
/// [`DISCORD_SHARED`], then `/b` is asked again.
const DISCORD_GLOBAL: &[&[&str]] = &[
    DISCORD_A,
    DISCORD_B,
    &[
        "HTTP/1.1 429 Too Many Requests",
        "Retry-After: 1",
        "X-RateLimit-Global: true",
        "X-RateLimit-Scope: global",
    ],
    DISCORD_B,
];

const DISCORD_SHARED: &[&[&str]] = &[
    DISCORD_A,
    DISCORD_B,
    &[
        "HTTP/1.1 429 Too Many Requests",
        "Retry-After: 1",
        "X-RateLimit-Limit: 5",
        "X-RateLimit-Remaining: 0",
        "X-RateLimit-Reset-After: 1",
        "X-RateLimit-Bucket: a",
        "X-RateLimit-Scope: shared",
    ],
    DISCORD_B,
];

const DISCORD_A: &[&str] = &[
    "HTTP/1.1 200 OK",
    "X-RateLimit-Limit: 5",
    "X-RateLimit-Remaining: 4",
    "X-RateLimit-Reset-After: 1",
    "X-RateLimit-Bucket: a",
];

const DISCORD_B: &[&str] = &[
    "HTTP/1.1 200 OK",
    "X-RateLimit-Limit: 5",
    "X-RateLimit-Remaining: 4",
    "X-RateLimit-Reset-After: 1",
    "X-RateLimit-Bucket: b",
];

/// OpenAI's headers (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers")
/// with a token quota of 1,000 draining: 600 left after the first request, 200 after the
/// second, whole again a second later.
const OPENAI_TOKENS: &[&[&str]] = &[
    &[
        "HTTP/1.1 200 OK",
        "x-ratelimit-limit-requests: 60",
        "x-ratelimit-remaining-requests: 59",
        "x-ratelimit-reset-requests: 1s",
        "x-ratelimit-limit-tokens: 1000",
        "x-ratelimit-remaining-tokens: 600",
        "x-ratelimit-reset-tokens: 1s",
    ],
    &[
        "HTTP/1.1 200 OK",
        "x-ratelimit-limit-requests: 60",
        "x-ratelimit-remaining-requests: 58",
        "x-ratelimit-reset-requests: 1s",
        "x-ratelimit-limit-tokens: 1000",
        "x-ratelimit-remaining-tokens: 200",
        "x-ratelimit-reset-tokens: 1s",
    ],
    &["HTTP/1.1 200 OK"],
];

/// Three requests one after the other, each expected to spend `tokens`: the second one's
/// quota, and the time from the second request's arrival to the third's.
async fn three_costing(server: &Scripted, tokens: u64) -> (RateLimitInfo, Duration) {
    let client = Client::new().expect("client");
    let cost = Cost::new().with("tokens", tokens);
    let mut quotas = Vec::new();
    for _ in 0..3 {
        let response = client
            .send_with_cost(client.get(server.url()), &cost)
            .await
            .expect("response");
        assert_eq!(response.status().as_u16(), 200);
        quotas.push(response.quota().clone());
    }
    (quotas.swap_remove(1), server.gap(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_token_quota_holds_a_request_that_would_overspend_it_until_its_reset() {
    let (big, small) = (Scripted::start(OPENAI_TOKENS), Scripted::start(OPENAI_TOKENS));
    let ((quota, big_gap), (_, small_gap)) = tokio::join!(three_costing(&big, 400), three_costing(&small, 100));
    assert_eq!(
        (quota.limit, quota.remaining),
        (Some(60), Some(58)),
        "the requests quota"
    );
    let tokens = quota.quota("tokens").expect("the tokens quota");
    assert_eq!(
        (tokens.limit, tokens.remaining, tokens.reset_after_ms),
        (Some(1_000), Some(200), Some(1_000))
    );
    println!("third request after {big_gap:?} (400 tokens), {small_gap:?} (100 tokens), 200 left");
    assert!(
        big_gap >= Duration::from_secs(1),
        "400 tokens went {big_gap:?} after, with 200 left, before the reset"
    );
    assert!(
        small_gap < big_gap / 2,
        "100 tokens fit in the 200 left, yet waited {small_gap:?}"
    );
}

/// `/a`, `/b`, `/a` (refused, not retried), `/b` with a fresh client: the last response's
/// statuses, and the time from the refusal to the next request's arrival.
async fn other_route_after_a_429(server: &Scripted) -> (Vec<u16>, Duration) {
    let client = Client::builder()
        .retry_statuses(Vec::<reqwest::StatusCode>::new())
        .build()
        .expect("client");
    let (a, b) = (format!("{}a", server.url()), format!("{}b", server.url()));
    let mut statuses = Vec::new();
    for url in [&a, &b, &a, &b] {
        let response = client.send(client.get(url)).await.expect("response");
        statuses.push(response.status().as_u16());
    }
    (statuses, server.gap(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_global_429_holds_every_route_of_the_host_a_shared_one_only_its_own() {
    let (global, shared) = (Scripted::start(DISCORD_GLOBAL), Scripted::start(DISCORD_SHARED));
    let ((global_statuses, global_gap), (shared_statuses, shared_gap)) =
        tokio::join!(other_route_after_a_429(&global), other_route_after_a_429(&shared));
    assert_eq!(global_statuses, [200, 200, 429, 200]);
    assert_eq!(shared_statuses, [200, 200, 429, 200]);
    println!("/b after the 429 on /a: {global_gap:?} (global), {shared_gap:?} (shared)");
    assert!(
        global_gap >= Duration::from_secs(1),
        "/b went {global_gap:?} after a global 429 with Retry-After: 1"
    );
    assert!(
        shared_gap < global_gap / 2,
        "/b waited {shared_gap:?} for a shared limit on /a's bucket"
    );
}

/// Sends two GETs one after the other with a fresh client: the first one's quota, and the
/// time between their arrivals at the server.
async fn two_requests(server: &Scripted) -> (RateLimitInfo, Duration) {
    let client = Client::new().expect("client");
    let first = client.send(client.get(server.url())).await.expect("response");
    let second = client.send(client.get(server.url())).await.expect("response");
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    (first.quota().clone(), server.gap(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_x_ratelimit_remaining_0_holds_the_next_request_until_the_literal_reset() {
    let (spent, left) = (Scripted::start(X_SPENT), Scripted::start(X_LEFT));
    let ((spent_quota, spent_gap), (left_quota, left_gap)) = tokio::join!(two_requests(&spent), two_requests(&left));
    let expected = RateLimitInfo {
        limit: Some(10),
        remaining: Some(0),
        reset_after_ms: Some(1_000),
        ..RateLimitInfo::default()
    };
    assert_eq!(spent_quota, expected);
    assert_eq!(left_quota.remaining, Some(9));
    println!("next request after {spent_gap:?} (remaining 0), {left_gap:?} (remaining 9)");
    assert!(
        spent_gap >= Duration::from_secs(1),
        "sent {spent_gap:?} after, before the reset"
    );
    assert!(left_gap < spent_gap / 2, "with 9 left it waited {left_gap:?} too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_ietf_fields_let_the_next_request_go_after_one_refill_not_at_the_reset() {
    let (ietf, legacy) = (Scripted::start(IETF_SPENT), Scripted::start(X_SPENT));
    let ((quota, ietf_gap), (_, legacy_gap)) = tokio::join!(two_requests(&ietf), two_requests(&legacy));
    let expected = RateLimitInfo {
        limit: Some(10),
        remaining: Some(0),
        reset_after_ms: Some(1_000),
        policy: Some("p".to_owned()),
        window_ms: Some(1_000),
        ..RateLimitInfo::default()
    };
    assert_eq!(quota, expected);
    println!("next request after {ietf_gap:?} (IETF, w=1 q=10), {legacy_gap:?} (X-RateLimit, no window)");
    // w / q = 100 ms refills one request; without a window only the reset (1 s) does.
    assert!(
        ietf_gap >= Duration::from_millis(100),
        "sent {ietf_gap:?} after, before a refill"
    );
    assert!(
        ietf_gap < legacy_gap / 2,
        "{ietf_gap:?}: waited for the reset as if no window were known"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_literal_429_with_retry_after_1_is_retried_after_that_second() {
    let (denied, baseline) = (Scripted::start(DENIED_FOR_1S), Scripted::start(DENIED_FOR_0S));
    // Jitter of at most 1 ms on top of the server's floor.
    let backoff = BackoffPolicy {
        base_ms: 1,
        ..default_backoff()
    };
    let send = |server: &Scripted| {
        let floors = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&floors);
        let client = Client::builder()
            .backoff(backoff)
            .on_retry(move |event| log.lock().expect("lock").push(event.floor))
            .build()
            .expect("client");
        let url = server.url();
        async move {
            let response = client.send(client.get(url)).await.expect("response");
            assert_eq!((response.status().as_u16(), response.retries()), (200, 1));
            let floors = floors.lock().expect("lock").clone();
            floors
        }
    };
    let (floors, baseline_floors) = tokio::join!(send(&denied), send(&baseline));
    let (waited, baseline_waited) = (denied.gap(0), baseline.gap(0));
    println!("retried after {waited:?} (Retry-After: 1), {baseline_waited:?} (Retry-After: 0)");
    assert!(
        waited >= Duration::from_secs(1),
        "retried {waited:?} after, before Retry-After"
    );
    assert!(
        waited < baseline_waited + Duration::from_secs(2),
        "retried {waited:?} after, far beyond the 1 s asked"
    );
    assert_eq!(floors, [Some(Duration::from_secs(1))]);
    assert_eq!(baseline_floors, [Some(Duration::ZERO)]);
}

/// Discord's bucket header on every answer (discord.com/developers/docs/topics/rate-limits).
const DISCORD_BUCKET: &[&[&str]] = &[&[
    "HTTP/1.1 200 OK",
    "X-RateLimit-Limit: 5",
    "X-RateLimit-Remaining: 4",
    "X-RateLimit-Reset-After: 1",
    "X-RateLimit-Bucket: abcd1234",
]];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_the_server_puts_in_one_named_bucket_share_one_client_bucket() {
    let server = Scripted::start(DISCORD_BUCKET);
    let client = Client::new().expect("client");
    let (a, b) = (
        format!("{}/channels/1", server.url()),
        format!("{}/channels/2", server.url()),
    );
    for url in [&a, &b] {
        let response = client.send(client.get(url.as_str())).await.expect("response");
        assert_eq!(response.quota().policy.as_deref(), Some("abcd1234"));
    }
    let bucket_a = client.bucket_for(&a.parse().expect("url"));
    let bucket_b = client.bucket_for(&b.parse().expect("url"));
    assert!(bucket_a.ends_with(" abcd1234"), "{bucket_a}");
    assert_eq!(bucket_a, bucket_b, "two routes of one Discord bucket are paced as one");
}
