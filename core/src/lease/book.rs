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

pub use super::held::{BookConfig, Left, QuotaKey, Tally};
use super::held::{Held, Ledger};
use super::wire::{LeaseAsk, LeaseGranted, LeaseReturn};
use crate::evict::{evict_lowest, EVICT_SHARE};

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

/// A proxy's leases.
#[derive(Debug, Clone, Default)]
pub struct LeaseBook {
    config: BookConfig,
    held: HashMap<QuotaKey, Held>,
    /// Units to give back with the next call, and what befell the leases.
    ledger: Ledger,
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
        std::mem::take(&mut self.ledger.tally)
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
                self.ledger.tally.units_spent += units;
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
        if let Some(h) = self.held.get_mut(quota) {
            h.refused(&self.config, retry_after_ms, reset_after_ms, now_ms);
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
        self.ledger.tally.units_spent += units;
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
        match self.held.get_mut(quota) {
            Some(h) => h.put_back(quota, lease, units, now_ms, &mut self.ledger),
            None => Held::default().put_back(quota, lease, units, now_ms, &mut self.ledger),
        }
    }

    /// What to send now: the grants to ask for (quotas about to run out or end, sized for
    /// their spending rate) and the units to give back (leases about to end). Marks the
    /// grants as asked until [`LeaseBook::granted`] or [`LeaseBook::failed`].
    pub fn due(&mut self, now_ms: u64) -> (Vec<LeaseAsk>, Vec<LeaseReturn>) {
        let max = self.config.max_items_per_call.max(1);
        let mut asks = Vec::new();
        for (quota, h) in &mut self.held {
            // One call carries at most `max_items_per_call` asks; the rest wait for the next.
            let room = asks.len() < max;
            asks.extend(h.due(quota, &self.config, room, now_ms, &mut self.ledger));
        }
        let returns = &mut self.ledger.returns;
        let later = returns.split_off(returns.len().min(max));
        (asks, std::mem::replace(returns, later))
    }

    /// The answer to the grants asked for, `asked_at_ms` being when the call went out: the
    /// new lease replaces the quota's old one, whose unspent units go back with the next
    /// call. It ends `expires_in_ms` after the call went out: no later than the service's
    /// end.
    pub fn granted(&mut self, asks: &[LeaseAsk], grants: &[LeaseGranted], asked_at_ms: u64, now_ms: u64) {
        for (ask, g) in asks.iter().zip(grants) {
            match self.held.get_mut(&(ask.rule.clone(), ask.identity.clone())) {
                Some(h) => h.granted(ask, g, &self.config, (asked_at_ms, now_ms), &mut self.ledger),
                // Forgotten meanwhile: give the units straight back.
                None => self.ledger.returns.push(LeaseReturn {
                    rule: ask.rule.clone(),
                    identity: ask.identity.clone(),
                    lease: g.lease,
                    unspent: g.units,
                }),
            }
        }
    }

    /// The grants asked for got no answer: they may be asked again.
    pub fn failed(&mut self, asks: &[LeaseAsk]) {
        for ask in asks {
            if let Some(h) = self.held.get_mut(&(ask.rule.clone(), ask.identity.clone())) {
                h.failed();
            }
        }
    }

    /// Forgets every quota (the rules changed); what their leases did not spend goes back
    /// with the next call.
    pub fn forget_all(&mut self, now_ms: u64) {
        for (quota, h) in self.held.drain() {
            h.end(&quota, now_ms, &mut self.ledger);
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
        let ledger = &mut self.ledger;
        evict_lowest(
            &mut self.held,
            count,
            None,
            |h| h.used_ms,
            |quota, h| h.end(quota, now_ms, ledger),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::wire::{MAX_LEASE_ITEMS, MAX_WANT};

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
