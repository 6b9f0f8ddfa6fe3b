//! Production Redis, against real servers: TLS on one server and on a three-master cluster
//! (a CA the node was not told of is refused, and so are the system's roots for a private
//! CA), a client certificate, an ACL user whose password comes from a file (a wrong one
//! leaves the node up, saying why, until the file is fixed), and a Sentinel failover under
//! load, measured with and without `--store-wait-replicas`.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, TestNode};
use serde_json::{json, Value};
use sluice_core::time::Micros;
use sluice_service::node::NodeConfig;
use sluice_service::store::redis::{RedisOptions, RedisStore};
use sluice_service::store::{Store, StoreError};
use sluice_testkit::{RedisCluster, RedisOptions as ServerOptions, RedisSentinel, RedisServer, ScratchDir, TlsFiles};

const RULES: &str = r#"
[[rule]]
name = "per-ip"
by = "ip"
algorithm = "fixed_window"
limit = 5
window = "1m"
failure = "closed"

[[rule]]
name = "per-key"
by = "api_key"
algorithm = "fixed_window"
limit = 1000000
window = "1d"
failure = "closed"
"#;

fn trusting(tls: &TlsFiles) -> RedisOptions {
    RedisOptions {
        ca_file: Some(tls.ca().to_path_buf()),
        ..RedisOptions::new(Duration::from_secs(2))
    }
}

fn config() -> NodeConfig {
    NodeConfig {
        store_timeout: Duration::from_millis(500),
        ..NodeConfig::default()
    }
}

async fn node(url: &str, options: RedisOptions) -> TestNode {
    let store = RedisStore::connect(url, options)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    TestNode::start(Store::Redis(Box::new(store)), RULES, config()).await
}

