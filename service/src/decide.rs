//! The decision step every front end shares (the HTTP check, the gRPC rate limit service,
//! a region's regional rules): the limits a request is decided against, all at once.
//!
//! Each limit travels as one [`Matched`] value from matching to the answer: the front end
//! builds it (a rule and its identity, or a descriptor's limit), [`decide_limits`] (or a
//! region's [`crate::region::decide::decide`]) fills in its decision, and [`settle`] counts
//! it the same way whoever asked: metrics, the console, the violation of a refusal.
//!
//! The store decides them in one call (one round trip per store slot; see
//! [`crate::store`]): the request passes when every enforced limit admits it, and a denied
//! request consumes nothing. Shadow limits count when the request passes but never deny.
//! When the store fails, each limit's failure policy decides: `open` asks the node's
//! fallback buckets (`degraded: true`), all-or-nothing as well; `closed` denies.

use std::borrow::Cow;
use std::time::Instant;

use sluice_core::algorithm::Algorithm;
use sluice_core::algorithm::{passes, Part};
use sluice_core::rules::{FailureMode, Global, Rule, RuleSet};
use sluice_core::wire::Slot;
use sluice_core::wire::{CheckResponse, RuleOutcome};
use sluice_core::{Decision, Limit, Micros};

use crate::console::Answer;
use crate::metrics::Verdict;
use crate::node::Node;
use crate::refusals::Settled;
use crate::store::{closed_decision, within, Item, Stamped, Store, StoreError};
use crate::violations::Violation;

/// How a limit's decision counts in the metrics: a shadow limit's denial apart, since it
/// refused nothing.
pub fn verdict(allowed: bool, shadow: bool) -> Verdict {
    match (allowed, shadow) {
        (true, _) => Verdict::Allowed,
        (false, true) => Verdict::ShadowDenied,
        (false, false) => Verdict::Denied,
    }
}

/// One limit a request is decided against, whichever front end asked (HTTP rules, gRPC
/// descriptors): its store key, its limit, whether it is a shadow, its failure policy.
#[derive(Debug, Clone)]
pub struct Target {
    /// The limit's store key ([`crate::store::keys::limit`]).
    pub key: String,
    /// The limit for this identity.
    pub limit: Limit,
    /// Counts, never denies.
    pub shadow: bool,
    /// What decides when the store cannot answer.
    pub failure: FailureMode,
    /// What the request costs this limit.
    pub cost: u64,
}

impl Target {
    /// The target as a store decides it.
    pub fn item(&self) -> Item<'_> {
        Item {
            key: &self.key,
            part: Part {
                limit: &self.limit,
                shadow: self.shadow,
                cost: self.cost,
            },
        }
    }
}

/// One limit a request is decided against, from matching to the answer: what it limits,
/// its store [`Target`], and its decision once made.
#[derive(Debug, Clone)]
pub struct Matched<'a> {
    /// The rule's name (a descriptor's limit: its name).
    pub name: &'a str,
    /// The identity it counts.
    pub identity: Cow<'a, str>,
    /// The rule's window, for the answer's headers (0 for a concurrency rule: none).
    pub window_ms: u64,
    /// The rule's global limit, if it is one (see [`crate::region`]).
    pub global: Option<&'a Global>,
    /// What the store decides.
    pub target: Target,
    /// Its decision; `None` until decided, and for good when a global rule refused the
    /// request before this limit was counted.
    pub decision: Option<Decision>,
    /// When the store decided it (unix µs), if the store did: a concurrency slot's name.
    pub at: Option<Micros>,
}

impl<'a> Matched<'a> {
    /// `rule` matched with `identity`, at `cost`: its limit for that identity (an
    /// override's, if one is in force).
    pub fn rule(node: &Node, rules: &RuleSet, (rule, identity): (&'a Rule, &'a str), cost: u64, now_ms: u64) -> Self {
        let limit = rules.limit_for(rule, identity, now_ms);
        Matched {
            name: &rule.name,
            identity: Cow::Borrowed(identity),
            // A limit on requests at once has no window for the headers to name (its
            // `window` is how long a slot outlives its holder).
            window_ms: if limit.algorithm() == Algorithm::Concurrency {
                0
            } else {
                rule.window_ms
            },
            global: rule.global.as_ref(),
            target: Target {
                key: node.store.keys().limit(&rule.name, identity),
                limit,
                shadow: rule.shadow,
                failure: rule.failure,
                cost,
            },
            decision: None,
            at: None,
        }
    }

    /// Its part of the answer, once decided.
    pub fn outcome(&self, degraded: bool) -> Option<RuleOutcome<'_>> {
        Some(RuleOutcome {
            rule: self.name,
            window_ms: self.window_ms,
            shadow: self.target.shadow,
            decision: self.decision?,
            degraded,
        })
    }
}

