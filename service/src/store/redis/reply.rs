//! The check script's replies, read: a decision for each rule of a group, or a lease's grant.
//! Pure — the numbers Redis answered in, typed answers or a protocol error that quotes them
//! out — so that a reply of any shape (a script of another version, a proxy in the way, a
//! corrupted server) is an error, never a panic or a decision made of the wrong numbers. The
//! fuzz target `redis_replies` holds them to that.

use sluice_core::lease::Grant;
use sluice_core::{Decision, Micros};

use crate::store::{Stamped, StoreError};

/// A count from the script: a negative one (which it never sends) reads as 0.
fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn micros(v: i64) -> Micros {
    Micros::new(count(v))
}

/// A `decide` or `peek` reply for rules of these limits, in order: the store's clock, then
/// five numbers a rule (allowed, remaining, reset, retry, delay).
pub fn decisions(reply: &[i64], limits: &[u64]) -> Result<Vec<Stamped>, StoreError> {
    let (Some(&at), rest) = (reply.first(), reply.get(1..).unwrap_or_default()) else {
        return Err(StoreError::Protocol(format!("script returned {reply:?}")));
    };
    if rest.len() != 5 * limits.len() {
        return Err(StoreError::Protocol(format!(
            "script returned {reply:?} for {} rules",
            limits.len()
        )));
    }
    Ok(limits
        .iter()
        .zip(rest.chunks_exact(5))
        .map(|(&limit, d)| Stamped {
            decision: Decision {
                allowed: d[0] == 1,
                limit,
                remaining: count(d[1]),
                reset_after: micros(d[2]),
                retry_after: micros(d[3]),
                delay: micros(d[4]),
            },
            at: micros(at),
        })
        .collect())
}

/// A `take` or `grant` reply (`op`) for a rule of limit `limit`: when, how many units until
/// when, and the decision.
pub fn grant(reply: &[i64], limit: u64, op: &str) -> Result<Grant, StoreError> {
    let [at, units, ends, allowed, remaining, reset, retry, delay] = reply[..] else {
        return Err(StoreError::Protocol(format!("{op} script returned {reply:?}")));
    };
    Ok(Grant {
        units: count(units),
        granted_at: micros(at),
        expires_at: micros(ends),
        decision: Decision {
            allowed: allowed == 1,
            limit,
            remaining: count(remaining),
            reset_after: micros(reset),
            retry_after: micros(retry),
            delay: micros(delay),
        },
    })
}
