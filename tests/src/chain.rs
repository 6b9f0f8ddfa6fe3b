//! The whole chain as a user runs it, all real processes on loopback: a demo upstream, two
//! `sluice-harness proxy` processes running `sluice_filter.wasm`, two `sluice-service`
//! nodes and a real Redis (one server, or a Redis Cluster). Everything is torn down on drop,
//! even when a test fails.
//!
//! The binaries are built by the fixture itself into the test's own target directory and
//! profile; the filter module is built like the filter's tests build it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sluice_testkit::{free_port, wait_for_port, Child, RedisCluster, RedisOptions, RedisSentinel, RedisServer};

pub use crate::build::{binary, filter_wasm};
use crate::envoy::{sluice_example, Envoy};
use crate::http::http;

/// Rules of the default chain: one fail-open rule per IP, one fail-closed rule per API key.
pub const RULES: &str = r#"
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
/// Every client is `source.address` (127.0.0.1) unless a test trusts proxies in front
/// ([`Options::trusted_hops`]).
pub const FILTER: &str = r#"{
  "check": {"cluster": "sluice_check", "authority": "sluice-check", "path": "/v1/check", "timeout_ms": 2000},
  "identities": {"ip": {"header": "x-forwarded-for", "trusted_hops": 0}, "api_key": {"header": "x-api-key"},
                 "user": {"header": "x-user-id"}, "tier": {"header": "x-tier"}},
  "local": {"by": "ip", "rate_per_s": 1000, "burst": 1000, "max_keys": 10000},
  "failure": {"mode": "open", "fallback": {"rate_per_s": 50, "burst": 100},
              "breaker": {"failures": 1000, "cooldown_ms": 1000}},
  "headers": "all"
}"#;

/// The admin API's bearer token in every chain.
pub const ADMIN_TOKEN: &str = "chain-admin-token";

/// `sluice-demo-upstream` listening on `port`.
pub fn upstream_command(port: u16) -> Command {
    let mut c = Command::new(binary("sluice-demo-upstream"));
    c.args(["--listen", &format!("127.0.0.1:{port}")]);
    c
}

/// `sluice-service` listening on `listen` (`HOST:PORT` or `unix:PATH`) with the rules file
/// `rules`, over the store at `store_url`.
pub fn node_command(listen: &str, rules: &Path, store_url: &str, store_timeout_ms: u64) -> Command {
    let mut c = Command::new(binary("sluice-service"));
    c.args(["--listen", listen])
        .arg("--rules")
        .arg(rules)
        .args(["--store", store_url])
        .args(["--store-timeout-ms", &store_timeout_ms.to_string()]);
    c
}

/// How a service node of a chain is started.
struct NodeSpec {
    listen: String,
    store_url: String,
    store_timeout_ms: u64,
    /// Its flags past [`node_command`]'s.
    args: Vec<String>,
}

impl NodeSpec {
    fn spawn(&self, dir: &Path) -> Child {
        let mut c = node_command(
            &self.listen,
            &dir.join("rules.toml"),
            &self.store_url,
            self.store_timeout_ms,
        );
        c.args(&self.args);
        Child::spawn("sluice-service", &mut c)
    }
}

/// `sluice-harness proxy` on `port` running the filter with the configuration in `config`,
/// in front of the upstream on `upstream`, its check cluster `sluice_check` = `checks`.
/// (No `--cluster` when `checks` is empty: the filter calls a `host:port`, as on Nginx.)
pub fn proxy_command(port: u16, config: &Path, upstream: u16, checks: &[u16]) -> Command {
    let checks: Vec<String> = checks.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut c = Command::new(binary("sluice-harness"));
    c.arg("proxy")
        .arg("--wasm")
        .arg(filter_wasm())
        .arg("--config")
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", &format!("127.0.0.1:{upstream}")]);
    if !checks.is_empty() {
        c.args(["--cluster", &format!("sluice_check={}", checks.join(","))]);
    }
    c
}

