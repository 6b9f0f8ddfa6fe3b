//! The decision step every front end shares (the HTTP check, the gRPC rate limit service,
//! a region's regional rules): the limits a request is decided against, all at once.
//!
//! The store decides them in one call (one round trip per store slot; see
//! [`crate::store`]): the request passes when every enforced limit admits it, and a denied
//! request consumes nothing. Shadow limits count when the request passes but never deny.
//! When the store fails, each limit's failure policy decides: `open` asks the node's
//! fallback buckets (`degraded: true`), all-or-nothing as well; `closed` denies.

use std::time::Instant;

use sluice_core::algorithm::{passes, Part};
use sluice_core::rules::{FailureMode, Rule, RuleSet};
use sluice_core::wire::{CheckResponse, RuleOutcome};
use sluice_core::{Decision, Limit};

use crate::metrics::Verdict;
use crate::node::Node;
use crate::store::{closed_decision, within, Item, Stamped, Store, StoreError};

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

/// Decides a request against every target at once, each at its cost, all-or-nothing, in
/// one store call; when the store fails, by each target's failure policy. Returns the
/// decisions in the targets' order and whether they came from the fallback buckets
/// (`degraded`).
pub async fn decide_limits(node: &Node, targets: &[Target]) -> (Vec<Decision>, bool) {
    let items: Vec<Item<'_>> = targets.iter().map(Target::item).collect();
    let (mut decisions, degraded) = match store_decide(node, &items).await {
        Ok(stamps) => (stamps.iter().map(|s| s.decision).collect(), false),
        Err(e) => {
            tracing::debug!(error = %e, "store failed; applying each rule's failure policy");
            node.metrics.degraded();
            (fail_over(node, targets, &items), true)
        }
    };
    // A refused request took nothing: the limits that would have admitted it still hold
    // what they held, and say so.
    let parts: Vec<Part<'_>> = items.iter().map(|i| i.part).collect();
    if !passes(&parts, &decisions) {
        for (d, t) in decisions.iter_mut().zip(targets).filter(|(d, _)| d.allowed) {
            d.remaining = d.remaining.saturating_add(t.cost.max(1));
        }
    }
    if !degraded {
        remember(node, targets, &decisions);
    }
    (decisions, degraded)
}

/// Seeds the fallback bucket of every target that fails open with what the store said is
/// left of it, so a failover starts each from there, not from a whole quota.
fn remember(node: &Node, targets: &[Target], decisions: &[Decision]) {
    if matches!(*node.store, Store::Memory(_)) {
        return; // never fails over
    }
    for (t, d) in targets.iter().zip(decisions) {
        if t.failure == FailureMode::Open {
            node.fallback.seed(&t.key, &t.limit, d.remaining);
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
fn fail_over(node: &Node, matched: &[Target], items: &[Item<'_>]) -> Vec<Decision> {
    let fails_open = |m: &Target| m.failure == FailureMode::Open;
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
    let window = sluice_core::time::micros_from_ms(rule.window_ms);
    let decision = Decision {
        allowed: false,
        limit: rule.limit.limit(),
        remaining: 0,
        reset_after: window,
        retry_after: window,
        delay: 0,
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

/// The limits of the `matched` rules, each at `cost`.
pub fn targets(node: &Node, rules: &RuleSet, matched: &[(&Rule, &str)], cost: u64, now_ms: u64) -> Vec<Target> {
    let keys = node.store.keys();
    matched
        .iter()
        .map(|&(rule, identity)| Target {
            key: keys.limit(&rule.name, identity),
            limit: rules.limit_for(rule, identity, now_ms),
            shadow: rule.shadow,
            failure: rule.failure,
            cost,
        })
        .collect()
}
