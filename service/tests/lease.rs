//! Leases over HTTP (`POST /v1/lease`) on the memory store and a real Redis: a grant takes
//! from the quota `/v1/check` decides on, a return gives back what the lease did not spend
//! and never more, rules that are not leased are refused by name, and a lease of a windowed
//! rule ends with its window.

mod common;

use std::time::Duration;

use common::TestNode;
use serde_json::{json, Value};
use sluice_service::node::NodeConfig;
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{RedisOptions, RedisStore};
use sluice_service::store::Store;
use sluice_testkit::RedisServer;

const RULES: &str = r#"
[[rule]]
name = "leased"
by = "ip"
algorithm = "fixed_window"
limit = 10
window = "1h"
lease = true
lease_ttl = "30s"

[[rule]]
name = "bucket"
by = "user"
algorithm = "token_bucket"
limit = 10
window = "1h"
lease = true

[[rule]]
name = "exact"
by = "api_key"
algorithm = "gcra"
limit = 10
window = "1h"
"#;

async fn nodes() -> (RedisServer, Vec<TestNode>) {
    let server = RedisServer::start();
    // Patient with Redis (5 s, the node's default is 50 ms): on a loaded machine a slow
    // reply would be a store failure, and these tests are about leases, not failures.
    let patience = Duration::from_secs(5);
    let redis = RedisStore::connect(&server.url(), RedisOptions::new(patience))
        .await
        .expect("redis");
    let memory = TestNode::start(Store::Memory(MemoryStore::new(1_000)), RULES, NodeConfig::default()).await;
    let config = NodeConfig {
        store_timeout: patience,
        ..NodeConfig::default()
    };
    let redis = TestNode::start(Store::Redis(Box::new(redis)), RULES, config).await;
    (server, vec![memory, redis])
}

async fn lease(node: &TestNode, body: Value) -> (u16, Value) {
    let r = node
        .client
        .post(node.url("/v1/lease"))
        .json(&body)
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.json().await.expect("json"))
}

fn ask(rule: &str, identity: &str, want: u64) -> Value {
    json!({"grants": [{"rule": rule, "identity": identity, "want": want}]})
}

