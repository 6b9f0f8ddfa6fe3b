//! The rule file: parsing, defaults, every validation message, syntax errors, round trips.

use sluice_core::rules::{FailureMode, Identity, RuleSet, RulesError, Unreachable};
use sluice_core::{Algorithm, Limit, Micros};

fn example_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    std::fs::read_to_string(path).unwrap()
}

fn err(toml: &str) -> String {
    RuleSet::from_toml(toml).unwrap_err().to_string()
}

const BASE: &str = "[[rule]]\nname = \"r\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\n";

/// BASE with `line` appended to the rule.
fn with(line: &str) -> String {
    format!("{BASE}{line}\n")
}

const OVERRIDE: &str = "[[override]]\nrule = \"r\"\nidentity = \"1\"\nlimit = 5\nuntil = \"2030-01-01T00:00:00Z\"\n";

#[test]
fn example_file_parses_with_every_algorithm_and_round_trips() {
    let set = RuleSet::from_toml(&example_text()).unwrap();
    let algorithms: Vec<Algorithm> = set.rules().iter().map(|r| r.limit.algorithm()).collect();
    for a in Algorithm::ALL {
        assert!(algorithms.contains(&a), "{a} missing from examples/rules.toml");
    }
    assert!(set.rules().iter().any(|r| r.shadow));
    assert!(set.rules().iter().any(|r| r.limit.shaping()));
    assert!(set.rules().iter().any(|r| r.tier.as_deref() == Some("free")));
    assert!(set.rules().iter().any(|r| r.tier.as_deref() == Some("pro")));
    assert_eq!(set.overrides().count(), 1);
    let per_ip = set.rule("per-ip").unwrap();
    assert_eq!((per_ip.limit.limit(), per_ip.window_ms), (5, 10_000));
    let again = RuleSet::from_toml(&set.to_toml()).unwrap();
    assert_eq!(again.to_toml(), set.to_toml());
    assert_eq!(again.overrides().count(), 1);
    let from_json = RuleSet::from_json(&set.to_json()).unwrap();
    assert_eq!(from_json.to_toml(), set.to_toml());
}

#[test]
fn defaults_are_as_documented() {
    let set = RuleSet::from_toml(BASE).unwrap();
    let r = &set.rules()[0];
    assert_eq!(r.path.as_str(), "*");
    assert!(r.methods.is_empty());
    assert_eq!(r.tier, None);
    assert_eq!(r.limit.capacity(), 10, "burst 0 means capacity = limit");
    assert_eq!(r.failure, FailureMode::Open);
    assert!(!r.limit.shaping());
    assert_eq!(r.limit.max_delay(), Micros::ZERO);
    assert!(!r.shadow);
    assert_eq!(r.by, Identity::Ip);
    assert_eq!(r.window_ms, 1_000);
    assert_eq!(r.limit.window(), Micros::SECOND, "windows are held in microseconds");
    // Defaults are left out when written back.
    assert_eq!(set.to_toml().trim(), BASE.trim());
}

#[test]
fn every_field_is_read() {
    let set = RuleSet::from_toml(
        r#"
[[rule]]
name      = "all"
by        = "header:X-Client-Id"
path      = "/api/upload*"
methods   = ["post", "PUT"]
tier      = "pro"
algorithm = "leaky_bucket"
limit     = 10
window    = "1m"
burst     = 4
failure   = "closed"
shaping   = true
max_delay = "2s"
shadow    = true
"#,
    )
    .unwrap();
    let r = &set.rules()[0];
    assert_eq!(r.by, Identity::Header("header:x-client-id".into()));
    assert_eq!(r.by.key(), "header:x-client-id");
    assert_eq!(r.methods, ["POST", "PUT"]);
    assert_eq!(r.tier.as_deref(), Some("pro"));
    assert_eq!(r.limit.algorithm(), Algorithm::LeakyBucket);
    assert_eq!((r.limit.limit(), r.limit.capacity(), r.window_ms), (10, 4, 60_000));
    assert_eq!(r.failure, FailureMode::Closed);
    assert!(r.limit.shaping() && r.shadow);
    assert_eq!(r.limit.max_delay(), Micros::from_secs(2));
    // What was written comes back, field for field.
    let again = RuleSet::from_toml(&set.to_toml()).unwrap();
    assert_eq!(again.to_toml(), set.to_toml());
    assert!(set.to_toml().contains("header:X-Client-Id"));
    for name in ["ip", "user", "api_key", "tier", "global"] {
        let set = RuleSet::from_toml(&BASE.replace("\"ip\"", &format!("{name:?}"))).unwrap();
        assert_eq!(set.rules()[0].by.key(), name);
    }
}