/// The limits of the rules a request matched, each at `cost`.
pub fn matched<'a>(
    node: &Node,
    rules: &'a RuleSet,
    found: impl IntoIterator<Item = (&'a Rule, &'a str)>,
    cost: u64,
    now_ms: u64,
) -> Vec<Matched<'a>> {
    found
        .into_iter()
        .map(|found| Matched::rule(node, rules, found, cost, now_ms))
        .collect()
}

/// After the decision, the same for every front end: each decided limit counted (its
/// verdict in the metrics and the console, and whether it is near its limit), and the first
/// enforced refusal logged as a violation (of `path`, empty for a gRPC call). Limits not
/// decided (a global rule refused the request first) count nothing.
pub fn settle<'m, 'a: 'm>(
    node: &Node,
    limits: impl IntoIterator<Item = &'m Matched<'a>>,
    degraded: bool,
    path: &str,
    now_ms: u64,
) {
    let decided: Vec<(&Matched<'_>, &Decision, Verdict)> = limits
        .into_iter()
        .filter_map(|m| {
            let d = m.decision.as_ref()?;
            Some((m, d, verdict(d.allowed, m.target.shadow)))
        })
        .collect();
    node.metrics.checks(decided.iter().map(|(m, d, v)| (m.name, *d, *v)));
    // The metrics count every verdict (the console samples them); the console records who
    // was refused, and the failure policy's answers.
    let answers: Vec<Answer<'_>> = decided
        .iter()
        .filter(|(_, _, verdict)| degraded || *verdict == Verdict::Denied)
        .map(|&(m, _, verdict)| Answer {
            rule: m.name,
            identity: &m.identity,
            verdict,
            degraded,
        })
        .collect();
    if !answers.is_empty() {
        node.console.record_all(&answers, now_ms);
    }
    if let Some((m, _, _)) = decided.iter().find(|(_, _, v)| *v == Verdict::Denied) {
        node.violations.record(Violation {
            rule: m.name.to_owned(),
            identity: m.identity.clone().into_owned(),
            at_ms: now_ms,
            cost: m.target.cost,
            path: path.to_owned(),
        });
    }
}

/// Counts one limit's verdict in the node's metrics and its console.
pub fn count(node: &Node, name: &str, identity: &str, verdict: Verdict, degraded: bool) {
    node.metrics.check(name, verdict);
    node.console.record(name, identity, verdict, degraded);
}

/// Looks at the remembered refusals this many times at most, waiting for a probe between:
/// an admitted probe is followed by one more.
const MAX_PROBE_WAITS: usize = 4;

/// Decides a request against every limit at once, each at its cost, all-or-nothing, in one
/// store call; when the store fails, by each limit's failure policy. Fills in each limit's
/// decision; whether they came from the fallback buckets (`degraded`).
pub async fn decide_limits<'m, 'a: 'm>(node: &Node, limits: impl IntoIterator<Item = &'m mut Matched<'a>>) -> bool {
    let mut limits: Vec<&mut Matched<'a>> = limits.into_iter().collect();
    let targets: Vec<&Target> = limits.iter().map(|m| &m.target).collect();
    let items: Vec<Item<'_>> = targets.iter().map(|t| t.item()).collect();
    let mut now = node.clock.now();
    // Waits for other requests' probes, then a look again each time; a few at most.
    for waits_left in (0..MAX_PROBE_WAITS).rev() {
        match node.refusals.settles(&items, now) {
            Settled::Refused(refused, d, others) => {
                // The store refused this limit and would still: the request is refused
                // here, the others not counted (a refused request consumes nothing) and
                // answered as the store last did beside this refusal.
                node.metrics.refused_from_memory(node.refusals.len());
                for (i, (m, other)) in limits.iter_mut().zip(others).enumerate() {
                    m.decision = if i == refused { Some(d) } else { other };
                }
                return false;
            }
            Settled::Wait(mut answered) if waits_left > 0 => {
                let _ = tokio::time::timeout(node.refusals.probe_window(), answered.changed()).await;
                now = node.clock.now();
            }
            Settled::Wait(_) | Settled::Ask => break,
        }
    }
    let (mut decisions, degraded, stamps) = match store_decide(node, &items).await {
        Ok(stamps) => {
            let decisions: Vec<Decision> = stamps.iter().map(|s| s.decision).collect();
            if !node.owed.is_empty() {
                // The store is back: what the fallback admitted of these keys is spent now,
                // before this request answers; the other keys' beside it.
                let own = node.owed.take_keys(targets.iter().map(|t| t.key.as_str()));
                crate::housekeeping::settle(node, own).await;
                node.owed.store_answered();
            }
            (decisions, false, stamps)
        }
        Err(e) => {
            tracing::debug!(error = %e, "store failed; applying each rule's failure policy");
            node.refusals.unanswered(&items);
            node.metrics.degraded();
            (fail_over(node, &targets, &items), true, Vec::new())
        }
    };
    // A refused request took nothing: the limits that would have admitted it still hold
    // what they held, and say so.
    let parts: Vec<Part<'_>> = items.iter().map(|i| i.part).collect();
    let passed = passes(&parts, &decisions);
    if !passed {
        for (d, t) in decisions.iter_mut().zip(&targets).filter(|(d, _)| d.allowed) {
            d.remaining = d.remaining.saturating_add(t.cost.max(1));
        }
    }
    if !degraded {
        node.refusals.remember(&items, &decisions, now);
        node.metrics.refusals_remembered(node.refusals.len());
        remember(node, &targets, &decisions);
    } else if passed {
        owe(node, &targets, &decisions);
    }
    for (i, (m, d)) in limits.iter_mut().zip(decisions).enumerate() {
        m.decision = Some(d);
        m.at = stamps.get(i).map(|s| s.at);
    }
    degraded
}

