//! Matching requests to rules, overrides over time, and limit keys.

use std::collections::BTreeMap;

use sluice_core::rules::{Override, RuleSet, MAX_TIMESTAMP_MS};

fn ids(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn example() -> RuleSet {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    RuleSet::from_toml(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn names(set: &RuleSet, i: &[(&str, &str)], m: &str, p: &str) -> Vec<String> {
    let i = ids(i);
    set.matching(&i, m, p)
        .map(|(r, id)| format!("{}={id}", r.name))
        .collect()
}

const RULES: &str = r#"
[[rule]]
name = "ip"
by = "ip"
algorithm = "gcra"
limit = 10
window = "1s"

[[rule]]
name = "search-get"
by = "user"
path = "/api/search*"
methods = ["GET", "head"]
algorithm = "sliding_window_counter"
limit = 100
window = "1m"

[[rule]]
name = "free"
by = "user"
tier = "free"
algorithm = "fixed_window"
limit = 1000
window = "1d"

[[rule]]
name = "client"
by = "header:X-Client"
path = "/v?/*"
algorithm = "token_bucket"
limit = 5
window = "1s"

[[rule]]
name = "everyone"
by = "global"
algorithm = "sliding_window_log"
limit = 100
window = "1s"
shadow = true
"#;

#[test]
fn missing_identity_skips_the_rule_and_global_always_matches() {
    let set = RuleSet::from_toml(RULES).unwrap();
    assert_eq!(names(&set, &[], "GET", "/api/search"), ["everyone=global"]);
    assert_eq!(
        names(&set, &[("ip", "")], "GET", "/"),
        ["everyone=global"],
        "empty = absent"
    );
    assert_eq!(
        names(&set, &[("ip", "1.2.3.4")], "GET", "/"),
        ["ip=1.2.3.4", "everyone=global"]
    );
    // A request's own "global" identity is not what a global rule uses.
    assert_eq!(names(&set, &[("global", "x")], "GET", "/"), ["everyone=global"]);
}

#[test]
fn methods_match_ignoring_case_and_paths_by_glob() {
    let set = RuleSet::from_toml(RULES).unwrap();
    let u = [("user", "7")];
    assert_eq!(
        names(&set, &u, "GET", "/api/search"),
        ["search-get=7", "everyone=global"]
    );
    assert_eq!(
        names(&set, &u, "get", "/api/search?q=1"),
        ["search-get=7", "everyone=global"]
    );
    assert_eq!(
        names(&set, &u, "HEAD", "/api/search/x"),
        ["search-get=7", "everyone=global"]
    );
    assert_eq!(names(&set, &u, "POST", "/api/search"), ["everyone=global"]);
    assert_eq!(names(&set, &u, "GET", "/api/searc"), ["everyone=global"]);
    assert_eq!(
        names(&set, &u, "GET", "/x/api/search"),
        ["everyone=global"],
        "globs are anchored"
    );
}

#[test]
fn tier_rules_need_the_tier_identity_to_equal_theirs() {
    let set = RuleSet::from_toml(RULES).unwrap();
    assert_eq!(
        names(&set, &[("user", "7"), ("tier", "free")], "PUT", "/"),
        ["free=7", "everyone=global"]
    );
    assert_eq!(
        names(&set, &[("user", "7"), ("tier", "pro")], "PUT", "/"),
        ["everyone=global"]
    );
    assert_eq!(
        names(&set, &[("user", "7"), ("tier", "Free")], "PUT", "/"),
        ["everyone=global"]
    );
    assert_eq!(names(&set, &[("user", "7")], "PUT", "/"), ["everyone=global"]);
    assert_eq!(
        names(&set, &[("tier", "free")], "PUT", "/"),
        ["everyone=global"],
        "no user identity"
    );
}

#[test]
fn header_identities_use_the_lower_cased_key() {
    let set = RuleSet::from_toml(RULES).unwrap();
    assert_eq!(
        names(&set, &[("header:x-client", "c1")], "GET", "/v1/a"),
        ["client=c1", "everyone=global"]
    );
    assert_eq!(
        names(&set, &[("header:x-client", "c1")], "GET", "/v10/a"),
        ["everyone=global"]
    );
    assert_eq!(
        names(&set, &[("header:X-Client", "c1")], "GET", "/v1/a"),
        ["everyone=global"]
    );
}

#[test]
fn every_rule_matches_in_file_order() {
    let set = RuleSet::from_toml(RULES).unwrap();
    assert_eq!(
        names(
            &set,
            &[
                ("ip", "1.2.3.4"),
                ("user", "7"),
                ("tier", "free"),
                ("header:x-client", "c")
            ],
            "GET",
            "/v2/x"
        ),
        ["ip=1.2.3.4", "free=7", "client=c", "everyone=global"]
    );
}

#[test]
fn example_rules_match_as_the_demo_expects() {
    let set = example();
    assert_eq!(
        names(&set, &[("ip", "1.2.3.4")], "GET", "/"),
        ["per-ip=1.2.3.4", "global-dry-run=global"]
    );
    assert_eq!(
        names(&set, &[("user", "7"), ("tier", "free")], "get", "/api/search/x"),
        ["search-per-user=7", "free-tier=7", "global-dry-run=global"]
    );
    assert_eq!(
        names(&set, &[("user", "7"), ("tier", "pro")], "POST", "/api/search"),
        ["pro-tier=7", "global-dry-run=global"]
    );
    assert_eq!(
        names(&set, &[("user", "7")], "PUT", "/api/upload/1"),
        ["uploads-shaped=7", "global-dry-run=global"]
    );
    assert_eq!(
        names(&set, &[("api_key", "k")], "GET", "/"),
        ["per-api-key=k", "global-dry-run=global"]
    );
}

#[test]
fn overrides_apply_until_their_end_exactly() {
    let mut set = example();
    let rule = set.rule("search-per-user").unwrap().clone();
    let until = 1_924_905_600_000; // 2030-12-31T00:00:00Z in examples/rules.toml
    assert_eq!(set.limit_for(&rule, "42", until - 1).limit(), 1000);
    assert_eq!(set.limit_for(&rule, "42", until).limit(), 100);
    assert_eq!(set.limit_for(&rule, "43", 0).limit(), 100);
    let other = set.rule("per-ip").unwrap().clone();
    assert_eq!(set.limit_for(&other, "42", 0).limit(), 5, "overrides are per rule");
    set.add_override(Override {
        rule: "search-per-user".into(),
        identity: "43".into(),
        limit: 7,
        until_ms: 5_000,
    })
    .unwrap();
    assert_eq!(set.limit_for(&rule, "43", 4_999).limit(), 7);
    assert_eq!(set.limit_for(&rule, "43", 5_000).limit(), 100);
    assert_eq!(set.overrides().count(), 2);
    assert_eq!(set.expire_overrides(4_999), 0);
    assert_eq!(set.overrides().count(), 2);
    assert_eq!(set.expire_overrides(5_000), 1);
    assert_eq!(set.overrides().count(), 1);
    assert!(set.remove_override("search-per-user", "42"));
    assert!(!set.remove_override("search-per-user", "42"));
    assert!(!set.remove_override("nope", "42"));
    assert_eq!(set.limit_for(&rule, "42", 0).limit(), 100);
    assert_eq!(set.overrides().count(), 0);
}

#[test]
fn overrides_keep_algorithm_window_and_burst_ratio() {
    let mut set = example();
    let add = |set: &mut RuleSet, rule: &str, limit| {
        set.add_override(Override {
            rule: rule.into(),
            identity: "x".into(),
            limit,
            until_ms: MAX_TIMESTAMP_MS,
        })
    };
    // api-key: gcra, 600 per minute, burst 50 → ×2 keeps burst/limit: 100.
    add(&mut set, "per-api-key", 1200).unwrap();
    let rule = set.rule("per-api-key").unwrap().clone();
    let o = set.limit_for(&rule, "x", 0);
    assert_eq!(
        (o.algorithm(), o.window(), o.limit(), o.capacity()),
        (rule.limit.algorithm(), rule.limit.window(), 1200, 100)
    );
    // Scaled down, the burst stays at least 1.
    add(&mut set, "per-api-key", 1).unwrap();
    assert_eq!(set.limit_for(&rule, "x", 0).capacity(), 1);
    // burst 0 (= limit) stays = limit; shaping and max_delay are kept.
    add(&mut set, "uploads-shaped", 20).unwrap();
    let up = set.rule("uploads-shaped").unwrap().clone();
    let o = set.limit_for(&up, "x", 0);
    assert!(o.shaping());
    assert_eq!((o.max_delay(), o.capacity()), (up.limit.max_delay(), 4));
    add(&mut set, "per-ip", 50).unwrap();
    let ip = set.rule("per-ip").unwrap().clone();
    assert_eq!(set.limit_for(&ip, "x", 0).capacity(), 50);
    // Adding again replaces.
    add(&mut set, "per-ip", 60).unwrap();
    assert_eq!(set.limit_for(&ip, "x", 0).limit(), 60);
}

#[test]
fn run_time_overrides_are_validated_and_written_back() {
    let mut set = example();
    let o = |rule: &str, identity: &str, limit, until_ms| Override {
        rule: rule.into(),
        identity: identity.into(),
        limit,
        until_ms,
    };
    let msg = |r: Result<(), sluice_core::rules::RulesError>| r.unwrap_err().to_string();
    assert!(msg(set.add_override(o("nope", "1", 5, 9))).contains("field rule: no rule has this name"));
    assert!(msg(set.add_override(o("per-ip", "1", 0, 9))).contains("field limit: limit must be at least 1"));
    assert!(msg(set.add_override(o("per-ip", "1", u64::MAX, 9))).contains("field limit:"));
    assert!(msg(set.add_override(o("per-ip", "", 5, 9))).contains("field identity"));
    assert!(msg(set.add_override(o("per-ip", &"x".repeat(257), 5, 9))).contains("field identity"));
    assert!(msg(set.add_override(o("per-ip", "1", 5, MAX_TIMESTAMP_MS + 1))).contains("field until"));
    assert!(msg(set.add_override(o("global-dry-run", "1", 5, 9))).contains("field identity"));
    set.add_override(o("global-dry-run", "global", 50_000, 1_798_675_200_250))
        .unwrap();
    set.add_override(o("per-ip", "203.0.113.9", 50, MAX_TIMESTAMP_MS))
        .unwrap();
    let text = set.to_toml();
    assert!(text.contains("until = \"2026-12-31T00:00:00.250Z\""), "{text}");
    let again = RuleSet::from_toml(&text).unwrap();
    assert_eq!(again.overrides().count(), 3);
    assert_eq!(again.to_toml(), text);
    let g = again.rule("global-dry-run").unwrap();
    assert_eq!(again.limit_for(g, "global", 1_798_675_200_249).limit(), 50_000);
    assert_eq!(again.limit_for(g, "global", 1_798_675_200_250).limit(), 10_000);
}

#[test]
fn a_missing_identity_skips_shares_or_denies_as_the_rule_says() {
    let set = RuleSet::from_toml(
        r#"
[[rule]]
name = "skip"
by = "api_key"
algorithm = "fixed_window"
limit = 5
window = "1m"

[[rule]]
name = "shared"
by = "api_key"
algorithm = "fixed_window"
limit = 5
window = "1m"
when_missing = "shared"

[[rule]]
name = "deny"
by = "user"
algorithm = "fixed_window"
limit = 5
window = "1m"
when_missing = "deny"
"#,
    )
    .unwrap();
    assert_eq!(
        names(&set, &[("api_key", "k"), ("user", "u")], "GET", "/"),
        ["skip=k", "shared=k", "deny=u"]
    );
    assert_eq!(
        names(&set, &[("api_key", "")], "GET", "/"),
        ["shared=(none)", "deny=(none)"]
    );
    let i = ids(&[]);
    let refusing: Vec<&str> = set
        .matching(&i, "GET", "/")
        .filter(|(r, id)| r.refuses(id))
        .map(|(r, _)| r.name.as_str())
        .collect();
    assert_eq!(
        refusing,
        ["deny"],
        "only the deny rule refuses, and only without its identity"
    );
    let i = ids(&[("user", "u")]);
    assert!(set.matching(&i, "GET", "/").all(|(r, id)| !r.refuses(id)));

    let bad = RuleSet::from_toml(
        "[[rule]]\nname = \"x\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nwhen_missing = \"drop\"\n",
    );
    let e = bad.expect_err("refused").to_string();
    assert!(e.contains("when_missing") && e.contains("\"drop\""), "{e}");
}

#[test]
fn case_insensitive_paths_match_whatever_the_case() {
    let set = RuleSet::from_toml(
        r#"
[[rule]]
name = "folded"
by = "ip"
path = "/API/search*"
case_insensitive_paths = true
algorithm = "gcra"
limit = 5
window = "1s"

[[rule]]
name = "exact"
by = "ip"
path = "/api/search*"
algorithm = "gcra"
limit = 5
window = "1s"
"#,
    )
    .unwrap();
    let ip = [("ip", "1.2.3.4")];
    assert_eq!(names(&set, &ip, "GET", "/Api/SEARCH"), ["folded=1.2.3.4"]);
    assert_eq!(
        names(&set, &ip, "GET", "/api/search"),
        ["folded=1.2.3.4", "exact=1.2.3.4"]
    );
    // It survives the round trip through the file a proxy reads.
    let again = RuleSet::from_json(&set.rules_json()).unwrap();
    assert_eq!(names(&again, &ip, "GET", "/API/Search/x"), ["folded=1.2.3.4"]);
}

/// Issue 40: a rule naming `hosts` applies to a request to one of them (port and case
/// ignored, `*.domain` for its subdomains); a request without a host, and one to another
/// host, only meet the rules naming none.
#[test]
fn rules_naming_hosts_apply_to_those_hosts_only() {
    let rule = |name: &str, hosts: &str| {
        format!("[[rule]]\nname = \"{name}\"\nby = \"ip\"\n{hosts}algorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\n")
    };
    let text = rule("api", "hosts = [\"API.example.com\", \"*.example.org\"]\n") + &rule("all", "");
    let set = RuleSet::from_toml(&text).unwrap();
    let i = ids(&[("ip", "1.2.3.4")]);
    let on = |host: Option<&str>| -> Vec<String> {
        set.matching_host(&i, "GET", host, "/")
            .map(|(r, _)| r.name.clone())
            .collect()
    };
    assert_eq!(on(Some("api.EXAMPLE.com:8443")), ["api", "all"]);
    assert_eq!(on(Some("a.b.example.org")), ["api", "all"]);
    assert_eq!(on(Some("example.org")), ["all"]);
    assert_eq!(on(Some("api.example.com.evil.net")), ["all"]);
    assert_eq!(on(None), ["all"]);
    assert_eq!(names(&set, &[("ip", "1.2.3.4")], "GET", "/"), ["all=1.2.3.4"]);
    let bad = RuleSet::from_toml(&rule("h", "hosts = [\"a/b\"]\n")).unwrap_err();
    assert!(bad.to_string().contains("field hosts"), "{bad}");
}

/// Explaining says why each rule that does not match does not, and agrees with matching.
#[test]
fn explain_names_the_failing_condition_and_agrees_with_matching() {
    let set = RuleSet::from_toml(
        r#"
[[rule]]
name = "login"
by = "ip"
path = "/login"
methods = ["POST"]
algorithm = "fixed_window"
limit = 3
window = "1m"

[[rule]]
name = "api-host"
by = "user"
hosts = ["api.example.com"]
path = "/api/*"
tier = "free"
algorithm = "fixed_window"
limit = 3
window = "1m"
"#,
    )
    .unwrap();
    let why = |i: &[(&str, &str)], m: &str, h: Option<&str>, p: &str| -> Vec<String> {
        let i = ids(i);
        let explained: Vec<String> = set
            .rules()
            .iter()
            .map(|r| match r.explain(&i, m, h, p) {
                Ok(id) => format!("{} matches by {id}", r.name),
                Err(why) => format!("{}: {why}", r.name),
            })
            .collect();
        let matched: Vec<&str> = set.matching_host(&i, m, h, p).map(|(r, _)| r.name.as_str()).collect();
        let said: Vec<&str> = set
            .rules()
            .iter()
            .filter(|r| r.explain(&i, m, h, p).is_ok())
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(matched, said);
        explained
    };
    assert_eq!(
        why(&[("ip", "1.2.3.4")], "GET", None, "/login"),
        [
            "login: method GET is not POST",
            "api-host: no host given; the rule is for api.example.com"
        ]
    );
    assert_eq!(
        why(
            &[("user", "u"), ("tier", "gold")],
            "POST",
            Some("API.example.com:443"),
            "/api/x"
        ),
        [
            "login: path /api/x does not match /login",
            "api-host: tier gold is not free"
        ]
    );
    assert_eq!(
        why(&[("tier", "free")], "POST", Some("api.example.com"), "/login"),
        [
            "login: no ip identity, and the rule skips requests without it",
            "api-host: path /login does not match /api/*"
        ]
    );
    assert_eq!(
        why(
            &[("user", "u"), ("tier", "free"), ("ip", "9.9.9.9")],
            "POST",
            Some("api.example.com"),
            "/api/x"
        ),
        ["login: path /api/x does not match /login", "api-host matches by u"]
    );
    assert_eq!(set.rules()[0].conditions(), "POST /login");
    assert_eq!(set.rules()[1].conditions(), "on api.example.com /api/* tier=free");
}
