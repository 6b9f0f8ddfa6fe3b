//! Deciding a check that matches global rules, in a region: the global rules from the units
//! the node holds (no store call, no WAN), the regional ones in the region's store as
//! always, all-or-nothing across both.

use sluice_core::lease::book::{Left, QuotaKey, Spend};
use sluice_core::rules::{Rule, Unreachable};
use sluice_core::time::instant_ms;
use sluice_core::{Decision, Micros};

use super::{Region, Source};
use crate::decide::{decide_limits, Target};
use crate::node::Node;
use crate::store::closed_decision;

/// How one check's global rules go, decided under the book's lock.
enum Plan {
    /// Refused without counting anything: the decisions of the global rules that refused.
    Refused(Vec<(usize, Decision)>, Source),
    /// As `Refused` for want of units, but a quota lacks them only for want of asking
    /// (see [`cold`]): the check may wait for its lease.
    Cold(Vec<(usize, Decision)>),
    /// The global rules in `pooled` spent from the book (`spent`, in the same order); those
    /// in `alone` are decided in the region's store with their share.
    Go {
        pooled: Vec<(usize, QuotaKey)>,
        spent: Vec<Left>,
        alone: Vec<usize>,
        /// The check waited for a cold quota's first lease.
        waited: bool,
    },
}

/// Decides a check whose `matched` rules (`targets`, in the same order) include global
/// rules. A rule's decision is `None` when it was not counted because a global rule refused
/// the request first; `true` beside them when the global store could not be reached and a
/// rule's `on_global_unreachable` decided (the answer's `degraded`).
pub async fn decide(
    node: &Node,
    region: &Region,
    matched: &[(&Rule, &str)],
    targets: &[Target],
    now_us: Micros,
) -> (Vec<Option<Decision>>, bool) {
    let now_ms = instant_ms(now_us);
    let cost = targets.first().map_or(1, |t| t.cost);
    let mut out = vec![None; matched.len()];
    let planned = match plan(region, matched, targets, cost, now_ms) {
        Plan::Cold(refused) if region.link_up() => wait_cold(node, region, matched, targets, cost, refused).await,
        planned => planned,
    };
    let (pooled, spent, alone, waited) = match planned {
        Plan::Refused(refused, source) => return refuse(region, out, refused, source),
        // The global store is cut off: no wait, a refusal.
        Plan::Cold(refused) => return refuse(region, out, refused, Source::Empty),
        Plan::Go {
            pooled,
            spent,
            alone,
            waited,
        } => (pooled, spent, alone, waited),
    };
    // The rest in one store call: the regional rules, and the global ones deciding alone.
    let in_store: Vec<usize> = (0..matched.len())
        .filter(|i| matched[*i].0.global.is_none() || alone.contains(i))
        .collect();
    let store_targets: Vec<Target> = in_store
        .iter()
        .map(|&i| {
            // Deciding alone: the share of this client's limit (an override's, if it has one).
            let share = matched[i]
                .0
                .global
                .as_ref()
                .and_then(|g| g.unreachable.share(&targets[i].limit));
            Target {
                limit: share.unwrap_or(targets[i].limit),
                ..targets[i].clone()
            }
        })
        .collect();
    let (decided, degraded) = if store_targets.is_empty() {
        (Vec::new(), false)
    } else {
        decide_limits(node, &store_targets).await
    };
    let passes = decided.iter().zip(&store_targets).all(|(d, t)| d.allowed || t.shadow);
    if !passes {
        let quotas: Vec<QuotaKey> = pooled.iter().map(|(_, q)| q.clone()).collect();
        region.book().unspend(&quotas, &spent, cost, now_ms);
    }
    for (i, d) in in_store.into_iter().zip(decided) {
        out[i] = Some(d);
    }
    for ((i, _), left) in pooled.iter().zip(&spent) {
        // A refused request took nothing: the units went back to the lease.
        let remaining = if passes {
            left.remaining
        } else {
            left.remaining.saturating_add(cost)
        };
        out[*i] = Some(Decision {
            allowed: true,
            limit: left.limit,
            remaining,
            reset_after: left.reset_after_ms.saturating_mul(1_000),
            retry_after: 0,
            delay: 0,
        });
    }
    region.count(if !alone.is_empty() {
        Source::Alone
    } else if waited {
        Source::Cold
    } else {
        Source::Pool
    });
    (out, degraded || !alone.is_empty())
}

/// The answer of a check its global rules refused (`refused`, counted as `source`).
fn refuse(
    region: &Region,
    mut out: Vec<Option<Decision>>,
    refused: Vec<(usize, Decision)>,
    source: Source,
) -> (Vec<Option<Decision>>, bool) {
    region.count(source);
    for (i, d) in refused {
        out[i] = Some(d);
    }
    // Refused while the global store cannot be reached: a failure policy decided.
    (out, !region.link_up())
}

/// Which global rules spend from the book and which decide alone, and the spend itself.
fn plan(region: &Region, matched: &[(&Rule, &str)], targets: &[Target], cost: u64, now_ms: u64) -> Plan {
    let up = region.link_up();
    let mut book = region.book();
    let mut pooled = Vec::new();
    let mut alone = Vec::new();
    for (i, (rule, identity)) in matched.iter().enumerate() {
        let Some(global) = &rule.global else { continue };
        let quota = (rule.name.clone(), (*identity).to_owned());
        match &global.unreachable {
            _ if up => pooled.push((i, quota)),
            Unreachable::Spend => pooled.push((i, quota)),
            Unreachable::Closed => return Plan::Refused(vec![(i, closed_decision(&targets[i].limit))], Source::CutOff),
            Unreachable::Share { .. } if book.holds(&quota, cost, now_ms) => pooled.push((i, quota)),
            Unreachable::Share { .. } => alone.push(i),
        }
    }
    let quotas: Vec<QuotaKey> = pooled.iter().map(|(_, q)| q.clone()).collect();
    match book.spend_units(&quotas, cost, now_ms) {
        Spend::Spent(spent) => Plan::Go {
            pooled,
            spent,
            alone,
            waited: false,
        },
        // Not with the region's book (`remember_spent` is off); refused as a spent quota is.
        Spend::Exhausted { quota, .. } => {
            let (i, _) = pooled[quota];
            Plan::Refused(vec![(i, closed_decision(&targets[i].limit))], Source::Empty)
        }
        Spend::Missing => {
            // The quotas without units refuse; the others are not counted.
            let refused = pooled
                .iter()
                .filter(|(_, q)| !book.holds(q, cost, now_ms))
                .map(|(i, _)| (*i, closed_decision(&targets[*i].limit)))
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
    matched: &[(&Rule, &str)],
    targets: &[Target],
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
        let now_ms = instant_ms(node.clock.now_us());
        match plan(region, matched, targets, cost, now_ms) {
            // Another quota's exchange ended; this one's lease has not landed yet.
            Plan::Cold(_) if region.link_up() => {}
            Plan::Cold(refused) => return Plan::Refused(refused, Source::Empty),
            Plan::Go {
                pooled, spent, alone, ..
            } => {
                return Plan::Go {
                    pooled,
                    spent,
                    alone,
                    waited: true,
                }
            }
            refused => return refused,
        }
    }
}
