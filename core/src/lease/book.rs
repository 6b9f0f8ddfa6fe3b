//! A proxy's book of leases: what it holds of each `(rule, identity)` quota, spending it
//! all-or-nothing across the rules a request matches, asking for more before it runs out,
//! and giving back what it will not spend before each lease ends.
//!
//! Pure state, time passed in (the proxy's clock, milliseconds). The filter drives it: for
//! a request, [`LeaseBook::spend`]; on its timer, [`LeaseBook::due`] gives the grants to ask
//! for and the units to give back in one `POST /v1/lease`, whose answer goes to
//! [`LeaseBook::granted`]. What happened to the leases meanwhile, for metrics, is in
//! [`LeaseBook::take_tally`].

use std::collections::HashMap;

use super::lease_size;
use super::wire::{LeaseAsk, LeaseGranted, LeaseReturn, MAX_LEASE_ITEMS};
use crate::evict::{evict_lowest, EVICT_SHARE};
use crate::time::Micros;

/// A quota the book holds leases of: a rule's name and the identity value it limits.
pub type QuotaKey = (String, String);

/// Tuning of a [`LeaseBook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookConfig {
    /// Quotas held at most; past that the least recently used eighth is given back and
    /// forgotten.
    pub max_quotas: usize,
    /// A lease is renewed when it would run out within this long at its spending rate, or
    /// ends within it (ms); within half its length at most, so a short lease is not renewed
    /// as soon as it is granted.
    pub renew_ahead_ms: u64,
    /// Unspent units go back this long before a lease ends (ms): the service takes nothing
    /// back after the end, and the call takes time.
    pub return_margin_ms: u64,
    /// Leases are sized for this long at the spending rate (ms), or for the length of the
    /// quota's last lease when that is longer (a lease lasts what the rule's `lease_ttl`
    /// gives: sizing it for its whole life spares calls).
    pub horizon_ms: u64,
    /// A quota used within this long keeps a lease (of at least one unit) even when it was
    /// idle the last whole second, so a client that comes back now and then finds a unit in
    /// hand (ms; 0, the default: a quota idle a whole second lets its lease go). For a holder
    /// with no exact path to fall back on (a region's node); it costs a renewal a lease.
    pub keep_warm_ms: u64,
    /// Most asks, and most returns, one call carries: the rest wait for the next call.
    /// [`MAX_LEASE_ITEMS`], the default, is what `POST /v1/lease` takes.
    pub max_items_per_call: usize,
    /// Units a lease asks for at least (1, the default): more spares a holder whose quota's
    /// first request waited for its lease a second wait for the next (a region's node).
    pub min_lease_units: u64,
    /// A quota whose grant brought less than was asked, which leaves it empty (or whose exact
    /// check refused, see [`LeaseBook::refused`]), is spent for a while: once its units in
    /// hand are gone [`LeaseBook::spend`] answers [`Spend::Exhausted`] without a call, and no
    /// grant is asked for meanwhile (true, the default). A holder whose calls carry many quotas at a fixed pace (a region's node)
    /// may turn it off: asking for a spent quota costs it no call.
    pub remember_spent: bool,
}

impl Default for BookConfig {
    fn default() -> Self {
        BookConfig {
            max_quotas: 10_000,
            renew_ahead_ms: 250,
            return_margin_ms: 100,
            horizon_ms: 1_000,
            min_lease_units: 1,
            remember_spent: true,
            keep_warm_ms: 0,
            max_items_per_call: MAX_LEASE_ITEMS,
        }
    }
}

/// One quota's lease and spending.
#[derive(Debug, Clone, Default)]
struct Held {
    /// The lease's id, units left, and when it ends (proxy clock); no lease when `id` is
    /// `None`.
    id: Option<u64>,
    units: u64,
    ends_ms: u64,
    /// The lease a renewal replaced, while it still has units and runs: spent first, so a
    /// renewal costs no call of its own to give its units back.
    drain: Option<Drain>,
    /// What the quota held for this proxy: what it had left at the grant plus the lease's
    /// units, less what this proxy spent since (the headers' `remaining`).
    remaining: u64,
    /// The rule's limit and window, and when the quota is whole again (proxy clock).
    limit: u64,
    window_ms: u64,
    reset_at_ms: u64,
    /// How long its last lease lasted (ms).
    last_ttl_ms: u64,
    /// Units the lease came with (0: none left to grant, or no lease).
    granted_units: u64,
    /// The quota is spent until then (proxy clock; 0: not spent): its last grant brought
    /// less than was asked, or an exact check refused it.
    spent_until_ms: u64,
    /// A grant was asked for and not answered yet.
    asked: bool,
    /// That grant was asked while a lease with units was live: it renews it.
    renewing: bool,
    /// Units spent in the current second, and the rate of the last whole one.
    spent_this_s: u64,
    second: u64,
    rate_per_s: u64,
    /// When it was last used, for eviction.
    used_ms: u64,
    /// Units handed on since the lease was granted, and when it was (see
    /// [`LeaseBook::hand_on`]): holders that lease come in lumps, so their demand is
    /// measured over the lease, not over the last second.
    handed: u64,
    granted_at_ms: u64,
}

/// A replaced lease's units, spent before the new lease's.
#[derive(Debug, Clone, Copy)]
struct Drain {
    id: u64,
    units: u64,
    ends_ms: u64,
}

impl Drain {
    /// Whether it can give `units` at `now_ms`.
    fn has(&self, units: u64, now_ms: u64) -> bool {
        now_ms < self.ends_ms && self.units >= units
    }
}

impl Held {
    fn live(&self, now_ms: u64) -> bool {
        self.id.is_some() && now_ms < self.ends_ms
    }

    /// Whether a live lease, the replaced one first, has `units` at `now_ms`.
    fn has(&self, units: u64, now_ms: u64) -> bool {
        self.drain.is_some_and(|d| d.has(units, now_ms)) || (self.live(now_ms) && self.units >= units)
    }

