//! Concurrency rules in every store: the Lua script agrees with sluice-core slot for slot
//! (taken, given back, renewed, expired), and under contention from four nodes' worth of
//! clients no store (memory, Redis, Redis Cluster, Redis Sentinel's master) ever has more
//! than the limit in flight, while the limit is used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_core::{Algorithm, Limit, Micros, State};
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{RedisOptions, RedisStore};
use sluice_service::store::Store;
use sluice_testkit::{RedisCluster, RedisOptions as ServerOptions, RedisSentinel, RedisServer};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One step of a trace: after `gap` µs, take a slot, or give back / renew the `pick`th slot
/// held (by core's count), or one that was never held.
#[derive(Debug, Clone, Copy)]
enum Step {
    Take,
    Release(usize),
    Renew(usize),
    Stray,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Take),
        2 => (0usize..16).prop_map(Step::Release),
        2 => (0usize..16).prop_map(Step::Renew),
        1 => Just(Step::Stray),
    ]
}

#[test]
fn lua_agrees_with_core_on_slots_taken_given_back_renewed_and_expired() {
    let server = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(
            &server.url(),
            RedisOptions::new(Duration::from_secs(2)),
        ))
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 400,
        failure_persistence: None,
        ..Config::default()
    });
    let counter = AtomicU64::new(0);
    let trace = (
        1u64..8,
        10u64..500,
        // A gap of u64::MAX is exactly the window: a slot reaches its expiry to the µs.
        proptest::collection::vec((prop_oneof![4 => 0u64..120_000, 1 => Just(u64::MAX)], step()), 1..60),
    );
    runner
        .run(&trace, |(slots, window_ms, steps)| {
            let limit = Limit::builder(Algorithm::Concurrency, slots, Micros::from_ms(window_ms))
                .build()
                .unwrap();
            let key = format!("sluice:{{slots:{}}}", counter.fetch_add(1, Ordering::Relaxed));
            let (mut state, mut now, mut held) = (State::Fresh, 1u64 << 50, Vec::<u64>::new());
            for (i, &(gap, step)) in steps.iter().enumerate() {
                now += if gap == u64::MAX { window_ms * 1_000 } else { gap };
                let at_now = Micros::new(now);
                store.set_clock(Some(at_now));
                let pick = |n: usize| (!held.is_empty()).then(|| n % held.len());
                match step {
                    Step::Take => {
                        let want = limit.decide(&mut state, at_now, 1);
                        let got = rt.block_on(store.decide(&key, &limit, 1)).unwrap();
                        prop_assert_eq!(got.decision, want, "step {} take", i);
                        if want.allowed {
                            held.push(now);
                        }
                    }
                    Step::Release(n) | Step::Renew(n) => {
                        let Some(j) = pick(n) else { continue };
                        let renew = matches!(step, Step::Renew(_));
                        let at = Micros::new(held[j]);
                        let want = if renew {
                            limit.renew(&mut state, at, at_now, 1)
                        } else {
                            limit.release(&mut state, at, 1)
                        };
                        let (found, then) = rt.block_on(store.slots(&key, &limit, at, 1, renew)).unwrap();
                        prop_assert_eq!(found, want, "step {} renew {}", i, renew);
                        prop_assert_eq!(then, at_now);
                        if renew && want > 0 {
                            held[j] = now;
                        } else {
                            held.swap_remove(j);
                        }
                    }
                    Step::Stray => {
                        let at = Micros::new(now - 1);
                        let want = limit.release(&mut state, at, 1);
                        let (found, _) = rt.block_on(store.slots(&key, &limit, at, 1, false)).unwrap();
                        prop_assert_eq!(found, want, "step {} stray", i);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

/// 64 clients over four stores (four nodes) take slots of one key, hold each 2 ms, and
/// give it back; the most in flight at once, and how many requests went through.
async fn in_flight_under_64_clients(stores: Vec<Arc<Store>>, limit: u64) -> (u64, u64) {
    let limit = Limit::builder(Algorithm::Concurrency, limit, Micros::from_secs(30))
        .build()
        .unwrap();
    let (in_flight, most, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for client in 0..64 {
        let store = stores[client % stores.len()].clone();
        let (in_flight, most, done) = (in_flight.clone(), most.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let key = "sluice:{slots:contended}";
            for _ in 0..30 {
                let items = [sluice_service::store::Item {
                    key,
                    part: sluice_core::algorithm::Part {
                        limit: &limit,
                        shadow: false,
                        cost: 1,
                    },
                }];
                let stamp = store.decide_all(&items).await.expect("the store answers")[0];
                if !stamp.decision.allowed {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                // Out of flight before the slot is given back: the count never runs ahead.
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let (found, _) = store.slots(key, &limit, stamp.at, 1, false).await.unwrap();
                assert_eq!(found, 1, "the slot was held until given back");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (most.load(Ordering::SeqCst), done.load(Ordering::Relaxed))
}

async fn redis_stores(url: &str) -> Vec<Arc<Store>> {
    let mut stores = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::connect(url, RedisOptions::new(Duration::from_secs(5)))
            .await
            .unwrap();
        stores.push(Arc::new(Store::Redis(Box::new(store))));
    }
    stores
}

#[test]
fn no_store_has_more_than_the_limit_in_flight_and_each_uses_it() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let sentinel = RedisSentinel::start(&ServerOptions::default());
    runtime().block_on(async {
        let memory = vec![Arc::new(Store::Memory(MemoryStore::new(1_000)))];
        for (name, stores) in [
            ("memory", memory),
            ("redis", redis_stores(&server.url()).await),
            ("redis cluster", redis_stores(&cluster.url()).await),
            ("redis sentinel", redis_stores(&sentinel.url()).await),
        ] {
            let (most, done) = in_flight_under_64_clients(stores, 8).await;
            println!("{name}: at most {most} in flight, {done} requests through");
            assert!(most <= 8, "{name}: {most} in flight against a limit of 8");
            assert_eq!(most, 8, "{name}: 64 clients never filled 8 slots");
            assert!(done >= 100, "{name}: only {done} requests went through");
        }
    });
}
