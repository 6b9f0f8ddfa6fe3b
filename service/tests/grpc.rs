//! Envoy's rate limit service API (gRPC) driven by a tonic client, over the memory store and
//! a real `redis-server`: envoyproxy/ratelimit's README examples (their configurations as
//! printed there, and the decisions the README describes), the response's fields and
//! headers, bad requests, store failures, health, and exactness under 64 concurrent clients.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_core::rules::RuleSet;
use sluice_service::edge::Edge;
use sluice_service::grpc::descriptors::DescriptorSet;
use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_service::grpc::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_service::grpc::{self, config, AnswerHeaders, RateLimiter};
use sluice_service::node::{Node, NodeConfig};
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{RedisOptions, RedisStore};
use sluice_service::store::Store;
use sluice_testkit::RedisServer;
use tonic::transport::Channel;

/// A stop signal that never comes: the server runs until the test ends.
fn never_stop() -> tokio::sync::watch::Receiver<bool> {
    tokio::sync::watch::channel(false).1
}

type Client = RateLimitServiceClient<Channel>;

/// Serves the gRPC API over `store` with the YAML `configs` on a free loopback port.
async fn serve(store: Store, configs: &[&str]) -> (Client, Arc<Node>) {
    // Long enough that 1,280 concurrent calls all get the store's answer: a timed-out call
    // would be decided by the fail-open fallback buckets instead (tested apart).
    let config = NodeConfig {
        store_timeout: Duration::from_secs(10),
        ..NodeConfig::default()
    };
    serve_with(store, configs, config).await
}

/// [`serve`] with the node's `config`, headers on every answer.
async fn serve_with(store: Store, configs: &[&str], config: NodeConfig) -> (Client, Arc<Node>) {
    serve_headers(store, configs, config, AnswerHeaders::Always).await
}

