//! One proxy of several workers: VMs of one process in the harness, sharing its shared data
//! as Envoy's workers (one `vm_id`) and Nginx's worker processes (an `shm_kv` zone) do.
//! With `share: process` they are one participant; with `share: worker`, each its own.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sluice_harness::abi::LogLevel;
use sluice_harness::{CallResponse, Flavor, Host, HostOptions, Outcome};

/// `n` started workers of one process running the filter with `config`.
fn workers(config: &Value, flavor: Flavor, n: usize) -> Vec<Host> {
    let options = HostOptions {
        flavor,
        ..HostOptions::default()
    };
    (0..n)
        .map(|_| {
            let mut host = Host::from_plugin(plugin(), options.clone()).expect("module loads");
            host.start(b"", config.to_string().as_bytes()).expect("filter starts");
            host
        })
        .collect()
}

/// Requests from one client, each on the next worker in turn; how many the local prefilter
/// let through to a check (each then answered as admitted).
fn spread(hosts: &mut [Host], requests: usize) -> usize {
    let mut through = 0;
    for i in 0..requests {
        let host = &mut hosts[i % hosts.len()];
        let (s, outcome) = request(host, "203.0.113.7", "/api", &[]);
        if outcome == Outcome::Pause {
            through += 1;
            for call in host.pending_calls() {
                host.respond_call(call.token, answer(true, 10, 1000, 0))
                    .expect("answered");
            }
        }
        host.finish_stream(s).expect("ended");
    }
    through
}

fn local(flavor: Flavor, share: &str) -> Value {
    let mut config = config_in(flavor);
    config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": 3});
    config["share"] = share.into();
    config
}

fn one_client_over_four_workers_gets_one_burst(flavor: Flavor) {
    let mut hosts = workers(&local(flavor, "process"), flavor, 4);
    assert_eq!(spread(&mut hosts, 24), 3, "one burst for the process");
    let mut hosts = workers(&local(flavor, "worker"), flavor, 4);
    assert_eq!(spread(&mut hosts, 24), 12, "share: worker, a burst each");
}

/// A prefilter's burst of 400 over four workers: each takes 12 of the process's tokens at a
/// time and spends them without reading the table. The process never admits past the burst;
/// the tokens the other three hold when the bucket runs dry refuse early, 11 each at most.
fn a_large_burst_is_taken_a_dozen_tokens_at_a_time(flavor: Flavor) {
    let config = |burst: u64| {
        let mut config = config_in(flavor);
        config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": burst});
        config
    };
    let mut hosts = workers(&config(400), flavor, 4);
    let calls = |hosts: &[Host]| hosts.iter().map(Host::host_calls).sum::<u64>();
    let before = calls(&hosts);
    assert_eq!(spread(&mut hosts, 96), 96, "within the burst");
    let taken_ahead = calls(&hosts) - before;
    assert!(spread(&mut hosts, 1_000) <= 400 - 96, "past the burst");
    let mut hosts = workers(&config(400), flavor, 4);
    let admitted = spread(&mut hosts, 1_000);
    assert!(
        (400 - 3 * 11..=400).contains(&admitted),
        "{admitted} of a burst of 400 admitted"
    );
    // A burst under 64 is taken a token at a time: each request reads and writes the table.
    let mut hosts = workers(&config(63), flavor, 4);
    let before = calls(&hosts);
    assert_eq!(spread(&mut hosts, 48), 48);
    let one_at_a_time = (calls(&hosts) - before) * 2;
    println!("{flavor:?}: 96 requests cost {taken_ahead} host calls taken ahead, {one_at_a_time} one at a time");
    assert!(
        taken_ahead + 96 * 3 < one_at_a_time,
        "{taken_ahead} host calls taken ahead, {one_at_a_time} one at a time"
    );
}

