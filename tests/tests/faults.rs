//! The whole chain under faults, with what the client sees measured: Redis killed under
//! load, a Redis Cluster master killed, a service node killed, a check service that stalls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_testkit::{free_port, wait_for_port, Child};
use sluice_tests::chain::{proxy_command, upstream_command, Chain, Options, ProxyHost, FILTER};
use sluice_tests::http::http;

/// Generous limits (load must not be denied by the limit itself): one fail-open rule per IP,
/// one fail-closed rule per API key.
const ROOMY: &str = r#"
[[rule]]
name = "open-ip"
by = "ip"
algorithm = "sliding_window_counter"
limit = 1000000
window = "1m"
failure = "open"

[[rule]]
name = "closed-key"
by = "api_key"
algorithm = "sliding_window_counter"
limit = 1000000
window = "1m"
failure = "closed"
"#;

/// One answer seen by a load thread: when its request was sent and when the answer came
/// (since the start), whether it was on the fail-closed route, and its status.
#[derive(Debug, Clone, Copy)]
struct Seen {
    sent: Duration,
    answered: Duration,
    closed: bool,
    status: u16,
}

/// Load on both routes through both proxies, from 4 threads, until `stop`.
fn load(chain: &Chain, start: Instant, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<Vec<Seen>>> {
    (0..4)
        .map(|t| {
            let (stop, proxy) = (stop.clone(), chain.proxies[t % 2]);
            std::thread::spawn(move || {
                let closed = t >= 2;
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let headers: &[(&str, &str)] = if closed { &[("x-api-key", "k")] } else { &[] };
                    let sent = start.elapsed();
                    let status = http(proxy, "GET", "/load", headers).status;
                    seen.push(Seen {
                        sent,
                        answered: start.elapsed(),
                        closed,
                        status,
                    });
                }
                seen
            })
        })
        .collect()
}

#[test]
fn redis_killed_under_load_fails_open_or_closed_per_rule_never_5xx_and_recovers_within_2s() {
    let mut chain = Chain::with(Options {
        rules: ROOMY.to_owned(),
        ..Options::default()
    });
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let threads = load(&chain, start, stop.clone());

    std::thread::sleep(Duration::from_secs(1));
    let killed = start.elapsed();
    chain.redis().stop();
    std::thread::sleep(Duration::from_secs(2));
    let dead_until = start.elapsed();
    chain.redis().restart();
    let restarted = start.elapsed();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("load thread"))
        .collect();

    let fives: Vec<&Seen> = seen.iter().filter(|s| s.status >= 500).collect();
    assert!(fives.is_empty(), "5xx answers: {fives:?}");
    // The statuses of requests sent at or after `from` and answered before `to`: a request
    // is classed by when it ran, however long a loaded machine made it take.
    let phase = |from: Duration, to: Duration, closed: bool| -> Vec<u16> {
        seen.iter()
            .filter(|s| s.sent >= from && s.answered < to && s.closed == closed)
            .map(|s| s.status)
            .collect()
    };
    // Healthy: everything passes.
    assert!(phase(Duration::ZERO, killed, false).iter().all(|&s| s == 200));
    assert!(phase(Duration::ZERO, killed, true).iter().all(|&s| s == 200));
    // The chain's own time per request on this machine now: the slowest healthy one.
    let baseline = seen
        .iter()
        .filter(|s| s.answered < killed)
        .map(|s| s.answered - s.sent)
        .max()
        .unwrap_or_default();
    // Dead (requests sent from 500 ms after the kill: the nodes' connections have seen the
    // crash): fail-open serves, fail-closed denies.
    let grace = killed + Duration::from_millis(500);
    let open_dead = phase(grace, dead_until, false);
    let closed_dead = phase(grace, dead_until, true);
    assert!(
        !open_dead.is_empty() && open_dead.iter().all(|&s| s == 200),
        "fail-open while dead: {open_dead:?}"
    );
    assert!(
        !closed_dead.is_empty() && closed_dead.iter().all(|&s| s == 429),
        "fail-closed while dead: {closed_dead:?}"
    );
    assert!(
        chain.nodes_metric("sluice_degraded_total") > 0.0,
        "fail-open answers are counted as degraded"
    );
    // Restarted: the last request denied on the fail-closed route was sent within 2 s (the
    // figure README promises) plus the chain's own time per request; all 200 after it.
    let last_denial = seen
        .iter()
        .filter(|s| s.closed && s.status == 429)
        .map(|s| s.sent)
        .max()
        .unwrap_or(restarted);
    let recovery = last_denial.saturating_sub(restarted);
    let total = seen.len();
    println!(
        "Redis killed under load: {total} answers, {} while dead (open {} × 200, closed {} × 429), \
         0 × 5xx; shared decisions back {recovery:?} after the restart (slowest healthy request {baseline:?})",
        open_dead.len() + closed_dead.len(),
        open_dead.len(),
        closed_dead.len()
    );
    assert!(
        recovery <= Duration::from_secs(2) + baseline,
        "shared decisions resumed only after {recovery:?} (the chain's own time: {baseline:?})"
    );
    assert!(!phase(last_denial + Duration::from_millis(1), start.elapsed(), true).is_empty());
}