/// [`serve_with`], the answers carrying headers as `headers` says.
async fn serve_headers(
    store: Store,
    configs: &[&str],
    config: NodeConfig,
    headers: AnswerHeaders,
) -> (Client, Arc<Node>) {
    let parsed = configs
        .iter()
        .map(|c| config::parse(c).expect("test YAML parses"))
        .collect();
    let descriptors = Arc::new(DescriptorSet::new(parsed).expect("test configuration is valid"));
    let node = Node::new(store, RuleSet::default(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let limiter = RateLimiter::new(node.clone(), descriptors, headers);
    tokio::spawn(grpc::serve(listener, limiter, None, Edge::default(), never_stop()));
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    (client, node)
}

fn memory() -> Store {
    Store::Memory(MemoryStore::new(10_000))
}

/// The memory store and a real Redis (kept running by the returned server).
async fn both_stores() -> (RedisServer, [Store; 2]) {
    let server = RedisServer::start();
    let redis = redis_store(&server).await;
    (server, [memory(), redis])
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn ask(client: &mut Client, req: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(req).await.expect("an answer").into_inner()
}

fn code(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).expect("a known code")
}

/// Waits for the start of the next whole second, so that a burst of second-long fixed
/// windows' requests falls in one window.
async fn next_second() {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    tokio::time::sleep(Duration::from_secs(1) - Duration::from_nanos(u64::from(since.subsec_nanos()))).await;
}

/// How many of `n` identical requests sent at once are admitted.
async fn admitted(client: &Client, n: usize, req: &RateLimitRequest) -> usize {
    let calls = (0..n).map(|_| {
        let (mut c, r) = (client.clone(), req.clone());
        tokio::spawn(async move { code(&ask(&mut c, r).await) == Code::Ok })
    });
    let mut ok = 0;
    for call in calls.collect::<Vec<_>>() {
        ok += usize::from(call.await.expect("task"));
    }
    ok
}

const EXAMPLE_1: &str = "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

/// README example 1: two values of one key, each with 500 per second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_1_each_value_has_its_own_500_per_second() {
    let (client, _) = serve(memory(), &[EXAMPLE_1]).await;
    let users = request("mongo_cps", &[&[("database", "users")]]);
    let default = request("mongo_cps", &[&[("database", "default")]]);
    // Up to ten tries: on a loaded machine (CI beside other builds) a burst of 560 calls
    // once took longer than a second three times running.
    for _attempt in 0..10 {
        next_second().await;
        let started = SystemTime::now();
        let (u, d) = tokio::join!(admitted(&client, 540, &users), admitted(&client, 20, &default));
        if started.elapsed().expect("clock") < Duration::from_millis(900) {
            assert_eq!((u, d), (500, 20), "users: 500 of 540; default: its own 500");
            return;
        }
        // The burst ran past its second on a slow machine: try in the next one.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("540 requests never fitted in one second");
}

const EXAMPLE_2: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

/// README example 2: nested descriptors, every number its own counter, both descriptors
/// of one request limited together — and, unlike envoyproxy/ratelimit, a refused request
/// moves no counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_2_marketing_five_a_day_per_number_and_a_hundred_overall() {
    let server = RedisServer::start();
    for store in [memory(), redis_store(&server).await] {
        let (mut client, _) = serve(store, &[EXAMPLE_2]).await;
        let send = |number: &'static str| {
            request(
                "messaging",
                &[
                    &[("message_type", "marketing"), ("to_number", number)],
                    &[("to_number", number)],
                ],
            )
        };
        for i in 0..5 {
            let r = ask(&mut client, send("2061111111")).await;
            assert_eq!(code(&r), Code::Ok, "marketing message {i}");
        }
        let refused = ask(&mut client, send("2061111111")).await;
        assert_eq!(code(&refused), Code::OverLimit);
        assert_eq!(refused.statuses[0].code, Code::OverLimit as i32, "the marketing limit");
        assert_eq!(refused.statuses[1].code, Code::Ok as i32, "the per-number limit");
        assert_eq!(
            refused.statuses[1].limit_remaining, 95,
            "the refusal took nothing from it"
        );
        let other = ask(&mut client, send("2062222222")).await;
        assert_eq!(code(&other), Code::Ok, "another number has its own 5");
        let plain = ask(&mut client, request("messaging", &[&[("to_number", "2061111111")]])).await;
        assert_eq!((code(&plain), plain.statuses[0].limit_remaining), (Code::Ok, 94));
    }
}

const EXAMPLE_3: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

/// README example 3: the key and value beat the key alone; a limit of 0 refuses all.
#[tokio::test]
async fn example_3_a_value_beats_the_key_and_zero_blocks() {
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, _) = serve(store, &[EXAMPLE_3]).await;
        let other = ask(
            &mut client,
            request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]]),
        )
        .await;
        assert_eq!(code(&other), Code::Ok);
        let limit = other.statuses[0].current_limit.as_ref().expect("a limit");
        assert_eq!(limit.requests_per_unit, 10);
        let blocked = ask(
            &mut client,
            request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]]),
        )
        .await;
        assert_eq!(code(&blocked), Code::OverLimit);
    }
}

const EXAMPLE_4_FLAT: &str = "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
";

const EXAMPLE_4_NESTED: &str = "
domain: example4_nested
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
";

/// README example 4: a descriptor matches only a configuration as deep as it is long.
#[tokio::test]
async fn example_4_levels_must_match() {
    let (mut client, _) = serve(memory(), &[EXAMPLE_4_FLAT, EXAMPLE_4_NESTED]).await;
    let two = [("key", "value"), ("subkey", "subvalue")];
    let flat = ask(&mut client, request("example4", &[&two])).await;
    assert!(flat.statuses[0].current_limit.is_none(), "no limit for two tuples");
    let nested = ask(&mut client, request("example4_nested", &[&two])).await;
    let limit = nested.statuses[0].current_limit.as_ref().expect("the nested limit");
    assert_eq!(limit.requests_per_unit, 300);
}

