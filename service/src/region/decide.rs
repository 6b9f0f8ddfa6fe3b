//! Deciding a check that matches global rules, in a region: the global rules from the units
//! the node holds (no store call, no WAN), the regional ones in the region's store as
//! always, all-or-nothing across both.

use sluice_core::lease::book::{Left, QuotaKey, Spend};
use sluice_core::rules::Unreachable;
use sluice_core::{Decision, Micros};

use super::{Region, Source};
use crate::decide::{decide_limits, Matched};
use crate::node::Node;
use crate::store::closed_decision;

/// How one check's global rules go, decided under the book's lock.
enum Plan {
    /// Refused without counting anything: the decisions of the global rules that refused.
    Refused(Vec<(usize, Decision)>, Source),
    /// As `Refused` for want of units, but a quota lacks them only for want of asking
    /// (see [`cold`]): the check may wait for its lease.
    Cold(Vec<(usize, Decision)>),
    /// The global rules in `pooled` spent from the book (each with what its quota holds
    /// after); those in `alone` are decided in the region's store with their share.
    Go {
        pooled: Vec<(usize, QuotaKey, Left)>,
        alone: Vec<usize>,
        /// The check waited for a cold quota's first lease.
        waited: bool,
    },
}

/// Decides a check whose `matched` limits include global rules, filling in their
/// decisions; a limit's stays `None` when it was not counted because a global rule refused
/// the request first. Returns `true` when the global store could not be reached and a rule's
/// `on_global_unreachable` decided (the answer's `degraded`).
pub async fn decide(node: &Node, region: &Region, matched: &mut [Matched<'_>], now: Micros) -> bool {
    let now_ms = now.instant_ms();
    let cost = matched.first().map_or(1, |m| m.target.cost);
    let planned = match plan(region, matched, cost, now_ms) {
        Plan::Cold(refused) if region.link_up() => wait_cold(node, region, matched, cost, refused).await,
        planned => planned,
    };
    let (pooled, alone, waited) = match planned {
        Plan::Refused(refused, source) => return refuse(region, matched, refused, source),
        // The global store is cut off: no wait, a refusal.
        Plan::Cold(refused) => return refuse(region, matched, refused, Source::Empty),
        Plan::Go { pooled, alone, waited } => (pooled, alone, waited),
    };
    // The rest in one store call: the regional rules, and the global ones deciding alone
    // with the share of this client's limit (an override's, if it has one).
    for &i in &alone {
        let m = &mut matched[i];
        if let Some(share) = m.global.and_then(|g| g.unreachable.share(&m.target.limit)) {
            m.target.limit = share;
        }
    }
    let in_store = |(i, m): &(usize, &mut Matched<'_>)| m.global.is_none() || alone.contains(i);
    let store: Vec<&mut Matched<'_>> = matched
        .iter_mut()
        .enumerate()
        .filter(in_store)
        .map(|(_, m)| m)
        .collect();
    let degraded = !store.is_empty() && decide_limits(node, store).await;
    let passes = matched
        .iter()
        .enumerate()
        .filter(|(i, m)| m.global.is_none() || alone.contains(i))
        .all(|(_, m)| m.decision.is_some_and(|d| d.allowed) || m.target.shadow);
    if !passes {
        let quotas: Vec<QuotaKey> = pooled.iter().map(|(_, q, _)| q.clone()).collect();
        let spent: Vec<Left> = pooled.iter().map(|(_, _, left)| *left).collect();
        region.book().unspend(&quotas, &spent, cost, now_ms);
    }
    for (i, _, left) in &pooled {
        // A refused request took nothing: the units went back to the lease.
        let remaining = if passes {
            left.remaining
        } else {
            left.remaining.saturating_add(cost)
        };
        matched[*i].decision = Some(Decision {
            allowed: true,
            limit: left.limit,
            remaining,
            reset_after: Micros::from_ms(left.reset_after_ms),
            retry_after: Micros::ZERO,
            delay: Micros::ZERO,
        });
    }
    region.count(if !alone.is_empty() {
        Source::Alone
    } else if waited {
        Source::Cold
    } else {
        Source::Pool
    });
    degraded || !alone.is_empty()
}

/// The answer of a check its global rules refused (`refused`, counted as `source`).
fn refuse(region: &Region, matched: &mut [Matched<'_>], refused: Vec<(usize, Decision)>, source: Source) -> bool {
    region.count(source);
    for (i, d) in refused {
        matched[i].decision = Some(d);
    }
    // Refused while the global store cannot be reached: a failure policy decided.
    !region.link_up()
}

/// Which global rules spend from the book and which decide alone, and the spend itself.
fn plan(region: &Region, matched: &[Matched<'_>], cost: u64, now_ms: u64) -> Plan {
    let up = region.link_up();
    let mut book = region.book();
    let mut pooled = Vec::new();
    let mut alone = Vec::new();
    for (i, m) in matched.iter().enumerate() {
        let Some(global) = m.global else { continue };
        let quota = (m.name.to_owned(), m.identity.clone().into_owned());
        match &global.unreachable {
            _ if up => pooled.push((i, quota)),
            Unreachable::Spend => pooled.push((i, quota)),
            Unreachable::Closed => return Plan::Refused(vec![(i, closed_decision(&m.target.limit))], Source::CutOff),
            Unreachable::Share { .. } if book.holds(&quota, cost, now_ms) => pooled.push((i, quota)),
            Unreachable::Share { .. } => alone.push(i),
        }
    }
    let quotas: Vec<QuotaKey> = pooled.iter().map(|(_, q)| q.clone()).collect();
    match book.spend_units(&quotas, cost, now_ms) {
        Spend::Spent(spent) => Plan::Go {
            pooled: pooled
                .into_iter()
                .zip(spent)
                .map(|((i, q), left)| (i, q, left))
                .collect(),
            alone,
            waited: false,
        },
        // Not with the region's book (`remember_spent` is off); refused as a spent quota is.
        Spend::Exhausted { quota, .. } => {
            let (i, _) = pooled[quota];
            Plan::Refused(vec![(i, closed_decision(&matched[i].target.limit))], Source::Empty)
        }
        Spend::Missing => {
            // The quotas without units refuse; the others are not counted.
            let refused = pooled
                .iter()
                .filter(|(_, q)| !book.holds(q, cost, now_ms))
                .map(|(i, _)| (*i, closed_decision(&matched[*i].target.limit)))
                .collect();
            // Decided under the same lock as the spend: a lease landing just after it wakes
            // the waiting check again.
            if pooled.iter().any(|(_, q)| book.may_get(q, cost, now_ms)) {
                Plan::Cold(refused)
            } else {
                Plan::Refused(refused, Source::Empty)
            }
        }
    }
}

/// A check refused (`refused`) only because a global quota lacks units for want of asking
/// — cold (no lease: a new client, or one idle past `--global-keep-warm-ms`), or its lease
/// ran out though the global store had units to give (`LeaseBook::may_get`) — waits for
/// the node's next exchange with the global store (woken at once: one WAN round trip) to
/// lease the quota (the book asks for what the waiting checks want), then is planned again.
/// Refused after all if the lease came with no units (the quota is spent), if it does not
/// come within the region's timeout, or if `max_cold_waits` checks wait already.
async fn wait_cold(
    node: &Node,
    region: &Region,
    matched: &[Matched<'_>],
    cost: u64,
    refused: Vec<(usize, Decision)>,
) -> Plan {
    let Some(_place) = region.cold_wait() else {
        return Plan::Refused(refused, Source::ColdOverCap);
    };
    let mut landed = region.landed.subscribe();
    region.wake.notify_one();
    let deadline = tokio::time::Instant::now() + region.config.timeout + region.config.tick;
    loop {
        if !matches!(tokio::time::timeout_at(deadline, landed.changed()).await, Ok(Ok(()))) {
            return Plan::Refused(refused, Source::ColdTimedOut);
        }
        let now_ms = node.clock.now().instant_ms();
        match plan(region, matched, cost, now_ms) {
            // Another quota's exchange ended; this one's lease has not landed yet.
            Plan::Cold(_) if region.link_up() => {}
            Plan::Cold(refused) => return Plan::Refused(refused, Source::Empty),
            Plan::Go { pooled, alone, .. } => {
                return Plan::Go {
                    pooled,
                    alone,
                    waited: true,
                }
            }
            refused => return refused,
        }
    }
}
