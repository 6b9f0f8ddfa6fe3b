//! The operator's console, node side (issue 43), over real sockets: each endpoint, the
//! read-only token, rates and the top refused identities under load, explain spending
//! nothing, reset (memory, Redis, Redis Cluster), the security headers, hostile names.

mod common;

use std::time::Duration;

use common::{TestNode, TOKEN};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use sluice_service::node::NodeConfig;
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{RedisOptions, RedisStore};
use sluice_service::store::Store;
use sluice_testkit::{RedisCluster, RedisServer};

const READ_TOKEN: &str = "read-only-token";
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

const RULES: &str = r#"
[[rule]]
name = "per-ip"
by = "ip"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[rule]]
name = "login"
by = "ip"
path = "/login"
methods = ["POST"]
algorithm = "sliding_window_log"
limit = 2
window = "1h"

[[rule]]
name = "<img src=x onerror=alert(1)>"
by = "user"
path = "/hostile"
algorithm = "fixed_window"
limit = 1
window = "1h"
"#;

fn config() -> NodeConfig {
    NodeConfig {
        admin_read_token: Some(READ_TOKEN.into()),
        node_name: "node-a".into(),
        ..NodeConfig::default()
    }
}

async fn node() -> TestNode {
    TestNode::start(Store::Memory(MemoryStore::new(10_000)), RULES, config()).await
}

/// One call to the admin listener: status, headers and the body (JSON, or a string).
async fn call(
    n: &TestNode,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, HeaderMap, Value) {
    let url = format!("http://{}{path}", n.admin_addr);
    let mut req = n.client.request(method.parse().expect("method"), url);
    if let Some(token) = token {
        req = req.bearer_auth(token).header("x-sluice-operator", "alice on call");
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.expect("admin call");
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let text = r.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, body)
}