const EXAMPLE_5: &str = "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// README example 5: an unlimited descriptor is OK with `limit_remaining` at its maximum.
#[tokio::test]
async fn example_5_unlimited() {
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, _) = serve(store, &[EXAMPLE_5]).await;
        let r = ask(&mut client, request("internal", &[&[("ldap", "x")], &[("azure", "y")]])).await;
        assert_eq!(code(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[1].limit_remaining, 99);
    }
}

const EXAMPLE_6: &str = "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
";

/// README example 6: a shadow limit counts but never refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_6_shadow_mode_counts_but_never_refuses() {
    let (client, node) = serve(memory(), &[EXAMPLE_6]).await;
    let a = request("example6", &[&[("service", "auth-service"), ("user", "user-a")]]);
    let b = request("example6", &[&[("service", "auth-service"), ("user", "user-b")]]);
    next_second().await;
    let (a_ok, b_ok) = tokio::join!(admitted(&client, 30, &a), admitted(&client, 25, &b));
    assert_eq!(a_ok, 30, "user-a is never refused");
    assert!(b_ok <= 20, "user-b is limited to 20 a second: {b_ok}");
    let metrics = node.metrics.render();
    let shadow = metrics
        .lines()
        .find(|l| l.contains("user_user-a") && l.contains("shadow_denied"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(shadow.is_some_and(|n| n >= 10), "shadow refusals counted: {metrics}");
    let near = metrics
        .lines()
        .find(|l| l.starts_with("sluice_checks_near_limit_total{") && l.contains("user_user-b"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(
        near.is_some_and(|n| n >= 1),
        "checks near user-b's limit counted: {metrics}"
    );
    for (api, n) in [("grpc_rls", 55), ("http", 0)] {
        let count = format!("sluice_check_duration_seconds_count{{api=\"{api}\"}} {n}\n");
        assert!(metrics.contains(&count), "{count} in {metrics}");
    }
}

const EXAMPLE_7: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

/// README example 7: with both descriptors, the 10/s limit replaces the 5/s one, which
/// is left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_7_replaces() {
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, _) = serve(store, &[EXAMPLE_7]).await;
        let one = [("key_1", "value_1"), ("user", "bkthomps")];
        let two = [("key_2", "value_2"), ("user", "bkthomps")];
        next_second().await;
        let both = request("example7", &[&one, &two]);
        assert_eq!(admitted(&client, 12, &both).await, 10, "10/s, not 5/s");
        let alone = ask(&mut client, request("example7", &[&one])).await;
        assert_eq!(
            (code(&alone), alone.statuses[0].limit_remaining),
            (Code::Ok, 4),
            "the replaced limit was not counted"
        );
    }
}

const EXAMPLE_11: &str = "
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

/// README examples 9 and 11: wildcard values, sharing one counter or one each.
#[tokio::test]
async fn example_11_wildcards_share_a_threshold_or_not() {
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, _) = serve(store, &[EXAMPLE_11]).await;
        for (key, file) in [("files", "files/a.pdf"), ("files", "files/b.csv")] {
            for _ in 0..5 {
                assert_eq!(
                    code(&ask(&mut client, request("example11", &[&[(key, file)]])).await),
                    Code::Ok
                );
            }
        }
        let c = ask(&mut client, request("example11", &[&[("files", "files/c.txt")]])).await;
        assert_eq!(code(&c), Code::OverLimit, "files/* share their 10");
        for _ in 0..10 {
            let r = ask(
                &mut client,
                request("example11", &[&[("files_no_share", "files_no_share/a.pdf")]]),
            )
            .await;
            assert_eq!(code(&r), Code::Ok);
        }
        let b = ask(
            &mut client,
            request("example11", &[&[("files_no_share", "files_no_share/b.csv")]]),
        )
        .await;
        assert_eq!(code(&b), Code::Ok, "b.csv has its own 10");
    }
}

