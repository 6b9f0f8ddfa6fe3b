//! One tick's decisions for one bucket: what it needs ([`Walk::step`]), what grant pays for
//! it ([`ask`]), and what Envoy is told once the store has answered ([`settle`]). Pure: the
//! book holds the state and calls the store.

use std::collections::HashMap;

use sluice_core::lease::lease_end;
use sluice_core::lease::wire::{LeaseAsk, LeaseGranted, LeaseReturn};
use sluice_core::rules::{Rule, RuleSet};
use sluice_core::Micros;

use super::assign::{self, Strategy, SECOND_MS};
use super::bucket::{BucketKey, Resolved};
use super::{action, UnknownBuckets};

/// A renewal is sent this long before the assignment it follows ends.
pub const RENEW_MARGIN_MS: u64 = 500;

/// A bucket one stream subscribed.
pub(super) struct Bucket {
    pub(super) quota: Resolved,
    /// Its quota's limit key ([`keys::limit`]; empty unless the quota is a rule's).
    pub(super) quota_key: String,
    /// Requests a second its latest report showed (allowed and denied).
    pub(super) demand_per_s: u64,
    /// When a report last showed it in use (or it was subscribed).
    pub(super) used_at_ms: u64,
    /// A report came since its assignment was made: the next tick checks it still fits.
    pub(super) reported: bool,
    pub(super) assigned: Option<Assigned>,
}

/// The assignment a bucket holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Assigned {
    pub(super) strategy: Strategy,
    /// The lease that paid for its last seconds (0: none).
    pub(super) lease: u64,
    /// The end its leases paid for (when it was sent plus its TTL).
    pub(super) paid_until_ms: u64,
    /// When to send the next one.
    pub(super) renew_at_ms: u64,
}

/// A contended quota: what every node's buckets want of it, as the store last answered.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Share {
    /// Requests a second, over every node (`None`: not heard yet).
    pub(super) total: Option<u64>,
    /// When this node last told the store its own part.
    pub(super) told_at_ms: u64,
    /// Until when the quota counts as contended: a grant for it came back short, or left
    /// less than it took.
    pub(super) contended_until_ms: u64,
}

/// A grant to ask for in this tick.
pub(super) struct Due {
    pub(super) stream: u64,
    pub(super) key: BucketKey,
    pub(super) ask: LeaseAsk,
    pub(super) wanted: Strategy,
    pub(super) ttl_s: u64,
    /// The assignment it extends, if it keeps the same bucket.
    pub(super) extends: Option<Assigned>,
    /// What the assignment it replaces paid for and cannot spend any more.
    pub(super) back: Option<LeaseReturn>,
}

/// How long a blanket answer (an unknown or refused bucket) lasts, and a refusal for want
/// of units before the bucket asks again.
const BLANKET_TTL_S: u64 = 30;
const DENIED_TTL_S: u64 = 2;
/// How long an answer may take to reach Envoy: what an old bucket may still spend of its
/// refills after its replacement is sent.
const DELIVERY_MS: u64 = 100;
/// Most units one grant asks for.
const MAX_WANT: u64 = 1_000_000_000;

/// What one bucket needs this tick.
pub(super) enum Step {
    /// Nothing.
    Keep,
    /// This action, and nothing from the store.
    Say(action::Action),
    /// This action, then forget the bucket.
    Drop(action::Action),
    /// A grant (its stream and key are the caller's to fill in).
    Ask(Due),
}

/// What a tick knows as it walks the buckets.
pub(super) struct Walk<'a> {
    pub(super) rules: &'a RuleSet,
    /// What every node's buckets want of a quota, a second, as last heard from the store.
    pub(super) shares: &'a HashMap<String, Share>,
    pub(super) now: Micros,
    /// Whether grants may be asked for (not while backing off a failed exchange).
    pub(super) asking: bool,
    pub(super) unknown: UnknownBuckets,
    pub(super) idle_ms: u64,
}

