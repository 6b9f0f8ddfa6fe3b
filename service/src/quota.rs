//! A quota read without spending it (a peek: a check of cost 0) and a cost spent after the
//! response (a debit, `POST /v1/debit`): an LLM API learns what a request cost — its tokens —
//! only when it answers.
//!
//! Neither counts in the check metrics or records a violation: a peek decides nothing, and
//! a debit refuses nothing. A node in a region peeks and debits its regional rules only:
//! its global rules are spent from leases the node holds (see [`crate::region`]).

use sluice_core::algorithm::{peeked, Algorithm};
use sluice_core::rules::{Rule, RuleSet};
use sluice_core::wire::{CheckRequest, CheckResponse, RuleOutcome};

use crate::decide::{matched, refused_for_missing, Matched};
use crate::node::Node;
use crate::store::{within, Item, StoreError};

/// The rules `req` matches that this node can peek or debit.
fn found<'r>(node: &Node, rules: &'r RuleSet, req: &'r CheckRequest) -> Vec<(&'r Rule, &'r str)> {
    rules
        .matching_host(&req.identities, &req.method, req.host.as_deref(), &req.path)
        .filter(|(rule, _)| node.region.is_none() || rule.global.is_none())
        .collect()
}

/// What `req` would get now, spending nothing: each rule's decision for a request of cost
/// 1, with `remaining` what is left now. When the store cannot answer, the node's fallback
/// buckets say (`degraded`), whatever the rules' failure policies.
pub async fn peek(node: &Node, req: &CheckRequest) -> CheckResponse {
    let rules = node.rules();
    let now_ms = node.clock.now().instant_ms();
    let found = found(node, &rules, req);
    if let Some((rule, _)) = found.iter().find(|(rule, id)| rule.refuses(id) && !rule.shadow) {
        return refused_for_missing(rule, now_ms);
    }
    let mut matched = matched(node, &rules, found, 1, now_ms);
    let degraded = peek_limits(node, &mut matched).await;
    let outcomes: Vec<RuleOutcome<'_>> = matched.iter().filter_map(|m| m.outcome(degraded)).collect();
    CheckResponse::from_outcomes(&outcomes, now_ms)
}

/// Fills in the decisions `limits` (each of cost 1) would get now, spending nothing, as a
/// peek reads them ([`peeked`]: `remaining` what is left); whether the fallback buckets
/// gave them (`degraded`: the store could not answer).
pub async fn peek_limits(node: &Node, limits: &mut [Matched<'_>]) -> bool {
    let items: Vec<Item<'_>> = limits.iter().map(|m| m.target.item()).collect();
    let (decisions, degraded) = match within(node.config.store_timeout, node.store.peek_all(&items)).await {
        Ok(decisions) => (decisions, false),
        Err(e) => {
            tracing::debug!(error = %e, "store failed; the fallback buckets answer the peek");
            (node.fallback.decide_all_now(&items, false), true)
        }
    };
    for (m, d) in limits.iter_mut().zip(decisions) {
        m.decision = Some(peeked(d));
    }
    degraded
}

/// Spends `req.cost` of every rule `req` matches, whatever is left of each: never refused,
/// and what is beyond a quota is not carried as a debt. The answer is the next request's
/// (as a [`peek`] after the debit): `allowed: false` says the quota is spent. Nothing is
/// taken from the fallback buckets when the store cannot answer: the error says so.
pub async fn debit(node: &Node, req: &CheckRequest) -> Result<CheckResponse, StoreError> {
    let rules = node.rules();
    let now_ms = node.clock.now().instant_ms();
    // A concurrency rule counts requests in flight, which a cost learnt afterwards is not.
    let found = found(node, &rules, req)
        .into_iter()
        .filter(|(rule, _)| rule.limit.algorithm() != Algorithm::Concurrency);
    let mut matched = matched(node, &rules, found, req.cost, now_ms);
    for m in &mut matched {
        let t = &m.target;
        let taken = within(node.config.store_timeout, node.store.take(&t.key, &t.limit, t.cost)).await?;
        tracing::debug!(rule = %m.name, cost = t.cost, taken = taken.units, "debit");
        m.decision = Some(taken.decision);
    }
    let outcomes: Vec<RuleOutcome<'_>> = matched.iter().filter_map(|m| m.outcome(false)).collect();
    Ok(CheckResponse::from_outcomes(&outcomes, now_ms))
}
