//! The promise of each algorithm, stated on random traces of arrival times and costs.

use proptest::prelude::*;
use sluice_core::{Algorithm, Decision, Limit, Micros, State};

const MS: Micros = Micros::MILLISECOND;

/// A random limit and a trace of (arrival time, cost), times non-decreasing.
#[derive(Debug, Clone)]
struct Trace {
    limit: u64,
    window: Micros,
    burst: u64,
    arrivals: Vec<(Micros, u64)>,
}

fn trace() -> impl Strategy<Value = Trace> {
    (1u64..40, 1u64..5_000, 0u64..60, any::<u64>()).prop_flat_map(|(limit, window_ms, burst, start)| {
        let window = window_ms * MS;
        let gap = 0..(window.as_u64() / 4).max(2);
        let start = start % (1 << 45);
        proptest::collection::vec((gap, 1u64..4), 1..200).prop_map(move |steps| {
            let mut now = Micros::new(start);
            let arrivals = steps
                .into_iter()
                .map(|(gap, cost)| {
                    now += Micros::new(gap);
                    (now, cost)
                })
                .collect();
            Trace {
                limit,
                window,
                burst,
                arrivals,
            }
        })
    })
}

/// Runs the trace, returning each request's decision.
fn run(limit: &Limit, arrivals: &[(Micros, u64)]) -> Vec<Decision> {
    let mut state = State::Fresh;
    arrivals
        .iter()
        .map(|&(now, cost)| limit.decide(&mut state, now, cost))
        .collect()
}

fn admitted(arrivals: &[(Micros, u64)], decisions: &[Decision]) -> Vec<(Micros, u64)> {
    arrivals
        .iter()
        .zip(decisions)
        .filter(|(_, d)| d.allowed)
        .map(|(a, _)| *a)
        .collect()
}

/// `admitted` never exceeds `capacity + limit/window · t` in any interval of length t.
fn assert_rate_bound(
    admitted: &[(Micros, u64)],
    capacity: u64,
    limit: u64,
    window: Micros,
) -> Result<(), TestCaseError> {
    let window_us = window.as_u64();
    for i in 0..admitted.len() {
        let mut sum = 0u128;
        for j in i..admitted.len() {
            sum += u128::from(admitted[j].1);
            let t = u128::from((admitted[j].0 - admitted[i].0).as_u64());
            prop_assert!(
                sum * u128::from(window_us) <= u128::from(capacity) * u128::from(window_us) + t * u128::from(limit),
                "{sum} admitted within {t}µs: more than {capacity} + {limit}/{window_us}µs · t"
            );
        }
    }
    Ok(())
}

/// Each denial's `retry_after` is exact: the same request then passes, 1 µs earlier it does not.
fn assert_retry_after_exact(limit: &Limit, arrivals: &[(Micros, u64)], ceiling: u64) -> Result<(), TestCaseError> {
    let mut state = State::Fresh;
    for &(now, cost) in arrivals {
        let before = state.clone();
        let d = limit.decide(&mut state, now, cost);
        if d.allowed {
            prop_assert_eq!(d.retry_after, Micros::ZERO);
            continue;
        }
        if cost > ceiling {
            continue;
        }
        prop_assert!(
            d.retry_after > Micros::ZERO,
            "denied with retry_after 0 at {}",
            now.as_u64()
        );
        let mut later = before.clone();
        prop_assert!(
            limit.decide(&mut later, now + d.retry_after, cost).allowed,
            "not allowed at now + retry_after ({})",
            d.retry_after.as_u64()
        );
        let mut earlier = before;
        prop_assert!(
            !limit
                .decide(&mut earlier, now + d.retry_after - Micros::new(1), cost)
                .allowed,
            "allowed 1µs before retry_after ({})",
            d.retry_after.as_u64()
        );
    }
    Ok(())
}