impl Walk<'_> {
    /// What bucket `b` (id `key`) needs; `room`: whether this tick can take one more grant.
    pub(super) fn step(&self, key: &BucketKey, b: &mut Bucket, room: bool) -> Step {
        let now_ms = self.now.instant_ms();
        if now_ms.saturating_sub(b.used_at_ms) >= self.idle_ms {
            return Step::Drop(action::abandon(key));
        }
        let blanket = |b: &mut Bucket, strategy| {
            if b.assigned.is_some_and(|a| now_ms < a.renew_at_ms) {
                return Step::Keep;
            }
            b.assigned = Some(Assigned {
                strategy,
                lease: 0,
                paid_until_ms: now_ms,
                renew_at_ms: now_ms + BLANKET_TTL_S * SECOND_MS - RENEW_MARGIN_MS,
            });
            Step::Say(action::assign(key, strategy, BLANKET_TTL_S))
        };
        let (rule, identity) = match &b.quota {
            Resolved::Unknown => {
                return match self.unknown {
                    UnknownBuckets::Abandon => Step::Drop(action::abandon(key)),
                    UnknownBuckets::Allow => blanket(b, Strategy::AllowAll),
                    UnknownBuckets::Deny => blanket(b, Strategy::DenyAll),
                }
            }
            Resolved::Refused => return blanket(b, Strategy::DenyAll),
            Resolved::Of { rule, identity } => (rule.clone(), identity.clone()),
        };
        // Between renewals, only a report can make a bucket outgrow its assignment.
        let reported = std::mem::take(&mut b.reported);
        let Some(r) = self.rules.rule(&rule) else {
            return Step::Keep;
        };
        let total = self.shares.get(&b.quota_key).and_then(|s| s.total);
        let planned = planned(r, b.demand_per_s, total);
        let outgrown = reported && b.assigned.is_some_and(|a| !assign::fits(a.strategy, planned));
        let renew = outgrown || b.assigned.is_none_or(|a| now_ms >= a.renew_at_ms);
        if !(renew && self.asking && room) {
            return Step::Keep;
        }
        ask(self.rules, r, &identity, b, planned, outgrown, self.now).map_or(Step::Keep, Step::Ask)
    }
}

/// The bucket `rule` plans for a demand of `demand_per_s` when every node's buckets of the
/// quota want `total` a second.
fn planned(rule: &Rule, demand_per_s: u64, total: Option<u64>) -> Strategy {
    let total = total.unwrap_or(demand_per_s);
    assign::plan_shared(demand_per_s, total, room(rule), assignment_ttl(rule) / Micros::SECOND)
}

/// The grant bucket `b` of `rule`/`identity` needs now (`None`: none can be made before its
/// window turns, or none is needed). Its stream and key are filled in by the caller.
///
/// A renewal extends the bucket Envoy has; only a report showing the demand outgrew it
/// (`outgrown`) replaces it. Were a bucket replaced at every renewal while the quota cannot
/// pay for the plan at once, each replacement would cost a new burst and a second paid
/// ahead, and the client would settle well under the rule's rate.
fn ask(
    rules: &RuleSet,
    r: &Rule,
    identity: &str,
    b: &Bucket,
    planned: Strategy,
    outgrown: bool,
    now: Micros,
) -> Option<Due> {
    let now_ms = now.instant_ms();
    let rule = r.name.as_str();
    let limit = rules.limit_for(r, identity, now_ms);
    let ttl_s = (lease_end(&limit, now, assignment_ttl(r)) - now) / Micros::SECOND;
    if ttl_s == 0 {
        return None; // the last second of a window: the next window pays for what follows
    }
    let end_ms = now_ms + ttl_s * SECOND_MS;
    let extends = b
        .assigned
        .filter(|a| matches!(a.strategy, Strategy::Bucket { per_s, .. } if per_s > 0) && a.paid_until_ms > now_ms)
        .filter(|a| !outgrown || assign::fits(a.strategy, planned));
    let wanted = extends.map_or(planned, |a| a.strategy);
    let want = match extends {
        Some(a) => assign::extension(a.strategy, a.paid_until_ms, end_ms),
        None => wanted.units(ttl_s),
    };
    // A new bucket replaces the old one when Envoy receives it: the refills the old one was
    // paid for after that go back (its unspent tokens cannot: Envoy may have spent them).
    let back = match (extends, b.assigned) {
        (None, Some(a)) if a.lease != 0 => {
            let unspent = assign::refills(a.strategy, now_ms + DELIVERY_MS, a.paid_until_ms);
            (unspent > 0).then(|| LeaseReturn {
                rule: rule.to_owned(),
                identity: identity.to_owned(),
                lease: a.lease,
                unspent,
            })
        }
        _ => None,
    };
    (want > 0).then(|| Due {
        stream: 0,
        key: BucketKey::new(),
        ask: LeaseAsk {
            rule: rule.to_owned(),
            identity: identity.to_owned(),
            want: want.min(MAX_WANT),
        },
        wanted,
        ttl_s,
        extends,
        back,
    })
}

