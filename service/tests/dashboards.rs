//! The Grafana dashboard (`examples/grafana/sluice.json`) and the Prometheus alert rules
//! (`examples/prometheus/alerts.yml`) ask only for series a node serves: a node is started,
//! checked until its rules have counted allows and denials, its `/metrics` scraped, and every
//! metric a query names, and every label its selectors match, looked up in the scrape.
//! (`promtool check rules` and `promtool test rules` check the alerts' syntax and behaviour:
//! scripts/test.)

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice_testkit::{free_port, wait_for_port, Child};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-service");
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Series Prometheus makes itself for each target, not the node.
const SCRAPE_SERIES: [&str; 1] = ["up"];
/// Labels Prometheus adds to each scraped series (the target's).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// A series selector in a query: the metric and its label matchers (`label`, `op`, `value`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Selector {
    metric: String,
    matchers: Vec<(String, String, String)>,
}

/// The series selectors of a PromQL expression (a Grafana `label_values(…, label)` query is
/// read as its selector). A small scanner, not a parser: identifiers that are followed by
/// `(` are functions, aggregations and operators keywords, those after `by`, `without`, `on`, `ignoring`, `group_left` and
/// `group_right` label lists, `$`-names Grafana's variables; ranges and strings are skipped.
fn selectors(expr: &str) -> Vec<Selector> {
    const KEYWORDS: [&str; 21] = [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "atan2", // operators
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk", // aggregations, whose `by (…)` may come before their `(`
    ];
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let expr = match expr.trim().strip_prefix("label_values(") {
        Some(args) => args.rsplit_once(',').map_or(args, |(selector, _label)| selector),
        None => expr,
    };
    let s: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut j: usize| {
        while j < s.len() && s[j].is_whitespace() {
            j += 1;
        }
        j
    };
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = string_end(&s, i).0;
        } else if c == '[' {
            while i < s.len() && s[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            i += 1;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_' || s[i] == '.') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_' || s[i] == ':') {
                i += 1;
            }
            let ident: String = s[start..i].iter().collect();
            let next = skip_ws(i);
            if LABEL_LISTS.contains(&ident.as_str()) {
                if s.get(next) == Some(&'(') {
                    i = next;
                    while i < s.len() && s[i] != ')' {
                        i += 1;
                    }
                    i += 1;
                }
            } else if s.get(next) == Some(&'(') || KEYWORDS.contains(&ident.as_str()) {
                // A function or aggregation, or an operator.
            } else if s.get(next) == Some(&'{') {
                let (matchers, end) = matchers(&s, next);
                out.push(Selector {
                    metric: ident,
                    matchers,
                });
                i = end;
            } else {
                out.push(Selector {
                    metric: ident,
                    matchers: Vec::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The end (after the closing quote) of the string starting at `s[i]`, and its value.
fn string_end(s: &[char], i: usize) -> (usize, String) {
    let quote = s[i];
    let mut j = i + 1;
    let mut value = String::new();
    while j < s.len() && s[j] != quote {
        if s[j] == '\\' && quote != '`' && j + 1 < s.len() {
            j += 1;
        }
        value.push(s[j]);
        j += 1;
    }
    (j + 1, value)
}

/// The matchers of the `{…}` at `s[i]`, and the index after its `}`.
fn matchers(s: &[char], mut i: usize) -> (Vec<(String, String, String)>, usize) {
    let mut out = Vec::new();
    i += 1;
    loop {
        while i < s.len() && (s[i].is_whitespace() || s[i] == ',') {
            i += 1;
        }
        if i >= s.len() || s[i] == '}' {
            return (out, i + 1);
        }
        let start = i;
        while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
            i += 1;
        }
        let label: String = s[start..i].iter().collect();
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        let op_start = i;
        while i < s.len() && matches!(s[i], '=' | '!' | '~') {
            i += 1;
        }
        let op: String = s[op_start..i].iter().collect();
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        assert!(
            !label.is_empty() && !op.is_empty() && i < s.len() && matches!(s[i], '"' | '\'' | '`'),
            "cannot read the matchers in {:?}",
            s.iter().collect::<String>()
        );
        let (end, value) = string_end(s, i);
        out.push((label, op, value));
        i = end;
    }
}

/// Every string under a key `expr`, `query` or `definition` in `v`, with where it is.
fn queries(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                let here = format!("{at}.{k}");
                match (k.as_str(), x) {
                    ("expr" | "query" | "definition", Value::String(q)) => out.push((here, q.clone())),
                    _ => queries(x, &here, out),
                }
            }
        }
        Value::Array(items) => {
            for (n, x) in items.iter().enumerate() {
                let title = x.get("title").or_else(|| x.get("alert")).or_else(|| x.get("name"));
                let here = match title.and_then(Value::as_str) {
                    Some(t) => format!("{at}[{t}]"),
                    None => format!("{at}[{n}]"),
                };
                queries(x, &here, out);
            }
        }
        _ => {}
    }
}

