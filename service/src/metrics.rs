//! Prometheus metrics: one [`Registry`] per node, built with the node and encoded by
//! `prometheus-client` in the Prometheus text format (version 0.0.4), so every series is
//! named, typed and its label values escaped in one place.
//!
//! The hot path does not format or allocate: a counter is bumped with one relaxed atomic
//! add, as it was before the registry (only a rule name's first check takes a write lock, to
//! add its counters). Counters other modules bump directly (the RLQS service's here, a
//! region's in [`crate::region`]) stay plain atomics, read at scrape time by a
//! [`Collector`]; a rule's check counters are found by its name under a read lock, so no
//! label set is built per check (`RuleChecks`).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

mod latency;
mod rules;

pub use latency::{Api, CheckTimer};
use latency::{CheckLatency, Latency};
use rules::{BuildInfo, RulesInForce};
use sluice_core::rules::RuleSet;
use sluice_core::Decision;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// How a rule's check ended, the `decision` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted.
    Allowed = 0,
    /// Denied (enforced).
    Denied = 1,
    /// A shadow rule that would have denied.
    ShadowDenied = 2,
}

const VERDICTS: [&str; 3] = ["allowed", "denied", "shadow_denied"];
/// The index of a rule's near-limit count, after its verdicts'.
const NEAR_LIMIT: usize = VERDICTS.len();

/// A rule's name and its check counts: one per [`Verdict`], then near-limit.
pub type RuleCounts = (Arc<str>, [u64; 4]);

/// A decision allowed with at most a fifth of its limit left.
fn near_limit(d: &Decision) -> bool {
    d.allowed && d.limit > 0 && d.remaining.saturating_mul(5) <= d.limit
}

/// The node's counters, and the registry that exposes them with the rest of the node's.
///
/// Series are named without the `sluice_` prefix (the registry's) and a counter without
/// its `_total` (the encoder's); help texts without their final stop (the registry's).
pub struct Metrics {
    registry: Registry,
    checks: RuleChecks,
    check_latency: CheckLatency,
    rules_in_force: RulesInForce,
    store_latency: Latency,
    store_errors: Counter,
    degraded: Counter,
    lease_calls: Counter,
    leases_granted: Counter,
    lease_units_granted: Counter,
    leases_returned: Counter,
    lease_units_returned: Counter,
    reloads_ok: Counter,
    reloads_error: Counter,
    unauthenticated: Counter,
    waits_refused: Counter,
    refused_from_memory: Counter,
    refusals_remembered: Gauge,
    fallback_keys: Gauge,
    fallback_settled: Counter,
    fallback_unsettled: Counter,
    slots_taken: Counter,
    slots_released: Counter,
    slots_renewed: Counter,
    slots_not_found: Counter,
    /// The rate limit quota service's counters.
    pub rlqs: Arc<RlqsStats>,
}

