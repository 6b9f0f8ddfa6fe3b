//! GCRA (generic cell rate algorithm), which also serves as the leaky bucket.
//!
//! The state is one number, the theoretical arrival time (TAT): when the bucket would be
//! empty if no more requests came. Each unit of cost pushes it `interval` further. A
//! request fits while the TAT stays within `capacity × interval` of now. In shaping mode a
//! request that does not fit may still pass after a delay of up to `max_delay`: the leaky
//! bucket's queue, without the queue.

use super::{admitted, denied, Decision, Limit, Micros, State};

pub(super) fn decide(limit: &Limit, state: &mut State, now: Micros, cost: u64) -> Decision {
    let tat = match *state {
        State::Tat(tat) => tat.max(now),
        _ => now,
    };
    let tau = limit.capacity * limit.interval;
    let remaining_before = (tau - (tat - now).min(tau)) / limit.interval;
    if cost > limit.capacity {
        let reset = tat - now;
        return denied(limit, remaining_before, reset, reset);
    }
    let new_tat = tat + cost * limit.interval;
    let over = (new_tat - now).saturating_sub(tau);
    if over > limit.max_delay {
        return denied(limit, remaining_before, tat - now, over - limit.max_delay);
    }
    *state = State::Tat(new_tat);
    let remaining = (tau.saturating_sub(new_tat - now)) / limit.interval;
    Decision {
        delay: over,
        ..admitted(limit, remaining, new_tat - now)
    }
}

pub(super) fn refund(limit: &Limit, state: &mut State, admitted_at: Micros, cost: u64) {
    if let State::Tat(tat) = state {
        *tat = tat.saturating_sub(cost * limit.interval).max(admitted_at);
    }
}