/// Where the node that would have listened on `port` listens instead with
/// [`ProxyHost::NginxUnixSocket`].
fn node_socket(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("node-{port}.sock"))
}

/// The filter configuration `filter` with `check.cluster` set to `address`.
pub fn with_check_address(filter: &str, address: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(filter).expect("filter configuration is JSON");
    config["check"]["cluster"] = address.into();
    config.to_string()
}

/// The counter store under the service nodes.
pub enum Store {
    /// One `redis-server`.
    Redis(RedisServer),
    /// A Redis Cluster.
    Cluster(RedisCluster),
    /// A master, its replica and three sentinels.
    Sentinel(RedisSentinel),
}

/// The host the proxies play, as `sluice-harness proxy --host-flavor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHost {
    /// Envoy: the check cluster lists both nodes.
    Envoy,
    /// Nginx with ngx_wasm_module: each proxy's filter calls one node at its `host:port`.
    Nginx,
    /// Nginx calling each node over a Unix socket (`unix:PATH`), the node's `--listen`:
    /// a connection per call, as ngx_wasm_module makes them.
    NginxUnixSocket,
    /// A real Envoy ([`Options::envoy_workers`]) from `examples/envoy.yaml`, its check cluster listing both
    /// nodes ([`crate::envoy::sluice_example`]): the filter's configuration is the example's,
    /// not [`Options::filter`].
    RealEnvoy,
}

/// The data token of a real Envoy's chain when a test names none: the example sends one.
const ENVOY_DATA_TOKEN: &str = "chain-data-token";

/// How to build a chain.
pub struct Options {
    /// The rules file's text.
    pub rules: String,
    /// The filter's configuration (JSON).
    pub filter: String,
    /// Masters of a Redis Cluster with one replica each; 0 for a single Redis.
    pub cluster_masters: usize,
    /// `--store-timeout-ms` of the nodes.
    pub store_timeout_ms: u64,
    /// The host the proxies play.
    pub host: ProxyHost,
    /// The data token the nodes ask for (`--data-token-file`) and the filter sends
    /// (`check.token`); `None` for none.
    pub data_token: Option<String>,
    /// Proxies in front whose `x-forwarded-for` entries are trusted, so a test client can
    /// name its IP: as operations.md says to set it on each host — Envoy's
    /// `xff_num_trusted_hops` (the harness's `--xff-num-trusted-hops`; the filter reads
    /// the `source.address` Envoy derives), the filter's `identities.ip.trusted_hops` on
    /// Nginx, which hands the filter the header as it came.
    pub trusted_hops: u32,
    /// With [`ProxyHost::RealEnvoy`]: more `(from, to)` replacements in the example, after
    /// the chain's own (a failure mode, a breaker's threshold).
    pub envoy_edits: Vec<(&'static str, &'static str)>,
    /// More flags for every node.
    pub node_args: Vec<&'static str>,
    /// With [`ProxyHost::RealEnvoy`]: each Envoy's worker threads (`--concurrency`).
    pub envoy_workers: u32,
    /// The store is a master, a replica and three sentinels (not with `cluster_masters`).
    pub sentinel: bool,
    /// An upstream already listening on this port, instead of the demo upstream.
    pub upstream: Option<u16>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            rules: RULES.to_owned(),
            filter: FILTER.to_owned(),
            cluster_masters: 0,
            store_timeout_ms: 200,
            host: ProxyHost::Envoy,
            data_token: None,
            trusted_hops: 0,
            envoy_edits: Vec::new(),
            node_args: Vec::new(),
            envoy_workers: 2,
            sentinel: false,
            upstream: None,
        }
    }
}

/// `filter` (JSON) with `check.token` set to `token`.
pub fn with_token(filter: &str, token: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(filter).expect("filter configuration is JSON");
    config["check"]["token"] = token.into();
    config.to_string()
}