/// Every field of a status, and Sluice's headers for Envoy to add (with Retry-After on a
/// refusal); hits_addend at request and descriptor level.
#[tokio::test]
async fn statuses_headers_and_hits_addend() {
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, _) = serve(store, &[EXAMPLE_2]).await;
        let mut req = request("messaging", &[&[("to_number", "1")]]);
        req.hits_addend = 30;
        let r = ask(&mut client, req.clone()).await;
        let status = &r.statuses[0];
        assert_eq!(status.limit_remaining, 70, "30 hits");
        let limit = status.current_limit.as_ref().expect("limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (100, 4), "100 a DAY (4)");
        assert!(limit.name.contains("to_number"), "{}", limit.name);
        let reset = status.duration_until_reset.expect("reset");
        assert!((1..=86_400).contains(&reset.seconds), "{reset:?}");
        let header = |r: &RateLimitResponse, name: &str| {
            r.response_headers_to_add
                .iter()
                .find(|h| h.key.eq_ignore_ascii_case(name))
                .map(|h| h.value.clone())
        };
        assert_eq!(header(&r, "X-RateLimit-Remaining").as_deref(), Some("70"));
        assert!(header(&r, "RateLimit").is_some_and(|v| v.contains(";r=70")));
        assert!(header(&r, "RateLimit-Policy").is_some_and(|v| v.contains(";q=100;w=86400")));
        assert_eq!(header(&r, "Retry-After"), None, "only on a refusal");
        // A descriptor's own hits_addend wins over the request's.
        req.descriptors[0].hits_addend = Some(70);
        let r = ask(&mut client, req.clone()).await;
        assert_eq!((code(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
        let refused = ask(&mut client, req).await;
        assert_eq!(code(&refused), Code::OverLimit);
        assert!(
            header(&refused, "Retry-After").is_some(),
            "a refusal carries Retry-After"
        );
        // Descriptors of one request at costs of their own, decided together.
        let mut mixed = request("messaging", &[&[("to_number", "2")], &[("to_number", "3")]]);
        mixed.hits_addend = 4;
        mixed.descriptors[1].hits_addend = Some(9);
        let r = ask(&mut client, mixed).await;
        let left: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
        assert_eq!(left, [96, 91], "4 from one, 9 from the other");
    }
}

/// By default only a refusal carries headers (`Retry-After` and the quota); `never` leaves
/// them to Envoy (the statuses still carry the limit and what remains).
#[tokio::test]
async fn answers_carry_headers_as_configured() {
    for (headers, on_ok, on_refusal) in [
        (AnswerHeaders::Refusals, false, true),
        (AnswerHeaders::Never, false, false),
        (AnswerHeaders::Always, true, true),
    ] {
        let (mut client, _) = serve_headers(memory(), &[EXAMPLE_2], NodeConfig::default(), headers).await;
        let mut req = request("messaging", &[&[("to_number", "1")]]);
        req.hits_addend = 100;
        let ok = ask(&mut client, req.clone()).await;
        assert_eq!((code(&ok), ok.statuses[0].limit_remaining), (Code::Ok, 0));
        let refused = ask(&mut client, req).await;
        assert_eq!(code(&refused), Code::OverLimit);
        let has = |r: &RateLimitResponse, name: &str| {
            r.response_headers_to_add
                .iter()
                .any(|h| h.key.eq_ignore_ascii_case(name))
        };
        assert_eq!(has(&ok, "RateLimit"), on_ok, "{headers:?}");
        assert_eq!(has(&refused, "Retry-After"), on_refusal, "{headers:?}");
    }
}

/// `unit: week` (any case, as every unit): Envoy's WEEK (7) in the answer, a week-long window
/// that starts on a Thursday at 00:00 UTC (aligned to the Unix epoch), and its headers.
#[tokio::test]
async fn a_weekly_limit_is_a_week_long() {
    const WEEKLY: &str = "
domain: d
descriptors:
  - key: k
    rate_limit:
      unit: Week
      requests_per_unit: 3
";
    const WEEK_S: u64 = 7 * 86_400;
    let (mut client, _) = serve(memory(), &[WEEKLY]).await;
    let r = ask(&mut client, request("d", &[&[("k", "v")]])).await;
    let status = &r.statuses[0];
    let limit = status.current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Week as i32),
        "WEEK is 7"
    );
    assert_eq!(Unit::Week as i32, 7);
    assert_eq!(status.limit_remaining, 2);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs();
    let to_thursday = WEEK_S - now % WEEK_S;
    let reset = status.duration_until_reset.expect("reset");
    let reset_s = u64::try_from(reset.seconds).expect("a positive reset");
    assert!(
        reset_s.abs_diff(to_thursday) <= 5,
        "{reset:?}, next Thursday in {to_thursday} s"
    );
    let policy = r
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case("RateLimit-Policy"))
        .map(|h| h.value.as_str());
    assert!(policy.is_some_and(|v| v.contains(";q=3;w=604800")), "{policy:?}");
}

