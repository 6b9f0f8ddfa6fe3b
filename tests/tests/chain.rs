//! The whole chain as a user runs it, all real processes on loopback: a demo upstream, two
//! `sluice-harness proxy` processes running `sluice_filter.wasm`, two `sluice-service`
//! nodes and a real Redis. Everything is torn down on drop, even when a test fails.
//!
//! The binaries are built by the fixture itself into the test's own target directory and
//! profile; the filter module is built like the filter's tests build it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use sluice_testkit::{free_port, wait_for_port, Child, RedisServer};

const RULES: &str = r#"
[[rule]]
name      = "global-ip"
by        = "ip"
algorithm = "sliding_window_log"
limit     = 10
window    = "1m"
failure   = "open"

[[rule]]
name      = "paid-key"
by        = "api_key"
algorithm = "sliding_window_log"
limit     = 1000
window    = "1m"
failure   = "closed"
"#;

/// The filter configuration; a generous check timeout, since debug builds share two cores.
const FILTER: &str = r#"{
  "check": {"cluster": "sluice_check", "authority": "sluice-check", "path": "/v1/check", "timeout_ms": 2000},
  "identities": {"ip": {"header": "x-forwarded-for", "trusted_hops": 0}, "api_key": {"header": "x-api-key"}},
  "local": {"by": "ip", "rate_per_s": 1000, "burst": 1000, "max_keys": 10000},
  "failure": {"mode": "open", "fallback": {"rate_per_s": 50, "burst": 100},
              "breaker": {"failures": 1000, "cooldown_ms": 1000}},
  "headers": "all"
}"#;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A workspace binary of the same profile as this test, built (or brought up to date) once.
///
/// Cargo builds only the test's own package's binaries for a test, so the chain builds the
/// other packages' binaries itself: a clean clone works, and a stale binary is never run.
fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> → target/<profile>
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target directory")
            .to_path_buf();
        let mut cargo = Command::new(env!("CARGO"));
        // `--workspace` resolves features as a developer's `cargo build --workspace` does,
        // so a tree built that way is reused as it stands.
        cargo.current_dir(root()).args(["build", "--workspace", "--bins"]);
        if dir.file_name().is_some_and(|profile| profile == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("cannot run cargo");
        assert!(status.success(), "building the chain's binaries failed");
        dir
    });
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing after the build", path.display());
    path
}

/// `sluice_filter.wasm`, built once into target/wasm-modules.
fn filter_wasm() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let target = root().join("target").join("wasm-modules");
        let status = Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["build", "-p", "sluice-filter", "--target", "wasm32-wasip1", "--release"])
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("cannot run cargo");
        assert!(status.success(), "building the filter failed (run scripts/setup)");
        target.join("wasm32-wasip1/release/sluice_filter.wasm")
    })
}

struct Chain {
    upstream: u16,
    proxies: [u16; 2],
    redis: RedisServer,
    _dir: PathBuf,
    /// The service nodes, by index.
    nodes: Vec<Child>,
    _children: Vec<Child>,
}