fn a_stalled_service_costs_the_process_failures_calls(flavor: Flavor) {
    // Three failures open the breaker (common::config): one process of four workers makes
    // three calls that fail, then every worker answers by the failure policy at once.
    let mut config = config_in(flavor);
    config["local"] = json!(null);
    let mut hosts = workers(&config, flavor, 4);
    let mut calls = 0;
    for i in 0..16 {
        let host = &mut hosts[i % 4];
        let (s, _) = request(host, &format!("198.51.100.{i}"), "/api", &[]);
        for call in host.pending_calls() {
            calls += 1;
            host.fail_call(call.token).expect("failed");
            // the one retry a refused connection gets
            for retry in host.pending_calls() {
                calls += 1;
                host.fail_call(retry.token).expect("failed");
            }
        }
        host.finish_stream(s).expect("ended");
    }
    assert!(calls <= 2 * 3, "{calls} calls: the breaker is not the process's");
    let mut config = config_in(flavor);
    config["local"] = json!(null);
    config["share"] = "worker".into();
    let mut hosts = workers(&config, flavor, 4);
    let mut calls = 0;
    for i in 0..16 {
        let host = &mut hosts[i % 4];
        let (s, _) = request(host, &format!("198.51.100.{i}"), "/api", &[]);
        while let Some(call) = host.pending_calls().first().cloned() {
            calls += 1;
            host.fail_call(call.token).expect("failed");
        }
        host.finish_stream(s).expect("ended");
    }
    assert!(calls > 2 * 3, "{calls} calls: share: worker keeps a breaker a worker");
}

/// Failing open with the service gone: one client over four workers gets one fallback
/// burst from the process (each worker's own with `share: worker`).
fn failing_open_one_client_over_four_workers_gets_one_fallback_burst(flavor: Flavor) {
    let admitted = |share: &str| {
        let mut config = config_in(flavor);
        config["local"] = json!(null);
        config["share"] = share.into();
        config["failure"] = json!({"mode": "open", "fallback": {"rate_per_s": 1, "burst": 3},
                                   "breaker": {"failures": 1000, "cooldown_ms": 1000}});
        let mut hosts = workers(&config, flavor, 4);
        let mut admitted = 0;
        for i in 0..24 {
            let host = &mut hosts[i % 4];
            let (s, outcome) = request(host, "203.0.113.7", "/api", &[]);
            let mut refused = matches!(outcome, Outcome::LocalResponse(_));
            while let Some(call) = host.pending_calls().first().cloned() {
                host.fail_call(call.token).expect("failed");
            }
            refused |= host.stream(s).is_some_and(|st| st.local_response.is_some());
            admitted += usize::from(!refused);
            host.finish_stream(s).expect("ended");
        }
        admitted
    };
    assert_eq!(admitted("process"), 3, "one fallback burst for the process");
    assert_eq!(admitted("worker"), 12, "share: worker, a burst each");
}

/// Leases of one client's quota over four workers: the lease calls their timers make, and
/// how many of 12 requests spread over them a lease of 8 units decided (the rest checked).
fn leases_over_four_workers(flavor: Flavor, share: &str) -> (usize, usize) {
    const RULES: &str = r#"{"rule": [{"name": "per-ip", "by": "ip", "algorithm": "fixed_window",
                                      "limit": 100, "window": "1m", "lease": true}]}"#;
    let mut config = config_in(flavor);
    config["local"] = json!(null);
    config["share"] = share.into();
    config["lease"] = json!({"tick_ms": 50, "poll_ms": 60_000});
    let mut hosts = workers(&config, flavor, 4);
    let tick = |host: &mut Host| host.advance(Duration::from_millis(50)).expect("tick");
    let calls_to = |host: &Host, path: &str| {
        let calls = host.pending_calls().into_iter();
        calls.filter(|c| c.header(":path") == Some(path)).collect::<Vec<_>>()
    };
    for host in &mut hosts {
        tick(host);
        for call in calls_to(host, "/v1/rules") {
            host.respond_call(call.token, CallResponse::new(200, RULES))
                .expect("rules");
        }
    }
    // Every worker meets the client before any lease: checked exactly, the demand noted.
    let ip = "9.9.9.9, 203.0.113.9";
    let send = |host: &mut Host| {
        let (s, outcome) = request(host, ip, "/", &[]);
        for call in calls_to(host, "/v1/check") {
            host.respond_call(call.token, answer(true, 50, 60_000, 0))
                .expect("answered");
        }
        host.finish_stream(s).expect("ended");
        outcome == Outcome::Continue
    };
    for host in &mut hosts {
        assert!(!send(host), "no lease yet");
    }
    // Every timer runs before any lease call is answered.
    for host in &mut hosts {
        tick(host);
    }
    let mut lease_calls = 0;
    for host in &mut hosts {
        for call in calls_to(host, "/v1/lease") {
            lease_calls += 1;
            host.respond_call(call.token, grant_each(&call, 7, 8, 10_000))
                .expect("granted");
        }
    }
    let leased = (0..12).filter(|i| send(&mut hosts[i % 4])).count();
    (lease_calls, leased)
}

