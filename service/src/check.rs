//! Evaluating a check request: every matching rule, all-or-nothing, in one store call.
//!
//! The store decides all the rules a request matches at once (one round trip per store
//! slot; see [`crate::store`]): the request passes when every enforced rule admits it, and
//! a denied request consumes nothing. Shadow rules count when the request passes but never
//! deny. When the store fails, each rule's failure policy decides: `open` asks the node's
//! fallback buckets (`degraded: true`), all-or-nothing as well; `closed` denies.

use std::borrow::Cow;
use std::time::Instant;

use sluice_core::algorithm::{passes, Part};
use sluice_core::identity::ip_identity;
use sluice_core::rules::{FailureMode, Rule};
use sluice_core::time::instant_ms;
use sluice_core::wire::{CheckRequest, CheckResponse, Outcome};
use sluice_core::{Decision, Limit, Micros};

use crate::metrics::Verdict;
use crate::node::Node;
use crate::store::{closed_decision, keys, Item, Stamped, StoreError};
use crate::violations::Violation;

/// One limit a request is decided against, whichever front end asked (HTTP rules, gRPC
/// descriptors): its store key, its limit, whether it is a shadow, its failure policy.
#[derive(Debug, Clone)]
pub struct Target {
    /// The limit's store key ([`keys::limit`]).
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

/// Decides a request against every target at once, each at its cost, all-or-nothing, in
/// one store call; when the store fails, by each target's failure policy. Returns the
/// decisions in the targets' order and whether they came from the fallback buckets
/// (`degraded`).
pub async fn decide(node: &Node, targets: &[Target], now_us: Micros) -> (Vec<Decision>, bool) {
    let items: Vec<Item<'_>> = targets
        .iter()
        .map(|t| Item {
            key: &t.key,
            part: Part {
                limit: &t.limit,
                shadow: t.shadow,
                cost: t.cost,
            },
        })
        .collect();
    let (mut decisions, degraded) = match store_decide(node, &items).await {
        Ok(stamps) => (stamps.iter().map(|s| s.decision).collect(), false),
        Err(e) => {
            tracing::debug!(error = %e, "store failed; applying each rule's failure policy");
            node.metrics.degraded();
            (fail_over(node, targets, &items, now_us), true)
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
    (decisions, degraded)
}

/// `req` as rules are matched against it, whoever sent it: its path canonical
/// (`sluice_core::path`), its `ip` identity grouped by the node's IPv6 prefix
/// (`sluice_core::identity`). What the filter sends is so already, and stays as it is.
pub fn canonical(mut req: CheckRequest, ipv6_prefix: u8) -> CheckRequest {
    if let Cow::Owned(path) = sluice_core::path::canonical(&req.path) {
        req.path = path;
    }
    if let Some(ip) = req.identities.get_mut("ip") {
        if let Cow::Owned(key) = ip_identity(ip, ipv6_prefix) {
            *ip = key;
        }
    }
    req
}

/// The answer to a request that a `deny` rule refuses for want of its identity: that rule
/// denies, nothing is counted anywhere (a refused request takes nothing).
fn refused_for_missing(node: &Node, rule: &Rule, now_ms: u64) -> CheckResponse {
    node.metrics.check(&rule.name, Verdict::Denied);
    let window = sluice_core::time::micros_from_ms(rule.window_ms);
    let decision = Decision {
        allowed: false,
        limit: rule.limit.limit(),
        remaining: 0,
        reset_after: window,
        retry_after: window,
        delay: 0,
    };
    let outcome = Outcome {
        rule: &rule.name,
        window_ms: rule.window_ms,
        shadow: false,
        decision,
        degraded: false,
    };
    CheckResponse::from_outcomes(&[outcome], now_ms)
}

/// Decides a validated request (see [`canonical`] for a caller's request).
pub async fn check(node: &Node, req: &CheckRequest) -> CheckResponse {
    let rules = node.rules();
    let now_us = node.clock.now_us();
    let now_ms = instant_ms(now_us);
    let matched: Vec<(&Rule, &str)> = rules.matching(&req.identities, &req.method, &req.path).collect();
    if matched.is_empty() {
        return CheckResponse::from_outcomes(&[], now_ms);
    }
    if let Some((rule, _)) = matched.iter().find(|(rule, id)| rule.refuses(id) && !rule.shadow) {
        return refused_for_missing(node, rule, now_ms);
    }
    let targets: Vec<Target> = matched
        .iter()
        .map(|&(rule, identity)| Target {
            key: keys::limit(&rule.name, identity),
            limit: rules.limit_for(rule, identity, now_ms),
            shadow: rule.shadow,
            failure: rule.failure,
            cost: req.cost,
        })
        .collect();
    let (decisions, degraded) = match &node.region {
        Some(region) if matched.iter().any(|(rule, _)| rule.global.is_some()) => {
            crate::region::decide::decide(node, region, &matched, &targets, now_us).await
        }
        _ => {
            let (decisions, degraded) = decide(node, &targets, now_us).await;
            (decisions.into_iter().map(Some).collect(), degraded)
        }
    };

    let mut outcomes: Vec<Outcome<'_>> = Vec::with_capacity(matched.len());
    let mut denied_by: Option<(&Rule, &str)> = None;
    for (&(rule, identity), decision) in matched.iter().zip(decisions) {
        // Not counted: a global rule refused the request before this rule was decided.
        let Some(decision) = decision else { continue };
        let verdict = match (decision.allowed, rule.shadow) {
            (true, _) => Verdict::Allowed,
            (false, true) => Verdict::ShadowDenied,
            (false, false) => Verdict::Denied,
        };
        node.metrics.check(&rule.name, verdict);
        if verdict == Verdict::Denied && denied_by.is_none() {
            denied_by = Some((rule, identity));
        }
        outcomes.push(Outcome {
            rule: &rule.name,
            window_ms: rule.window_ms,
            shadow: rule.shadow,
            decision,
            degraded,
        });
    }
    if let Some((rule, identity)) = denied_by {
        node.violations.record(Violation {
            rule: rule.name.clone(),
            identity: identity.to_owned(),
            at_ms: now_ms,
            cost: req.cost,
            path: req.path.clone(),
        });
    }
    CheckResponse::from_outcomes(&outcomes, now_ms)
}

/// One store call through the breaker, with the node's timeout.
async fn store_decide(node: &Node, items: &[Item<'_>]) -> Result<Vec<Stamped>, StoreError> {
    if !node.breaker.allow() {
        return Err(StoreError::Unavailable("circuit breaker open".into()));
    }
    let started = Instant::now();
    let call = node.store.decide_all(items);
    let result = match tokio::time::timeout(node.config.store_timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {:?}",
            node.config.store_timeout
        ))),
    };
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
fn fail_over(node: &Node, matched: &[Target], items: &[Item<'_>], now: Micros) -> Vec<Decision> {
    let fails_open = |m: &Target| m.failure == FailureMode::Open;
    let open: Vec<Item<'_>> = items
        .iter()
        .zip(matched)
        .filter(|(_, m)| fails_open(m))
        .map(|(i, _)| *i)
        .collect();
    let closed_denies = matched.iter().any(|m| !fails_open(m) && !m.shadow);
    let mut from_fallback = node.fallback.decide_all_at(&open, now, !closed_denies).into_iter();
    matched
        .iter()
        .map(|m| match fails_open(m).then(|| from_fallback.next()).flatten() {
            Some(d) => d,
            None => closed_decision(&m.limit),
        })
        .collect()
}
