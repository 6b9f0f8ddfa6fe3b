//! From Envoy's `BucketId` to a Sluice quota: which rule, which identity.
//!
//! - The rule: the entry `rule` names it; without one, the stream's domain does.
//! - The identity: the entry whose key is the rule's `by` as the rules file writes it (`ip`,
//!   `user`, `api_key`, `tier`, `header:<name>`); a `global` rule needs none. Without it the
//!   rule's `when_missing` decides, as for a check: `deny` refuses, `skip` leaves the bucket
//!   unknown, `count` counts it under the shared missing identity.
//! - The rule must be leased (`lease = true`): an assignment is a lease.

use std::collections::BTreeMap;

use sluice_core::identity::ip_identity;
use sluice_core::rules::{Identity, Rule, RuleSet};

/// Entries a bucket id may have, and bytes in one key or value, at most.
pub const MAX_ENTRIES: usize = 32;
/// See [`MAX_ENTRIES`].
pub const MAX_ENTRY_BYTES: usize = 1_024;

/// A bucket id as Sluice keeps it: its entries in key order (Envoy's map has none).
pub type BucketKey = BTreeMap<String, String>;

/// Why a bucket id is not read at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// No entries.
    Empty,
    /// More than [`MAX_ENTRIES`] entries.
    TooManyEntries,
    /// An empty key or value, or one over [`MAX_ENTRY_BYTES`].
    BadEntry,
}

impl Malformed {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Malformed::Empty => "empty_bucket_id",
            Malformed::TooManyEntries => "too_many_entries",
            Malformed::BadEntry => "bad_entry",
        }
    }
}

/// `entries` as a [`BucketKey`], if well formed.
pub fn key_of(entries: &std::collections::HashMap<String, String>) -> Result<BucketKey, Malformed> {
    if entries.is_empty() {
        return Err(Malformed::Empty);
    }
    if entries.len() > MAX_ENTRIES {
        return Err(Malformed::TooManyEntries);
    }
    let fine = |s: &String| !s.is_empty() && s.len() <= MAX_ENTRY_BYTES;
    if !entries.iter().all(|(k, v)| fine(k) && fine(v)) {
        return Err(Malformed::BadEntry);
    }
    Ok(entries.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// What a bucket stands for under the rules in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The quota of `rule` for `identity`.
    Of {
        /// The rule's name.
        rule: String,
        /// The identity, grouped as a check groups it (IPv6 by network).
        identity: String,
    },
    /// The rule refuses the bucket outright (`when_missing = "deny"` and no identity).
    Refused,
    /// No leased rule matches: the unknown-bucket policy answers.
    Unknown,
}

/// The quota `key` stands for in a stream of `domain`.
pub fn resolve(key: &BucketKey, domain: &str, rules: &RuleSet, ipv6_prefix: u8) -> Resolved {
    let name = key.get("rule").map_or(domain, String::as_str);
    let Some(rule) = rules.rule(name).filter(|r| r.lease_ttl.is_some()) else {
        return Resolved::Unknown;
    };
    match identity(rule, key) {
        Some(id) if rule.refuses(&id) => Resolved::Refused,
        Some(id) => Resolved::Of {
            rule: rule.name.clone(),
            identity: if rule.by == Identity::Ip {
                ip_identity(&id, ipv6_prefix).into_owned()
            } else {
                id
            },
        },
        None => Resolved::Unknown,
    }
}

/// The identity `rule` counts `key` under, as a check would (`None`: the rule skips it).
fn identity(rule: &Rule, key: &BucketKey) -> Option<String> {
    rule.identity_in(key).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> RuleSet {
        RuleSet::from_toml(
            r#"
            [[rule]]
            name = "per-user"
            by = "user"
            limit = 10
            window = "1s"
            algorithm = "token_bucket"
            lease = true

            [[rule]]
            name = "per-ip"
            by = "ip"
            algorithm = "fixed_window"
            limit = 10
            window = "1s"
            lease = true
            when_missing = "deny"

            [[rule]]
            name = "exact"
            by = "user"
            algorithm = "fixed_window"
            limit = 10
            window = "1s"
            "#,
        )
        .expect("rules parse")
    }

    fn key(entries: &[(&str, &str)]) -> BucketKey {
        entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_rule_entry_or_the_domain_picks_the_rule_and_by_the_identity() {
        let r = rules();
        let of = |rule: &str, identity: &str| Resolved::Of {
            rule: rule.into(),
            identity: identity.into(),
        };
        assert_eq!(
            resolve(&key(&[("rule", "per-user"), ("user", "ann")]), "envoy", &r, 64),
            of("per-user", "ann")
        );
        assert_eq!(
            resolve(&key(&[("user", "ann")]), "per-user", &r, 64),
            of("per-user", "ann")
        );
        assert_eq!(
            resolve(&key(&[("rule", "per-ip"), ("ip", "2001:db8::1")]), "envoy", &r, 64),
            of("per-ip", "2001:db8::/64")
        );
        assert_eq!(resolve(&key(&[("rule", "per-ip")]), "envoy", &r, 64), Resolved::Refused);
        assert_eq!(
            resolve(&key(&[("rule", "exact"), ("user", "a")]), "envoy", &r, 64),
            Resolved::Unknown
        );
        assert_eq!(
            resolve(&key(&[("rule", "nope"), ("user", "a")]), "envoy", &r, 64),
            Resolved::Unknown
        );
        assert_eq!(resolve(&key(&[("user", "a")]), "envoy", &r, 64), Resolved::Unknown);
    }

    #[test]
    fn malformed_ids_are_named() {
        let map = |n: usize, v: &str| (0..n).map(|i| (format!("k{i}"), v.to_string())).collect();
        assert_eq!(key_of(&map(0, "v")), Err(Malformed::Empty));
        assert_eq!(key_of(&map(33, "v")), Err(Malformed::TooManyEntries));
        assert_eq!(key_of(&map(1, "")), Err(Malformed::BadEntry));
        assert_eq!(key_of(&map(1, &"x".repeat(1_025))), Err(Malformed::BadEntry));
        assert_eq!(key_of(&map(2, "v")).map(|k| k.len()), Ok(2));
    }
}
