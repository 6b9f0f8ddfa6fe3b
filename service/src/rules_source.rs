//! Where rules come from at run time: the `--rules` file (watched), the admin API, and,
//! with Redis, the rules other nodes published.
//!
//! With Redis, the admin API stores the rule text under `sluice:{rules}` and bumps
//! `sluice:{rules}:version` (and publishes on `sluice:rules:changed` for observers); every
//! node polls the version every 250 ms, so a change reaches all nodes within a second even
//! across reconnects, when a pub/sub message would be lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sluice_core::rules::RuleSet;

use crate::node::Node;
use crate::store::{Store, StoreError};

const RULES_KEY: &str = "sluice:{rules}";
const VERSION_KEY: &str = "sluice:{rules}:version";
const CHANNEL: &str = "sluice:rules:changed";

/// Reads and validates a rule file; the error names the file and what is wrong where.
pub fn load_file(path: &Path) -> Result<RuleSet, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    RuleSet::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn fingerprint(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Reloads the file whenever it changes; a bad file keeps the rules in force.
pub async fn watch_file(node: Arc<Node>, path: PathBuf) {
    let mut seen = fingerprint(&path);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = fingerprint(&path);
        if now == seen || now.is_none() {
            continue;
        }
        seen = now;
        match load_file(&path) {
            Ok(rules) => {
                tracing::info!(file = %path.display(), rules = rules.rules().len(), "rules reloaded");
                node.set_rules(rules);
                node.metrics.reload(true);
            }
            Err(e) => {
                tracing::error!("rules not reloaded, keeping the previous ones: {e}");
                node.metrics.reload(false);
            }
        }
    }
}

/// Puts `rules` in force on this node and, with Redis, on every node.
pub async fn replace(node: &Node, rules: RuleSet) -> Result<(), StoreError> {
    if let Store::Redis(r) = &*node.store {
        let text = rules.to_toml();
        r.query::<()>(redis::cmd("SET").arg(RULES_KEY).arg(&text)).await?;
        let version: i64 = r.query(redis::cmd("INCR").arg(VERSION_KEY)).await?;
        let _ = r.query::<i64>(redis::cmd("PUBLISH").arg(CHANNEL).arg(version)).await;
    }
    node.set_rules(rules);
    node.metrics.reload(true);
    Ok(())
}

/// Follows the rules other nodes publish through Redis (no-op on the memory store).
pub async fn watch_redis(node: Arc<Node>) {
    let Store::Redis(r) = &*node.store else { return };
    let mut seen: Option<i64> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let Ok(version) = r.query::<Option<i64>>(redis::cmd("GET").arg(VERSION_KEY)).await else {
            continue;
        };
        if version.is_none() || version == seen {
            continue;
        }
        // At start too: a node adopts the rules published earlier through the admin API.
        seen = version;
        match r.query::<Option<String>>(redis::cmd("GET").arg(RULES_KEY)).await {
            Ok(Some(text)) => match RuleSet::from_toml(&text) {
                Ok(rules) => {
                    tracing::info!(version = ?version, "rules updated from Redis");
                    node.set_rules(rules);
                    node.metrics.reload(true);
                }
                Err(e) => {
                    tracing::error!("rules in Redis are invalid, keeping the previous ones: {e}");
                    node.metrics.reload(false);
                }
            },
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read rules from Redis"),
        }
    }
}
