//! The service over HTTP with the memory store: check semantics, bad input, admin API,
//! reloads and metrics.

mod common;

use std::time::{Instant, SystemTime};

use common::{eventually, TestNode, TOKEN};
use serde_json::json;
use sluice_service::node::NodeConfig;
use sluice_service::rules_source;
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::Store;
use sluice_testkit::ScratchDir;

const RULES: &str = r#"
[[rule]]
name = "per-ip"
by = "ip"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[rule]]
name = "per-user"
by = "user"
algorithm = "sliding_window_log"
limit = 2
window = "1h"

[[rule]]
name = "shadow-global"
by = "global"
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true

[[rule]]
name = "uploads"
by = "user"
path = "/upload*"
algorithm = "leaky_bucket"
limit = 10
window = "1s"
burst = 1
shaping = true
max_delay = "1s"
"#;

async fn node() -> TestNode {
    TestNode::start(Store::Memory(MemoryStore::new(10_000)), RULES, NodeConfig::default()).await
}

#[tokio::test]
async fn every_rule_must_allow_and_a_denial_consumes_nothing() {
    let n = node().await;
    // The user rule (2) denies the third request; the IP rule (3) must not have been charged.
    assert_eq!(n.admitted(json!({"ip": "1.1.1.1", "user": "u"}), "/a", 4).await, 2);
    let r = n.check(json!({"ip": "1.1.1.1"}), "/a").await;
    assert_eq!(r["allowed"], true);
    assert_eq!(
        r["rules"][0]["remaining"], 0,
        "ip rule charged for the two admitted requests only: {r}"
    );
    let denied = n.check(json!({"ip": "1.1.1.1", "user": "other"}), "/a").await;
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["policy"], "per-ip");
    assert!(denied["retry_after_ms"].as_u64().unwrap() > 0);
}

/// `Prefer: return=minimal` (RFC 7240, what the filter sends) leaves out each rule's own
/// result and says so; the headline is the same answer's, and a client that does not ask
/// gets every rule's.
#[tokio::test]
async fn a_check_that_prefers_a_minimal_return_gets_the_answer_without_its_rules() {
    let n = node().await;
    let body = json!({"identities": {"ip": "7.7.7.7", "user": "m"}, "method": "GET", "path": "/a"});
    for prefer in ["return=minimal", "respond-async, RETURN = minimal; x=1"] {
        let r = n
            .client
            .post(n.url("/v1/check"))
            .header("prefer", prefer)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let applied = r
            .headers()
            .get("preference-applied")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(applied.as_deref(), Some("return=minimal"), "{prefer}");
        let brief: serde_json::Value = r.json().await.unwrap();
        assert_eq!(brief["rules"], json!([]), "{prefer}: {brief}");
        assert_eq!(
            (brief["allowed"].clone(), brief["policy"].clone()),
            (json!(true), json!("per-user")),
            "{brief}"
        );
    }
    let r = n
        .client
        .post(n.url("/v1/check"))
        .header("prefer", "return=representation")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("preference-applied").is_none());
    let whole: serde_json::Value = r.json().await.unwrap();
    assert_eq!(whole["rules"].as_array().map(Vec::len), Some(3), "{whole}");
}

