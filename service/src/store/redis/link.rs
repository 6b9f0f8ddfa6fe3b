//! Reaching Redis: TLS, credentials, Sentinel and reconnecting, for [`super::RedisStore`].
//!
//! - **TLS** (`rediss`) with rustls: the system's roots, or only `--store-ca-file`'s CAs;
//!   a client certificate with `--store-cert`/`--store-key`. The files are read and checked
//!   once, at start: a missing or unreadable file stops the node there.
//! - **Credentials**: the ACL user from the address; the password from
//!   `--store-password-file` (read again at every connection attempt, so fixing the file
//!   lets a node that was refused connect without a restart) or from the address.
//! - **Sentinel**: the sentinels are asked which server is the master, and the answer is
//!   checked with `ROLE`; [`follow`] asks again every second, and at once when a call fails,
//!   and moves the store to a new master when they name one.
//! - **Reconnecting**: the first connection is retried on `sluice_core`'s jittered
//!   backoff, so nodes restarted together do not knock on Redis in step. Once connected,
//!   the redis crate's connection manager reconnects a lost connection itself (its backoff
//!   is jittered too), with the credentials it was built with; when calls keep failing,
//!   [`renew`] builds a new connection, reading the password file again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, TlsCertificates, TlsMode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use sluice_core::backoff::{Backoff, BackoffPolicy, Jitter, SplitMix64};

use super::address::{Address, Deployment};
use super::connection::{Connection, Engine, Kind};
use super::library;
use crate::store::keys::Keys;
use crate::store::StoreError;

/// How to reach the store beyond its address.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Bounds connecting and every reply.
    pub timeout: Duration,
    /// Trust only the CAs in this PEM file (TLS), instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM) to present (mutual TLS); needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key_file: Option<PathBuf>,
    /// A file holding the password (a trailing newline is ignored); wins over the URL's.
    pub password_file: Option<PathBuf>,
    /// A file holding the sentinels' own password, when they ask for one.
    pub sentinel_password_file: Option<PathBuf>,
    /// After each decision, wait until this many replicas have it (`WAIT`); 0: do not.
    pub wait_replicas: u32,
    /// Run the check as a script (`EVALSHA`) even where Redis has Functions: how Redis 6
    /// runs it, for the tests that compare both.
    pub script_only: bool,
    /// Send the checks that come while a call to a shard is in flight together in its next
    /// call (`super::batch`; Functions only). On by default.
    pub batching: bool,
    /// The names this node uses in the store, under its prefix (`--store-prefix`).
    pub keys: Keys,
}

impl RedisOptions {
    /// No TLS files, no password file, no `WAIT`: the address says it all.
    pub fn new(timeout: Duration) -> RedisOptions {
        RedisOptions {
            timeout,
            ca_file: None,
            cert_file: None,
            key_file: None,
            password_file: None,
            sentinel_password_file: None,
            wait_replicas: 0,
            script_only: false,
            batching: true,
            keys: Keys::default(),
        }
    }
}

/// An address with what it takes to connect to it.
pub(super) struct Link {
    pub(super) address: Address,
    options: RedisOptions,
    /// Read at start when the address says TLS.
    certs: Option<TlsCertificates>,
}

impl Link {
    /// Checks the options against the address and reads the TLS files.
    pub(super) fn new(address: Address, options: RedisOptions) -> Result<Link, StoreError> {
        let config = |m: String| StoreError::Config(m);
        if !address.tls && (options.ca_file.is_some() || options.cert_file.is_some()) {
            return Err(config(format!(
                "TLS files are given but {address} is not a TLS address: use rediss://"
            )));
        }
        if options.cert_file.is_some() != options.key_file.is_some() {
            return Err(config(
                "a client certificate needs both --store-cert and --store-key".into(),
            ));
        }
        if options.wait_replicas > 0 && matches!(address.deployment, Deployment::Cluster) {
            return Err(config(
                "--store-wait-replicas is for one server or Sentinel; a cluster's replicas are not waited for".into(),
            ));
        }
        let certs = if address.tls {
            Some(TlsCertificates {
                root_cert: options.ca_file.as_deref().map(pem_certificates).transpose()?,
                client_tls: match (&options.cert_file, &options.key_file) {
                    (Some(cert), Some(key)) => Some(ClientTlsConfig {
                        client_cert: pem_certificates(cert)?,
                        client_key: read(key, "the client key")?,
                    }),
                    _ => None,
                },
            })
        } else {
            None
        };
        Ok(Link {
            address,
            options,
            certs,
        })
    }

    /// The password: the file's, else the address's.
    fn password(&self) -> Result<Option<String>, StoreError> {
        match &self.options.password_file {
            Some(path) => Ok(Some(secret(path)?)),
            None => Ok(self.address.password.clone()),
        }
    }

    /// How to reach one data server of the address.
    fn node(&self, (host, port): &(String, u16), password: Option<String>) -> ConnectionInfo {
        let db = match self.address.deployment {
            Deployment::Single { db } => db,
            _ => 0,
        };
        ConnectionInfo {
            addr: self.addr(host, *port),
            redis: RedisConnectionInfo {
                db,
                username: self.address.username.clone(),
                password,
                ..RedisConnectionInfo::default()
            },
        }
    }

