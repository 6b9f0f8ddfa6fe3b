//! Every case of the header vectors (`vectors/headers.json`, shared with the JS SDK), the parser's
//! robustness on arbitrary input, and formatting round trips.

use proptest::prelude::*;
use serde_json::Value;
use sluice_core::headers::{format_headers, HeaderMode, Quota};
use sluice_pace::headers::{parse_headers, RateLimitInfo, UnitQuota};

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/headers.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

fn close(got: Option<u64>, want: &Value) -> bool {
    match (got, want.as_u64()) {
        (None, None) => want.is_null(),
        (Some(g), Some(w)) => g.abs_diff(w) <= 1,
        _ => false,
    }
}

/// The quotas in other units, compared by unit in any order; none expected when absent.
fn quotas_match(got: &[UnitQuota], want: &Value) -> bool {
    let want = want.as_array().map_or(&[][..], Vec::as_slice);
    got.len() == want.len()
        && want.iter().all(|w| {
            got.iter().any(|g| {
                let field = |k: &str| w.get(k).unwrap_or(&Value::Null);
                Some(g.unit.as_str()) == field("unit").as_str()
                    && close(g.limit, field("limit"))
                    && close(g.remaining, field("remaining"))
                    && close(g.reset_after_ms, field("reset_after_ms"))
                    && close(g.window_ms, field("window_ms"))
                    && g.policy.as_deref() == field("policy").as_str()
            })
        })
}

#[test]
fn shared_vectors_all_pass() {
    let v = vectors();
    let now_ms = v["now"].as_u64().expect("now") * 1000;
    let cases = v["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let headers: Vec<(&str, &str)> = case["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|h| (h[0].as_str().expect("name"), h[1].as_str().expect("value")))
            .collect();
        let status = case["status"].as_u64().unwrap_or(200) as u16;
        let got = parse_headers(status, headers, now_ms);
        let want = &case["expect"];
        let field = |k: &str| want.get(k).unwrap_or(&Value::Null);
        let ok = close(got.limit, field("limit"))
            && close(got.remaining, field("remaining"))
            && close(got.reset_after_ms, field("reset_after_ms"))
            && close(got.retry_after_ms, field("retry_after_ms"))
            && close(got.window_ms, field("window_ms"))
            && got.policy.as_deref() == field("policy").as_str()
            && got.partition.as_deref() == field("partition").as_str()
            && got.global == field("global").as_bool().unwrap_or(false)
            && quotas_match(&got.quotas, field("quotas"));
        if !ok {
            failures.push(format!("{name}: got {got:?}, want {want}"));
        }
    }
    assert!(failures.is_empty(), "failing vectors:\n{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn parser_never_panics(
        headers in proptest::collection::vec((
            prop_oneof![
                Just("X-RateLimit-Limit".to_owned()), Just("X-RateLimit-Remaining".to_owned()),
                Just("X-RateLimit-Reset".to_owned()), Just("X-RateLimit-Reset-After".to_owned()),
                Just("x-ratelimit-used".to_owned()), Just("RATELIMIT".to_owned()),
                Just("RateLimit-Policy".to_owned()), Just("RateLimit-Limit".to_owned()),
                Just("RateLimit-Remaining".to_owned()), Just("RateLimit-Reset".to_owned()),
                Just("Retry-After".to_owned()), Just("retry-after-ms".to_owned()),
                Just("x-ratelimit-reset-tokens".to_owned()), Just("x-ratelimit-remaining-requests".to_owned()),
                Just("anthropic-ratelimit-output-tokens-reset".to_owned()), Just("x-rate-limit-reset".to_owned()),
                Just("X-Shopify-Shop-Api-Call-Limit".to_owned()), any::<String>(),
                proptest::collection::vec(any::<u8>(), 0..30).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            ],
            prop_oneof![
                any::<String>(),
                proptest::collection::vec(any::<u8>(), 0..60).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
                "[0-9]{15,45}(\\.[0-9]{0,30})?",
                "[0-9.\"=;:, a-zé東\\\\]{0,40}",
                "\"[a-z\\\\\"]{0,5}\";[rqtw]=[0-9]{0,25}(;[a-z]{0,3}=[^,]{0,5})?(, ?\"[a-z]{0,3}\";r=[0-9]{0,3})*",
                "(limit|remaining|reset)=[0-9]{0,22}(, ?(limit|remaining|reset)=[-0-9]{0,22}){0,3}",
                "(Mon|Tue|Sunday), [0-9]{1,3}[ -](Jan|Feb|Foo)[ -][0-9]{1,5} [0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3} (GMT|UTC)",
                "([0-9]{0,22}(\\.[0-9]{0,9})?(h|m|s|ms|us|µs|ns|x)){0,4}",
                "[0-9]{0,22}/[0-9]{0,22}",
                "[0-9]{0,4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:[0-9]{2})",
                "[0-9]{0,22}(, ?[0-9]{0,22};w=[0-9]{0,22}){0,3}",
            ],
        ), 0..10),
        now in any::<u64>(),
    ) {
        // Never panics, and reads the same headers the same way every time.
        let read = || parse_headers(429, headers.iter().map(|(n, v)| (n.as_str(), v.as_str())), now);
        let info: RateLimitInfo = read();
        prop_assert_eq!(read(), info);
    }

    #[test]
    fn formatted_headers_parse_back(
        policy in "[a-zA-Z0-9 _.\"\\\\\u{0}\t\n\u{7f}é東-]{1,20}",
        limit in 1u64..1_000_000,
        remaining in 0u64..1_000_000,
        reset_s in 0u64..100_000,
        window_s in 1u64..100_000,
        retry_s in proptest::option::of(1u64..100_000),
        now_s in 1_000_000_000u64..4_000_000_000,
    ) {
        let quota = Quota {
            policy: &policy, limit, remaining, reset_after_ms: reset_s * 1000, window_ms: window_s * 1000,
            retry_after_ms: retry_s.map(|s| s * 1000), now_ms: now_s * 1000,
        };
        for mode in [HeaderMode::All, HeaderMode::Legacy, HeaderMode::Ietf] {
            let mut out = Vec::new();
            format_headers(&quota, mode, &mut out);
            // A Retry-After comes with a refusal; a success's is not read.
            let status = if retry_s.is_some() { 429 } else { 200 };
            let got = parse_headers(status, out.iter().map(|(n, v)| (*n, v.as_str())), now_s * 1000);
            let ietf = mode != HeaderMode::Legacy;
            let want = RateLimitInfo {
                limit: Some(limit),
                remaining: Some(remaining),
                reset_after_ms: Some(reset_s * 1000),
                retry_after_ms: retry_s.map(|s| s * 1000),
                // Controls and non-ASCII cannot travel in an sf-string: they are dropped.
                policy: ietf.then(|| policy.chars().filter(|c| (' '..='~').contains(c)).collect()),
                window_ms: ietf.then_some(window_s * 1000),
                // Legacy's reset is an epoch; the others' IETF `t` a delay, which wins.
                reset_is_instant: !ietf,
                refused: status == 429,
                ..RateLimitInfo::default()
            };
            prop_assert_eq!(got, want);
        }
    }
}