/// The label of `sluice_rules_reloads_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let checks = RuleChecks::default();
        registry.register("checks", "Rule evaluations by outcome", checks.clone());
        registry.register(
            "checks_near_limit",
            "Checks a rule allowed with at most a fifth of its limit left",
            NearLimit(checks.clone()),
        );
        let check_latency = CheckLatency::default();
        registry.register(
            "check_duration_seconds",
            "Time to decide a check, by API (rlqs: a store exchange deciding assignments)",
            check_latency.clone(),
        );
        let rules_in_force = RulesInForce::default();
        registry.register_collector(Box::new(rules_in_force.clone()));
        registry.register_collector(Box::new(BuildInfo));
        let store_latency = Latency::default();
        registry.register(
            "store_latency_seconds",
            "Latency of counter store calls",
            store_latency.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        let reloads_ok = reloads.get_or_create(&ReloadLabels { result: "ok" }).clone();
        let reloads_error = reloads.get_or_create(&ReloadLabels { result: "error" }).clone();
        registry.register("rules_reloads", "Rule reloads by result", reloads);
        let rlqs = Arc::new(RlqsStats::default());
        registry
            .sub_registry_with_prefix("rlqs")
            .register_collector(Box::new(rlqs.clone()));
        let r = &mut registry;
        Metrics {
            store_errors: counter(r, "store_errors", "Counter store calls that failed"),
            degraded: counter(r, "degraded", "Rule decisions taken by the local fallback"),
            lease_calls: counter(r, "lease_calls", "Lease calls answered (POST /v1/lease, 200)"),
            leases_granted: counter(r, "leases_granted", "Leases asked for and answered (some with 0 units)"),
            lease_units_granted: counter(r, "lease_units_granted", "Units of quota granted in leases"),
            leases_returned: counter(
                r,
                "leases_returned",
                "Lease returns handled (some taking back 0 units: the lease had ended)",
            ),
            lease_units_returned: counter(r, "lease_units_returned", "Units of quota leases gave back unspent"),
            unauthenticated: counter(
                r,
                "unauthenticated",
                "Calls to the data API (HTTP or gRPC) refused for a missing or wrong credential",
            ),
            waits_refused: counter(
                r,
                "waits_refused",
                "GET /v1/wait calls refused at once: the node held --max-waits already",
            ),
            refused_from_memory: counter(
                r,
                "checks_refused_from_memory",
                "Limits refused (and lease asks granted nothing) by a refusal the node remembered, without a store call (the store's retry_after not over)",
            ),
            fallback_settled: counter(
                r,
                "fallback_settled_units",
                "Units the fallback admitted while the store was away, spent in the store once it answered",
            ),
            fallback_unsettled: counter(
                r,
                "fallback_unsettled_units",
                "Units the fallback admitted that were not kept to be spent in the store (--max-keys reached)",
            ),
            slots_taken: counter(
                r,
                "slots_taken",
                "Concurrency slots taken by the checks admitted (named in their answers); less those given back and those held now, the slots that expired unreleased",
            ),
            slots_released: counter(
                r,
                "slots_released",
                "Concurrency slots given back when their request ended (POST /v1/slots)",
            ),
            slots_renewed: counter(
                r,
                "slots_renewed",
                "Concurrency slots renewed while their request ran (POST /v1/slots, renew)",
            ),
            slots_not_found: counter(
                r,
                "slots_not_found",
                "Concurrency slots a release or renewal named that were no longer held: expired first (a holder too slow to renew, or gone), or given back already",
            ),
            refusals_remembered: {
                let gauge = Gauge::default();
                r.register(
                    "refusals_remembered",
                    "Refusals the node remembers, each until its retry_after (bounded by --max-refusals)",
                    gauge.clone(),
                );
                gauge
            },
            fallback_keys: {
                let gauge = Gauge::default();
                r.register(
                    "fallback_keys",
                    "Keys the node's fallback buckets hold, read at each scrape (bounded by --max-keys)",
                    gauge.clone(),
                );
                gauge
            },
            registry,
            checks,
            check_latency,
            rules_in_force,
            store_latency,
            reloads_ok,
            reloads_error,
            rlqs,
        }
    }
}

/// A counter registered in `registry` as `name` (`_total` is added when encoded).
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let counter = Counter::default();
    registry.register(name, help, counter.clone());
    counter
}

impl Metrics {
    /// The node's registry (prefix `sluice`), for the node's other parts to register their
    /// metrics in while the node is built ([`crate::region::Region::register_metrics`]).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Counts one rule's verdict.
    pub fn check(&self, rule: &str, verdict: Verdict) {
        self.checks.count(rule, verdict as usize);
    }

    /// Counts `n` concurrency slots taken by an admitted check.
    pub fn slots_taken(&self, n: u64) {
        self.slots_taken.inc_by(n);
    }

    /// Counts a concurrency slot a release or renewal named that was no longer held.
    pub fn slot_not_found(&self) {
        self.slots_not_found.inc();
    }

    /// Counts `n` concurrency slots given back, or renewed.
    pub fn slots(&self, renewed: bool, n: u64) {
        let counter = if renewed {
            &self.slots_renewed
        } else {
            &self.slots_released
        };
        counter.inc_by(n);
    }

    /// Counts a check `rule` allowed with at most a fifth of its limit left (nothing when
    /// `decision` denied, or left more).
    pub fn near_limit(&self, rule: &str, decision: &Decision) {
        if near_limit(decision) {
            self.checks.count(rule, NEAR_LIMIT);
        }
    }

