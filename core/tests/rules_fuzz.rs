//! Property tests: rule parsing never panics, and globs agree with a reference matcher.

use proptest::prelude::*;
use sluice_core::rules::{parse_duration, parse_rfc3339, Glob, RuleSet};

const BASE: &str = "[[rule]]\nname = \"r\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\n";

/// Plain recursive glob semantics over characters.
fn reference(p: &[char], t: &[char]) -> bool {
    match p.split_first() {
        None => t.is_empty(),
        Some(('*', rest)) => (0..=t.len()).any(|i| reference(rest, &t[i..])),
        Some(('?', rest)) => !t.is_empty() && reference(rest, &t[1..]),
        Some((c, rest)) => t.first() == Some(c) && reference(rest, &t[1..]),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn rule_parsing_never_panics(
        text in any::<String>(),
        mutated in "[a-z_=\"\\[\\] 0-9\n.:{},-]{0,200}",
        value in "[a-z0-9\"_:.*?/ -]{0,24}",
        field in prop::sample::select(vec![
            "name", "by", "path", "methods", "tier", "algorithm", "limit", "window",
            "burst", "failure", "shaping", "max_delay", "shadow",
        ]),
    ) {
        let _ = RuleSet::from_toml(&text);
        let _ = RuleSet::from_json(&text);
        let _ = RuleSet::from_toml(&format!("{BASE}{mutated}"));
        let _ = RuleSet::from_toml(&format!("{BASE}{field} = {value}\n"));
        let _ = RuleSet::from_toml(&format!("{BASE}[[override]]\nrule = \"r\"\nidentity = \"1\"\nlimit = 5\nuntil = {value}\n"));
        let _ = parse_duration(&text);
        let _ = parse_rfc3339(&text);
    }

    #[test]
    fn numbers_never_panic(limit in any::<u64>(), burst in any::<u64>(), window in "[0-9]{1,21}(ms|s|m|h|d)", delay in "[0-9]{1,21}(ms|s|m|h|d)") {
        let limit = limit >> (limit % 64);
        let burst = burst >> (burst % 64);
        for algorithm in ["token_bucket", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter", "gcra"] {
            let text = format!(
                "[[rule]]\nname = \"r\"\nby = \"ip\"\nalgorithm = \"{algorithm}\"\nlimit = {}\nwindow = \"{window}\"\nburst = {}\nshaping = {}\nmax_delay = \"{delay}\"\n",
                limit.min(i64::MAX as u64), burst.min(i64::MAX as u64), algorithm == "leaky_bucket",
            );
            if let Ok(set) = RuleSet::from_toml(&text) {
                prop_assert_eq!(RuleSet::from_toml(&set.to_toml()).unwrap().to_toml(), set.to_toml());
            }
        }
    }

    #[test]
    fn timestamps_round_trip(ms in 0u64..=253_402_300_799_999) {
        prop_assert_eq!(parse_rfc3339(&sluice_core::rules::format_rfc3339(ms)), Ok(ms));
    }

    #[test]
    fn globs_agree_with_the_reference(pattern in "[ab/é*?]{0,8}", text in "[ab/é]{0,12}") {
        let p: Vec<char> = pattern.chars().collect();
        let t: Vec<char> = text.chars().collect();
        prop_assert_eq!(Glob::new(&pattern).matches(&text), reference(&p, &t), "{} vs {}", pattern, text);
    }
}