/// One lease call for the process, whose units every worker spends; with `share: worker`
/// each worker leases, and spends, its own.
fn one_lease_serves_every_worker(flavor: Flavor) {
    assert_eq!(leases_over_four_workers(flavor, "process"), (1, 8));
    assert_eq!(leases_over_four_workers(flavor, "worker"), (4, 12));
}

/// The filter's own in-flight limit of 3: requests of one client held open on the next
/// worker in turn; how many were admitted of `n` at once, and of 3 more once those ended.
fn in_flight_over_four_workers(flavor: Flavor, share: &str, n: usize) -> (usize, usize) {
    let mut config = config_in(flavor);
    config["concurrency"] = json!({"local": {"by": "ip", "limit": 3}});
    config["share"] = share.into();
    let mut hosts = workers(&config, flavor, 4);
    let mut open = Vec::new();
    let mut admitted = 0;
    for i in 0..n {
        let w = i % hosts.len();
        let (s, outcome) = request(&mut hosts[w], "203.0.113.7", "/api", &[]);
        if outcome == Outcome::Pause {
            admitted += 1;
            open.push((w, s)); // checked: its slot is held until it ends
        } else {
            hosts[w].finish_stream(s).expect("ended");
        }
    }
    for (w, s) in open {
        hosts[w].finish_stream(s).expect("ended");
    }
    let after = (0..3)
        .filter(|&i| request(&mut hosts[i], "203.0.113.7", "/api", &[]).1 == Outcome::Pause)
        .count();
    (admitted, after)
}

/// With `share: process`, one limit for the process; with `share: worker`, each its own.
fn one_in_flight_limit_for_the_process(flavor: Flavor) {
    assert_eq!(in_flight_over_four_workers(flavor, "process", 8), (3, 3));
    assert_eq!(in_flight_over_four_workers(flavor, "worker", 8), (8, 3));
}

on_both_hosts!(
    one_in_flight_limit_for_the_process,
    one_client_over_four_workers_gets_one_burst,
    a_large_burst_is_taken_a_dozen_tokens_at_a_time,
    a_stalled_service_costs_the_process_failures_calls,
    failing_open_one_client_over_four_workers_gets_one_fallback_burst,
    one_lease_serves_every_worker
);

/// ngx_wasm_module traps on shared data of no declared `shm_kv` zone, taking the worker
/// down. A configuration that asks for `share: process` touches its keys at configuration,
/// so such an Nginx fails there, naming the directive, never on traffic.
#[test]
fn nginx_asked_to_share_without_an_shm_kv_zone_fails_at_configuration() {
    let options = HostOptions {
        flavor: Flavor::Nginx,
        shm_kv: Vec::new(),
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin(), options).expect("module loads");
    let err = host
        .start(b"", config_in(Flavor::Nginx).to_string().as_bytes())
        .expect_err("no zone");
    assert!(err.to_string().contains("shm_kv"), "{err}");
}

/// An nginx.conf written before `share` (no `shm_kv` zone) and a configuration that does not
/// say `share` (issue 65): every worker keeps serving, each deciding alone, and the log says
/// once, as an error, which zone to add. Envoy, with the same configuration, is one
/// participant.
#[test]
fn a_configuration_without_share_needs_no_zone_in_nginx() {
    let mut config = config_in(Flavor::Nginx);
    config.as_object_mut().map(|c| c.remove("share"));
    config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": 2, "max_keys": 100});
    let options = HostOptions {
        flavor: Flavor::Nginx,
        shm_kv: Vec::new(),
        ..HostOptions::default()
    };
    let mut hosts: Vec<Host> = (0..2)
        .map(|_| {
            let mut host = Host::from_plugin(plugin(), options.clone()).expect("module loads");
            host.start(b"", config.to_string().as_bytes()).expect("no zone needed");
            host
        })
        .collect();
    // Each worker lets its own burst of 2 through: 4 of 8, where one participant lets 2.
    assert_eq!(spread(&mut hosts, 8), 4, "decided per worker");
    for host in &hosts {
        let said: Vec<_> = host
            .logs()
            .iter()
            .filter(|l| l.level == LogLevel::Error && l.message.contains("shm_kv sluice"))
            .collect();
        assert_eq!(said.len(), 1, "{:#?}", host.logs());
    }
    let mut config = config_in(Flavor::Envoy);
    config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": 2, "max_keys": 100});
    let mut envoy = workers(&config, Flavor::Envoy, 2);
    assert_eq!(spread(&mut envoy, 8), 2, "one participant");
    assert!(
        !envoy[0].logs().iter().any(|l| l.message.contains("shm_kv")),
        "{:#?}",
        envoy[0].logs()
    );
}
