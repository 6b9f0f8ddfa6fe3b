//! Leases (`POST /v1/lease`): units of a leased rule's quota granted to a proxy ahead of
//! use, taken from the shared state at once, and what it did not spend given back while
//! the lease lasts (see `sluice_core::lease` for what each algorithm then guarantees).
//!
//! An ask of a quota the node remembers spent ([`crate::refusals`]: a check refused at a
//! cost of one, or a grant of nothing) is granted nothing until the store's wait ends,
//! without a store call; a grant of nothing is remembered for the checks and the asks after
//! it, any other grant forgets.

use sluice_core::algorithm::Part;
use sluice_core::identity::ip_identity;
use sluice_core::lease::wire::{LeaseGranted, LeaseRequest, LeaseResponse};
use sluice_core::lease::{lease_end, Grant};
use sluice_core::rules::{Identity, Rule, RuleSet};
use sluice_core::{Decision, Limit, Micros};

use crate::exchange::{answer, exchange, next_id, LeaseError};
use crate::node::Node;
use crate::refusals::Settled;
use crate::region::{sublease, Region};
use crate::store::Item;

/// Takes back what `req`'s returns did not spend, then grants its asks.
pub async fn lease(node: &Node, req: &LeaseRequest) -> Result<LeaseResponse, LeaseError> {
    let (rules, rules_version) = node.rules_in_force();
    let now = node.clock.now();
    let now_ms = now.instant_ms();
    let req = ip_grouped(req, &rules, node.config.ipv6_prefix);
    let memory = Memory::look(node, &rules, &req, now);
    let asked = &memory.asked;
    let exchanged = match &node.region {
        Some(region) => through_region(node, region, &rules, now_ms, asked).await,
        None => {
            exchange(&node.store, &rules, now_ms, asked, node.config.store_timeout, |r| {
                r.lease_ttl
            })
            .await
        }
    };
    let (grants, returned) = memory.answered(node, exchanged, now)?;
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

/// A quota an ask is for, as the node's memory of refusals knows it.
struct Quota<'r> {
    rule: &'r Rule,
    key: String,
    limit: Limit,
}

impl Quota<'_> {
    /// The quota as the memory sees an ask: for at least one unit.
    fn item(&self) -> Item<'_> {
        let part = Part {
            limit: &self.limit,
            shadow: self.rule.shadow,
            cost: 1,
        };
        Item { key: &self.key, part }
    }

    /// A grant of nothing, as the memory refused it.
    fn refused(&self, decision: Decision, now: Micros) -> Option<LeaseGranted> {
        let g = Grant {
            units: 0,
            granted_at: now,
            expires_at: lease_end(&self.limit, now, self.rule.lease_ttl?),
            decision,
        };
        Some(answer(self.rule, next_id(), &g))
    }
}

/// A lease request's asks as the node's memory of refusals sees them.
struct Memory<'r> {
    /// Per ask, what the memory granted (`None`: the store decides).
    settled: Vec<Option<LeaseGranted>>,
    /// What goes to the store: the asks not settled, and every return.
    asked: LeaseRequest,
    /// The quota of each ask of `asked` the memory may speak for.
    quotas: Vec<Option<Quota<'r>>>,
}

impl<'r> Memory<'r> {
    /// Grants nothing to each ask of `req` whose quota's unit the node remembers refused
    /// at `now`; the others are asked of the store.
    fn look(node: &Node, rules: &'r RuleSet, req: &LeaseRequest, now: Micros) -> Memory<'r> {
        let mut memory = Memory {
            settled: Vec::with_capacity(req.grants.len()),
            asked: LeaseRequest {
                grants: Vec::new(),
                returns: req.returns.clone(),
            },
            quotas: Vec::new(),
        };
        for ask in &req.grants {
            let quota = quota(node, rules, req, &ask.rule, &ask.identity, now.instant_ms());
            let refused = quota
                .as_ref()
                .and_then(|q| match node.refusals.settles(&[q.item()], now) {
                    Settled::Refused(_, d, _) => q.refused(d, now),
                    Settled::Wait(_) | Settled::Ask => None,
                });
            if refused.is_some() {
                node.metrics.refused_from_memory(node.refusals.len());
            } else {
                memory.asked.grants.push(ask.clone());
                memory.quotas.push(quota);
            }
            memory.settled.push(refused);
        }
        memory
    }

    /// The store's answer to the asks: remembered (a grant of nothing is a refusal until
    /// the wait the proxy is told, less the millisecond that was rounded up, so never longer
    /// than the store's; units forget it), then every ask's grant in the request's order.
    fn answered(
        self,
        node: &Node,
        exchanged: Result<(Vec<LeaseGranted>, Vec<u64>), LeaseError>,
        now: Micros,
    ) -> Result<(Vec<LeaseGranted>, Vec<u64>), LeaseError> {
        let (granted, returned) = exchanged.inspect_err(|_| {
            let items: Vec<Item<'_>> = self.quotas.iter().flatten().map(Quota::item).collect();
            node.refusals.unanswered(&items);
        })?;
        for (q, g) in self.quotas.iter().zip(&granted) {
            let Some(q) = q else { continue };
            let decision = Decision {
                allowed: g.units > 0,
                limit: g.limit,
                remaining: g.remaining,
                reset_after: Micros::from_ms(g.reset_after_ms),
                retry_after: Micros::from_ms(g.retry_after_ms.saturating_sub(1)),
                delay: Micros::ZERO,
            };
            node.refusals.remember(&[q.item()], &[decision], now);
        }
        let mut granted = granted.into_iter();
        let grants = self
            .settled
            .into_iter()
            .filter_map(|s| s.or_else(|| granted.next()))
            .collect();
        Ok((grants, returned))
    }
}

/// The quota of an ask of `rule`/`identity` in `req` the memory may speak for: a leased
/// rule the node's own store decides (not a region's global rule), none of whose units the
/// same request returns (the returns come first and may pay for the ask).
fn quota<'r>(
    node: &Node,
    rules: &'r RuleSet,
    req: &LeaseRequest,
    rule: &str,
    identity: &str,
    now_ms: u64,
) -> Option<Quota<'r>> {
    let rule = rules.rule(rule).filter(|r| r.lease_ttl.is_some())?;
    let returned = req
        .returns
        .iter()
        .any(|r| r.rule == rule.name && r.identity == identity);
    if returned || (node.region.is_some() && rule.global.is_some()) {
        return None;
    }
    Some(Quota {
        rule,
        key: node.store.keys().limit(&rule.name, identity),
        limit: rules.limit_for(rule, identity, now_ms),
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