#[test]
fn a_redis_cluster_master_killed_and_its_replica_promoted_checks_recover() {
    let mut chain = Chain::with(Options {
        rules: ROOMY.replace("failure = \"open\"", "failure = \"closed\""),
        cluster_masters: 3,
        trusted_hops: 1,
        ..Options::default()
    });
    // 30 clients: their keys spread over the three masters' slots.
    let ips: Vec<String> = (1..=30).map(|i| format!("192.0.2.{i}")).collect();
    let round = |chain: &Chain| -> Vec<u16> {
        ips.iter()
            .enumerate()
            .map(|(i, ip)| http(chain.proxies[i % 2], "GET", "/c", &[("x-forwarded-for", ip)]).status)
            .collect()
    };
    assert!(round(&chain).iter().all(|&s| s == 200));

    let masters = chain.cluster().master_ports();
    assert_eq!(masters.len(), 3);
    chain.cluster().kill(masters[0]);
    let killed = Instant::now();
    let mut rounds = Vec::new();
    let recovered = loop {
        let codes = round(&chain);
        assert!(codes.iter().all(|&s| s == 200 || s == 429), "{codes:?}");
        let ok = codes.iter().all(|&s| s == 200);
        rounds.push(codes.iter().filter(|&&s| s == 429).count());
        if ok && rounds.len() > 1 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "checks never recovered; 429s per round: {rounds:?}"
        );
    };
    println!("cluster master killed: checks recovered after {recovered:?}; 429s per round of 30: {rounds:?}");
    // A replica took over: three masters again.
    chain.cluster().wait_ok(Duration::from_secs(10));
    assert_eq!(chain.cluster().master_ports().len(), 3);
    assert!(round(&chain).iter().all(|&s| s == 200));
}

#[test]
fn with_one_service_node_killed_the_proxies_decide_through_the_other() {
    one_node_killed(ProxyHost::Envoy);
}

#[test]
fn with_one_service_node_killed_real_envoys_decide_through_the_other() {
    one_node_killed(ProxyHost::RealEnvoy);
}

fn one_node_killed(host: ProxyHost) {
    let mut chain = Chain::with(Options {
        host,
        ..Options::default()
    });
    for i in 0..4 {
        assert_eq!(http(chain.proxies[i % 2], "GET", "/x", &[]).status, 200);
    }
    chain.nodes[0].kill();
    // Still global decisions (not the filter's fail-open fallback, which would allow all
    // 26): exactly 6 more pass, then 429s naming the rule.
    let statuses: Vec<u16> = (0..26)
        .map(|i| http(chain.proxies[i % 2], "GET", "/y", &[]).status)
        .collect();

    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        6,
        "{host:?}: {statuses:?}"
    );
    assert!(statuses[6..].iter().all(|&s| s == 429), "{host:?}: {statuses:?}");
    assert_eq!(chain.upstream_count(), 10, "{host:?}");
    for envoy in &mut chain.envoys {
        envoy.assert_healthy();
    }
}