/// Admissions of 8 checks for each of 20 client IPs (spread over the cluster's slots).
async fn admitted_per_ip(n: &TestNode) -> Vec<usize> {
    let mut admitted = Vec::new();
    for i in 0..20 {
        admitted.push(n.admitted(json!({"ip": format!("10.0.0.{i}")}), "/", 8).await);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_run_over_tls_on_one_server_and_on_a_cluster() {
    let tls = TlsFiles::generate("store-tls");
    let server = RedisServer::start_with(&ServerOptions::tls(&tls));
    let cluster = RedisCluster::start_with(3, 0, &ServerOptions::tls(&tls));
    for url in [server.url(), cluster.url()] {
        assert!(url.starts_with("rediss"), "{url}");
        let n = node(&url, trusting(&tls)).await;
        assert_eq!(admitted_per_ip(&n).await, vec![5; 20], "{url}");
        let ready = n.client.get(n.url("/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "{url}");
    }
    // Plain text to a TLS port is not a store.
    let plain = server.url().replacen("rediss", "redis", 1);
    assert!(
        RedisStore::connect(&plain, RedisOptions::new(Duration::from_millis(500)))
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_did_not_sign_the_server_is_refused_with_a_clear_error() {
    let tls = TlsFiles::generate("store-wrong-ca");
    let server = RedisServer::start_with(&ServerOptions::tls(&tls));
    let wrong = RedisOptions {
        ca_file: Some(tls.other_ca().to_path_buf()),
        ..RedisOptions::new(Duration::from_secs(2))
    };
    // The system's roots (no --store-ca-file) do not know a private CA either.
    for options in [wrong, RedisOptions::new(Duration::from_secs(2))] {
        let Err(StoreError::Unavailable(e)) = RedisStore::connect(&server.url(), options).await else {
            panic!("a server signed by an unknown CA was trusted");
        };
        assert!(e.contains("certificate") && e.contains("--store-ca-file"), "{e}");
    }
    // A file that holds no certificate stops the node at start, naming the file.
    let scratch = ScratchDir::new("store-bad-ca");
    std::fs::write(scratch.join("empty.pem"), "not a certificate\n").unwrap();
    let empty = RedisOptions {
        ca_file: Some(scratch.join("empty.pem")),
        ..RedisOptions::new(Duration::from_secs(2))
    };
    let Err(StoreError::Config(e)) = RedisStore::start(&server.url(), empty) else {
        panic!("a CA file without a certificate was accepted");
    };
    assert!(e.contains("empty.pem") && e.contains("no PEM certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_asks_for_a_client_certificate_gets_the_one_configured() {
    let tls = TlsFiles::generate("store-mtls");
    let server = RedisServer::start_with(&ServerOptions {
        tls_auth_clients_required: true,
        ..ServerOptions::tls(&tls)
    });
    assert!(
        RedisStore::connect(&server.url(), trusting(&tls)).await.is_err(),
        "a client without a certificate got in"
    );
    let with_cert = RedisOptions {
        cert_file: Some(tls.client_cert().to_path_buf()),
        key_file: Some(tls.client_key().to_path_buf()),
        ..trusting(&tls)
    };
    let n = node(&server.url(), with_cert).await;
    assert_eq!(n.admitted(json!({"ip": "10.1.1.1"}), "/", 7).await, 5);
}

fn password_file(scratch: &ScratchDir, password: &str) -> PathBuf {
    let path = scratch.join("redis-password");
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_logs_in_with_a_password_file_and_a_wrong_one_is_fixed_without_a_restart() {
    let tls = TlsFiles::generate("store-acl");
    let server = RedisServer::start_with(&ServerOptions::tls(&tls).with_user("sluice", "right-horse"));
    // The user keeps the rights docs/redis.md lists, no more.
    let rights = "resetkeys ~sluice:* resetchannels &sluice:* -@all +@read +@write +@scripting +@pubsub +@stream +ping +wait +time";
    let setuser: Vec<&str> = ["acl", "setuser", "sluice"]
        .into_iter()
        .chain(rights.split(' '))
        .collect();
    assert_eq!(server.cli(&setuser).trim(), "OK");
    let url = server.url().replacen("rediss://", "rediss://sluice@", 1);
    let scratch = ScratchDir::new("store-acl");
    let file = password_file(&scratch, "wrong-horse");
    let options = RedisOptions {
        password_file: Some(file.clone()),
        ..trusting(&tls)
    };
    let store = RedisStore::start(&url, options).expect("the node starts");
    let n = TestNode::start(Store::Redis(Box::new(store)), RULES, config()).await;

    // Up, not ready, and saying why; the failure policy answers.
    let mut reason = String::new();
    eventually("/readyz never gave the login failure", async || {
        let r = n.client.get(n.url("/readyz")).send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        reason = body["error"].as_str().unwrap_or_default().to_owned();
        status == 503 && reason.contains("authentication failed")
    })
    .await;
    assert!(reason.contains("--store-password-file"), "{reason}");
    assert!(!reason.contains("wrong-horse"), "the password is shown: {reason}");
    let closed = n.check(json!({"ip": "10.2.2.2"}), "/").await;
    assert_eq!(
        (&closed["allowed"], &closed["degraded"]),
        (&json!(false), &json!(true)),
        "{closed}"
    );

    // Fixing the file is enough.
    std::fs::write(&file, "right-horse\n").unwrap();
    eventually("the node did not log in after the file was fixed", async || {
        n.client.get(n.url("/readyz")).send().await.unwrap().status() == 200
    })
    .await;
    assert_eq!(n.admitted(json!({"ip": "10.2.2.3"}), "/", 7).await, 5);
    // Those rights cover the rules' publication and the violations log too.
    let rules = n.admin_get("/v1/admin/rules").await;
    assert_eq!(rules.status(), 200);
    eventually("the two refusals were not logged", async || {
        n.violations("10.2.2.3").await.len() == 2
    })
    .await;

    // Without a password Redis's disabled default user is refused, with a hint.
    let Err(StoreError::Unavailable(e)) = RedisStore::connect(&server.url(), trusting(&tls)).await else {
        panic!("the disabled default user got in");
    };
    assert!(e.contains("--store-password-file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_over_tls_with_a_password_of_their_own_name_a_master_behind_an_acl_user() {
    let tls = TlsFiles::generate("sentinel-tls");
    let sentinel = RedisSentinel::start(&ServerOptions::tls(&tls).with_user("sluice", "data-pass"));
    for &p in sentinel.sentinel_ports() {
        let reply = sentinel.cli_sentinel(p, &["acl", "setuser", "default", "resetpass", ">sentinel-pass"]);
        assert_eq!(reply.trim(), "OK", "sentinel {p}");
    }
    let url = sentinel.url().replacen("://", "://sluice@", 1);
    assert!(url.starts_with("rediss+sentinel://sluice@"), "{url}");
    let scratch = ScratchDir::new("sentinel-tls");
    std::fs::write(scratch.join("data"), "data-pass\n").unwrap();
    std::fs::write(scratch.join("sentinel"), "sentinel-pass\n").unwrap();
    let options = RedisOptions {
        password_file: Some(scratch.join("data")),
        ..trusting(&tls)
    };
    assert!(
        RedisStore::connect(&url, options.clone()).await.is_err(),
        "the sentinels answered without their password"
    );
    let options = RedisOptions {
        sentinel_password_file: Some(scratch.join("sentinel")),
        ..options
    };
    let n = node(&url, options).await;
    assert_eq!(n.admitted(json!({"ip": "10.3.3.3"}), "/", 7).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_rotated_on_the_server_is_read_again_from_the_file() {
    let server = RedisServer::start_with(&ServerOptions::default().with_user("sluice", "old-pass"));
    let scratch = ScratchDir::new("store-rotation");
    let file = password_file(&scratch, "old-pass");
    let options = RedisOptions {
        password_file: Some(file.clone()),
        ..RedisOptions::new(Duration::from_secs(1))
    };
    let url = server.url().replacen("redis://", "redis://sluice@", 1);
    let n = node(&url, options).await;
    assert_eq!(n.admitted(json!({"ip": "10.4.4.4"}), "/", 7).await, 5);

    // Rotate: the server's password, then the file; then the node's connections drop.
    assert_eq!(
        server
            .cli(&["acl", "setuser", "sluice", "resetpass", ">new-pass"])
            .trim(),
        "OK"
    );
    std::fs::write(&file, "new-pass\n").unwrap();
    let kill = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &server.port().to_string(),
            "--user",
            "sluice",
            "--pass",
            "new-pass",
            "--no-auth-warning",
        ])
        .args(["client", "kill", "user", "sluice"])
        .output()
        .unwrap();
    assert!(kill.status.success(), "{kill:?}");
    eventually("the node never logged in with the rotated password", async || {
        n.check(json!({"ip": "10.4.4.5"}), "/").await["degraded"] == false
    })
    .await;
}

/// What one run of steady load across a failover saw.
#[derive(Debug, Default)]
struct Failover {
    /// Checks answered before the master was killed, and in how long.
    before: (u64, Duration),
    /// From the kill to the end of the last answer the failure policy gave.
    recovery: Duration,
    degraded: u64,
    server_errors: u64,
    /// Admitted by the store, over the whole run.
    admitted: u64,
    /// The counter the new master holds for them.
    counted: u64,
    /// The replication lag the kill found (`RedisSentinel::lag_at_kill`).
    lag: Duration,
    /// Admitted by the store in the lag before the link was cut, and `LOST_SLACK` more:
    /// what the replica may not have received.
    admitted_in_lag: u64,
}

/// Beyond the lag the link reports: its reading thread's delay (bytes it has not read yet
/// are not on the link) and the answer's way back to the test; two of the link's latencies.
const LOST_SLACK: Duration = Duration::from_millis(20);

/// Checks by 4 workers against one quota; the master is killed after 2 s; the load goes on
/// until the node has decided from the store for 2 s after the last degraded answer.
async fn failover_under_load(sentinel: &mut RedisSentinel, wait_replicas: u32) -> Failover {
    let options = RedisOptions {
        wait_replicas,
        ..RedisOptions::new(Duration::from_millis(500))
    };
    let key = format!("failover-{wait_replicas}");
    let store = RedisStore::connect(&sentinel.url(), options).await.unwrap();
    // The quota is a day's fixed window: the scripts decide at a held noon of today (UTC),
    // so no run ends its window midway (one across midnight counted only its second half,
    // and "lost" what it admitted before). The keys' TTLs are relative: 12 h of real time.
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    store.set_clock(Some(Micros::from_secs(now_s - now_s % 86_400 + 43_200)));
    let n = Arc::new(TestNode::start(Store::Redis(Box::new(store)), RULES, config()).await);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (n, stop, key) = (n.clone(), stop.clone(), key.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"identities": {"api_key": key}, "method": "GET", "path": "/"});
                    let r = n.client.post(n.url("/v1/check")).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let answer: Value = r.json().await.unwrap_or_default();
                    let (allowed, degraded) = (answer["allowed"] == true, answer["degraded"] == true);
                    seen.push((started.elapsed(), status, allowed, degraded));
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = started.elapsed();
    let old = sentinel.kill_master();
    let cut_at = started.elapsed();
    let new = tokio::task::block_in_place(|| sentinel.wait_for_new_master(old, Duration::from_secs(30)));
    assert_ne!(old, new);
    // The old master comes back (as an orchestrator restarts it), as the new one's replica.
    tokio::task::block_in_place(|| sentinel.restart_killed());
    // Wait for the node to decide from the store again, then 2 s more.
    eventually("the node never decided from the new master", async || {
        n.check(json!({"api_key": "probe"}), "/").await["degraded"] == false
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for w in workers {
        seen.extend(w.await.unwrap());
    }
    // One more check reads the counter: remaining = limit - counted - 1.
    let last = n.check(json!({"api_key": key}), "/").await;
    assert_eq!(last["degraded"], false, "{last}");
    let remaining = last["remaining"].as_u64().unwrap_or_else(|| panic!("{last}"));
    let before: Vec<_> = seen.iter().filter(|s| s.0 < killed_at).collect();
    let last_degraded = seen.iter().filter(|s| s.3).map(|s| s.0).max().unwrap_or(killed_at);
    let lag = sentinel.lag_at_kill();
    let unsent_since = cut_at.saturating_sub(lag + LOST_SLACK);
    Failover {
        before: (before.len() as u64, killed_at),
        recovery: last_degraded.saturating_sub(killed_at),
        degraded: seen.iter().filter(|s| s.3).count() as u64,
        server_errors: seen.iter().filter(|s| s.1 >= 500).count() as u64,
        admitted: seen.iter().filter(|s| s.2 && !s.3).count() as u64,
        counted: 1_000_000 - remaining - 1,
        lag,
        admitted_in_lag: seen
            .iter()
            .filter(|s| s.2 && !s.3 && s.0 >= unsent_since && s.0 <= cut_at)
            .count() as u64,
    }
}

/// The replica replicates over a link with this one-way delay, cut with the master.
const LAG: Duration = Duration::from_millis(10);

/// The node follows Sentinel to the promoted replica under load: no 5xx meanwhile, the
/// failure policy answers until it does. What the replica had not received when the master
/// died is lost, so a failover can admit that much beyond a limit, and no more: at most the
/// admissions of the replication lag the kill found (the link's latency, longer when a busy
/// machine runs its threads late); with `--store-wait-replicas 1`, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_follows_a_sentinel_failover_and_waiting_for_a_replica_loses_nothing() {
    let mut runs = Vec::new();
    for wait in [0, 1] {
        let mut sentinel = RedisSentinel::start_lagging(&ServerOptions::default(), Some(LAG));
        runs.push(failover_under_load(&mut sentinel, wait).await);
    }
    let [plain, waited] = &runs[..] else { unreachable!() };
    for (name, f) in [("no wait", plain), ("wait 1", waited)] {
        let rate = f.before.0 as f64 / f.before.1.as_secs_f64();
        eprintln!(
            "{name}: {rate:.0} checks/s before the kill; recovered in {:?} ({} answers by the failure policy, {} 5xx); \
             admitted {}, the new master counted {} (lost {})",
            f.recovery,
            f.degraded,
            f.server_errors,
            f.admitted,
            f.counted,
            f.admitted as i64 - f.counted as i64
        );
        assert_eq!(f.server_errors, 0, "{name}: {f:?}");
        assert!(f.recovery < Duration::from_secs(15), "{name}: {f:?}");
        assert!(f.admitted > 0, "{name}: {f:?}");
    }
    // The bound design.md states: no more than the admissions of the replication lag, as
    // the link measured it when cut (a fixed number of lags failed on busy machines, where
    // the real lag is longer than the link's latency).
    let per_lag = plain.before.0 as f64 * LAG.as_secs_f64() / plain.before.1.as_secs_f64();
    let lost = plain.admitted.saturating_sub(plain.counted);
    eprintln!(
        "no wait: lost {lost}; the lag at the kill {:?} ({per_lag:.1} admissions a {LAG:?}), \
         {} admitted in it and {LOST_SLACK:?} more",
        plain.lag, plain.admitted_in_lag
    );
    assert!(
        lost <= plain.admitted_in_lag,
        "lost {lost}, more than the {} admitted in the lag at the kill ({:?}) and {LOST_SLACK:?}: {plain:?}",
        plain.admitted_in_lag,
        plain.lag
    );
    assert!(
        waited.admitted <= waited.counted,
        "waiting for a replica lost admissions: {waited:?}"
    );
}

/// Issue 41: a failover does not hand out a second limit. Two nodes spend a quota of 3,000 a
/// day that fails open, then its master is killed: while there is none, each node's
/// fallback starts from what the store last said was left (nothing), not from a whole
/// quota — before, the fallback admitted another 3,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_hands_out_no_second_limit_to_a_rule_failing_open() {
    const OPEN: &str = "[[rule]]\nname = \"open-day\"\nby = \"user\"\nalgorithm = \"fixed_window\"\n\
                        limit = 3000\nwindow = \"1d\"\nfailure = \"open\"\n";
    let mut sentinel = RedisSentinel::start_lagging(&ServerOptions::default(), Some(LAG));
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(&sentinel.url(), RedisOptions::new(Duration::from_millis(500)))
            .await
            .unwrap();
        // Refusals not remembered: a spent quota's checks must reach the store, and then
        // the fallback, to show what the fallback admits (remembered, they are refused
        // without either until the day ends).
        let config = NodeConfig {
            max_refusals: 0,
            ..config()
        };
        nodes.push(Arc::new(
            TestNode::start(Store::Redis(Box::new(store)), OPEN, config).await,
        ));
    }
    let who = json!({"user": "spender"});
    let mut spent = 0;
    for i in 0..3_100 {
        spent += usize::from(nodes[i % 2].check(who.clone(), "/").await["allowed"] == true);
    }
    assert_eq!(spent, 3_000, "the store admits the limit");
    let old = sentinel.kill_master();
    // Checks on both nodes until each decides from the new master again.
    let (mut degraded, mut admitted_degraded) = (0, 0);
    let started = Instant::now();
    loop {
        let mut recovered = 0;
        for n in &nodes {
            let r = n.check(who.clone(), "/").await;
            if r["degraded"] == true {
                degraded += 1;
                admitted_degraded += usize::from(r["allowed"] == true);
            } else {
                recovered += 1;
            }
        }
        if recovered == nodes.len() && degraded > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no recovery");
    }
    let new = tokio::task::block_in_place(|| sentinel.wait_for_new_master(old, Duration::from_secs(30)));
    assert_ne!(new, old);
    eprintln!("{degraded} answers by the fallback while there was no master, {admitted_degraded} admitted");
    assert!(degraded > 0, "the failover was seen");
    // Spent is spent: the fallback's buckets start from nothing left (the issue asks at
    // most 10 % of the limit; before, every answer of the fallback admitted).
    assert_eq!(
        admitted_degraded, 0,
        "the fallback admitted {admitted_degraded} of {degraded} checks on a spent quota"
    );
}

/// The `open-day` rule: 3,000 a day, failing open.
const OPEN_DAY: &str = "[[rule]]\nname = \"open-day\"\nby = \"user\"\nalgorithm = \"fixed_window\"\n\
                        limit = 3000\nwindow = \"1d\"\nfailure = \"open\"\n";

/// The `closed-day` rule: 3,000 a day, failing closed.
const CLOSED_DAY: &str = "[[rule]]\nname = \"closed-day\"\nby = \"user\"\nalgorithm = \"fixed_window\"\n\
                          limit = 3000\nwindow = \"1d\"\nfailure = \"closed\"\n";

/// `count` nodes over one Sentinel deployment spend half of `rules` (3,000 a day), then its
/// master is killed under load (4 callers a node) until every node has decided from the new
/// master for 2 s, then the rest is spent. All admissions, the fallbacks' included, and
/// those the fallbacks made. `held_clock`: the scripts decide at a held noon of today, so no
/// run crosses the day's end (see failover_under_load); else at Redis's own clock, which
/// batches checks as a node in production does.
async fn half_way_failover(count: usize, rules: &str, held_clock: bool) -> (usize, usize) {
    let mut sentinel = RedisSentinel::start_lagging(&ServerOptions::default(), Some(LAG));
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut nodes = Vec::new();
    for _ in 0..count {
        let store = RedisStore::connect(&sentinel.url(), RedisOptions::new(Duration::from_millis(500)))
            .await
            .unwrap();
        if held_clock {
            store.set_clock(Some(Micros::from_secs(now_s - now_s % 86_400 + 43_200)));
        }
        nodes.push(Arc::new(
            TestNode::start(Store::Redis(Box::new(store)), rules, config()).await,
        ));
    }
    eventually("the nodes never counted each other", async || {
        nodes.iter().all(|n| n.node.nodes() == count as u64)
    })
    .await;
    let who = json!({"user": format!("half-{count}-{held_clock}")});
    let mut admitted = 0;
    for i in 0..1_500 {
        admitted += usize::from(nodes[i % count].check(who.clone(), "/").await["allowed"] == true);
    }
    assert_eq!(admitted, 1_500, "the store admits half the limit");
    // The replica has it all (a sleep of a few lags was not always enough on a busy machine).
    tokio::task::block_in_place(|| sentinel.wait_for_replica(Duration::from_secs(10)));
    let old = sentinel.kill_master();
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..4 * count)
        .map(|i| {
            let (n, stop, who) = (nodes[i % count].clone(), stop.clone(), who.clone());
            tokio::spawn(async move {
                let (mut admitted, mut by_fallback) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let r = n.check(who.clone(), "/").await;
                    let allowed = usize::from(r["allowed"] == true);
                    admitted += allowed;
                    by_fallback += allowed * usize::from(r["degraded"] == true);
                }
                (admitted, by_fallback)
            })
        })
        .collect();
    let new = tokio::task::block_in_place(|| sentinel.wait_for_new_master(old, Duration::from_secs(30)));
    assert_ne!(new, old);
    for n in &nodes {
        eventually("a node never decided from the new master", async || {
            n.check(json!({"user": "probe"}), "/").await["degraded"] == false
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut by_fallback = 0;
    for c in callers {
        let (a, f) = c.await.unwrap();
        admitted += a;
        by_fallback += f;
    }
    // What is left, if anything, until the store refuses.
    for i in 0.. {
        let r = nodes[i % count].check(who.clone(), "/").await;
        assert_eq!(r["degraded"], false, "{r}");
        if r["allowed"] != true {
            break;
        }
        admitted += 1;
    }
    (admitted, by_fallback)
}

/// Issue 53: a Sentinel failover half-way through a day's quota that fails open does not
/// hand out most of a second limit. The nodes' fallbacks start from their share of what the
/// store last said was left, and what they admitted is spent in the store once it answers
/// again: before, one node's fallback admitted the 1,500 left and the promoted replica then
/// admitted its own 1,500 (4,452 of 3,000 tried by hand).
///
/// One node's fallback admissions are spent before its next answer, so one node admits at
/// most the limit. Two nodes come back to the promoted master one after the other, and
/// until the second does, the first can spend what the store still shows, which the
/// second's fallback had already admitted: at most the limit and that node's share (750;
/// seen 3,002-3,007 when they come back together, 3,348-3,434 on a faster machine with
/// another test beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_half_way_through_a_quota_admits_at_most_the_limit() {
    for (count, bound) in [(1, 1.01), (2, 1.25)] {
        let (admitted, by_fallback) = half_way_failover(count, OPEN_DAY, true).await;
        eprintln!("{count} node(s): {admitted} of 3,000 admitted, {by_fallback} by the fallback during the failover");
        assert!(by_fallback > 0, "{count} node(s): the fallback answered the failover");
        assert!(
            admitted as f64 <= 3_000.0 * bound,
            "{count} node(s): {admitted} admitted of 3,000 ({by_fallback} by the fallback)"
        );
        assert!(admitted >= 2_900, "{count} node(s): only {admitted} of 3,000 admitted");
    }
}

/// Issue 65: once in four runs by hand, a failover half-way through a quota failing closed
/// admitted 4,540 of 3,000 (the promoted replica as if it had nothing). The replica holds the
/// 1,500 admitted before the kill (the test waits for it), and a node failing closed admits
/// nothing without a master: every run admits the limit and no more, at Redis's clock (the
/// batched path of production) and at a held one. Runs: `FAILOVER_RUNS` (20 by default),
/// each about 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_failover_half_way_admits_the_limit_in_every_run() {
    let runs: usize = std::env::var("FAILOVER_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let day_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 86_400;
    // Redis's clock must not cross midnight during a run.
    let real_clock = day_s < 86_400 - 60 * 30;
    let mut seen = Vec::new();
    for run in 0..runs {
        let held = run % 2 == 1 || !real_clock;
        let (admitted, by_fallback) = half_way_failover(1, CLOSED_DAY, held).await;
        seen.push(admitted);
        eprintln!("run {run} (held clock {held}): {admitted} of 3,000 admitted");
        assert_eq!(by_fallback, 0, "run {run}: a closed rule admitted without a master");
        assert!(
            (2_990..=3_000).contains(&admitted),
            "run {run} (held clock {held}): {admitted} of 3,000 admitted; runs so far {seen:?}"
        );
    }
}

/// The connection to a promoted master is made as the first was (issue 65's review): a
/// PING, and the library of Functions loaded and used, not the script (EVALSHA) and no
/// batch, which it fell back to after every failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_master_runs_functions_as_the_first_did() {
    use sluice_service::store::redis::Engine;
    let mut sentinel = RedisSentinel::start(&ServerOptions::default());
    let store = RedisStore::connect(&sentinel.url(), RedisOptions::new(Duration::from_millis(500)))
        .await
        .unwrap();
    eventually("never connected", async || store.is_connected()).await;
    assert_eq!(store.engine(), Some(Engine::Functions));
    let old = sentinel.kill_master();
    let new = tokio::task::block_in_place(|| sentinel.wait_for_new_master(old, Duration::from_secs(30)));
    assert_ne!(old, new);
    // The old master is dead: an answer is the new one's.
    eventually("the store never followed to the new master", async || {
        store.ping().await.is_ok()
    })
    .await;
    assert_eq!(store.engine(), Some(Engine::Functions), "on the promoted master");
}
