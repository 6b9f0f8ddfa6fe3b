//! Leased quotas: units of one limit taken from the shared state ahead of use, for a proxy to
//! spend locally until the lease ends; what it has not spent then goes back.
//!
//! A grant is a decision of cost `n` ([`Limit::decide`]) for the largest `n` up to what was
//! asked that the limit admits now, so the shared state never counts more than the limit:
//! units are taken when granted, not when spent. What that guarantees, per algorithm, when
//! the admitted requests are counted at the moment they are *spent* (the lease lasting at most
//! `ttl`):
//!
//! * `fixed_window`: exact. A lease never outlives the window it was granted in
//!   ([`lease_end`]), so every unit is spent in the window that counted it.
//! * `sliding_window_counter`: as exact as the algorithm (the lease ends with its window, so
//!   units are spent in the window whose counter holds them).
//! * `token_bucket`, `gcra`, `leaky_bucket` (policing): over any interval `T`, at most what
//!   the bucket admits over `T + ttl` (`burst + limit × (T + ttl) / window`): a unit granted
//!   at `t` may be spent up to `ttl` later, while the bucket refills from `t`. Over-admission
//!   is bounded by `limit × ttl / window` units and vanishes as `ttl` shrinks; at most
//!   `limit` per window when counted at grant.
//! * `sliding_window_log` and shaping (`leaky_bucket` with `max_delay`) cannot be leased: a
//!   log counts each unit at its own time, which a lease moves, and a shaped request's delay
//!   is decided when it arrives. [`leasable`] says so and why.

use thiserror::Error;

pub mod book;
pub mod held;
pub mod wire;

use crate::algorithm::{Algorithm, Decision, Limit, State};
use crate::time::Micros;

/// Why a limit cannot be leased.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LeaseError {
    /// The sliding window log counts each unit at the moment it is admitted.
    #[error(
        "sliding_window_log cannot be leased: it counts each request at its own time, and a lease spends units \
         later than they were counted, so the window would hold more than its limit; use fixed_window, \
         sliding_window_counter, token_bucket or gcra with `lease = true`"
    )]
    SlidingLog,
    /// A concurrency limit's slots come back when requests end, not as time passes.
    #[error(
        "concurrency cannot be leased: a slot is given back when its request ends, which a lease of units \
         spent ahead cannot follow; leave `lease` (and `global`) out of a concurrency rule"
    )]
    Concurrency,
    /// A shaping limit delays requests instead of refusing them.
    #[error("a shaping limit (max_delay) cannot be leased: a request's delay is decided when it arrives")]
    Shaping,
}

/// Whether `limit` can be leased, and why not.
pub fn leasable(limit: &Limit) -> Result<(), LeaseError> {
    if limit.shaping() {
        return Err(LeaseError::Shaping);
    }
    match limit.algorithm() {
        Algorithm::SlidingWindowLog => Err(LeaseError::SlidingLog),
        Algorithm::Concurrency => Err(LeaseError::Concurrency),
        _ => Ok(()),
    }
}

/// When a lease granted at `now` for `ttl` ends: `now + ttl`, but never past the end of the
/// window a windowed algorithm counted it in.
pub fn lease_end(limit: &Limit, now: Micros, ttl: Micros) -> Micros {
    let end = now.saturating_add(ttl);
    match limit.algorithm() {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
            let window_end = limit.window().saturating_mul(now / limit.window() + 1);
            end.min(window_end)
        }
        _ => end,
    }
}

/// What a grant gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Units granted: from 0 (nothing available) to what was asked.
    pub units: u64,
    /// When it was granted.
    pub granted_at: Micros,
    /// When the lease ends ([`lease_end`]); unspent units go back until then.
    pub expires_at: Micros,
    /// The decision that took them (or, with 0 units, the refusal of one), for the headers.
    pub decision: Decision,
}