#[test]
fn a_stalled_check_service_costs_the_timeout_until_the_breaker_opens() {
    // A "check service" that accepts connections and never answers.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let stalled_port = stalled.local_addr().expect("addr").port();
    stalled.set_nonblocking(true).expect("nonblocking");
    let connections = Arc::new(Mutex::new(Vec::new())); // kept open: the stall is the point
    let accept = |connections: &Mutex<Vec<_>>| {
        while let Ok((conn, _)) = stalled.accept() {
            connections.lock().expect("lock").push(conn);
        }
    };
    let (upstream, proxy) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("sluice-stall-{}-{proxy}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let timeout = Duration::from_millis(300);
    let config = FILTER.replace("\"timeout_ms\": 2000", "\"timeout_ms\": 300").replace(
        "\"failures\": 1000, \"cooldown_ms\": 1000",
        "\"failures\": 3, \"cooldown_ms\": 60000",
    );
    std::fs::write(dir.join("filter.json"), config).expect("filter config");
    let _upstream = Child::spawn("demo upstream", &mut upstream_command(upstream));
    let _proxy = Child::spawn(
        "sluice-harness proxy",
        &mut proxy_command(proxy, &dir.join("filter.json"), upstream, &[stalled_port]),
    );
    wait_for_port(upstream, Duration::from_secs(30));
    wait_for_port(proxy, Duration::from_secs(30));

    let mut held = Vec::new();
    for _ in 0..13 {
        let start = Instant::now();
        let r = http(proxy, "GET", "/api/hello", &[]);
        assert_eq!(r.status, 200, "fail open: {}", r.body);
        held.push(start.elapsed());
        accept(&connections);
    }
    std::thread::sleep(Duration::from_millis(200));
    accept(&connections);
    let _ = std::fs::remove_dir_all(&dir);
    // The breaker stopped calling after three failures: the stalled service saw three calls.
    assert_eq!(connections.lock().expect("lock").len(), 3, "request times: {held:?}");
    // The ten after the breaker opened made no call: they measure the proxy's own cost on
    // this machine now, the baseline the stalled ones are compared with. A stalled request
    // costs the timeout once, never twice (a retry would wait a second timeout): under two
    // timeouts beyond that baseline. Not tighter: on a loaded machine timers fire late, and
    // once by more than half of 300 ms, with the suite and two builds beside it.
    let baseline = held[3..].iter().max().copied().unwrap_or_default();
    for (i, d) in held[..3].iter().enumerate() {
        assert!(*d >= timeout, "request {i} did not wait for the check: {held:?}");
        assert!(
            *d < 2 * timeout + baseline,
            "request {i} took {d:?}: two timeouts or more beyond the proxy's own {baseline:?}"
        );
    }
    println!("stalled check service: requests took {held:?}");
}

/// Issue 40: no request passes unchecked after an idle gap. By default a node keeps an idle
/// connection longer than the proxies' pools do (65 min against the example Envoy's 5 s), so
/// the proxy closes it first; here the nodes close it after 300 ms, shorter than the pools
/// (the harness's 90 s, the example Envoy's 5 s), as a node set too short would: a check sent
/// on such a connection finds it closed, and is sent again on a new one. Every request after
/// each gap — about the node's idle timeout, and past the pool's — is decided by the service:
/// none fails open.
fn every_request_after_an_idle_gap_is_decided(host: ProxyHost) {
    let chain = Chain::with(Options {
        host,
        rules: ROOMY.to_owned(),
        node_args: vec!["--header-timeout-ms", "300", "--idle-timeout-ms", "300"],
        ..Options::default()
    });
    let checks = || {
        ["allowed", "denied"]
            .iter()
            .map(|d| chain.nodes_metric(&format!("sluice_checks_total{{rule=\"open-ip\",decision=\"{d}\"}}")))
            .sum::<f64>()
    };
    let mut decided = 0;
    // Gaps about the node's timeout, where a proxy may send on a connection as the node
    // closes it, and past it.
    for gap in (0..40).map(|k| 260 + 3 * k).chain([700, 700, 5_100]) {
        std::thread::sleep(Duration::from_millis(gap));
        for i in 0..2 {
            let r = http(chain.proxies[i], "GET", "/x", &[]);
            assert_eq!(r.status, 200, "{host:?}: {}", r.body);
            assert!(
                r.header("ratelimit-policy").is_some(),
                "{host:?}: after gap {gap}, proxy {i}: not decided: {r:?}"
            );
            decided += 1;
        }
    }
    assert_eq!(checks(), f64::from(decided), "{host:?}: every request was checked");
}

#[test]
fn every_request_after_an_idle_gap_is_decided_envoy() {
    every_request_after_an_idle_gap_is_decided(ProxyHost::Envoy);
}

#[test]
fn every_request_after_an_idle_gap_is_decided_real_envoy() {
    every_request_after_an_idle_gap_is_decided(ProxyHost::RealEnvoy);
}
