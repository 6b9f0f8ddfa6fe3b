//! Fixed window: a counter per aligned window `[k·window, (k+1)·window)`.

use super::{admitted, denied, Decision, Limit, Micros, State};

pub(super) fn decide(limit: &Limit, state: &mut State, now: Micros, cost: u64) -> Decision {
    let id = now / limit.window;
    let count = match *state {
        State::Window { id: stored, count } if stored == id => count,
        _ => 0,
    };
    let reset = (id + 1) * limit.window - now;
    if cost > limit.limit - count.min(limit.limit) {
        // The next window starts empty; a cost above the limit never fits, and gets the same answer.
        return denied(limit, limit.limit - count.min(limit.limit), reset, reset);
    }
    *state = State::Window {
        id,
        count: count + cost,
    };
    admitted(limit, limit.limit - count - cost, reset)
}

pub(super) fn refund(limit: &Limit, state: &mut State, admitted_at: Micros, cost: u64) {
    if let State::Window { id, count } = state {
        if *id == admitted_at / limit.window {
            *count = count.saturating_sub(cost);
        }
    }
}
