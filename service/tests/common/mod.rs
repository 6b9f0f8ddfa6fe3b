//! An in-process service node on a free loopback port, for the integration tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_core::rules::RuleSet;
use sluice_service::edge::Edge;
use sluice_service::node::{Node, NodeConfig};
use sluice_service::region::{self, Region};
use sluice_service::store::Store;
use sluice_service::{admin, housekeeping, http, rules_source};

/// The rules of [`TestNode::peek_and_debit`]: an LLM API's budget per user.
pub const TOKEN_BUDGET_RULES: &str = r#"
[[rule]]
name = "tokens-day"
by = "user"
path = "/v1/chat"
algorithm = "fixed_window"
limit = 100
window = "24h"

[[rule]]
name = "tokens-bucket"
by = "user"
path = "/v1/chat"
algorithm = "token_bucket"
limit = 1000
window = "24h"
"#;

/// A running node and a client for it.
pub struct TestNode {
    pub addr: SocketAddr,
    /// The admin listener's address: [`TestNode::url`] sends `/v1/admin/…` there.
    pub admin_addr: SocketAddr,
    pub node: Arc<Node>,
    pub client: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
    admin_server: tokio::task::JoinHandle<()>,
}

pub const TOKEN: &str = "s3cret-token";

impl TestNode {
    /// Starts a node over `store` with the TOML `rules`.
    pub async fn start(store: Store, rules: &str, config: NodeConfig) -> TestNode {
        TestNode::start_in_region(store, rules, config, None).await
    }

    /// Starts a node over `store` with the TOML `rules`, leasing global rules in `region`.
    pub async fn start_in_region(store: Store, rules: &str, config: NodeConfig, region: Option<Region>) -> TestNode {
        let rules = RuleSet::from_toml(rules).expect("test rules are valid");
        let config = NodeConfig {
            admin_token: Some(TOKEN.into()),
            ..config
        };
        let node = Node::in_region(store, rules, config, region);
        tokio::spawn(region::refill::run(node.clone()));
        // Settled with the store before the test talks to it, as a running node is: its
        // rules are the published ones (or published by it). Without this a test racing
        // the node's first poll reads version 0 and its If-Match is stale.
        let _ = rules_source::adopt_published(&node).await;
        tokio::spawn(rules_source::follow_published(node.clone()));
        tokio::spawn(housekeeping::sweep(node.clone()));
        tokio::spawn(housekeeping::settle_owed(node.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = http::router(node.clone());
        let server = tokio::spawn(async move {
            Edge::default().serve_http(listener, app, std::future::pending()).await;
        });
        let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let admin_addr = admin_listener.local_addr().expect("addr");
        let admin = admin::router(node.clone());
        let admin_server = tokio::spawn(async move {
            Edge::default()
                .serve_http(admin_listener, admin, std::future::pending())
                .await;
        });
        TestNode {
            addr,
            admin_addr,
            admin_server,
            node,
            client: reqwest::Client::new(),
            server,
        }
    }

    /// `GET path` with the admin token.
    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("admin GET")
    }

    /// `PUT /v1/admin/rules` with `body`, and `If-Match: if_match` when given.
    pub async fn put_rules(&self, body: String, if_match: Option<&str>) -> reqwest::Response {
        let mut put = self
            .client
            .put(self.url("/v1/admin/rules"))
            .bearer_auth(TOKEN)
            .body(body);
        if let Some(tag) = if_match {
            put = put.header("if-match", tag);
        }
        put.send().await.expect("admin PUT")
    }

    /// The URL of `path`: on the admin listener for `/v1/admin/…`, else the data one.
    pub fn url(&self, path: &str) -> String {
        if path.starts_with("/v1/admin/") {
            format!("http://{}{path}", self.admin_addr)
        } else {
            format!("http://{}{path}", self.addr)
        }
    }

    /// The node's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let r = self.client.get(self.url("/metrics")).send().await.expect("metrics");
        r.text().await.expect("metrics text")
    }

