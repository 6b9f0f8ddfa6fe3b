//! A node's periodic chores, off the request path.

use std::sync::Arc;
use std::time::Duration;

use crate::console;
use crate::node::Node;
use crate::rules_source;
use crate::store::Store;

/// How long a node's presence lasts unless renewed (every second, by [`sweep`]).
const PRESENCE_MS: u64 = 3_000;

/// Every second: samples the rules' counts for the console, drops expired state from the
/// memory store and the fallback buckets, removes the overrides that have ended, and renews
/// the node's presence in the store, reading how many nodes share it ([`Node::nodes`]: the
/// fallback buckets start from their share of a quota).
pub async fn sweep(node: Arc<Node>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let presence = node
            .store
            .share_demand(&node.store.keys().nodes, &node.instance, 1, PRESENCE_MS);
        match crate::store::within(node.config.store_timeout, presence).await {
            Ok(nodes) => node.set_nodes(nodes),
            Err(e) => tracing::debug!(error = %e, "presence not renewed"),
        }
        node.console.sample(&node.metrics.rule_counts(), console::now_ms());
        if let Store::Memory(m) = &*node.store {
            m.sweep();
        }
        node.fallback.sweep();
        if let Err(e) = rules_source::expire_overrides(&node, node.clock.now().instant_ms()).await {
            tracing::debug!(error = %e, "expired overrides not removed yet");
        }
    }
}

/// Runs beside a node: whenever a store call succeeds with admissions owed, spends them in
/// the store ([`settle`]). A check first spends what its own keys owe itself
/// ([`crate::decide`]), so this task's pace (a busy runtime can leave it waiting) never lets
/// a hot key hand out its remainder meanwhile.
pub async fn settle_owed(node: Arc<Node>) {
    loop {
        node.owed.due().await;
        settle(&node, node.owed.take_all()).await;
    }
}

/// Spends `owed` (key, limit, units the fallback admitted) in the store, each key in one
/// call; what the store cannot take now (it failed again) stays owed for its next answer.
pub async fn settle(node: &Node, owed: Vec<(String, sluice_core::Limit, u64)>) {
    for (key, limit, units) in owed {
        match node.store.take(&key, &limit, units).await {
            Ok(taken) => {
                tracing::debug!(key = %sluice_core::text::visible(&key), units, taken = taken.units,
                    "fallback admissions spent in the store");
                node.metrics.fallback_settled(units);
            }
            Err(e) => {
                tracing::debug!(error = %e, "fallback admissions not spent yet; kept for the store's next answer");
                node.owed.add(&key, &limit, units);
            }
        }
    }
}