/// Grants up to `want` units of `limit` at `now` for `ttl`: the largest number the limit
/// admits now, taken from `state` at once; 0 units (and `state` untouched) when not even one
/// fits. The caller checks [`leasable`] first.
pub fn grant(limit: &Limit, state: &mut State, now: Micros, want: u64, ttl: Micros) -> Grant {
    let expires_at = lease_end(limit, now, ttl);
    let want = want.max(1);
    let whole = limit.decide(&mut state.clone(), now, want);
    // The refusal says what is left; every algorithm admits any cost up to it (a smaller cost
    // is admitted whenever a larger one is), so search below `want` only when it is unsure.
    let (mut lo, mut hi) = if whole.allowed {
        (want, want)
    } else {
        (0, whole.remaining.min(want - 1))
    };
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if limit.decide(&mut state.clone(), now, mid).allowed {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 {
        let decision = limit.decide(&mut state.clone(), now, 1);
        return Grant {
            units: 0,
            granted_at: now,
            expires_at,
            decision,
        };
    }
    let decision = limit.decide(state, now, lo);
    Grant {
        units: lo,
        granted_at: now,
        expires_at,
        decision,
    }
}

/// Takes up to `want` units of `limit` at `now`, whatever is left of them, with no lease: a
/// cost learnt after the request passed (the tokens an answer used). Never refuses; what is
/// beyond the quota is not carried as a debt. The grant's decision is the next request's
/// ([`Limit::peek`] after the take), so its caller knows whether the quota is spent.
pub fn take(limit: &Limit, state: &mut State, now: Micros, want: u64) -> Grant {
    let taken = grant(limit, state, now, want, Micros::ZERO);
    Grant {
        decision: limit.peek(state, now),
        ..taken
    }
}

/// Gives back, at `now`, `unspent` units of a lease granted at `granted_at` and ending at
/// `expires_at` (the caller bounds `unspent` by what the lease holds); whether they were
/// taken back.
///
/// Only until the lease ends: units held past it are not given back but come back as the
/// algorithm refills (or its window turns). A unit returned later would escape the bucket's
/// cap while it was held, and the bucket could then admit more at once than it ever holds.
pub fn give_back(
    limit: &Limit,
    state: &mut State,
    (granted_at, expires_at): (Micros, Micros),
    unspent: u64,
    now: Micros,
) -> bool {
    if unspent == 0 || now > expires_at {
        return false;
    }
    limit.refund(state, granted_at, unspent);
    true
}

/// How many units to ask for next: enough for the proxy's observed rate over `horizon`
/// (`spent_per_s` units per second), at least 1, and no more than a quarter of what the
/// quota has left (`remaining`), so that a quota running low is shared out in smaller
/// leases, down to one unit — an exact call per request — at its end.
pub fn lease_size(spent_per_s: u64, horizon: Micros, remaining: u64) -> u64 {
    let for_rate =
        u64::try_from(u128::from(spent_per_s) * u128::from(horizon.as_u64()) / u128::from(Micros::SECOND.as_u64()))
            .unwrap_or(u64::MAX);
    for_rate.min(remaining / 4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::time::Micros;

    const SECOND: Micros = Micros::SECOND;

    fn limit(algorithm: Algorithm, n: u64) -> Limit {
        Limit::builder(algorithm, n, 60 * SECOND).build().unwrap()
    }

    #[test]
    fn a_grant_takes_what_is_left_up_to_the_ask() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::SlidingWindowCounter,
        ] {
            let l = limit(algorithm, 100);
            let mut s = State::default();
            let g = grant(&l, &mut s, SECOND, 70, SECOND);
            assert_eq!((g.units, g.decision.remaining), (70, 30), "{algorithm}");
            let g = grant(&l, &mut s, SECOND, 70, SECOND);
            assert_eq!(g.units, 30, "{algorithm}: the rest");
            let g = grant(&l, &mut s, SECOND, 70, SECOND);
            assert_eq!(g.units, 0, "{algorithm}: nothing left");
            assert!(!g.decision.allowed, "{algorithm}");
            let held = (SECOND, 2 * SECOND);
            assert!(give_back(&l, &mut s, held, 20, SECOND + Micros::new(1)));
            assert_eq!(
                grant(&l, &mut s, SECOND + Micros::new(1), 70, SECOND).units,
                20,
                "{algorithm}: given back"
            );
            let before = s.clone();
            assert!(
                !give_back(&l, &mut s, held, 10, 2 * SECOND + Micros::new(1)),
                "{algorithm}: too late"
            );
            assert_eq!(s, before, "{algorithm}: nothing back");
        }
    }

    #[test]
    fn a_windowed_lease_ends_with_its_window() {
        let fixed = limit(Algorithm::FixedWindow, 10);
        assert_eq!(lease_end(&fixed, 59 * SECOND, 5 * SECOND), 60 * SECOND);
        assert_eq!(lease_end(&fixed, 61 * SECOND, 5 * SECOND), 66 * SECOND);
        let bucket = limit(Algorithm::TokenBucket, 10);
        assert_eq!(lease_end(&bucket, 59 * SECOND, 5 * SECOND), 64 * SECOND);
    }

    #[test]
    fn logs_and_shaping_cannot_be_leased() {
        assert_eq!(
            leasable(&limit(Algorithm::SlidingWindowLog, 5)),
            Err(LeaseError::SlidingLog)
        );
        let shaped = Limit::builder(Algorithm::LeakyBucket, 5, SECOND)
            .shaping(Some(SECOND))
            .build()
            .unwrap();
        assert_eq!(leasable(&shaped), Err(LeaseError::Shaping));
        assert_eq!(leasable(&limit(Algorithm::Gcra, 5)), Ok(()));
        assert!(LeaseError::SlidingLog.to_string().contains("use fixed_window"));
    }

    #[test]
    fn leases_shrink_as_the_quota_runs_low() {
        // 50 per second over a 2 s horizon: 100, while a quarter of what is left allows it.
        assert_eq!(lease_size(50, 2 * SECOND, 10_000), 100);
        assert_eq!(lease_size(50, 2 * SECOND, 200), 50);
        assert_eq!(lease_size(50, 2 * SECOND, 3), 1, "an exact call per request at the end");
        assert_eq!(lease_size(0, 2 * SECOND, 10_000), 1);
    }
}