    /// Takes `units` at `now_ms` from the replaced lease if it has them, else from the
    /// lease; the lease they came from.
    fn take(&mut self, units: u64, now_ms: u64) -> u64 {
        self.remaining = self.remaining.saturating_sub(units);
        match &mut self.drain {
            Some(d) if d.has(units, now_ms) => {
                d.units -= units;
                d.id
            }
            _ => {
                self.units -= units;
                self.id.unwrap_or_default()
            }
        }
    }

    fn spent(&self, now_ms: u64) -> bool {
        now_ms < self.spent_until_ms
    }

    /// What the quota holds after a spend at `now_ms`, as this holder sees it.
    fn left(&self, now_ms: u64) -> Left {
        Left {
            remaining: self.remaining,
            limit: self.limit,
            reset_after_ms: self.reset_at_ms.saturating_sub(now_ms),
            window_ms: self.window_ms,
            lease: self.id.unwrap_or_default(),
        }
    }

    /// The spending rate at `now_ms` (units a second): the last whole second's count, or
    /// this one's when it is already higher; 0 once a whole second passed without a spend,
    /// so a quota nobody uses stops asking for leases.
    fn rate_at(&self, now_ms: u64) -> u64 {
        let second = now_ms / 1_000;
        if second == self.second {
            self.rate_per_s.max(self.spent_this_s)
        } else if second == self.second + 1 {
            self.spent_this_s
        } else {
            0
        }
    }

    /// The rate at `now_ms` (units a second) of the units handed on since the lease was
    /// granted, over at least a second.
    fn handed_rate_at(&self, now_ms: u64) -> u64 {
        let over_ms = now_ms.saturating_sub(self.granted_at_ms).max(1_000);
        self.handed.saturating_mul(1_000) / over_ms
    }

    fn count(&mut self, now_ms: u64, units: u64) {
        let second = now_ms / 1_000;
        if second != self.second {
            self.rate_per_s = if second == self.second + 1 {
                self.spent_this_s
            } else {
                0
            };
            (self.second, self.spent_this_s) = (second, 0);
        }
        self.spent_this_s += units;
    }
}

/// What a quota holds after a spend, as this proxy sees it (for the response headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// What the quota had left when the lease was granted, with the lease's units, less
    /// what this proxy spent since: other proxies' spending shows at the next grant.
    pub remaining: u64,
    /// The rule's limit per window.
    pub limit: u64,
    /// Milliseconds from the spend until the quota is whole again (as the grant said it).
    pub reset_after_ms: u64,
    /// The rule's window in milliseconds.
    pub window_ms: u64,
    /// The lease the units came from.
    pub lease: u64,
}

/// Units [`LeaseBook::hand_on`] gave another holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handed {
    /// Units handed on: 1 to what was wanted.
    pub units: u64,
    /// When the other holder's lease of them ends (the book's clock).
    pub ends_ms: u64,
    /// What the quota holds after it, and the lease the units came from.
    pub left: Left,
}

/// What [`LeaseBook::spend`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spend {
    /// One unit of every quota was spent; what each holds now, in the quotas' order.
    Spent(Vec<Left>),
    /// Some quota has no live lease with a unit left: nothing was spent; decide exactly.
    Missing,
    /// The quota at this index of the request's is spent (its last grant brought less than
    /// was asked and its units are gone, or an exact check refused it) for `retry_after_ms`
    /// more: nothing was spent; refuse without a call. `left` is what it holds (nothing).
    Exhausted {
        /// Index of the spent quota in the request's quotas.
        quota: usize,
        /// What it holds, for the refusal's headers.
        left: Left,
        /// Milliseconds until it may grant again.
        retry_after_ms: u64,
    },
}

/// What befell the book's leases since [`LeaseBook::take_tally`] was last called, for
/// metrics. A lease granted with units ends one of three ways: spent out, given back (in
/// [`LeaseBook::due`]'s returns; whether they reached the service is the caller's to
/// know), or expired — its end came with units neither spent nor given back, which come
/// back to the quota only as it refills or its window turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Leases granted with units while the quota held a live lease that had come with
    /// units (the grant was asked for before that lease ended or was given back).
    pub renewed: u64,
    /// Leases found ended with units left.
    pub expired: u64,
    /// The units those leases had left.
    pub units_expired: u64,
    /// Units spent: one per quota of each request decided by leases.
    pub units_spent: u64,
}

/// A proxy's leases.
#[derive(Debug, Clone, Default)]
pub struct LeaseBook {
    config: BookConfig,
    held: HashMap<QuotaKey, Held>,
    /// Units to give back with the next call.
    returns: Vec<LeaseReturn>,
    tally: Tally,
}

impl LeaseBook {
    /// An empty book.
    pub fn new(config: BookConfig) -> LeaseBook {
        LeaseBook {
            config,
            ..LeaseBook::default()
        }
    }

    /// What befell the leases since the last call (see [`Tally`]), and starts counting
    /// afresh.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    /// Quotas held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no quota is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Spends one unit of each of `quotas` at `now_ms`, all or none: only when every one
    /// has a live lease with a unit left. A quota not held yet is noted, so that the next
    /// [`LeaseBook::due`] asks for it.
    pub fn spend(&mut self, quotas: &[QuotaKey], now_ms: u64) -> Spend {
        self.spend_units(quotas, 1, now_ms)
    }

    /// Spends `units` of each of `quotas`, all or none, as [`LeaseBook::spend`] does one.
    pub fn spend_units(&mut self, quotas: &[QuotaKey], units: u64, now_ms: u64) -> Spend {
        let mut ready = true;
        let mut exhausted = None;
        for (i, q) in quotas.iter().enumerate() {
            // The key is cloned only for a quota seen the first time (the hot path is a hit).
            if !self.held.contains_key(q) {
                self.make_room(now_ms);
                self.held.insert(q.clone(), Held::default());
            }
            let Some(h) = self.held.get_mut(q) else { continue };
            h.used_ms = now_ms;
            let has = h.has(units, now_ms);
            ready &= has;
            if exhausted.is_none() && !has && h.spent(now_ms) {
                let (left, retry_after_ms) = (h.left(now_ms), h.spent_until_ms - now_ms);
                exhausted = Some(Spend::Exhausted {
                    quota: i,
                    left: Left { remaining: 0, ..left },
                    retry_after_ms,
                });
            }
        }
        if !ready {
            if let Some(spend) = exhausted {
                return spend;
            }
            for q in quotas {
                if let Some(h) = self.held.get_mut(q) {
                    h.count(now_ms, units); // the demand counts, so the lease asked for fits it
                }
            }
            return Spend::Missing;
        }
        let mut left = Vec::with_capacity(quotas.len());
        for q in quotas {
            if let Some(h) = self.held.get_mut(q) {
                let lease = h.take(units, now_ms);
                h.count(now_ms, units);
                self.tally.units_spent += units;
                left.push(Left {
                    lease,
                    ..h.left(now_ms)
                });
            }
        }
        Spend::Spent(left)
    }

