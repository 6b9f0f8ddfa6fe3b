//! Token bucket: holds up to `capacity` tokens, refilled at `limit / window`.
//!
//! Tokens are kept scaled by [`Limit::token_unit`] so that refilling `elapsed` µs adds the
//! integer `elapsed × token_rate`: no fractions, no rounding, the same in Lua.

use super::{admitted, denied, Decision, Limit, Micros, State};

/// Scaled tokens available at `now`, given the stored state.
fn available(limit: &Limit, state: &State, now: Micros) -> u64 {
    let full = limit.capacity * limit.unit;
    match *state {
        State::Bucket { tokens, last } => {
            let elapsed = now.saturating_sub(last);
            if elapsed >= time_to_full(limit, tokens) {
                full
            } else {
                tokens + elapsed.as_u64() * limit.rate
            }
        }
        _ => full,
    }
}

/// Microseconds until a bucket holding `tokens` scaled tokens is full again.
pub(super) fn time_to_full(limit: &Limit, tokens: u64) -> Micros {
    Micros::new(
        (limit.capacity * limit.unit)
            .saturating_sub(tokens)
            .div_ceil(limit.rate),
    )
}

pub(super) fn decide(limit: &Limit, state: &mut State, now: Micros, cost: u64) -> Decision {
    let tokens = available(limit, state, now);
    let unit = limit.unit;
    if cost > limit.capacity {
        let reset = time_to_full(limit, tokens);
        return denied(limit, tokens / unit, reset, reset);
    }
    let need = cost * unit;
    if need > tokens {
        let retry = Micros::new((need - tokens).div_ceil(limit.rate));
        return denied(limit, tokens / unit, time_to_full(limit, tokens), retry);
    }
    let left = tokens - need;
    *state = State::Bucket {
        tokens: left,
        last: now,
    };
    admitted(limit, left / unit, time_to_full(limit, left))
}

pub(super) fn refund(limit: &Limit, state: &mut State, cost: u64) {
    if let State::Bucket { tokens, .. } = state {
        *tokens = (*tokens + cost.min(limit.capacity) * limit.unit).min(limit.capacity * limit.unit);
    }
}
