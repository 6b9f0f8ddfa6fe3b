//! One request against every limit it matches, all-or-nothing.

use super::{Decision, Limit, State};
use crate::time::Micros;

/// One of the limits a request is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// The rule's limit for this request's identity.
    pub limit: &'a Limit,
    /// A shadow rule counts the request but never denies it.
    pub shadow: bool,
    /// What the request costs this limit (0 counts as 1, as [`Limit::decide`] takes it).
    pub cost: u64,
}

/// Whether a request passes: every enforced part admitted it.
pub fn passes(parts: &[Part<'_>], decisions: &[Decision]) -> bool {
    parts.iter().zip(decisions).all(|(p, d)| d.allowed || p.shadow)
}

/// Decides a request against every part, at each part's cost, at `now`, all-or-nothing.
///
/// Each part is decided on its own state as [`Limit::decide`] would. The request passes when
/// every enforced part admits it ([`passes`]); only then does each part that admitted it,
/// shadow parts included, keep its new state. When it does not pass, no state changes, so a
/// denied request consumes nothing anywhere and needs no refund. `states[i]` is part `i`'s
/// state; the decisions come back in the parts' order.
///
/// The service's memory store calls this under one critical section for all the keys; the
/// Redis check script mirrors it.
pub fn decide_all(parts: &[Part<'_>], states: &mut [State], now: Micros) -> Vec<Decision> {
    debug_assert_eq!(parts.len(), states.len());
    let mut next: Vec<State> = Vec::with_capacity(parts.len());
    let decisions: Vec<Decision> = parts
        .iter()
        .zip(states.iter())
        .map(|(part, state)| {
            let mut s = state.clone();
            let d = part.limit.decide(&mut s, now, part.cost);
            next.push(s);
            d
        })
        .collect();
    if passes(parts, &decisions) {
        for ((state, new), d) in states.iter_mut().zip(next).zip(&decisions) {
            if d.allowed {
                *state = new;
            }
        }
    }
    decisions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::time::Micros;

    fn limit(algorithm: Algorithm, n: u64) -> Limit {
        Limit::builder(algorithm, n, Micros::SECOND).build().unwrap()
    }

    #[test]
    fn a_denial_by_any_enforced_part_changes_no_state() {
        let (wide, narrow) = (limit(Algorithm::SlidingWindowLog, 10), limit(Algorithm::FixedWindow, 1));
        let parts = [
            Part {
                limit: &wide,
                shadow: false,
                cost: 1,
            },
            Part {
                limit: &narrow,
                shadow: false,
                cost: 1,
            },
        ];
        let mut states = [State::Fresh, State::Fresh];
        assert!(passes(&parts, &decide_all(&parts, &mut states, Micros::ZERO)));
        let after_first = states.clone();
        let d = decide_all(&parts, &mut states, Micros::new(1));
        assert!(d[0].allowed && !d[1].allowed && !passes(&parts, &d));
        assert_eq!(states, after_first, "the denied request consumed nothing");
        assert_eq!(d[0].remaining, 8, "the admitting part reports what it would have left");
    }

    #[test]
    fn shadow_parts_count_when_the_request_passes_and_never_deny() {
        let (enforced, shadow) = (limit(Algorithm::TokenBucket, 5), limit(Algorithm::Gcra, 1));
        let parts = [
            Part {
                limit: &enforced,
                shadow: false,
                cost: 1,
            },
            Part {
                limit: &shadow,
                shadow: true,
                cost: 1,
            },
        ];
        let mut states = [State::Fresh, State::Fresh];
        let first = decide_all(&parts, &mut states, Micros::ZERO);
        assert!(first[1].allowed && states[1] != State::Fresh, "the shadow part counted");
        let second = decide_all(&parts, &mut states, Micros::new(1));
        assert!(
            !second[1].allowed && passes(&parts, &second),
            "a shadow denial does not deny"
        );
        assert_eq!(second[0].remaining, 3);
    }

    #[test]
    fn one_part_is_the_single_decision() {
        for algorithm in Algorithm::ALL {
            let l = limit(algorithm, 3);
            let parts = [Part {
                limit: &l,
                shadow: false,
                cost: 1,
            }];
            let (mut states, mut single) = ([State::Fresh], State::Fresh);
            for t in 0..6 {
                let all = decide_all(&parts, &mut states, Micros::from_ms(t));
                assert_eq!(
                    all[0],
                    l.decide(&mut single, Micros::from_ms(t), 1),
                    "{algorithm} at {t} ms"
                );
                assert_eq!(states[0], single, "{algorithm} at {t} ms");
            }
        }
    }
}
