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
    assert_eq!(host.metric("sluice_filter_leases_granted"), Some(1));
    assert_eq!(host.metric("sluice_filter_lease_units_granted"), Some(3));
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

on_both_hosts!(
    a_held_lease_decides_requests_here_and_the_rest_are_checked,
    unspent_units_go_back_before_the_lease_ends,
    malformed_rules_and_lease_answers_leave_exact_checks,
);