/// A client's mistakes are INVALID_ARGUMENT naming what is wrong; unknown domains and
/// descriptors are OK, as in envoyproxy/ratelimit.
/// Issue 40: a descriptor's own `limit` (Envoy's per-request override from route metadata)
/// replaces the configured limit, applies where none is configured (in a configured
/// domain), counts apart from the configured limit, and a limit of 0 refuses; an unknown
/// unit is a clear INVALID_ARGUMENT.
#[tokio::test]
async fn a_descriptors_own_limit_replaces_the_configured_one() {
    use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use sluice_service::grpc::envoy::r#type::v3::RateLimitUnit;
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n";
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, _node) = serve(store, &[yaml]).await;
        let own = |domain: &str, key: &str, per: u32, unit: RateLimitUnit| {
            let mut r = request(domain, &[&[(key, "v")]]);
            r.descriptors[0].limit = Some(RateLimitOverride {
                requests_per_unit: per,
                unit: unit as i32,
            });
            r
        };
        let mut codes = Vec::new();
        for _ in 0..4 {
            codes.push(code(&ask(&mut client, own("d", "k", 3, RateLimitUnit::Hour)).await));
        }
        assert_eq!(
            codes,
            [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
            "3 an hour, not the configured 1"
        );
        let configured = code(&ask(&mut client, request("d", &[&[("k", "v")]])).await);
        assert_eq!(configured, Code::Ok, "the configured limit's counter is its own");
        let answer = ask(&mut client, own("d", "k", 3, RateLimitUnit::Minute)).await;
        let shown = answer.statuses[0].current_limit.clone().expect("a limit");
        assert_eq!(
            (shown.requests_per_unit, shown.unit, shown.name.as_str()),
            (3, Unit::Minute as i32, "d.k")
        );
        assert_eq!(code(&answer), Code::Ok, "3 a minute counts apart from 3 an hour");

        let unconfigured: Vec<Code> = {
            let mut codes = Vec::new();
            for _ in 0..3 {
                codes.push(code(&ask(&mut client, own("d", "other", 2, RateLimitUnit::Day)).await));
            }
            codes
        };
        assert_eq!(
            unconfigured,
            [Code::Ok, Code::Ok, Code::OverLimit],
            "applies with no configured descriptor"
        );
        let zero = ask(&mut client, own("d", "z", 0, RateLimitUnit::Second)).await;
        assert_eq!(code(&zero), Code::OverLimit, "0 refuses");
        let elsewhere = ask(&mut client, own("unconfigured", "k", 0, RateLimitUnit::Second)).await;
        assert_eq!(code(&elsewhere), Code::Ok, "an unconfigured domain has no limits");

        let bad = client
            .should_rate_limit(own("d", "k", 3, RateLimitUnit::Unknown))
            .await
            .expect_err("an unknown unit is refused");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(
            bad.message().contains("descriptor 0: its limit's unit"),
            "{}",
            bad.message()
        );
    }
}

