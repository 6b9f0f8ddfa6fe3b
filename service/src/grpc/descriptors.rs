//! Envoy's rate limit descriptors matched against a configuration in envoyproxy/ratelimit's
//! format: a domain, a tree of descriptor keys (a value or any value), a limit per node.
//!
//! Matching follows envoyproxy/ratelimit: a descriptor's entries walk the tree one level per
//! entry, each entry taking the child with its key and value, else one whose value has `*`
//! wildcards matching it, else the child with its key and no value (any value); the limit
//! applies when the walk ends on a node with one at the descriptor's last entry. Each
//! distinct descriptor (its domain, keys and values) counts on its own: a key configured
//! without a value gives every value its own counter, and so does a wildcard unless it
//! sets `share_threshold`. `requests_per_unit: 0` refuses every request.

use std::collections::BTreeSet;

use serde::Deserialize;

use sluice_core::algorithm::{Algorithm, Limit};
use sluice_core::rules::FailureMode;
use sluice_core::time::Micros;

/// One configuration file: a domain and its descriptor tree.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// The domain requests name.
    pub domain: String,
    /// The top level of the tree.
    #[serde(default)]
    pub descriptors: Vec<DescriptorNode>,
}

/// A node of the tree: a key, optionally a value, optionally a limit, and its children.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorNode {
    /// The entry key.
    pub key: String,
    /// The entry value; absent (or empty) matches any value.
    #[serde(default)]
    pub value: Option<String>,
    /// The limit of a descriptor ending here.
    #[serde(default)]
    pub rate_limit: Option<RateLimitSpec>,
    /// Count, never deny.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Accepted for compatibility; Sluice's metrics are per limit name already.
    #[serde(default)]
    pub detailed_metric: bool,
    /// Accepted for compatibility (metric keys), as `detailed_metric`.
    #[serde(default)]
    pub value_to_metric: bool,
    /// A wildcard value's matches share one counter instead of one each.
    #[serde(default)]
    pub share_threshold: bool,
    /// Accepted and ignored: envoyproxy/ratelimit's quota mode.
    #[serde(default)]
    pub quota_mode: bool,
    /// Accepted and ignored.
    #[serde(default)]
    pub metadata: Option<serde::de::IgnoredAny>,
    /// The next level.
    #[serde(default)]
    pub descriptors: Vec<DescriptorNode>,
}

/// A limit: `requests_per_unit` per `unit` (envoyproxy/ratelimit's fields), or unlimited.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// Its name (in responses, headers, metrics and `replaces`).
    #[serde(default)]
    pub name: Option<String>,
    /// `second`, `minute`, `hour` or `day`.
    #[serde(default)]
    pub unit: Option<Unit>,
    /// Requests per unit.
    #[serde(default)]
    pub requests_per_unit: u64,
    /// No limit at all: the descriptor is always under it.
    #[serde(default)]
    pub unlimited: bool,
    /// Limits (by name) this one replaces when both apply to a request.
    #[serde(default)]
    pub replaces: Vec<Replaced>,
    /// Sluice's extension: the algorithm (default `fixed_window`, as envoyproxy/ratelimit).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// Sluice's extension: what happens when the store cannot answer (default `open`).
    #[serde(default)]
    pub failure_mode: Option<FailureMode>,
}

/// A `replaces` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replaced {
    /// The replaced limit's name.
    pub name: String,
}

/// envoyproxy/ratelimit's time units (any case in the file, as there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days (Envoy's `WEEK`, added to its API in December 2024). Fixed windows are
    /// aligned to the Unix epoch, so a week's starts on a Thursday at 00:00 UTC.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts it.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts it.
    Year,
}

impl TryFrom<String> for Unit {
    type Error = String;

    fn try_from(s: String) -> Result<Unit, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => {
                return Err(format!(
                    "invalid rate limit unit {s:?}: use second, minute, hour, day, week, month or year"
                ))
            }
        })
    }
}

