//! Sizing an assignment: what a bucket asks of its rule's quota, and the token bucket Envoy
//! enforces for what was granted. Pure: no store, no clock.
//!
//! An assignment is a lease of `g` units for `T` whole seconds, handed to Envoy as a token
//! bucket of `burst` tokens (it starts full) refilled `per_s` tokens a second, with
//! `burst + per_s·T ≤ g`: whatever Envoy does with it in `T` seconds stays within what the
//! shared state was debited. Envoy keeps its token bucket when a new assignment carries the
//! same one (its tokens cannot exceed `burst`), so a renewal with an unchanged plan asks only
//! for the seconds it adds, `per_s` a second.

/// Envoy reads durations in whole seconds (its TTL timer and `fill_interval` take the
/// `seconds` field alone), so every duration Sluice sends is whole seconds.
pub const SECOND_MS: u64 = 1_000;

/// The `fill_interval` of a bucket that never refills within any assignment: about ten
/// years, so Envoy adds one token per decade (`tokens_per_fill` must be positive).
pub const NEVER_S: i64 = 315_360_000;

/// What a bucket is given to enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// A token bucket: `burst` tokens at first, `per_s` more each second (0: none).
    Bucket {
        /// Tokens the bucket starts with and holds at most (at least 1).
        burst: u64,
        /// Tokens added each second.
        per_s: u64,
    },
    /// Refuse everything: the quota is spent, or the rule refuses the bucket.
    DenyAll,
    /// Allow everything (only for buckets no rule limits, when the operator says so).
    AllowAll,
}

impl Strategy {
    /// Units the strategy may admit over `ttl_s` seconds from a full bucket.
    pub fn units(self, ttl_s: u64) -> u64 {
        match self {
            Strategy::Bucket { burst, per_s } => burst.saturating_add(per_s.saturating_mul(ttl_s)),
            Strategy::DenyAll => 0,
            Strategy::AllowAll => u64::MAX,
        }
    }
}

/// What a rule's quota can give one bucket: its rate a second and what one grant can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The rule's rate, units a second.
    pub per_s: u64,
    /// The most one grant can take at once (a bucket's capacity, a window's limit).
    pub capacity: u64,
}

/// The bucket a demand of `demand_per_s` requests a second should have for `ttl_s` seconds:
/// a quarter more than the demand, at least 1 a second, at most the rule's rate, with half a
/// second's worth as its burst; and small enough that one grant can pay for it (its burst
/// and `ttl_s` seconds are taken at once: Envoy may spend them all before it hears again).
pub fn plan(demand_per_s: u64, room: Room, ttl_s: u64) -> Strategy {
    let payable = u128::from(room.capacity) * 2 / (2 * u128::from(ttl_s) + 1);
    let cap = room.per_s.min(u64::try_from(payable).unwrap_or(u64::MAX));
    let per_s = demand_per_s.saturating_add(demand_per_s / 4).min(cap).max(1);
    Strategy::Bucket {
        burst: (per_s / 2).max(1),
        per_s,
    }
}

/// Whether `current` still serves where `wanted` is what the demand asks now: at least the
/// rate wanted and at most a quarter more, so a steady client keeps its bucket (Envoy then
/// extends it instead of starting a new one) and a client holding more than it should gives
/// it up at its next report.
pub fn fits(current: Strategy, wanted: Strategy) -> bool {
    match (current, wanted) {
        (Strategy::Bucket { per_s, .. }, Strategy::Bucket { per_s: want, .. }) => {
            per_s >= want && per_s <= want.saturating_add(want / 4 + 1)
        }
        _ => false,
    }
}