#[tokio::test]
async fn bad_requests_are_named_and_unknown_descriptors_pass() {
    let (mut client, _) = serve(memory(), &[EXAMPLE_2]).await;
    let cases = [
        (request("", &[&[("to_number", "1")]]), "domain is empty"),
        (request("messaging", &[]), "no descriptors"),
        (request("messaging", &[&[]]), "descriptor 0 has 0 entries"),
        (request("messaging", &[&[("", "1")]]), "key is empty"),
    ];
    for (req, says) in cases {
        let status = client.should_rate_limit(req).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(says), "{}", status.message());
    }
    let unknown = ask(&mut client, request("nowhere", &[&[("a", "b")]])).await;
    assert_eq!((code(&unknown), unknown.statuses.len()), (Code::Ok, 1));
}

/// 64 concurrent clients against one limit of 1,000 a day: exactly 1,000 admitted, on
/// the memory store and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_get_exactly_the_limit() {
    const CONFIG: &str = "
domain: exact
descriptors:
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 1000
";
    let server = RedisServer::start();
    for store in [memory(), redis_store(&server).await] {
        let kind = store.kind();
        let (client, node) = serve(store, &[CONFIG]).await;
        let req = request("exact", &[&[("tenant", "acme")]]);
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (client, req) = (client.clone(), req.clone());
                tokio::spawn(async move { admitted(&client, 20, &req).await })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("task");
        }
        let metrics = node.metrics.render();
        assert!(
            metrics.contains("sluice_degraded_total 0\n"),
            "{kind}: every answer must be the store's, none the fallback's:\n{metrics}"
        );
        assert_eq!(total, 1_000, "{kind}: 1,280 asked, the limit is 1,000");
    }
}

/// The store unreachable: a limit that fails open is decided by the fallback buckets, one
/// that fails closed makes the answer an UNAVAILABLE error, for Envoy's failure_mode_deny.
#[tokio::test]
async fn store_failures_follow_each_limits_policy() {
    const CONFIG: &str = "
domain: failing
descriptors:
  - key: open
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: closed
    rate_limit:
      unit: minute
      requests_per_unit: 5
      failure_mode: closed
";
    let dead = RedisStore::start(
        &format!("redis://127.0.0.1:{}", sluice_testkit::free_port()),
        RedisOptions::new(Duration::from_millis(50)),
    )
    .expect("a store");
    let (mut client, _) = serve(Store::Redis(Box::new(dead)), &[CONFIG]).await;
    let open = ask(&mut client, request("failing", &[&[("open", "x")]])).await;
    assert_eq!(code(&open), Code::Ok, "fail open: the fallback decides");
    let closed = client
        .should_rate_limit(request("failing", &[&[("closed", "x")]]))
        .await
        .expect_err("fails closed");
    assert_eq!(closed.code(), tonic::Code::Unavailable);
    assert!(closed.message().contains("fails closed"), "{}", closed.message());
}

/// The standard health service answers SERVING for the rate limit service.
#[tokio::test]
async fn health_is_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let parsed = vec![config::parse(EXAMPLE_5).expect("yaml")];
    let node = Node::new(memory(), RuleSet::default(), NodeConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let set = Arc::new(DescriptorSet::new(parsed).expect("valid"));
    let limiter = RateLimiter::new(node, set, AnswerHeaders::default());
    tokio::spawn(grpc::serve(listener, limiter, None, Edge::default(), never_stop()));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
}

/// Configuration errors name the file's problem: an unknown key, a missing unit.
#[test]
fn configuration_errors_name_what_is_wrong() {
    let unknown = config::parse("domain: d\ndescriptors:\n  - key: a\n    colour: blue\n").expect_err("refused");
    assert!(unknown.contains("unknown field `colour`"), "{unknown}");
    assert!(unknown.contains("line 4"), "{unknown}");
    let parsed = config::parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 3\n")
        .expect("parses");
    let missing = DescriptorSet::new(vec![parsed]).expect_err("refused");
    assert!(missing.to_string().contains("rate_limit has no unit"), "{missing}");
    let unit = config::parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n")
        .expect_err("refused");
    assert!(unit.contains("invalid rate limit unit"), "{unit}");
}

