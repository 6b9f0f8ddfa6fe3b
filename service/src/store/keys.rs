//! Every name a node uses in a shared store, built here and nowhere else, each starting with
//! the deployment's prefix (`--store-prefix`, default `sluice`): two deployments with
//! different prefixes share a Redis without meeting.
//!
//! Limit state: `<prefix>:{<identity>}:<rule>:<suffix>`. The identity between the braces is
//! the Redis Cluster hash tag, so every rule that limits one client (its IP, its user, its
//! key) keeps its state in one slot, and a request's rules cost one script per slot on a
//! cluster rather than one per rule. That is sound because a rule's state is still one
//! key set in one slot, so each script stays atomic; what it costs is that one identity's
//! rules no longer spread over the cluster's nodes (a single hot client was one node's
//! load per rule already). The encoding is injective and keeps exactly one pair of braces
//! whatever a client sends: `%`, `{` and `}` are percent-encoded in both parts (`%25`,
//! `%7B`, `%7D`) and `:` in the rule name (`%3A`), so the braces end the identity and the
//! next `:` ends the rule name. Names and identities without those characters appear as
//! they are.
//!
//! The published rule set and its version share the tag `{rules}`, so one script updates
//! both on a cluster; changes are announced on [`Keys::rules_channel`].

use sluice_core::Algorithm;

/// The default prefix.
pub const DEFAULT_PREFIX: &str = "sluice";

/// Most bytes of a prefix.
pub const MAX_PREFIX_BYTES: usize = 64;

/// A prefix that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store prefix {prefix:?}: {problem}")]
pub struct BadPrefix {
    /// The prefix given.
    pub prefix: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// One deployment's names in the store, all under its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
    /// The published rule set's text (TOML): `<prefix>:{rules}`.
    pub rules: String,
    /// The published rule set's version, bumped by every change: `<prefix>:{rules}:version`.
    pub rules_version: String,
    /// Pub/sub channel announcing a new rules version: `<prefix>:rules:changed`.
    pub rules_channel: String,
    /// The capped stream of violations: `<prefix>:violations`.
    pub violations: String,
    /// Written before each `WAIT` of `--store-wait-replicas` (see `redis::connection`):
    /// `<prefix>:wait-barrier`.
    pub wait_barrier: String,
    /// The live nodes, each renewing its presence (`Store::share_demand` on this name, so
    /// `<prefix>:nodes:demand`; no braces, so never a limit's name): `<prefix>:nodes`.
    pub nodes: String,
}

