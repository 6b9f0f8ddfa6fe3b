//! Sliding window log: the exact algorithm. It remembers every admitted (time, cost) of the
//! last `window` and admits a request only if the window ending now stays within `limit`.
//!
//! An entry admitted at `t` counts in the window `(now - window, now]`, so it stops counting
//! at `t + window`. Memory is at most `limit` entries per key; the running total keeps each
//! decision O(1) amortised.

use std::collections::VecDeque;

use super::{admitted, denied, Decision, Limit, Micros, State};

pub(super) fn decide(limit: &Limit, state: &mut State, now: Micros, cost: u64) -> Decision {
    if !matches!(state, State::Log { .. }) {
        *state = State::Log {
            entries: VecDeque::new(),
            used: 0,
        };
    }
    let State::Log { entries, used } = state else {
        return denied(limit, 0, Micros::ZERO, limit.window);
    };
    while let Some(&(ts, c)) = entries.front() {
        if ts + limit.window > now {
            break;
        }
        *used -= c;
        entries.pop_front();
    }
    let free = limit.limit.saturating_sub(*used);
    if cost > free {
        let reset = entries
            .back()
            .map_or(Micros::ZERO, |&(ts, _)| (ts + limit.window).saturating_sub(now));
        return denied(
            limit,
            free,
            reset,
            retry_after(limit, entries, cost - free, now).unwrap_or(reset),
        );
    }
    match entries.back_mut() {
        Some((ts, c)) if *ts == now => *c += cost,
        _ => entries.push_back((now, cost)),
    }
    *used += cost;
    admitted(limit, free - cost, limit.window)
}

/// When the oldest entries will have freed `missing` units; `None` if they never can.
fn retry_after(limit: &Limit, entries: &VecDeque<(Micros, u64)>, mut missing: u64, now: Micros) -> Option<Micros> {
    for &(ts, c) in entries {
        if c >= missing {
            return Some((ts + limit.window).saturating_sub(now));
        }
        missing -= c;
    }
    None
}

pub(super) fn refund(state: &mut State, admitted_at: Micros, cost: u64) {
    if let State::Log { entries, used } = state {
        if let Some(i) = entries.iter().rposition(|&(ts, _)| ts == admitted_at) {
            let taken = entries[i].1.min(cost);
            entries[i].1 -= taken;
            *used -= taken;
            if entries[i].1 == 0 {
                entries.remove(i);
            }
        }
    }
}
