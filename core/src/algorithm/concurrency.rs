//! Concurrency: at most `limit` requests in flight at once.
//!
//! A slot is a sliding-log entry whose time is when its request took it or last renewed it,
//! and `window` is how long it outlives that time: the request's end gives it back (a
//! refund at that time), its holder renews it while the request runs (the entry moves to
//! now), and a holder that dies stops renewing, so its slots drop out of the log `window`
//! after their last renewal. A request of cost `c` takes `c` slots.
//!
//! When a slot frees is not known in advance, so a refusal's `retry_after` and every
//! decision's `reset_after` are [`SHORT`] (capped at `window`): look again soon, not a
//! promise.

use super::{sliding_window_log, Decision, Limit, Micros, State};

/// Most slots one concurrency rule may have (its `limit`): each check reads every slot held.
pub const MAX_SLOTS: u64 = 10_000;

/// What a concurrency decision says for `retry_after` and `reset_after`: a second, or the
/// rule's `window` when shorter.
pub const SHORT: Micros = Micros::SECOND;

pub(super) fn decide(limit: &Limit, state: &mut State, now: Micros, cost: u64) -> Decision {
    let mut decision = sliding_window_log::decide(limit, state, now, cost);
    let short = SHORT.min(limit.window);
    decision.reset_after = short;
    if !decision.allowed {
        decision.retry_after = short;
    }
    decision
}

/// Moves up to `cost` slots taken or last renewed at `at` to `now`, so that they live another
/// `window`; the slots moved (0 when they had expired or been given back).
pub(super) fn renew(state: &mut State, at: Micros, now: Micros, cost: u64) -> u64 {
    let moved = release(state, at, cost);
    if moved > 0 {
        insert(state, now, moved);
    }
    moved
}

/// Gives back up to `cost` slots taken or last renewed at `at`; the slots freed.
pub(super) fn release(state: &mut State, at: Micros, cost: u64) -> u64 {
    let held = |s: &State| match s {
        State::Log { used, .. } => *used,
        _ => 0,
    };
    let before = held(state);
    sliding_window_log::refund(state, at, cost);
    before - held(state)
}

/// Adds `cost` slots at `at`, keeping the entries in time order (one entry per time).
fn insert(state: &mut State, at: Micros, cost: u64) {
    let State::Log { entries, used } = state else { return };
    let i = entries.partition_point(|&(ts, _)| ts <= at);
    match i.checked_sub(1).map(|j| &mut entries[j]) {
        Some((ts, c)) if *ts == at => *c += cost,
        _ => entries.insert(i, (at, cost)),
    }
    *used += cost;
}

#[cfg(test)]
mod tests {
    use crate::algorithm::{Algorithm, Limit, State};
    use crate::time::Micros;

    const MS: Micros = Micros::MILLISECOND;

    fn two_slots() -> Limit {
        Limit::builder(Algorithm::Concurrency, 2, 5 * Micros::SECOND)
            .build()
            .unwrap()
    }

    #[test]
    fn a_slot_comes_back_when_its_request_ends() {
        let l = two_slots();
        let mut s = State::Fresh;
        let (a, b) = (MS, 2 * MS);
        assert!(l.decide(&mut s, a, 1).allowed);
        let second = l.decide(&mut s, b, 1);
        assert!(second.allowed && second.remaining == 0);
        let refused = l.decide(&mut s, 3 * MS, 1);
        assert!(!refused.allowed);
        assert_eq!(
            (refused.retry_after, refused.reset_after),
            (Micros::SECOND, Micros::SECOND)
        );
        l.refund(&mut s, a, 1);
        let third = l.decide(&mut s, 4 * MS, 1);
        assert!(third.allowed, "the first request ended: its slot is free");
        l.refund(&mut s, a, 1);
        assert!(
            !l.decide(&mut s, 5 * MS, 1).allowed,
            "a slot given back twice frees nothing more"
        );
    }

    #[test]
    fn a_renewed_slot_outlives_its_window_and_an_abandoned_one_does_not() {
        let l = two_slots();
        let mut s = State::Fresh;
        assert!(l.decide(&mut s, Micros::ZERO, 1).allowed);
        assert!(l.decide(&mut s, MS, 1).allowed);
        let renewed_at = 3 * Micros::SECOND;
        assert_eq!(l.renew(&mut s, Micros::ZERO, renewed_at, 1), 1);
        assert_eq!(l.renew(&mut s, Micros::ZERO, renewed_at, 1), 0, "nothing left at 0");
        // At 6 s the slot taken at 1 ms and never renewed has expired; the renewed one holds.
        let at_six = 6 * Micros::SECOND;
        assert!(l.decide(&mut s, at_six, 1).allowed);
        assert!(
            !l.decide(&mut s, at_six + MS, 1).allowed,
            "the renewed slot still counts"
        );
        assert_eq!(l.expires_after(&s, at_six), 5 * Micros::SECOND);
        // Its holder gives it back at its renewed time.
        l.refund(&mut s, renewed_at, 1);
        assert!(l.decide(&mut s, at_six + 2 * MS, 1).allowed);
    }

    #[test]
    fn a_short_window_shortens_the_advice() {
        let l = Limit::builder(Algorithm::Concurrency, 1, 200 * MS).build().unwrap();
        let mut s = State::Fresh;
        assert!(l.decide(&mut s, Micros::ZERO, 1).allowed);
        assert_eq!(l.decide(&mut s, MS, 1).retry_after, 200 * MS);
        assert!(
            Limit::builder(Algorithm::Concurrency, super::MAX_SLOTS + 1, Micros::SECOND)
                .build()
                .is_err()
        );
    }
}
