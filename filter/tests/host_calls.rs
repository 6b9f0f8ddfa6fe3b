//! The calls into the host a request costs the filter on each path, counted by the harness
//! (every import, WASI's included), with the process's state and with each worker's: the
//! list is docs/filter.md's. A path that grows fails here; a path that shrinks lowers its
//! figure.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sluice_harness::{CallResponse, Flavor, Host, Outcome};

/// One request from `ip` through `host` to its end, the check (if any) answered as
/// admitted: the host calls it cost, and how it went.
fn one_request(host: &mut Host, ip: &str) -> (u64, Outcome) {
    let (calls, _, outcome) = metered_request(host, ip);
    (calls, outcome)
}

/// [`one_request`], with the wasm instructions it ran.
fn metered_request(host: &mut Host, ip: &str) -> (u64, u64, Outcome) {
    let instructions = host.instructions().expect("a metered host");
    let before = host.host_calls();
    let (s, outcome) = request(host, ip, "/api", &[]);
    for call in host.pending_calls() {
        host.respond_call(call.token, answer(true, 10, 1000, 0))
            .expect("answered");
    }
    if !matches!(outcome, Outcome::LocalResponse(_)) {
        let _ = host.response_headers(s, &[(":status", "200")], false);
    }
    host.finish_stream(s).expect("ended");
    let ran = host.instructions().expect("a metered host") - instructions;
    (host.host_calls() - before, ran, outcome)
}

fn started(config: &Value, flavor: Flavor) -> Host {
    let mut host = host_of(metered_plugin(), config, flavor);
    one_request(&mut host, "192.0.2.1"); // warm: the first request's one-off allocations
    host
}

/// (path, share) → the host calls of one request.
fn count(flavor: Flavor, share: &str) -> [(&'static str, u64); 2] {
    let mut config = config_in(flavor);
    config["share"] = share.into();
    config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": 1});
    let mut host = started(&config, flavor);
    let (checked, outcome) = one_request(&mut host, "198.51.100.7");
    assert_eq!(outcome, Outcome::Pause, "checked");
    let (local, outcome) = one_request(&mut host, "198.51.100.7");
    assert!(
        matches!(outcome, Outcome::LocalResponse(_)),
        "refused by the local bucket"
    );
    [("check", checked), ("local deny", local)]
}

/// The host calls of a request decided by a lease (`share`), no local prefilter.
fn leased(flavor: Flavor, share: &str) -> u64 {
    const RULES: &str = r#"{"rule": [{"name": "per-ip", "by": "ip", "algorithm": "fixed_window",
                                      "limit": 1000, "window": "1m", "lease": true}]}"#;
    let mut config = config_in(flavor);
    config["share"] = share.into();
    config["local"] = json!(null);
    config["lease"] = json!({"tick_ms": 50, "poll_ms": 60_000});
    let mut host = host_of(metered_plugin(), &config, flavor);
    let tick_and_answer = |host: &mut Host, answer: &dyn Fn(&sluice_harness::PendingCall) -> CallResponse| {
        host.advance(Duration::from_millis(50)).expect("tick");
        for call in host.pending_calls() {
            host.respond_call(call.token, answer(&call)).expect("answered");
        }
    };
    tick_and_answer(&mut host, &|_| CallResponse::new(200, RULES));
    let ip = "198.51.100.9";
    assert_eq!(one_request(&mut host, ip).1, Outcome::Pause, "checked: no lease yet");
    tick_and_answer(&mut host, &|call| grant_each(call, 7, 100, 10_000));
    one_request(&mut host, ip); // warm
    let (calls, instructions, outcome) = metered_request(&mut host, ip);
    assert_eq!(outcome, Outcome::Continue, "decided by the lease");
    println!("{flavor:?}: leased, share {share}: {calls} host calls, {instructions} wasm instructions");
    // The module's own work costs in a real Envoy about as much as its host calls do
    // (BENCHMARKS-LOG.md, "Where a leased request's time goes"): 24,700 instructions before
    // they were cut, 18,900 after (rustc 1.95), 21,100 since a spend works out when its
    // quota next needs the timer (which then reads no other slot: tests/lease_timer.rs);
    // the bound leaves a newer compiler room.
    assert!(
        instructions <= 22_000,
        "leased, share {share}: {instructions} wasm instructions a request"
    );
    calls
}

fn host_calls_per_request(flavor: Flavor) {
    let (process, worker) = (leased(flavor, "process"), leased(flavor, "worker"));
    println!("{flavor:?}: leased, share process {process}, share worker {worker}");
    // The process's book costs the quota's slot read and written.
    assert_eq!(
        process,
        worker + 2,
        "leased: {process} calls with share: process, {worker} with worker"
    );
    // Its rule looks at no method, host or path: none of them is read. `Origin` is, once,
    // for the headers the response names to a page on another origin (`cors_expose`).
    assert!(worker <= 14, "share: worker: leased {worker}");

    let process = count(flavor, "process");
    let worker = count(flavor, "worker");
    println!("{flavor:?}: share process {process:?}, share worker {worker:?}");
    // The process's buckets cost their slots read and, admitting, written; its breaker a
    // read on the way out and, while it counts no failure, none on the answer: 5 more on
    // the check path (6 while the answer read the breaker too), 2 on a refusal.
    for ((path, p), (_, w)) in process.iter().zip(worker) {
        let more = if *path == "check" { 5 } else { 2 };
        assert_eq!(*p, w + more, "{path}: {p} calls with share: process, {w} with worker");
    }
    let [(_, check), (_, local)] = worker;
    // Each reads `origin` once (`cors_expose`): the 429 or the added headers name themselves
    // to a page on another origin. The check reads the method, path and host from one map
    // of the request's headers (a read each cost 24).
    assert!(
        check <= 21 && local <= 8,
        "share: worker: check {check}, local deny {local}"
    );
}

on_both_hosts!(host_calls_per_request);
