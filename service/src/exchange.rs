//! One lease exchange with a store (the node's own, or a region's global one): what the
//! returns did not spend given back, then the grants, each a store call. The step both
//! leasing paths share, `crate::lease` (a proxy's `POST /v1/lease`) and `crate::region`
//! (a region's node leasing from the global store); it knows neither.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use sluice_core::lease::wire::{LeaseGranted, LeaseRequest};
use sluice_core::lease::Grant;
use sluice_core::rules::{Rule, RuleSet};
use sluice_core::Micros;
use thiserror::Error;

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
        Ok::<_, LeaseError>(answer(rule, id, &g))
    });
    let grants = join_all(grants).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok((grants, returned))
}

/// What a proxy is told of grant `g` of `rule`, lease `id`.
pub(crate) fn answer(rule: &Rule, id: u64, g: &Grant) -> LeaseGranted {
    LeaseGranted {
        lease: id,
        units: g.units,
        // Rounded down: the lease holder ends it no later than the store does.
        expires_in_ms: g.expires_at.saturating_sub(g.granted_at).instant_ms(),
        limit: g.decision.limit,
        remaining: g.decision.remaining,
        reset_after_ms: g.decision.reset_after.wait_ms(),
        window_ms: rule.window_ms,
        // With nothing granted, when one unit could be: the proxy refuses until then.
        retry_after_ms: if g.units == 0 {
            g.decision.retry_after.wait_ms()
        } else {
            0
        },
    }
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