    /// Whether asking the store could let `quota` spend `units` at `now_ms`: it has no live
    /// lease (cold: never leased, or its lease ended), or its lease is short of `units`
    /// though its grant brought some (the store had units to give then). `false` when the
    /// last grant brought none: the quota is spent until that lease ends.
    pub fn may_get(&self, quota: &QuotaKey, units: u64, now_ms: u64) -> bool {
        self.held
            .get(quota)
            .is_none_or(|h| !h.spent(now_ms) && (!h.live(now_ms) || (h.units < units && h.granted_units > 0)))
    }

    /// An exact check refused `quota` at `now_ms`, saying when to retry and when it is
    /// whole again: with [`BookConfig::remember_spent`], the quota is spent as after a grant
    /// that brought nothing (until the retry, and no sooner than it is whole or a lease's
    /// length has passed; see [`Spend::Exhausted`]), so the requests after it are refused
    /// without a call. A quota the book does not hold is not noted.
    pub fn refused(&mut self, quota: &QuotaKey, retry_after_ms: u64, reset_after_ms: u64, now_ms: u64) {
        if !self.config.remember_spent {
            return;
        }
        if let Some(h) = self.held.get_mut(quota) {
            let until = now_ms.saturating_add(spent_for(retry_after_ms, reset_after_ms, h.last_ttl_ms));
            h.spent_until_ms = h.spent_until_ms.max(until);
        }
    }

    /// Whether `quota` has a live lease with `units` left at `now_ms`.
    pub fn holds(&self, quota: &QuotaKey, units: u64, now_ms: u64) -> bool {
        self.held.get(quota).is_some_and(|h| h.has(units, now_ms))
    }

    /// Puts back `units` of each of `quotas` that a [`LeaseBook::spend_units`] took (`spent`
    /// is what it answered, in the same order) when the request was refused after all.
    pub fn unspend(&mut self, quotas: &[QuotaKey], spent: &[Left], units: u64, now_ms: u64) {
        for (q, left) in quotas.iter().zip(spent) {
            self.put_back(q, left.lease, units, now_ms);
        }
    }

    /// Hands on up to `want` units of `quota` to another holder (a proxy leasing through a
    /// region's node), from a live lease that lasts more than `keep_ms` longer: the units
    /// leave the book as spent ones do, and must be spent or [`LeaseBook::put_back`] within
    /// [`Handed::ends_ms`], `keep_ms` before the lease ends. `want` counts as this second's
    /// demand (unless a grant is asked for already: then only what was handed on), so the
    /// book's next ask covers it; a quota not held yet is noted, as [`LeaseBook::spend`]
    /// notes one. `None` when nothing can be handed on now.
    pub fn hand_on(&mut self, quota: &QuotaKey, want: u64, keep_ms: u64, now_ms: u64) -> Option<Handed> {
        if !self.held.contains_key(quota) {
            self.make_room(now_ms);
        }
        let h = self.held.entry(quota.clone()).or_default();
        h.used_ms = now_ms;
        let ends_ms = h.ends_ms.checked_sub(keep_ms).filter(|end| *end > now_ms);
        let lease = h.id.filter(|_| ends_ms.is_some());
        let units = if lease.is_some() { want.min(h.units) } else { 0 };
        // What was handed on counts, and what was not while no ask is out (the holder asks
        // again each tick until it gets units: counting each ask would inflate the demand).
        let demand = if h.asked { units } else { want };
        h.count(now_ms, demand);
        h.handed = h.handed.saturating_add(demand);
        let (Some(lease), Some(ends_ms)) = (lease, ends_ms) else {
            return None;
        };
        if units == 0 {
            return None;
        }
        h.units -= units;
        h.remaining = h.remaining.saturating_sub(units);
        self.tally.units_spent += units;
        Some(Handed {
            units,
            ends_ms,
            left: Left {
                remaining: h.remaining,
                limit: h.limit,
                reset_after_ms: h.reset_at_ms.saturating_sub(now_ms),
                window_ms: h.window_ms,
                lease,
            },
        })
    }

    /// Puts `units` of `quota` back into the lease `lease` they were spent or handed on
    /// from, if it still runs; never into another one (that lease's units were granted
    /// apart, so the quota would hold more than it was given). When `lease` was replaced
    /// meanwhile (renewed, or the quota forgotten), the units go back to the store with the
    /// next call instead, as that lease's return: the store takes them while it runs, and
    /// never more than it holds. Whether they went back into the book.
    pub fn put_back(&mut self, quota: &QuotaKey, lease: u64, units: u64, now_ms: u64) -> bool {
        self.tally.units_spent -= units.min(self.tally.units_spent);
        match self.held.get_mut(quota) {
            Some(h) if h.id == Some(lease) && h.live(now_ms) => {
                h.units += units;
                h.remaining = h.remaining.saturating_add(units);
                true
            }
            Some(Held {
                drain: Some(d),
                remaining,
                ..
            }) if d.id == lease && now_ms < d.ends_ms => {
                d.units += units;
                *remaining = remaining.saturating_add(units);
                true
            }
            // Ended: the store takes nothing back any more.
            Some(h) if h.id == Some(lease) => false,
            _ => {
                self.returns.push(LeaseReturn {
                    rule: quota.0.clone(),
                    identity: quota.1.clone(),
                    lease,
                    unspent: units,
                });
                false
            }
        }
    }

