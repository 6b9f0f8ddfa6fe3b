//! The Redis fixtures start what they say: TLS servers that refuse plain text and strangers'
//! CAs, ACL servers that refuse the default user, a TLS cluster, and a Sentinel set that
//! fails over.

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_testkit::{RedisCluster, RedisOptions, RedisSentinel, RedisServer, TlsFiles};

/// `redis-cli -p PORT args...` (nothing else: no TLS, no user): stdout and stderr together,
/// and whether it exited with success.
fn bare_cli(port: u16, args: &[&str]) -> (String, bool) {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out.status.success())
}

/// `--tls --cacert CA [--cert CERT --key KEY]`.
fn tls_flags(ca: &std::path::Path, cert: Option<(&std::path::Path, &std::path::Path)>) -> Vec<String> {
    let mut flags = vec!["--tls".to_owned(), "--cacert".to_owned(), ca.display().to_string()];
    if let Some((cert, key)) = cert {
        flags.extend([
            "--cert".to_owned(),
            cert.display().to_string(),
            "--key".to_owned(),
            key.display().to_string(),
        ]);
    }
    flags
}

fn ping_with(port: u16, flags: &[String]) -> String {
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.push("ping");
    bare_cli(port, &args).0
}

#[test]
fn tls_server_answers_over_tls_only() {
    let tls = TlsFiles::generate("tls-test");
    for file in [
        tls.ca(),
        tls.server_cert(),
        tls.server_key(),
        tls.client_cert(),
        tls.client_key(),
        tls.other_ca(),
    ] {
        assert!(file.is_file(), "{} missing", file.display());
    }
    let server = RedisServer::start_with(&RedisOptions::tls(&tls));
    assert_eq!(server.url(), format!("rediss://127.0.0.1:{}", server.port()));
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");

    // Optional client certificates: none is fine, the CA's is fine.
    assert_eq!(ping_with(server.port(), &tls_flags(tls.ca(), None)).trim(), "PONG");
    // Plain text is refused.
    let (out, ok) = bare_cli(server.port(), &["ping"]);
    assert!(!out.contains("PONG"), "plain text answered: {out}");
    assert!(!ok || out.to_lowercase().contains("error"), "plain text: {out}");
    // A client that trusts another CA refuses the server's certificate.
    let out = ping_with(server.port(), &tls_flags(tls.other_ca(), None));
    assert!(!out.contains("PONG"), "a client trusting another CA connected: {out}");
    // The same after a restart.
    let mut server = server;
    server.restart();
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");
    let (out, _) = bare_cli(server.port(), &["ping"]);
    assert!(!out.contains("PONG"), "plain text answered after restart: {out}");
}

#[test]
fn tls_server_can_require_client_certificates() {
    let tls = TlsFiles::generate("tls-required-test");
    let server = RedisServer::start_with(&RedisOptions {
        tls_auth_clients_required: true,
        ..RedisOptions::tls(&tls)
    });
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");
    let out = ping_with(server.port(), &tls_flags(tls.ca(), None));
    assert!(
        !out.contains("PONG"),
        "a client without a certificate was accepted: {out}"
    );
    let with_cert = tls_flags(tls.ca(), Some((tls.client_cert(), tls.client_key())));
    assert_eq!(ping_with(server.port(), &with_cert).trim(), "PONG");
}

#[test]
fn acl_server_lets_only_its_user_in() {
    let server = RedisServer::start_with(&RedisOptions::default().with_user("app", "s3cret pass"));
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");
    assert_eq!(server.cli(&["acl", "whoami"]).trim(), "app");
    assert_eq!(server.cli(&["set", "k", "v"]).trim(), "OK");

    let (out, _) = bare_cli(server.port(), &["ping"]);
    assert!(out.contains("NOAUTH"), "the default user got in: {out}");
    let (out, _) = bare_cli(
        server.port(),
        &["--no-auth-warning", "--user", "default", "--pass", "", "ping"],
    );
    assert!(!out.contains("PONG"), "the default user got in: {out}");
    let (out, _) = bare_cli(
        server.port(),
        &["--no-auth-warning", "--user", "app", "--pass", "wrong", "ping"],
    );
    assert!(!out.contains("PONG"), "a wrong password got in: {out}");
    let (out, _) = bare_cli(
        server.port(),
        &["--no-auth-warning", "--user", "app", "--pass", "s3cret pass", "ping"],
    );
    assert_eq!(out.trim(), "PONG");
}