/// The concurrency slots a request that passed holds: one per concurrency limit the store
/// admitted it on (a fallback's slots are not named: they expire in the fallback).
pub fn slots_held(limits: &[Matched<'_>]) -> Vec<Slot> {
    limits
        .iter()
        .filter(|m| m.target.limit.algorithm() == Algorithm::Concurrency)
        .filter_map(|m| {
            let at = m.at.filter(|_| m.decision.is_some_and(|d| d.allowed))?;
            Some(Slot {
                rule: m.name.to_owned(),
                at: at.as_u64(),
                window_ms: m.target.limit.window().instant_ms(),
            })
        })
        .collect()
}

/// Seeds the fallback bucket of every target that fails open with this node's share of
/// what the store said is left of it (the live nodes share it evenly), so a failover starts
/// each from there, not from a whole quota, and the nodes' fallbacks together admit at most
/// what was left.
fn remember(node: &Node, targets: &[&Target], decisions: &[Decision]) {
    if matches!(*node.store, Store::Memory(_)) {
        return; // never fails over
    }
    let nodes = node.nodes();
    for (t, d) in targets.iter().zip(decisions) {
        if t.failure == FailureMode::Open {
            node.fallback.seed(&t.key, &t.limit, d.remaining / nodes);
        }
    }
}

/// Keeps what the fallback admitted of each target failing open, to spend it in the store
/// when it answers again ([`crate::owed`]).
fn owe(node: &Node, targets: &[&Target], decisions: &[Decision]) {
    for (t, d) in targets.iter().zip(decisions) {
        if t.failure == FailureMode::Open && d.allowed && t.cost > 0 && !node.owed.add(&t.key, &t.limit, t.cost) {
            node.metrics.fallback_unsettled(t.cost);
        }
    }
}

/// One store call through the breaker, with the node's timeout.
async fn store_decide(node: &Node, items: &[Item<'_>]) -> Result<Vec<Stamped>, StoreError> {
    if !node.breaker.allow() {
        return Err(StoreError::Unavailable("circuit breaker open".into()));
    }
    let started = Instant::now();
    let call = node.store.decide_all(items);
    let result = within(node.config.store_timeout, call).await;
    node.metrics.store_latency(started.elapsed());
    if node.config.traces.on() {
        crate::trace::store_time(started.elapsed());
    }
    match &result {
        Ok(_) => node.breaker.success(),
        Err(_) => {
            node.metrics.store_error();
            node.breaker.failure();
        }
    }
    result
}

/// The decisions when the store could not answer: rules that fail closed deny; rules that
/// fail open ask the fallback buckets together, which keep nothing when a closed rule
/// denies the request anyway.
fn fail_over(node: &Node, matched: &[&Target], items: &[Item<'_>]) -> Vec<Decision> {
    let fails_open = |m: &&Target| m.failure == FailureMode::Open;
    let open: Vec<Item<'_>> = items
        .iter()
        .zip(matched)
        .filter(|(_, m)| fails_open(m))
        .map(|(i, _)| *i)
        .collect();
    let closed_denies = matched.iter().any(|m| !fails_open(m) && !m.shadow);
    let mut from_fallback = node.fallback.decide_all_now(&open, !closed_denies).into_iter();
    matched
        .iter()
        .map(|m| match fails_open(m).then(|| from_fallback.next()).flatten() {
            Some(d) => d,
            None => closed_decision(&m.limit),
        })
        .collect()
}

/// The answer to a request that a `deny` rule refuses for want of its identity: that rule
/// denies, nothing is counted anywhere (a refused request takes nothing).
pub fn refused_for_missing(rule: &Rule, now_ms: u64) -> CheckResponse {
    let window = sluice_core::Micros::from_ms(rule.window_ms);
    let decision = Decision {
        allowed: false,
        limit: rule.limit.limit(),
        remaining: 0,
        reset_after: window,
        retry_after: window,
        delay: sluice_core::Micros::ZERO,
    };
    let outcome = RuleOutcome {
        rule: &rule.name,
        window_ms: rule.window_ms,
        shadow: false,
        decision,
        degraded: false,
    };
    CheckResponse::from_outcomes(&[outcome], now_ms)
}
