//! Deciding a check that matches global rules, in a region: the global rules from the units
//! the node holds (no store call, no WAN), the regional ones in the region's store as
//! always, all-or-nothing across both.

use sluice_core::lease::book::{Left, Quota, Spend};
use sluice_core::rules::{Rule, Unreachable};
use sluice_core::time::instant_ms;
use sluice_core::{Decision, Micros};

use super::{Region, Source};
use crate::check::{self, Target};
use crate::node::Node;
use crate::store::closed_decision;

/// How one check's global rules go, decided under the book's lock.
enum Plan {
    /// Refused without counting anything: the decisions of the global rules that refused.
    Refused(Vec<(usize, Decision)>, Source),
    /// The global rules in `pooled` spent from the book (`spent`, in the same order); those
    /// in `alone` are decided in the region's store with their share.
    Go {
        pooled: Vec<(usize, Quota)>,
        spent: Vec<Left>,
        alone: Vec<usize>,
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
    let (pooled, spent, alone) = match plan(region, matched, targets, cost, now_ms) {
        Plan::Refused(refused, source) => {
            region.count(source);
            for (i, d) in refused {
                out[i] = Some(d);
            }
            // Refused while the global store cannot be reached: a failure policy decided.
            return (out, !region.link_up());
        }
        Plan::Go { pooled, spent, alone } => (pooled, spent, alone),
    };
    // The rest in one store call: the regional rules, and the global ones deciding alone.
    let in_store: Vec<usize> = (0..matched.len())
        .filter(|i| matched[*i].0.global.is_none() || alone.contains(i))
        .collect();
    let store_targets: Vec<Target> = in_store
        .iter()
        .map(|&i| match matched[i].0.global.as_ref().map(|g| &g.unreachable) {
            Some(Unreachable::Share(share)) => Target {
                limit: *share,
                ..targets[i].clone()
            },
            _ => targets[i].clone(),
        })
        .collect();
    let (decided, degraded) = if store_targets.is_empty() {
        (Vec::new(), false)
    } else {
        check::decide(node, &store_targets, now_us).await
    };
    let passes = decided.iter().zip(&store_targets).all(|(d, t)| d.allowed || t.shadow);
    if !passes {
        let quotas: Vec<Quota> = pooled.iter().map(|(_, q)| q.clone()).collect();
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
    region.count(if alone.is_empty() { Source::Pool } else { Source::Alone });
    (out, degraded || !alone.is_empty())
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
            Unreachable::Share(_) if book.holds(&quota, cost, now_ms) => pooled.push((i, quota)),
            Unreachable::Share(_) => alone.push(i),
        }
    }
    let quotas: Vec<Quota> = pooled.iter().map(|(_, q)| q.clone()).collect();
    match book.spend_units(&quotas, cost, now_ms) {
        Spend::Spent(spent) => Plan::Go { pooled, spent, alone },
        Spend::Missing => {
            // The quotas without units refuse; the others are not counted.
            let refused = pooled
                .iter()
                .filter(|(_, q)| !book.holds(q, cost, now_ms))
                .map(|(i, _)| (*i, closed_decision(&targets[*i].limit)))
                .collect();
            Plan::Refused(refused, Source::Empty)
        }
    }
}
