//! Evaluating a check request: every matching rule, all-or-nothing, in one store call.
//!
//! The store decides all the rules a request matches at once (one round trip per store
//! slot; see [`crate::store`]): the request passes when every enforced rule admits it, and
//! a denied request consumes nothing. Shadow rules count when the request passes but never
//! deny. When the store fails, each rule's failure policy decides: `open` asks the node's
//! fallback buckets (`degraded: true`), all-or-nothing as well; `closed` denies.

use std::time::Instant;

use sluice_core::algorithm::Part;
use sluice_core::rules::{FailureMode, Rule};
use sluice_core::time::instant_ms;
use sluice_core::wire::{CheckRequest, CheckResponse, Outcome};
use sluice_core::{Decision, Limit, Micros};

use crate::metrics::Verdict;
use crate::node::Node;
use crate::store::{closed_decision, keys, Item, Stamped, StoreError};
use crate::violations::Violation;

/// A rule the request matched: the rule, the identity it limits, its limit, its key.
struct Matched<'r> {
    rule: &'r Rule,
    identity: &'r str,
    limit: Limit,
    key: String,
}

/// Decides a validated request.
pub async fn check(node: &Node, req: &CheckRequest) -> CheckResponse {
    let rules = node.rules();
    let now_us = node.clock.now_us();
    let now_ms = instant_ms(now_us);
    let matched: Vec<Matched<'_>> = rules
        .matching(&req.identities, &req.method, &req.path)
        .map(|(rule, identity)| Matched {
            rule,
            identity,
            limit: rules.limit_for(rule, identity, now_ms),
            key: keys::limit(&rule.name, identity),
        })
        .collect();
    if matched.is_empty() {
        return CheckResponse::from_outcomes(&[], now_ms);
    }
    let items: Vec<Item<'_>> = matched
        .iter()
        .map(|m| Item {
            key: &m.key,
            part: Part {
                limit: &m.limit,
                shadow: m.rule.shadow,
            },
        })
        .collect();
    let (decisions, degraded) = match store_decide(node, &items, req.cost).await {
        Ok(stamps) => (stamps.iter().map(|s| s.decision).collect(), false),
        Err(e) => {
            tracing::debug!(error = %e, "store failed; applying each rule's failure policy");
            node.metrics.degraded();
            (fail_over(node, &matched, &items, req.cost, now_us), true)
        }
    };

    let mut outcomes: Vec<Outcome<'_>> = Vec::with_capacity(matched.len());
    let mut denied_by: Option<&Matched<'_>> = None;
    for (m, decision) in matched.iter().zip(decisions) {
        let verdict = match (decision.allowed, m.rule.shadow) {
            (true, _) => Verdict::Allowed,
            (false, true) => Verdict::ShadowDenied,
            (false, false) => Verdict::Denied,
        };
        node.metrics.check(&m.rule.name, verdict);
        if verdict == Verdict::Denied && denied_by.is_none() {
            denied_by = Some(m);
        }
        outcomes.push(Outcome {
            rule: &m.rule.name,
            window_ms: m.rule.window_ms,
            shadow: m.rule.shadow,
            decision,
            degraded,
        });
    }
    if let Some(m) = denied_by {
        node.violations.record(Violation {
            rule: m.rule.name.clone(),
            identity: m.identity.to_owned(),
            at_ms: now_ms,
            cost: req.cost,
            path: req.path.clone(),
        });
    }
    CheckResponse::from_outcomes(&outcomes, now_ms)
}

/// One store call through the breaker, with the node's timeout.
async fn store_decide(node: &Node, items: &[Item<'_>], cost: u64) -> Result<Vec<Stamped>, StoreError> {
    if !node.breaker.allow() {
        return Err(StoreError::Unavailable("circuit breaker open".into()));
    }
    let started = Instant::now();
    let call = node.store.decide_all(items, cost);
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
fn fail_over(node: &Node, matched: &[Matched<'_>], items: &[Item<'_>], cost: u64, now: Micros) -> Vec<Decision> {
    let fails_open = |m: &Matched<'_>| m.rule.failure == FailureMode::Open;
    let open: Vec<Item<'_>> = items
        .iter()
        .zip(matched)
        .filter(|(_, m)| fails_open(m))
        .map(|(i, _)| *i)
        .collect();
    let closed_denies = matched.iter().any(|m| !fails_open(m) && !m.rule.shadow);
    let mut from_fallback = node
        .fallback
        .decide_all_at(&open, cost, now, !closed_denies)
        .into_iter();
    matched
        .iter()
        .map(|m| match fails_open(m).then(|| from_fallback.next()).flatten() {
            Some(d) => d,
            None => closed_decision(&m.limit),
        })
        .collect()
}
