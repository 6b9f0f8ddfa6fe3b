//! What the operator's console shows of this node (`GET /v1/admin/rules/status`,
//! `GET /v1/admin/top`): per rule, its answers a second over the last [`POINTS`] buckets of
//! [`STEP_S`] seconds, and the identities it refuses most; and where the rules in force
//! came from.
//!
//! A check counts each rule once, in the node's metrics; the console samples those counters
//! ([`Console::sample`]: every second, and before its rates are read) into a ring of packed
//! atomics per rule (a bucket's start and its count in one word, so a bucket that comes
//! round again restarts without a lock). What the metrics do not count is recorded by
//! [`Console::record`], on refusals and failures only: the refused identity goes to the
//! rule's Space-Saving summary ([`sluice_core::space_saving`]), under a mutex of its own, and
//! an answer of the failure policy to the ring. The first count of a rule name takes a write
//! lock to add it, later ones only a read lock and atomics. At most [`MAX_TRACKED`] rule
//! names are tracked; a rules change drops the names no longer in force that answered
//! nothing within the ring.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sluice_core::rules::RuleSet;
use sluice_core::space_saving::SpaceSaving;

use crate::metrics::{RuleCounts, Verdict};

/// Seconds per rate bucket.
pub const STEP_S: u64 = 10;
/// Buckets kept per rule (five minutes).
pub const POINTS: usize = 30;
/// Identities kept per rule by the Space-Saving summary (`k`).
pub const TOP_CAPACITY: usize = 16;
/// Most rule names tracked; names past it are not (counted in [`Console::untracked`]).
pub const MAX_TRACKED: usize = 10_000;

/// The counts of one bucket: allowed, denied, shadow-denied (each [`Verdict`]'s, sampled from
/// the metrics), by the failure policy (recorded).
const KINDS: usize = 4;
const VERDICTS: usize = 3;
const FAILURE: usize = 3;

/// Where the rules in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// The rules file, at start or on reload.
    File,
    /// `PUT /v1/admin/rules` or an override change on this node.
    Admin,
    /// Another node's change, read from the store.
    Pubsub,
    /// No rules file and nothing published yet.
    None,
}

/// Where the rules in force came from, and when this node took them.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    /// From where.
    pub kind: SourceKind,
    /// The file's path, the change, or the published version.
    pub detail: String,
    /// When this node put them in force, unix ms.
    pub at_ms: u64,
}

/// One rule's rates, each `POINTS` numbers a second, oldest first.
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    /// Requests the rule admitted.
    pub allowed: Vec<f64>,
    /// Requests it refused.
    pub denied: Vec<f64>,
    /// Requests a shadow rule would have refused.
    pub shadow_denied: Vec<f64>,
    /// Answers of its failure policy (the store could not answer), allowed or not.
    pub failure: Vec<f64>,
}

/// One identity among a rule's most refused.
#[derive(Debug, Clone, Serialize)]
pub struct TopIdentity {
    /// The identity value.
    pub identity: String,
    /// Refusals counted: at most `error` more than the true count.
    pub refused: u64,
    /// How much `refused` may overcount.
    pub error: u64,
}

/// A rule's most refused identities.
#[derive(Debug, Clone, Serialize)]
pub struct TopRule {
    /// The rule.
    pub rule: String,
    /// Every refusal of the rule on this node since it started.
    pub refused: u64,
    /// The most refused identities, most first.
    pub identities: Vec<TopIdentity>,
}

/// One decided rule of a check that refused or came from the failure policy, as the console
/// records it (the metrics count every verdict).
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The identity it counted.
    pub identity: &'a str,
    /// How it answered.
    pub verdict: Verdict,
    /// Its failure policy answered (the store could not).
    pub degraded: bool,
}

/// One rule's counters.
struct RuleStats {
    /// `POINTS` buckets of `KINDS` counts, each `bucket number << 32 | count`.
    ring: [[AtomicU64; KINDS]; POINTS],
    top: Mutex<SpaceSaving>,
}