    /// POSTs a check for `identities` on GET `path`; returns the JSON answer.
    pub async fn check(&self, identities: Value, path: &str) -> Value {
        self.check_body(json!({"identities": identities, "method": "GET", "path": path}))
            .await
    }

    pub async fn check_body(&self, body: Value) -> Value {
        let r = self
            .client
            .post(self.url("/v1/check"))
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200, "check failed");
        r.json().await.expect("json")
    }

    /// POSTs a debit (`POST /v1/debit`) of `cost` for `identities` on GET `path`: its status
    /// and JSON answer.
    pub async fn debit(&self, identities: Value, path: &str, cost: u64) -> (u16, Value) {
        let body = json!({"identities": identities, "method": "GET", "path": path, "cost": cost});
        let r = self
            .client
            .post(self.url("/v1/debit"))
            .json(&body)
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.json().await.expect("json"))
    }

    /// A peek (a check of cost 0) for `identities` on GET `path`.
    pub async fn peek(&self, identities: Value, path: &str) -> Value {
        self.check_body(json!({"identities": identities, "method": "GET", "path": path, "cost": 0}))
            .await
    }

    /// Peeks, checks and debits one user's quota of 100 (a fixed window, first rule) and
    /// 1,000 (a token bucket, second): a peek spends nothing, a debit takes what is left
    /// and says the quota is spent, and the next check is refused.
    pub async fn peek_and_debit(&self) {
        let who = json!({"user": "llm-user"});
        for _ in 0..2 {
            let p = self.peek(who.clone(), "/v1/chat").await;
            assert_eq!(
                (p["allowed"].clone(), p["remaining"].clone()),
                (json!(true), json!(100)),
                "{p}"
            );
        }
        assert_eq!(self.check(who.clone(), "/v1/chat").await["remaining"], 99);
        let (status, d) = self.debit(who.clone(), "/v1/chat", 90).await;
        assert_eq!(status, 200, "{d}");
        assert_eq!(
            (d["allowed"].clone(), d["remaining"].clone()),
            (json!(true), json!(9)),
            "{d}"
        );
        assert_eq!(d["rules"][1]["remaining"], 1000 - 91, "both rules debited: {d}");
        assert_eq!(self.peek(who.clone(), "/v1/chat").await["remaining"], 9);
        let (_, d) = self.debit(who.clone(), "/v1/chat", 50).await;
        assert_eq!(
            (d["allowed"].clone(), d["remaining"].clone()),
            (json!(false), json!(0)),
            "spent: {d}"
        );
        assert!(d["retry_after_ms"].as_u64().unwrap_or(0) > 0, "{d}");
        assert_eq!(
            d["rules"][1]["remaining"],
            1000 - 141,
            "a rule with room takes the whole cost: {d}"
        );
        let r = self.check(who.clone(), "/v1/chat").await;
        assert_eq!(r["allowed"], false, "the next request is refused: {r}");
        let (status, d) = self.debit(who.clone(), "/v1/chat", 0).await;
        assert_eq!(status, 400, "{d}");
        assert!(d["error"].as_str().unwrap_or("").contains("cost 0"), "{d}");
        // Another user's quota is untouched.
        assert_eq!(self.peek(json!({"user": "other"}), "/v1/chat").await["remaining"], 100);
    }

    /// The violations log's entries for `identity` (admin API).
    pub async fn violations(&self, identity: &str) -> Vec<Value> {
        let r: Value = self
            .client
            .get(self.url(&format!("/v1/admin/violations?identity={identity}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        r["violations"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("no violations list in {r}"))
    }

    /// How many of `n` identical checks are allowed.
    pub async fn admitted(&self, identities: Value, path: &str, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            if self.check(identities.clone(), path).await["allowed"] == true {
                ok += 1;
            }
        }
        ok
    }
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after 10 s.
pub async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < Duration::from_secs(10), "{what} (waited 10 s)");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.server.abort();
        self.admin_server.abort();
    }
}