/// examples/envoy-rls.yaml and examples/ratelimit.yaml go together: every descriptor Envoy
/// builds from the route's `rate_limits` (remote_address, request_headers and generic_key
/// actions, each kind present) falls under a limit of the example file, in the filter's domain.
#[test]
fn the_envoy_example_asks_for_limits_the_example_file_has() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let set = config::load(&[examples.join("ratelimit.yaml").as_path()]).expect("the example file loads");
    let text = std::fs::read_to_string(examples.join("envoy-rls.yaml")).expect("the Envoy example");
    let envoy: serde_norway::Value = serde_norway::from_str(&text).expect("the Envoy example is YAML");
    let domains = values_under(&envoy, "domain");
    let [domain] = domains.as_slice() else {
        panic!("one rate limit filter domain: {domains:?}")
    };
    let domain = domain.as_str().expect("a domain string");
    let mut kinds = Vec::new();
    for rate_limit in values_under(&envoy, "rate_limits").into_iter().flat_map(sequence) {
        let actions = rate_limit.get("actions").map_or(&[][..], sequence);
        let entries: Vec<(String, String)> = actions.iter().map(|a| envoy_entry(a, &mut kinds)).collect();
        let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let found = set.find(domain, &entries);
        assert!(found.is_some(), "no limit in ratelimit.yaml for {entries:?}");
    }
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(kinds, ["generic_key", "remote_address", "request_headers"]);
}

/// The descriptor entry an Envoy rate limit action makes, for a request with sample headers.
fn envoy_entry(action: &serde_norway::Value, kinds: &mut Vec<String>) -> (String, String) {
    let (kind, spec) = action
        .as_mapping()
        .and_then(|m| m.iter().next())
        .unwrap_or_else(|| panic!("an action is a one-key map: {action:?}"));
    let kind = kind.as_str().expect("an action's name");
    kinds.push(kind.to_owned());
    let field = |name: &str| spec.get(name).and_then(|v| v.as_str());
    match kind {
        "remote_address" => ("remote_address".into(), "198.51.100.1".into()),
        "request_headers" => {
            let header = field("header_name").expect("header_name");
            let sample = match header {
                "x-api-key" => "key-1",
                ":path" => "/api/search?q=sluice",
                _ => panic!("give the test a sample value for header {header}"),
            };
            (field("descriptor_key").expect("descriptor_key").into(), sample.into())
        }
        "generic_key" => (
            field("descriptor_key").unwrap_or("generic_key").into(),
            field("descriptor_value").expect("descriptor_value").into(),
        ),
        _ => panic!("the test knows no action {kind}"),
    }
}

/// Every value under `key` anywhere in `v`.
fn values_under<'v>(v: &'v serde_norway::Value, key: &str) -> Vec<&'v serde_norway::Value> {
    let mut found = Vec::new();
    if let Some(map) = v.as_mapping() {
        for (k, child) in map {
            if k.as_str() == Some(key) {
                found.push(child);
            }
            found.extend(values_under(child, key));
        }
    } else if let Some(items) = v.as_sequence() {
        found.extend(items.iter().flat_map(|i| values_under(i, key)));
    }
    found
}

fn sequence(v: &serde_norway::Value) -> &[serde_norway::Value] {
    v.as_sequence().map_or(&[], Vec::as_slice)
}

/// Redis with the same 10 s patience as [`serve`]'s node: on a loaded machine 1,280 calls
/// queued on one connection could outlast a shorter response timeout, and a timed-out call
/// is decided by the fail-open fallback (an over-admission the test would then count).
async fn redis_store(server: &RedisServer) -> Store {
    let store = RedisStore::connect(&server.url(), RedisOptions::new(Duration::from_secs(10)))
        .await
        .expect("redis");
    Store::Redis(Box::new(store))
}

