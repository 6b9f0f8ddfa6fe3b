//! A node's periodic chores, off the request path.

use std::sync::Arc;
use std::time::Duration;

use crate::console;
use crate::node::Node;
use crate::rules_source;
use crate::store::Store;

/// Every second: samples the rules' counts for the console, drops expired state from the
/// memory store and the fallback buckets, and removes the overrides that have ended.
pub async fn sweep(node: Arc<Node>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
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
