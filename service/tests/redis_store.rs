//! The Redis store against real `redis-server`s: the Lua script agrees with sluice-core
//! decision for decision (one rule at explicit times and on Redis's own `TIME`; several
//! rules all-or-nothing, on one node and across cluster slots; a batch of one key's checks
//! on Redis's clock), a check is one script call
//! per slot, exactly the limit is admitted under concurrency (single node and cluster),
//! every key gets a TTL, a script flush is survived, and a dead Redis fails fast then
//! recovers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_core::algorithm::{decide_all, Part};
use sluice_core::{Algorithm, Limit, Micros, State};
use sluice_service::store::memory::MemoryStore;
use sluice_service::store::redis::{Engine, RedisOptions, RedisStore};
use sluice_service::store::{keys, Item, StoreError};
use sluice_testkit::{reset_stats, script_calls, RedisCluster, RedisServer};

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

/// A Redis of its own, a runtime, and a store connected to that Redis.
fn started() -> (RedisServer, tokio::runtime::Runtime, RedisStore) {
    let server = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url(), RedisOptions::new(TIMEOUT)))
        .unwrap();
    (server, rt, store)
}

/// Any limit of any algorithm (index 7: the leaky bucket shaping), and its window in µs.
fn limit() -> impl Strategy<Value = Limit> {
    limit_of(1..3_000)
}

/// [`limit`], its window `window_ms` long.
fn limit_of(window_ms: std::ops::Range<u64>) -> impl Strategy<Value = Limit> {
    (0usize..8, 1u64..30, window_ms, 0u64..40, 0u64..2_000).prop_map(|(a, limit, window_ms, burst, max_delay_ms)| {
        let (algorithm, shaping) = if a == 7 {
            (Algorithm::LeakyBucket, true)
        } else {
            (Algorithm::ALL[a], false)
        };
        Limit::builder(algorithm, limit, Micros::from_ms(window_ms))
            .burst(burst)
            .shaping(shaping.then_some(Micros::from_ms(max_delay_ms)))
            .build()
            .unwrap()
    })
}

fn case() -> impl Strategy<Value = Case> {
    (limit(), 1u64 << 40..1u64 << 51).prop_flat_map(|(limit, start)| {
        let gap = 0..(limit.window().as_u64() / 3).max(2);
        proptest::collection::vec((gap, 1u64..4, proptest::bool::weighted(0.1)), 1..40).prop_map(move |steps| Case {
            limit,
            steps,
            start,
        })
    })
}

/// The store's options for each way Redis runs the check: as Functions (Redis 7), and as
/// the script (Redis 6, or a user without the right to load Functions).
fn engines() -> [(Engine, RedisOptions); 2] {
    [
        (Engine::Functions, RedisOptions::new(TIMEOUT)),
        (
            Engine::Script,
            RedisOptions {
                script_only: true,
                ..RedisOptions::new(TIMEOUT)
            },
        ),
    ]
}

#[test]
fn lua_agrees_with_core_on_random_traces_as_functions_and_as_the_script() {
    let server = RedisServer::start();
    let rt = runtime();
    for (engine, options) in engines() {
        let store = rt.block_on(RedisStore::connect(&server.url(), options)).unwrap();
        assert_eq!(store.engine(), Some(engine));
        lua_agrees_with_core_on_random_traces(&rt, &store, engine);
    }
}

fn lua_agrees_with_core_on_random_traces(rt: &tokio::runtime::Runtime, store: &RedisStore, engine: Engine) {
    let counter = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 1_500,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&case(), |c| {
            let key = format!("sluice:{{diff:{engine:?}:{}}}", counter.fetch_add(1, Ordering::Relaxed));
            let mut state = State::Fresh;
            let mut now = c.start;
            for (i, &(gap, cost, refund)) in c.steps.iter().enumerate() {
                now += gap;
                let want = c.limit.decide(&mut state, Micros::new(now), cost);
                store.set_clock(Some(Micros::new(now)));
                let got = rt.block_on(store.decide(&key, &c.limit, cost)).unwrap();
                prop_assert_eq!(got.at, Micros::new(now));
                prop_assert_eq!(got.decision, want, "step {} of {:?} at {}", i, c.limit, now);
                if refund && want.allowed {
                    c.limit.refund(&mut state, Micros::new(now), cost);
                    rt.block_on(store.refund(&key, &c.limit, Micros::new(now), cost))
                        .unwrap();
                }
            }
            Ok(())
        })
        .unwrap();
}

