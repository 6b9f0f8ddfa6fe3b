//! The Redis store against real `redis-server`s: the Lua scripts agree with sluice-core
//! decision for decision (at explicit times, and on Redis's own `TIME`), admit exactly the
//! limit under concurrency (single node and cluster), set TTLs, survive a script flush, and
//! fail fast then recover when Redis dies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_core::{Algorithm, Limit, State};
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::RedisStore;
use sluice_service::store::StoreError;
use sluice_testkit::{RedisCluster, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(500);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
struct Case {
    limit: Limit,
    /// (gap µs, cost, refund this admission afterwards)
    steps: Vec<(u64, u64, bool)>,
    start: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0usize..7,
        1u64..30,
        1u64..3_000,
        0u64..40,
        0u64..2_000,
        1u64 << 40..1u64 << 51,
    )
        .prop_flat_map(|(a, limit, window_ms, burst, max_delay_ms, start)| {
            let (algorithm, shaping) = if a == 6 {
                (Algorithm::LeakyBucket, true)
            } else {
                (Algorithm::ALL[a], false)
            };
            let limit = Limit::builder(algorithm, limit, window_ms * 1000)
                .burst(burst)
                .shaping(shaping.then_some(max_delay_ms * 1000))
                .build()
                .unwrap();
            let gap = 0..(window_ms * 1000 / 3).max(2);
            proptest::collection::vec((gap, 1u64..4, proptest::bool::weighted(0.1)), 1..40)
                .prop_map(move |steps| Case { limit, steps, start })
        })
}