/// `filter` (JSON) reading the client's IP from `x-forwarded-for` with `hops` trusted
/// proxies in front (`identities.ip`).
pub fn with_trusted_hops(filter: &str, hops: u32) -> String {
    let mut config: serde_json::Value = serde_json::from_str(filter).expect("filter configuration is JSON");
    config["identities"]["ip"] = serde_json::json!({"header": "x-forwarded-for", "trusted_hops": hops});
    config.to_string()
}

/// A running chain.
pub struct Chain {
    /// The demo upstream's port.
    pub upstream: u16,
    /// The proxies' ports.
    pub proxies: [u16; 2],
    /// The proxies' admin ports (`GET /stats`).
    pub proxy_admins: [u16; 2],
    /// The service nodes' ports.
    pub node_ports: [u16; 2],
    /// The service nodes' admin API ports (`--admin-listen`).
    pub admin_ports: [u16; 2],
    /// The service nodes, by index.
    pub nodes: Vec<Child>,
    /// The proxies, by index (the harness's; none with real Envoys).
    pub proxy_children: Vec<Child>,
    /// The real Envoys, by index ([`ProxyHost::RealEnvoy`]).
    pub envoys: Vec<Envoy>,
    /// The counter store.
    pub store: Store,
    /// How each node was started ([`Chain::restart_node`]).
    node_specs: Vec<NodeSpec>,
    dir: PathBuf,
    _upstream: Option<Child>,
}

impl Chain {
    /// The default chain: [`RULES`], [`FILTER`], one Redis.
    pub fn start() -> Chain {
        Chain::with(Options::default())
    }