    fn addr(&self, host: &str, port: u16) -> ConnectionAddr {
        if self.address.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        }
    }

    fn client(&self, info: ConnectionInfo) -> Result<redis::Client, StoreError> {
        match &self.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
            None => redis::Client::open(info),
        }
        .map_err(|e| self.explain(&e))
    }

    /// Connects: to the server, to the cluster, or to the master the sentinels name.
    pub(super) async fn open(&self) -> Result<Connection, StoreError> {
        let connection = match &self.address.deployment {
            Deployment::Single { .. } => {
                let first = self.address.hosts.first();
                let node = first.ok_or_else(|| StoreError::Config("no host".into()))?;
                self.single(self.client(self.node(node, self.password()?))?).await?
            }
            Deployment::Cluster => {
                let password = self.password()?;
                let nodes: Vec<ConnectionInfo> = self
                    .address
                    .hosts
                    .iter()
                    .map(|h| self.node(h, password.clone()))
                    .collect();
                let mut builder = ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.options.timeout)
                    .response_timeout(self.options.timeout)
                    .retries(2);
                if let Some(certs) = &self.certs {
                    builder = builder.tls(TlsMode::Secure).certs(certs.clone());
                }
                let client = builder.build().map_err(|e| self.explain(&e))?;
                let cluster = client.get_async_connection().await.map_err(|e| self.explain(&e))?;
                Connection::new(Kind::Cluster(cluster))
            }
            Deployment::Sentinel { .. } => self.single(self.sentinel_master().await?).await?,
        };
        self.ready(connection).await
    }

    /// `connection`, once it is usable: a server that lets the connection in but refuses its
    /// commands (no password given, a user without rights) is an error now, and its engine is
    /// the library of Functions where the server takes it (loaded there if it is not yet).
    async fn ready(&self, mut connection: Connection) -> Result<Connection, StoreError> {
        let pong: String = connection.query(&redis::cmd("PING")).await.map_err(|e| self.hint(e))?;
        tracing::debug!(store = %self.address, %pong, "connected");
        connection.engine = if self.options.script_only {
            Engine::Script
        } else {
            library::load(&connection).await?
        };
        Ok(connection)
    }

    /// A connection to one server; with `--store-wait-replicas`, a second one for `WAIT`.
    async fn single(&self, client: redis::Client) -> Result<Connection, StoreError> {
        let connection = Connection::new(Kind::Single(self.manager(client.clone()).await?));
        Ok(match self.options.wait_replicas {
            0 => connection,
            wanted => connection.waiting_for(
                wanted,
                self.options.timeout,
                self.manager(client).await?,
                self.options.keys.wait_barrier.clone(),
            ),
        })
    }

    async fn manager(&self, client: redis::Client) -> Result<ConnectionManager, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.options.timeout)
            .set_response_timeout(self.options.timeout)
            .set_number_of_retries(1);
        ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| self.explain(&e))
    }

    /// A client for the master the sentinels name now (checked with `ROLE`).
    async fn sentinel_master(&self) -> Result<redis::Client, StoreError> {
        self.sentinels()?.async_get_client().await.map_err(|e| self.explain(&e))
    }

    fn sentinels(&self) -> Result<SentinelClient, StoreError> {
        let Deployment::Sentinel { master } = &self.address.deployment else {
            return Err(StoreError::Config("not a Sentinel address".into()));
        };
        let addrs = self.address.hosts.iter().map(|(h, p)| self.addr(h, *p));
        let mut b = SentinelClientBuilder::new(addrs, master.clone(), SentinelServerType::Master)
            .map_err(|e| self.explain(&e))?;
        if let Some(user) = &self.address.username {
            b = b.set_client_to_redis_username(user.clone());
        }
        if let Some(password) = self.password()? {
            b = b.set_client_to_redis_password(password);
        }
        if let Some(path) = &self.options.sentinel_password_file {
            b = b.set_client_to_sentinel_password(secret(path)?);
        }
        if let Some(certs) = &self.certs {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_certificates(certs.clone());
        }
        b.build().map_err(|e| self.explain(&e))
    }

    /// A pub/sub connection: to the server, the first seed node, or the master now.
    pub(super) async fn pubsub(&self) -> Result<redis::aio::PubSub, StoreError> {
        let client = match &self.address.deployment {
            Deployment::Sentinel { .. } => self.sentinel_master().await?,
            _ => {
                let first = self.address.hosts.first();
                let node = first.ok_or_else(|| StoreError::Config("no host".into()))?;
                self.client(self.node(node, self.password()?))?
            }
        };
        client.get_async_pubsub().await.map_err(|e| self.explain(&e))
    }

    /// A Redis error as a store error, with a hint when it is one the operator can fix.
    pub(super) fn explain(&self, e: &redis::RedisError) -> StoreError {
        self.hint(StoreError::Unavailable(e.to_string()))
    }

    /// `e` with the address and a hint when it is an error the operator can fix.
    fn hint(&self, e: StoreError) -> StoreError {
        let text = match &e {
            StoreError::Unavailable(m) | StoreError::Protocol(m) => m,
            StoreError::Config(_) => return e,
        };
        let hint = if text.contains("uthentication failed") || text.contains("WRONGPASS") {
            " (check the user in the address and --store-password-file)"
        } else if text.contains("NOAUTH") {
            " (Redis asks for a password: give --store-password-file)"
        } else if text.contains("certificate") || text.contains("UnknownIssuer") {
            " (is --store-ca-file the CA that signed the server's certificate, and is it the server's name or IP?)"
        } else {
            ""
        };
        StoreError::Unavailable(format!("{}: {text}{hint}", self.address))
    }
}