/// The same decisions in an order of its own, sorted.
fn sorted(mut decisions: Vec<sluice_core::Decision>) -> Vec<sluice_core::Decision> {
    decisions.sort_by_key(|d| (d.allowed, d.remaining, d.reset_after, d.retry_after, d.delay));
    decisions
}

/// A hot key's checks batched into one call decide as core decides them in turn (the
/// batched path: one `MGET` for the call, the key's state cached between its checks, written
/// once at the end). Batches form only on Redis's clock, so each step sends `n` checks of
/// one key at once (the first goes alone, the others wait for it and go as one batch) and
/// core replays them at the times their calls were decided (each answer's `at`), call after
/// call; the answers are the same, in some order within a call. Steps a few milliseconds
/// apart cross the short windows.
#[test]
fn a_batch_of_one_keys_checks_decides_as_core_does_in_turn() {
    let (_server, rt, store) = started();
    assert_eq!(store.engine(), Some(Engine::Functions));
    let (counter, batched) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut runner = TestRunner::new(Config {
        cases: 120,
        failure_persistence: None,
        ..Config::default()
    });
    let case = (
        limit_of(1..40),
        proptest::collection::vec((0u64..4, 1u64..3, 2usize..7), 1..10),
    );
    runner
        .run(&case, |(limit, steps)| {
            let key = format!("sluice:{{hot:{}}}", counter.fetch_add(1, Ordering::Relaxed));
            let mut state = State::Fresh;
            for (i, &(gap_ms, cost, n)) in steps.iter().enumerate() {
                std::thread::sleep(Duration::from_millis(gap_ms));
                let answers = rt.block_on(futures_util::future::join_all(
                    (0..n).map(|_| store.decide(&key, &limit, cost)),
                ));
                let mut got: Vec<_> = answers.into_iter().collect::<Result<_, _>>().unwrap();
                got.sort_by_key(|s| s.at);
                for call in got.chunk_by(|a, b| a.at == b.at) {
                    batched.fetch_add(u64::from(call.len() > 1), Ordering::Relaxed);
                    let want: Vec<_> = call.iter().map(|s| limit.decide(&mut state, s.at, cost)).collect();
                    let got: Vec<_> = call.iter().map(|s| s.decision).collect();
                    prop_assert_eq!(
                        sorted(got),
                        sorted(want),
                        "step {} of {:?} at {:?}",
                        i,
                        limit,
                        call[0].at
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    assert!(batched.load(Ordering::Relaxed) > 100, "too few batches to tell");
}

/// Several rules (some shadow) and one trace of (gap µs, cost) checks against all of them.
#[derive(Debug, Clone)]
struct MultiCase {
    rules: Vec<(Limit, bool)>,
    steps: Vec<(u64, u64)>,
    start: u64,
}

fn multi_case() -> impl Strategy<Value = MultiCase> {
    (
        proptest::collection::vec((limit(), proptest::bool::weighted(0.25)), 1..5),
        proptest::collection::vec((0u64..1_000_000, 1u64..4), 1..30),
        1u64 << 40..1u64 << 51,
    )
        .prop_map(|(rules, steps, start)| MultiCase { rules, steps, start })
}

/// Runs `cases` random multi-rule traces through `store` and through core's `decide_all`;
/// rule `j` of case `n` is keyed by `key(n, j)`.
fn several_rules_agree_with_core(
    rt: &tokio::runtime::Runtime,
    store: &RedisStore,
    cases: u32,
    key: impl Fn(u64, usize) -> String,
) {
    let counter = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&multi_case(), |c| {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let keys: Vec<String> = (0..c.rules.len()).map(|j| key(n, j)).collect();
            let mut states = vec![State::Fresh; c.rules.len()];
            let mut now = c.start;
            for (i, &(gap, cost)) in c.steps.iter().enumerate() {
                now += gap;
                // Each rule at a cost of its own (rule j: cost + j), as gRPC descriptors may ask.
                let parts: Vec<Part<'_>> = c
                    .rules
                    .iter()
                    .enumerate()
                    .map(|(j, (limit, shadow))| Part {
                        limit,
                        shadow: *shadow,
                        cost: cost + j as u64,
                    })
                    .collect();
                let items: Vec<Item<'_>> = keys
                    .iter()
                    .zip(&parts)
                    .map(|(key, part)| Item { key, part: *part })
                    .collect();
                let want = decide_all(&parts, &mut states, Micros::new(now));
                store.set_clock(Some(Micros::new(now)));
                let got = rt.block_on(store.decide_all(&items)).unwrap();
                let got: Vec<_> = got.iter().map(|s| s.decision).collect();
                prop_assert_eq!(got, want, "step {} at {}", i, now);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn one_call_decides_several_rules_as_core_does_on_random_traces() {
    let server = RedisServer::start();
    let rt = runtime();
    for (engine, options) in engines() {
        let store = rt.block_on(RedisStore::connect(&server.url(), options)).unwrap();
        several_rules_agree_with_core(&rt, &store, 300, |n, j| {
            keys::limit(&format!("r{j}"), &format!("multi-{n}-{engine:?}"))
        });
    }
}

#[test]
fn rules_in_several_cluster_slots_decide_as_core_does_refunds_included() {
    let cluster = RedisCluster::start(3, 0);
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(&cluster.url(), RedisOptions::new(TIMEOUT)))
        .unwrap();
    // Each rule limits another identity, so a case's rules land in up to four slots, and a
    // denial in one slot is undone by refunds in the others.
    several_rules_agree_with_core(&rt, &store, 150, |n, j| keys::limit("r", &format!("multi-{n}-{j}")));
}

#[test]
fn a_check_is_one_round_trip_however_many_rules_and_a_denial_consumes_nothing() {
    let server = RedisServer::start();
    let port = [server.port()];
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url(), RedisOptions::new(TIMEOUT))
            .await
            .unwrap();
        let day = Micros::from_secs(86_400);
        let wide = Limit::builder(Algorithm::SlidingWindowLog, 100, day).build().unwrap();
        let narrow = Limit::builder(Algorithm::FixedWindow, 10, day).build().unwrap();
        let bucket = Limit::builder(Algorithm::TokenBucket, 50, day).build().unwrap();
        let (k_wide, k_narrow, k_other, k_bucket) = (
            keys::limit("wide", "ip"),
            keys::limit("narrow", "ip"),
            keys::limit("narrow", "other"),
            keys::limit("bucket", "ip"),
        );
        let item = |key, limit| Item {
            key,
            part: Part {
                limit,
                shadow: false,
                cost: 1,
            },
        };
        let three = [item(&k_wide, &wide), item(&k_narrow, &narrow), item(&k_bucket, &bucket)];
        store.decide_all(&three[..1]).await.unwrap(); // loads the script
        reset_stats(&port);
        let mut admitted = 0;
        for _ in 0..30 {
            let stamps = store.decide_all(&three).await.unwrap();
            admitted += u32::from(stamps.iter().all(|s| s.decision.allowed));
        }
        assert_eq!(admitted, 10, "the narrow rule admits 10");
        assert_eq!(script_calls(&port), 30, "one script call per check, denials included");
        // The 20 denials took nothing from the wide rule: 89 more pass with another narrow key.
        let two = [item(&k_wide, &wide), item(&k_other, &narrow)];
        let mut passed = 0;
        for _ in 0..100 {
            passed += u32::from(store.decide_all(&two[..1]).await.unwrap()[0].decision.allowed);
        }
        assert_eq!(
            passed, 89,
            "what the wide rule had left after 10 (+1 loading) admissions"
        );
    });
}

#[test]
fn a_cluster_check_is_one_call_per_slot_and_hashes_slots_as_redis_does() {
    let cluster = RedisCluster::start(3, 0);
    let ports = cluster.master_ports();
    for key in [
        keys::limit("per-ip", "203.0.113.9"),
        keys::limit("r", "a}b{c"),
        "no-tag".to_owned(),
    ] {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &ports[0].to_string(), "cluster", "keyslot", &key])
            .output()
            .expect("redis-cli runs");
        let redis: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(keys::slot(&key), redis, "{key}");
    }
    runtime().block_on(async {
        let store = RedisStore::connect(&cluster.url(), RedisOptions::new(TIMEOUT))
            .await
            .unwrap();
        let limit = Limit::builder(Algorithm::Gcra, 1_000, Micros::from_secs(86_400))
            .build()
            .unwrap();
        let (a, b, c) = (
            keys::limit("a", "alice"),
            keys::limit("b", "alice"),
            keys::limit("c", "bob"),
        );
        assert_ne!(keys::slot(&a), keys::slot(&c));
        let item = |key| Item {
            key,
            part: Part {
                limit: &limit,
                shadow: false,
                cost: 1,
            },
        };
        for items in [[item(&a), item(&b)], [item(&a), item(&c)]] {
            store.decide_all(&items).await.unwrap(); // loads the script on each master
        }
        reset_stats(&ports);
        for _ in 0..10 {
            store.decide_all(&[item(&a), item(&b)]).await.unwrap();
        }
        assert_eq!(script_calls(&ports), 10, "one identity's rules: one slot, one call");
        for _ in 0..10 {
            store.decide_all(&[item(&a), item(&b), item(&c)]).await.unwrap();
        }
        assert_eq!(script_calls(&ports), 30, "two identities: two slots, two calls");
    });
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
        .map(|&a| Limit::builder(a, 2, Micros::new(CLOCK_WINDOW_US)).build().unwrap())
        .collect();
    limits.push(
        Limit::builder(Algorithm::LeakyBucket, 2, Micros::new(CLOCK_WINDOW_US))
            .burst(1)
            .shaping(Some(Micros::new(2_500_000)))
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
            let item = Item {
                key: &key,
                part: Part {
                    limit,
                    shadow: false,
                    cost: 1,
                },
            };
            let want = stores.1.decide_all(&[item])[0].decision;
            redis[i].push((got.allowed, got.remaining));
            memory[i].push((want.allowed, want.remaining));
        }
    }
}

#[test]
fn lua_scripts_on_redis_time_agree_with_the_memory_store() {
    let (_server, rt, store) = started();
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

/// 4 stores on separate connections, as 4 service nodes would have.
async fn four_nodes(url: &str) -> Vec<Arc<RedisStore>> {
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(
            RedisStore::connect(url, RedisOptions::new(Duration::from_secs(5)))
                .await
                .unwrap(),
        ));
    }
    stores
}