/// The bucket to plan for a demand of `demand_per_s` when every bucket of its quota (on
/// every node) wants `total` a second: [`plan`] while the rule's rate covers everyone; else
/// its part of the rate in proportion to its demand, exactly (no quarter more), so the plans
/// add up to the rate and no one holds what another is refused.
pub fn plan_shared(demand_per_s: u64, total: u64, room: Room, ttl_s: u64) -> Strategy {
    if total <= room.per_s {
        return plan(demand_per_s, room, ttl_s);
    }
    let part = u128::from(demand_per_s) * u128::from(room.per_s) / u128::from(total);
    let part = u64::try_from(part).unwrap_or(u64::MAX);
    match plan(part, room, ttl_s) {
        Strategy::Bucket { per_s, .. } => {
            let per_s = per_s.min(part).max(1);
            Strategy::Bucket {
                burst: (per_s / 2).max(1),
                per_s,
            }
        }
        other => other,
    }
}

/// The largest bucket `granted` units pay for over `ttl_s` seconds, shaped like `wanted`
/// (its burst equal to its rate, as [`plan`] makes them); `DenyAll` for none.
pub fn fit(granted: u64, wanted: Strategy, ttl_s: u64) -> Strategy {
    if granted >= wanted.units(ttl_s) {
        return wanted;
    }
    if granted == 0 {
        return Strategy::DenyAll;
    }
    // burst = per_s / 2 + what rounding leaves: per_s·(ttl_s + ½) ≤ granted.
    let per_s = granted * 2 / (2 * ttl_s + 1);
    Strategy::Bucket {
        burst: granted - per_s * ttl_s,
        per_s,
    }
}

/// Requests a second shown by a report of `used` requests over `elapsed_ms`. Envoy reports
/// whole seconds and 0 on a bucket's first report: anything under a second counts as one.
pub fn demand_per_s(used: u64, elapsed_ms: u64) -> u64 {
    let elapsed_ms = elapsed_ms.max(SECOND_MS);
    let per_s = u128::from(used) * u128::from(SECOND_MS) / u128::from(elapsed_ms);
    u64::try_from(per_s).unwrap_or(u64::MAX)
}

/// The units a renewal keeping `strategy` must be granted to move the assignment's end
/// from `paid_until_ms` to `end_ms`: `per_s` for each second it adds, rounded up.
pub fn extension(strategy: Strategy, paid_until_ms: u64, end_ms: u64) -> u64 {
    match strategy {
        Strategy::Bucket { per_s, .. } => {
            let added = u128::from(end_ms.saturating_sub(paid_until_ms));
            let units = (u128::from(per_s) * added).div_ceil(u128::from(SECOND_MS));
            u64::try_from(units).unwrap_or(u64::MAX)
        }
        Strategy::DenyAll | Strategy::AllowAll => 0,
    }
}

/// The refills `strategy` adds from `from_ms` to `to_ms`, rounded down: what an assignment
/// replaced at `from_ms` and paid for until `to_ms` can give back.
pub fn refills(strategy: Strategy, from_ms: u64, to_ms: u64) -> u64 {
    match strategy {
        Strategy::Bucket { per_s, .. } => {
            let units = u128::from(per_s) * u128::from(to_ms.saturating_sub(from_ms)) / u128::from(SECOND_MS);
            u64::try_from(units).unwrap_or(u64::MAX)
        }
        Strategy::DenyAll | Strategy::AllowAll => 0,
    }
}