#[test]
fn tls_acl_replica_syncs() {
    let tls = TlsFiles::generate("tls-replica-test");
    let mut options = RedisOptions::tls(&tls).with_user("app", "pw");
    // Sync at once (by default a master waits 5 s for more replicas to share a transfer).
    options.extra = vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
    let master = RedisServer::start_with(&options);
    let replica = RedisServer::start_with(&RedisOptions {
        replica_of: Some(master.port()),
        ..options.clone()
    });
    assert_eq!(master.cli(&["set", "k", "v"]).trim(), "OK");
    let start = Instant::now();
    while replica.cli(&["get", "k"]).trim() != "v" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "replica never got the key: {}",
            replica.cli(&["info", "replication"])
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tls_acl_cluster_reaches_ok() {
    let tls = TlsFiles::generate("tls-cluster-test");
    let cluster = RedisCluster::start_with(3, 1, &RedisOptions::tls(&tls).with_user("app", "pw"));
    assert!(
        cluster.url().starts_with("rediss+cluster://127.0.0.1:"),
        "{}",
        cluster.url()
    );
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "masters: {masters:?}");
    for &p in &masters {
        assert!(cluster.cli(p, &["cluster", "info"]).contains("cluster_state:ok"));
    }
    // Redirections name the TLS ports: a write through any node lands.
    for key in ["a", "b", "c", "d"] {
        assert_eq!(cluster.cli(masters[0], &["-c", "set", key, "1"]).trim(), "OK", "{key}");
    }
    // Plain text reaches no node.
    let (out, _) = bare_cli(masters[0], &["ping"]);
    assert!(!out.contains("PONG"), "plain text answered: {out}");
}

#[test]
fn plain_cluster_still_starts() {
    let cluster = RedisCluster::start(3, 0);
    assert!(
        cluster.url().starts_with("redis+cluster://127.0.0.1:"),
        "{}",
        cluster.url()
    );
    assert_eq!(cluster.master_ports().len(), 3);
}

/// Kills the master, waits for the failover, checks the replica was promoted and that the
/// killed server comes back as its replica.
fn fail_over(set: &mut RedisSentinel) {
    let [first, replica] = set.data_ports();
    assert_eq!(set.master_port(), first);
    assert_eq!(set.cli_data(first, &["set", "k", "v"]).trim(), "OK");

    let start = Instant::now();
    let killed = set.kill_master();
    assert_eq!(killed, first);
    let new = set.wait_for_new_master(killed, Duration::from_secs(20));
    eprintln!("failover took {:?}", start.elapsed());
    assert_eq!(new, replica);
    assert_eq!(set.master_port(), replica);
    assert_eq!(set.cli_data(new, &["get", "k"]).trim(), "v");

    assert_eq!(set.restart_killed(), first);
    let start = Instant::now();
    while !set
        .cli_data(first, &["info", "replication"])
        .contains("master_link_status:up")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the restarted server is no synced replica: {}",
            set.cli_data(first, &["info", "replication"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(set.cli_data(first, &["get", "k"]).trim(), "v");
}

#[test]
fn sentinel_set_fails_over() {
    let mut set = RedisSentinel::start(&RedisOptions::default());
    assert_eq!(set.master_name(), "sluice");
    let s = set.sentinel_ports();
    assert_eq!(
        set.url(),
        format!(
            "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/sluice",
            s[0], s[1], s[2]
        )
    );
    fail_over(&mut set);

    // And back: the restarted server, now a replica, is promoted in turn (at once: a
    // sentinel waits twice the failover timeout after a failover before starting another).
    set.set_failover_timeout(Duration::from_secs(2));
    let [first, replica] = set.data_ports();
    let start = Instant::now();
    assert_eq!(set.kill_master(), replica);
    assert_eq!(set.wait_for_new_master(replica, Duration::from_secs(20)), first);
    eprintln!("second failover took {:?}", start.elapsed());
    assert_eq!(set.cli_data(first, &["get", "k"]).trim(), "v");
}

#[test]
fn tls_acl_sentinel_set_fails_over() {
    let tls = TlsFiles::generate("tls-sentinel-test");
    let mut set = RedisSentinel::start(&RedisOptions::tls(&tls).with_user("app", "pw"));
    assert!(set.url().starts_with("rediss+sentinel://127.0.0.1:"), "{}", set.url());
    let (out, _) = bare_cli(set.data_ports()[0], &["ping"]);
    assert!(!out.contains("PONG"), "plain text answered: {out}");
    fail_over(&mut set);
}
