//! Where rules come from at run time: the `--rules` file (watched, TOML or
//! envoyproxy/ratelimit YAML), the admin API, and the rule set published in the store, which
//! every node follows (TOML rules; YAML ones are each node's own copy of its files).
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

use crate::grpc::descriptors::DescriptorSet;
use sluice_core::rules::RuleSet;
use tokio::sync::Notify;

use crate::console::SourceKind;
use crate::grpc::config;
use crate::node::Node;
use crate::store::{Publish, StoreError};

/// Reads and validates a rule file; the error names the file and what is wrong where. Also
/// returns the fingerprint of the text the rules came from, for [`watch_file`].
pub fn load_file(path: &Path) -> Result<(RuleSet, u64), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let rules = RuleSet::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((rules, fingerprint(&[text.as_bytes()])))
}

/// Reads and validates envoyproxy/ratelimit configuration files (YAML, one domain each);
/// the error names the file and what is wrong where. Also returns the fingerprint of the
/// texts, for [`watch_files`].
pub fn load_yaml_files(paths: &[PathBuf]) -> Result<(DescriptorSet, u64), String> {
    let mut texts = Vec::with_capacity(paths.len());
    for path in paths {
        texts.push(std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?);
    }
    let set = descriptors_of(paths, &texts)?;
    Ok((set, fingerprint(&texts)))
}