fn give(rule: &str, identity: &str, lease: &Value, unspent: u64) -> Value {
    json!({"returns": [{"rule": rule, "identity": identity, "lease": lease, "unspent": unspent}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_takes_from_the_shared_quota_and_a_return_gives_back_what_was_not_spent() {
    let (_server, nodes) = nodes().await;
    for node in &nodes {
        let kind = node.node.store.kind();
        let ip = json!({"ip": "198.51.100.7"});
        let (status, granted) = lease(node, ask("leased", "198.51.100.7", 6)).await;
        assert_eq!(status, 200, "{kind}: {granted}");
        let g = &granted["grants"][0];
        assert_eq!(
            (g["units"].as_u64(), g["remaining"].as_u64()),
            (Some(6), Some(4)),
            "{kind}: {g}"
        );
        assert!(
            g["expires_in_ms"].as_u64().is_some_and(|ms| ms <= 30_000),
            "{kind}: {g}"
        );
        assert_eq!(
            node.admitted(ip.clone(), "/", 5).await,
            4,
            "{kind}: the lease's 6 are taken"
        );
        // The lease spent 2 of its 6: 4 come back, once.
        let id = g["lease"].clone();
        let (_, back) = lease(node, give("leased", "198.51.100.7", &id, 4)).await;
        assert_eq!(back["returned"], json!([4]), "{kind}");
        let (_, again) = lease(node, give("leased", "198.51.100.7", &id, 4)).await;
        assert_eq!(again["returned"], json!([2]), "{kind}: only what the lease still held");
        let (_, forged) = lease(node, give("leased", "198.51.100.7", &json!(12_345), 9)).await;
        assert_eq!(forged["returned"], json!([0]), "{kind}: no such lease");
        assert_eq!(node.admitted(ip.clone(), "/", 8).await, 6, "{kind}: 4 + 2 back");
        // Nothing left: a grant of 0 units, and the checks deny.
        let (_, empty) = lease(node, ask("leased", "198.51.100.7", 3)).await;
        assert_eq!(empty["grants"][0]["units"], 0, "{kind}");
        // 5 calls: 2 grants (one of 0 units), 3 returns taking back 4, 2 and 0.
        let metrics = node.metrics().await;
        for series in [
            "sluice_lease_calls_total 5",
            "sluice_leases_granted_total 2",
            "sluice_lease_units_granted_total 6",
            "sluice_leases_returned_total 3",
            "sluice_lease_units_returned_total 6",
        ] {
            assert!(metrics.lines().any(|l| l == series), "{kind}: no {series} in {metrics}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_the_most_that_is_left_and_leases_shrink_to_it() {
    let (_server, nodes) = nodes().await;
    for node in &nodes {
        let kind = node.node.store.kind();
        let user = json!({"user": "u1"});
        assert_eq!(node.admitted(user.clone(), "/", 7).await, 7, "{kind}");
        let (_, granted) = lease(node, ask("bucket", "u1", 50)).await;
        assert_eq!(granted["grants"][0]["units"], 3, "{kind}: the 3 left of 10");
        assert_eq!(node.admitted(user, "/", 1).await, 0, "{kind}");
        let metrics = node.metrics().await;
        assert!(
            metrics.contains("sluice_lease_units_granted_total 3"),
            "{kind}: {metrics}"
        );
    }
}

/// Issue 51: a grant of nothing is remembered like a check's refusal: the asks and checks
/// of that quota after it cost no store call until the store's wait, and units given back
/// end it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_of_nothing_is_remembered_until_units_come_back() {
    let (server, nodes) = nodes().await;
    let node = &nodes[1];
    let (ip, id) = (json!({"ip": "198.51.100.9"}), "198.51.100.9");
    let (_, all) = lease(node, ask("leased", id, 10)).await;
    assert_eq!(all["grants"][0]["units"], 10, "{all}");
    let (_, empty) = lease(node, ask("leased", id, 1)).await;
    let g = &empty["grants"][0];
    assert_eq!(g["units"], 0, "{g}");
    assert!(g["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{g}");
    let calls = sluice_testkit::script_calls(&[server.port()]);
    for _ in 0..5 {
        let (_, again) = lease(node, ask("leased", id, 3)).await;
        assert_eq!(again["grants"][0]["units"], 0, "{again}");
        assert!(again["grants"][0]["retry_after_ms"].as_u64() > Some(0), "{again}");
    }
    assert_eq!(node.admitted(ip.clone(), "/", 3).await, 0);
    assert_eq!(
        sluice_testkit::script_calls(&[server.port()]),
        calls,
        "no store call while the store would grant nothing"
    );
    // The lease gives 4 back: the next ask is the store's, and has them.
    let (_, back) = lease(node, give("leased", id, &all["grants"][0]["lease"], 4)).await;
    assert_eq!(back["returned"], json!([4]), "{back}");
    let (_, after) = lease(node, ask("leased", id, 3)).await;
    assert_eq!(after["grants"][0]["units"], 3, "{after}");
    assert_eq!(node.admitted(ip, "/", 3).await, 1);
}

#[tokio::test]
async fn rules_that_are_not_leased_and_bad_bodies_are_refused_by_name() {
    let (_server, nodes) = nodes().await;
    for node in &nodes {
        let (status, err) = lease(node, ask("exact", "k", 5)).await;
        assert_eq!(status, 400);
        assert!(
            err["error"]
                .as_str()
                .is_some_and(|e| e.contains("\"exact\" is not a leased rule")),
            "{err}"
        );
        let (status, err) = lease(node, ask("nope", "k", 5)).await;
        assert_eq!(status, 400, "{err}");
        let (status, err) = lease(node, ask("leased", "k", 0)).await;
        assert_eq!(status, 400);
        assert!(err["error"].as_str().is_some_and(|e| e.contains("want 0")), "{err}");
    }
}

#[tokio::test]
async fn a_store_that_cannot_answer_is_a_503_that_says_to_check_exactly() {
    let dead = RedisStore::start(
        &format!("redis://127.0.0.1:{}", sluice_testkit::free_port()),
        RedisOptions::new(Duration::from_millis(50)),
    )
    .expect("a store");
    let node = TestNode::start(Store::Redis(Box::new(dead)), RULES, NodeConfig::default()).await;
    let (status, err) = lease(&node, ask("leased", "1.2.3.4", 5)).await;
    assert_eq!(status, 503);
    assert!(err["error"].as_str().is_some_and(|e| e.contains("/v1/check")), "{err}");
}

/// Proxies read the rules (not the overrides, which name identities) to match leased rules
/// themselves; the version is the ETag, and an unchanged version answers 304.
#[tokio::test]
async fn proxies_read_the_rules_without_overrides() {
    let node = TestNode::start(Store::Memory(MemoryStore::new(100)), RULES, NodeConfig::default()).await;
    let added = node
        .client
        .post(node.url("/v1/admin/overrides"))
        .bearer_auth(common::TOKEN)
        .json(&json!({"rule": "leased", "identity": "secret-key-1", "limit": 99, "until": "2099-01-01T00:00:00Z"}))
        .send()
        .await
        .expect("override");
    assert_eq!(added.status(), 201);
    let r = node.client.get(node.url("/v1/rules")).send().await.expect("rules");
    assert_eq!(r.status(), 200);
    let etag = r.headers()["etag"].to_str().expect("etag").to_owned();
    let text = r.text().await.expect("text");
    assert!(!text.contains("secret-key-1"), "overrides stay on the service: {text}");
    let rules = sluice_core::rules::RuleSet::from_json(&text).expect("the proxy reads them");
    let leased: Vec<&str> = rules
        .rules()
        .iter()
        .filter(|r| r.lease_ttl.is_some())
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(leased, ["leased", "bucket"]);
    let again = node
        .client
        .get(node.url("/v1/rules"))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("rules");
    assert_eq!(again.status(), 304, "unchanged since {etag}");
}