impl Unit {
    /// The unit's length.
    pub fn micros(self) -> Micros {
        const DAY: Micros = Micros::from_secs(86_400);
        match self {
            Unit::Second => Micros::SECOND,
            Unit::Minute => Micros::from_secs(60),
            Unit::Hour => Micros::from_secs(3_600),
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }
}

/// A configuration entry that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("domain {domain:?}, descriptor {path}: {problem}")]
pub struct DescriptorError {
    /// The domain.
    pub domain: String,
    /// The keys leading to the entry (`key=value/key`).
    pub path: String,
    /// What is wrong.
    pub problem: String,
    /// The entries leading to it, `(key, value)`, from the top (none for the domain itself):
    /// what finds its line in the file.
    pub entries: Vec<(String, Option<String>)>,
    /// How many entries with the same key and value come before it at its level (1 for
    /// the second of a pair).
    pub earlier: usize,
}

/// A validated limit of the tree.
#[derive(Debug, Clone)]
pub struct DescriptorLimit {
    /// The name: the configured one, else `domain.key_value.key…`.
    pub name: String,
    /// The limit: `None` when unlimited or when it refuses everything (`requests_per_unit: 0`).
    pub limit: Option<Limit>,
    /// No limit at all.
    pub unlimited: bool,
    /// Requests per unit, and the unit, as configured (for the response).
    pub requests_per_unit: u64,
    /// The configured unit.
    pub unit: Option<Unit>,
    /// Count, never deny.
    pub shadow: bool,
    /// The store-failure policy.
    pub failure: FailureMode,
    /// Names of the limits this one replaces.
    pub replaces: Vec<String>,
}

/// A validated tree node.
#[derive(Debug, Clone)]
struct Node {
    key: String,
    value: Option<String>,
    share_threshold: bool,
    limit: Option<DescriptorLimit>,
    children: Vec<Node>,
}

/// Whether `value` matches `pattern`, whose `*`s each match any run of characters.
fn wildcard(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        return rest.is_empty(); // no `*` at all: an exact match was wanted
    };
    for part in parts {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Every domain's validated tree.
#[derive(Debug, Clone, Default)]
pub struct DescriptorSet {
    domains: Vec<(String, Vec<Node>)>,
}

impl DescriptorSet {
    /// Validates `configs` (one per file); a domain may appear once. The error is the
    /// first problem of [`DescriptorSet::problems`].
    pub fn new(configs: Vec<DomainConfig>) -> Result<DescriptorSet, DescriptorError> {
        let (set, problems) = DescriptorSet::checked(configs);
        match problems.into_iter().next() {
            Some(first) => Err(first),
            None => Ok(set),
        }
    }

    /// Every problem of `configs`, in file order (none: [`DescriptorSet::new`] takes them).
    pub fn problems(configs: Vec<DomainConfig>) -> Vec<DescriptorError> {
        DescriptorSet::checked(configs).1
    }

    /// The set of the valid parts of `configs`, and every problem of the others.
    fn checked(configs: Vec<DomainConfig>) -> (DescriptorSet, Vec<DescriptorError>) {
        let mut domains: Vec<(String, Vec<Node>)> = Vec::new();
        let mut problems = Vec::new();
        for config in configs {
            let fail = |problem: &str| DescriptorError {
                domain: config.domain.clone(),
                path: String::from("(top)"),
                problem: problem.to_owned(),
                entries: Vec::new(),
                earlier: 0,
            };
            if config.domain.is_empty() {
                problems.push(fail("the domain is empty"));
            } else if domains.iter().any(|(d, _)| *d == config.domain) {
                problems.push(fail("this domain is configured twice"));
            }
            let nodes = nodes(&config.domain, &config.domain, &[], config.descriptors, &mut problems);
            domains.push((config.domain, nodes));
        }
        (DescriptorSet { domains }, problems)
    }

    /// How many limits the tree holds (unlimited ones and those refusing everything
    /// included): what a reload reports as its count of rules.
    pub fn len(&self) -> usize {
        fn count(nodes: &[Node]) -> usize {
            nodes
                .iter()
                .map(|n| usize::from(n.limit.is_some()) + count(&n.children))
                .sum()
        }
        self.domains.iter().map(|(_, nodes)| count(nodes)).sum()
    }

    /// Whether the tree holds no limit at all: every descriptor is allowed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.iter().any(|(d, _)| d == domain)
    }

    /// The limit a descriptor (its entries, `(key, value)`, in order) falls under, if any,
    /// and the identity of its counter: the domain and the entries, `key=value` joined by
    /// `|`, a wildcard that shares its threshold standing for the values it matched.
    pub fn find<'s>(&'s self, domain: &str, entries: &[(&str, &str)]) -> Option<(&'s DescriptorLimit, String)> {
        let (_, top) = self.domains.iter().find(|(d, _)| d == domain)?;
        let mut level: &[Node] = top;
        let mut identity = String::from(domain);
        for (i, &(key, value)) in entries.iter().enumerate() {
            let exact = level.iter().find(|n| n.key == key && n.value.as_deref() == Some(value));
            let pattern = || {
                level.iter().find(|n| {
                    n.key == key
                        && n.value
                            .as_deref()
                            .is_some_and(|p| p.contains('*') && wildcard(p, value))
                })
            };
            let any = || level.iter().find(|n| n.key == key && n.value.is_none());
            let node = exact.or_else(pattern).or_else(any)?;
            let shown = match (&node.value, node.share_threshold) {
                (Some(p), true) => p.as_str(),
                _ => value,
            };
            identity.push('|');
            identity.push_str(key);
            identity.push('=');
            identity.push_str(shown);
            if i + 1 == entries.len() {
                return node.limit.as_ref().map(|l| (l, identity));
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }

    /// The limit a request sets itself for a descriptor (Envoy's per-request override:
    /// `requests_per_unit` per `unit`), as envoyproxy/ratelimit applies it: in a configured
    /// domain it replaces whatever limit the descriptor falls under, and applies even when
    /// none does; never in shadow mode; a fixed window; 0 refuses every request. It keeps
    /// the configured limit's name and failure mode when one matches (else the name is
    /// `domain.key_value…`); its counter is the descriptor's entries' own, apart from the
    /// configured limit's. `None` for a domain not configured.
    pub fn overridden(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        requests_per_unit: u64,
        unit: Unit,
    ) -> Option<(DescriptorLimit, String)> {
        if !self.has_domain(domain) {
            return None;
        }
        let configured = self.find(domain, entries).map(|(l, _)| l);
        let mut identity = String::from(domain);
        let mut path = String::from(domain);
        for (key, value) in entries {
            identity.push_str(&format!("|{key}={value}"));
            path.push_str(&format!(".{key}_{value}"));
        }
        identity.push_str(&format!("|@{requests_per_unit}/{unit:?}"));
        let spec = RateLimitSpec {
            name: Some(configured.map_or(path.clone(), |l| l.name.clone())),
            unit: Some(unit),
            requests_per_unit,
            unlimited: false,
            replaces: Vec::new(),
            algorithm: None,
            failure_mode: configured.map(|l| l.failure),
        };
        // A fixed window of 1 to 2^32 per unit always builds.
        limit(spec, false, &path).ok().map(|l| (l, identity))
    }

    /// The limits of a request's descriptors (`None` where none applies) with their
    /// counters' identities, less those that another applying limit `replaces`.
    pub fn limits_for<'s, 'd>(
        &'s self,
        domain: &str,
        descriptors: impl IntoIterator<Item = &'d [(&'d str, &'d str)]>,
    ) -> Vec<Option<(&'s DescriptorLimit, String)>> {
        let mut found: Vec<_> = descriptors.into_iter().map(|d| self.find(domain, d)).collect();
        let replaced: BTreeSet<String> = found
            .iter()
            .flatten()
            .flat_map(|(l, _)| l.replaces.iter().cloned())
            .collect();
        for slot in &mut found {
            if slot.as_ref().is_some_and(|(l, _)| replaced.contains(&l.name)) {
                *slot = None;
            }
        }
        found
    }
}

/// An entry on the way down the tree, `(key, value)`.
type Step = (String, Option<String>);

/// Validates one level of the tree under `path`, reached by the entries `trail`: its valid
/// nodes; the problems of the others go to `problems`, in file order.
fn nodes(
    domain: &str,
    path: &str,
    trail: &[Step],
    specs: Vec<DescriptorNode>,
    problems: &mut Vec<DescriptorError>,
) -> Vec<Node> {
    let mut out: Vec<Node> = Vec::with_capacity(specs.len());
    let mut seen: Vec<Step> = Vec::with_capacity(specs.len());
    for spec in specs {
        let value = spec.value.filter(|v| !v.is_empty());
        let here = match &value {
            Some(v) => format!("{path}.{}_{v}", spec.key),
            None => format!("{path}.{}", spec.key),
        };
        let mut steps = trail.to_vec();
        steps.push((spec.key.clone(), value.clone()));
        let earlier = seen.iter().filter(|(k, v)| *k == spec.key && *v == value).count();
        seen.push((spec.key.clone(), value.clone()));
        let twice = out.iter().any(|n| n.key == spec.key && n.value == value);
        let checked = if spec.key.is_empty() {
            Err("an entry has an empty key".to_owned())
        } else if twice {
            Err("the same key and value appear twice at this level".to_owned())
        } else if spec.share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            Err("share_threshold needs a wildcard value (one with `*`)".to_owned())
        } else {
            spec.rate_limit.map(|rl| limit(rl, spec.shadow_mode, &here)).transpose()
        };
        let problem = checked.as_ref().err().map(|problem| DescriptorError {
            domain: domain.to_owned(),
            path: here.clone(),
            problem: problem.clone(),
            entries: steps.clone(),
            earlier,
        });
        problems.extend(problem);
        let children = nodes(domain, &here, &steps, spec.descriptors, problems);
        if let Ok(limit) = checked {
            out.push(Node {
                children,
                key: spec.key,
                value,
                share_threshold: spec.share_threshold,
                limit,
            });
        }
    }
    out
}

/// Validates a node's `rate_limit`.
fn limit(spec: RateLimitSpec, shadow: bool, path: &str) -> Result<DescriptorLimit, String> {
    let name = spec.name.filter(|n| !n.is_empty()).unwrap_or_else(|| path.to_owned());
    let replaces = spec.replaces.into_iter().map(|r| r.name).collect();
    let failure = spec.failure_mode.unwrap_or(FailureMode::Open);
    if spec.unlimited {
        if spec.unit.is_some() {
            return Err("an unlimited rate_limit has no unit".into());
        }
        return Ok(DescriptorLimit {
            name,
            limit: None,
            unlimited: true,
            requests_per_unit: 0,
            unit: None,
            shadow,
            failure,
            replaces,
        });
    }
    let unit = spec
        .unit
        .ok_or("rate_limit has no unit: give second, minute, hour, day, week, month or year (or unlimited: true)")?;
    let algorithm = spec.algorithm.unwrap_or(Algorithm::FixedWindow);
    if algorithm == Algorithm::Concurrency {
        return Err(
            "algorithm concurrency cannot be a descriptor's: Envoy's rate limit protocol has no call that gives a \
             slot back when the request ends; put the concurrency rule in the rule file for the filter or /v1/check"
                .into(),
        );
    }
    let built = match spec.requests_per_unit {
        0 => None, // refuses every request
        n => Some(
            Limit::builder(algorithm, n, unit.micros())
                .build()
                .map_err(|e| format!("rate_limit: {e}"))?,
        ),
    };
    Ok(DescriptorLimit {
        name,
        limit: built,
        unlimited: false,
        requests_per_unit: spec.requests_per_unit,
        unit: Some(unit),
        shadow,
        failure,
        replaces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(yaml_like: Vec<DomainConfig>) -> DescriptorSet {
        DescriptorSet::new(yaml_like).unwrap()
    }

    fn node(key: &str, value: Option<&str>, per: u64, children: Vec<DescriptorNode>) -> DescriptorNode {
        DescriptorNode {
            key: key.into(),
            value: value.map(Into::into),
            rate_limit: (per > 0).then(|| RateLimitSpec {
                name: None,
                unit: Some(Unit::Second),
                requests_per_unit: per,
                unlimited: false,
                replaces: vec![],
                algorithm: None,
                failure_mode: None,
            }),
            shadow_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            quota_mode: false,
            metadata: None,
            descriptors: children,
        }
    }

    #[test]
    fn a_descriptor_takes_the_exact_value_then_a_prefix_then_any_value() {
        let s = set(vec![DomainConfig {
            domain: "d".into(),
            descriptors: vec![
                node("k", Some("exact"), 1, vec![]),
                node("k", Some("pre*"), 2, vec![]),
                node("k", None, 3, vec![]),
            ],
        }]);
        let per = |v: &str| s.find("d", &[("k", v)]).map(|(l, _)| l.requests_per_unit);
        assert_eq!((per("exact"), per("prefix"), per("other")), (Some(1), Some(2), Some(3)));
        assert!(s.find("other-domain", &[("k", "exact")]).is_none());
    }

    #[test]
    fn a_limit_applies_only_where_the_descriptor_ends() {
        let s = set(vec![DomainConfig {
            domain: "d".into(),
            descriptors: vec![node("a", None, 5, vec![node("b", Some("x"), 7, vec![])])],
        }]);
        assert_eq!(s.find("d", &[("a", "1")]).map(|(l, _)| l.requests_per_unit), Some(5));
        let (limit, identity) = s.find("d", &[("a", "1"), ("b", "x")]).unwrap();
        assert_eq!((limit.requests_per_unit, identity.as_str()), (7, "d|a=1|b=x"));
        assert!(s.find("d", &[("a", "1"), ("b", "y")]).is_none(), "no node for b=y");
        assert!(
            s.find("d", &[("a", "1"), ("b", "x"), ("c", "z")]).is_none(),
            "past the tree"
        );
    }

    #[test]
    fn wildcards_match_anywhere_and_may_share_one_counter() {
        assert!(wildcard("/api/*/action", "/api/123/action"));
        assert!(!wildcard("/api/*/action", "/api/123/other"));
        assert!(wildcard("/api/*/resource/*/action", "/api/1/resource/2/action"));
        assert!(wildcard("files/*", "files/"));
        assert!(!wildcard("exact", "exactly"));
        let shared = DescriptorNode {
            share_threshold: true,
            ..node("f", Some("files/*"), 10, vec![])
        };
        let s = set(vec![DomainConfig {
            domain: "d".into(),
            descriptors: vec![shared, node("g", Some("g/*"), 10, vec![])],
        }]);
        let id = |k: &str, v: &str| s.find("d", &[(k, v)]).map(|(_, i)| i);
        assert_eq!(id("f", "files/a.pdf"), id("f", "files/b.csv"), "one shared counter");
        assert_ne!(id("g", "g/a"), id("g", "g/b"), "one counter each");
    }

    #[test]
    fn units_are_read_in_any_case_week_included() {
        let unit = |s: &str| Unit::try_from(s.to_owned());
        assert_eq!(unit("week"), Ok(Unit::Week));
        assert_eq!(unit("WEEK"), Ok(Unit::Week));
        assert_eq!(Unit::Week.micros(), 7 * Unit::Day.micros());
        assert_eq!(unit("Day").map(Unit::micros), Ok(Micros::from_secs(86_400)));
        let e = unit("fortnight").unwrap_err();
        assert!(e.contains("day, week, month"), "{e}");
    }

    #[test]
    fn bad_entries_are_named() {
        let e = DescriptorSet::new(vec![DomainConfig {
            domain: "d".into(),
            descriptors: vec![node(
                "a",
                Some("v"),
                0,
                vec![DescriptorNode {
                    rate_limit: Some(RateLimitSpec {
                        name: None,
                        unit: None,
                        requests_per_unit: 3,
                        unlimited: false,
                        replaces: vec![],
                        algorithm: None,
                        failure_mode: None,
                    }),
                    ..node("b", None, 0, vec![])
                }],
            )],
        }])
        .unwrap_err();
        assert_eq!(e.path, "d.a_v.b");
        assert!(e.to_string().contains("rate_limit has no unit"), "{e}");
    }
}