impl Chain {
    /// Upstream, Redis, two service nodes over it, two proxies whose check cluster lists
    /// both nodes (each proxy prefers a different one first).
    fn start() -> Chain {
        let redis = RedisServer::start();
        let dir = std::env::temp_dir().join(format!("sluice-chain-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("rules.toml"), RULES).expect("rules file");
        std::fs::write(dir.join("filter.json"), FILTER).expect("filter config");
        let mut children = Vec::new();

        let upstream = free_port();
        children.push(Child::spawn(
            "demo upstream",
            Command::new(binary("sluice-demo-upstream")).args(["--listen", &format!("127.0.0.1:{upstream}")]),
        ));
        let mut nodes = [0; 2];
        let mut node_children = Vec::new();
        for node in &mut nodes {
            *node = free_port();
            node_children.push(Child::spawn(
                "sluice-service",
                Command::new(binary("sluice-service"))
                    .arg("--listen")
                    .arg(format!("127.0.0.1:{node}"))
                    .arg("--rules")
                    .arg(dir.join("rules.toml"))
                    .args(["--store", &redis.url(), "--store-timeout-ms", "200"]),
            ));
        }
        let wasm = filter_wasm();
        let mut proxies = [0; 2];
        for proxy in &mut proxies {
            *proxy = free_port();
            children.push(Child::spawn(
                "sluice-harness proxy",
                Command::new(binary("sluice-harness"))
                    .arg("proxy")
                    .arg("--wasm")
                    .arg(wasm)
                    .arg("--config")
                    .arg(dir.join("filter.json"))
                    .arg("--listen")
                    .arg(format!("127.0.0.1:{proxy}"))
                    .arg("--upstream")
                    .arg(format!("127.0.0.1:{upstream}"))
                    .arg("--cluster")
                    .arg(format!("sluice_check=127.0.0.1:{},127.0.0.1:{}", nodes[0], nodes[1])),
            ));
        }
        for port in [upstream].iter().chain(&nodes).chain(&proxies) {
            wait_for_port(*port, Duration::from_secs(30));
        }
        Chain {
            upstream,
            proxies,
            redis,
            _dir: dir,
            nodes: node_children,
            _children: children,
        }
    }

    /// Requests the upstream has served.
    fn upstream_count(&self) -> u64 {
        let r = http(self.upstream, "GET", "/__count", &[]);
        r.body
            .trim()
            .trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or_else(|_| panic!("odd count {:?}", r.body))
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over its own connection (`Connection: close`).
fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nhost: sluice.test\r\nconnection: close\r\ncontent-length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[test]
fn a_global_limit_holds_across_both_proxies_and_both_nodes() {
    let chain = Chain::start();
    let mut statuses = Vec::new();
    for i in 0..30 {
        let r = http(chain.proxies[i % 2], "GET", "/api/hello", &[]);
        if r.status == 429 {
            assert_eq!(r.header("ratelimit-policy"), Some("\"global-ip\";q=10;w=60"));
            assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
            assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
            assert!(r.header("retry-after").is_some());
            assert!(r.body.contains("\"code\":429"), "{}", r.body);
        } else {
            assert_eq!(r.header("ratelimit-policy"), Some("\"global-ip\";q=10;w=60"));
        }
        statuses.push(r.status);
    }
    let allowed = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((allowed, denied), (10, 20), "statuses: {statuses:?}");
    assert!(
        statuses[..10].iter().all(|&s| s == 200),
        "the first ten pass: {statuses:?}"
    );
    assert_eq!(chain.upstream_count(), 10, "the upstream saw exactly the limit");
}

#[test]
fn a_dead_redis_fails_open_or_closed_per_rule_and_recovers() {
    let mut chain = Chain::start();
    let key = [("x-api-key", "k-1")];
    assert_eq!(http(chain.proxies[0], "GET", "/a", &key).status, 200);

    chain.redis.stop();
    let mut open = Vec::new();
    let mut closed = Vec::new();
    for i in 0..6 {
        open.push(http(chain.proxies[i % 2], "GET", "/b", &[]).status);
        closed.push(http(chain.proxies[i % 2], "GET", "/c", &key).status);
    }
    // `global-ip` fails open (the node's fallback bucket); `paid-key` fails closed: a
    // denial, never a 5xx from Sluice.
    assert!(open.iter().all(|&s| s == 200), "fail-open rule: {open:?}");
    assert!(closed.iter().all(|&s| s == 429), "fail-closed rule: {closed:?}");

    chain.redis.restart();
    // Shared decisions resume: the closed rule allows again within a few seconds.
    let mut recovered = false;
    for _ in 0..100 {
        if http(chain.proxies[1], "GET", "/d", &key).status == 200 {
            recovered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(recovered, "checks did not recover after Redis came back");
}

#[test]
fn a_stalled_check_service_costs_the_timeout_until_the_breaker_opens() {
    // A "check service" that accepts connections and never answers.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let stalled_port = stalled.local_addr().expect("addr").port();
    stalled.set_nonblocking(true).expect("nonblocking");
    let upstream = free_port();
    let proxy = free_port();
    let dir = std::env::temp_dir().join(format!("sluice-stall-{}-{proxy}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = FILTER.replace("\"timeout_ms\": 2000", "\"timeout_ms\": 100").replace(
        "\"failures\": 1000, \"cooldown_ms\": 1000",
        "\"failures\": 2, \"cooldown_ms\": 60000",
    );
    std::fs::write(dir.join("filter.json"), config).expect("filter config");
    let _upstream = Child::spawn(
        "demo upstream",
        Command::new(binary("sluice-demo-upstream")).args(["--listen", &format!("127.0.0.1:{upstream}")]),
    );
    let _proxy = Child::spawn(
        "sluice-harness proxy",
        Command::new(binary("sluice-harness"))
            .arg("proxy")
            .arg("--wasm")
            .arg(filter_wasm())
            .arg("--config")
            .arg(dir.join("filter.json"))
            .args(["--listen", &format!("127.0.0.1:{proxy}")])
            .args(["--upstream", &format!("127.0.0.1:{upstream}")])
            .args(["--cluster", &format!("sluice_check=127.0.0.1:{stalled_port}")]),
    );
    wait_for_port(upstream, Duration::from_secs(30));
    wait_for_port(proxy, Duration::from_secs(30));

    let mut held = Vec::new();
    let mut connections = Vec::new(); // kept open: the stall is the point
    for _ in 0..10 {
        let start = std::time::Instant::now();
        let r = http(proxy, "GET", "/api/hello", &[]);
        assert_eq!(r.status, 200, "fail open: {}", r.body);
        held.push(start.elapsed());
        while let Ok((conn, _)) = stalled.accept() {
            connections.push(conn);
        }
    }
    // The first two waited out the 100 ms timeout (a lower bound, so not flaky); then the
    // breaker stopped calling: the stalled service saw exactly two connections.
    assert!(held[..2].iter().all(|d| *d >= Duration::from_millis(100)), "{held:?}");
    std::thread::sleep(Duration::from_millis(200));
    while let Ok((conn, _)) = stalled.accept() {
        connections.push(conn);
    }
    assert_eq!(connections.len(), 2, "check calls made; request times: {held:?}");
}

#[test]
fn with_one_service_node_killed_the_proxies_decide_through_the_other() {
    let mut chain = Chain::start();
    for i in 0..4 {
        assert_eq!(http(chain.proxies[i % 2], "GET", "/x", &[]).status, 200);
    }
    chain.nodes[0].kill();
    // Still global decisions (not the filter's fail-open fallback, which would allow all
    // 26): exactly 6 more pass, then 429s naming the rule.
    let statuses: Vec<u16> = (0..26)
        .map(|i| http(chain.proxies[i % 2], "GET", "/y", &[]).status)
        .collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 6, "{statuses:?}");
    assert!(statuses[6..].iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(chain.upstream_count(), 10);
}
