//! The whole chain, correct end to end: limits hold across both proxies and both nodes,
//! rules combine as DESIGN.md says, the SDK paces itself from the headers, and rules,
//! overrides and shadow rules change and behave at run time with no restart.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_core::rules::format_rfc3339;
use sluice_tests::chain::{Chain, Options, FILTER};
use sluice_tests::http::{http, send, Reply};

/// The filter trusting one proxy hop of `x-forwarded-for`, so each test client can have its
/// own IP.
fn filter_trusting_xff() -> String {
    FILTER.replace("\"trusted_hops\": 0", "\"trusted_hops\": 1")
}

fn policy(r: &Reply) -> Option<&str> {
    r.header("ratelimit-policy")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn a_global_limit_holds_across_both_proxies_and_both_nodes() {
    let chain = Chain::start();
    let mut statuses = Vec::new();
    for i in 0..30 {
        let r = http(chain.proxies[i % 2], "GET", "/api/hello", &[]);
        assert_eq!(policy(&r), Some("\"global-ip\";q=10;w=60"));
        if r.status == 429 {
            assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
            assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
            assert!(r.header("retry-after").is_some());
            assert!(r.body.contains("\"code\":429"), "{}", r.body);
        }
        statuses.push(r.status);
    }
    let allowed = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((allowed, denied), (10, 20), "statuses: {statuses:?}");
    assert!(
        statuses[..10].iter().all(|&s| s == 200),
        "the first ten pass: {statuses:?}"
    );
    assert_eq!(chain.upstream_count(), 10, "the upstream saw exactly the limit");
    // Both nodes decided: the proxies take them in turn.
    for node in 0..2 {
        let seen = chain.node_metric(node, "sluice_checks_total{rule=\"global-ip\",decision=\"allowed\"}")
            + chain.node_metric(node, "sluice_checks_total{rule=\"global-ip\",decision=\"denied\"}");
        assert!(seen > 0.0, "node {node} decided nothing");
    }
}

const LEVELS: &str = r#"
[[rule]]
name = "per-ip"
by = "ip"
algorithm = "sliding_window_log"
limit = 10
window = "1m"

[[rule]]
name = "free-user"
by = "user"
tier = "free"
algorithm = "sliding_window_log"
limit = 3
window = "1m"

[[rule]]
name = "pro-user"
by = "user"
tier = "pro"
algorithm = "sliding_window_log"
limit = 6
window = "1m"

[[rule]]
name = "per-key"
by = "api_key"
algorithm = "sliding_window_log"
limit = 4
window = "1m"

[[rule]]
name = "search-ip"
by = "ip"
path = "/api/search*"
algorithm = "sliding_window_log"
limit = 2
window = "1m"
"#;

/// Sends `n` requests alternating proxies; returns the answers.
fn burst(chain: &Chain, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<Reply> {
    (0..n)
        .map(|i| http(chain.proxies[i % 2], "GET", path, headers))
        .collect()
}

fn statuses(replies: &[Reply]) -> Vec<u16> {
    replies.iter().map(|r| r.status).collect()
}

/// `n` × 200 then one 429, the 429 naming `rule` with quota `q`.
fn assert_limited_by(replies: &[Reply], n: usize, rule: &str, q: u64) {
    let codes = statuses(replies);
    assert!(codes[..n].iter().all(|&s| s == 200), "{rule}: {codes:?}");
    assert_eq!(codes[n], 429, "{rule}: {codes:?}");
    let denied = &replies[n];
    assert_eq!(
        policy(denied),
        Some(format!("\"{rule}\";q={q};w=60").as_str()),
        "{rule}"
    );
    assert_eq!(denied.header("x-ratelimit-limit"), Some(q.to_string().as_str()));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    let ratelimit = denied.header("ratelimit").unwrap_or_default();
    assert!(
        ratelimit.starts_with(&format!("\"{rule}\";r=0;")),
        "{rule}: RateLimit: {ratelimit}"
    );
}

#[test]
fn rules_per_ip_user_key_tier_and_path_combine_and_the_429_names_the_rule_that_denied() {
    let chain = Chain::with(Options {
        rules: LEVELS.to_owned(),
        filter: filter_trusting_xff(),
        ..Options::default()
    });
    // A free user is held to 3 though the IP allows 10; the headers on the way describe the
    // most restrictive rule (free-user: 2, 1, 0 left).
    let free = burst(
        &chain,
        4,
        "/api/items",
        &[
            ("x-forwarded-for", "203.0.113.1"),
            ("x-user-id", "u1"),
            ("x-tier", "free"),
        ],
    );
    assert_limited_by(&free, 3, "free-user", 3);
    let left: Vec<_> = free[..3].iter().map(|r| r.header("x-ratelimit-remaining")).collect();
    assert_eq!(left, [Some("2"), Some("1"), Some("0")]);

    // A pro user gets 6; the free rule does not apply to them.
    let pro = burst(
        &chain,
        7,
        "/api/items",
        &[
            ("x-forwarded-for", "203.0.113.2"),
            ("x-user-id", "u2"),
            ("x-tier", "pro"),
        ],
    );
    assert_limited_by(&pro, 6, "pro-user", 6);

    // An API key gets 4.
    let keyed = burst(
        &chain,
        5,
        "/api/items",
        &[("x-forwarded-for", "203.0.113.3"), ("x-api-key", "k1")],
    );
    assert_limited_by(&keyed, 4, "per-key", 4);

    // The search path allows 2 per IP; the denied third does not consume the IP's quota:
    // the IP then has 10 − 2 − 1 = 7 left after one more request elsewhere.
    let ip = [("x-forwarded-for", "203.0.113.4")];
    let search = burst(&chain, 3, "/api/search?q=x", &ip);
    assert_limited_by(&search, 2, "search-ip", 2);
    let other = http(chain.proxies[0], "GET", "/api/items", &ip);
    assert_eq!(other.status, 200);
    assert_eq!(policy(&other), Some("\"per-ip\";q=10;w=60"));
    assert_eq!(other.header("x-ratelimit-remaining"), Some("7"));

    // A bare IP is held to 10 in all, whichever paths it uses.
    let bare = [("x-forwarded-for", "203.0.113.5")];
    let mut mixed = burst(&chain, 5, "/api/items", &bare);
    mixed.extend(burst(&chain, 6, "/other", &bare));
    assert_limited_by(&mixed, 10, "per-ip", 10);

    assert_eq!(
        chain.upstream_count(),
        3 + 6 + 4 + 2 + 1 + 10,
        "the upstream saw only what was allowed"
    );
}

#[test]
fn the_sdk_reading_the_headers_finishes_a_paced_workload_with_at_most_one_429() {
    let chain = Chain::with(Options {
        rules: r#"
[[rule]]
name = "sdk-key"
by = "api_key"
algorithm = "token_bucket"
limit = 20
window = "1s"
burst = 5
"#
        .to_owned(),
        ..Options::default()
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("http://127.0.0.1:{}/api/work", chain.proxies[0]);
    let (codes, elapsed) = runtime.block_on(async {
        let client = sluice_client::Client::new().expect("client");
        let started = Instant::now();
        let tasks: Vec<_> = (0..60)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move {
                    let response = client.send(client.get(&url).header("x-api-key", "sdk")).await;
                    response.map(|r| r.status().as_u16())
                })
            })
            .collect();
        let mut codes = Vec::new();
        for task in tasks {
            codes.push(task.await.expect("task").expect("response"));
        }
        (codes, started.elapsed())
    });
    let denied = chain.nodes_metric("sluice_checks_total{rule=\"sdk-key\",decision=\"denied\"}");
    assert!(codes.iter().all(|&s| s == 200), "{codes:?}");
    assert!(denied <= 1.0, "{denied} × 429 seen by the SDK");
    assert_eq!(chain.upstream_count(), 60);
    // At best: the burst of 5 at once, then 55 at 20/s = 2.75 s.
    let achieved = 55.0 / elapsed.as_secs_f64();
    println!(
        "SDK through the chain: 60 requests in {:.2} s, {achieved:.1} req/s beyond the burst \
         = {:.1} % of the allowed 20/s, {denied} × 429",
        elapsed.as_secs_f64(),
        achieved / 20.0 * 100.0
    );
}

/// Asks node `node` directly which limit applies to a fresh IP.
fn limit_on(chain: &Chain, node: usize, probe: usize) -> Option<u64> {
    let body = format!(
        r#"{{"identities": {{"ip": "198.51.100.{}"}}, "method": "GET", "path": "/", "cost": 1}}"#,
        probe % 250
    );
    let r = send(
        chain.node_ports[node],
        "POST",
        "/v1/check",
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
    let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    v["limit"].as_u64()
}

#[test]
fn a_rule_changed_through_the_admin_api_takes_effect_on_both_nodes_within_a_second() {
    let mut chain = Chain::start();
    assert_eq!(limit_on(&chain, 0, 0), Some(10));
    assert_eq!(limit_on(&chain, 1, 1), Some(10));
    let pids: Vec<_> = chain.nodes.iter().map(|n| n.id()).collect();

    let new_rules = sluice_tests::chain::RULES.replace("limit     = 10", "limit     = 3");
    let (auth, token) = Chain::bearer();
    let started = Instant::now();
    let r = send(
        chain.node_ports[0],
        "PUT",
        "/v1/admin/rules",
        &[(auth, &token)],
        new_rules.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let mut probe = 2;
    let mut seen = [None, None];
    while seen.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(5) {
        for (node, when) in seen.iter_mut().enumerate() {
            probe += 1;
            if when.is_none() && limit_on(&chain, node, probe) == Some(3) {
                *when = Some(started.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("rule change visible after: node 0 {:?}, node 1 {:?}", seen[0], seen[1]);
    for (node, when) in seen.iter().enumerate() {
        let when = when.unwrap_or_else(|| panic!("node {node} never took the new rule"));
        assert!(when < Duration::from_secs(1), "node {node} took {when:?}");
    }
    // Through the proxies, the new limit holds.
    let codes: Vec<u16> = (0..5)
        .map(|i| http(chain.proxies[i % 2], "GET", "/z", &[]).status)
        .collect();
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    // No restart: the same processes.
    assert!(chain.nodes.iter_mut().all(|n| n.is_running()));
    assert_eq!(chain.nodes.iter().map(|n| n.id()).collect::<Vec<_>>(), pids);
}

#[test]
fn an_override_applies_until_its_time_and_then_the_rule_does_again() {
    let chain = Chain::with(Options {
        rules: r#"
[[rule]]
name = "per-user"
by = "user"
algorithm = "sliding_window_log"
limit = 2
window = "1m"
"#
        .to_owned(),
        ..Options::default()
    });
    // Whole seconds from now, at least 3 s away: time for the requests below.
    let until = (now_ms() / 1000 + 4) * 1000;
    let body = format!(
        r#"{{"rule": "per-user", "identity": "42", "limit": 5, "until": "{}"}}"#,
        format_rfc3339(until)
    );
    let (auth, token) = Chain::bearer();
    let r = send(
        chain.node_ports[1],
        "POST",
        "/v1/admin/overrides",
        &[(auth, &token)],
        body.as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    std::thread::sleep(Duration::from_millis(1000)); // both nodes have it (within 1 s)

    let user = [("x-user-id", "42")];
    let during = burst(&chain, 6, "/api", &user);
    assert!(
        now_ms() + 300 < until,
        "the requests took too long to test the override"
    );
    assert_eq!(statuses(&during), [200, 200, 200, 200, 200, 429]);
    assert_eq!(during[5].header("x-ratelimit-limit"), Some("5"));
    // Another user is held to the rule's 2 meanwhile.
    assert_eq!(
        statuses(&burst(&chain, 3, "/api", &[("x-user-id", "7")])),
        [200, 200, 429]
    );

    // Just before `until`, still 5; just after, the rule's 2 (and 5 already used: denied).
    std::thread::sleep(Duration::from_millis((until - 250).saturating_sub(now_ms())));
    let before = http(chain.proxies[0], "GET", "/api", &user);
    assert_eq!(
        before.header("x-ratelimit-limit"),
        Some("5"),
        "at {} ms before until",
        until as i64 - now_ms() as i64
    );
    std::thread::sleep(Duration::from_millis((until + 250).saturating_sub(now_ms())));
    let after = http(chain.proxies[1], "GET", "/api", &user);
    assert_eq!((after.status, after.header("x-ratelimit-limit")), (429, Some("2")));
}

#[test]
fn a_shadow_rule_never_denies_but_counts_what_it_would_have_denied() {
    let chain = Chain::with(Options {
        rules: r#"
[[rule]]
name = "trial"
by = "ip"
algorithm = "sliding_window_log"
limit = 3
window = "1m"
shadow = true

[[rule]]
name = "real"
by = "ip"
algorithm = "sliding_window_log"
limit = 100
window = "1m"
"#
        .to_owned(),
        ..Options::default()
    });
    let replies = burst(&chain, 10, "/api", &[]);
    assert!(replies.iter().all(|r| r.status == 200), "{:?}", statuses(&replies));
    // The headers describe the enforced rule, not the shadow one.
    assert_eq!(policy(&replies[9]), Some("\"real\";q=100;w=60"));
    assert_eq!(chain.upstream_count(), 10);
    let series = |d: &str| chain.nodes_metric(&format!("sluice_checks_total{{rule=\"trial\",decision=\"{d}\"}}"));
    assert_eq!(
        (series("allowed"), series("shadow_denied"), series("denied")),
        (3.0, 7.0, 0.0)
    );
}
