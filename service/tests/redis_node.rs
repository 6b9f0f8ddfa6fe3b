//! Service nodes over a real Redis: fail open and closed while Redis is down, recovery when
//! it returns, and rules shared between nodes through Redis.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, TestNode, TOKEN};
use serde_json::json;
use sluice_service::node::NodeConfig;
use sluice_service::store::redis::RedisStore;
use sluice_service::store::Store;
use sluice_testkit::RedisServer;

const RULES: &str = r#"
[[rule]]
name = "open-ip"
by = "ip"
algorithm = "token_bucket"
limit = 100
window = "1m"
failure = "open"

[[rule]]
name = "closed-key"
by = "api_key"
algorithm = "fixed_window"
limit = 100
window = "1m"
failure = "closed"
"#;

async fn node(server: &RedisServer) -> TestNode {
    let store = RedisStore::connect(&server.url(), Duration::from_millis(200))
        .await
        .unwrap();
    let config = NodeConfig {
        store_timeout: Duration::from_millis(100),
        breaker_failures: 3,
        breaker_cooldown: Duration::from_millis(200),
        ..NodeConfig::default()
    };
    TestNode::start(Store::Redis(Box::new(store)), RULES, config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_and_closed_while_redis_is_down_then_recover() {
    let mut server = RedisServer::start();
    let n = node(&server).await;
    let r = n.check(json!({"ip": "1.1.1.1"}), "/").await;
    assert_eq!(
        (r["allowed"].clone(), r["degraded"].clone()),
        (json!(true), json!(false))
    );

    server.stop();
    for _ in 0..10 {
        let open = n.check(json!({"ip": "1.1.1.1"}), "/").await;
        assert_eq!(
            (open["allowed"].clone(), open["degraded"].clone()),
            (json!(true), json!(true)),
            "{open}"
        );
        let closed = n.check(json!({"api_key": "k"}), "/").await;
        assert_eq!(
            (closed["allowed"].clone(), closed["degraded"].clone()),
            (json!(false), json!(true)),
            "{closed}"
        );
    }
    let ready = n.client.get(n.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["breaker"], "open", "{body}");
    let metrics = n
        .client
        .get(n.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!metrics.contains("sluice_degraded_total 0"), "{metrics}");

    server.restart();
    let started = Instant::now();
    loop {
        let r = n.check(json!({"api_key": "k"}), "/").await;
        if r["degraded"] == false && r["allowed"] == true {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no recovery: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(n.client.get(n.url("/readyz")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_put_on_one_node_reach_the_other_within_a_second() {
    let server = RedisServer::start();
    let a = node(&server).await;
    let b = node(&server).await;
    let rules = "[[rule]]\nname = \"tiny\"\nby = \"ip\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1h\"\n";
    let r = a
        .client
        .put(a.url("/v1/admin/rules"))
        .bearer_auth(TOKEN)
        .body(rules)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let started = Instant::now();
    loop {
        let r = b.check(json!({"ip": "9.9.9.9"}), "/").await;
        if r["policy"] == "tiny" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "node b still on old rules after 1s: {r}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Shared counters: the one request b admitted is spent for a too.
    assert_eq!(a.check(json!({"ip": "9.9.9.9"}), "/").await["allowed"], false);
    // Violations land in the shared stream (written off the hot path: wait for it).
    eventually("the denial never reached the shared stream", async || {
        !b.violations("9.9.9.9").await.is_empty()
    })
    .await;
    let v = b.violations("9.9.9.9").await;
    assert_eq!(v.len(), 1, "{v:?}");
}
