//! Properties of the backoff schedule: bounds, Retry-After as a floor, retries and elapsed
//! time never exceeded, full jitter's spread, determinism for a seed.

use proptest::prelude::*;
use sluice_core::backoff::{Backoff, BackoffPolicy, Jitter, SplitMix64};

fn policy() -> impl Strategy<Value = BackoffPolicy> {
    (
        0u64..2_000,
        0u64..60_000,
        0u32..12,
        0u64..120_000,
        prop_oneof![Just(Jitter::Full), Just(Jitter::Decorrelated)],
    )
        .prop_map(|(base_ms, cap_ms, max_retries, max_elapsed_ms, jitter)| BackoffPolicy {
            base_ms,
            cap_ms,
            max_retries,
            max_elapsed_ms,
            jitter,
        })
}

/// Runs a whole schedule: each attempt takes `attempt_ms`, the server may ask for a wait.
fn run(policy: BackoffPolicy, seed: u64, attempt_ms: u64, retry_after: &[Option<u64>]) -> Vec<(u64, u64)> {
    let mut b = Backoff::new(policy);
    let mut rng = SplitMix64(seed);
    let mut elapsed = 0u64;
    let mut delays = Vec::new();
    for i in 0.. {
        elapsed += attempt_ms;
        let asked = retry_after.get(i % retry_after.len().max(1)).copied().flatten();
        let Some(delay) = b.next_delay(elapsed, asked, &mut rng) else {
            break;
        };
        delays.push((elapsed, delay));
        elapsed += delay;
    }
    delays
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn delays_respect_cap_floor_retries_and_elapsed(
        policy in policy(),
        seed in any::<u64>(),
        attempt_ms in 0u64..5_000,
        retry_after in proptest::collection::vec(proptest::option::of(0u64..40_000), 1..6),
    ) {
        let delays = run(policy, seed, attempt_ms, &retry_after);
        prop_assert!(delays.len() <= policy.max_retries as usize);
        for (i, &(elapsed, delay)) in delays.iter().enumerate() {
            let asked = retry_after[i % retry_after.len()];
            match asked {
                Some(floor) => prop_assert!(delay >= floor, "{delay} < Retry-After {floor}"),
                None => prop_assert!(delay <= policy.cap_ms, "{delay} > cap {}", policy.cap_ms),
            }
            prop_assert!(delay <= policy.cap_ms.max(asked.unwrap_or(0)));
            prop_assert!(elapsed + delay <= policy.max_elapsed_ms, "retry at {} > {}", elapsed + delay, policy.max_elapsed_ms);
            if policy.jitter == Jitter::Decorrelated && asked.is_none() {
                let left = policy.max_elapsed_ms - elapsed;
                prop_assert!(delay >= policy.base_ms.min(policy.cap_ms).min(left));
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule(policy in policy(), seed in any::<u64>(), attempt_ms in 0u64..1_000) {
        prop_assert_eq!(run(policy, seed, attempt_ms, &[None]), run(policy, seed, attempt_ms, &[None]));
    }

    #[test]
    fn retry_after_beyond_max_elapsed_gives_up(policy in policy(), seed in any::<u64>(), elapsed in 0u64..120_000) {
        let mut b = Backoff::new(policy);
        let asked = policy.max_elapsed_ms.saturating_sub(elapsed) + 1;
        prop_assert_eq!(b.next_delay(elapsed, Some(asked), &mut SplitMix64(seed)), None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Full jitter draws uniformly from `[0, min(cap, base·2^n)]`: the mean is half the
    /// ceiling and the draws cover the range.
    #[test]
    fn full_jitter_spreads_uniformly(seed in any::<u64>(), base_ms in 10u64..1_000, retry in 0u32..6) {
        let policy = BackoffPolicy { base_ms, cap_ms: 20_000, max_retries: 10, max_elapsed_ms: u64::MAX, jitter: Jitter::Full };
        let ceiling = (base_ms << retry).min(20_000) as f64;
        let mut rng = SplitMix64(seed);
        let samples = 4_000;
        let (mut sum, mut low, mut high) = (0.0, 0, 0);
        for _ in 0..samples {
            let mut b = Backoff::new(policy);
            for _ in 0..retry {
                b.next_delay(0, None, &mut rng);
            }
            let d = b.next_delay(0, None, &mut rng).expect("within retries") as f64;
            prop_assert!(d <= ceiling);
            sum += d;
            low += usize::from(d < ceiling * 0.1);
            high += usize::from(d > ceiling * 0.9);
        }
        let mean = sum / samples as f64;
        prop_assert!((mean - ceiling / 2.0).abs() <= ceiling * 0.05, "mean {mean} for ceiling {ceiling}");
        // Each tail holds its share of the whole milliseconds `0..=ceiling` (for a small
        // ceiling more than 10 %: 3 of the 22 values of 0..=21 are below 2.1), within five
        // standard deviations of the binomial count (a false alarm about once in 10^4 runs).
        let values = ceiling as u64 + 1;
        let below = (0..values).filter(|&k| (k as f64) < ceiling * 0.1).count() as f64;
        let above = (0..values).filter(|&k| (k as f64) > ceiling * 0.9).count() as f64;
        for (what, count, share) in [("low", low, below / values as f64), ("high", high, above / values as f64)] {
            let expected = samples as f64 * share;
            let sigma = (samples as f64 * share * (1.0 - share)).sqrt();
            prop_assert!(
                (count as f64 - expected).abs() <= 5.0 * sigma,
                "{what} tail: {count} draws, {expected:.0} ± {:.0} expected", 5.0 * sigma
            );
        }
    }
}
