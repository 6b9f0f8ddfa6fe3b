//! A Redis Sentinel set on loopback: a master, its replica and three sentinels.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, wait_for_port, Child};
use crate::redis::{run_cli, temp_dir};
use crate::{RedisOptions, RedisServer, WanLink};

/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "sluice";

/// How many sentinels watch the master; a failover takes the votes of 2.
const SENTINELS: usize = 3;

/// One master, one replica of it, and three sentinels watching them under the name
/// `sluice`; everything is killed and its files removed when dropped.
///
/// The data servers are started with the [`RedisOptions`] given (TLS, an ACL user; the
/// sentinels then speak TLS too and authenticate to the data servers as that user, but ask
/// no password themselves). A master is deemed down after 1 s of silence; the failover
/// timeout is 10 s (see [`RedisSentinel::set_failover_timeout`] before failing over twice).
pub struct RedisSentinel {
    /// The data servers: the first master first.
    data: Vec<RedisServer>,
    /// Index in `data` of the server [`RedisSentinel::kill_master`] killed, until restarted.
    killed: Option<usize>,
    sentinel_ports: Vec<u16>,
    sentinels: Vec<Child>,
    /// `redis-cli` flags for the sentinels (TLS) and for the data servers (TLS and the user).
    sentinel_flags: Vec<String>,
    data_flags: Vec<String>,
    /// The data servers' options, without `replica_of`.
    options: RedisOptions,
    scheme: &'static str,
    dir: PathBuf,
    /// The link the replica replicates through, with [`RedisSentinel::start_lagging`].
    link: Option<WanLink>,
    /// How long the oldest replication bytes the last kill dropped had been on the link.
    lag_at_kill: Duration,
}

/// `s` as a double-quoted Redis configuration value.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn path_value(path: &Path) -> String {
    quoted(
        path.to_str()
            .unwrap_or_else(|| panic!("{} is not UTF-8", path.display())),
    )
}

/// The configuration of a sentinel on `port` watching the master on `master`.
fn sentinel_conf(port: u16, master: u16, dir: &Path, options: &RedisOptions) -> String {
    let mut conf = String::new();
    let mut line = |l: String| {
        conf.push_str(&l);
        conf.push('\n');
    };
    match &options.tls {
        None => line(format!("port {port}")),
        Some(tls) => {
            line("port 0".into());
            line(format!("tls-port {port}"));
            line(format!("tls-cert-file {}", path_value(tls.server_cert())));
            line(format!("tls-key-file {}", path_value(tls.server_key())));
            line(format!("tls-ca-cert-file {}", path_value(tls.ca())));
            line("tls-replication yes".into());
            line(format!("tls-auth-clients {}", options.tls_auth_clients()));
        }
    }
    line("bind 127.0.0.1".into());
    line(format!("dir {}", path_value(dir)));
    line(format!("sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2"));
    line(format!("sentinel down-after-milliseconds {MASTER_NAME} 1000"));
    line(format!("sentinel failover-timeout {MASTER_NAME} 10000"));
    line(format!("sentinel parallel-syncs {MASTER_NAME} 1"));
    if let Some((name, password)) = &options.user {
        line(format!("sentinel auth-user {MASTER_NAME} {}", quoted(name)));
        line(format!("sentinel auth-pass {MASTER_NAME} {}", quoted(password)));
    }
    conf
}

/// `key value` pairs of a `redis-cli` reply that lists keys and values on alternate lines.
fn pairs(reply: &str) -> Vec<(&str, &str)> {
    let lines: Vec<&str> = reply.lines().collect();
    lines.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect()
}

impl RedisSentinel {
    /// Starts the master, its replica (and waits until it has synced), and the sentinels;
    /// returns once every sentinel watches the master and sees the replica and the two other
    /// sentinels. `options.replica_of` is ignored.
    pub fn start(options: &RedisOptions) -> RedisSentinel {
        RedisSentinel::start_lagging(options, None)
    }

