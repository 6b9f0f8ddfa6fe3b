//! Proxies leasing global rules through their region's node (`POST /v1/lease` on a node in a
//! region, for a rule with `global = true` and `lease = true`): the node hands on units of
//! the leases it holds of the global quota ([`LeaseBook::hand_on`]), never more, and takes
//! what a proxy did not spend back into the lease the units came from. No store call and
//! no WAN trip: a proxy's lease is the node's units, already debited from the global quota.
//!
//! Every handed-on lease is remembered until it ends, so a return takes back at most what
//! that lease was handed, once.
//!
//! [`LeaseBook::hand_on`]: sluice_core::lease::book::LeaseBook::hand_on

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sluice_core::lease::book::QuotaKey;
use sluice_core::lease::wire::{LeaseAsk, LeaseGranted, LeaseRequest, LeaseReturn};
use sluice_core::rules::RuleSet;

use super::Region;
use crate::exchange::{next_id, LeaseError};

/// A proxy's lease ends this long before the node's lease it came from (ms): the proxy gives
/// its unspent units back 100 ms before its own end, and they must reach the node before the
/// node gives its lease back (100 ms before that lease ends, at a tick of 50 ms).
pub const KEEP_MS: u64 = 250;

/// How long a proxy that got nothing waits before it asks again, at most (ms).
const EMPTY_MS: u64 = 100;

/// The leases a node has handed on to proxies and not yet taken back.
pub struct Subleases {
    out: HashMap<u64, Out>,
    max: usize,
}

/// One lease handed on.
struct Out {
    quota: QuotaKey,
    /// The node's lease the units came from.
    from: u64,
    units: u64,
    ends_ms: u64,
}

impl Subleases {
    /// Room for `max` leases at once; past it, until some end, proxies get nothing (and
    /// decide with `/v1/check`).
    pub fn new(max: usize) -> Subleases {
        Subleases {
            out: HashMap::new(),
            max,
        }
    }

    /// Whether another lease fits, forgetting the ended ones when full.
    fn room(&mut self, now_ms: u64) -> bool {
        if self.out.len() >= self.max {
            self.out.retain(|_, o| o.ends_ms > now_ms);
        }
        self.out.len() < self.max
    }

    /// The lease `ret` names, if it was handed on for its quota and runs: the node's lease
    /// its units came from, and what it can give back (at most what it was handed).
    fn take(&mut self, quota: &QuotaKey, ret: &LeaseReturn, now_ms: u64) -> Option<(u64, u64)> {
        let out = self.out.remove(&ret.lease)?;
        if out.quota != *quota {
            self.out.insert(ret.lease, out); // another quota's lease: not this return's
            return None;
        }
        (out.ends_ms > now_ms).then_some((out.from, ret.unspent.min(out.units)))
    }
}

/// A proxy's exchange for global rules with the node of `region`: its returns first (into
/// the node's leases), then its asks (out of them), in `req`'s order. Every rule named must
/// be global and leased (`lease = true`).
pub fn exchange(
    region: &Region,
    rules: &RuleSet,
    now_ms: u64,
    req: &LeaseRequest,
) -> Result<(Vec<LeaseGranted>, Vec<u64>), LeaseError> {
    let returned = req.returns.iter().map(|r| give_back(region, r, now_ms)).collect();
    let grants = req
        .grants
        .iter()
        .map(|ask| hand_on(region, rules, ask, now_ms))
        .collect::<Result<_, _>>()?;
    Ok((grants, returned))
}

/// Takes back into the node's lease what `ret` did not spend: the units taken back.
fn give_back(region: &Region, ret: &LeaseReturn, now_ms: u64) -> u64 {
    let quota = (ret.rule.clone(), ret.identity.clone());
    let Some((from, units)) = region.subleases().take(&quota, ret, now_ms) else {
        return 0;
    };
    if !region.book().put_back(&quota, from, units, now_ms) {
        return 0; // the node's lease was renewed (they go back to the global store) or ended
    }
    region.counters.units_taken_back.fetch_add(units, Ordering::Relaxed);
    units
}

/// Hands on what the node holds of `ask`'s quota, up to what it wants.
fn hand_on(region: &Region, rules: &RuleSet, ask: &LeaseAsk, now_ms: u64) -> Result<LeaseGranted, LeaseError> {
    let not_leased = || LeaseError::NotLeased(ask.rule.clone());
    let rule = rules
        .rule(&ask.rule)
        .filter(|r| r.global.is_some())
        .ok_or_else(not_leased)?;
    let ttl_ms = rule.lease_ttl.ok_or_else(not_leased)?.instant_ms();
    let quota = (rule.name.clone(), ask.identity.clone());
    let mut subleases = region.subleases();
    let handed = if subleases.room(now_ms) {
        region.book().hand_on(&quota, ask.want, KEEP_MS, now_ms)
    } else {
        None
    };
    let Some(h) = handed else {
        // Nothing held (cold: the node asks the global store at its next tick) or spent.
        return Ok(LeaseGranted {
            lease: 0,
            units: 0,
            expires_in_ms: EMPTY_MS,
            limit: rules.limit_for(rule, &ask.identity, now_ms).limit(),
            remaining: 0,
            reset_after_ms: 0,
            window_ms: rule.window_ms,
            // Not known here: the proxy asks again at its next tick.
            retry_after_ms: 0,
        });
    };
    let ends_ms = h.ends_ms.min(now_ms.saturating_add(ttl_ms));
    let lease = next_id();
    subleases.out.insert(
        lease,
        Out {
            quota,
            from: h.left.lease,
            units: h.units,
            ends_ms,
        },
    );
    region.counters.units_handed_on.fetch_add(h.units, Ordering::Relaxed);
    Ok(LeaseGranted {
        lease,
        units: h.units,
        expires_in_ms: ends_ms.saturating_sub(now_ms),
        limit: h.left.limit,
        remaining: h.left.remaining,
        reset_after_ms: h.left.reset_after_ms,
        window_ms: h.left.window_ms,
        retry_after_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ret(rule: &str, lease: u64, unspent: u64) -> LeaseReturn {
        LeaseReturn {
            rule: rule.into(),
            identity: "u".into(),
            lease,
            unspent,
        }
    }

    #[test]
    fn a_return_takes_back_at_most_what_its_lease_was_handed_and_once() {
        let mut subs = Subleases::new(2);
        let quota: QuotaKey = ("r".into(), "u".into());
        let out = |units| Out {
            quota: quota.clone(),
            from: 7,
            units,
            ends_ms: 1_000,
        };
        subs.out.insert(1, out(10));
        subs.out.insert(2, out(10));
        assert!(!subs.room(500), "full while both run");
        let other: QuotaKey = ("s".into(), "u".into());
        assert_eq!(subs.take(&other, &ret("s", 1, 5), 500), None, "another quota's lease");
        assert_eq!(subs.take(&quota, &ret("r", 1, 500), 500), Some((7, 10)), "capped");
        assert_eq!(subs.take(&quota, &ret("r", 1, 5), 500), None, "once");
        assert_eq!(subs.take(&quota, &ret("r", 2, 5), 1_000), None, "ended");
        subs.out.insert(3, out(1));
        subs.out.insert(
            4,
            Out {
                ends_ms: 2_000,
                ..out(1)
            },
        );
        assert!(!subs.room(999), "full while both run");
        assert!(subs.room(1_000), "the ended one makes room");
        assert_eq!(subs.out.len(), 1);
    }
}
