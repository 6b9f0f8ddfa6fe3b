//! Where rules come from at run time: the `--rules` file (watched), the admin API, and the
//! rule set published in the store, which every node follows.
//!
//! One rule set is in force across the nodes of a store: the published one, versioned.
//! Every change is a compare-and-set on that version ([`crate::store::Store::publish_rules`]), and the
//! last change wins, whatever its source: an admin call, or an edit of a node's rules file
//! (a deliberate change). A node that starts adopts the published rules if there are any
//! (a restart is not a change; it warns when its file differs) and publishes its file if
//! there are none. Nodes learn of a change from the store's pub/sub channel at once, and
//! poll the version every [`NodeConfig::rules_poll`] (250 ms unless `--rules-poll-ms` says
//! otherwise) as the safety net (a message is lost across a reconnect).
//!
//! [`NodeConfig::rules_poll`]: crate::node::NodeConfig::rules_poll

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_core::rules::RuleSet;
use tokio::sync::Notify;

use crate::node::Node;
use crate::store::{Publish, StoreError};

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

/// Publishes `rules` as the next version if the published version is `expected` (`None`:
/// whatever it is), and puts them in force on this node. `Conflict` changes nothing.
pub async fn replace(node: &Node, rules: RuleSet, expected: Option<u64>) -> Result<Publish, StoreError> {
    let outcome = node.store.publish_rules(&rules.to_toml(), expected).await?;
    if let Publish::Done(version) = outcome {
        node.set_published_rules(rules, version);
        node.metrics.reload(true);
    }
    Ok(outcome)
}

/// Reloads the file whenever its content differs from what was seen last (checked every
/// 500 ms), starting from `seen`, the fingerprint [`load_file`] returned for the rules in
/// force, and publishes it. A bad file keeps the rules in force, and so do a file with no
/// rule (unless `allow_empty_rules`) and a deleted one (each said once, as a warning); a
/// file that cannot be published (store down) is in force on this node and published once
/// the store answers.
pub async fn watch_file(node: Arc<Node>, path: PathBuf, mut seen: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut missing = false;
    loop {
        tick.tick().await;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !std::mem::replace(&mut missing, true) {
                    let count = node.rules().rules().len();
                    tracing::warn!(file = %path.display(), rules = count, "the rules file is gone: keeping the rules in force");
                }
                continue;
            }
            Err(_) => continue, // being replaced: the rules in force stay
        };
        missing = false;
        let now = fingerprint(&bytes);
        if now == seen {
            continue;
        }
        let rules = std::str::from_utf8(&bytes)
            .map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
            .and_then(|text| RuleSet::from_toml(text).map_err(|e| format!("{}: {e}", path.display())))
            .and_then(|rules| {
                if rules.rules().is_empty() && !node.config.allow_empty_rules {
                    Err(format!(
                        "{} holds no rule, which would turn every limit off (start the node with \
                         --allow-empty-rules to allow that)",
                        path.display()
                    ))
                } else {
                    Ok(rules)
                }
            });
        let rules = match rules {
            Ok(rules) => rules,
            Err(e) => {
                seen = now;
                tracing::error!("rules not reloaded, keeping the previous ones: {e}");
                node.metrics.reload(false);
                continue;
            }
        };
        let count = rules.rules().len();
        match replace(&node, rules.clone(), None).await {
            Ok(_) => {
                seen = now;
                tracing::info!(file = %path.display(), rules = count, version = node.rules_version(), "rules reloaded and published");
            }
            Err(e) => {
                node.set_rules(rules);
                tracing::warn!(file = %path.display(), "rules reloaded on this node only, publishing again shortly: {e}");
            }
        }
    }
}

/// Follows the published rule set: at start (adopting it, or publishing this node's rules
/// when none is published), on every change announced by the store, and every
/// `node.config.rules_poll`.
pub async fn follow_published(node: Arc<Node>) {
    let changed = Arc::new(Notify::new());
    node.store.notify_rule_changes(changed.clone());
    let mut tick = tokio::time::interval(node.config.rules_poll.max(Duration::from_millis(1)));
    loop {
        tokio::select! {
            _ = changed.notified() => {}
            _ = tick.tick() => {}
        }
        if let Err(e) = adopt_published(&node).await {
            tracing::debug!(error = %e, "cannot read the published rules");
        }
    }
}

/// Puts the published rules in force if their version is not the node's; publishes the
/// node's rules if nothing is published yet.
pub async fn adopt_published(node: &Node) -> Result<(), StoreError> {
    let Some(published) = node.store.published_rules().await? else {
        let rules = (*node.rules()).clone();
        if let Publish::Done(version) = replace(node, rules, Some(0)).await? {
            tracing::info!(version, "no rules were published: published this node's");
        }
        return Ok(());
    };
    let (in_force, version) = node.rules_in_force();
    if published.version == version {
        return Ok(());
    }
    match RuleSet::from_toml(&published.text) {
        Ok(rules) => {
            if version == 0 && rules.to_toml() != in_force.to_toml() {
                tracing::warn!(
                    version = published.version,
                    "the published rules differ from this node's rules file; the published ones are in force \
                     (edit the file, or PUT /v1/admin/rules, to change them everywhere)"
                );
            }
            tracing::info!(
                version = published.version,
                rules = rules.rules().len(),
                "rules updated from the store"
            );
            node.set_published_rules(rules, published.version);
            node.metrics.reload(true);
        }
        Err(e) => {
            tracing::error!("the published rules are invalid, keeping the previous ones: {e}");
            node.metrics.reload(false);
        }
    }
    Ok(())
}

/// Removes the overrides that have ended from the rules in force and publishes the result
/// (if another change comes first, the next call tries again on that one).
pub async fn expire_overrides(node: &Node, now_ms: u64) -> Result<usize, StoreError> {
    let (in_force, version) = node.rules_in_force();
    let mut rules = (*in_force).clone();
    let removed = rules.expire_overrides(now_ms);
    if removed == 0 {
        return Ok(0);
    }
    match replace(node, rules, Some(version)).await? {
        Publish::Done(_) => {
            tracing::info!(removed, "expired overrides removed");
            Ok(removed)
        }
        Publish::Conflict(_) => Ok(0),
    }
}
