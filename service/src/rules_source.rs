//! Where rules come from at run time: the `--rules` file (watched), the admin API, and,
//! with Redis, the rules other nodes published.
//!
//! With Redis, the admin API stores the rule text under `sluice:{rules}` and bumps
//! `sluice:{rules}:version` (and publishes on `sluice:rules:changed` for observers); every
//! node polls the version every 250 ms, so a change reaches all nodes within a second even
//! across reconnects, when a pub/sub message would be lost.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_core::rules::RuleSet;

use crate::node::Node;
use crate::store::{Store, StoreError};

const RULES_KEY: &str = "sluice:{rules}";
const VERSION_KEY: &str = "sluice:{rules}:version";
const CHANNEL: &str = "sluice:rules:changed";

/// Reads and validates a rule file; the error names the file and what is wrong where. Also
/// returns the fingerprint of the text the rules came from, for [`watch_file`].
pub fn load_file(path: &Path) -> Result<(RuleSet, u64), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let rules = RuleSet::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((rules, fingerprint(text.as_bytes())))
}

/// A hash of a file's bytes. Content, not `(mtime, len)`: two edits of the same length
/// within the filesystem's timestamp granularity look the same from the metadata.
fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Reloads the file whenever its content differs from what was seen last (checked every
/// 500 ms), starting from `seen`, the fingerprint [`load_file`] returned for the rules in
/// force; a bad file keeps the rules in force.
pub async fn watch_file(node: Arc<Node>, path: PathBuf, mut seen: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let Ok(bytes) = std::fs::read(&path) else {
            continue; // being replaced, or gone: the rules in force stay
        };
        let now = fingerprint(&bytes);
        if now == seen {
            continue;
        }
        seen = now;
        let rules = std::str::from_utf8(&bytes)
            .map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
            .and_then(|text| RuleSet::from_toml(text).map_err(|e| format!("{}: {e}", path.display())));
        match rules {
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