/// 4 stores (separate connections, as 4 nodes) × 16 clients each hammer one key.
async fn admitted_by_64_clients(url: &str, algorithm: Algorithm, key: &str) -> u64 {
    let limit = Limit::builder(algorithm, 1_000, Micros::from_secs(86_400))
        .build()
        .unwrap();
    let stores = four_nodes(url).await;
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

/// 4 stores × 16 clients, each client a user with its own rule (20 a day) sharing one IP
/// rule (1,000 a day), 25 tries each: 1,280 requests the user rules would admit. Returns
/// how many passed both and what the IP rule has left afterwards.
async fn two_rules_under_64_clients(url: &str) -> (u64, u64) {
    let day = Micros::from_secs(86_400);
    let shared = Limit::builder(Algorithm::SlidingWindowLog, 1_000, day).build().unwrap();
    let per_user = Limit::builder(Algorithm::FixedWindow, 20, day).build().unwrap();
    let stores = four_nodes(url).await;
    let passed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in 0..64 {
        let store = stores[client % 4].clone();
        let passed = passed.clone();
        tasks.push(tokio::spawn(async move {
            let (ip, user) = (
                keys::limit("ip", "10.0.0.1"),
                keys::limit("user", &format!("u{client}")),
            );
            let items = [
                Item {
                    key: &ip,
                    part: Part {
                        limit: &shared,
                        shadow: false,
                        cost: 1,
                    },
                },
                Item {
                    key: &user,
                    part: Part {
                        limit: &per_user,
                        shadow: false,
                        cost: 1,
                    },
                },
            ];
            for _ in 0..25 {
                let stamps = store.decide_all(&items).await.expect("redis answers");
                if stamps.iter().all(|s| s.decision.allowed) {
                    passed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let probe = stores[0]
        .decide(&keys::limit("ip", "10.0.0.1"), &shared, 1)
        .await
        .unwrap();
    let left = probe.decision.remaining + u64::from(probe.decision.allowed);
    (passed.load(Ordering::Relaxed), left)
}

#[test]
fn two_rules_stay_all_or_nothing_under_concurrency_on_one_redis_and_a_cluster() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    runtime().block_on(async {
        let (passed, left) = two_rules_under_64_clients(&server.url()).await;
        assert_eq!((passed, left), (1_000, 0), "one Redis: exactly the shared limit");
        // On a cluster the two rules are two slots: a request the user rule denies is
        // refunded on the IP rule, and meanwhile may make another wait (never over-admit).
        let (passed, left) = two_rules_under_64_clients(&cluster.url()).await;
        assert!(passed <= 1_000, "cluster admitted {passed}");
        assert_eq!(left, 1_000 - passed, "every denied request was refunded");
    });
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
    let port = [server.port()];
    runtime().block_on(async {
        for a in EXACT {
            reset_stats(&port);
            let n = admitted_by_64_clients(&server.url(), a, &format!("sluice:{{atom:{a}}}")).await;
            assert_eq!(n, 1_000, "{a}: 1,600 attempts on a limit of 1,000");
            // Batched: the checks that came while a node's call was in flight went together.
            let calls = script_calls(&port);
            println!("{a}: 1,600 checks in {calls} calls");
            assert!(
                calls < 1_600,
                "{a}: {calls} calls for 1,600 concurrent checks: nothing batched"
            );
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
fn every_key_gets_a_ttl_and_a_function_flush_is_survived() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url(), RedisOptions::new(TIMEOUT))
            .await
            .unwrap();
        for a in Algorithm::ALL {
            let limit = Limit::builder(a, 5, Micros::from_secs(60)).build().unwrap();
            assert!(
                store
                    .decide(&format!("sluice:{{ttl:{a}}}"), &limit, 1)
                    .await
                    .unwrap()
                    .decision
                    .allowed
            );
        }
        // A key's later admissions keep the TTL its first set (a window's), or set a new one;
        // checks batched together on a fresh key write it once, with the TTL it needs.
        for a in Algorithm::ALL {
            let limit = Limit::builder(a, 50, Micros::from_secs(60)).build().unwrap();
            let key = format!("sluice:{{later:{a}}}");
            for _ in 0..3 {
                assert!(store.decide(&key, &limit, 1).await.unwrap().decision.allowed);
            }
            // The first call goes alone; the 16 on the fresh key wait for it and go as one batch.
            let (lead, key) = (format!("sluice:{{lead:{a}}}"), format!("sluice:{{batched:{a}}}"));
            let together = std::iter::once(&lead)
                .chain(std::iter::repeat_n(&key, 16))
                .map(|key| store.decide(key, &limit, 1));
            for answer in futures_util::future::join_all(together).await {
                assert!(answer.unwrap().decision.allowed, "{a}");
            }
        }
        let keys = server.cli(&["--scan", "--pattern", "sluice:*"]);
        assert!(keys.lines().count() >= 24, "{keys}");
        for key in keys.lines() {
            let ttl: i64 = server.cli(&["pttl", key]).trim().parse().unwrap();
            assert!(ttl > 0 && ttl <= 120_000, "{key} has pttl {ttl}");
        }
        server.cli(&["script", "flush"]);
        server.cli(&["function", "flush"]);
        let limit = Limit::builder(Algorithm::Gcra, 5, Micros::from_secs(60))
            .build()
            .unwrap();
        assert!(
            store.decide("sluice:{after-flush}", &limit, 1).await.is_ok(),
            "FUNCTION FLUSH not recovered"
        );
        assert_eq!(store.engine(), Some(Engine::Functions));
        assert!(
            server.cli(&["function", "list"]).contains("_decide"),
            "the library is back"
        );
    });
}

#[test]
fn a_dead_redis_fails_fast_and_a_restarted_one_is_used_again() {
    let mut server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url(), RedisOptions::new(Duration::from_millis(200)))
            .await
            .unwrap();
        let limit = Limit::builder(Algorithm::FixedWindow, 100, Micros::from_secs(60))
            .build()
            .unwrap();
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
        // A restart without persistence lost the library; the store loaded it again.
        assert!(server.cli(&["function", "list"]).contains("_decide"));
    });
}

/// On a cluster a lease's record sits in its limit's slot: grants and give-backs of
/// identities spread over the masters work in one script call each.
#[test]
fn leases_work_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::connect(&cluster.url(), RedisOptions::new(TIMEOUT))
            .await
            .unwrap();
        let limit = Limit::builder(Algorithm::FixedWindow, 10, Micros::from_secs(3_600))
            .build()
            .unwrap();
        for n in 0..12 {
            let key = keys::limit("leased", &format!("id{n}"));
            let g = store.grant(&key, &limit, (8, Micros::SECOND), 1).await.unwrap();
            assert_eq!(g.units, 8, "{key}");
            assert_eq!(store.give_back(&key, &limit, 1, 5).await.unwrap(), 5, "{key}");
            let again = store.grant(&key, &limit, (10, Micros::SECOND), 2).await.unwrap();
            assert_eq!(again.units, 7, "{key}: 10 - 8 + 5");
        }
    });
}

