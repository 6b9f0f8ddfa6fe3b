//! Worked examples for each algorithm; the promises on random traces are in
//! `core/tests/algorithm_props.rs`.

use super::*;

const SEC: Micros = Micros::SECOND;

fn limit(algorithm: Algorithm, n: u64, window: Micros) -> Limit {
    Limit::builder(algorithm, n, window).build().unwrap()
}

#[test]
fn every_algorithm_admits_the_limit_then_denies() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 5, 10 * SEC);
        let mut s = State::Fresh;
        for i in 0..5 {
            let d = l.decide(&mut s, 100 * SEC, 1);
            assert!(d.allowed, "{algorithm}: request {i} denied");
            assert_eq!(d.remaining, 4 - i, "{algorithm}: remaining after {i}");
        }
        let d = l.decide(&mut s, 100 * SEC, 1);
        assert!(!d.allowed, "{algorithm}: sixth request admitted");
        assert_eq!(d.remaining, 0);
        assert!(d.retry_after > Micros::ZERO, "{algorithm}: denial without retry_after");
    }
}

#[test]
fn token_bucket_refills_at_limit_per_window() {
    let l = limit(Algorithm::TokenBucket, 10, SEC); // one token per 100ms
    let mut s = State::Fresh;
    for _ in 0..10 {
        assert!(l.decide(&mut s, Micros::ZERO, 1).allowed);
    }
    let d = l.decide(&mut s, Micros::ZERO, 1);
    assert_eq!(d.retry_after, Micros::new(100_000));
    assert!(!l.decide(&mut s, Micros::new(99_999), 1).allowed);
    assert!(l.decide(&mut s, Micros::new(100_000), 1).allowed);
}

#[test]
fn gcra_burst_is_capacity_and_interval_is_window_over_limit() {
    let l = Limit::builder(Algorithm::Gcra, 60, 60 * SEC).burst(3).build().unwrap();
    let mut s = State::Fresh;
    for _ in 0..3 {
        assert!(l.decide(&mut s, Micros::ZERO, 1).allowed);
    }
    let d = l.decide(&mut s, Micros::ZERO, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, SEC);
    assert_eq!(d.reset_after, 3 * SEC);
}

#[test]
fn shaping_leaky_bucket_delays_up_to_max_delay() {
    let l = Limit::builder(Algorithm::LeakyBucket, 10, SEC)
        .burst(1)
        .shaping(Some(Micros::new(250_000)))
        .build()
        .unwrap();
    let mut s = State::Fresh;
    let delays: Vec<_> = (0..5).map(|_| l.decide(&mut s, Micros::ZERO, 1)).collect();
    // One passes at once, the next two wait 100ms and 200ms; 300ms would exceed max_delay.
    assert_eq!(
        delays.iter().map(|d| d.allowed).collect::<Vec<_>>(),
        [true, true, true, false, false]
    );
    assert_eq!(
        delays.iter().map(|d| d.delay).collect::<Vec<_>>(),
        [0, 100_000, 200_000, 0, 0].map(Micros::new)
    );
    assert_eq!(delays[3].retry_after, Micros::new(50_000));
}

#[test]
fn fixed_window_resets_at_the_aligned_boundary() {
    let l = limit(Algorithm::FixedWindow, 2, SEC);
    let mut s = State::Fresh;
    assert!(l.decide(&mut s, Micros::new(1_700_000), 1).allowed);
    assert!(l.decide(&mut s, Micros::new(1_700_000), 1).allowed);
    let d = l.decide(&mut s, Micros::new(1_700_000), 1);
    assert_eq!(
        (d.allowed, d.retry_after, d.reset_after),
        (false, Micros::new(300_000), Micros::new(300_000))
    );
    assert!(l.decide(&mut s, Micros::from_secs(2), 1).allowed);
}

#[test]
fn sliding_window_log_frees_the_oldest_entry_first() {
    let l = limit(Algorithm::SlidingWindowLog, 2, SEC);
    let mut s = State::Fresh;
    assert!(l.decide(&mut s, Micros::ZERO, 1).allowed);
    assert!(l.decide(&mut s, Micros::new(400_000), 1).allowed);
    let d = l.decide(&mut s, Micros::new(500_000), 1);
    assert_eq!((d.allowed, d.retry_after), (false, Micros::new(500_000)));
    assert!(l.decide(&mut s, Micros::SECOND, 1).allowed);
    assert!(!l.decide(&mut s, Micros::SECOND, 1).allowed);
}