/// The descriptor set of the YAML `texts` read from `paths`; a file holding nothing but
/// comments adds no domain.
fn descriptors_of(paths: &[PathBuf], texts: &[impl AsRef<[u8]>]) -> Result<DescriptorSet, String> {
    let mut configs = Vec::with_capacity(texts.len());
    for (path, bytes) in paths.iter().zip(texts) {
        let text = std::str::from_utf8(bytes.as_ref()).map_err(|e| format!("{}: not UTF-8: {e}", path.display()))?;
        if config::is_blank(text) {
            continue;
        }
        configs.push(config::parse(text).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    DescriptorSet::new(configs).map_err(|e| e.to_string())
}

/// A hash of files' bytes. Content, not `(mtime, len)`: two edits of the same length
/// within the filesystem's timestamp granularity look the same from the metadata.
fn fingerprint(files: &[impl AsRef<[u8]>]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for bytes in files {
        bytes.as_ref().hash(&mut hasher);
    }
    hasher.finish()
}

/// Publishes `rules` as the next version if the published version is `expected` (`None`:
/// whatever it is), and puts them in force on this node, noting that they came from `kind`
/// (`detail`: the file, the change) for the console. `Conflict` changes nothing.
pub async fn replace(
    node: &Node,
    rules: RuleSet,
    expected: Option<u64>,
    (kind, detail): (SourceKind, &str),
) -> Result<Publish, StoreError> {
    let outcome = node.store.publish_rules(&rules.to_toml(), expected).await?;
    if let Publish::Done(version) = outcome {
        node.set_published_rules(rules, version);
        node.console.set_source(kind, detail);
        node.metrics.reload(true);
    }
    Ok(outcome)
}

/// Reloads the TOML rules file whenever its content differs from what was seen last (see
/// `watch`), starting from `seen`, the fingerprint [`load_file`] returned.
pub async fn watch_file(node: Arc<Node>, path: PathBuf, seen: u64) {
    watch(node, Kind::Toml, vec![path], seen).await;
}

/// Reloads the gRPC API's envoyproxy/ratelimit YAML files whenever their content differs
/// from what was seen last (see `watch`), starting from `seen`, the fingerprint
/// [`load_yaml_files`] returned.
pub async fn watch_files(node: Arc<Node>, paths: Vec<PathBuf>, seen: u64) {
    watch(node, Kind::Yaml, paths, seen).await;
}

/// What the watched files are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One TOML rules file.
    Toml,
    /// envoyproxy/ratelimit YAML files.
    Yaml,
}

/// What a rules file holds once read and validated.
enum Loaded {
    /// TOML: the HTTP API's rules, published to the store.
    Toml(RuleSet),
    /// envoyproxy/ratelimit YAML: the gRPC API's descriptors, in force on this node.
    Yaml(DescriptorSet),
}

impl Loaded {
    /// Reads `texts`, the content of `paths`: one TOML file, or YAML files.
    fn read(kind: Kind, paths: &[PathBuf], texts: &[Vec<u8>]) -> Result<Loaded, String> {
        match (paths, texts) {
            ([path], [bytes]) if kind == Kind::Toml => std::str::from_utf8(bytes)
                .map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
                .and_then(|text| RuleSet::from_toml(text).map_err(|e| format!("{}: {e}", path.display())))
                .map(Loaded::Toml),
            _ => descriptors_of(paths, texts).map(Loaded::Yaml),
        }
    }

    /// How many rules (TOML) or limits (YAML) it holds.
    fn count(&self) -> usize {
        match self {
            Loaded::Toml(rules) => rules.rules().len(),
            Loaded::Yaml(descriptors) => descriptors.len(),
        }
    }
}

/// How many rules (TOML) or descriptor limits (YAML) are in force on `node`.
fn count_in_force(node: &Node, kind: Kind) -> usize {
    match kind {
        Kind::Toml => node.rules().rules().len(),
        Kind::Yaml => node.descriptors().len(),
    }
}

/// Reloads the rules files — one TOML file, or the YAML files of the gRPC API — whenever
/// their content differs from what was seen last (checked every 500 ms; an edit in place,
/// a file renamed over, a ConfigMap's symlink swapped), starting from `seen`, the
/// fingerprint [`load_file`] or [`load_yaml_files`] returned for the rules in force. TOML
/// rules are published to the store; YAML ones are put in force on this node (every node
/// reads its own copy). A bad file keeps the rules in force, and so do a file with no rule
/// (unless `allow_empty_rules`) and a deleted one (each said once, as a warning); TOML
/// rules that cannot be published (store down) are in force on this node and published
/// once the store answers. Each reload is one INFO line naming the file, the count of
/// rules and the version.
async fn watch(node: Arc<Node>, kind: Kind, paths: Vec<PathBuf>, mut seen: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut missing = false;
    let shown = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    loop {
        tick.tick().await;
        let texts = match paths.iter().map(std::fs::read).collect::<Result<Vec<_>, _>>() {
            Ok(texts) => texts,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !std::mem::replace(&mut missing, true) {
                    let count = count_in_force(&node, kind);
                    tracing::warn!(file = %shown, rules = count, "the rules file is gone: keeping the rules in force");
                }
                continue;
            }
            Err(_) => continue, // being replaced: the rules in force stay
        };
        missing = false;
        let now = fingerprint(&texts);
        if now == seen {
            continue;
        }
        let loaded = match Loaded::read(kind, &paths, &texts) {
            Ok(loaded) if loaded.count() == 0 && !node.config.allow_empty_rules => {
                seen = now;
                let count = count_in_force(&node, kind);
                tracing::warn!(
                    file = %shown,
                    rules = count,
                    "the rules file holds no rule, which would turn every limit off: keeping the rules in force \
                     (start the node with --allow-empty-rules to allow that)"
                );
                node.metrics.reload(false);
                continue;
            }
            Ok(loaded) => loaded,
            Err(e) => {
                seen = now;
                tracing::error!("rules not reloaded, keeping the previous ones: {e}");
                node.metrics.reload(false);
                continue;
            }
        };
        let count = loaded.count();
        match loaded {
            Loaded::Yaml(descriptors) => {
                seen = now;
                let version = node.set_descriptors(Arc::new(descriptors));
                node.metrics.reload(true);
                tracing::info!(file = %shown, rules = count, version, "rules reloaded");
            }
            Loaded::Toml(rules) => match replace(&node, rules.clone(), None, (SourceKind::File, &shown)).await {
                Ok(_) => {
                    seen = now;
                    tracing::info!(file = %shown, rules = count, version = node.rules_version(), "rules reloaded");
                }
                Err(e) => {
                    node.set_rules(rules);
                    node.console.set_source(SourceKind::File, &shown);
                    tracing::warn!(file = %shown, "rules reloaded on this node only, publishing again shortly: {e}");
                }
            },
        }
    }
}

/// Follows the published rule set: at start (adopting it, or publishing this node's rules
/// when none is published), on every change announced by the store, and every
/// `node.config.rules_poll`.
pub async fn follow_published(node: Arc<Node>) {
    let changed = Arc::new(Notify::new());
    let forget = node.clone();
    node.store
        .notify_rule_changes(changed.clone(), Arc::new(move |key: &str| forget.refusals.forget(key)));
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
        let source = node.console.source();
        if let Publish::Done(version) = replace(node, rules, Some(0), (source.kind, &source.detail)).await? {
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
            let detail = format!("version {} read from the store", published.version);
            node.console.set_source(SourceKind::Pubsub, detail);
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
    match replace(
        node,
        rules,
        Some(version),
        (SourceKind::Admin, "expired overrides removed"),
    )
    .await?
    {
        Publish::Done(_) => {
            tracing::info!(removed, "expired overrides removed");
            Ok(removed)
        }
        Publish::Conflict(_) => Ok(0),
    }
}
