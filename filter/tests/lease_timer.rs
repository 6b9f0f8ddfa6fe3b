//! The timer of one proxy of four workers that share their leases (`share: process`), under
//! a steady load of many clients: it reads the slots of only the quotas with something to
//! do, and still renews every lease before it ends, so that no request waits for a check.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sluice_harness::{CallResponse, Flavor, Host, HostOptions, Outcome, PendingCall};

const RULES: &str = r#"{"rule": [{"name": "per-ip", "by": "ip", "algorithm": "token_bucket",
                                  "limit": 50000000, "window": "1m", "lease": true}]}"#;
const CLIENTS: usize = 40;
const WORKERS: usize = 4;
const STEP: Duration = Duration::from_millis(5);

/// What the load cost, after its first two seconds.
#[derive(Debug, Default)]
struct Load {
    requests: u64,
    checks: u64,
    lease_calls: u64,
    ticks: u64,
    tick_host_calls: u64,
}

/// The service: the rules, each lease asked for granted whole for a second (the rules'
/// default `lease_ttl`), and every check admitted.
fn answer_calls(host: &mut Host) -> (u64, u64) {
    let (mut checks, mut leases) = (0, 0);
    while let Some(call) = host.pending_calls().first().cloned() {
        let answer = match call.header(":path") {
            Some("/v1/rules") => {
                let mut rules = CallResponse::new(200, RULES);
                rules.headers.push(("etag".into(), "\"1\"".into()));
                rules
            }
            Some("/v1/lease") => {
                leases += 1;
                grant_all(&call)
            }
            _ => {
                checks += 1;
                answer(true, 10, 1_000, 0)
            }
        };
        host.respond_call(call.token, answer).expect("answered");
    }
    (checks, leases)
}

fn grant_all(call: &PendingCall) -> CallResponse {
    let body: Value = serde_json::from_slice(&call.body).expect("JSON");
    let grants: Vec<Value> = body["grants"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, ask)| {
            json!({"lease": 1_000 + i, "units": ask["want"], "expires_in_ms": 1_000, "limit": 50_000_000,
                   "remaining": 40_000_000, "reset_after_ms": 60_000, "window_ms": 60_000})
        })
        .collect();
    let returned = vec![0; body["returns"].as_array().map_or(0, Vec::len)];
    let answer = json!({"rules_version": 1, "grants": grants, "returned": returned});
    CallResponse::new(200, answer.to_string())
}

/// Six seconds of `CLIENTS` clients, each sending a request every 5 ms to the next worker;
/// the service answers each call 5 ms after it went out.
fn steady_load(flavor: Flavor) -> Load {
    let mut config = config_in(flavor);
    config["local"] = json!(null);
    config["share"] = "process".into();
    config["lease"] = json!({"tick_ms": 50, "poll_ms": 60_000});
    let options = HostOptions {
        flavor,
        ..HostOptions::default()
    };
    let mut hosts: Vec<Host> = (0..WORKERS)
        .map(|_| {
            let mut host = Host::from_plugin(metered_plugin(), options.clone()).expect("module loads");
            host.start(b"", config.to_string().as_bytes()).expect("filter starts");
            host
        })
        .collect();
    let mut load = Load::default();
    for step in 0..1_200u64 {
        let counted = step >= 400;
        for host in &mut hosts {
            let (checks, leases) = answer_calls(host);
            if counted {
                load.checks += checks;
                load.lease_calls += leases;
            }
        }
        for client in 0..CLIENTS {
            let host = &mut hosts[(client + step as usize) % WORKERS];
            let (s, outcome) = request(host, &format!("198.51.100.{client}"), "/api", &[]);
            assert!(!matches!(outcome, Outcome::LocalResponse(_)), "refused");
            if outcome == Outcome::Pause {
                load.checks += u64::from(counted);
                let (call, _) = the_call(host);
                host.respond_call(call.token, answer(true, 10, 1_000, 0))
                    .expect("answered");
            }
            let _ = host.response_headers(s, &[(":status", "200")], false);
            host.finish_stream(s).expect("ended");
            load.requests += u64::from(counted);
        }
        for host in &mut hosts {
            let before = host.host_calls();
            host.advance(STEP).expect("tick");
            if counted {
                load.ticks += u64::from(step % 10 == 9);
                load.tick_host_calls += host.host_calls() - before;
            }
        }
    }
    load
}

fn the_timer_reads_only_quotas_with_something_to_do(flavor: Flavor) {
    let load = steady_load(flavor);
    println!("{flavor:?}: {load:?}");
    // Every lease renewed before it ends: after the first leases, no request is checked.
    assert_eq!(load.checks, 0, "{load:?}");
    // Each quota's lease lasts a second and is renewed about every 750 ms: a worker's timer
    // reads its slot a few times a lease (as it is renewed, as the replaced lease ends):
    // 8.9 host calls a tick. Reading every known quota's slot every tick, as it once did,
    // cost 43.
    let per_tick = load.tick_host_calls as f64 / load.ticks as f64;
    assert!(per_tick < 10.0, "{per_tick} host calls a tick: {load:?}");
    // The process asks for its quotas' leases once for its four workers, many a call: 11
    // calls in these 4 s (the clock is the harness's, so the count is exact).
    assert!(load.lease_calls <= 12, "{load:?}");
}

on_both_hosts!(the_timer_reads_only_quotas_with_something_to_do);