/// The milliseconds of refills `units` pay for under `strategy`, rounded down.
pub fn paid_ms(strategy: Strategy, units: u64) -> u64 {
    match strategy {
        Strategy::Bucket { per_s, .. } if per_s > 0 => {
            let ms = u128::from(units) * u128::from(SECOND_MS) / u128::from(per_s);
            u64::try_from(ms).unwrap_or(u64::MAX)
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOM: Room = Room {
        per_s: 1_000,
        capacity: 1_000_000,
    };

    #[test]
    fn a_plan_pays_for_a_quarter_more_than_the_demand() {
        assert_eq!(plan(0, ROOM, 1), Strategy::Bucket { burst: 1, per_s: 1 });
        assert_eq!(plan(100, ROOM, 1), Strategy::Bucket { burst: 62, per_s: 125 });
        assert_eq!(plan(100, ROOM, 1).units(5), 687);
        // At most the rule's rate, and what one grant can pay for.
        assert_eq!(
            plan(u64::MAX, ROOM, 1),
            Strategy::Bucket {
                burst: 500,
                per_s: 1_000
            }
        );
        let small = Room {
            per_s: 100,
            capacity: 100,
        };
        assert_eq!(plan(1_000, small, 1), Strategy::Bucket { burst: 33, per_s: 66 });
        assert!(plan(1_000, small, 1).units(1) <= 100);
    }

    #[test]
    fn a_plan_is_kept_while_the_demand_stays_within_it() {
        let p = plan(100, ROOM, 1);
        assert!(fits(p, plan(100, ROOM, 1)) && fits(p, plan(80, ROOM, 1)));
        assert!(!fits(p, plan(101, ROOM, 1)) && !fits(p, plan(79, ROOM, 1)));
        assert!(!fits(Strategy::DenyAll, plan(1, ROOM, 1)));
    }

    #[test]
    fn a_contended_quota_is_shared_in_proportion_to_demand() {
        let room = Room {
            per_s: 200,
            capacity: 200,
        };
        // Room for everyone: a quarter more than the demand.
        assert_eq!(plan_shared(30, 100, room, 1), plan(30, room, 1));
        // 400 wanted of 200: each gets half its demand, exactly.
        assert_eq!(plan_shared(32, 400, room, 1), Strategy::Bucket { burst: 8, per_s: 16 });
        assert_eq!(plan_shared(8, 400, room, 1), Strategy::Bucket { burst: 2, per_s: 4 });
        assert_eq!(plan_shared(1, 400, room, 1), Strategy::Bucket { burst: 1, per_s: 1 });
        // Never more than one grant can pay for.
        assert_eq!(plan_shared(u64::MAX, u64::MAX, room, 1), plan(u64::MAX, room, 1));
    }

    #[test]
    fn what_is_granted_bounds_what_the_bucket_admits() {
        let wanted = plan(100, ROOM, 1);
        for granted in 0..=800 {
            for ttl_s in 1..=6 {
                let got = fit(granted, wanted, ttl_s);
                assert!(got.units(ttl_s) <= granted, "{granted} over {ttl_s}s gave {got:?}");
                if let Strategy::Bucket { burst, per_s } = got {
                    assert!(burst >= 1 && 2 * burst + 1 >= per_s, "{got:?}");
                }
                if granted < wanted.units(ttl_s) {
                    // Short of what was wanted: nothing granted is left unused.
                    assert_eq!(got.units(ttl_s), granted, "{granted} over {ttl_s}s gave {got:?}");
                }
            }
        }
        assert_eq!(fit(0, wanted, 5), Strategy::DenyAll);
        assert_eq!(fit(3, wanted, 5), Strategy::Bucket { burst: 3, per_s: 0 });
        assert_eq!(fit(687, wanted, 5), wanted);
    }

    #[test]
    fn a_report_under_a_second_counts_as_one() {
        assert_eq!(demand_per_s(7, 0), 7);
        assert_eq!(demand_per_s(50, 5_000), 10);
        assert_eq!(demand_per_s(u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn an_extension_pays_for_the_seconds_it_adds() {
        let p = Strategy::Bucket { burst: 10, per_s: 10 };
        assert_eq!(extension(p, 5_000, 6_000), 10);
        assert_eq!(extension(p, 5_000, 5_050), 1);
        assert_eq!(extension(p, 6_000, 5_000), 0);
        assert_eq!(extension(Strategy::DenyAll, 0, 9_000), 0);
        assert_eq!(refills(p, 5_000, 5_050), 0);
        assert_eq!(refills(p, 5_000, 5_450), 4);
        assert_eq!(paid_ms(p, 4), 400);
        assert_eq!(paid_ms(Strategy::Bucket { burst: 1, per_s: 0 }, 4), 0);
    }
}
