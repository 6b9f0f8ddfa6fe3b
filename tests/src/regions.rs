//! Regions on loopback: each its own `redis-server` and `sluice-service` node, one global
//! `redis-server` (over TLS, behind an ACL user whose password the nodes read from a file, as
//! a store across a WAN should be), and a [`WanLink`] between each region's node and the
//! global store — the fixture of `tests/tests/regions.rs`. And a keep-alive check client, so a measured
//! latency is the check's, not a TCP handshake's. And a proxy per region, leasing through
//! its region's node.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_testkit::{free_port, wait_for_port, Child, RedisOptions, RedisServer, ScratchDir, TlsFiles, WanLink};

use crate::chain::{node_command, proxy_command, upstream_command, FILTER};

/// One region: its store and its node.
pub struct Region {
    /// The node's HTTP port.
    pub port: u16,
    /// The node.
    pub node: Child,
    /// The link to the global store.
    pub link: WanLink,
    /// The region's own store.
    pub redis: RedisServer,
}

/// Regions sharing a global store.
pub struct Regions {
    /// The regions, in the order of the latencies given.
    pub regions: Vec<Region>,
    /// The global store.
    pub global: RedisServer,
    dir: ScratchDir,
    _tls: TlsFiles,
}

impl Regions {
    /// A region per entry of `one_way` (the WAN latency each way between that region and
    /// the global store), every node running `rules`.
    pub fn start(rules: &str, one_way: &[Duration]) -> Regions {
        Regions::start_with(rules, one_way, &[])
    }

    /// [`Regions::start`], every node also given `args`.
    pub fn start_with(rules: &str, one_way: &[Duration], args: &[&str]) -> Regions {
        let dir = ScratchDir::new("regions");
        std::fs::write(dir.join("rules.toml"), rules).expect("rules file");
        let tls = TlsFiles::generate("regions");
        let global = RedisServer::start_with(&RedisOptions::tls(&tls).with_user("sluice", "global-pass"));
        std::fs::write(dir.join("global-password"), "global-pass\n").expect("password file");
        let global_addr = ([127, 0, 0, 1], global.port()).into();
        let regions: Vec<Region> = one_way
            .iter()
            .enumerate()
            .map(|(i, latency)| {
                let redis = RedisServer::start();
                let link = WanLink::start(global_addr, *latency).expect("WAN link");
                let port = free_port();
                let node = Child::spawn(
                    "sluice-service (region)",
                    node_command(&format!("127.0.0.1:{port}"), &dir.join("rules.toml"), &redis.url(), 500)
                        .args(["--global-store", &format!("rediss://sluice@127.0.0.1:{}", link.port())])
                        .arg("--global-store-ca-file")
                        .arg(tls.ca())
                        .arg("--global-store-password-file")
                        .arg(dir.join("global-password"))
                        .args(["--region", &format!("r{i}")])
                        .args(args),
                );
                Region {
                    port,
                    node,
                    link,
                    redis,
                }
            })
            .collect();
        for r in &regions {
            wait_for_port(r.port, Duration::from_secs(30));
            // The node connects to the global store in the background: until it has, a check
            // of a new client cannot get its quota's first lease.
            let mut checker = Checker::connect(r.port);
            let started = std::time::Instant::now();
            while !checker.check("/", "fixture-warm-up") {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "region {} never admitted a check",
                    r.port
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Regions {
            regions,
            global,
            dir,
            _tls: tls,
        }
    }

    /// The value of the series `series` (name and labels as written) on region `i`'s node.
    pub fn metric(&self, i: usize, series: &str) -> f64 {
        let text = crate::http::http(self.regions[i].port, "GET", "/metrics", &[]).body;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} on region {i}'s node"))
    }
}

/// A proxy in a region: `sluice-harness proxy` running the filter, leasing (a 20 ms timer,
/// the rules polled every second) with its region's node as its check cluster, in front of
/// a demo upstream.
pub struct RegionProxy {
    /// The proxy's port.
    pub port: u16,
    admin: u16,
    _proxy: Child,
    _upstream: Child,
}

impl RegionProxy {
    /// Filter metric `name`; panics, naming it, when the filter has no such metric.
    pub fn metric(&self, name: &str) -> i64 {
        let stats = crate::http::http(self.admin, "GET", "/stats", &[]).body;
        let stats: serde_json::Value =
            serde_json::from_str(&stats).unwrap_or_else(|e| panic!("proxy stats {stats:?}: {e}"));
        stats["metrics"][name]
            .as_i64()
            .unwrap_or_else(|| panic!("the proxy has no metric {name}: {stats}"))
    }
}

impl Regions {
    /// A proxy leasing through region `i`'s node.
    pub fn proxy(&self, i: usize) -> RegionProxy {
        let mut filter: serde_json::Value = serde_json::from_str(FILTER).expect("JSON");
        filter["lease"] = serde_json::json!({"tick_ms": 20, "poll_ms": 1000});
        let config = self.dir.join(&format!("filter-{i}.json"));
        std::fs::write(&config, filter.to_string()).expect("filter config");
        let (port, admin, upstream) = (free_port(), free_port(), free_port());
        let upstream_child = Child::spawn("demo upstream", &mut upstream_command(upstream));
        let proxy = Child::spawn(
            "sluice-harness proxy (region)",
            proxy_command(port, &config, upstream, &[self.regions[i].port])
                .args(["--admin", &format!("127.0.0.1:{admin}")]),
        );
        for p in [upstream, port, admin] {
            wait_for_port(p, Duration::from_secs(30));
        }
        RegionProxy {
            port,
            admin,
            _proxy: proxy,
            _upstream: upstream_child,
        }
    }
}

/// Seconds since the Unix epoch: the clock the stores count windows by.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A check client on one keep-alive connection.
pub struct Checker {
    port: u16,
    stream: BufReader<TcpStream>,
}

impl Checker {
    /// Connects to the node on `port`.
    pub fn connect(port: u16) -> Checker {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the node");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        Checker {
            port,
            stream: BufReader::new(stream),
        }
    }

    /// Checks a request of `user` on `path`: whether it was allowed.
    pub fn check(&mut self, path: &str, user: &str) -> bool {
        let body = format!(r#"{{"identities":{{"user":"{user}"}},"method":"GET","path":"{path}","cost":1}}"#);
        let request = format!(
            "POST /v1/check HTTP/1.1\r\nhost: sluice.test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = self
            .exchange(request.as_bytes())
            .unwrap_or_else(|e| panic!("check on port {}: {e}", self.port));
        let json: serde_json::Value =
            serde_json::from_slice(&answer).unwrap_or_else(|e| panic!("check answer is not JSON: {e}"));
        json["allowed"]
            .as_bool()
            .unwrap_or_else(|| panic!("check answer without `allowed`: {json}"))
    }

    fn exchange(&mut self, request: &[u8]) -> std::io::Result<Vec<u8>> {
        self.stream.get_mut().write_all(request)?;
        let mut status = String::new();
        self.stream.read_line(&mut status)?;
        if !status.starts_with("HTTP/1.1 200") {
            return Err(std::io::Error::other(format!("status {}", status.trim())));
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().map_err(std::io::Error::other)?;
                }
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body)?;
        Ok(body)
    }
}
