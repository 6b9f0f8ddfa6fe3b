//! When a quota next needs its holder's timer: [`Held::wake_ms`], so that a timer looking
//! after many quotas reads only those with something to do (a filter whose workers share
//! their leases pays a shared-data read for each quota it looks at), and when its slot may
//! go to another quota ([`Held::vacant_from_ms`]).
//!
//! Both follow from the state alone, because nothing in it changes with time but by
//! thresholds: a lease ends, a replaced one ends, a lost ask lapses, a spent quota may ask
//! again, and the spending rate only falls once its second is over.

use super::{BookConfig, Held, ASK_LOST_MS};

impl Held {
    /// The spending rate [`Held::due`] sizes and times a grant by at `now_ms` (units a
    /// second): the last second's, or the rate of what was handed on since the grant.
    pub(super) fn demand_at(&self, now_ms: u64) -> u64 {
        self.rate_at(now_ms).max(self.handed_rate_at(now_ms))
    }

    /// Whether the quota wants a grant at `now_ms`, asked or not: it is in use (or kept
    /// warm: an idle one lets its lease end and give its units back), not spent (a spent
    /// quota asks again only shortly before the service said it may grant), and has no
    /// lease, or one that runs out or ends within the renewal's lead.
    pub(super) fn needs_grant(&self, c: &BookConfig, now_ms: u64) -> bool {
        let rate = self.demand_at(now_ms);
        let warm = c.keep_warm_ms > 0 && now_ms.saturating_sub(self.used_ms) <= c.keep_warm_ms;
        let ahead_ms = self.ahead_ms(c);
        let runs_out = self.units.saturating_mul(1_000) <= rate.saturating_mul(ahead_ms);
        let ends_soon = self.id.is_some() && now_ms.saturating_add(ahead_ms) >= self.ends_ms;
        let spent = now_ms.saturating_add(ahead_ms) < self.spent_until_ms;
        (rate > 0 || warm) && !spent && (self.id.is_none() || runs_out || ends_soon)
    }

    /// How long before its lease runs out or ends a quota asks for the next (ms).
    fn ahead_ms(&self, c: &BookConfig) -> u64 {
        c.renew_ahead_ms.min(self.last_ttl_ms / 2)
    }

    /// The first instant from `now_ms` at which [`Held::due`] would do anything for this
    /// quota — end its lease or the one a renewal replaced, or ask for a grant — if nothing
    /// else touches it meanwhile (a spend, a grant, a refusal: each gives a new state to ask
    /// again); `u64::MAX` for never. `now_ms` itself when it would now.
    pub fn wake_ms(&self, c: &BookConfig, now_ms: u64) -> u64 {
        let mut wake = u64::MAX;
        if let Some(d) = self.drain {
            wake = if d.units == 0 {
                now_ms
            } else {
                d.ends_ms.saturating_sub(c.return_margin_ms)
            };
        }
        if self.id.is_some() {
            wake = wake.min(self.ends_ms.saturating_sub(c.return_margin_ms));
        }
        wake.min(self.asks_from_ms(c, now_ms)).max(now_ms)
    }

    /// The first instant from `now_ms` at which the quota, as it is, would ask for a grant;
    /// `u64::MAX` for never.
    ///
    /// From `from` on (neither spent nor asking any more), the quota asks while it is in use
    /// and either has no lease, or its lease runs out at the rate or ends within the lead.
    /// The rate rises only as its second begins (a state may come from a worker whose clock
    /// read a little later) and only falls after; the use and "runs out" fall with the rate;
    /// "ends within the lead" only begins. So if the quota ever asks, it asks at the first of
    /// these instants at which it wants to.
    fn asks_from_ms(&self, c: &BookConfig, now_ms: u64) -> u64 {
        let mut from = now_ms.max(self.spent_until_ms.saturating_sub(self.ahead_ms(c)));
        if self.asked {
            from = from.max(self.asked_ms.saturating_add(ASK_LOST_MS));
        }
        let risen = from.max(self.second.saturating_mul(1_000));
        let ends_soon = self.ends_ms.saturating_sub(self.ahead_ms(c));
        // In order: `from` is the first, `risen.max(ends_soon)` the last.
        let (a, b) = (from.max(ends_soon), risen);
        let at = [from, a.min(b), a.max(b), risen.max(ends_soon)];
        let mut last = None;
        for t in at {
            if last != Some(t) && self.needs_grant(c, t) {
                return t;
            }
            last = Some(t);
        }
        u64::MAX
    }

