//! The rules in force as operators alert on them: each rule's configured limit and period,
//! the rules' published version and when this node put them in force; and the build.
//!
//! Read at scrape time from what the node last put in force ([`RulesInForce::set`]), so a
//! removed rule's series go with the reload that removed it. One series per rule name:
//! rule names are the operator's, never a client's.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use sluice_core::rules::RuleSet;

use super::{encode_family, encode_one};

/// A rule's configured limit, as exported.
#[derive(Debug, Clone, PartialEq)]
struct RuleLimit {
    name: String,
    limit: u64,
    period_s: f64,
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<RuleLimit>,
    version: u64,
    loaded_at_s: f64,
}

/// The collector of `sluice_rule_limit`, `sluice_rule_period_seconds`,
/// `sluice_rules_version` and `sluice_rules_loaded_timestamp_seconds`.
#[derive(Debug, Clone, Default)]
pub(super) struct RulesInForce(Arc<RwLock<State>>);

impl RulesInForce {
    /// Records `rules`, of published `version` (0: not published), as put in force now.
    pub(super) fn set(&self, rules: &RuleSet, version: u64) {
        let mut exported: Vec<RuleLimit> = rules
            .rules()
            .iter()
            .map(|r| RuleLimit {
                name: r.name.clone(),
                limit: r.limit.limit(),
                period_s: r.window_ms as f64 / 1e3,
            })
            .collect();
        exported.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let loaded_at_s = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = State {
            rules: exported,
            version,
            loaded_at_s,
        };
    }
}

impl Collector for RulesInForce {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let state = self.0.read().unwrap_or_else(|p| p.into_inner());
        let by_rule = |r: &RuleLimit| [("rule", r.name.clone())];
        encode_family(
            &mut encoder,
            "rule_limit",
            "Requests (or cost units) each rule admits per period, as configured.",
            state.rules.iter().map(|r| (by_rule(r), ConstGauge::new(r.limit))),
        )?;
        encode_family(
            &mut encoder,
            "rule_period_seconds",
            "The period (window) of each rule's limit, in seconds.",
            state.rules.iter().map(|r| (by_rule(r), ConstGauge::new(r.period_s))),
        )?;
        encode_one(
            &mut encoder,
            "rules_version",
            "Published version of the rules in force (0: not published).",
            ConstGauge::new(state.version),
        )?;
        encode_one(
            &mut encoder,
            "rules_loaded_timestamp_seconds",
            "When this node put the rules in force, in seconds since the Unix epoch.",
            ConstGauge::new(state.loaded_at_s),
        )
    }
}

/// `sluice_build_info`: 1, labelled with the crate's version and, when the build was given
/// one in `SLUICE_GIT_SHA`, the commit.
#[derive(Debug)]
pub(super) struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let mut labels = vec![("version", env!("CARGO_PKG_VERSION"))];
        if let Some(sha) = option_env!("SLUICE_GIT_SHA").filter(|s| !s.is_empty()) {
            labels.push(("git_sha", sha));
        }
        encode_family(
            &mut encoder,
            "build_info",
            "Always 1: the build of this node, in its labels.",
            [(labels, ConstGauge::new(1u64))],
        )
    }
}