    /// What to send now: the grants to ask for (quotas about to run out or end, sized for
    /// their spending rate) and the units to give back (leases about to end). Marks the
    /// grants as asked until [`LeaseBook::granted`] or [`LeaseBook::failed`].
    pub fn due(&mut self, now_ms: u64) -> (Vec<LeaseAsk>, Vec<LeaseReturn>) {
        let c = self.config;
        let mut asks = Vec::new();
        for ((rule, identity), h) in &mut self.held {
            if h.drain
                .is_some_and(|d| now_ms + c.return_margin_ms >= d.ends_ms || d.units == 0)
            {
                let quota = (rule.clone(), identity.clone());
                end_drain(&mut self.returns, &mut self.tally, &quota, h.drain.take(), now_ms);
            }
            let held = h.live(now_ms) && h.granted_units > 0;
            let ending = h.live(now_ms) && now_ms + c.return_margin_ms >= h.ends_ms;
            if ending || (h.id.is_some() && !h.live(now_ms)) {
                end_lease(
                    &mut self.returns,
                    &mut self.tally,
                    &(rule.clone(), identity.clone()),
                    h,
                    now_ms,
                );
                (h.id, h.units) = (None, 0);
            }
            // Only a quota in use (or kept warm) asks: an idle one lets its lease end and give
            // its units back.
            let rate = h.rate_at(now_ms).max(h.handed_rate_at(now_ms));
            let warm = c.keep_warm_ms > 0 && now_ms.saturating_sub(h.used_ms) <= c.keep_warm_ms;
            let ahead_ms = c.renew_ahead_ms.min(h.last_ttl_ms / 2);
            let runs_out = h.units.saturating_mul(1_000) <= rate.saturating_mul(ahead_ms);
            let ends_soon = h.id.is_some() && now_ms + ahead_ms >= h.ends_ms;
            // A spent quota asks again only shortly before the service said it may grant.
            let spent = now_ms.saturating_add(ahead_ms) < h.spent_until_ms;
            let needed = (rate > 0 || warm) && !spent && (h.id.is_none() || runs_out || ends_soon);
            // One call carries at most `max_items_per_call` asks; the rest wait for the next.
            if needed && !h.asked && asks.len() < c.max_items_per_call.max(1) {
                h.asked = true;
                h.renewing = held;
                let horizon_ms = c.horizon_ms.max(h.last_ttl_ms);
                let want = lease_size(rate, Micros::from_ms(horizon_ms), u64::MAX).max(c.min_lease_units);
                asks.push(LeaseAsk {
                    rule: rule.clone(),
                    identity: identity.clone(),
                    want: want.min(super::wire::MAX_WANT),
                });
            }
        }
        let later = self
            .returns
            .split_off(self.returns.len().min(c.max_items_per_call.max(1)));
        (asks, std::mem::replace(&mut self.returns, later))
    }

    /// The answer to the grants asked for, `asked_at_ms` being when the call went out: the
    /// new lease replaces the quota's old one, whose unspent units go back with the next
    /// call. It ends `expires_in_ms` after the call went out: no later than the service's
    /// end.
    pub fn granted(&mut self, asks: &[LeaseAsk], grants: &[LeaseGranted], asked_at_ms: u64, now_ms: u64) {
        for (ask, g) in asks.iter().zip(grants) {
            let quota = (ask.rule.clone(), ask.identity.clone());
            let Some(h) = self.held.get_mut(&quota) else {
                // Forgotten meanwhile: give the units straight back.
                self.returns.push(LeaseReturn {
                    rule: ask.rule.clone(),
                    identity: ask.identity.clone(),
                    lease: g.lease,
                    unspent: g.units,
                });
                continue;
            };
            h.asked = false;
            h.spent_until_ms = spent_until(&self.config, ask, g, asked_at_ms);
            if g.units == 0 && h.live(now_ms) && h.units > 0 {
                // A renewal that brought nothing: the lease in hand is kept, and spent first.
                h.renewing = false;
                continue;
            }
            end_drain(&mut self.returns, &mut self.tally, &quota, h.drain.take(), now_ms);
            match h.id {
                // A renewal: the replaced lease's units are spent first, until it ends.
                Some(id) if g.units > 0 && h.live(now_ms) && h.units > 0 => {
                    h.drain = Some(Drain {
                        id,
                        units: h.units,
                        ends_ms: h.ends_ms,
                    });
                }
                _ => end_lease(&mut self.returns, &mut self.tally, &quota, h, now_ms),
            }
            if g.units > 0 && std::mem::take(&mut h.renewing) {
                self.tally.renewed += 1;
            }
            h.id = Some(g.lease);
            (h.units, h.granted_units) = (g.units, g.units);
            h.remaining = g.remaining.saturating_add(g.units);
            (h.limit, h.window_ms) = (g.limit, g.window_ms);
            h.reset_at_ms = now_ms.saturating_add(g.reset_after_ms);
            h.ends_ms = asked_at_ms.saturating_add(g.expires_in_ms);
            h.last_ttl_ms = g.expires_in_ms;
            (h.handed, h.granted_at_ms) = (0, now_ms);
        }
    }

    /// The grants asked for got no answer: they may be asked again.
    pub fn failed(&mut self, asks: &[LeaseAsk]) {
        for ask in asks {
            if let Some(h) = self.held.get_mut(&(ask.rule.clone(), ask.identity.clone())) {
                h.asked = false;
            }
        }
    }

    /// Forgets every quota (the rules changed); what their leases did not spend goes back
    /// with the next call.
    pub fn forget_all(&mut self, now_ms: u64) {
        for (quota, h) in self.held.drain() {
            end_drain(&mut self.returns, &mut self.tally, &quota, h.drain, now_ms);
            end_lease(&mut self.returns, &mut self.tally, &quota, &h, now_ms);
        }
    }

