//! The whole chain, correct end to end: limits hold across both proxies and both nodes,
//! rules combine as docs/design.md says, the SDK paces itself from the headers, and rules,
//! overrides and shadow rules change and behave at run time with no restart.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_core::rules::format_rfc3339;
use sluice_tests::chain::{Chain, Options, ProxyHost};
use sluice_tests::envoy::jwt;
use sluice_tests::http::{http, send, Reply};

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
    global_limit_holds(Chain::start(), "Envoy");
}

/// As above, in two real Envoys from examples/envoy.yaml.
#[test]
fn a_global_limit_holds_across_two_real_envoys_and_both_nodes() {
    let chain = Chain::with(Options {
        host: ProxyHost::RealEnvoy,
        ..Options::default()
    });
    let mut chain = global_limit_holds(chain, "real Envoy");
    for envoy in &mut chain.envoys {
        envoy.assert_healthy();
    }
}

/// As above, with Nginx's filters calling their nodes over Unix sockets (`--listen unix:`).
#[test]
fn a_global_limit_holds_with_nginx_calling_the_nodes_over_unix_sockets() {
    let chain = Chain::with(Options {
        host: ProxyHost::NginxUnixSocket,
        ..Options::default()
    });
    global_limit_holds(chain, "Nginx over Unix sockets");
}

