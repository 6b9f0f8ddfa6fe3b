//! Every `sluice:` name in a shared store, built here and nowhere else.
//!
//! Limit state: `sluice:{<rule>:<identity>}:<suffix>`. Everything between the braces is
//! the Redis Cluster hash tag, so all keys of one limit share a slot. The encoding is
//! injective and keeps exactly one pair of braces whatever a client sends: `%`, `{` and
//! `}` are percent-encoded in both parts (`%25`, `%7B`, `%7D`) and `:` in the rule name
//! (`%3A`), so the first `:` inside the braces always ends the rule name. Names and
//! identities without those characters appear as they are.
//!
//! The published rule set and its version share the tag `{rules}`, so one script updates
//! both on a cluster; changes are announced on [`RULES_CHANNEL`].

use sluice_core::Algorithm;

/// The published rule set's text (TOML).
pub const RULES: &str = "sluice:{rules}";
/// The published rule set's version, bumped by every change.
pub const RULES_VERSION: &str = "sluice:{rules}:version";
/// Pub/sub channel announcing a new rules version.
pub const RULES_CHANNEL: &str = "sluice:rules:changed";
/// The capped stream of violations.
pub const VIOLATIONS: &str = "sluice:violations";

/// The hash-tagged key prefix of one limit: `sluice:{<rule>:<identity>}`.
pub fn limit(rule: &str, identity: &str) -> String {
    let mut key = String::with_capacity(rule.len() + identity.len() + 10);
    key.push_str("sluice:{");
    push_escaped(&mut key, rule, true);
    key.push(':');
    push_escaped(&mut key, identity, false);
    key.push('}');
    key
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
    }
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
    use super::limit;

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(limit("per-ip", "203.0.113.9"), "sluice:{per-ip:203.0.113.9}");
        assert_eq!(limit("per-ip", "2001:db8::1"), "sluice:{per-ip:2001:db8::1}");
        assert_eq!(limit("g", "global"), "sluice:{g:global}");
    }

    #[test]
    fn braces_cannot_move_the_hash_tag_and_keys_do_not_collide() {
        let k = limit("r", "a}b{c");
        assert_eq!(k, "sluice:{r:a%7Db%7Bc}");
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert!(k.ends_with('}'));
        let pairs = [
            ("a:b", "c"),
            ("a", "b:c"),
            ("r", "x}"),
            ("r", "x%7D"),
            ("r", "x)"),
            ("r%", "x"),
            ("r%25", "x"),
        ];
        let keys: std::collections::BTreeSet<String> = pairs.iter().map(|(r, i)| limit(r, i)).collect();
        assert_eq!(keys.len(), pairs.len(), "{keys:?}");
    }
}