impl Keys {
    /// The names under `prefix`: 1 to [`MAX_PREFIX_BYTES`] bytes of ASCII letters, digits,
    /// `-`, `_`, `.` and `:` (no braces: they would move the Redis Cluster hash tag).
    pub fn new(prefix: &str) -> Result<Keys, BadPrefix> {
        let bad = |problem| BadPrefix {
            prefix: prefix.to_owned(),
            problem,
        };
        if prefix.is_empty() || prefix.len() > MAX_PREFIX_BYTES {
            return Err(bad("must be 1 to 64 bytes"));
        }
        if !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err(bad(
                "may hold only ASCII letters, digits, '-', '_', '.' and ':' (no braces, spaces or others)",
            ));
        }
        Ok(Keys::under(prefix))
    }

    /// The names under `prefix`, taken as it is.
    fn under(prefix: &str) -> Keys {
        Keys {
            rules: format!("{prefix}:{{rules}}"),
            rules_version: format!("{prefix}:{{rules}}:version"),
            rules_channel: format!("{prefix}:rules:changed"),
            violations: format!("{prefix}:violations"),
            wait_barrier: format!("{prefix}:wait-barrier"),
            nodes: format!("{prefix}:nodes"),
            prefix: prefix.to_owned(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key prefix of `rule`'s limit state for `identity`: `<prefix>:{<identity>}:<rule>`
    /// (see the module's encoding).
    pub fn limit(&self, rule: &str, identity: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + rule.len() + identity.len() + 4);
        key.push_str(&self.prefix);
        key.push_str(":{");
        push_escaped(&mut key, identity, false);
        key.push_str("}:");
        push_escaped(&mut key, rule, true);
        key
    }
}

impl Default for Keys {
    /// The names under [`DEFAULT_PREFIX`].
    fn default() -> Keys {
        Keys::under(DEFAULT_PREFIX)
    }
}

/// What the lease `id` of the limit `limit_key` still holds: `<limit key>:lease:<id>`, in
/// the limit's slot.
pub fn lease(limit_key: &str, id: u64) -> String {
    format!("{limit_key}:lease:{id}")
}

/// What every node's RLQS buckets of the limit `limit_key` ask for, a second (a hash of node
/// → `per_s:until_ms`): `<limit key>:demand`, in the limit's slot.
pub fn demand(limit_key: &str) -> String {
    format!("{limit_key}:demand")
}

/// The hash-tagged key prefix of one limit under the default prefix,
/// `sluice:{<identity>}:<rule>`: [`Keys::limit`] of [`Keys::default`].
pub fn limit(rule: &str, identity: &str) -> String {
    Keys::default().limit(rule, identity)
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key
/// when it has none, modulo 16384, as the cluster specification defines it.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The suffixes of the keys holding one limit's state under `algorithm`, in the order the
/// Lua script takes them.
pub fn state_suffixes(algorithm: Algorithm) -> &'static [&'static str] {
    match algorithm {
        Algorithm::TokenBucket => &[":tb"],
        Algorithm::Gcra | Algorithm::LeakyBucket => &[":tat"],
        Algorithm::FixedWindow => &[":fw"],
        Algorithm::SlidingWindowLog => &[":log", ":logm"],
        Algorithm::SlidingWindowCounter => &[":swc"],
        Algorithm::Concurrency => &[":slots"],
    }
}

/// Every key that can hold the state of the limit `limit_key`, whatever its algorithm (a
/// rule's algorithm may have changed since the state was written): each suffix of
/// [`state_suffixes`] once, a sliding log's second key among them. All in the limit's slot.
pub fn every_state_key(limit_key: &str) -> Vec<String> {
    let mut suffixes: Vec<&str> = Algorithm::ALL
        .iter()
        .flat_map(|&a| state_suffixes(a))
        .copied()
        .collect();
    suffixes.sort_unstable();
    suffixes.dedup();
    suffixes.iter().map(|s| format!("{limit_key}{s}")).collect()
}

fn push_escaped(key: &mut String, part: &str, colon: bool) {
    for c in part.chars() {
        match c {
            '%' => key.push_str("%25"),
            '{' => key.push_str("%7B"),
            '}' => key.push_str("%7D"),
            ':' if colon => key.push_str("%3A"),
            c => key.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{limit, slot};

    #[test]
    fn a_prefix_starts_every_name_and_bad_ones_are_named() {
        let keys = super::Keys::new("team-a").unwrap();
        assert_eq!(keys.limit("per-ip", "1.2.3.4"), "team-a:{1.2.3.4}:per-ip");
        assert_eq!(
            [
                &keys.rules,
                &keys.rules_version,
                &keys.rules_channel,
                &keys.violations,
                &keys.wait_barrier
            ],
            [
                "team-a:{rules}",
                "team-a:{rules}:version",
                "team-a:rules:changed",
                "team-a:violations",
                "team-a:wait-barrier"
            ]
        );
        assert_eq!(super::Keys::new("sluice").unwrap(), super::Keys::default());
        for bad in ["", "a{b", "a}", "a b", "é", &"x".repeat(65)] {
            let e = super::Keys::new(bad).unwrap_err();
            assert!(e.to_string().starts_with("store prefix"), "{e}");
        }
    }

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(limit("per-ip", "203.0.113.9"), "sluice:{203.0.113.9}:per-ip");
        assert_eq!(limit("per-ip", "2001:db8::1"), "sluice:{2001:db8::1}:per-ip");
        assert_eq!(limit("g", "global"), "sluice:{global}:g");
    }

    #[test]
    fn braces_cannot_move_the_hash_tag_and_keys_do_not_collide() {
        let k = limit("r{}", "a}b{c");
        assert_eq!(k, "sluice:{a%7Db%7Bc}:r%7B%7D");
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        let pairs = [
            ("a:b", "c"),
            ("a", "b:c"),
            ("b", "a:"),
            ("r", "x}"),
            ("r", "x%7D"),
            ("r", "x)"),
            ("r%", "x"),
            ("r%25", "x"),
        ];
        let keys: std::collections::BTreeSet<String> = pairs.iter().map(|(r, i)| limit(r, i)).collect();
        assert_eq!(keys.len(), pairs.len(), "{keys:?}");
    }

    #[test]
    fn one_identity_is_one_slot_whatever_the_rule() {
        assert_eq!(
            slot(&limit("per-ip", "203.0.113.9")),
            slot(&limit("search", "203.0.113.9"))
        );
        // The cluster specification's examples: CRC16("123456789") = 0x31C3, and a key
        // hashes by its tag (a real cluster's `CLUSTER KEYSLOT` agrees: tests/redis_store.rs).
        assert_eq!(slot("123456789"), 0x31C3);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
    }
}