    /// Counts every decided rule of one check (its verdict, and whether it allowed it near
    /// its limit) under one read lock.
    pub fn checks<'d>(&self, decided: impl IntoIterator<Item = (&'d str, &'d Decision, Verdict)>) {
        let map = self.checks.0.read().unwrap_or_else(|p| p.into_inner());
        let mut new = Vec::new();
        for (rule, decision, verdict) in decided {
            let Some(c) = map.get(rule) else {
                new.push((rule, *decision, verdict));
                continue;
            };
            c[verdict as usize].fetch_add(1, Ordering::Relaxed);
            if near_limit(decision) {
                c[NEAR_LIMIT].fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(map);
        for (rule, decision, verdict) in new {
            self.check(rule, verdict);
            self.near_limit(rule, &decision);
        }
    }

    /// Every rule's check counts so far (each [`Verdict`]'s, then near-limit), by name: what
    /// the console samples for its rates.
    pub fn rule_counts(&self) -> Vec<RuleCounts> {
        self.checks.snapshot()
    }

    /// Times a check of `api` until the timer is dropped.
    pub fn time_check(&self, api: Api) -> CheckTimer<'_> {
        CheckTimer::start(self.check_latency.of(api))
    }

    /// Records `rules`, of published `version` (0: not published), as put in force now:
    /// `sluice_rule_limit`, `sluice_rule_period_seconds`, `sluice_rules_version` and
    /// `sluice_rules_loaded_timestamp_seconds` show them from the next scrape.
    pub fn rules_in_force(&self, rules: &RuleSet, version: u64) {
        self.rules_in_force.set(rules, version);
    }

    /// Records one store call's latency.
    pub fn store_latency(&self, d: Duration) {
        self.store_latency.observe(d);
    }

    /// Counts a store error.
    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    /// Counts a decision taken by the local fallback.
    pub fn degraded(&self) {
        self.degraded.inc();
    }

    /// Counts units the fallback admitted that were spent in the store once it answered.
    pub fn fallback_settled(&self, units: u64) {
        self.fallback_settled.inc_by(units);
    }

    /// Counts units the fallback admitted that could not be kept to be spent in the store.
    pub fn fallback_unsettled(&self, units: u64) {
        self.fallback_unsettled.inc_by(units);
    }

    /// Counts a limit refused by a remembered refusal, and how many are remembered.
    pub fn refused_from_memory(&self, remembered: usize) {
        self.refused_from_memory.inc();
        self.refusals_remembered(remembered);
    }

    /// How many refusals the node remembers now.
    pub fn refusals_remembered(&self, remembered: usize) {
        self.refusals_remembered
            .set(i64::try_from(remembered).unwrap_or(i64::MAX));
    }

    /// How many keys the node's fallback buckets hold now (set before each scrape).
    pub fn fallback_keys(&self, keys: usize) {
        self.fallback_keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// Counts a lease call answered (`POST /v1/lease`, 200): decisions by leases, beside
    /// the exact checks `sluice_checks_total` counts.
    pub fn lease_call(&self) {
        self.lease_calls.inc();
    }

    /// Counts a lease granted with `units` (0: asked, none left).
    ///
    /// Renewals are not told apart: an ask names a quota, not the lease it follows, and a
    /// proxy gives a lease's units back in whichever call comes next, or not at all once
    /// spent, so the service cannot tell a renewal from a first lease (the filter counts
    /// them, `sluice_filter_leases_renewed`).
    pub fn lease_granted(&self, units: u64) {
        self.leases_granted.inc();
        self.lease_units_granted.inc_by(units);
    }

    /// Counts a lease's return and the `units` it gave back (0: ended, or none held).
    pub fn lease_returned(&self, units: u64) {
        self.leases_returned.inc();
        self.lease_units_returned.inc_by(units);
    }

    /// Counts a call to the data API refused for want of its credential.
    pub fn unauthenticated(&self) {
        self.unauthenticated.inc();
    }

    /// Counts a `/v1/wait` refused because the node holds as many as it may.
    pub fn wait_refused(&self) {
        self.waits_refused.inc();
    }

    /// Counts a rules reload.
    pub fn reload(&self, ok: bool) {
        if ok { &self.reloads_ok } else { &self.reloads_error }.inc();
    }

    /// Everything the node's registry holds, in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        if prometheus_text::encode(&mut out, &self.registry).is_err() {
            // Writing to a String does not fail, nor does encoding what this module reads.
            tracing::error!("the metrics could not be encoded");
        }
        out
    }
}