#[tokio::test]
async fn without_the_data_token_a_call_is_unauthenticated_and_decides_nothing() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let config = NodeConfig {
        data_token: Some("grpc-secret".into()),
        ..NodeConfig::default()
    };
    let (mut client, node) = serve_with(memory(), &[yaml], config).await;
    for token in [None, Some("Bearer wrong"), Some("grpc-secret")] {
        let mut call = tonic::Request::new(request("d", &[&[("k", "v")]]));
        if let Some(t) = token {
            call.metadata_mut().insert("authorization", t.parse().expect("ascii"));
        }
        let status = client.should_rate_limit(call).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}: {status}");
        assert!(status.message().contains("--data-token-file"), "{status}");
    }
    // The refused calls spent nothing: the one request an hour is still there.
    let mut call = tonic::Request::new(request("d", &[&[("k", "v")]]));
    call.metadata_mut()
        .insert("authorization", "Bearer grpc-secret".parse().expect("ascii"));
    let answer = client.should_rate_limit(call).await.expect("served").into_inner();
    assert_eq!(code(&answer), Code::Ok);
    assert!(node.metrics.render().contains("sluice_unauthenticated_total 3\n"));
}

#[tokio::test]
async fn a_cost_over_an_http_checks_cap_is_refused_naming_it() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let (mut client, _node) = serve(memory(), &[yaml]).await;
    for (request_level, descriptor_level) in [(2_000_000, None), (1, Some(1_000_001))] {
        let mut req = request("d", &[&[("k", "v")]]);
        req.hits_addend = request_level;
        req.descriptors[0].hits_addend = descriptor_level;
        let status = client.should_rate_limit(req).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert!(status.message().contains("1000000"), "{status}");
    }
    let mut req = request("d", &[&[("k", "v")]]);
    req.hits_addend = 10;
    assert_eq!(
        code(&ask(&mut client, req).await),
        Code::Ok,
        "the cap itself is far above this"
    );
}

/// envoyproxy/ratelimit's own integration expectation: two descriptors in one request,
/// `key2` 20 a minute and `key3` 10 an hour. Once `key3` is over, every refused request
/// answers `key2` with its limit and what is left of it (a refused request takes nothing),
/// whether the store refused it or the node's memory of the store's refusal did.
#[tokio::test]
async fn a_refusal_from_memory_still_answers_the_other_descriptors() {
    const TWO: &str = "
domain: two
descriptors:
  - key: key2
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: key3
    rate_limit: { unit: hour, requests_per_unit: 10 }
";
    let (_server, stores) = both_stores().await;
    for store in stores {
        let (mut client, node) = serve(store, &[TWO]).await;
        let req = request("two", &[&[("key2", "a")], &[("key3", "b")]]);
        for n in 1..=10u32 {
            let r = ask(&mut client, req.clone()).await;
            assert_eq!(code(&r), Code::Ok, "request {n}");
            let left: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
            assert_eq!(left, [20 - n, 10 - n], "request {n}");
        }
        for n in 11..=14 {
            let r = ask(&mut client, req.clone()).await;
            assert_eq!(code(&r), Code::OverLimit, "request {n}");
            let key2 = &r.statuses[0];
            assert_eq!(Code::try_from(key2.code), Ok(Code::Ok), "request {n}: key2 {key2:?}");
            let limit = key2
                .current_limit
                .as_ref()
                .unwrap_or_else(|| panic!("request {n}: key2 without its limit"));
            assert_eq!(
                (limit.requests_per_unit, limit.unit),
                (20, 2),
                "request {n}: 20 a MINUTE (2)"
            );
            assert_eq!(key2.limit_remaining, 10, "request {n}: what is left of key2");
            let key3 = &r.statuses[1];
            assert_eq!(Code::try_from(key3.code), Ok(Code::OverLimit), "request {n}");
            assert_eq!(key3.limit_remaining, 0, "request {n}");
            assert!(key3.current_limit.is_some(), "request {n}: key3's limit");
        }
        let from_memory = node
            .metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("sluice_checks_refused_from_memory_total "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        assert_eq!(
            from_memory,
            Some(3.0),
            "the refusals after the store's came from memory"
        );
    }
}