impl RuleStats {
    /// Records one answer in bucket number `bucket`: a refusal in the top summary, an answer
    /// of the failure policy in the ring.
    fn tally(&self, bucket: u64, a: &Answer<'_>) {
        if a.degraded {
            self.add(bucket, FAILURE, 1);
        }
        if a.verdict == Verdict::Denied {
            self.top
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .offer(a.identity, 1);
        }
    }

    fn new() -> RuleStats {
        RuleStats {
            ring: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            top: Mutex::new(SpaceSaving::new(
                NonZeroUsize::new(TOP_CAPACITY).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// Adds `n` to count `kind` of bucket number `bucket` (saturating at 2^32 - 1),
    /// restarting the slot if it held an older bucket.
    fn add(&self, bucket: u64, kind: usize, n: u64) {
        const MAX: u64 = 0xffff_ffff;
        let cell = &self.ring[slot(bucket)][kind];
        let tag = bucket & MAX;
        let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            let count = if v >> 32 == tag { v & MAX } else { 0 };
            Some(tag << 32 | count.saturating_add(n).min(MAX))
        });
    }

    /// The count `kind` of bucket number `bucket` (0 if the slot holds another bucket).
    fn read(&self, bucket: u64, kind: usize) -> u64 {
        let v = self.ring[slot(bucket)][kind].load(Ordering::Relaxed);
        if v >> 32 == bucket & 0xffff_ffff {
            v & 0xffff_ffff
        } else {
            0
        }
    }

    fn answered_since(&self, first_bucket: u64, last_bucket: u64) -> bool {
        (first_bucket..=last_bucket).any(|b| (0..KINDS).any(|k| self.read(b, k) > 0))
    }
}

fn slot(bucket: u64) -> usize {
    (bucket % POINTS as u64) as usize
}

/// The console's view of this node.
pub struct Console {
    rules: RwLock<HashMap<Arc<str>, RuleStats>>,
    /// Each rule's verdict counts in the metrics at the last [`Console::sample`].
    sampled: Mutex<HashMap<Arc<str>, [u64; VERDICTS]>>,
    source: Mutex<Source>,
    untracked: AtomicU64,
}

impl Default for Console {
    fn default() -> Console {
        Console {
            rules: RwLock::default(),
            sampled: Mutex::default(),
            source: Mutex::new(Source {
                kind: SourceKind::None,
                detail: String::new(),
                at_ms: now_ms(),
            }),
            untracked: AtomicU64::new(0),
        }
    }
}

/// Unix ms now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Console {
    /// Records one decided rule that refused `identity` or came from its failure policy
    /// (`degraded`: the store could not answer); other answers record nothing (the rates
    /// come from the metrics, [`Console::sample`]).
    pub fn record(&self, rule: &str, identity: &str, verdict: Verdict, degraded: bool) {
        self.record_at(rule, identity, verdict, degraded, now_ms());
    }

    /// [`Console::record`] at `now_ms` (unix ms).
    pub fn record_at(&self, rule: &str, identity: &str, verdict: Verdict, degraded: bool, now_ms: u64) {
        self.record_all(
            &[Answer {
                rule,
                identity,
                verdict,
                degraded,
            }],
            now_ms,
        );
    }

    /// Records the refusals and failure-policy answers of one check at `now_ms` (unix ms);
    /// other answers are skipped (see [`Console::record`]).
    pub fn record_all(&self, answers: &[Answer<'_>], now_ms: u64) {
        let bucket = now_ms / 1000 / STEP_S;
        let noted = answers.iter().filter(|a| a.degraded || a.verdict == Verdict::Denied);
        self.each_rule(noted.map(|a| (a.rule, a)), |stats, a| stats.tally(bucket, a));
    }

    /// Adds what the metrics counted of each rule since the last sample (`counts`: each
    /// rule's totals, [`crate::metrics::Metrics::rule_counts`]) to the bucket of `now_ms`
    /// (unix ms). The node samples every second and before its rates are read: a count
    /// lands at most a second late, in the bucket of when it was sampled.
    pub fn sample(&self, counts: &[RuleCounts], now_ms: u64) {
        let bucket = now_ms / 1000 / STEP_S;
        let mut sampled = self.sampled.lock().unwrap_or_else(PoisonError::into_inner);
        let mut moved = Vec::new();
        for (rule, totals) in counts {
            let totals: [u64; VERDICTS] = std::array::from_fn(|k| totals[k]);
            let before = sampled.insert(rule.clone(), totals).unwrap_or_default();
            let delta: [u64; VERDICTS] = std::array::from_fn(|k| totals[k].saturating_sub(before[k]));
            if delta != [0; VERDICTS] {
                moved.push((&**rule, delta));
            }
        }
        self.each_rule(moved, |stats, delta| {
            for (kind, n) in delta.into_iter().enumerate().filter(|(_, n)| *n > 0) {
                stats.add(bucket, kind, n);
            }
        });
    }

    /// Calls `f` with each rule's counters and its item, under one read lock; a rule not
    /// tracked yet is added under the write lock (or counted in [`Console::untracked`]).
    fn each_rule<'r, T>(&self, items: impl IntoIterator<Item = (&'r str, T)>, f: impl Fn(&RuleStats, T)) {
        let mut new = Vec::new();
        {
            let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
            for (rule, item) in items {
                match rules.get(rule) {
                    Some(stats) => f(stats, item),
                    None => new.push((rule, item)),
                }
            }
        }
        if new.is_empty() {
            return;
        }
        let mut rules = self.rules.write().unwrap_or_else(PoisonError::into_inner);
        for (rule, item) in new {
            if rules.len() >= MAX_TRACKED && !rules.contains_key(rule) {
                self.untracked.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            f(rules.entry(rule.into()).or_insert_with(RuleStats::new), item);
        }
    }

    /// Answers of rule names not tracked (past [`MAX_TRACKED`]).
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }

