//! Leases (`POST /v1/lease`): units of a leased rule's quota granted to a proxy ahead of
//! use, taken from the shared state at once, and what it did not spend given back while
//! the lease lasts (see `sluice_core::lease` for what each algorithm then guarantees).

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::lease::wire::{LeaseGranted, LeaseRequest, LeaseResponse};
use sluice_core::rules::{Rule, RuleSet};
use sluice_core::time::{instant_ms, wait_ms};
use thiserror::Error;

use crate::node::Node;
use crate::store::{keys, StoreError};

/// Why leases could not be given.
#[derive(Debug, Error)]
pub enum LeaseError {
    /// The proxy asked for a rule the service does not have, or one not leased.
    #[error("rule {0:?} is not a leased rule here (lease = true); fetch the rules again and decide it with /v1/check")]
    NotLeased(String),
    /// The counter store did not answer.
    #[error("the counter store cannot answer ({0}); decide with /v1/check, which applies each rule's failure policy")]
    Store(#[from] StoreError),
}

/// Takes back what `req`'s returns did not spend, then grants its asks.
pub async fn lease(node: &Node, req: &LeaseRequest) -> Result<LeaseResponse, LeaseError> {
    let (rules, rules_version) = node.rules_in_force();
    let now_ms = instant_ms(node.clock.now_us());
    let mut returned = Vec::with_capacity(req.returns.len());
    for r in &req.returns {
        let back = match leased(&rules, &r.rule) {
            Ok(rule) => {
                let limit = rules.limit_for(rule, &r.identity, now_ms);
                let key = keys::limit(&rule.name, &r.identity);
                timed(node, node.store.give_back(&key, &limit, r.lease, r.unspent)).await?
            }
            Err(_) => 0, // the rule went away: its units come back as it refills
        };
        node.metrics.lease_returned(back);
        returned.push(back);
    }
    let mut grants = Vec::with_capacity(req.grants.len());
    for ask in &req.grants {
        let rule = leased(&rules, &ask.rule)?;
        let ttl = rule.lease_ttl.ok_or_else(|| LeaseError::NotLeased(ask.rule.clone()))?;
        let limit = rules.limit_for(rule, &ask.identity, now_ms);
        let key = keys::limit(&rule.name, &ask.identity);
        let id = next_id();
        let g = timed(node, node.store.grant(&key, &limit, ask.want, ttl, id)).await?;
        node.metrics.lease_granted(g.units);
        grants.push(LeaseGranted {
            lease: id,
            units: g.units,
            // Rounded down: the proxy ends it no later than the service does.
            expires_in_ms: instant_ms(g.expires_at.saturating_sub(g.granted_at)),
            limit: g.decision.limit,
            remaining: g.decision.remaining,
            reset_after_ms: wait_ms(g.decision.reset_after),
            window_ms: rule.window_ms,
        });
    }
    node.metrics.lease_call();
    Ok(LeaseResponse {
        rules_version,
        grants,
        returned,
    })
}

/// The rule `name`, if it is leased.
fn leased<'r>(rules: &'r RuleSet, name: &str) -> Result<&'r Rule, LeaseError> {
    rules
        .rule(name)
        .filter(|r| r.lease_ttl.is_some())
        .ok_or_else(|| LeaseError::NotLeased(name.to_owned()))
}

/// A store call with the node's timeout.
async fn timed<T>(node: &Node, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    match tokio::time::timeout(node.config.store_timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {:?}",
            node.config.store_timeout
        ))),
    }
}

/// A lease id no other lease of this node had, and unlikely any other node's.
fn next_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one((COUNTER.fetch_add(1, Ordering::Relaxed), std::process::id()))
}
