//! Regions end to end: each region its own Redis and service node, one global Redis, and a
//! WAN link of 50 ms each way between every region and the global store (a delaying TCP
//! relay on loopback). The global limit holds summed over regions for every leasable
//! algorithm; a region's checks do not wait on the WAN; a region whose traffic rises gets
//! the quota within seconds; a region cut off from the global store follows each rule's
//! policy, and shares again once the link is back.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_tests::http::http;
use sluice_tests::regions::{unix_now, Checker, Regions};

const WAN: Duration = Duration::from_millis(50);

/// One check as a client saw it: sent and answered (unix seconds), and whether admitted.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: f64,
    answered: f64,
    allowed: bool,
}

/// Checks `path` for `user` on `port` at `rate` a second from `start` (skipping the slots it
/// fell behind on) until `end`, in a thread.
fn drive(port: u16, path: &str, user: &'static str, rate: f64, start: Instant, end: Duration) -> JoinHandle<Vec<Sent>> {
    let path = path.to_owned();
    let mut checker = Checker::connect(port);
    pace(rate, start, end, move || checker.check(&path, user))
}

/// Sends `path` of `user` through the proxy on `port` as [`drive`] checks it: admitted when
/// the answer is 200 (the upstream's), refused when it is 429.
fn drive_proxy(
    port: u16,
    path: &str,
    user: &'static str,
    rate: f64,
    start: Instant,
    end: Duration,
) -> JoinHandle<Vec<Sent>> {
    let path = path.to_owned();
    pace(rate, start, end, move || {
        let status = http(port, "GET", &path, &[("x-user-id", user)]).status;
        assert!(status == 200 || status == 429, "{path}: status {status}");
        status == 200
    })
}

/// Calls `send` at `rate` a second from `start` (skipping the slots it fell behind on) until
/// `end`, in a thread: what each call saw.
fn pace(
    rate: f64,
    start: Instant,
    end: Duration,
    mut send: impl FnMut() -> bool + Send + 'static,
) -> JoinHandle<Vec<Sent>> {
    std::thread::spawn(move || {
        let gap = Duration::from_secs_f64(1.0 / rate);
        let mut next = start;
        let mut sent = Vec::new();
        while next < start + end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let at = unix_now();
            let allowed = send();
            sent.push(Sent {
                at,
                answered: unix_now(),
                allowed,
            });
            next = (next + gap).max(Instant::now());
        }
        sent
    })
}

fn joined(threads: Vec<JoinHandle<Vec<Sent>>>) -> Vec<Vec<Sent>> {
    threads.into_iter().map(|t| t.join().expect("client thread")).collect()
}

/// Admitted, and sent, among `sent` sent within `[from, to)` (unix seconds).
fn admitted(sent: &[Sent], from: f64, to: f64) -> (usize, usize) {
    let within: Vec<&Sent> = sent.iter().filter(|s| s.at >= from && s.at < to).collect();
    (within.iter().filter(|s| s.allowed).count(), within.len())
}

const LIMIT: u64 = 100;

/// The algorithms a rule may be leased with.
const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window_counter",
    "token_bucket",
    "gcra",
    "leaky_bucket",
];

/// Every leasable algorithm, 100 a second, leased by regions for 1 s at a time (the default).
fn bound_rules() -> String {
    ALGORITHMS
        .iter()
        .map(|a| {
            format!(
                "[[rule]]\nname = \"{a}\"\nby = \"user\"\npath = \"/{a}\"\nalgorithm = \"{a}\"\nlimit = {LIMIT}\n\
                 window = \"1s\"\nglobal = true\n\n"
            )
        })
        .collect()
}

