//! Prometheus metrics, kept in atomics so the hot path never formats or allocates.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

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
/// Histogram bucket upper bounds in seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The node's counters.
#[derive(Default)]
pub struct Metrics {
    checks: RwLock<HashMap<String, [AtomicU64; 3]>>,
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
    store_errors: AtomicU64,
    degraded: AtomicU64,
    lease_calls: AtomicU64,
    leases_granted: AtomicU64,
    lease_units_granted: AtomicU64,
    leases_returned: AtomicU64,
    lease_units_returned: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_error: AtomicU64,
    unauthenticated: AtomicU64,
    waits_refused: AtomicU64,
    /// The rate limit quota service's counters.
    pub rlqs: RlqsStats,
}

impl Metrics {
    /// Counts one rule's verdict.
    pub fn check(&self, rule: &str, verdict: Verdict) {
        let i = verdict as usize;
        if let Some(c) = self.checks.read().unwrap_or_else(|p| p.into_inner()).get(rule) {
            c[i].fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut map = self.checks.write().unwrap_or_else(|p| p.into_inner());
        map.entry(rule.to_owned()).or_default()[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Records one store call's latency.
    pub fn store_latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.latency_buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Counts a store error.
    pub fn store_error(&self) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a decision taken by the local fallback.
    pub fn degraded(&self) {
        self.degraded.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a lease call answered (`POST /v1/lease`, 200): decisions by leases, beside
    /// the exact checks `sluice_checks_total` counts.
    pub fn lease_call(&self) {
        self.lease_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a lease granted with `units` (0: asked, none left).
    ///
    /// Renewals are not told apart: an ask names a quota, not the lease it follows, and a
    /// proxy gives a lease's units back in whichever call comes next, or not at all once
    /// spent, so the service cannot tell a renewal from a first lease (the filter counts
    /// them, `sluice_filter_leases_renewed`).
    pub fn lease_granted(&self, units: u64) {
        self.leases_granted.fetch_add(1, Ordering::Relaxed);
        self.lease_units_granted.fetch_add(units, Ordering::Relaxed);
    }

    /// Counts a lease's return and the `units` it gave back (0: ended, or none held).
    pub fn lease_returned(&self, units: u64) {
        self.leases_returned.fetch_add(1, Ordering::Relaxed);
        self.lease_units_returned.fetch_add(units, Ordering::Relaxed);
    }

    /// Counts a call to the data API refused for want of its credential.
    pub fn unauthenticated(&self) {
        self.unauthenticated.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a `/v1/wait` refused because the node holds as many as it may.
    pub fn wait_refused(&self) {
        self.waits_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a rules reload.
    pub fn reload(&self, ok: bool) {
        if ok { &self.reloads_ok } else { &self.reloads_error }.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        out.push_str("# HELP sluice_checks_total Rule evaluations by outcome.\n# TYPE sluice_checks_total counter\n");
        let checks = self.checks.read().unwrap_or_else(|p| p.into_inner());
        let mut rules: Vec<_> = checks.iter().collect();
        rules.sort_by(|a, b| a.0.cmp(b.0));
        for (rule, counts) in rules {
            let rule = rule.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            for (name, c) in VERDICTS.iter().zip(counts) {
                let _ = writeln!(
                    out,
                    "sluice_checks_total{{rule=\"{rule}\",decision=\"{name}\"}} {}",
                    c.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP sluice_store_latency_seconds Latency of counter store calls.\n# TYPE sluice_store_latency_seconds histogram\n");
        for (bound, bucket) in BUCKETS.iter().zip(&self.latency_buckets) {
            let _ = writeln!(
                out,
                "sluice_store_latency_seconds_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "sluice_store_latency_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "sluice_store_latency_seconds_sum {}",
            self.latency_sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "sluice_store_latency_seconds_count {count}");
        let simple = [
            (
                "sluice_store_errors_total",
                "Counter store calls that failed.",
                &self.store_errors,
            ),
            (
                "sluice_degraded_total",
                "Rule decisions taken by the local fallback.",
                &self.degraded,
            ),
            (
                "sluice_lease_calls_total",
                "Lease calls answered (POST /v1/lease, 200).",
                &self.lease_calls,
            ),
            (
                "sluice_leases_granted_total",
                "Leases asked for and answered (some with 0 units).",
                &self.leases_granted,
            ),
            (
                "sluice_lease_units_granted_total",
                "Units of quota granted in leases.",
                &self.lease_units_granted,
            ),
            (
                "sluice_leases_returned_total",
                "Lease returns handled (some taking back 0 units: the lease had ended).",
                &self.leases_returned,
            ),
            (
                "sluice_lease_units_returned_total",
                "Units of quota leases gave back unspent.",
                &self.lease_units_returned,
            ),
            (
                "sluice_unauthenticated_total",
                "Calls to the data API (HTTP or gRPC) refused for a missing or wrong credential.",
                &self.unauthenticated,
            ),
            (
                "sluice_waits_refused_total",
                "GET /v1/wait calls refused at once: the node held --max-waits already.",
                &self.waits_refused,
            ),
        ];
        write_series(&mut out, "counter", &simple);
        self.rlqs.render(&mut out);
        let _ = writeln!(
            out,
            "# HELP sluice_rules_reloads_total Rule reloads by result.\n# TYPE sluice_rules_reloads_total counter\nsluice_rules_reloads_total{{result=\"ok\"}} {}\nsluice_rules_reloads_total{{result=\"error\"}} {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_error.load(Ordering::Relaxed)
        );
        out
    }
}

/// Counters of the RLQS service .
#[derive(Default)]
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

impl RlqsStats {
    fn render(&self, out: &mut String) {
        let counters = [
            (
                "sluice_rlqs_usages_total",
                "Bucket usages read from RLQS reports.",
                &self.reports,
            ),
            (
                "sluice_rlqs_usages_ignored_total",
                "Bucket usages ignored: ill-formed, or past the bucket limits.",
                &self.ignored,
            ),
            (
                "sluice_rlqs_assignments_total",
                "RLQS assignments sent.",
                &self.assignments,
            ),
            (
                "sluice_rlqs_denials_total",
                "RLQS assignments that were DENY_ALL for want of units.",
                &self.denials,
            ),
            (
                "sluice_rlqs_abandoned_total",
                "RLQS buckets abandoned (idle, unknown, or their rule gone).",
                &self.abandoned,
            ),
            (
                "sluice_rlqs_exchanges_total",
                "RLQS store exchanges (one per tick with grants due).",
                &self.exchanges,
            ),
            (
                "sluice_rlqs_grants_total",
                "Grants asked for in RLQS store exchanges.",
                &self.grants,
            ),
        ];
        write_series(out, "counter", &counters);
        let gauges = [
            ("sluice_rlqs_streams", "RLQS streams open.", &self.streams),
            ("sluice_rlqs_buckets", "RLQS buckets followed.", &self.buckets),
        ];
        write_series(out, "gauge", &gauges);
    }
}

/// Writes each unlabelled series of `series` (name, help, value) as a Prometheus `kind`.
fn write_series(out: &mut String, kind: &str, series: &[(&str, &str, &AtomicU64)]) {
    for (name, help, v) in series {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
            v.load(Ordering::Relaxed)
        );
    }
}