/// Random traces of grants and give-backs on one limit of every leasable algorithm: the
/// Lua script grants what sluice-core's `lease::grant` grants, at the same times, ends the
/// lease at the same moment, and takes back what `lease::give_back` takes back — never
/// more than the lease holds, nothing once it ended.
#[test]
fn leases_in_lua_agree_with_core() {
    use sluice_core::lease::{give_back, grant, leasable};

    let (_server, rt, store) = started();
    let steps = proptest::collection::vec((0u64..400_000, 1u64..40, 1u64..900_000, 0u64..50), 1..25);
    let counter = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 200,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&(limit(), steps, 1u64 << 40..1u64 << 51), |(limit, steps, start)| {
            if leasable(&limit).is_err() {
                return Ok(());
            }
            let key = keys::limit("leased", &format!("c{}", counter.fetch_add(1, Ordering::Relaxed)));
            let mut state = State::Fresh;
            let mut now = start;
            // The core side's leases: (units held, granted at, ends).
            let mut held: Vec<(u64, u64, u64)> = Vec::new();
            for (i, &(gap, want, ttl, back)) in steps.iter().enumerate() {
                now += gap;
                let id = i as u64;
                let want_core = grant(&limit, &mut state, Micros::new(now), want, Micros::new(ttl));
                store.set_clock(Some(Micros::new(now)));
                let got = rt
                    .block_on(store.grant(&key, &limit, (want, Micros::new(ttl)), id))
                    .unwrap();
                prop_assert_eq!(
                    (got.units, got.expires_at, got.decision),
                    (want_core.units, want_core.expires_at, want_core.decision),
                    "grant {} at {}",
                    i,
                    now
                );
                held.push((want_core.units, now, want_core.expires_at.as_u64()));
                // Give back `back` units of an earlier lease, a little later.
                let (j, at) = (i / 2, now + gap / 2);
                let (units, granted_at, ends) = held[j];
                let take = back.min(units);
                let taken = give_back(
                    &limit,
                    &mut state,
                    (Micros::new(granted_at), Micros::new(ends)),
                    take,
                    Micros::new(at),
                );
                let expect = if taken { take } else { 0 };
                if taken {
                    held[j].0 -= take;
                }
                store.set_clock(Some(Micros::new(at)));
                let got = rt.block_on(store.give_back(&key, &limit, j as u64, back)).unwrap();
                prop_assert_eq!(got, expect, "give back {} of lease {} at {}", back, j, at);
                now = at;
            }
            Ok(())
        })
        .unwrap();
}