    /// At the bound, forgets the least recently used eighth of the quotas in one pass,
    /// giving their units back (a flood of new quotas then costs one pass per eighth of the
    /// bound, not a scan of every quota each).
    fn make_room(&mut self, now_ms: u64) {
        if self.held.len() < self.config.max_quotas.max(1) {
            return;
        }
        let count = (self.config.max_quotas / EVICT_SHARE).max(1);
        let (returns, tally) = (&mut self.returns, &mut self.tally);
        evict_lowest(
            &mut self.held,
            count,
            None,
            |h| h.used_ms,
            |quota, h| {
                end_drain(returns, tally, quota, h.drain, now_ms);
                end_lease(returns, tally, quota, h, now_ms);
            },
        );
    }
}

/// Until when a quota granted `g` for `ask` (asked at `asked_at_ms`) is spent: 0 when the
/// grant brought all that was asked. A grant takes all the quota holds up to the ask, so a
/// short one leaves it empty: then no grant is asked for, and once the units in hand are
/// spent requests are refused without a call, for [`spent_for`]. Counted from when the
/// call went out, the earliest moment the service's answer could count from.
fn spent_until(config: &BookConfig, ask: &LeaseAsk, g: &LeaseGranted, asked_at_ms: u64) -> u64 {
    if !config.remember_spent || g.units >= ask.want {
        return 0;
    }
    asked_at_ms.saturating_add(spent_for(g.retry_after_ms, g.reset_after_ms, g.expires_in_ms))
}

/// How long an empty quota stays spent: until the service may grant one unit again
/// (`retry_after_ms`), and no sooner than it is whole again (`reset_after_ms`) or a lease's
/// length (`lease_ms`) has passed, whichever comes first. Asking for every unit as it comes
/// back would cost a call a unit (a token bucket refills one at a time); what comes back
/// meanwhile waits for the next grant, which takes up to all the quota holds, so the rate
/// the quota admits is kept.
fn spent_for(retry_after_ms: u64, reset_after_ms: u64, lease_ms: u64) -> u64 {
    retry_after_ms.max(reset_after_ms.min(lease_ms))
}

/// Ends `h`'s lease: what it did not spend goes back with the next call if it is still
/// live, and is tallied as expired if it is not.
fn end_lease(returns: &mut Vec<LeaseReturn>, tally: &mut Tally, quota: &QuotaKey, h: &Held, now_ms: u64) {
    if let Some(id) = h.id {
        end_units(returns, tally, quota, (id, h.units), h.live(now_ms));
    }
}

/// Ends `drain`, a lease a renewal replaced, as [`end_lease`] ends a lease.
fn end_drain(returns: &mut Vec<LeaseReturn>, tally: &mut Tally, quota: &QuotaKey, drain: Option<Drain>, now_ms: u64) {
    if let Some(d) = drain {
        end_units(returns, tally, quota, (d.id, d.units), now_ms < d.ends_ms);
    }
}

