//! Real Redis servers and clusters on loopback ports.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, wait_for_port, Child};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{tag}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

fn redis_command(port: u16, dir: &PathBuf, extra: &[&str]) -> Command {
    let mut c = Command::new("redis-server");
    c.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(dir)
    .args(extra)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

/// `redis-cli -p PORT args...` output; panics on failure.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}; run scripts/setup"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `EVALSHA` calls counted in the text of `INFO commandstats` (since the server started or
/// its last `CONFIG RESETSTAT`); 0 when there were none.
pub fn evalsha_calls(commandstats: &str) -> u64 {
    commandstats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `EVALSHA` calls served by the Redis on each of `ports` since `CONFIG RESETSTAT`, summed.
pub fn script_calls(ports: &[u16]) -> u64 {
    ports
        .iter()
        .map(|&p| evalsha_calls(&cli(p, &["info", "commandstats"])))
        .sum()
}

/// `CONFIG RESETSTAT` on the Redis on each of `ports`.
pub fn reset_stats(ports: &[u16]) {
    for &p in ports {
        let reply = cli(p, &["config", "resetstat"]);
        assert_eq!(reply.trim(), "OK", "CONFIG RESETSTAT on port {p}");
    }
}

/// One `redis-server` on a free port, stopped when dropped.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl RedisServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> RedisServer {
        let port = free_port();
        let dir = temp_dir("redis");
        let child = Child::spawn("redis-server", &mut redis_command(port, &dir, &[]));
        wait_for_port(port, Duration::from_secs(10));
        RedisServer { port, dir, child }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would).
    pub fn stop(&mut self) {
        self.child.kill();
    }

    /// Starts it again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.child.kill();
        self.child = Child::spawn("redis-server", &mut redis_command(self.port, &self.dir, &[]));
        wait_for_port(self.port, Duration::from_secs(10));
    }

    /// Runs a `redis-cli` command against it and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `masters` masters with `replicas` replicas each, on free ports.
pub struct RedisCluster {
    ports: Vec<u16>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits for `cluster_state:ok`.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let dir = temp_dir("cluster");
        let n = masters * (1 + replicas);
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let children = ports
            .iter()
            .map(|&p| {
                let node_dir = dir.join(p.to_string());
                let _ = std::fs::create_dir_all(&node_dir);
                let conf = format!("nodes-{p}.conf");
                // The bus port is explicit: by default it is the port + 10,000, which can be
                // taken, or past 65535.
                let bus = free_port().to_string();
                let extra = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "1000",
                    // Replicas sync at once (the default waits 5 s for more replicas to
                    // share a transfer): until synced, a replica refuses to fail over.
                    "--repl-diskless-sync-delay",
                    "0",
                ];
                Child::spawn("redis-server", &mut redis_command(p, &node_dir, &extra))
            })
            .collect();
        for &p in &ports {
            wait_for_port(p, Duration::from_secs(10));
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}; run scripts/setup"));
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { ports, children, dir };
        cluster.wait_ok(Duration::from_secs(30));
        cluster.wait_replicas_synced(Duration::from_secs(30));
        cluster
    }

    /// Waits until every replica has its master link up: only then can it be promoted.
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        self.wait_until(timeout, "replicas not synced", |p| {
            let info = cli(p, &["info", "replication"]);
            !info.contains("role:slave") || info.contains("master_link_status:up")
        });
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub fn wait_ok(&self, timeout: Duration) {
        self.wait_until(timeout, "cluster not ok", |p| {
            cli(p, &["cluster", "info"]).contains("cluster_state:ok")
        });
    }

    /// Polls every 100 ms until `node_ok` holds for every live node; panics with `what`
    /// after `timeout`.
    fn wait_until(&self, timeout: Duration, what: &str, node_ok: impl Fn(u16) -> bool) {
        let start = Instant::now();
        while !self.live_ports().all(&node_ok) {
            assert!(start.elapsed() < timeout, "{what} after {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ports of the nodes the test did not kill (a node that crashed on its own stays in,
    /// so that waiting for it fails).
    fn live_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports
            .iter()
            .zip(&self.children)
            .filter(|(_, c)| c.id().is_some())
            .map(|(&p, _)| p)
    }

    /// `redis+cluster://H1:P1,H2:P2,...` over every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// Ports of the nodes that are masters now.
    pub fn master_ports(&self) -> Vec<u16> {
        self.live_ports()
            .filter(|&p| cli(p, &["role"]).starts_with("master"))
            .collect()
    }

    /// Kills the node on `port` (a crash).
    pub fn kill(&mut self, port: u16) {
        if let Some(i) = self.ports.iter().position(|&p| p == port) {
            self.children[i].kill();
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            c.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