/// A user who may not load Functions (`-function`) still decides, as the script.
#[test]
fn a_user_without_the_right_to_load_functions_decides_as_the_script() {
    let server = RedisServer::start();
    server.cli(&[
        "acl",
        "setuser",
        "checker",
        "on",
        ">secret",
        "~*",
        "&*",
        "+@all",
        "-function",
    ]);
    runtime().block_on(async {
        let url = format!("redis://checker:secret@127.0.0.1:{}", server.port());
        let store = RedisStore::connect(&url, RedisOptions::new(TIMEOUT)).await.unwrap();
        assert_eq!(store.engine(), Some(Engine::Script));
        let limit = Limit::builder(Algorithm::FixedWindow, 2, Micros::from_secs(60))
            .build()
            .unwrap();
        let allowed: Vec<bool> = [0; 3]
            .iter()
            .map(|_| async { store.decide("sluice:{acl}", &limit, 1).await.unwrap().decision.allowed })
            .collect::<futures_util::future::JoinAll<_>>()
            .await;
        assert_eq!(allowed.iter().filter(|a| **a).count(), 2);
    });
}

/// Every master of a cluster has the library once a store connects.
#[test]
fn every_master_of_a_cluster_has_the_library() {
    let cluster = RedisCluster::start(3, 0);
    runtime().block_on(async {
        let store = RedisStore::connect(&cluster.url(), RedisOptions::new(TIMEOUT))
            .await
            .unwrap();
        assert_eq!(store.engine(), Some(Engine::Functions));
    });
    for port in cluster.master_ports() {
        let list = cluster.cli(port, &["function", "list"]);
        assert!(list.contains("_decide"), "master {port}: {list}");
    }
}

