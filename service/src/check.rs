//! Evaluating a check request: every matching rule, all-or-nothing.
//!
//! Rules are decided in rule-file order, each atomically in the store. At the first
//! enforced denial evaluation stops and the rules that already admitted the request are
//! refunded, so a denied request consumes nothing. Shadow rules count (and are refunded
//! like the others) but never deny. When the store fails, a rule's failure policy decides:
//! `open` asks the node's fallback bucket (`degraded: true`), `closed` denies.

use std::time::Instant;

use sluice_core::rules::{FailureMode, Rule};
use sluice_core::time::instant_ms;
use sluice_core::wire::{CheckRequest, CheckResponse, Outcome};
use sluice_core::{Limit, Micros};

use crate::metrics::Verdict;
use crate::node::Node;
use crate::store::{closed_decision, keys, Stamped, StoreError};
use crate::violations::Violation;

/// A rule's admission, kept for a refund.
struct Admitted {
    key: String,
    limit: Limit,
    at: Micros,
    degraded: bool,
}

/// Decides a validated request.
pub async fn check(node: &Node, req: &CheckRequest) -> CheckResponse {
    let rules = node.rules();
    let now_us = node.clock.now_us();
    let now_ms = instant_ms(now_us);
    let mut outcomes: Vec<Outcome<'_>> = Vec::new();
    let mut admitted: Vec<Admitted> = Vec::new();
    let mut denied_by: Option<(&Rule, &str)> = None;

    for (rule, identity) in rules.matching(&req.identities, &req.method, &req.path) {
        let limit = rules.limit_for(rule, identity, now_ms);
        let key = keys::limit(&rule.name, identity);
        let (decision, degraded, at) = match store_decide(node, &key, &limit, req.cost).await {
            Ok(Stamped { decision, at }) => (decision, false, at),
            Err(e) => {
                tracing::debug!(rule = %rule.name, error = %e, "store failed; applying the rule's failure policy");
                node.metrics.degraded();
                match rule.failure {
                    FailureMode::Open => (node.fallback.decide_at(&key, &limit, req.cost, now_us), true, now_us),
                    FailureMode::Closed => (closed_decision(&limit), true, now_us),
                }
            }
        };
        let verdict = match (decision.allowed, rule.shadow) {
            (true, _) => Verdict::Allowed,
            (false, true) => Verdict::ShadowDenied,
            (false, false) => Verdict::Denied,
        };
        node.metrics.check(&rule.name, verdict);
        outcomes.push(Outcome {
            rule: &rule.name,
            window_ms: rule.window_ms,
            shadow: rule.shadow,
            decision,
            degraded,
        });
        if decision.allowed {
            admitted.push(Admitted {
                key,
                limit,
                at,
                degraded,
            });
        } else if !rule.shadow {
            denied_by = Some((rule, identity));
            break;
        }
    }

    if let Some((rule, identity)) = denied_by {
        for a in &admitted {
            refund(node, a, req.cost).await;
        }
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
async fn store_decide(node: &Node, key: &str, limit: &Limit, cost: u64) -> Result<Stamped, StoreError> {
    if !node.breaker.allow() {
        return Err(StoreError::Unavailable("circuit breaker open".into()));
    }
    let started = Instant::now();
    let result = match tokio::time::timeout(node.config.store_timeout, node.store.decide(key, limit, cost)).await {
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

async fn refund(node: &Node, a: &Admitted, cost: u64) {
    if a.degraded {
        node.fallback.refund(&a.key, &a.limit, a.at, cost);
        return;
    }
    let call = node.store.refund(&a.key, &a.limit, a.at, cost);
    match tokio::time::timeout(node.config.store_timeout, call).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(key = %a.key, error = %e, "refund failed; quota stays spent"),
        Err(_) => tracing::debug!(key = %a.key, "refund timed out; quota stays spent"),
    }
}