    /// `rule`'s rates at `now_ms`: each bucket's count over its [`STEP_S`] seconds, the
    /// last (the current one) over the seconds elapsed in it (at least one). `None` for a
    /// rule that answered nothing yet.
    pub fn rates(&self, rule: &str, now_ms: u64) -> Option<Rates> {
        let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
        let stats = rules.get(rule)?;
        let current = now_ms / 1000 / STEP_S;
        let elapsed_s = ((now_ms - current * STEP_S * 1000) as f64 / 1e3).max(1.0);
        let series = |kind: usize| -> Vec<f64> {
            (0..POINTS as u64)
                .map(|i| {
                    let Some(bucket) = current.checked_sub(POINTS as u64 - 1 - i) else {
                        return 0.0;
                    };
                    let per = if bucket == current { elapsed_s } else { STEP_S as f64 };
                    stats.read(bucket, kind) as f64 / per
                })
                .collect()
        };
        Some(Rates {
            allowed: series(Verdict::Allowed as usize),
            denied: series(Verdict::Denied as usize),
            shadow_denied: series(Verdict::ShadowDenied as usize),
            failure: series(FAILURE),
        })
    }

    /// Rates of zero, for a rule that answered nothing yet.
    pub fn no_rates() -> Rates {
        Rates {
            allowed: vec![0.0; POINTS],
            denied: vec![0.0; POINTS],
            shadow_denied: vec![0.0; POINTS],
            failure: vec![0.0; POINTS],
        }
    }

