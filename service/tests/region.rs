//! A node in a region, in process, over a real global Redis (or Redis Cluster): global rules
//! are decided from the quota the node leases, all-or-nothing with the regional rules of the
//! same request.

mod common;

use std::time::Duration;

use common::{eventually, TestNode};
use serde_json::json;
use sluice_service::node::NodeConfig;
use sluice_service::region::{Region, RegionConfig};
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{RedisOptions, RedisStore};
use sluice_service::store::Store;
use sluice_testkit::{RedisCluster, RedisServer};

const RULES: &str = r#"
[[rule]]
name      = "tenant"
by        = "user"
algorithm = "fixed_window"
limit     = 10
window    = "1d"
global    = true

[[rule]]
name      = "tight"
by        = "user"
path      = "/tight"
algorithm = "fixed_window"
limit     = 3
window    = "1d"
"#;

async fn region_node(global_url: &str) -> TestNode {
    let patience = Duration::from_secs(5);
    let global = RedisStore::connect(global_url, RedisOptions::new(patience))
        .await
        .expect("global redis");
    let region = Region::new(Store::Redis(Box::new(global)), RegionConfig::default());
    TestNode::start_in_region(
        Store::Memory(MemoryStore::new(1_000)),
        RULES,
        NodeConfig::default(),
        Some(region),
    )
    .await
}

/// Ten a day across regions (a day: an hour's window once ended mid-test, at 02:00, and
/// refilled the quota); three of them on `/tight`. The seven requests `/tight`
/// refuses take nothing from the global quota, whose units went back into the node's lease,
/// so `/other` gets exactly the seven left — and not one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_regional_rule_refuses_takes_nothing_from_the_global_quota() {
    let global = RedisServer::start();
    regional_refusals_take_nothing(&global.url()).await;
}

/// The same with a Redis Cluster as the global store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_can_be_the_global_store() {
    let global = RedisCluster::start(3, 0);
    regional_refusals_take_nothing(&global.url()).await;
}

async fn regional_refusals_take_nothing(global_url: &str) {
    let node = region_node(global_url).await;
    let user = json!({"user": "u"});
    let mut tight = 0;
    eventually("/tight admits its 3 once the pool fills", async || {
        tight += usize::from(node.check(user.clone(), "/tight").await["allowed"] == true);
        tight == 3
    })
    .await;
    for _ in 0..7 {
        // Refused by /tight once the global rule admitted it (a check while the pool is
        // empty is refused by the global rule and counts for neither).
        eventually("the global rule admits a /tight request", async || {
            let answer = node.check(user.clone(), "/tight").await;
            assert_eq!(answer["allowed"], false, "/tight is spent: {answer}");
            let rules = answer["rules"].as_array().expect("rules");
            rules.iter().any(|r| r["name"] == "tenant" && r["allowed"] == true)
        })
        .await;
    }
    let mut other = 0;
    eventually("/other gets the 7 units left", async || {
        other += usize::from(node.check(user.clone(), "/other").await["allowed"] == true);
        other >= 7
    })
    .await;
    let later = node.admitted(user.clone(), "/other", 50).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let later = later + node.admitted(user.clone(), "/other", 50).await;
    assert_eq!(other + later, 7, "the global quota holds 10, 3 spent on /tight");
}

/// A client that comes back every 3.5 s — longer than a lease lasts, and than a quota idle a
/// whole second goes on asking — is admitted every time once its quota is known: the node
/// keeps a unit of it leased between visits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_comes_back_now_and_then_finds_a_unit_in_hand() {
    let global = RedisServer::start();
    let node = region_node(&global.url()).await;
    let user = json!({"user": "now-and-then"});
    eventually("the first lease lands", async || {
        node.check(user.clone(), "/other").await["allowed"] == true
    })
    .await;
    for visit in 1..=2 {
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let answer = node.check(user.clone(), "/other").await;
        assert_eq!(answer["allowed"], true, "visit {visit}: {answer}");
    }
}