/// Asserts the chain's global limit holds; the chain, for what else a test asks of it.
fn global_limit_holds(chain: Chain, host: &str) -> Chain {
    let mut statuses = Vec::new();
    for i in 0..30 {
        let r = http(chain.proxies[i % 2], "GET", "/api/hello", &[]);
        assert_eq!(policy(&r), Some("\"global-ip\";q=10;w=60"), "{host}");
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
    assert_eq!((allowed, denied), (10, 20), "{host}: statuses: {statuses:?}");
    assert!(
        statuses[..10].iter().all(|&s| s == 200),
        "{host}: the first ten pass: {statuses:?}"
    );
    assert_eq!(chain.upstream_count(), 10, "{host}: the upstream saw exactly the limit");
    // Both nodes decided: the proxies take them in turn (Envoy) or one each (Nginx).
    for node in 0..2 {
        let count = |decision: &str| {
            let series = format!("sluice_checks_total{{rule=\"global-ip\",decision=\"{decision}\"}}");
            chain
                .node_metric(node, &series)
                .unwrap_or_else(|| panic!("{host}: node {node} has no {series}: it decided nothing"))
        };
        assert!(
            count("allowed") + count("denied") > 0.0,
            "{host}: node {node} decided nothing"
        );
    }
    chain
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
        trusted_hops: 1,
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
    let series = |decision: &str| format!("sluice_checks_total{{rule=\"sdk-key\",decision=\"{decision}\"}}");
    let denied = chain.nodes_metric(&series("denied"));
    let admitted = chain.nodes_metric(&series("allowed"));
    assert!(codes.iter().all(|&s| s == 200), "{codes:?}");
    assert!(denied <= 1.0, "{denied} × 429 seen by the SDK");
    assert_eq!(chain.upstream_count(), 60);
    assert_eq!(admitted, 60.0, "the server admitted each request once");
    // The rule admits the burst of 5, then 20/s: over the span the workload took, that is
    // its capacity. The SDK used at least half of it (at best: 55 at 20/s = 2.75 s).
    let span = elapsed.as_secs_f64();
    let used = admitted / (5.0 + 20.0 * span);
    println!(
        "SDK through the chain: 60 requests in {span:.2} s = {:.1} % of what the rule admits \
         over that span, {denied} × 429",
        used * 100.0
    );
    assert!(used <= 1.0, "the server admitted more than its rule: {used:.2}");
    assert!(
        used >= 0.5,
        "the SDK used {:.1} % of the capacity over {span:.2} s",
        used * 100.0
    );
}

/// Asks the node on `port` directly which limit applies to IP 198.51.100.(`probe` % 250).
fn limit_at(port: u16, probe: usize) -> Option<u64> {
    let body = format!(
        r#"{{"identities": {{"ip": "198.51.100.{}"}}, "method": "GET", "path": "/", "cost": 1}}"#,
        probe % 250
    );
    limit_in_answer(port, &body)
}

/// POSTs the check `body` to the node on `port`; the `limit` of its answer.
fn limit_in_answer(port: u16, body: &str) -> Option<u64> {
    let r = send(
        port,
        "POST",
        "/v1/check",
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
    let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    v["limit"].as_u64()
}

/// Polls the node on `port` every 5 ms (one probe in flight at a time, so the reading is
/// late by one probe at most) until it answers `limit`; when, since `started`, that answer
/// came, or `None` after `give_up`.
fn limit_seen(port: u16, limit: u64, started: Instant, give_up: Duration) -> Option<Duration> {
    let mut probe = usize::from(port);
    while started.elapsed() < give_up {
        probe += 1;
        if limit_at(port, probe) == Some(limit) {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_rule_changed_through_the_admin_api_takes_effect_on_both_nodes_within_a_second() {
    let mut chain = Chain::start();
    assert_eq!(limit_at(chain.node_ports[0], 0), Some(10));
    assert_eq!(limit_at(chain.node_ports[1], 1), Some(10));
    let pids: Vec<_> = chain.nodes.iter().map(|n| n.id()).collect();

    let new_rules = sluice_tests::chain::RULES.replace("limit     = 10", "limit     = 3");
    let (auth, token) = Chain::bearer();
    let started = Instant::now();
    let r = send(
        chain.admin_ports[0],
        "PUT",
        "/v1/admin/rules",
        &[(auth, &token)],
        new_rules.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Each node watched from its own thread, so that one node's probes never delay the
    // other's reading.
    let seen: Vec<Option<Duration>> = std::thread::scope(|scope| {
        let watchers: Vec<_> = chain
            .node_ports
            .iter()
            .map(|&port| scope.spawn(move || limit_seen(port, 3, started, Duration::from_secs(5))))
            .collect();
        watchers.into_iter().map(|w| w.join().expect("watcher")).collect()
    });
    println!("rule change visible after: node 0 {:?}, node 1 {:?}", seen[0], seen[1]);
    // The product's promise, an absolute figure: every node within a second.
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
    chain.assert_nodes_up();
    assert_eq!(chain.nodes.iter().map(|n| n.id()).collect::<Vec<_>>(), pids);
}

/// The limit the node on `port` applies to user `user` now, asked with a cost above any
/// limit: a denial, which takes nothing from the user's quota.
fn user_limit_at(port: u16, user: &str) -> Option<u64> {
    let body = format!(r#"{{"identities": {{"user": "{user}"}}, "method": "GET", "path": "/api", "cost": 1000}}"#);
    limit_in_answer(port, &body)
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
    // Whole seconds from now, at least 5 s away: time to reach both nodes and for the
    // requests below, on a loaded machine too.
    let until = (now_ms() / 1000 + 6) * 1000;
    let body = format!(
        r#"{{"rule": "per-user", "identity": "42", "limit": 5, "until": "{}"}}"#,
        format_rfc3339(until)
    );
    let (auth, token) = Chain::bearer();
    let r = send(
        chain.admin_ports[1],
        "POST",
        "/v1/admin/overrides",
        &[(auth, &token)],
        body.as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    for (node, &port) in chain.node_ports.iter().enumerate() {
        while user_limit_at(port, "42") != Some(5) {
            assert!(now_ms() < until, "node {node} never applied the override");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    let user = [("x-user-id", "42")];
    let during = burst(&chain, 6, "/api", &user);
    assert!(now_ms() < until, "the requests took too long to test the override");
    assert_eq!(statuses(&during), [200, 200, 200, 200, 200, 429]);
    assert_eq!(during[5].header("x-ratelimit-limit"), Some("5"));
    // Another user is held to the rule's 2 meanwhile.
    assert_eq!(
        statuses(&burst(&chain, 3, "/api", &[("x-user-id", "7")])),
        [200, 200, 429]
    );

    // Around `until`, both nodes asked in turn: an answer that came before it says 5, a
    // check sent after it says 2 (one in flight at `until` may say either).
    std::thread::sleep(Duration::from_millis((until - 500).saturating_sub(now_ms())));
    let mut samples = Vec::new();
    while samples.iter().filter(|(sent, _, _)| *sent > until).count() < 2 {
        let sent = now_ms();
        let limit = user_limit_at(chain.node_ports[samples.len() % 2], "42");
        samples.push((sent, now_ms(), limit));
        std::thread::sleep(Duration::from_millis(10));
    }
    for &(sent, received, limit) in &samples {
        if received < until {
            assert_eq!(limit, Some(5), "answered {} ms before until", until - received);
        }
        if sent > until {
            assert_eq!(limit, Some(2), "sent {} ms after until", sent - until);
        }
    }
    // Through a proxy, the rule again (and 5 already used: denied).
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

/// The `[[rule]]` named `name` in examples/rules.toml, as it is written there.
fn example_rule(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let block = text
        .split("\n[[")
        .find(|b| b.starts_with("rule]]") && b.contains(&format!("\"{name}\"")))
        .unwrap_or_else(|| panic!("no rule {name:?} in {path}"));
    format!("[[{block}\n")
}

#[test]
fn the_uploads_shaped_example_rule_spaces_uploads_out_on_envoy_nginx_and_a_real_envoy() {
    // limit 10 per 1s, burst 2, max_delay 2s: uploads beyond the burst are held 100 ms
    // apart, those that would wait longer than 2 s are refused.
    let rule = example_rule("uploads-shaped");
    for host in [ProxyHost::Envoy, ProxyHost::Nginx, ProxyHost::RealEnvoy] {
        let chain = Chain::with(Options {
            rules: rule.clone(),
            host,
            ..Options::default()
        });
        let proxy = chain.proxies[0];
        // The user: a header the harness's filter configuration reads, or the subject of a
        // verified JWT, as examples/envoy.yaml reads it.
        let user = match host {
            ProxyHost::RealEnvoy => ("authorization", format!("Bearer {}", jwt("uploader", "pro", false))),
            _ => ("x-user-id", "uploader".to_owned()),
        };
        let started = Instant::now();
        let uploads: Vec<_> = (0..30)
            .map(|_| {
                let user = user.clone();
                std::thread::spawn(move || {
                    let r = send(proxy, "POST", "/api/upload", &[(user.0, &user.1)], b"data");
                    (r.status, started.elapsed())
                })
            })
            .collect();
        let mut done: Vec<(u16, Duration)> = uploads.into_iter().map(|t| t.join().unwrap()).collect();
        done.sort_by_key(|(_, at)| *at);
        let admitted: Vec<Duration> = done.iter().filter(|(s, _)| *s == 200).map(|(_, at)| *at).collect();
        let refused = done.iter().filter(|(s, _)| *s == 429).count();
        assert_eq!(admitted.len() + refused, 30, "{host:?}: only 200 and 429: {done:?}");
        // 2 s of 100 ms steps plus the burst: about 22 held or passed, the rest refused.
        assert!(
            (18..=25).contains(&admitted.len()),
            "{host:?}: {} admitted: {done:?}",
            admitted.len()
        );
        assert_eq!(chain.upstream_count(), admitted.len() as u64, "{host:?}");
        // Held, not passed at once: the k-th upload reaches the upstream no sooner than
        // (k - 3) steps of 100 ms (the burst and the first token pass at once; 10 ms of
        // slack for the service's clock against ours).
        for (k, at) in admitted.iter().enumerate() {
            let earliest = Duration::from_millis((k.saturating_sub(3) as u64 * 100).saturating_sub(10));
            assert!(
                *at >= earliest,
                "{host:?}: upload {k} admitted after {at:?}, before {earliest:?}"
            );
        }
        assert!(
            *admitted.last().unwrap() >= Duration::from_millis(1_500),
            "{host:?}: {admitted:?}"
        );
    }
}

/// An LLM API's budget: 100 tokens an hour per client, a request's tokens known only from
/// its answer (`x-tokens-used`, which the demo upstream echoes from `?tokens=`).
const TOKEN_BUDGET: &str = r#"
[[rule]]
name      = "tokens"
by        = "ip"
path      = "/v1/chat"
algorithm = "fixed_window"
limit     = 100
window    = "1h"
"#;

/// What node 0 says is left of the client's token budget, spending nothing (a peek).
fn tokens_left(chain: &Chain, token: &str) -> u64 {
    let body = r#"{"identities":{"ip":"127.0.0.1"},"method":"GET","path":"/v1/chat","cost":0}"#;
    let auth = format!("Bearer {token}");
    let r = send(
        chain.node_ports[0],
        "POST",
        "/v1/check",
        &[("authorization", &auth)],
        body.as_bytes(),
    );
    let answer: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    answer["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining in {answer}"))
}

/// Issue 40: a cost learnt after the response is spent. Each answer's `x-tokens-used` is
/// debited (less the 1 its check spent) on the filter's next tick; once the budget is spent
/// the next request is refused.
fn a_cost_learnt_after_the_response_is_spent(host: ProxyHost) {
    let token = "debit-token";
    let mut filter: serde_json::Value = serde_json::from_str(sluice_tests::chain::FILTER).expect("FILTER is JSON");
    filter["debit"] = serde_json::json!({"header": "x-tokens-used"});
    let chain = Chain::with(Options {
        host,
        rules: TOKEN_BUDGET.to_owned(),
        filter: filter.to_string(),
        data_token: Some(token.to_owned()),
        envoy_edits: vec![(
            "\"lease\": {}",
            "\"lease\": {}, \"debit\": {\"header\": \"x-tokens-used\"}",
        )],
        ..Options::default()
    });
    let left_after = |expected: u64| {
        let started = Instant::now();
        loop {
            let left = tokens_left(&chain, token);
            if left == expected {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{host:?}: {left} tokens left, not {expected}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(tokens_left(&chain, token), 100, "{host:?}: a peek spends nothing");
    let r = http(chain.proxies[0], "GET", "/v1/chat?tokens=60", &[]);
    assert_eq!(r.status, 200, "{host:?}: {r:?}");
    assert_eq!(r.header("x-tokens-used"), Some("60"), "{host:?}");
    left_after(40);
    // 60 more, though 40 are left: the whole 40 is taken, the rest is not a debt.
    let r = http(chain.proxies[1], "GET", "/v1/chat?tokens=60", &[]);
    assert_eq!(r.status, 200, "{host:?}: {r:?}");
    left_after(0);
    let r = http(chain.proxies[0], "GET", "/v1/chat?tokens=1", &[]);
    assert_eq!(r.status, 429, "{host:?}: the budget is spent: {r:?}");
    assert_eq!(policy(&r), Some("\"tokens\";q=100;w=3600"), "{host:?}");
    // A response without the header spends nothing more than its check; another path none.
    let r = http(chain.proxies[1], "GET", "/other?tokens=500", &[]);
    assert_eq!(r.status, 200, "{host:?}: {r:?}");
    let debits: u64 = match host {
        ProxyHost::RealEnvoy => chain
            .envoys
            .iter()
            .map(|e| e.filter_metric("sluice_filter_debits"))
            .sum(),
        _ => (0..2)
            .map(|i| {
                chain.proxy_stats(i)["metrics"]["sluice_filter_debits"]
                    .as_u64()
                    .unwrap_or(0)
            })
            .sum(),
    };
    // The /other request's debit goes out and matches no rule.
    assert_eq!(debits, 3, "{host:?}: one debit per answer that named more than 1 token");
}

#[test]
fn a_cost_learnt_after_the_response_is_spent_envoy() {
    a_cost_learnt_after_the_response_is_spent(ProxyHost::Envoy);
}

#[test]
fn a_cost_learnt_after_the_response_is_spent_nginx() {
    a_cost_learnt_after_the_response_is_spent(ProxyHost::Nginx);
}

#[test]
fn a_cost_learnt_after_the_response_is_spent_real_envoy() {
    a_cost_learnt_after_the_response_is_spent(ProxyHost::RealEnvoy);
}

/// A rule naming hosts limits the requests for those hosts only, through the filter: on
/// Envoy the client's `Host` is `:authority`; on Nginx it is the `host` header, since
/// ngx_wasm_module's `:authority` is the server's own name and port (seen in a real Nginx).
fn a_rule_naming_a_host_limits_that_host_only(host: ProxyHost) {
    let chain = Chain::with(Options {
        host,
        rules: "[[rule]]\nname = \"api-host\"\nby = \"ip\"\nhosts = [\"api.example.com\"]\n\
                algorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\n"
            .to_owned(),
        ..Options::default()
    });
    let get = |name: &str| http(chain.proxies[0], "GET", "/x", &[("host", name)]).status;
    let api: Vec<u16> = (0..4).map(|_| get("API.example.com:8080")).collect();
    assert_eq!(
        api,
        [200, 200, 429, 429],
        "{host:?}: the named host, any case, any port"
    );
    let other: Vec<u16> = (0..4).map(|_| get("www.example.com")).collect();
    assert_eq!(other, [200; 4], "{host:?}: another host is not limited");
}

#[test]
fn a_rule_naming_a_host_limits_that_host_only_envoy() {
    a_rule_naming_a_host_limits_that_host_only(ProxyHost::Envoy);
}

#[test]
fn a_rule_naming_a_host_limits_that_host_only_nginx() {
    a_rule_naming_a_host_limits_that_host_only(ProxyHost::Nginx);
}

#[test]
fn a_rule_naming_a_host_limits_that_host_only_real_envoy() {
    a_rule_naming_a_host_limits_that_host_only(ProxyHost::RealEnvoy);
}