/// How long an assignment of `rule` lasts: its `lease_ttl` in whole seconds (Envoy reads no
/// finer), at least one.
pub(super) fn assignment_ttl(rule: &Rule) -> Micros {
    let ttl = rule.lease_ttl.unwrap_or(Micros::SECOND);
    (ttl / Micros::SECOND).max(1) * Micros::SECOND
}

/// The demand a bucket's first assignment is sized for, before Envoy's first report (every
/// few seconds) shows its own: the rule's rate when no other bucket is known to share the
/// quota, so a client alone is served at its rule's rate from its first second; an eighth
/// of it on a quota already contended (a grant fell short lately), so eight clients
/// starting together still share. Either way a bucket has only what its lease took from the
/// shared state: a second bucket of a quota the first holds whole gets what is left, its
/// grant falls short, and from then on the quota is shared by demand.
pub(super) fn first_demand(rule: &Rule, contended: bool) -> u64 {
    let per_s = room(rule).per_s;
    if contended {
        per_s / 8
    } else {
        per_s
    }
}

/// What `rule`'s quota can give a bucket.
fn room(rule: &Rule) -> assign::Room {
    let per_s = u128::from(rule.limit.limit()) * 1_000 / u128::from(rule.window_ms.max(1));
    assign::Room {
        per_s: u64::try_from(per_s).unwrap_or(u64::MAX),
        capacity: rule.limit.capacity(),
    }
}

/// What bucket `b` holds once grant `g` answered `d` at `now_ms`, and what Envoy is told
/// (`None`: nothing yet).
pub(super) fn settle(b: &mut Bucket, d: &Due, g: &LeaseGranted, now_ms: u64) -> Option<(Strategy, u64)> {
    // The store's clock may end the lease a little sooner than planned.
    let ttl_s = d.ttl_s.min(g.expires_in_ms / SECOND_MS);
    if ttl_s == 0 {
        // Too late in the window for a whole second: ask again once it turns.
        if let Some(a) = &mut b.assigned {
            a.renew_at_ms = now_ms + RENEW_MARGIN_MS;
        }
        return None;
    }
    let strategy = match d.extends {
        Some(a) if g.units >= d.ask.want => a.strategy,
        Some(a) if g.units > 0 && a.paid_until_ms > now_ms + RENEW_MARGIN_MS / 2 => {
            // Part of an extension: Envoy's bucket runs on while the next ticks pay for the
            // rest (a new, smaller bucket would throw away the tokens this one holds).
            b.assigned = Some(Assigned {
                lease: g.lease,
                paid_until_ms: a.paid_until_ms + assign::paid_ms(a.strategy, g.units),
                ..a
            });
            return None;
        }
        _ => assign::fit(g.units, d.wanted, ttl_s),
    };
    let ttl_s = if strategy == Strategy::DenyAll {
        ttl_s.min(DENIED_TTL_S)
    } else {
        ttl_s
    };
    b.assigned = Some(Assigned {
        strategy,
        lease: g.lease,
        paid_until_ms: now_ms + ttl_s * SECOND_MS,
        renew_at_ms: (now_ms + ttl_s * SECOND_MS).saturating_sub(RENEW_MARGIN_MS),
    });
    Some((strategy, ttl_s))
}