    /// When another quota may first take this one's place (in a fixed table of them): once
    /// it has no live lease nor replaced one, no grant asked for, is not spent, and was not
    /// used within the last second. Every one of these only becomes true with time.
    pub fn vacant_from_ms(&self) -> u64 {
        let lease = if self.id.is_some() { self.ends_ms } else { 0 };
        let drain = self.drain.map_or(0, |d| d.ends_ms);
        let ask = if self.asked {
            self.asked_ms.saturating_add(ASK_LOST_MS)
        } else {
            0
        };
        lease
            .max(drain)
            .max(ask)
            .max(self.spent_until_ms)
            .max(self.used_ms.saturating_add(1_000))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::Ledger;
    use super::*;

    /// A quota's state, its times around `0..20_000` ms and its counts small, as the book's
    /// own steps leave them and as another worker's clock may.
    fn held() -> impl Strategy<Value = Held> {
        let time = || 0u64..20_000;
        (
            (
                prop::option::of(1u64..5),
                0u64..50,
                time(),
                prop::option::of((1u64..5, 0u64..50, time())),
            ),
            (0u64..3_000, time(), time(), any::<bool>(), time()),
            (0u64..300, 0u64..25, 0u64..300, time(), 0u64..300, time()),
        )
            .prop_map(
                |(
                    (id, units, ends_ms, drain),
                    (last_ttl_ms, spent_until_ms, asked_ms, asked, used_ms),
                    (spent_this_s, second, rate_per_s, granted_at_ms, handed, reset),
                )| Held {
                    id,
                    units,
                    ends_ms,
                    drain: drain.map(|(id, units, ends_ms)| super::super::Drain { id, units, ends_ms }),
                    remaining: units,
                    limit: 100,
                    window_ms: 1_000,
                    reset_at_ms: reset,
                    last_ttl_ms,
                    granted_units: units,
                    spent_until_ms,
                    asked,
                    asked_ms,
                    renewing: false,
                    spent_this_s,
                    second,
                    rate_per_s,
                    used_ms,
                    handed,
                    granted_at_ms,
                },
            )
    }

    fn config() -> impl Strategy<Value = BookConfig> {
        (0u64..600, 0u64..300, prop::sample::select(vec![0u64, 500, 5_000])).prop_map(
            |(renew_ahead_ms, return_margin_ms, keep_warm_ms)| BookConfig {
                renew_ahead_ms,
                return_margin_ms,
                keep_warm_ms,
                ..BookConfig::default()
            },
        )
    }

    /// Whether `due` at `t` does anything to `h`: asks, ends a lease, or changes the state.
    fn acts(h: &Held, c: &BookConfig, t: u64) -> bool {
        let (mut after, mut ledger) = (h.clone(), Ledger::default());
        let asked = after.due(&("r".into(), "i".into()), c, true, t, &mut ledger);
        asked.is_some() || after != *h || ledger != Ledger::default()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// A timer that first looks at the quota when it wakes misses nothing: before then
        /// `due` does nothing, and then it does something (the wake is not early either).
        #[test]
        fn due_does_nothing_before_the_wake_and_something_at_it(
            h in held(), c in config(), now in 0u64..20_000, steps in prop::collection::vec(0u64..25_000, 8),
        ) {
            let wake = h.wake_ms(&c, now);
            prop_assert!(wake >= now);
            for t in steps.into_iter().map(|s| now + s).filter(|&t| t < wake) {
                prop_assert!(!acts(&h, &c, t), "due acted at {} before the wake {}", t, wake);
            }
            for t in (now..wake.min(now + 25_000)).step_by(97) {
                prop_assert!(!acts(&h, &c, t), "due acted at {} before the wake {}", t, wake);
            }
            if wake < u64::MAX {
                prop_assert!(acts(&h, &c, wake), "due did nothing at its wake {}", wake);
            }
        }

        #[test]
        fn a_quota_is_vacant_from_its_instant_on(h in held(), t in 0u64..40_000) {
            let from = h.vacant_from_ms();
            let live = h.id.is_some() && t < h.ends_ms;
            let draining = h.drain.is_some_and(|d| t < d.ends_ms);
            let spent_or_used = t < h.spent_until_ms || t < h.used_ms + 1_000;
            let vacant = !live && !draining && !h.asking(t) && !spent_or_used;
            prop_assert_eq!(h.vacant(t), vacant);
            prop_assert_eq!(t >= from, vacant);
        }
    }
}
