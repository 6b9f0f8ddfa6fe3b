//! The rule file: parsing, validation messages, matching and overrides.

use std::collections::BTreeMap;

use proptest::prelude::*;
use sluice_core::rules::{limit_key, Override, RuleSet, RulesError};
use sluice_core::Algorithm;

fn ids(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn example() -> RuleSet {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    RuleSet::from_toml(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn err(toml: &str) -> String {
    RuleSet::from_toml(toml).unwrap_err().to_string()
}

const BASE: &str = "[[rule]]\nname = \"r\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\n";

#[test]
fn example_file_parses_with_every_algorithm_and_round_trips() {
    let set = example();
    let algorithms: Vec<Algorithm> = set.rules().iter().map(|r| r.limit.algorithm()).collect();
    for a in Algorithm::ALL {
        assert!(algorithms.contains(&a), "{a} missing from examples/rules.toml");
    }
    let again = RuleSet::from_toml(&set.to_toml()).unwrap();
    assert_eq!(again.to_toml(), set.to_toml());
    assert_eq!(again.overrides().count(), 1);
}

#[test]
fn validation_errors_name_rule_and_field() {
    let cases = [
        (
            BASE.replace("gcra", "gcrA"),
            "rule \"r\": field algorithm: unknown algorithm \"gcrA\"",
        ),
        (
            BASE.replace("\"1s\"", "\"1\""),
            "rule \"r\": field window: \"1\" has no unit",
        ),
        (
            BASE.replace("limit = 10", "limit = 0"),
            "rule \"r\": field limit: limit must be at least 1",
        ),
        (BASE.replace("\"ip\"", "\"cookie\""), "rule \"r\": field by:"),
        (
            BASE.replace("name = \"r\"", "name = \"\""),
            "rule #1: field name: must not be empty",
        ),
        (
            format!("{BASE}shaping = true\n"),
            "rule \"r\": field shaping: only leaky_bucket",
        ),
        (format!("{BASE}failure = \"maybe\"\n"), "rule \"r\": field failure"),
        (format!("{BASE}methods = [\"G T\"]\n"), "rule \"r\": field methods"),
        (
            format!("{BASE}{BASE}"),
            "rule \"r\": field name: another rule has the same name",
        ),
        (
            BASE.replace("limit = 10", "limit = 4000000000")
                .replace("gcra", "sliding_window_counter")
                .replace("1s", "1d"),
            "rule \"r\": field limit:",
        ),
        (
            format!(
                "{BASE}[[override]]\nrule = \"nope\"\nidentity = \"1\"\nlimit = 5\nuntil = \"2030-01-01T00:00:00Z\"\n"
            ),
            "override #1 (rule \"nope\"",
        ),
        (
            format!("{BASE}[[override]]\nrule = \"r\"\nidentity = \"1\"\nlimit = 5\nuntil = \"tomorrow\"\n"),
            "field until",
        ),
    ];
    for (toml, want) in cases {
        let got = err(&toml);
        assert!(got.contains(want), "got: {got}\nwanted: {want}");
    }
}

#[test]
fn syntax_errors_and_unknown_fields_report_the_line() {
    let got = err(&format!("{BASE}colour = \"red\"\n"));
    assert!(
        got.starts_with("line 7:") && got.contains("unknown field `colour`"),
        "{got}"
    );
    let got = err("[[rule]\nname = 1");
    assert!(got.starts_with("line 1:"), "{got}");
    assert!(matches!(
        RuleSet::from_toml("[[rule]]\nname=\"x\""),
        Err(RulesError::Syntax { .. })
    ));
}

#[test]
fn matching_follows_identity_path_method_and_tier() {
    let set = example();
    let names = |i: &BTreeMap<String, String>, m: &str, p: &str| -> Vec<String> {
        set.matching(i, m, p)
            .map(|(r, id)| format!("{}={id}", r.name))
            .collect()
    };
    assert_eq!(
        names(&ids(&[("ip", "1.2.3.4")]), "GET", "/"),
        ["per-ip=1.2.3.4", "global-dry-run=global"]
    );
    assert_eq!(
        names(&ids(&[("user", "7"), ("tier", "free")]), "get", "/api/search/x"),
        ["search-per-user=7", "free-tier=7", "global-dry-run=global"]
    );
    assert_eq!(
        names(&ids(&[("user", "7"), ("tier", "pro")]), "POST", "/api/search"),
        ["pro-tier=7", "global-dry-run=global"]
    );
    assert_eq!(
        names(&ids(&[("user", "7")]), "PUT", "/api/upload/1"),
        ["uploads-shaped=7", "global-dry-run=global"]
    );
}

#[test]
fn overrides_apply_until_their_end_exactly() {
    let mut set = example();
    let rule = set
        .rules()
        .iter()
        .find(|r| r.name == "search-per-user")
        .unwrap()
        .clone();
    let until = 1_924_905_600_000; // 2030-12-31T00:00:00Z
    assert_eq!(set.limit_for(&rule, "42", until - 1).limit(), 1000);
    assert_eq!(set.limit_for(&rule, "42", until).limit(), 100);
    assert_eq!(set.limit_for(&rule, "43", 0).limit(), 100);
    set.add_override(Override {
        rule: "search-per-user".into(),
        identity: "43".into(),
        limit: 7,
        until_ms: 5_000,
    })
    .unwrap();
    assert_eq!(set.limit_for(&rule, "43", 4_999).limit(), 7);
    set.expire_overrides(5_000);
    assert_eq!(set.overrides().count(), 1);
    assert!(set.remove_override("search-per-user", "42"));
    assert_eq!(set.limit_for(&rule, "42", 0).limit(), 100);
    let bad = set.add_override(Override {
        rule: "search-per-user".into(),
        identity: "1".into(),
        limit: 0,
        until_ms: 9,
    });
    assert!(bad.unwrap_err().to_string().contains("field limit"));
}

#[test]
fn limit_keys_keep_one_hash_tag() {
    assert_eq!(limit_key("per-ip", "1.2.3.4"), "sluice:{per-ip:1.2.3.4}");
    assert_eq!(limit_key("r", "a}b{c"), "sluice:{r:a)b(c}");
}

#[test]
fn json_rules_are_accepted_too() {
    let set = RuleSet::from_json(
        r#"{"rule":[{"name":"j","by":"global","algorithm":"fixed_window","limit":3,"window":"1s"}]}"#,
    )
    .unwrap();
    assert_eq!(set.rules()[0].name, "j");
    assert!(RuleSet::from_json(r#"{"rule":[{"name":"j","x":1}]}"#)
        .unwrap_err()
        .to_string()
        .contains("unknown field `x`"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn rule_parsing_never_panics(text in any::<String>(), mutated in "[a-z_=\"\\[\\] 0-9\n.:-]{0,200}") {
        let _ = RuleSet::from_toml(&text);
        let _ = RuleSet::from_toml(&format!("{BASE}{mutated}"));
        let _ = RuleSet::from_json(&text);
    }

    #[test]
    fn check_request_parsing_never_panics(body in any::<Vec<u8>>(), text in "\\{\"identities\":\\{[^}]{0,40}\\},\"method\":\"[A-Z]{0,5}\",\"path\":\"[^\"]{0,10}\",\"cost\":-?[0-9]{0,22}\\}") {
        let _ = sluice_core::wire::CheckRequest::from_json(&body);
        let _ = sluice_core::wire::CheckRequest::from_json(text.as_bytes());
    }
}