async fn get(n: &TestNode, path: &str) -> Value {
    let (status, _, body) = call(n, "GET", path, Some(TOKEN), None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

async fn explain(n: &TestNode, body: Value) -> Value {
    let (status, _, answer) = call(n, "POST", "/v1/admin/explain", Some(TOKEN), Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn rule<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["rules"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["rule"] == name || r["name"] == name))
        .unwrap_or_else(|| panic!("no rule {name} in {answer}"))
}

#[tokio::test]
async fn node_status_and_page_answer_with_the_security_headers() {
    let n = node().await;
    let info = get(&n, "/v1/admin/node").await;
    assert_eq!(
        (&info["node"], &info["store"], &info["access"]),
        (&json!("node-a"), &json!("memory"), &json!("admin"))
    );
    assert!(info["now_ms"].as_u64() >= info["started_at_ms"].as_u64(), "{info}");
    let status = get(&n, "/v1/admin/rules/status").await;
    assert_eq!((&status["step_s"], &status["points"]), (&json!(10), &json!(30)));
    assert!(
        status["source"]["kind"].is_string() && status["source"]["at_ms"].is_u64(),
        "{status}"
    );
    let names: Vec<&str> = status["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["per-ip", "login", HOSTILE], "evaluation order");
    let login = rule(&status, "login");
    assert_eq!(login["match"], "POST /login");
    assert_eq!(
        (&login["algorithm"], &login["failure"], &login["by"]),
        (&json!("sliding_window_log"), &json!("open"), &json!("ip"))
    );
    for series in ["allowed", "denied", "shadow_denied", "failure"] {
        assert_eq!(login["rates"][series].as_array().unwrap().len(), 30, "{series}");
    }
    // The page: no token, compiled in; `/` sends there.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirects
        .get(format!("http://{}/", n.admin_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.headers()["location"].to_str().unwrap()),
        (308, "/console/")
    );
    for (path, kind) in [
        ("/console/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let (status, headers, _) = call(&n, "GET", path, None, None).await;
        assert_eq!(status, 200, "{path}");
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind), "{path}");
        assert_eq!(headers["content-security-policy"], sluice_service::admin::CSP, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
    }
    // JSON answers, errors included, carry them too, and are never cached.
    for (path, token, code) in [
        ("/v1/admin/rules/status", Some(TOKEN), 200),
        ("/v1/admin/top", None, 401),
    ] {
        let (status, headers, _) = call(&n, "GET", path, token, None).await;
        assert_eq!(status, code, "{path}");
        assert_eq!(
            headers["content-security-policy"],
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
        );
        assert_eq!(headers["referrer-policy"], "no-referrer");
        assert_eq!(headers["cache-control"], "no-store");
    }
}

#[tokio::test]
async fn the_read_token_reads_and_explains_but_changes_nothing() {
    let n = node().await;
    let (status, _, info) = call(&n, "GET", "/v1/admin/node", Some(READ_TOKEN), None).await;
    assert_eq!((status, &info["access"]), (200, &json!("read")));
    for path in [
        "/v1/admin/rules/status",
        "/v1/admin/top",
        "/v1/admin/overrides",
        "/v1/admin/violations",
        "/v1/admin/rules",
    ] {
        assert_eq!(call(&n, "GET", path, Some(READ_TOKEN), None).await.0, 200, "{path}");
    }
    let (status, _, _) = call(
        &n,
        "POST",
        "/v1/admin/explain",
        Some(READ_TOKEN),
        Some(json!({"path": "/"})),
    )
    .await;
    assert_eq!(status, 200, "explain spends nothing: the read token may");
    let changes = [
        ("PUT", "/v1/admin/rules", None),
        (
            "POST",
            "/v1/admin/overrides",
            Some(json!({"rule": "per-ip", "identity": "1.1.1.1", "limit": 9, "until": "2099-01-01T00:00:00Z"})),
        ),
        ("DELETE", "/v1/admin/overrides?rule=per-ip&identity=1.1.1.1", None),
        (
            "POST",
            "/v1/admin/reset",
            Some(json!({"rule": "per-ip", "identity": "1.1.1.1"})),
        ),
    ];
    for (method, path, body) in changes {
        let (status, _, answer) = call(&n, method, path, Some(READ_TOKEN), body).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("this token is read-only: changing") && error.ends_with("needs the admin token"),
            "{error}"
        );
    }
    assert!(
        get(&n, "/v1/admin/overrides").await["overrides"]
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing added"
    );
    for token in [None, Some("wrong")] {
        assert_eq!(call(&n, "GET", "/v1/admin/node", token, None).await.0, 401);
    }
}

#[tokio::test]
async fn rates_rise_for_the_refusing_rule_only_and_its_top_identity_comes_first() {
    let n = node().await;
    for (ip, times) in [("10.0.0.7", 10), ("10.0.0.8", 4)] {
        n.admitted(json!({"ip": ip}), "/", times).await;
    }
    let status = get(&n, "/v1/admin/rules/status").await;
    let now = |r: &Value, series: &str| r["rates"][series][29].as_f64().unwrap();
    let per_ip = rule(&status, "per-ip");
    assert!(now(per_ip, "denied") > 0.0 && now(per_ip, "allowed") > 0.0, "{per_ip}");
    let login = rule(&status, "login");
    for series in ["allowed", "denied", "shadow_denied", "failure"] {
        assert!(
            login["rates"][series].as_array().unwrap().iter().all(|v| v == 0.0),
            "{login}"
        );
    }
    let top = get(&n, "/v1/admin/top").await;
    assert_eq!(top["capacity"], 16);
    assert_eq!(
        top["rules"].as_array().unwrap().len(),
        1,
        "only the refusing rule: {top}"
    );
    let per_ip = rule(&top, "per-ip");
    assert_eq!(per_ip["refused"], 8);
    assert_eq!(
        per_ip["identities"][0],
        json!({"identity": "10.0.0.7", "refused": 7, "error": 0})
    );
    assert_eq!(per_ip["identities"][1]["identity"], "10.0.0.8");
    let login = get(&n, "/v1/admin/top?rule=login").await;
    assert_eq!(login["rules"][0]["refused"], 0);
    let (status, _, answer) = call(&n, "GET", "/v1/admin/top?rule=nope", Some(TOKEN), None).await;
    assert_eq!(status, 404, "{answer}");
    // The violations log, by rule.
    let v = get(&n, "/v1/admin/violations?rule=per-ip&count=3").await;
    assert_eq!(v["violations"].as_array().unwrap().len(), 3, "{v}");
    assert!(get(&n, "/v1/admin/violations?rule=login").await["violations"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// Explain 10 times: nothing spent; the full quota is still there; once spent, explain
/// says the request would not pass. Over `n`'s store (memory or Redis).
async fn explain_spends_nothing(n: &TestNode, ip: &str) {
    let body = json!({"method": "GET", "path": "/x/../a?q=1", "ip": ip});
    for _ in 0..10 {
        let answer = explain(n, body.clone()).await;
        assert_eq!(answer["would_pass"], true, "{answer}");
        assert_eq!(rule(&answer, "per-ip")["state"]["remaining"], 3, "{answer}");
    }
    let answer = explain(n, body.clone()).await;
    assert_eq!(answer["path"], "/a", "canonical path: {answer}");
    let per_ip = rule(&answer, "per-ip");
    assert_eq!(
        (&per_ip["matches"], &per_ip["limit"], &per_ip["override"]),
        (&json!(true), &json!(3), &json!(false))
    );
    let key = per_ip["key"].as_str().unwrap();
    assert!(
        key.contains(per_ip["identity"].as_str().unwrap()) && key.ends_with(":per-ip"),
        "{key}"
    );
    let login = rule(&answer, "login");
    assert_eq!(
        (&login["matches"], &login["why"], &login["state"]),
        (&json!(false), &json!("method GET is not POST"), &Value::Null)
    );
    assert_eq!(
        n.check(json!({"ip": ip}), "/a").await["remaining"],
        2,
        "the whole quota was left"
    );
    assert_eq!(n.admitted(json!({"ip": ip}), "/a", 3).await, 2);
    let answer = explain(n, body).await;
    assert_eq!(answer["would_pass"], false, "{answer}");
    let state = &rule(&answer, "per-ip")["state"];
    assert_eq!(
        (&state["remaining"], &state["would_pass"]),
        (&json!(0), &json!(false)),
        "{state}"
    );
    assert!(state["retry_after_ms"].as_u64() > Some(0), "{state}");
}

/// Spends an identity's quota of `login` (a sliding log: two keys) and `per-ip`, resets
/// `login`'s, and finds it whole again while `per-ip`'s stays spent.
async fn reset_restores_the_quota(n: &TestNode, ip: &str) {
    let login = json!({"identities": {"ip": ip}, "method": "POST", "path": "/login"});
    for _ in 0..2 {
        assert_eq!(n.check_body(login.clone()).await["allowed"], true);
    }
    assert_eq!(n.check_body(login.clone()).await["allowed"], false);
    let (status, _, answer) = call(
        n,
        "POST",
        "/v1/admin/reset",
        Some(TOKEN),
        Some(json!({"rule": "login", "identity": ip})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"status": "ok", "rule": "login", "identity": ip}));
    let again = n.check_body(login.clone()).await;
    assert_eq!(again["allowed"], true, "reset: {again}");
    assert_eq!(
        again["rules"][1]["remaining"], 1,
        "login whole again, less this request: {again}"
    );
    assert_eq!(again["rules"][0]["remaining"], 0, "per-ip untouched: {again}");
    let (status, _, _) = call(
        n,
        "POST",
        "/v1/admin/reset",
        Some(TOKEN),
        Some(json!({"rule": "nope", "identity": ip})),
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn explain_spends_nothing_and_reset_restores_the_quota_in_memory() {
    let n = node().await;
    explain_spends_nothing(&n, "203.0.113.9").await;
    reset_restores_the_quota(&n, "203.0.113.10").await;
    let answer = explain(
        &n,
        json!({"path": "/", "ip": "2001:db8::1", "identities": {"user": "alice"}}),
    )
    .await;
    assert_eq!(
        answer["identities"],
        json!({"ip": "2001:db8::/64", "user": "alice"}),
        "IPv6 grouped"
    );
    let (status, _, answer) = call(
        &n,
        "POST",
        "/v1/admin/explain",
        Some(TOKEN),
        Some(json!({"method": "GET"})),
    )
    .await;
    assert_eq!(status, 400, "no path: {answer}");
}

async fn redis_node(url: &str) -> TestNode {
    let store = RedisStore::connect(url, RedisOptions::new(Duration::from_millis(500)))
        .await
        .expect("redis");
    let config = NodeConfig {
        store_timeout: Duration::from_millis(500),
        ..config()
    };
    TestNode::start(Store::Redis(Box::new(store)), RULES, config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_and_reset_act_on_redis_and_a_cluster() {
    let server = RedisServer::start();
    let n = redis_node(&server.url()).await;
    assert_eq!(get(&n, "/v1/admin/node").await["store"], "redis");
    explain_spends_nothing(&n, "198.51.100.1").await;
    reset_restores_the_quota(&n, "198.51.100.2").await;
    // Both keys of the sliding log are gone (the log left behind would later take its
    // entries off a count that no longer holds them).
    let keys = ["sluice:{198.51.100.2}:login:log", "sluice:{198.51.100.2}:login:logm"];
    assert_eq!(
        server.cli(&["EXISTS", keys[0], keys[1]]).trim(),
        "2",
        "one request since the reset"
    );
    let body = json!({"rule": "login", "identity": "198.51.100.2"});
    assert_eq!(
        call(&n, "POST", "/v1/admin/reset", Some(TOKEN), Some(body)).await.0,
        200
    );
    assert_eq!(server.cli(&["EXISTS", keys[0], keys[1]]).trim(), "0");
    let cluster = RedisCluster::start(3, 0);
    let n = redis_node(&cluster.url()).await;
    assert_eq!(get(&n, "/v1/admin/node").await["store"], "redis-cluster");
    explain_spends_nothing(&n, "198.51.100.3").await;
    reset_restores_the_quota(&n, "198.51.100.4").await;
}

#[tokio::test]
async fn overrides_are_listed_and_their_errors_name_the_field() {
    let n = node().await;
    let add = |body: Value| call(&n, "POST", "/v1/admin/overrides", Some(TOKEN), Some(body));
    let good = json!({"rule": "per-ip", "identity": "1.2.3.4", "limit": 10, "until": "2099-01-01T00:00:00Z"});
    assert_eq!(add(good.clone()).await.0, 201);
    let list = get(&n, "/v1/admin/overrides").await;
    assert_eq!(
        list["overrides"],
        json!([{"rule": "per-ip", "identity": "1.2.3.4", "limit": 10, "until": "2099-01-01T00:00:00Z", "until_ms": 4_070_908_800_000u64}])
    );
    let explained = explain(&n, json!({"path": "/", "ip": "1.2.3.4"})).await;
    assert_eq!(
        (
            &rule(&explained, "per-ip")["limit"],
            &rule(&explained, "per-ip")["override"]
        ),
        (&json!(10), &json!(true))
    );
    for (field, value) in [
        ("rule", json!("nope")),
        ("until", json!("tomorrow")),
        ("limit", json!(-1)),
        ("identity", json!("")),
    ] {
        let mut bad = good.clone();
        bad[field] = value;
        let (status, _, answer) = add(bad).await;
        assert_eq!((status, &answer["field"]), (400, &json!(field)), "{answer}");
        assert!(answer["error"].is_string());
    }
    let mut extra = good.clone();
    extra["colour"] = json!("red");
    assert_eq!(add(extra).await.2["field"], "colour");
}

#[tokio::test]
async fn hostile_names_and_identities_come_back_as_data() {
    let n = node().await;
    let who = "<script>alert('x')</script>\"&";
    assert_eq!(n.admitted(json!({"user": who}), "/hostile", 3).await, 1);
    let top = get(&n, &format!("/v1/admin/top?rule={}", urlencode(HOSTILE))).await;
    assert_eq!(top["rules"][0]["rule"], HOSTILE);
    assert_eq!(top["rules"][0]["identities"][0]["identity"], who);
    let v = get(&n, &format!("/v1/admin/violations?rule={}", urlencode(HOSTILE))).await;
    assert_eq!(v["violations"][0]["identity"], who, "{v}");
    let status = get(&n, "/v1/admin/rules/status").await;
    assert!(rule(&status, HOSTILE)["rates"]["denied"][29].as_f64() > Some(0.0));
    let explained = explain(&n, json!({"path": "/hostile", "identities": {"user": who}})).await;
    assert_eq!(rule(&explained, HOSTILE)["identity"], who);
    let body = json!({"rule": HOSTILE, "identity": who});
    let (status, _, answer) = call(&n, "POST", "/v1/admin/reset", Some(TOKEN), Some(body.clone())).await;
    assert_eq!(
        (status, answer["rule"].as_str(), answer["identity"].as_str()),
        (200, Some(HOSTILE), Some(who))
    );
    assert_eq!(n.check(json!({"user": who}), "/hostile").await["allowed"], true);
}

/// `s` percent-encoded for a query value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test]
async fn a_concurrency_rule_is_explained_as_slots_held_not_a_window() {
    const SLOTS: &str = r#"
[[rule]]
name = "in-flight"
by = "user"
algorithm = "concurrency"
limit = 2
window = "5s"
"#;
    let n = TestNode::start(Store::Memory(MemoryStore::new(1_000)), SLOTS, config()).await;
    let body = json!({"path": "/gen", "identities": {"user": "alice"}});
    let free = |answer: &Value| rule(answer, "in-flight")["state"]["remaining"].clone();
    let answer = explain(&n, body.clone()).await;
    let explained = rule(&answer, "in-flight");
    assert_eq!(explained["algorithm"], "concurrency", "{answer}");
    assert!(
        explained["why"]
            .as_str()
            .is_some_and(|w| w.contains("requests in flight")),
        "{answer}"
    );
    assert_eq!(free(&answer), 2, "both slots free: {answer}");
    assert_eq!(n.check(json!({"user": "alice"}), "/gen").await["allowed"], true);
    assert_eq!(free(&explain(&n, body.clone()).await), 1, "one held, explain took none");
    assert_eq!(free(&explain(&n, body).await), 1);
}
