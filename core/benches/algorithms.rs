//! ns per `decide` for every algorithm, on a key that admits and on a key that denies; and a
//! `StateMap` at its bound taking a flood of new keys (the filter's local buckets under a
//! spray of client addresses).

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use sluice_core::{Algorithm, Limit, Micros, State, StateMap};

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for algorithm in Algorithm::ALL {
        // Admitting: a limit so high that the steady 1µs-apart stream always passes.
        let open = Limit::builder(algorithm, 1_000_000, Micros::from_secs(1_000))
            .build()
            .unwrap();
        let mut state = State::Fresh;
        let mut now = Micros::from_secs(1_700_000_000);
        group.bench_function(format!("{algorithm}/allow"), |b| {
            b.iter(|| {
                now += Micros::MILLISECOND;
                black_box(open.decide(&mut state, black_box(now), 1))
            })
        });
        // Denying: the quota is spent and time stands still.
        let tight = Limit::builder(algorithm, 10, Micros::from_secs(60)).build().unwrap();
        let mut state = State::Fresh;
        for _ in 0..10 {
            tight.decide(&mut state, Micros::from_secs(5), 1);
        }
        group.bench_function(format!("{algorithm}/deny"), |b| {
            b.iter(|| black_box(tight.decide(&mut state, black_box(Micros::from_secs(5)), 1)))
        });
    }
    group.finish();
}

/// A new key into a full map of live states (all keys decided within the same millisecond,
/// as a flood on a millisecond clock is): the cost of making room, per key.
fn new_key_at_the_bound(c: &mut Criterion) {
    let mut group = c.benchmark_group("state_map");
    let limit = Limit::builder(Algorithm::TokenBucket, 200, Micros::SECOND)
        .burst(400)
        .build()
        .unwrap();
    for max in [10_000usize, 100_000] {
        let mut map = StateMap::new(max);
        for i in 0..max {
            map.decide(&format!("10.0.{i}"), &limit, 1, Micros::MILLISECOND);
        }
        let mut next = 0u64;
        group.bench_function(format!("new_key_at_the_bound/{max}"), |b| {
            b.iter_batched(
                || {
                    next += 1;
                    format!("11.0.{next}")
                },
                |key| black_box(map.decide(&key, &limit, 1, Micros::from_ms(2))),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, decide, new_key_at_the_bound);
criterion_main!(benches);