/// A delay schedule for connecting: decorrelated jitter from 100 ms up to 5 s, for ever,
/// seeded differently in every process.
pub(super) fn reconnect_backoff() -> (Backoff, SplitMix64) {
    let policy = BackoffPolicy {
        base_ms: 100,
        cap_ms: 5_000,
        max_retries: u32::MAX,
        max_elapsed_ms: u64::MAX,
        jitter: Jitter::Decorrelated,
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (
        Backoff::new(policy),
        SplitMix64(nanos ^ u64::from(std::process::id()).rotate_left(32)),
    )
}

/// Rebuilds `live` when calls keep failing on it: woken by a failed call, it waits (the
/// jittered backoff, growing while the store stays down), and if the connection still does not answer `PING`, opens a new one (reading the
/// password file again: a rotated password is picked up without a restart; the redis
/// crate's own reconnects reuse the credentials it was built with).
pub(super) async fn renew(
    link: Arc<Link>,
    live: Arc<arc_swap::ArcSwapOption<Connection>>,
    failed: Arc<tokio::sync::Notify>,
) {
    let (mut backoff, mut rng) = reconnect_backoff();
    loop {
        failed.notified().await;
        let wait = backoff.next_delay(0, None, &mut rng).unwrap_or(5_000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if Arc::strong_count(&live) == 1 {
            return; // the store is gone
        }
        let current = live.load_full();
        let ping = match &current {
            Some(c) => c.query::<String>(&redis::cmd("PING")).await.map(drop),
            None => Err(StoreError::Unavailable("no connection".into())),
        };
        if ping.is_ok() {
            backoff.reset();
            continue;
        }
        match link.open().await {
            Ok(connection) => {
                live.store(Some(Arc::new(connection.reporting_to(failed.clone()))));
                backoff.reset();
                tracing::warn!(store = %link.address, "the connection kept failing; reconnected with a new one");
            }
            Err(e) => tracing::debug!(store = %link.address, "cannot reconnect yet: {e}"),
        }
    }
}

/// Keeps `live` on the master the sentinels name: asks every second, and as soon as a call
/// reports a failure (`stale`), and swaps in a connection to a new master when there is one.
pub(super) async fn follow(
    link: Arc<Link>,
    live: Arc<arc_swap::ArcSwapOption<Connection>>,
    stale: Arc<tokio::sync::Notify>,
) {
    let mut current = match link.sentinel_master().await {
        Ok(client) => client.get_connection_info().addr.to_string(),
        Err(_) => String::new(),
    };
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(1), stale.notified()).await;
        if Arc::strong_count(&live) == 1 {
            return; // the store is gone
        }
        let client = match link.sentinel_master().await {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!("the sentinels name no master that answers yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let named = client.get_connection_info().addr.to_string();
        if named == current {
            continue;
        }
        // Made ready as `open` makes the first: without it the new master's connection ran
        // the script (EVALSHA) and no batch, whatever the server could do.
        let connection = match link.single(client).await {
            Ok(connection) => link.ready(connection).await,
            Err(e) => Err(e),
        };
        match connection {
            Ok(connection) => {
                tracing::warn!(store = %link.address, master = %named, was = %current, engine = ?connection.engine,
                               "following Sentinel to a new master");
                live.store(Some(Arc::new(connection.reporting_to(stale.clone()))));
                current = named;
            }
            Err(e) => tracing::warn!(store = %link.address, master = %named, "cannot reach the new master yet: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| StoreError::Config(format!("cannot read {what} {}: {e}", path.display())))
}

/// A PEM file that holds at least one certificate.
fn pem_certificates(path: &Path) -> Result<Vec<u8>, StoreError> {
    let pem = read(path, "the certificate file")?;
    let count = CertificateDer::pem_slice_iter(&pem).filter(Result::is_ok).count();
    if count == 0 {
        return Err(StoreError::Config(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(pem)
}

/// A secret file's first line.
fn secret(path: &Path) -> Result<String, StoreError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| StoreError::Config(format!("cannot read the password file {}: {e}", path.display())))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(StoreError::Config(format!(
            "the password file {} is empty",
            path.display()
        )));
    }
    Ok(line.to_owned())
}