/// The series of a scrape: by metric name, each series' labels.
fn parse_scrape(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, _value) = line.rsplit_once(' ').expect("a sample value");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let chars: Vec<char> = rest.chars().collect();
                let mut labels = BTreeMap::new();
                let mut i = 0;
                while i < chars.len() && chars[i] != '}' {
                    let eq = chars[i..].iter().position(|&c| c == '=').expect("a label") + i;
                    let label: String = chars[i..eq].iter().collect();
                    let (end, value) = string_end(&chars, eq + 1);
                    labels.insert(label, value);
                    i = end;
                    if chars.get(i) == Some(&',') {
                        i += 1;
                    }
                }
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        out.entry(name.to_owned()).or_default().push(labels);
    }
    out
}

/// What is wrong with `selector` against the node's `served` series (nothing: empty).
fn problems(selector: &Selector, served: &BTreeMap<String, Vec<BTreeMap<String, String>>>) -> Vec<String> {
    if SCRAPE_SERIES.contains(&selector.metric.as_str()) {
        return Vec::new();
    }
    let Some(series) = served.get(&selector.metric) else {
        return vec![format!("{} is not a series the node serves", selector.metric)];
    };
    let mut out = Vec::new();
    for (label, op, value) in &selector.matchers {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        if !series.iter().any(|s| s.contains_key(label)) {
            out.push(format!("{} has no label {label}", selector.metric));
        } else if op == "=" && !value.contains('$') && !series.iter().any(|s| s.get(label) == Some(value)) {
            out.push(format!("{} has no series with {label}=\"{value}\"", selector.metric));
        }
    }
    out
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl").arg("-sf").args(args).output().expect("curl");
    assert!(out.status.success(), "curl {args:?} failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn the_scanner_finds_metrics_and_matchers_but_not_functions_labels_or_variables() {
    let found = selectors(
        r#"histogram_quantile(0.99, sum by (api, le) (rate(sluice_check_duration_seconds_bucket{job="$job", api="http"}[$__rate_interval])))
           / on (instance) group_left sum without (rule) (sluice_rule_limit) > bool 1e3 and up{job='x'} offset 5m"#,
    );
    let names: Vec<&str> = found.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(
        names,
        ["sluice_check_duration_seconds_bucket", "sluice_rule_limit", "up"]
    );
    assert_eq!(
        found[0].matchers,
        [
            ("job".into(), "=".into(), "$job".into()),
            ("api".into(), "=".into(), "http".into())
        ]
    );
    let found = selectors(r#"label_values(sluice_build_info{job="$job"}, instance)"#);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].metric, "sluice_build_info");
}

#[test]
fn every_dashboard_and_alert_query_names_a_series_the_node_serves() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let rules = format!("{ROOT}/examples/rules.toml");
    let _node = Child::spawn(
        "sluice-service",
        Command::new(BIN)
            .args(["--listen", &listen, "--rules", &rules])
            .stdout(Stdio::null()),
    );
    wait_for_port(port, Duration::from_secs(20));
    // per-ip admits 5 in 10 s: 7 checks are allowed (two near the limit) and refused.
    for _ in 0..7 {
        curl(&[
            "-XPOST",
            &format!("http://{listen}/v1/check"),
            "-d",
            r#"{"identities": {"ip": "192.0.2.1", "user": "u1", "api_key": "k1"}, "method": "GET", "path": "/api/search"}"#,
        ]);
    }
    let served = parse_scrape(&curl(&[&format!("http://{listen}/metrics")]));
    assert!(
        served.contains_key("sluice_checks_total"),
        "no checks counted: {served:?}"
    );

    let mut found = Vec::new();
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{ROOT}/examples/grafana/sluice.json")).unwrap())
            .expect("the dashboard is JSON");
    queries(&dashboard, "sluice.json", &mut found);
    let alerts: Value =
        serde_norway::from_str(&std::fs::read_to_string(format!("{ROOT}/examples/prometheus/alerts.yml")).unwrap())
            .expect("the alerts are YAML");
    queries(&alerts, "alerts.yml", &mut found);
    // Grafana's variables of type datasource and textbox are not queries of series.
    found.retain(|(_, q)| q != "prometheus" && q != "sluice");
    let alert_count = found.iter().filter(|(at, _)| at.starts_with("alerts.yml")).count();
    assert!(
        found.len() >= 20 && alert_count >= 5,
        "too few queries found: {found:?}"
    );

    let mut wrong = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (at, query) in &found {
        let selectors = selectors(query);
        if selectors.is_empty() {
            wrong.insert(format!("{at}: names no series: {query}"));
        }
        for s in &selectors {
            names.insert(s.metric.clone());
            for p in problems(s, &served) {
                wrong.insert(format!("{at}: {p}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "queries the node cannot answer:\n{}",
        Vec::from_iter(wrong).join("\n")
    );
    eprintln!("{} queries, {} series: {names:?}", found.len(), names.len());
}
