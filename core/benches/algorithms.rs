//! ns per `decide` for every algorithm, on a key that admits and on a key that denies.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_core::{Algorithm, Limit, State};

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for algorithm in Algorithm::ALL {
        // Admitting: a limit so high that the steady 1µs-apart stream always passes.
        let open = Limit::builder(algorithm, 1_000_000, 1_000_000_000).build().unwrap();
        let mut state = State::Fresh;
        let mut now = 1_700_000_000_000_000u64;
        group.bench_function(format!("{algorithm}/allow"), |b| {
            b.iter(|| {
                now += 1_000;
                black_box(open.decide(&mut state, black_box(now), 1))
            })
        });
        // Denying: the quota is spent and time stands still.
        let tight = Limit::builder(algorithm, 10, 60_000_000).build().unwrap();
        let mut state = State::Fresh;
        for _ in 0..10 {
            tight.decide(&mut state, 5_000_000, 1);
        }
        group.bench_function(format!("{algorithm}/deny"), |b| {
            b.iter(|| black_box(tight.decide(&mut state, black_box(5_000_000), 1)))
        });
    }
    group.finish();
}

criterion_group!(benches, decide);
criterion_main!(benches);