/// Lease `id`'s `units` left at its end: given back with the next call when it still runs
/// (`live`), tallied as expired when not.
fn end_units(
    returns: &mut Vec<LeaseReturn>,
    tally: &mut Tally,
    (rule, identity): &QuotaKey,
    (id, units): (u64, u64),
    live: bool,
) {
    if units == 0 {
        return;
    }
    if live {
        returns.push(LeaseReturn {
            rule: rule.clone(),
            identity: identity.clone(),
            lease: id,
            unspent: units,
        });
    } else {
        tally.expired += 1;
        tally.units_expired += units;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::wire::MAX_WANT;

    fn q(rule: &str, id: &str) -> QuotaKey {
        (rule.into(), id.into())
    }

    fn grant(lease: u64, units: u64, expires_in_ms: u64) -> LeaseGranted {
        LeaseGranted {
            lease,
            units,
            expires_in_ms,
            limit: 100,
            remaining: 50,
            reset_after_ms: 1_000,
            window_ms: 1_000,
            retry_after_ms: 0,
        }
    }

    #[test]
    fn a_request_spends_only_when_every_quota_has_a_unit() {
        let mut book = LeaseBook::new(BookConfig::default());
        let (a, b) = (q("per-ip", "1.2.3.4"), q("per-user", "u"));
        assert_eq!(book.spend(&[a.clone(), b.clone()], 0), Spend::Missing);
        let (asks, _) = book.due(0);
        assert_eq!(asks.len(), 2, "both asked for");
        // a gets 2 units, b 1 (the asks come in any order).
        let grants: Vec<LeaseGranted> = asks
            .iter()
            .map(|ask| grant(1, if ask.rule == "per-ip" { 2 } else { 1 }, 5_000))
            .collect();
        book.granted(&asks, &grants, 0, 10);
        let left = |s: Spend| match s {
            Spend::Spent(l) => l.iter().map(|l| l.remaining).collect::<Vec<_>>(),
            Spend::Missing | Spend::Exhausted { .. } => vec![],
        };
        // 50 left at the grant and the lease's units: 52 and 51, less the one spent.
        assert_eq!(left(book.spend(&[a.clone(), b.clone()], 20)), [51, 50]);
        // b is spent out: nothing is taken from a either.
        assert_eq!(book.spend(&[a.clone(), b.clone()], 30), Spend::Missing);
        assert_eq!(left(book.spend(std::slice::from_ref(&a), 40)), [50], "a kept its unit");
        assert_eq!(book.spend(&[a], 50), Spend::Missing);
    }

    #[test]
    fn units_handed_on_come_from_a_live_lease_and_go_back_only_into_it() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        // Not held: nothing handed on, but the demand makes the next call ask for 30.
        assert_eq!(book.hand_on(&a, 30, 250, 0), None);
        let (asks, _) = book.due(0);
        assert_eq!(asks.len(), 1, "the quota is asked for");
        assert!(asks[0].want >= 30, "sized for what was wanted: {}", asks[0].want);
        book.granted(&asks, &[grant(7, 40, 2_000)], 0, 10);
        // Up to what the lease holds, ending `keep_ms` before it.
        let h = book.hand_on(&a, 30, 250, 100).expect("handed on");
        assert_eq!((h.units, h.ends_ms, h.left.lease), (30, 1_750, 7));
        let h = book.hand_on(&a, 30, 250, 110).expect("the rest");
        assert_eq!(h.units, 10);
        assert_eq!(book.hand_on(&a, 30, 250, 120), None, "spent out");
        assert!(book.put_back(&a, 7, 5, 130), "back into its lease");
        assert!(book.holds(&a, 5, 140));
        assert!(!book.put_back(&a, 8, 5, 150), "never into another lease");
        let (_, returns) = book.due(150);
        assert_eq!(
            returns.iter().map(|r| (r.lease, r.unspent)).collect::<Vec<_>>(),
            [(8, 5)],
            "but back to the store, as the lease it came from"
        );
        // Too close to the lease's end to hand anything on.
        assert_eq!(book.hand_on(&a, 1, 250, 1_760), None);
        // Past the end nothing goes back.
        assert!(!book.put_back(&a, 7, 5, 2_001));
    }

    #[test]
    fn unspent_units_go_back_before_the_lease_ends_and_never_after() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        book.spend(std::slice::from_ref(&a), 0);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(7, 10, 1_000)], 0, 5);
        book.spend(std::slice::from_ref(&a), 10);
        let (_, returns) = book.due(500);
        assert!(returns.is_empty(), "not yet");
        let (_, returns) = book.due(950);
        assert_eq!(returns.len(), 1);
        assert_eq!((returns[0].lease, returns[0].unspent), (7, 9));
        assert_eq!(book.spend(&[a], 960), Spend::Missing, "given back: not spent any more");
        // A lease found already ended gives nothing back.
        let mut late = LeaseBook::new(BookConfig::default());
        let b = q("r", "y");
        late.spend(std::slice::from_ref(&b), 0);
        let (asks, _) = late.due(0);
        late.granted(&asks, &[grant(8, 10, 1_000)], 0, 5);
        let (_, returns) = late.due(2_000);
        assert!(returns.is_empty(), "past its end the service takes nothing back");
    }

    #[test]
    fn a_lease_is_renewed_before_it_runs_out_at_its_rate() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        book.spend(std::slice::from_ref(&a), 0);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(1, 100, 10_000)], 0, 1);
        // 100 a second: after 80 spent, 20 left last 200 ms < 250 ms ahead: renew.
        let mut renewals = 0;
        for t in 0..80u64 {
            assert!(matches!(
                book.spend(std::slice::from_ref(&a), 1_000 + t * 10),
                Spend::Spent(_)
            ));
            renewals += book.due(1_000 + t * 10).0.len();
        }
        assert_eq!(renewals, 1, "asked once, while units were left");
    }

    #[test]
    fn a_quota_nobody_uses_stops_leasing_and_gives_its_units_back() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        book.spend(std::slice::from_ref(&a), 0);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(1, 100, 2_000)], 0, 1);
        for t in 0..10u64 {
            book.spend(std::slice::from_ref(&a), 100 + t * 10);
        }
        // The traffic stops. Within the next whole second the last second's rate may still
        // renew it once; after that nothing is asked, and every unit comes back.
        let (mut asked, mut asked_late, mut given_back) = (0, 0, 0);
        for t in (200..10_000u64).step_by(50) {
            let (asks, returns) = book.due(t);
            asked += asks.len() as u64;
            asked_late += if t >= 2_000 { asks.len() } else { 0 };
            given_back += returns.iter().map(|r| r.unspent).sum::<u64>();
            if !asks.is_empty() {
                book.granted(&asks, &[grant(2 + t, 100, 2_000)], t, t);
            }
        }
        assert_eq!(asked_late, 0, "no lease asked for a quota idle a whole second");
        assert_eq!(given_back, 90 + 100 * asked, "every unit given back");
        // Demand again: asked for at once.
        assert_eq!(book.spend(std::slice::from_ref(&a), 10_000), Spend::Missing);
        assert_eq!(book.due(10_000).0.len(), 1);
    }

    #[test]
    fn a_lease_of_any_length_is_renewed_without_overflow() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        book.spend(std::slice::from_ref(&a), 0);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(1, 2, u64::MAX)], 0, 1);
        book.spend(std::slice::from_ref(&a), 1_000);
        book.spend(std::slice::from_ref(&a), 1_010);
        let (asks, _) = book.due(1_010);
        assert_eq!(asks.len(), 1, "run out: asked again");
        assert_eq!(asks[0].want, MAX_WANT, "sized for the longest lease");
    }

    #[test]
    fn a_call_carries_no_more_asks_than_the_service_takes() {
        let mut book = LeaseBook::new(BookConfig::default());
        for i in 0..100 {
            book.spend(&[q("r", &format!("client{i}"))], 0);
        }
        let (first, _) = book.due(0);
        assert_eq!(first.len(), MAX_LEASE_ITEMS, "the service refuses more in one call");
        book.failed(&first);
        let (second, _) = book.due(50);
        assert_eq!(second.len(), MAX_LEASE_ITEMS);
        // A holder whose calls are its own store calls (a region's node) may carry more.
        let mut book = LeaseBook::new(BookConfig {
            max_items_per_call: 1_024,
            ..BookConfig::default()
        });
        for i in 0..100 {
            book.spend(&[q("r", &format!("client{i}"))], 0);
        }
        assert_eq!(book.due(0).0.len(), 100);
    }

    #[test]
    fn the_book_is_bounded_and_gives_back_what_it_forgets() {
        let mut book = LeaseBook::new(BookConfig {
            max_quotas: 2,
            ..BookConfig::default()
        });
        let (a, b, c) = (q("r", "a"), q("r", "b"), q("r", "c"));
        book.spend(std::slice::from_ref(&a), 0);
        book.spend(std::slice::from_ref(&b), 1);
        let (asks, _) = book.due(2);
        let grants: Vec<LeaseGranted> = asks
            .iter()
            .enumerate()
            .map(|(i, _)| grant(i as u64, 5, 10_000))
            .collect();
        book.granted(&asks, &grants, 2, 3);
        book.spend(std::slice::from_ref(&b), 4);
        book.spend(&[c], 5);
        assert_eq!(book.len(), 2);
        let (_, returns) = book.due(6);
        assert_eq!(returns.len(), 1, "a's lease went back");
        assert_eq!((returns[0].identity.as_str(), returns[0].unspent), ("a", 5));
    }

    #[test]
    fn the_tally_counts_renewals_spends_and_expiries() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        book.spend(std::slice::from_ref(&a), 0);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(1, 10, 1_000)], 0, 5);
        assert_eq!(book.take_tally(), Tally::default(), "a first lease renews nothing");
        for t in 0..4 {
            assert!(matches!(book.spend(std::slice::from_ref(&a), 10 + t), Spend::Spent(_)));
        }
        // Asked 250 ms before its end while it still runs: a renewal.
        let (asks, returns) = book.due(760);
        assert_eq!((asks.len(), returns.len()), (1, 0));
        book.granted(&asks, &[grant(2, 10, 1_000)], 760, 770);
        let (_, returns) = book.due(780);
        assert!(
            returns.is_empty(),
            "the replaced lease's units are spent, not given back in a call"
        );
        let from: Vec<u64> = (0..7)
            .map(|t| match book.spend(std::slice::from_ref(&a), 780 + t) {
                Spend::Spent(left) => left[0].lease,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            from,
            [1, 1, 1, 1, 1, 1, 2],
            "the replaced lease's 6 first, then the new one"
        );
        assert!(book.due(790).1.is_empty(), "spent out: nothing to give back");
        let tally = book.take_tally();
        assert_eq!(
            tally,
            Tally {
                renewed: 1,
                units_spent: 11,
                ..Tally::default()
            }
        );
        assert_eq!(book.take_tally(), Tally::default(), "taken: counted afresh");
        // The timer stalls past lease 2's end (1,760): its 8 units left expire, once.
        book.spend(std::slice::from_ref(&a), 1_000);
        let (asks, returns) = book.due(2_000);
        assert!(returns.is_empty(), "nothing goes back after the end");
        book.due(2_010);
        let tally = book.take_tally();
        assert_eq!((tally.expired, tally.units_expired, tally.units_spent), (1, 8, 1));
        // Asked after it ended: a new lease, not a renewal.
        book.granted(&asks, &[grant(3, 5, 1_000)], 2_000, 2_010);
        assert_eq!(book.take_tally().renewed, 0);
    }

    #[test]
    fn the_tally_finds_expiries_wherever_a_lease_is_dropped() {
        // Replaced by a grant that came after its end, forgotten with the rules, evicted.
        let mut book = LeaseBook::new(BookConfig {
            max_quotas: 2,
            ..BookConfig::default()
        });
        let (a, b, c) = (q("r", "a"), q("r", "b"), q("r", "c"));
        book.spend(std::slice::from_ref(&a), 0);
        book.spend(std::slice::from_ref(&b), 0);
        let (asks, _) = book.due(0);
        let grants = vec![grant(1, 4, 1_000); asks.len()];
        book.granted(&asks, &grants, 0, 1);
        // a's renewal is asked at 760 and answered after a's end.
        book.spend(std::slice::from_ref(&a), 700);
        let (asks, _) = book.due(760);
        assert_eq!(asks.len(), 2, "both end soon");
        let grants = vec![grant(2, 0, 1_000); asks.len()];
        book.granted(&asks, &grants, 760, 1_200);
        let tally = book.take_tally();
        assert_eq!((tally.expired, tally.units_expired, tally.renewed), (2, 7, 0));
        // Leases with no units neither expire nor go back.
        book.forget_all(5_000);
        book.spend(std::slice::from_ref(&c), 5_000);
        assert_eq!(book.take_tally().expired, 0);
        let (asks, _) = book.due(5_000);
        book.granted(&asks, &[grant(3, 3, 1_000)], 5_000, 5_001);
        book.spend(std::slice::from_ref(&a), 6_500);
        book.spend(std::slice::from_ref(&b), 6_501); // evicts c, ended with 3 units
        let tally = book.take_tally();
        assert_eq!((tally.expired, tally.units_expired), (1, 3));
    }

    #[test]
    fn units_spent_several_at_a_time_go_back_only_to_the_lease_they_came_from() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("per-tenant", "t");
        let quotas = std::slice::from_ref(&a);
        assert_eq!(book.spend_units(quotas, 3, 0), Spend::Missing);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(1, 5, 5_000)], 0, 1);
        assert!(book.holds(&a, 5, 1) && !book.holds(&a, 6, 1));
        let Spend::Spent(spent) = book.spend_units(quotas, 3, 2) else {
            panic!("5 units hold a cost of 3")
        };
        assert_eq!((spent[0].remaining, spent[0].lease), (52, 1));
        assert_eq!(book.spend_units(quotas, 3, 3), Spend::Missing, "2 units left");
        // Refused after all: the 3 units are back in lease 1.
        book.unspend(quotas, &spent, 3, 4);
        assert!(book.holds(&a, 5, 4));
        assert_eq!(book.take_tally().units_spent, 0);
        // Once lease 1 is replaced, its units are not put into lease 2.
        let Spend::Spent(spent) = book.spend_units(quotas, 3, 5) else {
            panic!("5 units again")
        };
        book.spend_units(quotas, 2, 4_800); // at its rate it runs out: a renewal is due
        let (asks, returns) = book.due(4_800);
        assert!(returns.is_empty() && asks.len() == 1);
        book.granted(&asks, &[grant(2, 4, 5_000)], 4_800, 4_801);
        book.unspend(quotas, &spent, 3, 4_802);
        assert!(
            book.holds(&a, 4, 4_802) && !book.holds(&a, 5, 4_802),
            "lease 2 holds its own 4"
        );
    }

    #[test]
    fn a_quota_kept_warm_holds_a_unit_between_visits_and_lets_go_after() {
        let mut book = LeaseBook::new(BookConfig {
            keep_warm_ms: 10_000,
            ..BookConfig::default()
        });
        let a = q("per-key", "k");
        let quotas = std::slice::from_ref(&a);
        assert_eq!(book.spend(quotas, 0), Spend::Missing);
        let (asks, _) = book.due(0);
        book.granted(&asks, &[grant(1, 1, 1_000)], 0, 1);
        assert!(matches!(book.spend(quotas, 2), Spend::Spent(_)));
        // Idle since: it still renews before each lease ends, at least one unit.
        let mut lease = 1;
        for now in (100..9_000).step_by(50) {
            let (asks, _) = book.due(now);
            if let Some(ask) = asks.first() {
                assert!(ask.want >= 1);
                lease += 1;
                book.granted(&asks, &[grant(lease, 1, 1_000)], now, now + 1);
            }
        }
        assert!(lease >= 9, "renewed about every 500 ms: {lease} leases");
        assert!(
            matches!(book.spend(quotas, 9_000), Spend::Spent(_)),
            "a unit in hand after 9 s away"
        );
        // Away longer than it is kept warm: it stops asking, and its lease ends.
        for now in (9_050..22_000).step_by(50) {
            let (asks, _) = book.due(now);
            if now > 19_500 {
                assert!(asks.is_empty(), "asked at {now} after 10 s away");
            } else if !asks.is_empty() {
                lease += 1;
                book.granted(&asks, &[grant(lease, 1, 1_000)], now, now + 1);
            }
        }
        assert_eq!(book.spend(quotas, 22_000), Spend::Missing);
    }

    #[test]
    fn at_the_bound_the_least_recently_used_eighth_goes_at_once_with_its_units() {
        let mut book = LeaseBook::new(BookConfig {
            max_quotas: 16,
            ..BookConfig::default()
        });
        let quota = |i: u64| q("r", &i.to_string());
        for i in 0..16 {
            book.spend(&[quota(i)], i);
        }
        let (asks, _) = book.due(16);
        let grants: Vec<LeaseGranted> = asks.iter().map(|_| grant(1, 5, 5_000)).collect();
        book.granted(&asks, &grants, 16, 17);
        book.spend(&[quota(16)], 18);
        assert_eq!(book.len(), 15, "two of sixteen forgotten for the seventeenth");
        let (_, returns) = book.due(19);
        let mut back: Vec<&str> = returns.iter().map(|r| r.identity.as_str()).collect();
        back.sort_unstable();
        assert_eq!(back, ["0", "1"], "the two used longest ago, their units going back");
        assert!(returns.iter().all(|r| r.unspent == 5));
    }

    #[test]
    fn a_quota_granted_nothing_is_refused_and_not_asked_for_until_the_service_said() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        assert_eq!(book.spend(std::slice::from_ref(&a), 0), Spend::Missing);
        let (asks, _) = book.due(0);
        // Spent: nothing granted, one unit again in 300 ms, whole in 2 s; leases last 1 s.
        let empty = LeaseGranted {
            units: 0,
            remaining: 0,
            retry_after_ms: 300,
            reset_after_ms: 2_000,
            ..grant(1, 0, 1_000)
        };
        book.granted(&asks, std::slice::from_ref(&empty), 0, 10);
        // Refused from the book until a lease's length has passed (1 s, sooner than whole).
        match book.spend(std::slice::from_ref(&a), 20) {
            Spend::Exhausted {
                quota,
                left,
                retry_after_ms,
            } => {
                assert_eq!((quota, left.remaining, retry_after_ms), (0, 0, 980));
            }
            other => panic!("not refused: {other:?}"),
        }
        // No ask every tick while spent: only within the renewal margin of its end.
        for now in (50..750).step_by(50) {
            let _ = book.spend(std::slice::from_ref(&a), now);
            assert!(book.due(now).0.is_empty(), "asked for a spent quota at {now} ms");
        }
        let (asks, _) = book.due(760);
        assert_eq!(asks.len(), 1, "asked again ahead of the end");
        book.granted(&asks, &[grant(2, 5, 1_000)], 760, 770);
        assert!(
            matches!(book.spend(std::slice::from_ref(&a), 780), Spend::Spent(_)),
            "units again"
        );
        // A grant short of the ask emptied the quota: its units are spent, then it is
        // refused, and not asked for meanwhile.
        let mut short = LeaseBook::new(BookConfig::default());
        for _ in 0..10 {
            let _ = short.spend(std::slice::from_ref(&a), 0); // demand: 10 a second
        }
        let (asks, _) = short.due(0);
        let two = LeaseGranted {
            units: 2,
            retry_after_ms: 0,
            ..empty
        };
        assert!(asks[0].want > 2);
        short.granted(&asks, std::slice::from_ref(&two), 0, 10);
        assert!(matches!(short.spend(std::slice::from_ref(&a), 20), Spend::Spent(_)));
        assert!(matches!(short.spend(std::slice::from_ref(&a), 30), Spend::Spent(_)));
        assert!(matches!(
            short.spend(std::slice::from_ref(&a), 40),
            Spend::Exhausted {
                retry_after_ms: 960,
                ..
            }
        ));
        assert!(short.due(100).0.is_empty(), "asked for an emptied quota");
    }

    #[test]
    fn a_quota_an_exact_check_refused_is_refused_until_its_retry_after() {
        let mut book = LeaseBook::new(BookConfig::default());
        let a = q("r", "x");
        assert_eq!(book.spend(std::slice::from_ref(&a), 0), Spend::Missing);
        // Never leased: a lease's length is unknown, so until the retry.
        book.refused(&a, 200, 5_000, 5);
        assert!(matches!(
            book.spend(std::slice::from_ref(&a), 100),
            Spend::Exhausted {
                retry_after_ms: 105,
                ..
            }
        ));
        assert!(!book.may_get(&a, 1, 100));
        assert_eq!(
            book.spend(std::slice::from_ref(&a), 205),
            Spend::Missing,
            "checked again after"
        );
        // Off: nothing remembered.
        let mut off = LeaseBook::new(BookConfig {
            remember_spent: false,
            ..BookConfig::default()
        });
        let _ = off.spend(std::slice::from_ref(&a), 0);
        off.refused(&a, 200, 5_000, 5);
        assert_eq!(off.spend(std::slice::from_ref(&a), 100), Spend::Missing);
    }
}