#[test]
fn validation_errors_name_rule_and_field() {
    let cases: Vec<(String, &str)> = vec![
        (BASE.replace("name = \"r\"", "name = \"\""), "rule #1: field name: must not be empty"),
        (BASE.replace("name = \"r\"", "name = \"  \""), "rule #1: field name: must not be empty"),
        (BASE.replace("name = \"r\"", &format!("name = \"{}\"", "n".repeat(129))), "field name: must be at most 128"),
        (BASE.replace("name = \"r\"", "name = \"a\\tb\""), "field name: must be at most 128 bytes of printable"),
        (format!("{BASE}{BASE}"), "rule \"r\": field name: another rule has the same name"),
        (BASE.replace("\"ip\"", "\"cookie\""), "rule \"r\": field by: \"cookie\" is not an identity"),
        (BASE.replace("\"ip\"", "\"header:\""), "rule \"r\": field by: \"header:\": header name"),
        (BASE.replace("\"ip\"", "\"header:x y\""), "rule \"r\": field by:"),
        (BASE.replace("\"ip\"", "\"IP\""), "rule \"r\": field by:"),
        (with("path = \"\""), "rule \"r\": field path: must not be empty"),
        (with(&format!("path = \"/{}\"", "a".repeat(4096))), "rule \"r\": field path: is 4097 bytes"),
        (with("methods = [\"G T\"]"), "rule \"r\": field methods: \"G T\" is not an HTTP method"),
        (with("methods = [\"\"]"), "rule \"r\": field methods: \"\" is not an HTTP method"),
        (with("methods = [\"VERYLONGMETHODNAME\"]"), "rule \"r\": field methods:"),
        (with("tier = \"\""), "rule \"r\": field tier: must be 1 to 256 bytes"),
        (
            BASE.replace("gcra", "gcrA"),
            "rule \"r\": field algorithm: unknown algorithm \"gcrA\": expected one of token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter, gcra",
        ),
        (BASE.replace("\"1s\"", "\"1\""), "rule \"r\": field window: \"1\" has no unit"),
        (BASE.replace("\"1s\"", "\"0s\""), "rule \"r\": field window: must be at least 1ms"),
        (BASE.replace("\"1s\"", "\"1w\""), "rule \"r\": field window: \"1w\" has unknown unit"),
        (BASE.replace("\"1s\"", "\"366d\""), "rule \"r\": field window: \"366d\" is too long"),
        (BASE.replace("\"1s\"", "\"99999999999999999999ms\""), "rule \"r\": field window:"),
        (BASE.replace("limit = 10", "limit = 0"), "rule \"r\": field limit: limit must be at least 1"),
        (
            BASE.replace("limit = 10", "limit = 2000").replace("\"1s\"", "\"1ms\""),
            "rule \"r\": field limit: limit 2000 per 1ms is more than one request per microsecond",
        ),
        (
            BASE.replace("limit = 10", "limit = 4000000000")
                .replace("gcra", "sliding_window_counter")
                .replace("1s", "1d"),
            "rule \"r\": field limit: limit is too large",
        ),
        (with("burst = 9007199254740992"), "rule \"r\": field burst: burst is too large"),
        (
            BASE.replace("gcra", "fixed_window") + "burst = 5\n",
            "rule \"r\": field burst: fixed_window has no burst",
        ),
        (with("failure = \"maybe\""), "rule \"r\": field failure: \"maybe\" is not \"open\" or \"closed\""),
        (with("shaping = true\nmax_delay = \"1s\""), "rule \"r\": field shaping: only leaky_bucket can shape, not gcra"),
        (
            BASE.replace("gcra", "leaky_bucket") + "shaping = true\n",
            "rule \"r\": field max_delay: shaping = true needs",
        ),
        (with("max_delay = \"soon\""), "rule \"r\": field max_delay: \"soon\" is not a duration"),
        (with("max_delay = \"2\""), "rule \"r\": field max_delay: \"2\" has no unit"),
        (
            BASE.replace("gcra", "leaky_bucket") + "shaping = true\nmax_delay = \"61s\"\n",
            "rule \"r\": field max_delay: 61000 ms is longer than a request may be held (60000 ms)",
        ),
        (format!("{BASE}{}", OVERRIDE.replace("\"r\"", "\"nope\"")), "override #1 (rule \"nope\", identity \"1\"): field rule: no rule has this name"),
        (format!("{BASE}{}", OVERRIDE.replace("2030-01-01T00:00:00Z", "tomorrow")), "override #1 (rule \"r\", identity \"1\"): field until: \"tomorrow\" is not an RFC 3339"),
        (format!("{BASE}{}", OVERRIDE.replace("2030-01-01", "2030-02-30")), "override #1 (rule \"r\", identity \"1\"): field until"),
        (format!("{BASE}{}", OVERRIDE.replace("limit = 5", "limit = 0")), "override #1 (rule \"r\", identity \"1\"): field limit: limit must be at least 1"),
        (format!("{BASE}{}", OVERRIDE.replace("identity = \"1\"", "identity = \"\"")), "override #1 (rule \"r\", identity \"\"): field identity: must be 1 to 256 bytes"),
        (format!("{BASE}{OVERRIDE}{OVERRIDE}"), "override #2 (rule \"r\", identity \"1\"): field identity: another override has the same rule and identity"),
        (
            format!("{}{OVERRIDE}", BASE.replace("\"ip\"", "\"global\"")),
            "override #1 (rule \"r\", identity \"1\"): field identity: the rule limits by global",
        ),
    ];
    for (toml, want) in cases {
        let got = err(&toml);
        assert!(got.contains(want), "got:    {got}\nwanted: {want}");
    }
}