#[tokio::test]
async fn shadow_rules_count_but_never_deny() {
    let n = node().await;
    assert_eq!(n.admitted(json!({"ip": "2.2.2.2"}), "/a", 3).await, 3);
    let text = n.metrics().await;
    assert!(
        text.contains(r#"sluice_checks_total{rule="shadow-global",decision="shadow_denied"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"sluice_checks_total{rule="per-ip",decision="allowed"} 3"#),
        "{text}"
    );
    for name in [
        "sluice_store_latency_seconds_bucket",
        "sluice_store_errors_total",
        "sluice_degraded_total",
        "sluice_rules_reloads_total",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
}

/// The value of the series `series` (its name and labels as written) in `text`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The operator's signals follow the checks (near the limit, latency) and the rules in
/// force (limits, version, load time), on a real node's `/metrics`.
#[tokio::test]
async fn metrics_follow_checks_near_the_limit_and_rule_reloads() {
    let n = node().await;
    let text = n.metrics().await;
    assert_eq!(value(&text, r#"sluice_rule_limit{rule="per-ip"}"#), Some(3.0), "{text}");
    assert_eq!(
        value(&text, r#"sluice_rule_period_seconds{rule="per-ip"}"#),
        Some(3600.0)
    );
    assert_eq!(value(&text, r#"sluice_rule_limit{rule="uploads"}"#), Some(10.0));
    let version = value(&text, "sluice_rules_version").expect("a version");
    let loaded = value(&text, "sluice_rules_loaded_timestamp_seconds").expect("a load time");
    assert!(text.contains(&format!("sluice_build_info{{version=\"{}\"", env!("CARGO_PKG_VERSION"))));
    // per-ip admits 3 an hour: 2 then 1 left is more than a fifth, 0 left is not.
    let near = r#"sluice_checks_near_limit_total{rule="per-ip"}"#;
    let ip = json!({"ip": "7.7.7.7"});
    assert_eq!(n.admitted(ip.clone(), "/a", 2).await, 2);
    assert_eq!(value(&n.metrics().await, near), Some(0.0));
    assert_eq!(n.admitted(ip.clone(), "/a", 1).await, 1);
    assert_eq!(value(&n.metrics().await, near), Some(1.0));
    assert_eq!(
        n.admitted(ip.clone(), "/a", 1).await,
        0,
        "a denial is not near the limit"
    );
    let text = n.metrics().await;
    assert_eq!(value(&text, near), Some(1.0));
    let latency = |api: &str| format!(r#"sluice_check_duration_seconds_count{{api="{api}"}}"#);
    assert_eq!(value(&text, &latency("http")), Some(4.0), "{text}");
    assert_eq!(value(&text, &latency("grpc_rls")), Some(0.0));
    // A reload: the changed limit shows, the removed rules' series go.
    let rules = "[[rule]]\nname = \"per-ip\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n";
    assert_eq!(n.put_rules(rules.into(), None).await.status(), 200);
    let text = n.metrics().await;
    assert_eq!(value(&text, r#"sluice_rule_limit{rule="per-ip"}"#), Some(5.0), "{text}");
    assert_eq!(value(&text, r#"sluice_rule_period_seconds{rule="per-ip"}"#), Some(60.0));
    assert!(!text.contains(r#"sluice_rule_limit{rule="uploads"}"#), "{text}");
    assert_eq!(value(&text, "sluice_rules_version"), Some(version + 1.0));
    assert!(value(&text, "sluice_rules_loaded_timestamp_seconds").is_some_and(|t| t > loaded));
}

#[tokio::test]
async fn shaping_rules_return_a_delay() {
    let n = node().await;
    let body = |user: &str| json!({"identities": {"user": user}, "method": "POST", "path": "/upload/x"});
    let started = Instant::now();
    let first = n.check_body(body("s")).await;
    let second = n.check_body(body("s")).await;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    assert_eq!(
        (first["allowed"].clone(), first["delay_ms"].clone()),
        (json!(true), json!(0))
    );
    assert_eq!(second["allowed"], true);
    // 10 per second with a burst of 1: the second request is due 100 ms after the first,
    // less the time that passed between the two (at most what this test measured).
    let delay = second["delay_ms"].as_u64().unwrap();
    assert!(
        delay <= 100 && delay + elapsed_ms + 1 >= 100,
        "delay {delay} ms, {elapsed_ms} ms after the first request"
    );
}

#[tokio::test]
async fn a_peek_spends_nothing_and_a_debit_spends_a_cost_learnt_afterwards() {
    let store = Store::Memory(MemoryStore::new(10_000));
    TestNode::start(store, common::TOKEN_BUDGET_RULES, NodeConfig::default())
        .await
        .peek_and_debit()
        .await;
}

#[tokio::test]
async fn no_matching_rule_allows_without_policy() {
    let n = node().await;
    let r = n
        .check_body(json!({"identities": {}, "method": "GET", "path": "/"}))
        .await;
    assert_eq!(r["allowed"], true);
    assert!(r.get("policy").is_none() || r["policy"].is_null());
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_the_problem() {
    let n = node().await;
    let post = |body: String| n.client.post(n.url("/v1/check")).body(body).send();
    let cases = [
        ("{not json".to_owned(), 400, "invalid check request"),
        (
            r#"{"identities":{},"method":"GET","path":"/","bogus":1}"#.to_owned(),
            400,
            "unknown field `bogus`",
        ),
        (
            r#"{"identities":{},"method":"GET","path":"/","cost":99999999999}"#.to_owned(),
            400,
            "out of range",
        ),
        (
            format!(
                r#"{{"identities":{{"ip":"{}"}},"method":"GET","path":"/"}}"#,
                "x".repeat(300)
            ),
            400,
            "300 bytes",
        ),
        ("x".repeat(20_000), 413, "larger than"),
    ];
    for (body, status, want) in cases {
        let r = post(body).await.unwrap();
        assert_eq!(r.status(), status);
        let err: serde_json::Value = r.json().await.unwrap();
        assert!(err["error"].as_str().unwrap().contains(want), "{err} lacks {want}");
    }
    let r = n.client.get(n.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = n.client.get(n.url("/v1/check")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.json::<serde_json::Value>().await.unwrap()["error"].is_string());
}

#[tokio::test]
async fn wait_holds_its_answer_for_the_time_asked_and_refuses_what_it_cannot_serve() {
    let n = node().await;
    let started = Instant::now();
    let r = n.client.get(n.url("/v1/wait?ms=80")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        started.elapsed().as_millis() >= 80,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["waited_ms"], 80);
    for (query, want) in [
        ("", "ms is missing"),
        ("?ms=soon", "\"soon\" is not a whole number"),
        ("?ms=-1", "is not a whole number"),
        ("?ms=60001", "longer than the longest wait"),
    ] {
        let r = n.client.get(n.url(&format!("/v1/wait{query}"))).send().await.unwrap();
        assert_eq!(r.status(), 400, "{query}");
        let err: serde_json::Value = r.json().await.unwrap();
        assert!(
            err["error"].as_str().unwrap().contains(want),
            "{query}: {err} lacks {want}"
        );
    }
}

#[tokio::test]
async fn admin_api_needs_the_token() {
    let n = node().await;
    for auth in [None, Some("Bearer wrong"), Some("s3cret-token")] {
        let mut req = n.client.get(n.url("/v1/admin/rules"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        assert_eq!(req.send().await.unwrap().status(), 401, "{auth:?}");
    }
    let ok = n
        .client
        .get(n.url("/v1/admin/rules"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert!(ok.text().await.unwrap().contains("name = \"per-ip\""));
    // Every admin endpoint and method, before anything is read: 401 without the token,
    // and nothing changed.
    for (method, path) in [
        ("PUT", "/v1/admin/rules"),
        ("POST", "/v1/admin/overrides"),
        ("DELETE", "/v1/admin/overrides?rule=per-ip&identity=1.1.1.1"),
        ("GET", "/v1/admin/violations"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = n
            .client
            .request(method.clone(), n.url(path))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path}");
    }
    let rules = n.admin_get("/v1/admin/rules").await.text().await.unwrap();
    assert!(rules.contains("name = \"per-ip\""), "{rules}");
}

#[tokio::test]
async fn admin_rules_put_takes_effect_and_bad_rules_are_refused() {
    let n = node().await;
    let put = |body: &'static str| {
        n.client
            .put(n.url("/v1/admin/rules"))
            .bearer_auth(TOKEN)
            .body(body)
            .send()
    };
    let r = put("[[rule]]\nname = \"x\"\nby = \"ip\"\nalgorithm = \"nope\"\nlimit = 1\nwindow = \"1s\"\n")
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("field algorithm"));
    assert_eq!(n.admitted(json!({"ip": "3.3.3.3"}), "/", 4).await, 3, "old rules kept");
    let r = put("[[rule]]\nname = \"one\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\n")
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(n.admitted(json!({"ip": "4.4.4.4"}), "/", 3).await, 1);
}

#[tokio::test]
async fn overrides_apply_and_expire_on_time() {
    let n = node().await;
    let add = |identity: &str, until_ms: u64| {
        let until = sluice_core::rules::format_rfc3339(until_ms);
        let body = json!({"rule": "per-ip", "identity": identity, "limit": 10, "until": until});
        n.client
            .post(n.url("/v1/admin/overrides"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    assert_eq!(add("5.5.5.5", now_ms() + 3_600_000).await.unwrap().status(), 201);
    let r = n.check(json!({"ip": "5.5.5.5"}), "/").await;
    assert_eq!(r["rules"][0]["limit"], 10, "override not applied: {r}");

    // An override ending soon: each answer must agree with the test's clock around it (the
    // node reads the same wall clock), however slowly this machine runs.
    let until = now_ms() + 1_500;
    assert_eq!(add("5.5.5.6", until).await.unwrap().status(), 201);
    eventually("the override never ended", async || {
        let before = now_ms();
        let r = n.check(json!({"ip": "5.5.5.6"}), "/").await;
        let after = now_ms();
        match r["rules"][0]["limit"].as_u64() {
            Some(10) => assert!(before < until, "override still in force after its end: {r}"),
            Some(3) => assert!(after >= until, "override ended early: {r}"),
            _ => panic!("unexpected answer {r}"),
        }
        r["rules"][0]["limit"] == 3
    })
    .await;

    let bad = json!({"rule": "nope", "identity": "1", "limit": 1, "until": sluice_core::rules::format_rfc3339(until)});
    let r = n
        .client
        .post(n.url("/v1/admin/overrides"))
        .bearer_auth(TOKEN)
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = n
        .client
        .delete(n.url("/v1/admin/overrides?rule=per-ip&identity=5.5.5.5"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = n.check(json!({"ip": "5.5.5.5"}), "/").await;
    assert_eq!(r["rules"][0]["limit"], 3, "deleted override still applied: {r}");
}

#[tokio::test]
async fn violations_are_logged_off_the_hot_path() {
    let n = node().await;
    n.admitted(json!({"ip": "6.6.6.6"}), "/v", 5).await;
    eventually("two denials never logged", async || {
        n.violations("6.6.6.6").await.len() >= 2
    })
    .await;
    let list = n.violations("6.6.6.6").await;
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["rule"], "per-ip");
    assert_eq!(list[0]["path"], "/v");
}

/// Rule file text naming its rule after `limit`; limits of the same digit count give
/// files of the same length.
fn rule_file(limit: u32) -> String {
    format!(
        "[[rule]]\nname = \"r{limit}\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n"
    )
}

#[tokio::test]
async fn a_rule_file_edit_keeping_length_and_mtime_is_reloaded() {
    let dir = ScratchDir::new("same-length");
    let file = dir.join("rules.toml");
    std::fs::write(&file, rule_file(1)).unwrap();
    let n = TestNode::start(
        Store::Memory(MemoryStore::new(100)),
        &rule_file(1),
        NodeConfig::default(),
    )
    .await;
    let (_, seen) = rules_source::load_file(&file).unwrap();
    tokio::spawn(rules_source::watch_file(n.node.clone(), file.clone(), seen));
    let rule_in_force = || n.node.rules().rules()[0].name.clone();
    // A change of length shows the watcher is running.
    std::fs::write(&file, rule_file(22)).unwrap();
    eventually("a change of length not picked up", async || rule_in_force() == "r22").await;

    // Same length, same mtime, other content; renamed into place so the watcher never sees
    // the new file with another mtime.
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    let next = dir.join("next.toml");
    std::fs::write(&next, rule_file(33)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&next)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::rename(&next, &file).unwrap();
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.modified().unwrap(), meta.len()),
        (mtime, rule_file(22).len() as u64)
    );
    eventually("a same-length, same-mtime edit not picked up", async || {
        rule_in_force() == "r33"
    })
    .await;
}

/// Issue 40: an empty rules file (a truncated write, a ConfigMap not mounted yet) or a
/// deleted one does not turn every limit off: the rules in force stay, and the next good
/// file is taken; with `allow_empty_rules` an empty file is taken as it is.
#[tokio::test]
async fn an_empty_or_deleted_rule_file_keeps_the_rules_in_force() {
    for allow_empty in [false, true] {
        let dir = ScratchDir::new("empty-rules");
        let file = dir.join("rules.toml");
        std::fs::write(&file, rule_file(1)).unwrap();
        let config = NodeConfig {
            allow_empty_rules: allow_empty,
            ..NodeConfig::default()
        };
        let n = TestNode::start(Store::Memory(MemoryStore::new(100)), &rule_file(1), config).await;
        let (_, seen) = rules_source::load_file(&file).unwrap();
        tokio::spawn(rules_source::watch_file(n.node.clone(), file.clone(), seen));
        let names = || {
            n.node
                .rules()
                .rules()
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        };
        std::fs::write(&file, "# nothing yet\n").unwrap();
        if allow_empty {
            eventually("an allowed empty file not taken", async || names().is_empty()).await;
            continue;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1_200)).await; // two looks at it
        assert_eq!(names(), ["r1"], "an empty file turned every limit off");
        std::fs::remove_file(&file).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
        assert_eq!(names(), ["r1"], "an empty, then deleted, file changed the rules");
        std::fs::write(&file, rule_file(2)).unwrap();
        eventually("the next good file not taken", async || names() == ["r2"]).await;
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn overrides_are_removed_once_they_end() {
    let n = node().await;
    let until = sluice_core::rules::format_rfc3339(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + 1_500,
    );
    let r = n
        .client
        .post(n.url("/v1/admin/overrides"))
        .bearer_auth(TOKEN)
        .json(&json!({"rule": "per-ip", "identity": "7.7.7.7", "limit": 50, "until": until}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(n.node.rules().overrides().count(), 1);
    eventually("the ended override is still there", async || {
        n.node.rules().overrides().count() == 0
    })
    .await;
    let text = n.admin_get("/v1/admin/rules").await.text().await.unwrap();
    assert!(!text.contains("7.7.7.7"), "{text}");
}

/// Issue 40: over the check API, a rule naming `hosts` limits the requests that name one
/// of them (`host`, port and case ignored); a request without `host` (an older client)
/// meets only the rules naming none; a bad host is a 400 naming it.
#[tokio::test]
async fn a_rule_naming_hosts_limits_only_requests_to_them() {
    let rules = "[[rule]]\nname = \"api-host\"\nby = \"ip\"\nhosts = [\"api.example.com\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n";
    let n = TestNode::start(Store::Memory(MemoryStore::new(100)), rules, NodeConfig::default()).await;
    let ask = |host: Option<&str>| {
        let mut body = json!({"identities": {"ip": "7.7.7.7"}, "method": "GET", "path": "/"});
        if let Some(h) = host {
            body["host"] = json!(h);
        }
        n.check_body(body)
    };
    assert_eq!(ask(Some("API.example.com:443")).await["allowed"], true);
    assert_eq!(
        ask(Some("api.example.com")).await["allowed"],
        false,
        "the host's limit is 1"
    );
    for other in [None, Some("www.example.com")] {
        let r = ask(other).await;
        assert_eq!(
            (&r["allowed"], &r["rules"]),
            (&json!(true), &json!([])),
            "{other:?}: {r}"
        );
    }
    let bad = n
        .client
        .post(n.url("/v1/check"))
        .json(&json!({"identities": {}, "method": "GET", "path": "/", "host": "a b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("host `a b`"));
}

const SLOT_RULES: &str = r#"
[[rule]]
name = "in-flight"
by = "user"
algorithm = "concurrency"
limit = 2
window = "1h"
"#;

/// A node of [`SLOT_RULES`] over memory.
async fn slot_node() -> TestNode {
    TestNode::start(
        Store::Memory(MemoryStore::new(1_000)),
        SLOT_RULES,
        NodeConfig::default(),
    )
    .await
}

/// POSTs `body` to `/v1/slots`: its status and JSON answer.
async fn slots_call(n: &TestNode, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = n
        .client
        .post(n.url("/v1/slots"))
        .json(&body)
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.json().await.expect("json"))
}

#[tokio::test]
async fn a_batch_gives_back_several_requests_slots_in_one_call_each_only_by_its_identity() {
    let n = slot_node().await;
    let alice = json!({"user": "alice"});
    let mut slots = Vec::new();
    for _ in 0..2 {
        let answer = n.check(alice.clone(), "/gen").await;
        slots.push(answer["slots"].clone());
    }
    assert_eq!(n.check(alice.clone(), "/gen").await["allowed"], false, "both held");
    let entry = |who: &serde_json::Value, slots: &serde_json::Value| json!({"request": {"identities": who, "method": "GET", "path": "/gen"}, "slots": slots});
    let batch = json!({"batch": [
        entry(&alice, &slots[0]),
        entry(&json!({"user": "mallory"}), &slots[1]),
        entry(&alice, &slots[1]),
    ]});
    let (status, answer) = slots_call(&n, batch).await;
    assert_eq!(status, 200, "{answer}");
    let found: Vec<Option<u64>> = (0..3).map(|i| answer["batch"][i]["found"].as_u64()).collect();
    assert_eq!(found, [Some(1), Some(0), Some(1)], "mallory frees nothing: {answer}");
    for _ in 0..2 {
        assert_eq!(n.check(alice.clone(), "/gen").await["allowed"], true, "both given back");
    }
    // A tick's releases: more than a check's body limit (16 KiB) in one call.
    let many: Vec<serde_json::Value> = (0..200)
        .map(|i| entry(&json!({"user": format!("u{i:0>200}")}), &slots[0]))
        .collect();
    let (status, answer) = slots_call(&n, json!({ "batch": many })).await;
    assert_eq!(status, 200, "a batch of 200: {answer}");
    let (status, bad) = slots_call(&n, json!({"batch": [entry(&alice, &slots[0]), {"slots": []}]})).await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"].as_str().is_some_and(|e| e.contains("batch[1]")), "{bad}");
}

#[tokio::test]
async fn a_concurrency_slot_is_named_given_back_once_and_only_by_its_identity() {
    let n = slot_node().await;
    let alice = json!({"user": "alice"});
    let first = n.check(alice.clone(), "/gen").await;
    let slot = first["slots"][0].clone();
    assert_eq!(
        (slot["rule"].as_str(), slot["window_ms"].as_u64()),
        (Some("in-flight"), Some(3_600_000)),
        "{first}"
    );
    assert_eq!(
        first["window_ms"].as_u64(),
        Some(0),
        "a limit on requests at once has no window for the headers: {first}"
    );
    assert!(n.check(alice.clone(), "/gen").await["allowed"] == true);
    let refused = n.check(alice.clone(), "/gen").await;
    assert_eq!(
        (refused["allowed"].as_bool(), refused["retry_after_ms"].as_u64()),
        (Some(false), Some(1_000))
    );
    assert!(refused.get("slots").is_none(), "a refusal holds nothing: {refused}");
    let named = json!([{"rule": "in-flight", "at": slot["at"]}]);
    let request = |who: &serde_json::Value| json!({"identities": who, "method": "GET", "path": "/gen"});
    // Another identity naming alice's slot frees nothing of hers.
    let (status, answer) = slots_call(
        &n,
        json!({"request": request(&json!({"user": "mallory"})), "slots": named}),
    )
    .await;
    assert_eq!((status, answer["found"].as_u64()), (200, Some(0)), "{answer}");
    assert_eq!(n.check(alice.clone(), "/gen").await["allowed"], false);
    // Renewed: the slot moves to a new time, which names it from then on.
    let (status, renewed) = slots_call(&n, json!({"request": request(&alice), "slots": named, "renew": true})).await;
    assert_eq!((status, renewed["found"].as_u64()), (200, Some(1)), "{renewed}");
    let moved = json!([{"rule": "in-flight", "at": renewed["slots"][0]["at"]}]);
    let (_, stale) = slots_call(&n, json!({"request": request(&alice), "slots": named})).await;
    assert_eq!(stale["found"].as_u64(), Some(0), "the old name is gone: {stale}");
    let (_, released) = slots_call(&n, json!({"request": request(&alice), "slots": moved})).await;
    assert_eq!(released["found"].as_u64(), Some(1), "{released}");
    let (_, twice) = slots_call(&n, json!({"request": request(&alice), "slots": moved})).await;
    assert_eq!(
        twice["found"].as_u64(),
        Some(0),
        "given back twice frees nothing more: {twice}"
    );
    let again = n.check(alice.clone(), "/gen").await;
    assert_eq!(again["allowed"], true, "the slot came back: {again}");
    assert_eq!(
        n.check(alice.clone(), "/gen").await["allowed"],
        false,
        "and only the one"
    );
    // A body that is not one names what is wrong; never a 500.
    let (status, bad) = slots_call(&n, json!({"request": request(&alice)})).await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"].as_str().is_some_and(|e| e.contains("slots")), "{bad}");
    let metrics = n.metrics().await;
    for line in [
        "sluice_slots_taken_total 3",
        "sluice_slots_released_total 1",
        "sluice_slots_renewed_total 1",
        "sluice_slots_not_found_total 3",
    ] {
        assert!(metrics.contains(line), "{line} missing from {metrics}");
    }
}