    /// Like [`RedisSentinel::start`], but with `lag`, the replica replicates through a
    /// [`WanLink`] that delays each direction by it, and [`RedisSentinel::kill_master`] cuts
    /// that link too (the master's host is lost, with what was on the wire): what the master
    /// admitted in the last `lag` never reaches the replica.
    pub fn start_lagging(options: &RedisOptions, lag: Option<Duration>) -> RedisSentinel {
        let mut options = options.clone();
        options.replica_of = None;
        // Replicas sync at once (the default waits 5 s for more replicas to share a transfer).
        options
            .extra
            .splice(0..0, ["--repl-diskless-sync-delay".to_owned(), "0".to_owned()]);
        let master = RedisServer::start_with(&options);
        let link = lag.map(|lag| {
            let to = std::net::SocketAddr::from(([127, 0, 0, 1], master.port()));
            WanLink::start(to, lag).unwrap_or_else(|e| panic!("cannot start the replication link: {e}"))
        });
        let replica = RedisServer::start_with(&RedisOptions {
            replica_of: Some(link.as_ref().map_or(master.port(), WanLink::port)),
            ..options.clone()
        });
        let start = Instant::now();
        while !replica.cli(&["info", "replication"]).contains("master_link_status:up") {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the replica on port {} has not synced with its master on port {} after 30 s",
                replica.port(),
                master.port()
            );
            std::thread::sleep(Duration::from_millis(50));
        }

