//! Leased quotas in the filter, on both host flavors, under the harness's virtual clock: the
//! root's timer fetches the rules and asks for leases; requests whose rules are all leased
//! and held go on without a call, with headers; the rest are checked exactly; what a lease
//! does not spend goes back before it ends.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sluice_harness::{CallResponse, Flavor, Host, Outcome, PendingCall};

const RULES: &str = r#"{"rule": [
  {"name": "per-ip", "by": "ip", "algorithm": "fixed_window", "limit": 100, "window": "1m", "lease": true},
  {"name": "search", "by": "user", "path": "/api/search*", "algorithm": "gcra", "limit": 10, "window": "1s"}
]}"#;

fn leasing_host(flavor: Flavor) -> Host {
    let mut config = config_in(flavor);
    config["lease"] = json!({"tick_ms": 50, "poll_ms": 1000});
    host_with(&config, flavor)
}

/// The one pending call to `path`.
fn call_to(host: &Host, path: &str) -> PendingCall {
    let calls: Vec<PendingCall> = host
        .pending_calls()
        .into_iter()
        .filter(|c| c.header(":path") == Some(path))
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "expected one call to {path}: {:?}",
        host.pending_calls()
    );
    calls[0].clone()
}

fn header<'a>(pairs: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// Ticks until the rules are asked for, and answers them.
fn give_rules(host: &mut Host) {
    host.advance(Duration::from_millis(50)).expect("tick");
    let rules = call_to(host, "/v1/rules");
    let mut answer = CallResponse::new(200, RULES);
    answer.headers.push(("etag".into(), "\"1\"".into()));
    host.respond_call(rules.token, answer).expect("no trap");
}