/// After an admitted decision with `remaining = r`, exactly r more unit requests fit at once.
fn assert_remaining_exact(limit: &Limit, arrivals: &[(Micros, u64)]) -> Result<(), TestCaseError> {
    let mut state = State::Fresh;
    for &(now, cost) in arrivals {
        let d = limit.decide(&mut state, now, cost);
        if !d.allowed || d.remaining > 64 {
            continue;
        }
        let mut probe = state.clone();
        for k in 0..d.remaining {
            prop_assert!(
                limit.decide(&mut probe, now, 1).allowed,
                "unit {} of remaining {} denied",
                k,
                d.remaining
            );
        }
        prop_assert!(
            !limit.decide(&mut probe, now, 1).allowed,
            "more than remaining {} admitted",
            d.remaining
        );
    }
    Ok(())
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(1_000)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sliding_window_log_never_exceeds_limit_in_any_window(t in trace()) {
        let l = Limit::builder(Algorithm::SlidingWindowLog, t.limit, t.window).build().unwrap();
        let ok = admitted(&t.arrivals, &run(&l, &t.arrivals));
        for (i, &(end, _)) in ok.iter().enumerate() {
            let in_window: u64 = ok[..=i].iter().filter(|(ts, _)| *ts + t.window > end).map(|(_, c)| c).sum();
            prop_assert!(in_window <= t.limit, "{} in the window ending {}", in_window, end.as_u64());
        }
        assert_retry_after_exact(&l, &t.arrivals, t.limit)?;
        assert_remaining_exact(&l, &t.arrivals)?;
    }

    #[test]
    fn fixed_window_never_exceeds_limit_per_aligned_window(t in trace()) {
        let l = Limit::builder(Algorithm::FixedWindow, t.limit, t.window).build().unwrap();
        let ok = admitted(&t.arrivals, &run(&l, &t.arrivals));
        let mut per_window = std::collections::HashMap::new();
        for (ts, c) in ok {
            *per_window.entry(ts / t.window).or_insert(0) += c;
        }
        prop_assert!(per_window.values().all(|&n| n <= t.limit), "{:?}", per_window);
        assert_retry_after_exact(&l, &t.arrivals, t.limit)?;
        assert_remaining_exact(&l, &t.arrivals)?;
    }

    #[test]
    fn token_bucket_never_exceeds_burst_plus_rate(t in trace()) {
        let l = Limit::builder(Algorithm::TokenBucket, t.limit, t.window).burst(t.burst).build().unwrap();
        let ok = admitted(&t.arrivals, &run(&l, &t.arrivals));
        assert_rate_bound(&ok, l.capacity(), t.limit, t.window)?;
        assert_retry_after_exact(&l, &t.arrivals, l.capacity())?;
        assert_remaining_exact(&l, &t.arrivals)?;
    }

    #[test]
    fn gcra_and_leaky_meter_never_exceed_burst_plus_rate(t in trace()) {
        for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
            let l = Limit::builder(algorithm, t.limit, t.window).burst(t.burst).build().unwrap();
            let ok = admitted(&t.arrivals, &run(&l, &t.arrivals));
            assert_rate_bound(&ok, l.capacity(), t.limit, t.window)?;
            assert_retry_after_exact(&l, &t.arrivals, l.capacity())?;
            assert_remaining_exact(&l, &t.arrivals)?;
        }
    }

    #[test]
    fn shaping_leaky_bucket_releases_at_the_rate_and_delays_within_max_delay(t in trace(), max_delay_ms in 0u64..3_000) {
        let max_delay = max_delay_ms * MS;
        let l = Limit::builder(Algorithm::LeakyBucket, t.limit, t.window).burst(t.burst).shaping(Some(max_delay)).build().unwrap();
        let decisions = run(&l, &t.arrivals);
        let mut released = Vec::new();
        for (&(ts, cost), d) in t.arrivals.iter().zip(&decisions) {
            prop_assert!(d.delay <= max_delay, "delay {} above max {}", d.delay.as_u64(), max_delay.as_u64());
            if d.allowed {
                released.push((ts + d.delay, cost));
            }
        }
        released.sort_unstable();
        assert_rate_bound(&released, l.capacity(), t.limit, t.window)?;
        assert_retry_after_exact(&l, &t.arrivals, l.capacity())?;
    }

    #[test]
    fn sliding_window_counter_never_exceeds_its_estimate(t in trace()) {
        let l = Limit::builder(Algorithm::SlidingWindowCounter, t.limit, t.window).build().unwrap();
        let ok = admitted(&t.arrivals, &run(&l, &t.arrivals));
        let w = t.window / MS;
        for (i, &(now, _)) in ok.iter().enumerate() {
            // Recount from the admitted trace alone, independent of the algorithm's state.
            let id = now / t.window;
            let count = |k: u64| -> u64 { ok[..=i].iter().filter(|(ts, _)| *ts / t.window == k).map(|(_, c)| c).sum() };
            let previous = if id == 0 { 0 } else { count(id - 1) };
            let elapsed = (now - id * t.window) / MS;
            prop_assert!(previous * (w - elapsed) + count(id) * w <= t.limit * w, "estimate above {} at {}", t.limit, now.as_u64());
        }
        assert_retry_after_exact(&l, &t.arrivals, t.limit)?;
        assert_remaining_exact(&l, &t.arrivals)?;
    }

    #[test]
    fn a_denial_leaves_the_state_as_if_the_request_never_came(t in trace(), a in 0usize..6) {
        let l = Limit::builder(Algorithm::ALL[a], t.limit, t.window).burst(t.burst).build().unwrap();
        let mut state = State::Fresh;
        for &(now, cost) in &t.arrivals {
            let before = state.clone();
            if !l.decide(&mut state, now, cost).allowed {
                // The log prunes expired entries; nothing else may change.
                let mut replay = before;
                let mut pruned = state.clone();
                prop_assert_eq!(l.decide(&mut replay, now, 1), l.decide(&mut pruned, now, 1));
            }
        }
    }
}