/// Issue 41: checks keep being answered while a cluster moves slots between masters
/// (`redis-cli --cluster reshard`), with batching on: each is decided by the store or fails
/// (and a node's failure policy answers it), and afterwards every key holds exactly what
/// the store admitted of it — nothing lost, nothing counted twice.
#[test]
fn checks_during_a_live_reshard_are_answered_and_counted_exactly() {
    let cluster = RedisCluster::start(3, 0);
    let masters = cluster.master_ports();
    let id = |port: u16| cluster.cli(port, &["cluster", "myid"]).trim().to_owned();
    let (from, to) = (id(masters[0]), id(masters[1]));
    let rt = runtime();
    let store = Arc::new(
        rt.block_on(RedisStore::connect(
            &cluster.url(),
            RedisOptions::new(Duration::from_secs(2)),
        ))
        .unwrap(),
    );
    let limit = Limit::builder(Algorithm::FixedWindow, 1_000_000, Micros::from_secs(86_400))
        .build()
        .unwrap();
    let identities = 300;
    let key = |i: usize| keys::limit("reshard", &format!("id-{i}"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..identities).map(|_| AtomicU64::new(0)).collect());
    let failed = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..16)
        .map(|client| {
            let (store, stop, admitted, failed) = (store.clone(), stop.clone(), admitted.clone(), failed.clone());
            rt.spawn(async move {
                let mut i = client;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 7) % identities;
                    match store.decide(&key(i), &limit, 1).await {
                        Ok(s) if s.decision.allowed => {
                            admitted[i].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(s) => panic!("a limit of a million refused: {s:?}"),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let reshard = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", masters[0])])
        .args([
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            "3000",
            "--cluster-yes",
        ])
        .output()
        .expect("redis-cli --cluster reshard");
    assert!(
        reshard.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&reshard.stderr)
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for task in load {
        rt.block_on(task).unwrap();
    }
    let total: u64 = admitted.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    let failed = failed.load(Ordering::Relaxed);
    println!("{total} checks decided by the store, {failed} failed over, during a reshard of 3,000 slots");
    assert!(total > 1_000, "the load ran: {total}");
    for i in 0..identities {
        let stored = cluster.cli(masters[0], &["-c", "get", &format!("{}:fw", key(i))]);
        let count: u64 = stored
            .trim()
            .rsplit(':')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        assert_eq!(
            count,
            admitted[i].load(Ordering::Relaxed),
            "identity {i}: Redis counts {stored:?}, the store admitted another number"
        );
    }
}