        let dir = temp_dir("sentinel");
        let sentinel_ports: Vec<u16> = (0..SENTINELS).map(|_| free_port()).collect();
        let sentinels = sentinel_ports
            .iter()
            .map(|&p| {
                let conf = dir.join(format!("sentinel-{p}.conf"));
                std::fs::write(&conf, sentinel_conf(p, master.port(), &dir, &options))
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", conf.display()));
                let mut command = Command::new("redis-server");
                command
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                Child::spawn("redis-sentinel", &mut command)
            })
            .collect();
        for &p in &sentinel_ports {
            wait_for_port(p, Duration::from_secs(10));
        }
        let set = RedisSentinel {
            data: vec![master, replica],
            killed: None,
            sentinel_ports,
            sentinels,
            sentinel_flags: options.tls_cli_flags(),
            data_flags: options.cli_flags(),
            scheme: options.scheme(),
            options,
            dir,
            link,
            lag_at_kill: Duration::ZERO,
        };
        set.wait_watching(Duration::from_secs(30));
        set
    }

    /// Waits until every sentinel sees the master, 1 replica and 2 other sentinels.
    fn wait_watching(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let mut unready = String::new();
            for &p in &self.sentinel_ports {
                let reply = self.cli_sentinel(p, &["sentinel", "master", MASTER_NAME]);
                let fields = pairs(&reply);
                let get = |k: &str| fields.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
                if get("num-slaves") != Some("1") || get("num-other-sentinels") != Some("2") {
                    let _ = write!(
                        unready,
                        "\n  sentinel {p}: num-slaves {:?}, num-other-sentinels {:?} ({})",
                        get("num-slaves"),
                        get("num-other-sentinels"),
                        reply.lines().next().unwrap_or("no reply")
                    );
                }
            }
            if unready.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "sentinels not watching the set after {timeout:?}:{unready}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `sluice`, the name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/sluice` (`rediss+sentinel://`
    /// with TLS; never credentials).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.sentinel_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("{}+sentinel://{}/{MASTER_NAME}", self.scheme, nodes.join(","))
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> &[u16] {
        &self.sentinel_ports
    }

    /// The two data servers' ports, the first master's first (whichever is master now).
    pub fn data_ports(&self) -> [u16; 2] {
        [self.data[0].port(), self.data[1].port()]
    }

    /// The options the data servers were started with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// What the sentinel on `port` answers `SENTINEL get-master-addr-by-name sluice` with:
    /// the master's port, or `None` if it did not answer that.
    fn master_port_from(&self, port: u16) -> Option<u16> {
        let reply = self.cli_sentinel(port, &["sentinel", "get-master-addr-by-name", MASTER_NAME]);
        let mut lines = reply.lines();
        match (lines.next(), lines.next()) {
            (Some("127.0.0.1"), Some(p)) => p.trim().parse().ok(),
            _ => None,
        }
    }

    /// The master's port, as the first sentinel that answers names it (it may be a master
    /// that died and has not been failed over yet).
    pub fn master_port(&self) -> u16 {
        self.sentinel_ports
            .iter()
            .find_map(|&p| self.master_port_from(p))
            .unwrap_or_else(|| panic!("no sentinel of {:?} names the master", self.sentinel_ports))
    }

    /// Sets the sentinels' `failover-timeout` (10 s at start; `SENTINEL SET`). Besides
    /// bounding a failover, it spaces them: a sentinel starts no failover within twice
    /// this time of the last one it started or voted in, so a second failover soon after a
    /// first one (or a retry after a split vote) may wait up to 20 s unless this is lowered.
    pub fn set_failover_timeout(&self, timeout: Duration) {
        let ms = timeout.as_millis().to_string();
        for &p in &self.sentinel_ports {
            let reply = self.cli_sentinel(p, &["sentinel", "set", MASTER_NAME, "failover-timeout", &ms]);
            assert_eq!(
                reply.trim(),
                "OK",
                "SENTINEL SET failover-timeout on the sentinel on port {p}"
            );
        }
    }

    /// Waits until the replica has processed everything the master had written when this
    /// was called (its `slave_repl_offset` reaches the master's `master_repl_offset`), over
    /// a lagging link however busy the machine; panics after `timeout`.
    pub fn wait_for_replica(&self, timeout: Duration) {
        let offset = |port: u16, field: &str| -> u64 {
            let info = self.cli_data(port, &["info", "replication"]);
            info.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {field} in the INFO of port {port}: {info}"))
        };
        let master = self.master_port();
        let replica = self.data_ports().into_iter().find(|&p| p != master).unwrap_or(master);
        let written = offset(master, "master_repl_offset");
        let start = Instant::now();
        while offset(replica, "slave_repl_offset") < written {
            assert!(
                start.elapsed() < timeout,
                "the replica on {replica} has not reached offset {written} after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the data server that is master now (a crash), and cuts the replication link of
    /// [`RedisSentinel::start_lagging`]; returns its port.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port();
        let i = self
            .data
            .iter()
            .position(|s| s.port() == port)
            .unwrap_or_else(|| panic!("the sentinels name port {port} as master, not a data server of the set"));
        self.data[i].stop();
        if let Some(link) = &self.link {
            self.lag_at_kill = link.cut();
        }
        self.killed = Some(i);
        port
    }

    /// The replication lag when [`RedisSentinel::kill_master`] cut the link of
    /// [`RedisSentinel::start_lagging`]: how long the oldest bytes it dropped had been on
    /// their way (zero if the replica had everything, or without a link). What the master
    /// wrote before that reached the replica; what it wrote since, the replica never saw.
    pub fn lag_at_kill(&self) -> Duration {
        self.lag_at_kill
    }

    /// Polls the sentinels until every one names a master other than the one on `old_port`
    /// (the same for all) and that server answers `ROLE` as a master; returns its port.
    /// Panics after `timeout`.
    pub fn wait_for_new_master(&self, old_port: u16, timeout: Duration) -> u16 {
        let start = Instant::now();
        loop {
            let named: Vec<Option<u16>> = self.sentinel_ports.iter().map(|&p| self.master_port_from(p)).collect();
            if let Some(Some(new)) = named.first().copied() {
                if new != old_port
                    && named.iter().all(|&n| n == Some(new))
                    && self.cli_data(new, &["role"]).starts_with("master")
                {
                    return new;
                }
            }
            assert!(
                start.elapsed() < timeout,
                "no new master instead of port {old_port} after {timeout:?}: the sentinels on {:?} name {named:?}",
                self.sentinel_ports
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts, empty and on its port, the data server [`RedisSentinel::kill_master`]
    /// killed; returns its port. If the sentinels have failed over by now it comes back as
    /// a replica of the new master; otherwise as the master it was (the sentinels still
    /// name it). Panics if no server is down.
    pub fn restart_killed(&mut self) -> u16 {
        let i = self
            .killed
            .take()
            .unwrap_or_else(|| panic!("restart_killed: no data server was killed"));
        let port = self.data[i].port();
        let master = self.master_port();
        let options = RedisOptions {
            replica_of: (master != port).then_some(master),
            ..self.options.clone()
        };
        self.data[i].restart_with(options);
        port
    }

    /// Runs a `redis-cli` command against the data server on `port` (over TLS and as the
    /// ACL user, if the set has them) and returns its output.
    pub fn cli_data(&self, port: u16, args: &[&str]) -> String {
        run_cli(port, &self.data_flags, args)
    }

    /// Runs a `redis-cli` command against the sentinel on `port` (over TLS if the set has
    /// it) and returns its output.
    pub fn cli_sentinel(&self, port: u16, args: &[&str]) -> String {
        run_cli(port, &self.sentinel_flags, args)
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        // The sentinels first, so that they start no failover as the data servers go.
        for c in &mut self.sentinels {
            c.kill();
        }
        for s in &mut self.data {
            s.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
