//! Real Redis servers and clusters on loopback ports, in plain text or TLS, open or behind an
//! ACL user.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, wait_for_port, Child};
use crate::TlsFiles;

pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{tag}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// `redis-server` in `dir` with `args` (the port's among them), persisting nothing.
fn redis_command(dir: &Path, args: &[String]) -> Command {
    let mut c = Command::new("redis-server");
    c.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// `redis-cli -p PORT flags... args...` output; panics if redis-cli cannot run.
pub(crate) fn run_cli(port: u16, flags: &[String], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(flags)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}; run scripts/setup"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `redis-cli -p PORT args...` output, in plain text and as the default user; panics if
/// redis-cli cannot run.
fn cli(port: u16, args: &[&str]) -> String {
    run_cli(port, &[], args)
}

fn path_arg(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
        .to_owned()
}

/// How to start a `redis-server` (or a cluster's nodes, or a sentinel set's data servers).
/// The default is a plain-text server that lets anyone in.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// Serve TLS only, with these files: `--tls-port PORT --port 0`, the server certificate
    /// and the CA; a client may present a certificate (then it must be signed by the CA) or
    /// not. The server also speaks TLS to its master (`--tls-replication yes`).
    pub tls: Option<TlsFiles>,
    /// With `tls`: refuse clients that present no certificate (`--tls-auth-clients yes`).
    pub tls_auth_clients_required: bool,
    /// `(NAME, PASSWORD)`: an ACL user allowed everything, the `default` user disabled, so
    /// that only this user can log in. The server authenticates to its master as this user
    /// (`--masteruser`, `--masterauth`).
    pub user: Option<(String, String)>,
    /// Replicate the server on 127.0.0.1 at this port (`--replicaof`).
    pub replica_of: Option<u16>,
    /// More `redis-server` arguments, last (so they override the others).
    pub extra: Vec<String>,
}

impl RedisOptions {
    /// Options for a TLS server with `tls`.
    pub fn tls(tls: &TlsFiles) -> RedisOptions {
        RedisOptions {
            tls: Some(tls.clone()),
            ..RedisOptions::default()
        }
    }

    /// These options with the ACL user `name` with password `password`.
    pub fn with_user(self, name: &str, password: &str) -> RedisOptions {
        RedisOptions {
            user: Some((name.to_owned(), password.to_owned())),
            ..self
        }
    }

