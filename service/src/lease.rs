//! Leases (`POST /v1/lease`): units of a leased rule's quota granted to a proxy ahead of
//! use, taken from the shared state at once, and what it did not spend given back while
//! the lease lasts (see `sluice_core::lease` for what each algorithm then guarantees).

use sluice_core::identity::ip_identity;
use sluice_core::lease::wire::{LeaseGranted, LeaseRequest, LeaseResponse};
use sluice_core::rules::{Identity, RuleSet};

use crate::exchange::{exchange, LeaseError};
use crate::node::Node;
use crate::region::{sublease, Region};

/// Takes back what `req`'s returns did not spend, then grants its asks.
pub async fn lease(node: &Node, req: &LeaseRequest) -> Result<LeaseResponse, LeaseError> {
    let (rules, rules_version) = node.rules_in_force();
    let now_ms = node.clock.now().instant_ms();
    let timeout = node.config.store_timeout;
    let req = ip_grouped(req, &rules, node.config.ipv6_prefix);
    let (grants, returned) = match &node.region {
        Some(region) => through_region(node, region, &rules, now_ms, &req).await?,
        None => exchange(&node.store, &rules, now_ms, &req, timeout, |r| r.lease_ttl).await?,
    };
    for (r, back) in req.returns.iter().zip(&returned) {
        node.metrics.lease_returned(*back);
        if *back > 0 {
            // Units came back: a refusal of the quota this node remembers may pass now.
            node.refusals.forget(&node.store.keys().limit(&r.rule, &r.identity));
        }
    }
    for g in &grants {
        node.metrics.lease_granted(g.units);
    }
    node.metrics.lease_call();
    Ok(LeaseResponse {
        rules_version,
        grants,
        returned,
    })
}

/// `req` on a node in a region: its global rules out of the node's own leases of them
/// ([`crate::region::sublease`]), the others from the region's store, answered in `req`'s
/// order.
async fn through_region(
    node: &Node,
    region: &Region,
    rules: &RuleSet,
    now_ms: u64,
    req: &LeaseRequest,
) -> Result<(Vec<LeaseGranted>, Vec<u64>), LeaseError> {
    let global = |rule: &str| rules.rule(rule).is_some_and(|r| r.global.is_some());
    let part = |of_global: bool| LeaseRequest {
        grants: pick(&req.grants, |g| global(&g.rule) == of_global),
        returns: pick(&req.returns, |r| global(&r.rule) == of_global),
    };
    let (sub_grants, sub_returned) = sublease::exchange(region, rules, now_ms, &part(true))?;
    let (grants, returned) = exchange(
        &node.store,
        rules,
        now_ms,
        &part(false),
        node.config.store_timeout,
        |r| r.lease_ttl,
    )
    .await?;
    Ok((
        interleave(&req.grants, |g| global(&g.rule), sub_grants, grants),
        interleave(&req.returns, |r| global(&r.rule), sub_returned, returned),
    ))
}

/// The items of `items` that `keep` keeps, in order.
fn pick<T: Clone>(items: &[T], keep: impl Fn(&T) -> bool) -> Vec<T> {
    items.iter().filter(|i| keep(i)).cloned().collect()
}

/// [`pick`] undone: one answer per item of `items`, in order, taken from `yes` (the answers to
/// the items `which` picks, in their order) or from `no` (to the others).
fn interleave<T, A>(items: &[T], which: impl Fn(&T) -> bool, yes: Vec<A>, no: Vec<A>) -> Vec<A> {
    let (mut yes, mut no) = (yes.into_iter(), no.into_iter());
    items
        .iter()
        .filter_map(|i| if which(i) { yes.next() } else { no.next() })
        .collect()
}

/// `req` with the identities of rules by `ip` grouped as a check's are
/// ([`crate::check::canonical`]), so a lease counts in the same bucket as the checks.
fn ip_grouped(req: &LeaseRequest, rules: &RuleSet, ipv6_prefix: u8) -> LeaseRequest {
    let by_ip = |rule: &str| rules.rule(rule).is_some_and(|r| r.by == Identity::Ip);
    let group = |rule: &str, identity: &mut String| {
        if by_ip(rule) {
            *identity = ip_identity(identity, ipv6_prefix).into_owned();
        }
    };
    let mut req = req.clone();
    for g in &mut req.grants {
        group(&g.rule, &mut g.identity);
    }
    for r in &mut req.returns {
        group(&r.rule, &mut r.identity);
    }
    req
}