    /// Upstream, store, two service nodes over it, two proxies whose check cluster lists
    /// both nodes (calls take the nodes in turn).
    pub fn with(options: Options) -> Chain {
        let store = if options.cluster_masters > 0 {
            Store::Cluster(RedisCluster::start(options.cluster_masters, 1))
        } else if options.sentinel {
            Store::Sentinel(RedisSentinel::start(&RedisOptions::default()))
        } else {
            Store::Redis(RedisServer::start())
        };
        let store_url = match &store {
            Store::Redis(r) => r.url(),
            Store::Cluster(c) => c.url(),
            Store::Sentinel(s) => s.url(),
        };
        let dir = std::env::temp_dir().join(format!("sluice-chain-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("rules.toml"), &options.rules).expect("rules file");
        let data_token = match options.host {
            ProxyHost::RealEnvoy => Some(options.data_token.clone().unwrap_or_else(|| ENVOY_DATA_TOKEN.into())),
            _ => options.data_token.clone(),
        };
        let mut filter = match &options.data_token {
            Some(token) => with_token(&options.filter, token),
            None => options.filter.clone(),
        };
        if options.host != ProxyHost::Envoy {
            filter = with_trusted_hops(&filter, options.trusted_hops);
        }
        std::fs::write(dir.join("filter.json"), &filter).expect("filter config");
        std::fs::write(dir.join("admin-token"), ADMIN_TOKEN).expect("token file");

        let (upstream, upstream_child) = match options.upstream {
            Some(port) => (port, None),
            None => {
                let port = free_port();
                (port, Some(Child::spawn("demo upstream", &mut upstream_command(port))))
            }
        };
        let node_ports = [free_port(), free_port()];
        let admin_ports = [free_port(), free_port()];
        if let Some(token) = &data_token {
            std::fs::write(dir.join("data-token"), token).expect("token file");
        }
        let node_specs: Vec<NodeSpec> = node_ports
            .iter()
            .zip(&admin_ports)
            .map(|(port, admin)| {
                let listen = match options.host {
                    ProxyHost::NginxUnixSocket => format!("unix:{}", node_socket(&dir, *port).display()),
                    _ => format!("127.0.0.1:{port}"),
                };
                let mut args = vec![
                    "--admin-listen".to_owned(),
                    format!("127.0.0.1:{admin}"),
                    "--admin-token-file".to_owned(),
                    dir.join("admin-token").display().to_string(),
                ];
                if data_token.is_some() {
                    args.extend([
                        "--data-token-file".to_owned(),
                        dir.join("data-token").display().to_string(),
                    ]);
                }
                args.extend(options.node_args.iter().map(|a| (*a).to_owned()));
                NodeSpec {
                    listen,
                    store_url: store_url.clone(),
                    store_timeout_ms: options.store_timeout_ms,
                    args,
                }
            })
            .collect();
        let nodes = node_specs.iter().map(|spec| spec.spawn(&dir)).collect();
        let proxies = [free_port(), free_port()];
        let proxy_admins = [free_port(), free_port()];
        let proxy_children = (0..2)
            .filter(|_| options.host != ProxyHost::RealEnvoy)
            .map(|i| {
                let mut command = match options.host {
                    ProxyHost::Envoy => {
                        let mut c = proxy_command(proxies[i], &dir.join("filter.json"), upstream, &node_ports);
                        c.args(["--xff-num-trusted-hops", &options.trusted_hops.to_string()]);
                        c
                    }
                    ProxyHost::RealEnvoy => unreachable!("real Envoys are started below"),
                    ProxyHost::Nginx | ProxyHost::NginxUnixSocket => {
                        let config = dir.join(format!("filter-{i}.json"));
                        let check = match options.host {
                            ProxyHost::NginxUnixSocket => {
                                format!("unix:{}", node_socket(&dir, node_ports[i]).display())
                            }
                            _ => format!("127.0.0.1:{}", node_ports[i]),
                        };
                        std::fs::write(&config, with_check_address(&filter, &check)).expect("filter config");
                        let mut c = proxy_command(proxies[i], &config, upstream, &[]);
                        c.args(["--host-flavor", "nginx"]);
                        c
                    }
                };
                Child::spawn(
                    "sluice-harness proxy",
                    command.args(["--admin", &format!("127.0.0.1:{}", proxy_admins[i])]),
                )
            })
            .collect();
        // A node binds its data listener before its admin one: with the data API on a Unix
        // socket, its admin port says it is up.
        let data_ports: &[u16] = match options.host {
            ProxyHost::NginxUnixSocket => &[],
            _ => &node_ports,
        };
        let harness_ports: &[u16] = match options.host {
            ProxyHost::RealEnvoy => &[],
            _ => &[proxies[0], proxies[1], proxy_admins[0], proxy_admins[1]],
        };
        for port in [upstream]
            .iter()
            .chain(data_ports)
            .chain(&admin_ports)
            .chain(harness_ports)
        {
            wait_for_port(*port, Duration::from_secs(30));
        }
        // Real Envoys once the nodes are up (each waits for its own listener).
        let envoys = (0..2)
            .filter(|_| options.host == ProxyHost::RealEnvoy)
            .map(|i| {
                let token = data_token.as_deref().unwrap_or(ENVOY_DATA_TOKEN);
                let yaml = sluice_example(proxies[i], upstream, &node_ports, token, options.trusted_hops);
                let yaml = crate::envoy::substitute(&yaml, &options.envoy_edits);
                Envoy::start(&yaml, proxies[i], options.envoy_workers)
            })
            .collect::<Vec<_>>();
        let proxy_admins = match envoys.as_slice() {
            [a, b] => [a.admin, b.admin],
            _ => proxy_admins,
        };
        Chain {
            upstream,
            proxies,
            proxy_admins,
            node_ports,
            admin_ports,
            nodes,
            node_specs,
            proxy_children,
            envoys,
            store,
            dir,
            _upstream: upstream_child,
        }
    }

    /// Requests the upstream has served.
    pub fn upstream_count(&self) -> u64 {
        let r = http(self.upstream, "GET", "/__count", &[]);
        r.body
            .trim()
            .trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or_else(|_| panic!("odd count {:?}", r.body))
    }

    /// The rules file the nodes watch.
    pub fn rules_file(&self) -> PathBuf {
        self.dir.join("rules.toml")
    }

    /// The single Redis; panics on a cluster chain.
    pub fn redis(&mut self) -> &mut RedisServer {
        match &mut self.store {
            Store::Redis(r) => r,
            _ => panic!("this chain runs no single Redis"),
        }
    }

    /// The Sentinel-watched store; panics on another chain.
    pub fn sentinel(&mut self) -> &mut RedisSentinel {
        match &mut self.store {
            Store::Sentinel(s) => s,
            _ => panic!("this chain runs no Sentinel"),
        }
    }

    /// Kills service node `i` (a crash) and starts it again as it was; returns once it
    /// listens again.
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].kill();
        self.nodes[i] = self.node_specs[i].spawn(&self.dir);
        wait_for_port(self.admin_ports[i], Duration::from_secs(30));
    }