fn a_held_lease_decides_requests_here_and_the_rest_are_checked(flavor: Flavor) {
    let mut host = leasing_host(flavor);
    give_rules(&mut host);
    let ip = "9.9.9.9, 203.0.113.9";
    // No lease yet: checked exactly; the demand is noted.
    let (_, outcome) = request(&mut host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Pause);
    let check = call_to(&host, "/v1/check");
    host.respond_call(check.token, answer(true, 99, 60_000, 0))
        .expect("no trap");
    // The timer asks for a lease of the quota.
    host.advance(Duration::from_millis(50)).expect("tick");
    let lease = call_to(&host, "/v1/lease");
    let body: Value = serde_json::from_slice(&lease.body).expect("JSON");
    assert_eq!(body["grants"][0]["rule"], "per-ip");
    assert_eq!(body["grants"][0]["identity"], "203.0.113.9");
    assert!(body["grants"][0]["want"].as_u64().is_some_and(|w| w >= 1), "{body}");
    let granted = json!({"rules_version": 1, "returned": [], "grants": [
        {"lease": 7, "units": 3, "expires_in_ms": 10_000, "limit": 100, "remaining": 90,
         "reset_after_ms": 50_000, "window_ms": 60_000}]});
    host.respond_call(lease.token, CallResponse::new(200, granted.to_string()))
        .expect("no trap");
    // Three requests go on at once, no call, with the quota's headers.
    for left in [92, 91, 90] {
        let (s, outcome) = request(&mut host, ip, "/", &[]);
        assert_eq!(outcome, Outcome::Continue, "decided by the lease");
        assert!(host.pending_calls().is_empty(), "no call");
        host.response_headers(s, &[(":status", "200")], false).expect("no trap");
        let headers = &host.stream(s).expect("stream").response_headers;
        assert_eq!(
            header(headers, "x-ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
        assert_eq!(header(headers, "ratelimit-policy"), Some("\"per-ip\";q=100;w=60"));
    }
    assert_eq!(host.metric("sluice_filter_requests_leased"), Some(3));
    assert_eq!(host.metric("sluice_filter_lease_units_spent"), Some(3));
    assert_eq!(host.metric("sluice_filter_requests_checked"), Some(1), "the first one");
    assert_eq!(host.metric("sluice_filter_leases_granted"), Some(1));
    assert_eq!(host.metric("sluice_filter_lease_units_granted"), Some(3));
    assert_eq!(host.metric("sluice_filter_leases_renewed"), Some(0), "a first lease");
    // The lease is spent: checked exactly again.
    let (_, outcome) = request(&mut host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Pause);
    let check = call_to(&host, "/v1/check");
    host.respond_call(check.token, answer(true, 89, 50_000, 0))
        .expect("no trap");
    // A request that also matches a rule that is not leased is checked exactly.
    let (_, outcome) = request(&mut host, ip, "/api/search", &[("x-user-id", "42")]);
    assert_eq!(outcome, Outcome::Pause);
    assert_eq!(call_to(&host, "/v1/check").header(":method"), Some("POST"));
    assert_eq!(host.metric("sluice_filter_requests_checked"), Some(3));
    assert_eq!(host.metric("sluice_filter_lease_units_spent"), Some(3));
}

fn unspent_units_go_back_before_the_lease_ends(flavor: Flavor) {
    let mut host = leasing_host(flavor);
    give_rules(&mut host);
    let ip = "9.9.9.9, 198.51.100.1";
    let (_, _) = request(&mut host, ip, "/", &[]);
    let check = call_to(&host, "/v1/check");
    host.respond_call(check.token, answer(true, 99, 60_000, 0))
        .expect("no trap");
    host.advance(Duration::from_millis(50)).expect("tick");
    let lease = call_to(&host, "/v1/lease");
    let granted = json!({"rules_version": 1, "returned": [], "grants": [
        {"lease": 11, "units": 10, "expires_in_ms": 1_000, "limit": 100, "remaining": 90,
         "reset_after_ms": 50_000, "window_ms": 60_000}]});
    let sent_ms = lease.dispatched_at_ns / 1_000_000;
    host.respond_call(lease.token, CallResponse::new(200, granted.to_string()))
        .expect("no trap");
    let (_, outcome) = request(&mut host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Continue);
    // Near its end the lease's 9 unspent units go back, once.
    let mut returned = None;
    for _ in 0..20 {
        host.advance(Duration::from_millis(50)).expect("tick");
        for call in host.pending_calls() {
            if call.header(":path") == Some("/v1/lease") {
                let body: Value = serde_json::from_slice(&call.body).expect("JSON");
                if let Some(r) = body["returns"].as_array().and_then(|r| r.first()) {
                    returned = Some(r.clone());
                }
                let none = json!({"rules_version": 1, "grants": [], "returned": [9]});
                let grants = body["grants"].as_array().map_or(0, Vec::len);
                let answer = if grants == 0 {
                    none
                } else {
                    json!({"rules_version": 1, "returned": [9], "grants": vec![json!(
                        {"lease": 12, "units": 0, "expires_in_ms": 1_000, "limit": 100, "remaining": 0,
                         "reset_after_ms": 50_000, "window_ms": 60_000}); grants]})
                };
                host.respond_call(call.token, CallResponse::new(200, answer.to_string()))
                    .expect("no trap");
            }
        }
        if returned.is_some() {
            break;
        }
    }
    let r = returned.expect("the unspent units went back");
    assert_eq!(host.metric("sluice_filter_lease_units_returned"), Some(9));
    assert_eq!(host.metric("sluice_filter_leases_returned"), Some(1));
    assert_eq!(host.metric("sluice_filter_leases_expired"), Some(0));
    assert_eq!((r["lease"].as_u64(), r["unspent"].as_u64()), (Some(11), Some(9)));
    let at_ms = host.now_ns() / 1_000_000;
    assert!(
        at_ms < sent_ms + 1_000,
        "given back at {at_ms}, the lease ends at {}",
        sent_ms + 1_000
    );
}

/// Bad answers from the service (malformed rules, lease answers of the wrong shape or
/// status) are ignored: the filter keeps checking exactly, never traps.
fn malformed_rules_and_lease_answers_leave_exact_checks(flavor: Flavor) {
    let mut host = leasing_host(flavor);
    host.advance(Duration::from_millis(50)).expect("tick");
    let rules = call_to(&host, "/v1/rules");
    host.respond_call(rules.token, CallResponse::new(200, "{\"rule\": [{\"name\": 5}]}"))
        .expect("no trap");
    let ip = "9.9.9.9, 203.0.113.9";
    let (_, outcome) = request(&mut host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Pause, "no rules known: checked");
    let check = call_to(&host, "/v1/check");
    host.respond_call(check.token, answer(true, 99, 60_000, 0))
        .expect("no trap");
    // Good rules at the next poll; then every lease answer is bad.
    host.advance(Duration::from_millis(1_000)).expect("ticks");
    let rules = call_to(&host, "/v1/rules");
    host.respond_call(rules.token, CallResponse::new(200, RULES))
        .expect("no trap");
    let one_grant = json!({"rules_version": 1, "returned": [], "grants": [
        {"lease": 7, "units": 3, "expires_in_ms": 10_000, "limit": 100, "remaining": 90,
         "reset_after_ms": 50_000, "window_ms": 60_000}]});
    let two_grants = json!({"rules_version": 1, "returned": [],
        "grants": [one_grant["grants"][0].clone(), one_grant["grants"][0].clone()]});
    let bad = [
        CallResponse::new(200, "{}"),
        CallResponse::new(200, "{\"rules_version\": 1, \"grants\": [{\"lease\": 7"),
        CallResponse::new(200, two_grants.to_string()),
        CallResponse::new(500, one_grant.to_string()),
        CallResponse::new(200, ""),
    ];
    let mut leases = 0;
    for reply in bad.into_iter().cycle().take(10) {
        let (_, outcome) = request(&mut host, ip, "/", &[]);
        assert_eq!(outcome, Outcome::Pause, "no lease held: checked");
        let check = call_to(&host, "/v1/check");
        host.respond_call(check.token, answer(true, 99, 60_000, 0))
            .expect("no trap");
        host.advance(Duration::from_millis(50)).expect("tick");
        for call in host.pending_calls() {
            if call.header(":path") == Some("/v1/lease") {
                leases += 1;
                host.respond_call(call.token, reply.clone()).expect("no trap");
            }
        }
    }
    assert!(leases >= 5, "the filter kept asking for leases: {leases} calls");
    assert_eq!(host.metric("sluice_filter_requests_leased"), Some(0));
    assert_eq!(host.metric("sluice_filter_leases_granted"), Some(0));
}

/// A lease answer granting `units` to each ask of the lease call `call` (`lease` the first
/// id), lasting `expires_in_ms`.
/// Ticks until a lease call goes out; it and its body.
fn next_lease_call(host: &mut Host) -> (PendingCall, Value) {
    for _ in 0..100 {
        host.advance(Duration::from_millis(50)).expect("tick");
        if let Some(call) = host
            .pending_calls()
            .into_iter()
            .find(|c| c.header(":path") == Some("/v1/lease"))
        {
            let body = serde_json::from_slice(&call.body).expect("JSON");
            return (call, body);
        }
    }
    panic!("no lease call in 5 s");
}

/// Gets a first lease of 10 units for client `ip`, lasting `expires_in_ms`, and spends one.
fn first_lease(host: &mut Host, ip: &str, expires_in_ms: u64) {
    give_rules(host);
    request(host, ip, "/", &[]);
    let check = call_to(host, "/v1/check");
    host.respond_call(check.token, answer(true, 99, 60_000, 0))
        .expect("no trap");
    let (lease, _) = next_lease_call(host);
    host.respond_call(lease.token, grant_each(&lease, 1, 10, expires_in_ms))
        .expect("no trap");
    let (_, outcome) = request(host, ip, "/", &[]);
    assert_eq!(outcome, Outcome::Continue, "decided by the lease");
}

/// A lease granted before the last one ended is a renewal, and the last one's unspent
/// units go back; units that go back in a call that fails are counted as expired, not as
/// returned (the service never took them back).
fn renewals_and_returns_are_counted_and_a_failed_return_expires(flavor: Flavor) {
    let mut host = leasing_host(flavor);
    first_lease(&mut host, "9.9.9.9, 203.0.113.20", 1_000);
    // Asked ahead of the end while the lease runs: renewed with 10 more.
    let (renewal, body) = next_lease_call(&mut host);
    assert_eq!(body["grants"].as_array().map(Vec::len), Some(1), "{body}");
    host.respond_call(renewal.token, grant_each(&renewal, 2, 10, 1_000))
        .expect("no trap");
    assert_eq!(host.metric("sluice_filter_leases_renewed"), Some(1));
    assert_eq!(host.metric("sluice_filter_leases_granted"), Some(2));
    // The replaced lease's 9 go back with the next call, answered.
    let (back, body) = next_lease_call(&mut host);
    assert_eq!(body["returns"][0]["unspent"], 9, "{body}");
    host.respond_call(back.token, grant_each(&back, 3, 0, 1_000))
        .expect("no trap");
    assert_eq!(host.metric("sluice_filter_leases_returned"), Some(1));
    assert_eq!(host.metric("sluice_filter_lease_units_returned"), Some(9));
    // Lease 2's 10 go back near its end, in a call that fails.
    let mut failed = false;
    for _ in 0..10 {
        let (call, body) = next_lease_call(&mut host);
        if body["returns"].as_array().is_some_and(|r| !r.is_empty()) {
            assert_eq!(body["returns"][0]["unspent"], 10, "{body}");
            host.fail_call(call.token).expect("no trap");
            failed = true;
            break;
        }
        host.respond_call(call.token, grant_each(&call, 9, 0, 1_000))
            .expect("no trap");
    }
    assert!(failed, "lease 2's units never went back");
    assert_eq!(host.metric("sluice_filter_leases_returned"), Some(1), "not taken back");
    assert_eq!(host.metric("sluice_filter_leases_expired"), Some(1));
    assert_eq!(host.metric("sluice_filter_lease_units_expired"), Some(10));
    assert_eq!(
        host.metric("sluice_filter_leases_renewed"),
        Some(1),
        "0-unit grants renew nothing"
    );
    assert_eq!(host.metric("sluice_filter_lease_units_spent"), Some(1));
}

/// With a timer slower than the margin the book gives units back by, a lease's end can come
/// between two ticks: its unspent units are counted as expired, once, and not given back.
fn a_lease_ending_between_ticks_expires(flavor: Flavor) {
    let mut config = config_in(flavor);
    config["lease"] = json!({"tick_ms": 500, "poll_ms": 1000});
    let mut host = host_with(&config, flavor);
    host.advance(Duration::from_millis(450)).expect("ticks"); // the first tick at 500
    first_lease(&mut host, "9.9.9.9, 203.0.113.21", 900);
    let mut returns = 0;
    for _ in 0..40 {
        host.advance(Duration::from_millis(50)).expect("ticks");
        for call in host.pending_calls() {
            if call.header(":path") == Some("/v1/lease") {
                let body: Value = serde_json::from_slice(&call.body).expect("JSON");
                returns += body["returns"].as_array().map_or(0, Vec::len);
                host.respond_call(call.token, grant_each(&call, 5, 0, 900))
                    .expect("no trap");
            } else if call.header(":path") == Some("/v1/rules") {
                host.respond_call(call.token, CallResponse::new(304, ""))
                    .expect("no trap");
            }
        }
    }
    assert_eq!(returns, 0, "nothing goes back after the end");
    assert_eq!(host.metric("sluice_filter_leases_expired"), Some(1));
    assert_eq!(host.metric("sluice_filter_lease_units_expired"), Some(9));
    assert_eq!(host.metric("sluice_filter_leases_returned"), Some(0));
    assert_eq!(host.metric("sluice_filter_lease_units_spent"), Some(1));
}

/// With the defaults (`"lease": {}`), the rules are asked for again every 500 ms: a rule
/// changed at the service reaches the filter within a second, call included.
fn by_default_the_rules_are_polled_twice_a_second(flavor: Flavor) {
    let mut config = config_in(flavor);
    config["lease"] = json!({});
    let mut host = host_with(&config, flavor);
    give_rules(&mut host);
    let mut polls = Vec::new();
    for tick in 1..=40u64 {
        host.advance(Duration::from_millis(50)).expect("tick");
        for call in host.pending_calls() {
            if call.header(":path") == Some("/v1/rules") {
                polls.push(tick * 50);
                host.respond_call(call.token, CallResponse::new(304, ""))
                    .expect("no trap");
            }
        }
    }
    assert_eq!(polls, [500, 1_000, 1_500, 2_000], "polled every 500 ms");
}

/// Rules that look at no method, host or path let a leased request be matched without
/// reading them (docs/filter.md, "Host calls a request costs"); a request that goes on to
/// the check still carries them as the client sent them.
fn rules_that_ignore_the_target_still_check_it_as_sent(flavor: Flavor) {
    const IP_ONLY: &str = r#"{"rule": [
      {"name": "per-ip", "by": "ip", "algorithm": "fixed_window", "limit": 100, "window": "1m", "lease": true}
    ]}"#;
    let mut host = leasing_host(flavor);
    host.advance(Duration::from_millis(50)).expect("tick");
    let rules = call_to(&host, "/v1/rules");
    host.respond_call(rules.token, CallResponse::new(200, IP_ONLY))
        .expect("no trap");
    let (_, outcome) = request(&mut host, "9.9.9.9, 203.0.113.5", "/api/a%2Fb/../items?q=1", &[]);
    assert_eq!(outcome, Outcome::Pause, "no lease yet: checked");
    let check = call_to(&host, "/v1/check");
    let body: Value = serde_json::from_slice(&check.body).expect("JSON");
    assert_eq!(body["method"], "GET", "{body}");
    assert_eq!(body["path"], "/api/items", "the canonical path: {body}");
    assert_eq!(body["host"], "example.com", "{body}");
    assert_eq!(body["identities"]["ip"], "203.0.113.5", "{body}");
}

on_both_hosts!(
    by_default_the_rules_are_polled_twice_a_second,
    rules_that_ignore_the_target_still_check_it_as_sent,
    a_held_lease_decides_requests_here_and_the_rest_are_checked,
    unspent_units_go_back_before_the_lease_ends,
    malformed_rules_and_lease_answers_leave_exact_checks,
    renewals_and_returns_are_counted_and_a_failed_return_expires,
    a_lease_ending_between_ticks_expires,
);