    /// `redis` or `rediss` (with TLS).
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// `tls-auth-clients`' value.
    pub(crate) fn tls_auth_clients(&self) -> &'static str {
        if self.tls_auth_clients_required {
            "yes"
        } else {
            "optional"
        }
    }

    /// `redis-server` arguments for a server listening on `port`: the port, TLS, ACL,
    /// replication, then `extra`.
    pub(crate) fn server_args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(|&s| s.to_owned()));
        match &self.tls {
            None => push(&["--port", &port.to_string()]),
            Some(tls) => push(&[
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &path_arg(tls.server_cert()),
                "--tls-key-file",
                &path_arg(tls.server_key()),
                "--tls-ca-cert-file",
                &path_arg(tls.ca()),
                "--tls-auth-clients",
                self.tls_auth_clients(),
                "--tls-replication",
                "yes",
            ]),
        }
        if let Some((name, password)) = &self.user {
            push(&["--user", "default", "off"]);
            push(&["--user", name, "on", &format!(">{password}"), "~*", "&*", "+@all"]);
            push(&["--masteruser", name, "--masterauth", password]);
        }
        if let Some(master) = self.replica_of {
            push(&["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// `redis-cli` flags for TLS (with the client certificate), if any.
    pub(crate) fn tls_cli_flags(&self) -> Vec<String> {
        match &self.tls {
            None => Vec::new(),
            Some(tls) => vec![
                "--tls".to_owned(),
                "--cacert".to_owned(),
                path_arg(tls.ca()),
                "--cert".to_owned(),
                path_arg(tls.client_cert()),
                "--key".to_owned(),
                path_arg(tls.client_key()),
            ],
        }
    }

    /// `redis-cli` flags to reach a server started with these options: TLS and the user.
    pub(crate) fn cli_flags(&self) -> Vec<String> {
        let mut flags = self.tls_cli_flags();
        if let Some((name, password)) = &self.user {
            flags.extend(["--user", name, "--pass", password, "--no-auth-warning"].map(str::to_owned));
        }
        flags
    }
}

/// The check calls (`FCALL`s of the check library and `EVALSHA`s of the check script) in
/// `commandstats` (the text of `INFO commandstats`).
pub fn check_calls(commandstats: &str) -> u64 {
    ["cmdstat_fcall:calls=", "cmdstat_evalsha:calls="]
        .iter()
        .map(|stat| {
            commandstats
                .lines()
                .find_map(|l| l.strip_prefix(stat))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Check calls ([`check_calls`]) served by the Redis on each of `ports` since
/// `CONFIG RESETSTAT`, summed.
pub fn script_calls(ports: &[u16]) -> u64 {
    ports
        .iter()
        .map(|&p| check_calls(&cli(p, &["info", "commandstats"])))
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
    options: RedisOptions,
    child: Child,
}

impl RedisServer {
    /// Starts a plain-text server open to anyone and waits until it accepts connections.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&RedisOptions::default())
    }

    /// Starts a server with `options` and waits until it accepts connections (TCP: a TLS
    /// server may not have finished anything else, a replica may not have synced).
    pub fn start_with(options: &RedisOptions) -> RedisServer {
        let port = free_port();
        let dir = temp_dir("redis");
        let child = Child::spawn("redis-server", &mut redis_command(&dir, &options.server_args(port)));
        wait_for_port(port, Duration::from_secs(10));
        RedisServer {
            port,
            dir,
            options: options.clone(),
            child,
        }
    }

    /// The server's port (its TLS port with TLS).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The options it was started with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:PORT` with TLS (never credentials).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.options.scheme(), self.port)
    }

    /// Kills the server (as a crash would).
    pub fn stop(&mut self) {
        self.child.kill();
    }

    /// Starts it again on the same port with the same options (empty: nothing is
    /// persisted, and what a replica's master sent it is deleted).
    pub fn restart(&mut self) {
        let options = self.options.clone();
        self.restart_with(options);
    }

    /// Starts it again on the same port, empty, with `options` from now on.
    pub(crate) fn restart_with(&mut self, options: RedisOptions) {
        self.child.kill();
        // A replica keeps the last data set its master sent in dump.rdb, and would load it.
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        self.options = options;
        self.child = Child::spawn(
            "redis-server",
            &mut redis_command(&self.dir, &self.options.server_args(self.port)),
        );
        wait_for_port(self.port, Duration::from_secs(10));
    }

    /// Runs a `redis-cli` command against it (over TLS with the client certificate, and as
    /// the ACL user, if it has them) and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        run_cli(self.port, &self.options.cli_flags(), args)
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
    options: RedisOptions,
    /// `redis-cli` flags for TLS and the user.
    cli_flags: Vec<String>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits for `cluster_state:ok` and for the
    /// replicas to sync; plain text, open to anyone.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_with(masters, replicas, &RedisOptions::default())
    }

    /// As [`RedisCluster::start`], every node started with `options` (TLS, the cluster bus
    /// and replication included, and/or an ACL user); `options.replica_of` must be unset.
    pub fn start_with(masters: usize, replicas: usize, options: &RedisOptions) -> RedisCluster {
        assert!(
            options.replica_of.is_none(),
            "a cluster's nodes are not replicas of another server"
        );
        let cli_flags = options.cli_flags();
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
                let mut args = options.server_args(p);
                let cluster = [
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
                // Before `options.extra`, so that those override these.
                let at = args.len() - options.extra.len();
                args.splice(at..at, cluster.iter().map(|&s| s.to_owned()));
                if options.tls.is_some() {
                    args.splice(at..at, ["--tls-cluster".to_owned(), "yes".to_owned()]);
                }
                Child::spawn("redis-server", &mut redis_command(&node_dir, &args))
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
            .args(&cli_flags)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}; run scripts/setup"));
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster {
            ports,
            children,
            dir,
            options: options.clone(),
            cli_flags,
        };
        cluster.wait_ok(Duration::from_secs(30));
        cluster.wait_replicas_synced(Duration::from_secs(30));
        cluster
    }

    /// Waits until every replica has its master link up: only then can it be promoted.
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        self.wait_until(timeout, "replicas not synced", |p| {
            let info = self.cli(p, &["info", "replication"]);
            !info.contains("role:slave") || info.contains("master_link_status:up")
        });
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub fn wait_ok(&self, timeout: Duration) {
        self.wait_until(timeout, "cluster not ok", |p| {
            self.cli(p, &["cluster", "info"]).contains("cluster_state:ok")
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

    /// `redis+cluster://H1:P1,H2:P2,...` over every node (`rediss+cluster://` with TLS; never
    /// credentials).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("{}+cluster://{}", self.options.scheme(), nodes.join(","))
    }

    /// The options every node was started with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// Runs a `redis-cli` command against the node on `port` (with TLS and the user, if the
    /// cluster has them) and returns its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        run_cli(port, &self.cli_flags, args)
    }

    /// Ports of the nodes that are masters now.
    pub fn master_ports(&self) -> Vec<u16> {
        self.live_ports()
            .filter(|&p| self.cli(p, &["role"]).starts_with("master"))
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