    /// The Redis Cluster; panics on a single-Redis chain.
    pub fn cluster(&mut self) -> &mut RedisCluster {
        match &mut self.store {
            Store::Cluster(c) => c,
            _ => panic!("this chain runs no Redis Cluster"),
        }
    }

    /// Proxy `i`'s `GET /stats` (requests, check calls, VM memory, filter metrics).
    pub fn proxy_stats(&self, i: usize) -> serde_json::Value {
        let r = http(self.proxy_admins[i], "GET", "/stats", &[]);
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("proxy stats {:?}: {e}", r.body))
    }

    /// A counter of node `i`'s `/metrics`, by its full series name (labels included);
    /// `None` when the node does not export that series.
    pub fn node_metric(&self, i: usize, series: &str) -> Option<f64> {
        // From the admin listener, which every chain's nodes have on TCP.
        let r = http(self.admin_ports[i], "GET", "/metrics", &[]);
        let value = r
            .body
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))?;
        Some(
            value
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("node {i}: {series} = {value:?}: {e}")),
        )
    }

    /// The series summed over the nodes that export it; panics, naming it, when none does
    /// (a misspelt or missing series must not read as 0).
    pub fn nodes_metric(&self, series: &str) -> f64 {
        let values: Vec<f64> = (0..2).filter_map(|i| self.node_metric(i, series)).collect();
        assert!(!values.is_empty(), "no node exports the series {series}");
        values.iter().sum()
    }

    /// Asserts every service node is still running (not crashed) and answers `/metrics`.
    pub fn assert_nodes_up(&mut self) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            assert!(node.is_running(), "service node {i} is not running");
            // From the admin listener, which every chain's nodes have on TCP.
            let r = http(self.admin_ports[i], "GET", "/metrics", &[]);
            assert_eq!(r.status, 200, "service node {i} does not answer: {}", r.body);
        }
    }

    /// Asserts every proxy is still running and forwards a request from a fresh client
    /// (`x-forwarded-for: 192.0.2.99`, its IP with one trusted hop).
    pub fn assert_proxies_up(&mut self) {
        for (i, proxy) in self.proxy_children.iter_mut().enumerate() {
            assert!(proxy.is_running(), "proxy {i} is not running");
        }
        for envoy in &mut self.envoys {
            envoy.assert_healthy();
        }
        for (i, port) in self.proxies.iter().enumerate() {
            let r = http(*port, "GET", "/ok", &[("x-forwarded-for", "192.0.2.99")]);
            assert_eq!(r.status, 200, "proxy {i} does not forward: {}", r.body);
        }
    }

    /// A process's resident memory in bytes, from /proc.
    pub fn rss_bytes(child: &Child) -> u64 {
        let pid = child.id().expect("the process runs");
        Chain::rss_kib(pid).expect("/proc status") * 1024
    }

    /// The resident memory of process `pid` in KiB (`VmRSS`), unless it has ended.
    pub fn rss_kib(pid: u32) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
        kib.trim().trim_end_matches("kB").trim().parse().ok()
    }

    /// A `(name, value)` pair for an admin call's bearer token.
    pub fn bearer() -> (&'static str, String) {
        ("authorization", format!("Bearer {ADMIN_TOKEN}"))
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