    /// The most refused identities of `rule` (`None`: it refused nothing yet), or of every
    /// rule that refused something, by name.
    pub fn top(&self, rule: Option<&str>) -> Vec<TopRule> {
        let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<TopRule> = rules
            .iter()
            .filter(|(name, _)| rule.is_none_or(|r| &***name == r))
            .filter_map(|(name, stats)| {
                let top = stats.top.lock().unwrap_or_else(PoisonError::into_inner);
                (top.total() > 0).then(|| TopRule {
                    rule: name.to_string(),
                    refused: top.total(),
                    identities: top
                        .top()
                        .into_iter()
                        .map(|c| TopIdentity {
                            identity: c.key.clone(),
                            refused: c.count,
                            error: c.error,
                        })
                        .collect(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.rule.cmp(&b.rule));
        out
    }

    /// Notes that `rules` are now in force: drops the names no longer in them that answered
    /// nothing within the ring (a gRPC descriptor still answering stays).
    pub fn rules_in_force(&self, rules: &RuleSet) {
        let current = now_ms() / 1000 / STEP_S;
        let first = current.saturating_sub(POINTS as u64 - 1);
        let mut tracked = self.rules.write().unwrap_or_else(PoisonError::into_inner);
        tracked.retain(|name, stats| rules.rule(name).is_some() || stats.answered_since(first, current));
    }

    /// Where the rules in force came from.
    pub fn source(&self) -> Source {
        self.source.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records that the rules in force came from `kind` (`detail`: the file, the change,
    /// the version), now.
    pub fn set_source(&self, kind: SourceKind, detail: impl Into<String>) {
        *self.source.lock().unwrap_or_else(PoisonError::into_inner) = Source {
            kind,
            detail: detail.into(),
            at_ms: now_ms(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_790_000_000_000; // a bucket's start: divisible by 10 s

    #[test]
    fn rates_are_per_second_per_bucket_and_the_ring_wraps() {
        let c = Console::default();
        let counts = |allowed: u64, denied: u64| vec![(Arc::<str>::from("r"), [allowed, denied, 0, 0])];
        c.sample(&counts(20, 0), T0);
        c.sample(&counts(20, 0), T0 + 1_000); // nothing new: nothing added
        c.record_at("r", "a", Verdict::Denied, true, T0 + 12_000);
        c.sample(&counts(20, 1), T0 + 12_000);
        let r = c.rates("r", T0 + 14_000).unwrap();
        assert_eq!(r.allowed.len(), POINTS);
        assert_eq!(r.allowed[POINTS - 2], 2.0, "20 in 10 s");
        assert_eq!(r.denied[POINTS - 1], 0.25, "1 in the 4 s of the current bucket");
        assert_eq!(r.failure[POINTS - 1], 0.25);
        // Five minutes on, the same slots hold new buckets: the old counts are gone.
        let later = T0 + POINTS as u64 * STEP_S * 1000;
        c.sample(&counts(21, 1), later);
        let r = c.rates("r", later + 500).unwrap();
        assert_eq!(r.allowed[POINTS - 1], 1.0, "one in the first second");
        assert_eq!(r.allowed.iter().sum::<f64>(), 1.0, "{:?}", r.allowed);
        assert!(c.rates("other", later).is_none());
    }

    #[test]
    fn refusals_feed_the_top_of_their_rule_only() {
        let c = Console::default();
        for (who, n) in [("10.0.0.7", 5), ("10.0.0.8", 2)] {
            for _ in 0..n {
                c.record_at("per-ip", who, Verdict::Denied, false, T0);
            }
        }
        c.record_at("per-ip", "10.0.0.9", Verdict::Allowed, false, T0);
        c.record_at("quiet", "x", Verdict::ShadowDenied, false, T0);
        let top = c.top(None);
        assert_eq!(top.len(), 1, "only rules that refused");
        assert_eq!(top[0].refused, 7);
        assert_eq!(top[0].identities[0].identity, "10.0.0.7");
        assert_eq!(top[0].identities[0].refused, 5);
        assert!(c.top(Some("quiet")).is_empty());
        assert!(
            c.rates("per-ip", T0)
                .is_some_and(|r| r.denied.iter().all(|d| *d == 0.0)),
            "refusals are counted by the metrics, sampled; recording one only names who"
        );
    }
}