#[test]
fn sliding_window_counter_weights_the_previous_window() {
    let l = limit(Algorithm::SlidingWindowCounter, 10, SEC);
    let mut s = State::Fresh;
    for _ in 0..10 {
        assert!(l.decide(&mut s, Micros::new(500_000), 1).allowed);
    }
    // At 1.25s the previous window (10) still weighs 75%: 7.5 + 1 <= 10 passes twice.
    assert!(l.decide(&mut s, Micros::new(1_250_000), 1).allowed);
    assert!(l.decide(&mut s, Micros::new(1_250_000), 1).allowed);
    let d = l.decide(&mut s, Micros::new(1_250_000), 1);
    assert!(!d.allowed);
    // 10 × (1000 − e) / 1000 + 2 + 1 ≤ 10  ⇔  e ≥ 300ms.
    assert_eq!(d.retry_after, Micros::new(50_000));
}

#[test]
fn refund_gives_back_what_was_taken() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 3, SEC);
        let mut s = State::Fresh;
        for _ in 0..3 {
            assert!(l.decide(&mut s, Micros::new(10), 1).allowed);
        }
        l.refund(&mut s, Micros::new(10), 1);
        assert!(
            l.decide(&mut s, Micros::new(10), 1).allowed,
            "{algorithm}: refund did not free a unit"
        );
        assert!(
            !l.decide(&mut s, Micros::new(10), 1).allowed,
            "{algorithm}: refund freed too much"
        );
    }
}

#[test]
fn a_cost_above_capacity_is_always_denied() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 3, SEC);
        let mut s = State::Fresh;
        assert!(!l.decide(&mut s, Micros::ZERO, 4).allowed, "{algorithm}");
        let untouched = match &s {
            State::Log { entries, .. } => entries.is_empty(),
            other => *other == State::Fresh,
        };
        assert!(untouched, "{algorithm}: denial changed state to {s:?}");
    }
}

#[test]
fn state_expires_once_the_quota_is_whole_again() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 4, SEC);
        let mut s = State::Fresh;
        l.decide(&mut s, 5 * SEC + Micros::new(1_000), 2);
        let ttl = l.expires_after(&s, 5 * SEC + Micros::new(1_000));
        assert!(ttl > Micros::ZERO && ttl <= 2 * SEC, "{algorithm}: ttl {ttl:?}");
        let mut fresh = State::Fresh;
        let later = 5 * SEC + Micros::new(1_000) + ttl;
        assert_eq!(
            l.decide(&mut s, later, 1).remaining,
            l.decide(&mut fresh, later, 1).remaining,
            "{algorithm}"
        );
    }
}

#[test]
fn invalid_limits_are_rejected_with_the_field() {
    assert_eq!(
        Limit::builder(Algorithm::Gcra, 0, SEC).build(),
        Err(LimitError::ZeroLimit)
    );
    assert_eq!(
        Limit::builder(Algorithm::Gcra, 1, Micros::new(1_500)).build(),
        Err(LimitError::BadWindow)
    );
    assert!(matches!(
        Limit::builder(Algorithm::Gcra, 2_000, Micros::new(1_000)).build(),
        Err(LimitError::TooFast { .. })
    ));
    let e = Limit::builder(Algorithm::SlidingWindowCounter, 1 << 30, 86_400 * SEC)
        .build()
        .unwrap_err();
    assert!(matches!(e, LimitError::TooLarge { field: "limit", .. }), "{e}");
    // Round numbers stay valid thanks to the gcd scaling: a million a day.
    assert!(Limit::builder(Algorithm::TokenBucket, 1_000_000, 86_400 * SEC)
        .build()
        .is_ok());
}

#[test]
fn algorithm_names_round_trip() {
    for a in Algorithm::ALL {
        assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
    }
    assert!("tokenbucket"
        .parse::<Algorithm>()
        .unwrap_err()
        .to_string()
        .contains("token_bucket"));
}

#[test]
fn a_state_with_remaining_units_admits_exactly_those_and_a_peek_says_so() {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 50, 3_600 * SEC);
        for remaining in [0, 1, 7, 49, 50, 80] {
            let mut s = l.with_remaining(remaining, 100 * SEC);
            let left = remaining.min(50);
            assert_eq!(
                l.peek(&s, 100 * SEC).remaining,
                left,
                "{algorithm}: peek of {remaining}"
            );
            for i in 0..left {
                assert!(
                    l.decide(&mut s, 100 * SEC, 1).allowed,
                    "{algorithm}: {i} of {left} denied"
                );
            }
            assert!(
                !l.decide(&mut s, 100 * SEC, 1).allowed,
                "{algorithm}: more than {left} admitted"
            );
        }
    }
}
