//! `POST /v1/check` wire types: request validation, response aggregation, round trips.

use proptest::prelude::*;
use sluice_core::wire::{CheckRequest, CheckResponse, RuleOutcome, RuleResult};
use sluice_core::{Decision, Micros};

fn req(json: &str) -> Result<CheckRequest, String> {
    CheckRequest::from_json(json.as_bytes()).map_err(|e| e.to_string())
}

fn body(identities: &str, method: &str, path: &str, cost: &str) -> String {
    format!(r#"{{"identities":{{{identities}}},"method":{method:?},"path":{path:?}{cost}}}"#)
}

#[test]
fn design_example_parses_and_round_trips() {
    let r = req(r#"{ "identities": {"ip": "203.0.113.9", "user": "42", "tier": "free"},
  "method": "GET", "path": "/api/search", "cost": 1 }"#)
    .unwrap();
    assert_eq!((r.method.as_str(), r.path.as_str(), r.cost), ("GET", "/api/search", 1));
    assert_eq!(r.identities.len(), 3);
    let again = CheckRequest::from_json(r.to_json().as_bytes()).unwrap();
    assert_eq!(again, r);
    let no_cost = req(r#"{"identities":{},"method":"GET","path":"/"}"#).unwrap();
    assert_eq!(no_cost.cost, 1, "cost defaults to 1");
}

#[test]
fn every_limit_accepts_its_edge_and_rejects_one_past_it() {
    let k256 = "k".repeat(256);
    let k257 = "k".repeat(257);
    let sixteen: Vec<String> = (0..16).map(|i| format!("\"k{i}\":\"v\"")).collect();
    let seventeen: Vec<String> = (0..17).map(|i| format!("\"k{i}\":\"v\"")).collect();
    let p4096 = format!("/{}", "p".repeat(4095));
    let p4097 = format!("/{}", "p".repeat(4096));
    let ok = [
        body(&sixteen.join(","), "GET", "/", ""),
        body(&format!("\"{k256}\":\"v\""), "GET", "/", ""),
        body(&format!("\"ip\":\"{k256}\""), "GET", "/", ""),
        body("\"ip\":\"\"", "GET", "/", ""),
        body("", "GET", &p4096, ""),
        body("", "ABCDEFGHIJKLMNOP", "/", ""),
        body("", "M-SEARCH", "/", ""),
        body("", "get", "/", ""),
        body("", "GET", "/", ",\"cost\":1"),
        body("", "GET", "/", ",\"cost\":1000000"),
    ];
    for b in ok {
        assert!(req(&b).is_ok(), "{b}: {:?}", req(&b));
    }
    let bad = [
        (
            body(&seventeen.join(","), "GET", "/", ""),
            "identities: 17 given; at most 16".to_owned(),
        ),
        (
            body(&format!("\"{k257}\":\"v\""), "GET", "/", ""),
            format!("identity key `{}…` is 257 bytes; at most 256", "k".repeat(40)),
        ),
        (body("\"\":\"v\"", "GET", "/", ""), "identity key is empty".into()),
        (
            body(&format!("\"ip\":\"{k257}\""), "GET", "/", ""),
            "identity `ip` value is 257 bytes; at most 256".into(),
        ),
        (
            body("", "GET", &p4097, ""),
            "path is 4097 bytes; must be 1 to 4096".into(),
        ),
        (body("", "GET", "", ""), "path is 0 bytes; must be 1 to 4096".into()),
        (
            body("", "ABCDEFGHIJKLMNOPQ", "/", ""),
            "method `ABCDEFGHIJKLMNOPQ` is not an HTTP method".into(),
        ),
        (body("", "", "/", ""), "method `` is not an HTTP method".into()),
        (body("", "G T", "/", ""), "method `G T` is not an HTTP method".into()),
        (body("", "GET\n", "/", ""), "is not an HTTP method".into()),
        (body("", "GÉT", "/", ""), "is not an HTTP method".into()),
        (
            body("", "GET", "/", ",\"cost\":1000001"),
            "cost 1000001 out of range 0..=1000000".into(),
        ),
        (
            body("", "GET", "/", ",\"cost\":-1"),
            "cost: expected an unsigned integer, found -1".into(),
        ),
        (
            body("", "GET", "/", ",\"cost\":1.5"),
            "cost: expected an unsigned integer, found 1.5".into(),
        ),
        (body("", "GET", "/", ",\"cost\":99999999999999999999999"), "cost".into()),
        (
            body("", "GET", "/", ",\"cost\":\"1\""),
            "cost: expected an unsigned integer, found a string".into(),
        ),
    ];
    for (b, want) in bad {
        let got = req(&b).unwrap_err();
        assert!(got.contains(&want), "got:    {got}\nwanted: {want}");
    }
}

#[test]
fn malformed_and_unknown_input_is_named() {
    let cases = [
        (
            r#"{"identities":{},"method":"GET","path":"/","foo":1}"#,
            "unknown field `foo`, expected one of identities, method, path, cost, host",
        ),
        (r#"{"identities":{},"method":"GET"}"#, "path: required but missing"),
        (r#"{"method":"GET","path":"/"}"#, "identities: required but missing"),
        (
            r#"{"identities":{"ip":1},"method":"GET","path":"/"}"#,
            "identities.ip: expected a string, found a number",
        ),
        (
            r#"{"identities":[],"method":"GET","path":"/"}"#,
            "identities: expected an object, found an array",
        ),
        (
            r#"{"identities":{},"method":"GET","path":"/","path":"/"}"#,
            "member \"path\" repeated",
        ),
        (
            r#"{"identities":{},"method":"GET","path":"/"} x"#,
            "trailing characters",
        ),
        ("{not json", "expected a member name at byte 1"),
        ("", "expected a value, found the end"),
        ("null", "expected a JSON object"),
        (" [{}, \"GET\", \"/\", 1]", "expected a JSON object"),
    ];
    for (b, want) in cases {
        let got = req(b).unwrap_err();
        assert!(
            got.starts_with("invalid check request: ") && got.contains(want),
            "{b}: {got}"
        );
    }
    assert!(CheckRequest::from_json(&[0xff, 0xfe]).is_err());
}

fn decision(allowed: bool, remaining: u64, reset_us: u64, retry_us: u64, delay_us: u64) -> Decision {
    Decision {
        allowed,
        limit: 100,
        remaining,
        reset_after: Micros::new(reset_us),
        retry_after: Micros::new(retry_us),
        delay: Micros::new(delay_us),
    }
}

fn outcome(rule: &str, shadow: bool, decision: Decision) -> RuleOutcome<'_> {
    RuleOutcome {
        rule,
        window_ms: 60_000,
        shadow,
        decision,
        degraded: false,
    }
}

#[test]
fn no_outcomes_allow_without_policy() {
    let r = CheckResponse::from_outcomes(&[], 1_774_312_813_000);
    assert!(r.allowed && r.policy.is_none() && r.rules.is_empty());
    assert_eq!(
        (r.limit, r.remaining, r.retry_after_ms, r.delay_ms, r.reset_at),
        (0, 0, 0, 0, 0)
    );
    let json = r.to_json();
    assert!(!json.contains("policy"), "{json}");
}

#[test]
fn microseconds_become_milliseconds_rounded_up() {
    let r = CheckResponse::from_outcomes(
        &[outcome("a", false, decision(false, 0, 46_999_001, 1, 0))],
        1_774_312_813_000,
    );
    assert_eq!((r.reset_after_ms, r.retry_after_ms), (47_000, 1));
    assert_eq!(r.reset_at, 1_774_312_860, "unix seconds, rounded up");
    assert_eq!(r.rules[0].reset_after_ms, 47_000);
    let r = CheckResponse::from_outcomes(&[outcome("a", false, decision(true, 5, 0, 0, 1_500))], 0);
    assert_eq!((r.reset_after_ms, r.delay_ms), (0, 2));
}

#[test]
fn most_restrictive_rule_heads_the_response() {
    // Least remaining, then longest reset.
    let r = CheckResponse::from_outcomes(
        &[
            outcome("a", false, decision(true, 10, 5_000_000, 0, 0)),
            outcome("b", false, decision(true, 3, 1_000_000, 0, 0)),
            outcome("c", false, decision(true, 3, 9_000_000, 0, 0)),
        ],
        1_774_312_800_000,
    );
    assert!(r.allowed);
    assert_eq!(r.policy.as_deref(), Some("c"));
    assert_eq!(
        (r.limit, r.remaining, r.reset_after_ms, r.reset_at, r.window_ms),
        (100, 3, 9_000, 1_774_312_809, 60_000)
    );
    assert_eq!(r.retry_after_ms, 0);
}

#[test]
fn every_enforced_rule_must_allow_and_retry_is_the_longest_denial() {
    let r = CheckResponse::from_outcomes(
        &[
            outcome("a", false, decision(true, 0, 50_000_000, 0, 0)),
            outcome("b", false, decision(false, 0, 7_000_000, 7_000_000, 0)),
            outcome("c", false, decision(false, 2, 3_000_000, 20_000_000, 0)),
        ],
        0,
    );
    assert!(!r.allowed);
    assert_eq!(r.retry_after_ms, 20_000, "the longest wait among the denying rules");
    // A denying rule heads the response, so its policy explains the 429.
    assert_eq!(r.policy.as_deref(), Some("b"));
    assert_eq!(
        r.rules.iter().map(|x| x.allowed).collect::<Vec<_>>(),
        [true, false, false]
    );
    assert_eq!(r.delay_ms, 0);
}

#[test]
fn shadow_rules_are_reported_but_never_deny_nor_delay() {
    let r = CheckResponse::from_outcomes(
        &[
            outcome("a", false, decision(true, 10, 5_000_000, 0, 0)),
            outcome("s", true, decision(false, 0, 30_000_000, 30_000_000, 0)),
            outcome("t", true, decision(true, 0, 1_000, 0, 9_000_000)),
        ],
        0,
    );
    assert!(r.allowed);
    assert_eq!((r.policy.as_deref(), r.retry_after_ms, r.delay_ms), (Some("a"), 0, 0));
    assert_eq!(r.rules.len(), 3);
    assert!(!r.rules[1].allowed);
    // Only shadow rules matched: allowed, nothing to advertise.
    let only = CheckResponse::from_outcomes(&[outcome("s", true, decision(false, 0, 1_000, 1_000, 0))], 0);
    assert!(only.allowed && only.policy.is_none());
    assert_eq!(only.rules.len(), 1);
}

#[test]
fn delay_is_the_longest_and_only_when_allowed() {
    let r = CheckResponse::from_outcomes(
        &[
            outcome("a", false, decision(true, 1, 1_000, 0, 250_000)),
            outcome("b", false, decision(true, 1, 1_000, 0, 900_000)),
        ],
        0,
    );
    assert!(r.allowed);
    assert_eq!(r.delay_ms, 900);
    let denied = CheckResponse::from_outcomes(
        &[
            outcome("a", false, decision(true, 1, 1_000, 0, 250_000)),
            outcome("b", false, decision(false, 0, 1_000, 1_000, 0)),
        ],
        0,
    );
    assert_eq!(denied.delay_ms, 0);
}

#[test]
fn degraded_when_any_outcome_was() {
    let mut o = outcome("a", false, decision(true, 1, 0, 0, 0));
    assert!(!CheckResponse::from_outcomes(&[o], 0).degraded);
    o.degraded = true;
    assert!(CheckResponse::from_outcomes(&[outcome("b", false, decision(true, 1, 0, 0, 0)), o], 0).degraded);
}

#[test]
fn huge_numbers_do_not_overflow() {
    let r = CheckResponse::from_outcomes(
        &[outcome("a", false, decision(false, 0, u64::MAX, u64::MAX, u64::MAX))],
        u64::MAX,
    );
    assert!(!r.allowed);
    assert_eq!(r.reset_after_ms, u64::MAX.div_ceil(1000));
}

#[test]
fn responses_round_trip_and_parse_leniently() {
    let design = r#"{ "allowed": false, "limit": 100, "remaining": 0,
  "reset_after_ms": 47000, "retry_after_ms": 47000, "reset_at": 1774312860,
  "policy": "search-per-user", "window_ms": 60000,
  "rules": [{"name": "search-per-user", "allowed": false, "limit": 100, "remaining": 0, "reset_after_ms": 47000}],
  "delay_ms": 0, "degraded": false }"#;
    let r = CheckResponse::from_json(design.as_bytes()).unwrap();
    assert_eq!(
        r,
        CheckResponse {
            allowed: false,
            limit: 100,
            remaining: 0,
            reset_after_ms: 47_000,
            retry_after_ms: 47_000,
            reset_at: 1_774_312_860,
            policy: Some("search-per-user".into()),
            window_ms: 60_000,
            rules: vec![RuleResult {
                name: "search-per-user".into(),
                allowed: false,
                limit: 100,
                remaining: 0,
                reset_after_ms: 47_000,
            }],
            delay_ms: 0,
            degraded: false,
            slots: Vec::new(),
        }
    );
    let json = r.to_json().into_bytes();
    assert_eq!(CheckResponse::from_json(&json).unwrap(), r);
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    for k in [
        "allowed",
        "limit",
        "remaining",
        "reset_after_ms",
        "retry_after_ms",
        "reset_at",
        "policy",
        "window_ms",
        "rules",
        "delay_ms",
        "degraded",
    ] {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
    let lenient =
        CheckResponse::from_json(br#"{"allowed":false,"future":{"x":1},"rules":[{"name":"a","extra":true}]}"#).unwrap();
    assert!(!lenient.allowed);
    assert_eq!(lenient.rules[0].name, "a");
    let empty = CheckResponse::from_json(b"{}").unwrap_err().to_string();
    assert_eq!(empty, "invalid check response: allowed: required but missing");
    assert!(CheckResponse::from_json(b"[1]")
        .unwrap_err()
        .to_string()
        .contains("invalid check response"));
    assert!(CheckResponse::from_json(br#"{"allowed":"yes"}"#).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn check_request_parsing_never_panics(
        bytes in any::<Vec<u8>>(),
        text in "\\{\"identities\":\\{[^}]{0,40}\\},\"method\":\"[A-Z]{0,5}\",\"path\":\"[^\"]{0,10}\",\"cost\":-?[0-9]{0,22}\\}",
        s in any::<String>(),
    ) {
        let _ = CheckRequest::from_json(&bytes);
        let _ = CheckRequest::from_json(text.as_bytes());
        let _ = CheckRequest::from_json(s.as_bytes());
        let _ = CheckResponse::from_json(&bytes);
        let _ = CheckResponse::from_json(s.as_bytes());
    }

    #[test]
    fn valid_requests_round_trip(
        identities in prop::collection::btree_map("(?s).{1,12}", "(?s).{0,20}", 0..16),
        method in "[A-Z]{1,16}",
        path in "/(?s).{0,60}",
        cost in 1u64..=1_000_000,
    ) {
        // Written by the filter's encoder, read by the service's decoder, and by serde_json
        // as an independent reader: any text, quotes, backslashes and control characters
        // included.
        let r = CheckRequest { identities, method, path, cost, host: None };
        let json = r.to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(v["path"].as_str(), Some(r.path.as_str()));
        prop_assert_eq!(v["identities"].as_object().map(|o| o.len()), Some(r.identities.len()));
        for (k, value) in &r.identities {
            prop_assert_eq!(v["identities"][k].as_str(), Some(value.as_str()));
        }
        let parsed = CheckRequest::from_json(json.as_bytes());
        prop_assert_eq!(parsed, Ok(r));
    }

    #[test]
    fn answers_round_trip_and_are_json(
        policy in proptest::option::of("(?s).{0,30}"),
        names in prop::collection::vec("(?s).{0,20}", 0..4),
        numbers in any::<[u64; 6]>(),
        allowed: bool,
        degraded: bool,
    ) {
        // Written by the service, read by the filter and the SDKs; serde_json checks it is JSON.
        let r = CheckResponse {
            allowed,
            limit: numbers[0],
            remaining: numbers[1],
            reset_after_ms: numbers[2],
            retry_after_ms: numbers[3],
            reset_at: numbers[4],
            policy,
            window_ms: numbers[5],
            rules: names
                .into_iter()
                .map(|name| RuleResult { name, allowed, limit: numbers[0], remaining: numbers[1], reset_after_ms: numbers[2] })
                .collect(),
            delay_ms: numbers[3],
            degraded,
            slots: (allowed && !degraded)
                .then(|| sluice_core::wire::Slot { rule: "in-flight".into(), at: numbers[4], window_ms: numbers[5] })
                .into_iter()
                .collect(),
        };
        let json = r.to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(v["policy"].as_str(), r.policy.as_deref());
        prop_assert_eq!(v["reset_at"].as_u64(), Some(r.reset_at));
        prop_assert_eq!(v["rules"].as_array().map(Vec::len), Some(r.rules.len()));
        prop_assert_eq!(CheckResponse::from_json(json.as_bytes()), Ok(r));
    }

    #[test]
    fn aggregation_never_panics_and_shadow_never_denies(
        raw in prop::collection::vec((any::<bool>(), any::<bool>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()), 0..6),
        now in any::<u64>(),
    ) {
        let names: Vec<String> = (0..raw.len()).map(|i| format!("r{i}")).collect();
        let outcomes: Vec<RuleOutcome<'_>> = raw
            .iter()
            .zip(&names)
            .map(|(&(allowed, shadow, remaining, reset, retry, delay), name)| outcome(name, shadow, decision(allowed, remaining, reset, retry, delay)))
            .collect();
        let r = CheckResponse::from_outcomes(&outcomes, now);
        prop_assert_eq!(r.allowed, outcomes.iter().all(|o| o.shadow || o.decision.allowed));
        prop_assert_eq!(r.rules.len(), outcomes.len());
        prop_assert_eq!(r.policy.is_some(), outcomes.iter().any(|o| !o.shadow));
        if r.allowed { prop_assert_eq!(r.retry_after_ms, 0); } else { prop_assert_eq!(r.delay_ms, 0); }
    }
}

#[test]
fn a_method_the_service_would_refuse_is_sent_as_other() {
    use sluice_core::wire::check_method;
    assert_eq!(check_method("PATCH"), "PATCH");
    assert_eq!(check_method("M-SEARCH"), "M-SEARCH");
    for bad in ["", "GET /", "G\u{e9}T", &"A".repeat(40)] {
        assert_eq!(check_method(bad), "OTHER", "{bad:?}");
        let r = CheckRequest {
            identities: Default::default(),
            method: check_method(bad).to_owned(),
            path: "/".into(),
            cost: 1,
            host: None,
        };
        assert_eq!(r.validate(), Ok(()), "{bad:?} forwarded as is would be refused");
    }
}

/// Issue 40: `host` is optional (old clients send none), round-trips, and a bad one is
/// named.
#[test]
fn a_host_is_optional_and_a_bad_one_is_named() {
    let without = req(r#"{"identities":{},"method":"GET","path":"/"}"#).unwrap();
    assert_eq!(without.host, None);
    let with = req(r#"{"identities":{},"method":"GET","path":"/","host":"api.example.com:8080"}"#).unwrap();
    assert_eq!(with.host.as_deref(), Some("api.example.com:8080"));
    assert_eq!(req(&with.to_json()).unwrap(), with);
    assert!(!without.to_json().contains("host"), "{}", without.to_json());
    for bad in ["", "a b", "a/b", &"h".repeat(256)] {
        let body = format!(r#"{{"identities":{{}},"method":"GET","path":"/","host":"{bad}"}}"#);
        let e = req(&body).unwrap_err();
        assert!(e.starts_with("host `"), "{bad:?}: {e}");
    }
}
