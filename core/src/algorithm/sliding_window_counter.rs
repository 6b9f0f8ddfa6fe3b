//! Sliding window counter: counts per aligned window, and estimates the sliding window as
//! the previous window's count weighted by how much of it still overlaps, plus the current.
//!
//! A request passes when `previous × (window − elapsed) / window + current + cost ≤ limit`,
//! computed on whole milliseconds and multiplied out so that it stays in integers.

use super::{admitted, denied, Decision, Limit, Micros, State};

/// The counts of window `id` and the one before it, as of window `id`.
fn counts(state: &State, id: u64) -> (u64, u64) {
    match *state {
        State::Counter {
            id: stored,
            current,
            previous,
        } if stored == id => (current, previous),
        State::Counter {
            id: stored, current, ..
        } if stored + 1 == id => (0, current),
        _ => (0, 0),
    }
}

/// Scaled room left: `limit × w − previous × (w − e) − current × w`, in count·ms units.
fn room(limit: &Limit, current: u64, previous: u64, elapsed_ms: u64) -> u64 {
    let w = limit.window / Micros::MILLISECOND;
    (limit.limit * w).saturating_sub(previous * (w - elapsed_ms) + current * w)
}

pub(super) fn decide(limit: &Limit, state: &mut State, now: Micros, cost: u64) -> Decision {
    let w = limit.window / Micros::MILLISECOND;
    let id = now / limit.window;
    let start = id * limit.window;
    let elapsed_ms = (now - start) / Micros::MILLISECOND;
    let (current, previous) = counts(state, id);
    let reset = start + limit.window - now;
    let room_now = room(limit, current, previous, elapsed_ms);
    if cost * w > room_now || cost > limit.limit {
        let retry = if cost > limit.limit {
            reset
        } else {
            retry_after(limit, current, previous, cost, start, now)
        };
        return denied(limit, room_now / w, reset, retry);
    }
    *state = State::Counter {
        id,
        current: current + cost,
        previous,
    };
    admitted(limit, (room_now - cost * w) / w, reset)
}

/// The earliest time a request of `cost` fits, if nothing else is admitted meanwhile.
fn retry_after(limit: &Limit, current: u64, previous: u64, cost: u64, start: Micros, now: Micros) -> Micros {
    let w = limit.window / Micros::MILLISECOND;
    // The first elapsed millisecond `e` of a window with counts (cur, prev) at which
    // prev × (w − e) ≤ (limit − cur − cost) × w, if any.
    let first_fit = |cur: u64, prev: u64| -> Option<u64> {
        let spare = limit.limit.checked_sub(cur + cost)? * w;
        if prev == 0 {
            return Some(0);
        }
        let e = w.saturating_sub(spare / prev);
        (e < w).then_some(e)
    };
    let at = match first_fit(current, previous) {
        Some(e) => start + e * Micros::MILLISECOND,
        None => match first_fit(0, current) {
            Some(e) => start + limit.window + e * Micros::MILLISECOND,
            None => start + 2 * limit.window,
        },
    };
    at.saturating_sub(now).max(Micros::MICROSECOND)
}

pub(super) fn refund(limit: &Limit, state: &mut State, admitted_at: Micros, cost: u64) {
    let admitted_id = admitted_at / limit.window;
    if let State::Counter { id, current, previous } = state {
        if *id == admitted_id {
            *current = current.saturating_sub(cost);
        } else if *id == admitted_id + 1 {
            *previous = previous.saturating_sub(cost);
        }
    }
}