/// The design's bound (docs/design.md, Regions) holds for every algorithm, summed over three
/// regions that each ask for more than the limit: a windowed algorithm admits at most
/// `limit` in any aligned window; a bucket at most `burst + r·(T + L)` over any interval
/// `T`, `L` the regions' lease length. A request counts in a window when it was both sent
/// and answered in it (its unit was spent in between).
#[test]
fn the_global_limit_holds_summed_over_regions_for_every_leasable_algorithm() {
    let regions = Regions::start(&bound_rules(), &[WAN, WAN, WAN]);
    let ports: Vec<u16> = regions.regions.iter().map(|r| r.port).collect();
    for (algorithm, sent) in ALGORITHMS.iter().zip(every_algorithm(&ports, 250.0, drive)) {
        // Units parked in nodes when a window turns or a lease ends are what a saturated
        // quota loses: measured 0.91–0.96 of `most` for the fixed window and the buckets and
        // 0.74–0.85 for the sliding counter on a quiet machine, 0.38 on a loaded one — how
        // the machine schedules the regions, not a promise of the design, so printed, not
        // asserted. What the design promises is asserted: the bound, and no region starved.
        assert_global_bound(algorithm, &sent);
    }
}

/// [`drive`] or [`drive_proxy`].
type Driver = fn(u16, &str, &'static str, f64, Instant, Duration) -> JoinHandle<Vec<Sent>>;

/// What each of `ports` was sent for 4 s, `rate` a second of user `u1` for each algorithm's
/// rule at once (by `driver`), by algorithm, then by port.
fn every_algorithm(ports: &[u16], rate: f64, driver: Driver) -> Vec<Vec<Vec<Sent>>> {
    let start = Instant::now();
    let threads: Vec<Vec<JoinHandle<Vec<Sent>>>> = ALGORITHMS
        .iter()
        .map(|a| {
            ports
                .iter()
                .map(|port| driver(*port, &format!("/{a}"), "u1", rate, start, Duration::from_secs(4)))
                .collect()
        })
        .collect();
    threads.into_iter().map(joined).collect()
}

/// What [`the_global_limit_holds_summed_over_regions_for_every_leasable_algorithm`] asserts
/// of `by_client` (every request of `algorithm`'s rule, by client, each client's region or
/// proxy its own): the design's bound, 1 s leases, and every client admitted some — none
/// starved of its region's share.
fn assert_global_bound(algorithm: &str, by_client: &[Vec<Sent>]) {
    for (i, client) in by_client.iter().enumerate() {
        assert!(
            client.iter().any(|s| s.allowed),
            "{algorithm}: client {i} admitted none of {}: starved",
            client.len()
        );
    }
    let regions = by_client.len();
    let sent = by_client.concat();
    let ok: Vec<&Sent> = sent.iter().filter(|s| s.allowed).collect();
    let (first, last) = (sent.iter().map(|s| s.at).fold(f64::MAX, f64::min), unix_now());
    // What the algorithm admits over the run when asked for more than it allows: the limit
    // a second; the buckets their burst (the limit) on top.
    let bucket = !matches!(algorithm, "fixed_window" | "sliding_window_counter");
    let most = LIMIT as f64 * (last - first) + if bucket { LIMIT as f64 } else { 0.0 };
    eprintln!(
        "{algorithm}: {} of {} admitted over {:.2} s from {regions} clients ({:.2} of {most:.0})",
        ok.len(),
        sent.len(),
        last - first,
        ok.len() as f64 / most
    );
    match algorithm {
        "fixed_window" | "sliding_window_counter" => {
            let mut windows = std::collections::BTreeMap::<i64, u64>::new();
            for s in ok.iter().filter(|s| s.at.floor() == s.answered.floor()) {
                *windows.entry(s.at.floor() as i64).or_default() += 1;
            }
            for (window, n) in windows {
                assert!(
                    n <= LIMIT,
                    "{algorithm}: {n} admitted in the window of second {window}, limit {LIMIT}"
                );
            }
        }
        _ => {
            let lease = 1.0;
            let rate = LIMIT as f64; // per second, the burst being the limit
            let grid: Vec<f64> = (0..=((last - first) * 4.0) as usize)
                .map(|k| first + k as f64 / 4.0)
                .collect();
            for (k, a) in grid.iter().enumerate() {
                for b in &grid[k + 1..] {
                    let n = ok.iter().filter(|s| s.at >= *a && s.answered <= *b).count() as f64;
                    let bound = LIMIT as f64 + rate * (b - a + lease);
                    assert!(
                        n <= bound,
                        "{algorithm}: {n} admitted within {:.2} s, bound {bound:.1}",
                        b - a
                    );
                }
            }
        }
    }
}

/// Proxies leasing global rules through their region's node (`lease = true` beside
/// `global = true`): the node hands on units it holds of the global quota, so the bound is
/// the regions' own (units are debited from the global quota once, when a node leases them,
/// and a proxy's lease ends within its node's). Two regions, a proxy each, every leasable
/// algorithm asked for twice its limit: the bound holds over every request the proxies
/// answered, whether a lease or a check decided it.
#[test]
fn proxies_leasing_through_their_regions_keep_the_global_bound_for_every_leasable_algorithm() {
    let rules = bound_rules().replace("global = true\n", "global = true\nlease = true\n");
    let regions = Regions::start(&rules, &[WAN, WAN]);
    let proxies: Vec<_> = (0..2).map(|i| regions.proxy(i)).collect();
    std::thread::sleep(Duration::from_millis(1_200)); // the proxies fetch the rules
                                                      // Three clients a proxy: a refused request may wait a WAN round trip (a quota whose
                                                      // lease ran short is asked for again before a refusal).
    let ports: Vec<u16> = proxies.iter().flat_map(|p| [p.port; 3]).collect();
    for (algorithm, sent) in ALGORITHMS
        .iter()
        .zip(every_algorithm(&ports, LIMIT as f64 / 2.0, drive_proxy))
    {
        // A refused request through a proxy may wait a WAN round trip first, so the clients
        // send less than the regions test's (measured 0.55–0.64 of the most).
        assert_global_bound(algorithm, &sent);
    }
    for (i, p) in proxies.iter().enumerate() {
        let leased = p.metric("sluice_filter_requests_leased");
        eprintln!(
            "proxy {i}: {leased} decided by leases, {} by checks",
            p.metric("sluice_filter_requests_checked")
        );
        assert!(leased > 0, "proxy {i} leased nothing through its region");
    }
    let handed: f64 = (0..2)
        .map(|i| {
            regions.metric(
                i,
                &format!("sluice_global_sublease_units_total{{region=\"r{i}\",kind=\"handed_on\"}}"),
            )
        })
        .sum();
    assert!(handed > 0.0, "the nodes handed nothing on");
}

/// A global rule proxies lease through their region, far from its limit.
const ROOMY_LEASED: &str = r#"
[[rule]]
name       = "tenant"
by         = "user"
algorithm  = "token_bucket"
limit      = 1000000
window     = "1m"
global     = true
global_ttl = "5s"
lease      = true
lease_ttl  = "2s"
"#;

/// In steady state a request through a proxy leasing through its region needs neither a
/// call to the node nor a WAN trip: two regions, a proxy each at 100 requests a second.
#[test]
fn a_proxy_leasing_through_its_region_costs_almost_no_calls() {
    let regions = Regions::start(ROOMY_LEASED, &[WAN, WAN]);
    let proxies: Vec<_> = (0..2).map(|i| regions.proxy(i)).collect();
    std::thread::sleep(Duration::from_millis(1_200)); // the proxies fetch the rules
    let send = |secs: u64| {
        let start = Instant::now();
        let threads = proxies
            .iter()
            .map(|p| drive_proxy(p.port, "/api", "steady", 100.0, start, Duration::from_secs(secs)))
            .collect();
        let sent: Vec<Sent> = joined(threads).concat();
        assert!(
            sent.iter().all(|s| s.allowed),
            "far below the limit, every request admitted"
        );
        sent.len() as f64
    };
    send(3); // the leases settle at the clients' rate
    let calls = |i: usize| {
        regions.metric(i, "sluice_lease_calls_total") + proxies[i].metric("sluice_filter_requests_checked") as f64
    };
    let wan = |i: usize| {
        regions.metric(
            i,
            &format!("sluice_global_lease_calls_total{{region=\"r{i}\",result=\"ok\"}}"),
        )
    };
    let before: Vec<(f64, f64)> = (0..2).map(|i| (calls(i), wan(i))).collect();
    let sent = send(8) / 2.0;
    for (i, (calls_before, wan_before)) in before.into_iter().enumerate() {
        let per_request = (calls(i) - calls_before) / sent;
        let wan_per_request = (wan(i) - wan_before) / sent;
        eprintln!(
            "region {i}: {per_request:.4} calls from the proxy to its node and {wan_per_request:.4} WAN calls a request \
             (all along: {} lease calls, {} checks, {} leases granted, {} renewed)",
            regions.metric(i, "sluice_lease_calls_total"),
            proxies[i].metric("sluice_filter_requests_checked"),
            proxies[i].metric("sluice_filter_leases_granted"),
            proxies[i].metric("sluice_filter_leases_renewed"),
        );
        assert!(
            per_request <= 0.02,
            "region {i}: {per_request:.4} calls a request at the proxy"
        );
    }
}

/// A global rule and a regional one, far from their limits: every check takes a region
/// store call and a pool's units.
const ROOMY: &str = r#"
[[rule]]
name      = "tenant"
by        = "user"
algorithm = "token_bucket"
limit     = 1000000
window    = "1m"
global    = true

[[rule]]
name      = "tenant-here"
by        = "user"
algorithm = "sliding_window_counter"
limit     = 1000000
window    = "1m"
"#;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Two regions in one run, one 50 ms from the global store, one next to it: checks sent to
/// them in turn from one client, so both see the same machine. No check of the far region
/// waits on the WAN once its quota is leased.
#[test]
fn a_region_far_from_the_global_store_answers_as_fast_as_one_beside_it() {
    let regions = Regions::start(ROOMY, &[WAN, Duration::ZERO]);
    let (far, near) = (regions.regions[0].port, regions.regions[1].port);
    let mut clients = [Checker::connect(far), Checker::connect(near)];
    // Warm up: the pools fill (a check before the first lease lands waits for it).
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(1500) {
        for c in &mut clients {
            c.check("/api", "u1");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut latencies = [Vec::new(), Vec::new()];
    let mut allowed = [0usize; 2];
    for _ in 0..3000 {
        for (i, c) in clients.iter_mut().enumerate() {
            let t = Instant::now();
            allowed[i] += usize::from(c.check("/api", "u1"));
            latencies[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    for l in &mut latencies {
        l.sort_by(f64::total_cmp);
    }
    let [p50_far, p99_far] = [0.5, 0.99].map(|p| percentile(&latencies[0], p));
    let [p50_near, p99_near] = [0.5, 0.99].map(|p| percentile(&latencies[1], p));
    eprintln!(
        "check latency, 50 ms WAN: p50 {p50_far:.3} ms, p99 {p99_far:.3} ms; no WAN: p50 {p50_near:.3} ms, \
         p99 {p99_near:.3} ms; p99 ratio {:.2}",
        p99_far / p99_near
    );
    assert!(
        allowed.iter().all(|a| *a >= 2970),
        "checks must be decided from the pools: {allowed:?} of 3000 admitted"
    );
    // What the test is for: no check waits on the WAN. One that did would take a round trip
    // (100 ms) at least, so the far region's p99 stays under half of one however busy the
    // machine is; the precise comparison of the two tails is the benchmark's (BENCHMARKS.md).
    let round_trip = 2.0 * WAN.as_secs_f64() * 1e3;
    assert!(
        p99_far < round_trip / 2.0,
        "p99 {p99_far:.3} ms 50 ms from the global store ({p99_near:.3} ms beside it): a check waited on the WAN"
    );
}

/// The shift test's rule: 360 requests a second against a bucket of 400 a second, so the
/// global quota is never spent and every refusal is one the bound costs.
const SHARED: &str = r#"
[[rule]]
name      = "tenant"
by        = "user"
algorithm = "token_bucket"
limit     = 400
window    = "1s"
global    = true
"#;

/// Two regions split 360 requests a second 80/20, then 20/80. The region whose traffic rose
/// is served as fully as the other was within a few seconds, and the requests refused while
/// the quota had units (all refusals here) stay few.
#[test]
fn the_quota_follows_traffic_shifting_between_regions() {
    let regions = Regions::start(SHARED, &[WAN, WAN]);
    let (a, b) = (regions.regions[0].port, regions.regions[1].port);
    let phase = Duration::from_secs(5);
    let start = Instant::now();
    let t0 = unix_now();
    let first = [
        drive(a, "/api", "t", 240.0, start, phase),
        drive(b, "/api", "t", 60.0, start, phase),
    ];
    let second_start = start + phase;
    let second = [
        drive(a, "/api", "t", 72.0, second_start, phase),
        drive(b, "/api", "t", 288.0, second_start, phase),
    ];
    let [a1, b1]: [Vec<Sent>; 2] = joined(first.into()).try_into().expect("two");
    let [a2, b2]: [Vec<Sent>; 2] = joined(second.into()).try_into().expect("two");
    let shift = t0 + phase.as_secs_f64();
    let end = shift + phase.as_secs_f64();
    // Before the shift, once warm, the busy region is served.
    let (ok, sent) = admitted(&a1, shift - 2.0, shift);
    assert!(
        ok as f64 >= 0.95 * sent as f64,
        "80/20: the busy region got {ok} of {sent}"
    );
    // After it, the newly busy region is served within a few seconds...
    let caught_up = (0..20)
        .map(|k| shift + k as f64 * 0.25)
        .find(|from| {
            let (ok, sent) = admitted(&b2, *from, from + 0.25);
            sent > 0 && ok as f64 >= 0.9 * sent as f64
        })
        .map(|t| t - shift);
    eprintln!("20/80: the busy region is served within {caught_up:?} s of the shift");
    assert!(
        caught_up.is_some_and(|s| s <= 3.0),
        "the quota did not follow the traffic: {caught_up:?}"
    );
    let (ok, sent) = admitted(&b2, end - 2.0, end);
    assert!(
        ok as f64 >= 0.95 * sent as f64,
        "20/80: the busy region got {ok} of {sent}"
    );
    // What the bound cost: refusals while the quota had units, after the first second.
    let all: Vec<&Sent> = [&a1, &b1, &a2, &b2].into_iter().flatten().collect();
    let refused = |from: f64, to: f64| all.iter().filter(|s| !s.allowed && s.at >= from && s.at < to).count();
    let total = all.iter().filter(|s| s.at >= t0 + 1.0).count();
    let (warm, around_shift) = (refused(t0 + 1.0, shift), refused(shift, shift + 2.0));
    let cost = refused(t0 + 1.0, end + 1.0);
    eprintln!(
        "refused while the quota had units: {cost} of {total} after the first second ({warm} before the shift, \
         {around_shift} in the 2 s after it)"
    );
    assert!(
        (cost as f64) < 0.05 * total as f64,
        "{cost} of {total} refused while the quota had units"
    );
    // The WAN carries a few lease calls a second, not the checks.
    let calls: f64 = (0..2)
        .map(|i| {
            regions.metric(
                i,
                &format!("sluice_global_lease_calls_total{{region=\"r{i}\",result=\"ok\"}}"),
            )
        })
        .sum();
    let checks = all.len() as f64;
    eprintln!(
        "lease calls over the WAN: {calls} for {checks} checks ({:.4} a check, {:.1} a second per region)",
        calls / checks,
        calls / 2.0 / (end - t0)
    );
    // The design's bound: one exchange per tick (50 ms) and region, whatever the traffic
    // (each region sees 60 to 288 checks a second here, so checks over the WAN would break it).
    let per_region_per_s = calls / 2.0 / (end - t0);
    assert!(
        per_region_per_s <= 1000.0 / 50.0,
        "{per_region_per_s:.1} WAN calls a second per region: more than one a tick ({calls} for {checks} checks)"
    );
}

/// Three global rules, one per policy, 1,000 a second with 2 s leases; the share is 5 %.
const POLICIES: &str = r#"
[[rule]]
name      = "spend"
by        = "user"
path      = "/spend"
algorithm = "token_bucket"
limit     = 1000
window    = "1s"
global    = true
global_ttl = "2s"

[[rule]]
name      = "share"
by        = "user"
path      = "/share"
algorithm = "token_bucket"
limit     = 1000
window    = "1s"
global    = true
global_ttl = "2s"
on_global_unreachable = "share"
global_share = 5

[[rule]]
name      = "closed"
by        = "user"
path      = "/closed"
algorithm = "token_bucket"
limit     = 1000
window    = "1s"
global    = true
global_ttl = "2s"
on_global_unreachable = "closed"
"#;

/// The global store cut off from both regions for 4 s, then restored. `spend` admits only
/// while its leases last, then refuses; `share` keeps admitting, at most its share;
/// `closed` refuses; once restored, all three are served from the global quota again, by
/// the same processes.
#[test]
fn regions_cut_off_from_the_global_store_follow_each_rules_policy_and_recover() {
    let mut regions = Regions::start(POLICIES, &[WAN, WAN]);
    let paths = ["/spend", "/share", "/closed"];
    let (warm, cut_for, after) = (2.0, 4.0, 3.5);
    let start = Instant::now();
    let t0 = unix_now();
    let run = Duration::from_secs_f64(warm + cut_for + after);
    let threads: Vec<_> = paths
        .iter()
        .flat_map(|p| {
            regions
                .regions
                .iter()
                .map(move |r| drive(r.port, p, "t", 100.0, start, run))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(warm));
    let cut = unix_now();
    for r in &regions.regions {
        r.link.cut();
    }
    std::thread::sleep(Duration::from_secs_f64(cut_for - 0.5));
    let link_up: Vec<f64> = (0..2)
        .map(|i| regions.metric(i, &format!("sluice_global_link_up{{region=\"r{i}\"}}")))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let restored = unix_now();
    for r in &regions.regions {
        r.link.restore();
    }
    let by_thread = joined(threads);
    let end = t0 + run.as_secs_f64();
    assert_eq!(link_up, [0.0, 0.0], "the nodes must know the global store is cut off");
    let (ttl, timeout) = (2.0, 1.0);
    for (r, region) in regions.regions.iter_mut().enumerate() {
        assert!(region.node.is_running(), "region {r}'s node must not restart");
        let [spend, share, closed] = [0, 1, 2].map(|p| &by_thread[p * 2 + r]);
        let (ok, sent) = admitted(spend, t0 + 1.0, cut);
        assert!(
            ok as f64 >= 0.95 * sent as f64,
            "region {r}, spend: {ok} of {sent} before the cut"
        );
        // spend: what it holds, then nothing; no unit outlives its lease.
        let late = spend
            .iter()
            .filter(|s| s.allowed && s.at > cut + ttl + 0.05 && s.at < restored);
        assert_eq!(late.count(), 0, "region {r}, spend: admitted past its leases' end");
        // closed: refuses once a lease call failed.
        let (ok, sent) = admitted(closed, cut + ttl + timeout, restored);
        assert_eq!(ok, 0, "region {r}, closed: {ok} of {sent} admitted while cut off");
        // share: keeps serving alone, at most its share (50 a second, burst 50).
        let (from, to) = (cut + ttl + timeout, restored);
        let (ok, sent) = admitted(share, from, to);
        let bound = 50.0 + 50.0 * (to - from);
        eprintln!(
            "region {r}, share: {ok} of {sent} admitted alone over {:.2} s (bound {bound:.0})",
            to - from
        );
        assert!(
            ok > 0 && (ok as f64) <= bound,
            "region {r}, share: {ok} admitted alone, bound {bound:.0}"
        );
        // Restored: every policy is served from the global quota again.
        for (p, sent) in [spend, share, closed].iter().enumerate() {
            let (ok, n) = admitted(sent, end - 1.5, end);
            assert!(
                ok as f64 >= 0.9 * n as f64,
                "region {r}, {}: {ok} of {n} after the link came back",
                paths[p]
            );
        }
    }
    let up: Vec<f64> = (0..2)
        .map(|i| regions.metric(i, &format!("sluice_global_link_up{{region=\"r{i}\"}}")))
        .collect();
    assert_eq!(up, [1.0, 1.0], "the nodes must see the global store again");
}

/// A thousand users new to a region 50 ms from the global store, each sending its first
/// request: none is refused (the quota has units), each first request waits about one WAN
/// round trip for its quota's first lease, and the requests after it are decided at once
/// from that lease.
#[test]
fn a_thousand_new_users_are_admitted_on_their_first_request() {
    let regions = Regions::start(ROOMY, &[WAN]);
    let port = regions.regions[0].port;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut checker = Checker::connect(port);
                let mut seen = Vec::new();
                for u in 0..125 {
                    let user = format!("new-{t}-{u}");
                    let timed = |checker: &mut Checker| {
                        let started = Instant::now();
                        let allowed = checker.check("/api", &user);
                        (allowed, started.elapsed().as_secs_f64() * 1e3)
                    };
                    let first = timed(&mut checker);
                    let second = timed(&mut checker);
                    seen.push((first, second));
                }
                seen
            })
        })
        .collect();
    let seen: Vec<_> = threads.into_iter().flat_map(|t| t.join().expect("client")).collect();
    let refused = seen.iter().filter(|((a, _), (b, _))| !a || !b).count();
    let mut firsts: Vec<f64> = seen.iter().map(|((_, ms), _)| *ms).collect();
    let mut seconds: Vec<f64> = seen.iter().map(|(_, (_, ms))| *ms).collect();
    firsts.sort_by(f64::total_cmp);
    seconds.sort_by(f64::total_cmp);
    let (first, second) = (percentile(&firsts, 0.5), percentile(&seconds, 0.5));
    eprintln!(
        "1,000 new users, 50 ms WAN: first request p50 {first:.1} ms (p99 {:.1}), the next p50 {second:.2} ms (p99 {:.2}); {refused} refused; cold: {}",
        percentile(&firsts, 0.99),
        percentile(&seconds, 0.99),
        regions.metric(0, r#"sluice_global_checks_total{region="r0",source="cold"}"#)
    );
    assert_eq!(refused, 0, "no refusal while the quota has units");
    // A first request waits on the WAN (a round trip is 100 ms); the next one does not.
    assert!(
        first >= 100.0,
        "the first request's p50 {first:.1} ms: it did not wait for a lease"
    );
    assert!(
        second < first / 4.0,
        "the next request's p50 {second:.2} ms against {first:.1} ms: it waited too"
    );
    assert!(regions.metric(0, r#"sluice_global_checks_total{region="r0",source="cold"}"#) >= 1_000.0);
}

/// A user idle past `--global-keep-warm-ms` (here none is kept: 0) comes back after its
/// lease ended: admitted on its first request.
#[test]
fn a_user_idle_past_keep_warm_is_admitted_on_return() {
    let regions = Regions::start_with(ROOMY, &[WAN], &["--global-keep-warm-ms", "0"]);
    let mut checker = Checker::connect(regions.regions[0].port);
    assert!(checker.check("/api", "returning"), "admitted on its first visit");
    // The region's lease lasts 1 s; idle a whole second, it is not renewed.
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(checker.check("/api", "returning"), "admitted when it comes back");
    assert!(
        regions.metric(0, r#"sluice_global_checks_total{region="r0",source="cold"}"#) >= 2.0,
        "both visits were cold"
    );
}