#[test]
fn unnamed_rules_are_named_by_position() {
    let text = format!("{BASE}[[rule]]\nname = \"\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 0\nwindow = \"1s\"\n");
    assert_eq!(err(&text), "rule #2: field name: must not be empty");
    match RuleSet::from_toml(&BASE.replace("limit = 10", "limit = 0")).unwrap_err() {
        RulesError::Rule { rule, field, .. } => assert_eq!((rule.as_str(), field), ("\"r\"", "limit")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn syntax_errors_and_unknown_fields_report_the_line() {
    let got = err(&with("colour = \"red\""));
    assert!(
        got.starts_with("line 7:") && got.contains("unknown field `colour`") && got.contains("expected one of"),
        "{got}"
    );
    assert!(got.contains("colour = \"red\""), "the offending line is quoted: {got}");
    let got = err("[[rule]\nname = 1");
    assert!(got.starts_with("line 1:"), "{got}");
    let got = err(&BASE.replace("limit = 10", "limit = \"ten\""));
    assert!(got.starts_with("line 5:") && got.contains("limit = \"ten\""), "{got}");
    let got = err(&BASE.replace("limit = 10", "limit = -1"));
    assert!(got.starts_with("line 5:"), "{got}");
    let got = err(&format!("{BASE}[[rules]]\n"));
    assert!(
        got.starts_with("line 7:") && got.contains("unknown field `rules`"),
        "{got}"
    );
    let got = err(&format!(
        "{BASE}{}",
        OVERRIDE.replace("limit = 5", "limit = 5\nuntill = 1")
    ));
    assert!(
        got.starts_with("line 11:") && got.contains("unknown field `untill`"),
        "{got}"
    );
    assert!(matches!(
        RuleSet::from_toml("[[rule]]\nname=\"x\""),
        Err(RulesError::Syntax { .. })
    ));
    let missing = err("[[rule]]\nname=\"x\"\nby=\"ip\"\nlimit=1\nwindow=\"1s\"\n");
    assert!(missing.contains("missing field `algorithm`"), "{missing}");
}

#[test]
fn empty_files_have_no_rules() {
    assert!(RuleSet::from_toml("").unwrap().rules().is_empty());
    assert!(RuleSet::from_toml("# nothing yet\n").unwrap().rules().is_empty());
    let empty = RuleSet::default();
    assert!(RuleSet::from_toml(&empty.to_toml()).unwrap().rules().is_empty());
}

#[test]
fn json_rules_are_accepted_too() {
    let set = RuleSet::from_json(
        r#"{"rule":[{"name":"j","by":"global","algorithm":"fixed_window","limit":3,"window":"1s"}],
            "override":[{"rule":"j","identity":"global","limit":9,"until":"2030-01-01T00:00:00+02:00"}]}"#,
    )
    .unwrap();
    assert_eq!(set.rules()[0].name, "j");
    assert_eq!(set.overrides().next().unwrap().until_ms, 1_893_448_800_000);
    let got = RuleSet::from_json(r#"{"rule":[{"name":"j","x":1}]}"#)
        .unwrap_err()
        .to_string();
    assert!(got.contains("unknown field `x`"), "{got}");
    let got = RuleSet::from_json("{\n\"rule\": [\n{").unwrap_err().to_string();
    assert!(got.starts_with("line 3:"), "{got}");
    let got =
        RuleSet::from_json(r#"{"rule":[{"name":"j","by":"ip","algorithm":"fixed_window","limit":0,"window":"1s"}]}"#)
            .unwrap_err()
            .to_string();
    assert_eq!(got, "rule \"j\": field limit: limit must be at least 1");
}

#[test]
fn leased_rules_say_when_an_algorithm_cannot_be_leased() {
    let leased = RuleSet::from_toml(&with("lease = true\nlease_ttl = \"2s\"")).unwrap();
    assert_eq!(leased.rules()[0].lease_ttl, Some(Micros::from_secs(2)));
    let again = RuleSet::from_toml(&leased.to_toml()).unwrap();
    assert_eq!(again.rules()[0].lease_ttl, Some(Micros::from_secs(2)), "round trip");
    assert_eq!(
        RuleSet::from_toml(&with("lease = true")).unwrap().rules()[0].lease_ttl,
        Some(Micros::SECOND)
    );
    assert_eq!(
        RuleSet::from_toml(BASE).unwrap().rules()[0].lease_ttl,
        None,
        "off by default"
    );
    let log = BASE.replace("algorithm = \"gcra\"", "algorithm = \"sliding_window_log\"") + "lease = true\n";
    assert!(
        err(&log).contains("field lease: sliding_window_log cannot be leased"),
        "{}",
        err(&log)
    );
    assert!(err(&with("lease_ttl = \"2s\"")).contains("add lease = true"));
    assert!(err(&with("lease = true\nlease_ttl = \"2m\"")).contains("field lease_ttl: must be 1ms to 60000 ms"));
}

#[test]
fn global_rules_name_their_policy_and_refuse_what_regions_cannot_lease() {
    let plain = RuleSet::from_toml(&with("global = true")).unwrap();
    let g = plain.rules()[0].global.clone().expect("global");
    assert_eq!((g.ttl, g.unreachable), (Micros::SECOND, Unreachable::Spend), "defaults");
    assert_eq!(
        RuleSet::from_toml(BASE).unwrap().rules()[0].global,
        None,
        "regional by default"
    );
    let shared = RuleSet::from_toml(&with(
        "global = true\nglobal_ttl = \"5s\"\non_global_unreachable = \"share\"\nglobal_share = 30\nburst = 20",
    ))
    .unwrap();
    let again = RuleSet::from_toml(&shared.to_toml()).unwrap();
    for set in [&shared, &again] {
        let g = set.rules()[0].global.clone().expect("global");
        assert_eq!(g.ttl, Micros::from_secs(5));
        let Unreachable::Share { limit: share, .. } = g.unreachable else {
            panic!("share, not {:?}", g.unreachable)
        };
        assert_eq!(
            (share.limit(), share.capacity(), share.window()),
            (3, 6, Micros::SECOND),
            "30 % of 10 and of 20"
        );
        // A client with an override of 1,000 (burst 2,000) gets 30 % of its own limit when
        // cut off, not the rule's share.
        let override_limit = Limit::builder(share.algorithm(), 1_000, Micros::SECOND)
            .burst(2_000)
            .build()
            .unwrap();
        let alone = g.unreachable.share(&override_limit).expect("a share");
        assert_eq!((alone.limit(), alone.capacity()), (300, 600), "30 % of the override");
        assert_eq!(
            g.unreachable.share(&share).map(|l| l.limit()),
            Some(1),
            "30 % of 3, at least 1"
        );
    }
    // Proxies may lease a global rule through their region's node, for no longer than it.
    let through = RuleSet::from_toml(&with(
        "global = true\nglobal_ttl = \"2s\"\nlease = true\nlease_ttl = \"2s\"",
    ))
    .unwrap();
    assert_eq!(through.rules()[0].lease_ttl, Some(Micros::from_secs(2)));
    let closed = RuleSet::from_toml(&with("global = true\non_global_unreachable = \"closed\"")).unwrap();
    assert_eq!(
        closed.rules()[0].global.as_ref().map(|g| &g.unreachable),
        Some(&Unreachable::Closed)
    );
    let refused = [
        (
            "global_ttl = \"2s\"",
            "field global_ttl: applies to global rules: add global = true",
        ),
        (
            "global = true\nlease = true\nlease_ttl = \"2s\"",
            "field lease_ttl: a proxy's lease of a global rule comes out of its region's lease",
        ),
        (
            "global = true\nshadow = true",
            "field shadow: a global rule cannot be a shadow rule",
        ),
        (
            "global = true\nglobal_ttl = \"2m\"",
            "field global_ttl: must be 1ms to 60000 ms",
        ),
        (
            "global = true\non_global_unreachable = \"share\"",
            "field global_share: on_global_unreachable = \"share\" needs",
        ),
        (
            "global = true\non_global_unreachable = \"share\"\nglobal_share = 0",
            "field global_share: must be 1 to 100",
        ),
        (
            "global = true\nglobal_share = 5",
            "field global_share: applies with on_global_unreachable = \"share\"",
        ),
        (
            "global = true\non_global_unreachable = \"wait\"",
            "field on_global_unreachable: \"wait\" is not",
        ),
    ];
    for (line, message) in refused {
        assert!(err(&with(line)).contains(message), "{line}: {}", err(&with(line)));
    }
    let log = BASE.replace("algorithm = \"gcra\"", "algorithm = \"sliding_window_log\"") + "global = true\n";
    assert!(
        err(&log).contains("field global: sliding_window_log cannot be leased"),
        "{}",
        err(&log)
    );
    assert!(err(&log).contains("global = true"), "{}", err(&log));
}

#[test]
fn every_field_serde_writes_is_read_back_from_json() {
    use sluice_core::rules::{OverrideSpec, RuleFile, RuleSpec};
    let spec = RuleSpec {
        name: "n".into(),
        by: "header:x-team".into(),
        path: "/api/*".into(),
        methods: vec!["GET".into(), "PUT".into()],
        hosts: vec!["api.example.com".into(), "*.example.org".into()],
        case_insensitive_paths: true,
        when_missing: Some("deny".into()),
        tier: Some("free".into()),
        algorithm: "leaky_bucket".into(),
        limit: 7,
        window: "1m".into(),
        burst: 3,
        failure: "closed".into(),
        shaping: true,
        max_delay: "2s".into(),
        shadow: true,
        lease: true,
        lease_ttl: Some("3s".into()),
        global: true,
        global_ttl: Some("4s".into()),
        on_global_unreachable: Some("share".into()),
        global_share: Some(40),
    };
    let file = RuleFile {
        rules: vec![spec],
        overrides: vec![OverrideSpec {
            rule: "n".into(),
            identity: "a\"b".into(),
            limit: 9,
            until: "2030-01-01T00:00:00Z".into(),
        }],
    };
    let text = serde_json::to_string(&file).unwrap();
    let doc = sluice_core::json::parse(text.as_bytes()).unwrap();
    assert_eq!(RuleFile::read(&doc).unwrap(), file, "{text}");
    let toml = toml::to_string(&file).unwrap();
    assert_eq!(toml::from_str::<RuleFile>(&toml).unwrap(), file);
}