/// A rule's check counters, one per [`Verdict`] and one of checks near the limit, by rule
/// name: a check finds its rule's under a read lock, by the `&str` it has, with no label
/// set built; the first check of a rule name takes the write lock to add it. The family
/// `sluice_checks_total`, encoded sorted by rule ([`NearLimit`] encodes the last count).
#[derive(Debug, Clone, Default)]
struct RuleChecks(Arc<RwLock<HashMap<Arc<str>, [AtomicU64; 4]>>>);

/// The labels of `sluice_checks_total`, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CheckLabels {
    rule: Arc<str>,
    decision: &'static str,
}

impl RuleChecks {
    /// Adds one to `rule`'s count `i` (a [`Verdict`], or [`NEAR_LIMIT`]).
    fn count(&self, rule: &str, i: usize) {
        if let Some(c) = self.0.read().unwrap_or_else(|p| p.into_inner()).get(rule) {
            c[i].fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        map.entry(rule.into()).or_default()[i].fetch_add(1, Ordering::Relaxed);
    }
}

impl RuleChecks {
    /// A copy of the counts sorted by rule, so checks do not wait on the encoding.
    fn snapshot(&self) -> Vec<RuleCounts> {
        let mut rules: Vec<RuleCounts> = {
            let map = self.0.read().unwrap_or_else(|p| p.into_inner());
            map.iter()
                .map(|(rule, c)| (rule.clone(), c.each_ref().map(|c| c.load(Ordering::Relaxed))))
                .collect()
        };
        rules.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        rules
    }
}

impl TypedMetric for RuleChecks {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for RuleChecks {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        for (rule, counts) in self.snapshot() {
            for (decision, n) in VERDICTS.into_iter().zip(counts) {
                let labels = CheckLabels {
                    rule: rule.clone(),
                    decision,
                };
                ConstCounter::new(n).encode(encoder.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The family `sluice_checks_near_limit_total`: each rule's count of checks it allowed
/// with at most a fifth of its limit left, from [`RuleChecks`].
#[derive(Debug, Clone)]
struct NearLimit(RuleChecks);

impl TypedMetric for NearLimit {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for NearLimit {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        for (rule, counts) in self.0.snapshot() {
            ConstCounter::new(counts[NEAR_LIMIT]).encode(encoder.encode_family(&[("rule", rule)])?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Counters of the RLQS service, bumped by [`crate::grpc::rlqs`]; the series
/// `sluice_rlqs_*`.
#[derive(Debug, Default)]
pub struct RlqsStats {
    /// Bucket usages read from reports.
    pub reports: AtomicU64,
    /// Usages ignored, and why.
    pub ignored: AtomicU64,
    /// Assignments sent (token buckets and blankets).
    pub assignments: AtomicU64,
    /// Of them, `DENY_ALL` for want of units.
    pub denials: AtomicU64,
    /// Buckets abandoned (idle, unknown, or their rule gone).
    pub abandoned: AtomicU64,
    /// Store exchanges, and the grants they carried.
    pub exchanges: AtomicU64,
    /// See [`RlqsStats::exchanges`].
    pub grants: AtomicU64,
    /// Units of quota those grants took, and units replaced buckets gave back.
    pub units_granted: AtomicU64,
    /// See [`RlqsStats::units_granted`].
    pub units_returned: AtomicU64,
    /// Streams and buckets held now.
    pub streams: AtomicU64,
    /// See [`RlqsStats::streams`].
    pub buckets: AtomicU64,
}

impl Collector for RlqsStats {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let counters = [
            ("usages", "Bucket usages read from RLQS reports.", &self.reports),
            (
                "usages_ignored",
                "Bucket usages ignored: ill-formed, or past the bucket limits.",
                &self.ignored,
            ),
            ("assignments", "RLQS assignments sent.", &self.assignments),
            (
                "denials",
                "RLQS assignments that were DENY_ALL for want of units.",
                &self.denials,
            ),
            (
                "abandoned",
                "RLQS buckets abandoned (idle, unknown, or their rule gone).",
                &self.abandoned,
            ),
            (
                "exchanges",
                "RLQS store exchanges (one per tick with grants due).",
                &self.exchanges,
            ),
            ("grants", "Grants asked for in RLQS store exchanges.", &self.grants),
            (
                "units_granted",
                "Units of quota the grants of RLQS store exchanges took.",
                &self.units_granted,
            ),
            (
                "units_returned",
                "Units of quota replaced RLQS buckets gave back.",
                &self.units_returned,
            ),
        ];
        for (name, help, v) in counters {
            encode_one(&mut encoder, name, help, ConstCounter::new(v.load(Ordering::Relaxed)))?;
        }
        let gauges = [
            ("streams", "RLQS streams open.", &self.streams),
            ("buckets", "RLQS buckets followed.", &self.buckets),
        ];
        for (name, help, v) in gauges {
            encode_one(&mut encoder, name, help, ConstGauge::new(v.load(Ordering::Relaxed)))?;
        }
        Ok(())
    }
}

/// Encodes `metric`, a series with no labels but its registry's, as `name` (after the
/// registry's prefix; a counter's `_total` added), for a [`Collector`]. `help` is written as
/// given.
pub(crate) fn encode_one<M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric: M,
) -> fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, M::TYPE)?)
}

/// Encodes `series`, a metric for each label set, as the family `name`, for a
/// [`Collector`]: as [`encode_one`], the label set's labels after the registry's.
pub(crate) fn encode_family<S: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (S, M)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::latency::BUCKETS;
    use super::*;
    use crate::region::{Region, RegionConfig, Source};
    use crate::store::memory::MemoryStore;
    use crate::store::Store;
    use sluice_core::Micros;

    /// A node's metrics with a region named `region`, every counter bumped once or more.
    fn text(rule: &str, region: &str) -> String {
        let config = RegionConfig {
            name: region.into(),
            ..RegionConfig::default()
        };
        let region = Region::new(Store::Memory(MemoryStore::new(16)), config);
        let mut m = Metrics::default();
        region.register_metrics(m.registry_mut());
        m.check(rule, Verdict::Allowed);
        m.check(rule, Verdict::Allowed);
        m.check(rule, Verdict::ShadowDenied);
        for remaining in [21, 20, 0] {
            let decision = Decision {
                allowed: true,
                limit: 100,
                remaining,
                reset_after: Micros::ZERO,
                retry_after: Micros::ZERO,
                delay: Micros::ZERO,
            };
            m.near_limit(rule, &decision);
            m.near_limit(
                rule,
                &Decision {
                    allowed: false,
                    ..decision
                },
            );
        }
        drop(m.time_check(Api::Http));
        drop(m.time_check(Api::Rlqs));
        drop(m.time_check(Api::Rlqs));
        let rules =
            "[[rule]]\nname = \"per-ip\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n";
        m.rules_in_force(&RuleSet::from_toml(rules).expect("valid rules"), 7);
        m.store_latency(Duration::from_micros(300));
        m.store_latency(Duration::from_millis(70));
        m.store_latency(Duration::from_secs(2));
        m.store_error();
        m.degraded();
        m.lease_call();
        m.lease_granted(5);
        m.lease_returned(2);
        m.unauthenticated();
        m.wait_refused();
        m.reload(true);
        m.reload(false);
        m.reload(false);
        m.rlqs.reports.fetch_add(3, Ordering::Relaxed);
        m.rlqs.buckets.store(4, Ordering::Relaxed);
        region.count(Source::Cold);
        region.count(Source::Cold);
        region.count(Source::CutOff);
        m.render()
    }

    /// The build info series, as this build labels it.
    fn build_info() -> String {
        match option_env!("SLUICE_GIT_SHA").filter(|s| !s.is_empty()) {
            Some(sha) => format!(
                r#"sluice_build_info{{version="{}",git_sha="{sha}"}}"#,
                env!("CARGO_PKG_VERSION")
            ),
            None => format!(r#"sluice_build_info{{version="{}"}}"#, env!("CARGO_PKG_VERSION")),
        }
    }

    /// The series a node exports: names and labels as dashboards, tests and docs read them
    /// (the label order too: tests match a series by its text).
    #[test]
    fn every_series_keeps_its_name_and_labels() {
        let text = text("per-ip", "r0");
        let series: BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').expect("a value").0)
            .collect();
        let mut expected: BTreeSet<String> = [
            "sluice_store_latency_seconds_sum",
            "sluice_store_latency_seconds_count",
            "sluice_store_errors_total",
            "sluice_degraded_total",
            "sluice_lease_calls_total",
            "sluice_leases_granted_total",
            "sluice_lease_units_granted_total",
            "sluice_leases_returned_total",
            "sluice_lease_units_returned_total",
            "sluice_unauthenticated_total",
            "sluice_waits_refused_total",
            "sluice_checks_refused_from_memory_total",
            "sluice_refusals_remembered",
            "sluice_fallback_keys",
            "sluice_fallback_settled_units_total",
            "sluice_fallback_unsettled_units_total",
            "sluice_slots_taken_total",
            "sluice_slots_released_total",
            "sluice_slots_renewed_total",
            "sluice_slots_not_found_total",
            "sluice_rlqs_usages_total",
            "sluice_rlqs_usages_ignored_total",
            "sluice_rlqs_assignments_total",
            "sluice_rlqs_denials_total",
            "sluice_rlqs_abandoned_total",
            "sluice_rlqs_exchanges_total",
            "sluice_rlqs_grants_total",
            "sluice_rlqs_units_granted_total",
            "sluice_rlqs_units_returned_total",
            "sluice_rlqs_streams",
            "sluice_rlqs_buckets",
            r#"sluice_rules_reloads_total{result="ok"}"#,
            r#"sluice_rules_reloads_total{result="error"}"#,
            r#"sluice_global_link_up{region="r0"}"#,
            r#"sluice_rule_limit{rule="per-ip"}"#,
            r#"sluice_rule_period_seconds{rule="per-ip"}"#,
            "sluice_rules_version",
            "sluice_rules_loaded_timestamp_seconds",
        ]
        .map(String::from)
        .into();
        expected.insert(format!(
            r#"sluice_checks_near_limit_total{{rule="{rule}"}}"#,
            rule = "per-ip"
        ));
        expected.insert(build_info());
        for api in ["http", "grpc_rls", "rlqs"] {
            for part in ["sum", "count"] {
                expected.insert(format!(r#"sluice_check_duration_seconds_{part}{{api="{api}"}}"#));
            }
            for le in BUCKETS.map(|b| b.to_string()).into_iter().chain(["+Inf".into()]) {
                expected.insert(format!(
                    r#"sluice_check_duration_seconds_bucket{{api="{api}",le="{le}"}}"#
                ));
            }
        }
        for decision in ["allowed", "denied", "shadow_denied"] {
            expected.insert(format!(r#"sluice_checks_total{{rule="per-ip",decision="{decision}"}}"#));
        }
        for le in BUCKETS
            .map(|b| b.to_string())
            .iter()
            .map(String::as_str)
            .chain(["+Inf"])
        {
            expected.insert(format!(r#"sluice_store_latency_seconds_bucket{{le="{le}"}}"#));
        }
        for (name, label, values) in [
            ("lease_calls", "result", &["ok", "failed"][..]),
            ("lease_units", "kind", &["granted", "returned"]),
            ("sublease_units", "kind", &["handed_on", "taken_back"]),
            (
                "checks",
                "source",
                &[
                    "pool",
                    "empty",
                    "cut_off",
                    "alone",
                    "cold",
                    "cold_over_cap",
                    "cold_timed_out",
                ],
            ),
        ] {
            for v in values {
                expected.insert(format!(r#"sluice_global_{name}_total{{region="r0",{label}="{v}"}}"#));
            }
        }
        let expected: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
        assert_eq!(series, expected, "{text}");
        // A family's HELP and TYPE name it as its series do, and each help is one sentence.
        let text = format!("\n{text}");
        for l in text.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(l.ends_with('.') && !l.ends_with(".."), "{l}");
        }
        for name in ["sluice_checks_total", "sluice_global_link_up", "sluice_rlqs_streams"] {
            assert!(text.contains(&format!("\n# HELP {name} ")), "{text}");
        }
        for typed in [
            "sluice_checks_total counter",
            "sluice_store_latency_seconds histogram",
            "sluice_rules_reloads_total counter",
            "sluice_rlqs_buckets gauge",
            "sluice_global_link_up gauge",
            "sluice_global_checks_total counter",
            "sluice_checks_near_limit_total counter",
            "sluice_check_duration_seconds histogram",
            "sluice_rule_limit gauge",
            "sluice_rule_period_seconds gauge",
            "sluice_rules_version gauge",
            "sluice_rules_loaded_timestamp_seconds gauge",
            "sluice_build_info gauge",
        ] {
            assert!(text.contains(&format!("\n# TYPE {typed}\n")), "{typed}: {text}");
        }
    }

    #[test]
    fn values_are_counted_and_buckets_cumulative() {
        let text = text("per-ip", "r0");
        for line in [
            r#"sluice_checks_total{rule="per-ip",decision="allowed"} 2"#,
            r#"sluice_checks_total{rule="per-ip",decision="denied"} 0"#,
            r#"sluice_checks_total{rule="per-ip",decision="shadow_denied"} 1"#,
            r#"sluice_store_latency_seconds_bucket{le="0.00025"} 0"#,
            r#"sluice_store_latency_seconds_bucket{le="0.0005"} 1"#,
            r#"sluice_store_latency_seconds_bucket{le="0.05"} 1"#,
            r#"sluice_store_latency_seconds_bucket{le="0.1"} 2"#,
            r#"sluice_store_latency_seconds_bucket{le="1"} 2"#,
            r#"sluice_store_latency_seconds_bucket{le="+Inf"} 3"#,
            "sluice_store_latency_seconds_sum 2.0703",
            "sluice_store_latency_seconds_count 3",
            "sluice_lease_units_granted_total 5",
            "sluice_lease_units_returned_total 2",
            r#"sluice_rules_reloads_total{result="ok"} 1"#,
            r#"sluice_rules_reloads_total{result="error"} 2"#,
            "sluice_rlqs_usages_total 3",
            "sluice_rlqs_buckets 4",
            r#"sluice_global_link_up{region="r0"} 1"#,
            r#"sluice_global_checks_total{region="r0",source="cold"} 2"#,
            r#"sluice_global_checks_total{region="r0",source="cut_off"} 1"#,
            r#"sluice_global_checks_total{region="r0",source="pool"} 0"#,
            // Allowed with 20 and 0 of 100 left; not with 21, nor any denial.
            r#"sluice_checks_near_limit_total{rule="per-ip"} 2"#,
            r#"sluice_check_duration_seconds_count{api="http"} 1"#,
            r#"sluice_check_duration_seconds_count{api="grpc_rls"} 0"#,
            r#"sluice_check_duration_seconds_count{api="rlqs"} 2"#,
            r#"sluice_check_duration_seconds_bucket{api="rlqs",le="+Inf"} 2"#,
            r#"sluice_rule_limit{rule="per-ip"} 100"#,
            r#"sluice_rule_period_seconds{rule="per-ip"} 60.0"#,
            "sluice_rules_version 7",
            &format!("{} 1", build_info()),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
    }

    /// Rule and region names are label values, escaped as the text format says (`\`, `"`
    /// and a line feed), the same way for both.
    #[test]
    fn label_values_are_escaped() {
        let text = text("a \"b\" \\ c\nd", "eu \"west\"\\1");
        for line in [
            r#"sluice_checks_total{rule="a \"b\" \\ c\nd",decision="allowed"} 2"#,
            r#"sluice_global_link_up{region="eu \"west\"\\1"} 1"#,
            r#"sluice_global_lease_calls_total{region="eu \"west\"\\1",result="ok"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
    }
}
