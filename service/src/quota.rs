//! A quota read without spending it (a peek: a check of cost 0) and a cost spent after the
//! response (a debit, `POST /v1/debit`): an LLM API learns what a request cost — its tokens —
//! only when it answers.
//!
//! Neither counts in the check metrics or records a violation: a peek decides nothing, and
//! a debit refuses nothing. A node in a region peeks and debits its regional rules only:
//! its global rules are spent from leases the node holds (see [`crate::region`]).

use sluice_core::algorithm::peeked;
use sluice_core::rules::Rule;
use sluice_core::time::instant_ms;
use sluice_core::wire::{CheckRequest, CheckResponse, RuleOutcome};

use crate::decide::{refused_for_missing, targets, Target};
use crate::node::Node;
use crate::store::{within, Item, StoreError};

/// The rules `req` matches that this node can peek or debit.
fn matched<'r>(node: &Node, rules: &'r sluice_core::rules::RuleSet, req: &'r CheckRequest) -> Vec<(&'r Rule, &'r str)> {
    rules
        .matching_host(&req.identities, &req.method, req.host.as_deref(), &req.path)
        .filter(|(rule, _)| node.region.is_none() || rule.global.is_none())
        .collect()
}

fn outcome<'t>(rule: &'t Rule, decision: sluice_core::Decision, degraded: bool) -> RuleOutcome<'t> {
    RuleOutcome {
        rule: &rule.name,
        window_ms: rule.window_ms,
        shadow: rule.shadow,
        decision,
        degraded,
    }
}

/// What `req` would get now, spending nothing: each rule's decision for a request of cost
/// 1, with `remaining` what is left now. When the store cannot answer, the node's fallback
/// buckets say (`degraded`), whatever the rules' failure policies.
pub async fn peek(node: &Node, req: &CheckRequest) -> CheckResponse {
    let rules = node.rules();
    let now_ms = instant_ms(node.clock.now_us());
    let matched = matched(node, &rules, req);
    if let Some((rule, _)) = matched.iter().find(|(rule, id)| rule.refuses(id) && !rule.shadow) {
        return refused_for_missing(rule, now_ms);
    }
    let targets: Vec<Target> = targets(node, &rules, &matched, 1, now_ms);
    let (decisions, degraded) = peek_targets(node, &targets).await;
    let outcomes: Vec<RuleOutcome<'_>> = matched
        .iter()
        .zip(decisions)
        .map(|(&(rule, _), d)| outcome(rule, peeked(d), degraded))
        .collect();
    CheckResponse::from_outcomes(&outcomes, now_ms)
}

/// The decisions `targets` (each of cost 1) would get now, spending nothing, and whether
/// the fallback buckets gave them (`degraded`: the store could not answer).
pub async fn peek_targets(node: &Node, targets: &[Target]) -> (Vec<sluice_core::Decision>, bool) {
    let items: Vec<Item<'_>> = targets.iter().map(Target::item).collect();
    match within(node.config.store_timeout, node.store.peek_all(&items)).await {
        Ok(decisions) => (decisions, false),
        Err(e) => {
            tracing::debug!(error = %e, "store failed; the fallback buckets answer the peek");
            (node.fallback.decide_all_now(&items, false), true)
        }
    }
}

/// Spends `req.cost` of every rule `req` matches, whatever is left of each: never refused,
/// and what is beyond a quota is not carried as a debt. The answer is the next request's
/// (as a [`peek`] after the debit): `allowed: false` says the quota is spent. Nothing is
/// taken from the fallback buckets when the store cannot answer: the error says so.
pub async fn debit(node: &Node, req: &CheckRequest) -> Result<CheckResponse, StoreError> {
    let rules = node.rules();
    let now_ms = instant_ms(node.clock.now_us());
    let matched = matched(node, &rules, req);
    let targets = targets(node, &rules, &matched, req.cost, now_ms);
    let mut outcomes = Vec::with_capacity(matched.len());
    for (&(rule, _), target) in matched.iter().zip(&targets) {
        let taken = within(
            node.config.store_timeout,
            node.store.take(&target.key, &target.limit, req.cost),
        )
        .await?;
        tracing::debug!(rule = %rule.name, cost = req.cost, taken = taken.units, "debit");
        outcomes.push(outcome(rule, taken.decision, false));
    }
    Ok(CheckResponse::from_outcomes(&outcomes, now_ms))
}