#[test]
fn lua_scripts_agree_with_core_on_random_traces() {
    let server = RedisServer::start();
    let rt = runtime();
    let store = rt.block_on(RedisStore::connect(&server.url(), TIMEOUT)).unwrap();
    let counter = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 1_500,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&case(), |c| {
            let key = format!("sluice:{{diff:{}}}", counter.fetch_add(1, Ordering::Relaxed));
            let mut state = State::Fresh;
            let mut now = c.start;
            for (i, &(gap, cost, refund)) in c.steps.iter().enumerate() {
                now += gap;
                let want = c.limit.decide(&mut state, now, cost);
                let got = rt.block_on(store.decide_at(&key, &c.limit, cost, Some(now))).unwrap();
                prop_assert_eq!(got.at, now);
                prop_assert_eq!(got.decision, want, "step {} of {:?} at {}", i, c.limit, now);
                if refund && want.allowed {
                    c.limit.refund(&mut state, now, cost);
                    rt.block_on(store.refund(&key, &c.limit, now, cost)).unwrap();
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Window of the Redis-clock case: 2 per 4 s, one unit of quota every 2 s. Burst A starts
/// 2 s into a window, burst B 3 s after A (1 s into the next window), so every point where
/// a decision changes (a unit of refill, a window edge, a log entry's expiry, the shaping
/// limit) is at least 0.5 s away from both bursts: the few ms between Redis's `TIME` and the
/// memory store's clock cannot change a decision, while B still depends on the time since A.
const CLOCK_WINDOW_US: u64 = 4_000_000;

/// Every algorithm, and the leaky bucket shaping (capacity 1, at most 2.5 s of delay).
fn redis_clock_limits() -> Vec<Limit> {
    let mut limits: Vec<Limit> = Algorithm::ALL
        .iter()
        .map(|&a| Limit::builder(a, 2, CLOCK_WINDOW_US).build().unwrap())
        .collect();
    limits.push(
        Limit::builder(Algorithm::LeakyBucket, 2, CLOCK_WINDOW_US)
            .burst(1)
            .shaping(Some(2_500_000))
            .build()
            .unwrap(),
    );
    limits
}

/// Sleeps until the wall clock is `offset` µs into a `CLOCK_WINDOW_US` window.
fn sleep_until_window_offset(offset: u64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
    let wait = (offset + CLOCK_WINDOW_US - now % CLOCK_WINDOW_US) % CLOCK_WINDOW_US;
    std::thread::sleep(Duration::from_micros(wait));
}

type Decisions = Vec<(bool, u64)>;

/// Three quick requests per limit, each decided by Redis on its `TIME` and right after by
/// the memory store on its clock; appends (allowed, remaining) to `redis` and `memory`.
fn burst(
    rt: &tokio::runtime::Runtime,
    stores: (&RedisStore, &MemoryStore),
    redis: &mut [Decisions],
    memory: &mut [Decisions],
) {
    for (i, limit) in redis_clock_limits().iter().enumerate() {
        let key = format!("sluice:{{time:{i}}}");
        for _ in 0..3 {
            let got = rt.block_on(stores.0.decide(&key, limit, 1)).unwrap().decision;
            let want = stores.1.decide(&key, limit, 1).decision;
            redis[i].push((got.allowed, got.remaining));
            memory[i].push((want.allowed, want.remaining));
        }
    }
}

#[test]
fn lua_scripts_on_redis_time_agree_with_the_memory_store() {
    let server = RedisServer::start();
    let rt = runtime();
    let store = rt.block_on(RedisStore::connect(&server.url(), TIMEOUT)).unwrap();
    let local = MemoryStore::new(1_000);
    let limits = redis_clock_limits();
    let (mut redis, mut memory) = (vec![Vec::new(); limits.len()], vec![Vec::new(); limits.len()]);
    sleep_until_window_offset(2_000_000);
    let a = Instant::now();
    burst(&rt, (&store, &local), &mut redis, &mut memory);
    std::thread::sleep((a + Duration::from_secs(3)).saturating_duration_since(Instant::now()));
    burst(&rt, (&store, &local), &mut redis, &mut memory);
    for (limit, (got, want)) in limits.iter().zip(redis.iter().zip(&memory)) {
        assert_eq!(
            got, want,
            "{limit:?}: (allowed, remaining) on Redis TIME vs the memory store"
        );
    }
    // The scenario went as planned: the token bucket refilled one unit between the bursts.
    let tb = [(true, 1), (true, 0), (false, 0), (true, 0), (false, 0), (false, 0)];
    assert_eq!(memory[0], tb, "token bucket on the memory store");
}

/// 4 stores (separate connections, as 4 nodes) × 16 clients each hammer one key.
async fn admitted_by_64_clients(url: &str, algorithm: Algorithm, key: &str) -> u64 {
    let limit = Limit::builder(algorithm, 1_000, 86_400_000_000).build().unwrap();
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(
            RedisStore::connect(url, Duration::from_secs(5)).await.unwrap(),
        ));
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in 0..64 {
        let store = stores[client % 4].clone();
        let admitted = admitted.clone();
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let s = store.decide(&key, &limit, 1).await.expect("redis answers");
                if s.decision.allowed {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

const EXACT: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
];

#[test]
fn exactly_the_limit_is_admitted_under_concurrency_on_one_redis() {
    let server = RedisServer::start();
    runtime().block_on(async {
        for a in EXACT {
            let n = admitted_by_64_clients(&server.url(), a, &format!("sluice:{{atom:{a}}}")).await;
            assert_eq!(n, 1_000, "{a}: 1,600 attempts on a limit of 1,000");
        }
    });
}

#[test]
fn exactly_the_limit_is_admitted_under_concurrency_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    runtime().block_on(async {
        for a in EXACT {
            let n = admitted_by_64_clients(&cluster.url(), a, &format!("sluice:{{atom:{a}}}")).await;
            assert_eq!(n, 1_000, "{a} on the cluster");
        }
    });
}

#[test]
fn every_key_gets_a_ttl_and_a_script_flush_is_survived() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url(), TIMEOUT).await.unwrap();
        for a in Algorithm::ALL {
            let limit = Limit::builder(a, 5, 60_000_000).build().unwrap();
            assert!(
                store
                    .decide(&format!("sluice:{{ttl:{a}}}"), &limit, 1)
                    .await
                    .unwrap()
                    .decision
                    .allowed
            );
        }
        let keys = server.cli(&["--scan", "--pattern", "sluice:*"]);
        assert!(keys.lines().count() >= 6, "{keys}");
        for key in keys.lines() {
            let ttl: i64 = server.cli(&["pttl", key]).trim().parse().unwrap();
            assert!(ttl > 0 && ttl <= 120_000, "{key} has pttl {ttl}");
        }
        server.cli(&["script", "flush"]);
        let limit = Limit::builder(Algorithm::Gcra, 5, 60_000_000).build().unwrap();
        assert!(
            store.decide("sluice:{after-flush}", &limit, 1).await.is_ok(),
            "NOSCRIPT not recovered"
        );
    });
}

#[test]
fn a_dead_redis_fails_fast_and_a_restarted_one_is_used_again() {
    let mut server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url(), Duration::from_millis(200))
            .await
            .unwrap();
        let limit = Limit::builder(Algorithm::FixedWindow, 100, 60_000_000).build().unwrap();
        assert!(store.decide("sluice:{k}", &limit, 1).await.is_ok());
        server.stop();
        let started = std::time::Instant::now();
        let err = store.decide("sluice:{k}", &limit, 1).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
        // Bounded by the timeouts (connect + response, one retry), not hanging: a hang guard, not a threshold.
        assert!(started.elapsed() < Duration::from_secs(10));
        server.restart();
        let mut recovered = false;
        for _ in 0..50 {
            if store.decide("sluice:{k}", &limit, 1).await.is_ok() {
                recovered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(recovered, "store did not reconnect to the restarted Redis");
    });
}
