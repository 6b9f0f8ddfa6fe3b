//! Leases (`POST /v1/lease`): units of a leased rule's quota granted to a proxy ahead of
//! use, taken from the shared state at once, and what it did not spend given back while
//! the lease lasts (see `sluice_core::lease` for what each algorithm then guarantees).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;

use sluice_core::identity::ip_identity;
use sluice_core::lease::wire::{LeaseGranted, LeaseRequest, LeaseResponse};
use sluice_core::rules::{Identity, Rule, RuleSet};
use sluice_core::time::{instant_ms, wait_ms};
use sluice_core::Micros;
use thiserror::Error;

use crate::node::Node;
use crate::region::{sublease, Region};
use crate::store::{within, Store, StoreError};

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
    let timeout = node.config.store_timeout;
    let req = ip_grouped(req, &rules, node.config.ipv6_prefix);
    let (grants, returned) = match &node.region {
        Some(region) => through_region(node, region, &rules, now_ms, &req).await?,
        None => exchange(&node.store, &rules, now_ms, &req, timeout, |r| r.lease_ttl).await?,
    };
    for back in &returned {
        node.metrics.lease_returned(*back);
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
    let grants_global: Vec<bool> = req.grants.iter().map(|g| global(&g.rule)).collect();
    let returns_global: Vec<bool> = req.returns.iter().map(|r| global(&r.rule)).collect();
    let part = |of_global: bool| LeaseRequest {
        grants: pick(&req.grants, &grants_global, of_global),
        returns: pick(&req.returns, &returns_global, of_global),
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
        interleave(&grants_global, sub_grants, grants),
        interleave(&returns_global, sub_returned, returned),
    ))
}

/// The items of `items` whose flag in `flags` is `flag`.
fn pick<T: Clone>(items: &[T], flags: &[bool], flag: bool) -> Vec<T> {
    items
        .iter()
        .zip(flags)
        .filter(|(_, f)| **f == flag)
        .map(|(i, _)| i.clone())
        .collect()
}

/// [`pick`] undone: the items of `yes` where `flags` is true and of `no` elsewhere, in order.
fn interleave<T>(flags: &[bool], yes: Vec<T>, no: Vec<T>) -> Vec<T> {
    let (mut yes, mut no) = (yes.into_iter(), no.into_iter());
    flags
        .iter()
        .filter_map(|f| if *f { yes.next() } else { no.next() })
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

/// One lease exchange with `store`: the returns first, then the grants, each item its own
/// store call, all issued at once (over a WAN they cost one round trip together). A rule's
/// lease length is `ttl_of(rule)`; a rule without one is not leased here. The grants, and
/// the units each return took back.
pub async fn exchange(
    store: &Store,
    rules: &RuleSet,
    now_ms: u64,
    req: &LeaseRequest,
    timeout: Duration,
    ttl_of: impl Fn(&Rule) -> Option<Micros>,
) -> Result<(Vec<LeaseGranted>, Vec<u64>), LeaseError> {
    let returns = req.returns.iter().map(|r| async {
        let Some((rule, _)) = leased(rules, &r.rule, &ttl_of) else {
            return Ok(0); // the rule went away: its units come back as it refills
        };
        let limit = rules.limit_for(rule, &r.identity, now_ms);
        let key = store.keys().limit(&rule.name, &r.identity);
        within(timeout, store.give_back(&key, &limit, r.lease, r.unspent)).await
    });
    let returned = join_all(returns).await.into_iter().collect::<Result<Vec<u64>, _>>()?;
    let grants = req.grants.iter().map(|ask| async {
        let (rule, ttl) = leased(rules, &ask.rule, &ttl_of).ok_or_else(|| LeaseError::NotLeased(ask.rule.clone()))?;
        let limit = rules.limit_for(rule, &ask.identity, now_ms);
        let key = store.keys().limit(&rule.name, &ask.identity);
        let id = next_id();
        let g = within(timeout, store.grant(&key, &limit, ask.want, ttl, id)).await?;
        Ok::<_, LeaseError>(LeaseGranted {
            lease: id,
            units: g.units,
            // Rounded down: the lease holder ends it no later than the store does.
            expires_in_ms: instant_ms(g.expires_at.saturating_sub(g.granted_at)),
            limit: g.decision.limit,
            remaining: g.decision.remaining,
            reset_after_ms: wait_ms(g.decision.reset_after),
            window_ms: rule.window_ms,
            // With nothing granted, when one unit could be: the proxy refuses until then.
            retry_after_ms: if g.units == 0 {
                wait_ms(g.decision.retry_after)
            } else {
                0
            },
        })
    });
    let grants = join_all(grants).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok((grants, returned))
}

/// The rule `name` and its lease length, if it is leased here.
fn leased<'r>(rules: &'r RuleSet, name: &str, ttl_of: impl Fn(&Rule) -> Option<Micros>) -> Option<(&'r Rule, Micros)> {
    rules.rule(name).and_then(|r| Some((r, ttl_of(r)?)))
}

/// A lease id no other lease of this node had, and unlikely any other node's.
pub(crate) fn next_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one((COUNTER.fetch_add(1, Ordering::Relaxed), std::process::id()))
}
