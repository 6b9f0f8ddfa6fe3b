//! The Redis store: every decision is one atomic Lua script, on a single node or a cluster.
//!
//! Scripts mirror `sluice-core`'s state machines decision for decision (a differential test
//! enforces it); they read the clock with `TIME` so nodes with skewed clocks agree, and set
//! a TTL on every key they write. Keys share the hash tag `sluice:{<rule>:<identity>}` so a
//! limit's keys live in one cluster slot. Connections are multiplexed and reconnect on their
//! own; every call is bounded by a response timeout. A node that starts while Redis is down
//! connects in the background ([`RedisStore::start`]) and answers `Unavailable` meanwhile,
//! so each rule's failure policy applies. The published rules change by compare-and-set in
//! one script and are announced by pub/sub; the violations log is a capped stream.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use sluice_core::{Algorithm, Decision, Limit, Micros};

use super::{keys, Publish, Published, Stamped, StoreError, Violation};

const COMMON: &str = include_str!("lua/common.lua");

/// Publishes a rule set if the version is the expected one, and announces it.
/// KEYS: rules text, version. ARGV: text, expected version ("" for any), channel.
/// Returns {1, new version} or {0, current version}.
const PUBLISH_RULES: &str = r#"
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= current then
  return {0, current}
end
redis.call('SET', KEYS[1], ARGV[1])
local version = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[3], version)
return {1, version}
"#;

/// The loaded scripts, one per state shape.
struct Scripts {
    token_bucket: Script,
    gcra: Script,
    fixed_window: Script,
    sliding_window_log: Script,
    sliding_window_counter: Script,
    publish_rules: Script,
}

impl Scripts {
    fn new() -> Scripts {
        let with_common = |body: &str| Script::new(&format!("{COMMON}\n{body}"));
        Scripts {
            token_bucket: with_common(include_str!("lua/token_bucket.lua")),
            gcra: with_common(include_str!("lua/gcra.lua")),
            fixed_window: with_common(include_str!("lua/fixed_window.lua")),
            sliding_window_log: with_common(include_str!("lua/sliding_window_log.lua")),
            sliding_window_counter: with_common(include_str!("lua/sliding_window_counter.lua")),
            publish_rules: Script::new(PUBLISH_RULES),
        }
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A Redis or Redis Cluster store.
pub struct RedisStore {
    /// Set once the first connection is up.
    connection: Arc<OnceLock<Connection>>,
    scripts: Scripts,
    /// A plain `redis://` address of the (first) node, for pub/sub.
    pubsub_url: String,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Where to connect: a single node or a cluster's seed nodes.
enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl Target {
    fn parse(url: &str) -> Result<Target, StoreError> {
        if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            Ok(Target::Cluster(
                nodes.split(',').map(|n| format!("redis://{}", n.trim())).collect(),
            ))
        } else if url.starts_with("redis://") {
            Ok(Target::Single(url.to_owned()))
        } else {
            Err(StoreError::Unavailable(format!(
                "{url:?} is not a Redis address: use redis://HOST:PORT or redis+cluster://H1:P1,H2:P2"
            )))
        }
    }

    async fn open(&self, timeout: Duration) -> Result<Connection, StoreError> {
        match self {
            Target::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(2)
                    .build()
                    .map_err(unavailable)?;
                Ok(Connection::Cluster(
                    client.get_async_connection().await.map_err(unavailable)?,
                ))
            }
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout)
                    .set_number_of_retries(1);
                Ok(Connection::Single(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(unavailable)?,
                ))
            }
        }
    }
}

impl RedisStore {
    /// Connects to `redis://HOST:PORT` or `redis+cluster://H1:P1,H2:P2,...` now: an error if
    /// Redis does not answer.
    ///
    /// `timeout` bounds connecting and every reply, so a dead Redis costs at most that.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        let target = Target::parse(url)?;
        let connection = target.open(timeout).await?;
        let store = RedisStore::new(&target, url);
        let _ = store.connection.set(connection);
        Ok(store)
    }

    /// Like [`RedisStore::connect`], but returns at once and connects in the background,
    /// retrying with backoff (each failure logged) until Redis answers; meanwhile every call
    /// is `Unavailable`. Only a malformed address is an error.
    pub fn start(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        let target = Target::parse(url)?;
        let store = RedisStore::new(&target, url);
        let cell = store.connection.clone();
        let url = url.to_owned();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            loop {
                match target.open(timeout).await {
                    Ok(connection) => {
                        let _ = cell.set(connection);
                        tracing::info!(store = %url, "connected to Redis");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(store = %url, retry_in = ?wait, "cannot connect to Redis yet: {e}");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        Ok(store)
    }

    fn new(target: &Target, url: &str) -> RedisStore {
        let pubsub_url = match target {
            Target::Single(u) => u.clone(),
            Target::Cluster(nodes) => nodes.first().cloned().unwrap_or_else(|| url.to_owned()),
        };
        RedisStore {
            connection: Arc::new(OnceLock::new()),
            scripts: Scripts::new(),
            pubsub_url,
        }
    }

    /// Whether the first connection is up.
    pub fn is_connected(&self) -> bool {
        self.connection.get().is_some()
    }

    fn connection(&self) -> Result<Connection, StoreError> {
        self.connection
            .get()
            .cloned()
            .ok_or_else(|| StoreError::Unavailable("not connected to Redis yet (connecting in the background)".into()))
    }

    /// Decides at Redis's clock.
    pub async fn decide(&self, key: &str, limit: &Limit, cost: u64) -> Result<Stamped, StoreError> {
        self.decide_at(key, limit, cost, None).await
    }

    /// Decides at an explicit clock (`Some`, tests only) or at Redis's `TIME` (`None`).
    pub async fn decide_at(
        &self,
        key: &str,
        limit: &Limit,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Stamped, StoreError> {
        let reply: Vec<i64> = self.run(key, limit, "decide", now, cost, 0).await?;
        let [allowed, remaining, reset, retry, delay, at] = reply[..] else {
            return Err(StoreError::Protocol(format!("script returned {reply:?}")));
        };
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(Stamped {
            decision: Decision {
                allowed: allowed == 1,
                limit: limit.limit(),
                remaining: n(remaining),
                reset_after: n(reset),
                retry_after: n(retry),
                delay: n(delay),
            },
            at: n(at),
        })
    }

    /// Gives back `cost` admitted at `at`.
    pub async fn refund(&self, key: &str, limit: &Limit, at: Micros, cost: u64) -> Result<(), StoreError> {
        let _: Value = self.run(key, limit, "refund", Some(at), cost, at).await?;
        Ok(())
    }

    /// Round trip to Redis.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.command::<String>(&redis::cmd("PING")).await.map(drop)
    }

    async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        match self.connection()? {
            Connection::Single(mut c) => cmd.query_async(&mut c).await,
            Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
        .map_err(|e| match e.kind() {
            redis::ErrorKind::TypeError | redis::ErrorKind::ResponseError => StoreError::Protocol(e.to_string()),
            _ => unavailable(e),
        })
    }

    /// The published rule set, if any.
    pub async fn published_rules(&self) -> Result<Option<Published>, StoreError> {
        let mut cmd = redis::cmd("MGET");
        cmd.arg(keys::RULES_VERSION).arg(keys::RULES);
        let (version, text): (Option<u64>, Option<String>) = self.command(&cmd).await?;
        Ok(version.zip(text).map(|(version, text)| Published { version, text }))
    }

    /// Publishes `text` as the next version if `expected` is current (or `None`), and
    /// announces the new version on the rules channel, in one script.
    pub async fn publish_rules(&self, text: &str, expected: Option<u64>) -> Result<Publish, StoreError> {
        let mut invocation = self.scripts.publish_rules.prepare_invoke();
        invocation
            .key(keys::RULES)
            .key(keys::RULES_VERSION)
            .arg(text)
            .arg(expected.map_or(String::new(), |v| v.to_string()))
            .arg(keys::RULES_CHANNEL);
        let (done, version): (u8, u64) = match self.connection()? {
            Connection::Single(mut c) => invoke(&invocation, &mut c).await?,
            Connection::Cluster(mut c) => invoke(&invocation, &mut c).await?,
        };
        Ok(if done == 1 {
            Publish::Done(version)
        } else {
            Publish::Conflict(version)
        })
    }

    /// Subscribes to the rules channel in the background and wakes `notify` on every
    /// message; resubscribes after a lost connection.
    pub fn notify_rule_changes(&self, notify: Arc<tokio::sync::Notify>) {
        let url = self.pubsub_url.clone();
        tokio::spawn(async move {
            loop {
                match subscribe(&url).await {
                    Ok(mut pubsub) => {
                        tracing::debug!(store = %url, "subscribed to rule changes");
                        let mut messages = pubsub.on_message();
                        while messages.next().await.is_some() {
                            notify.notify_one();
                        }
                        tracing::debug!(store = %url, "rule change subscription lost; resubscribing");
                    }
                    Err(e) => tracing::debug!(store = %url, "cannot subscribe to rule changes: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    /// Appends to the capped violations stream (`XADD … MAXLEN ~ capacity`).
    pub async fn record_violation(&self, v: &Violation, capacity: usize) -> Result<(), StoreError> {
        let fields = [("rule", v.rule.as_str()), ("identity", &v.identity), ("path", &v.path)];
        let mut cmd = redis::cmd("XADD");
        cmd.arg(keys::VIOLATIONS)
            .arg("MAXLEN")
            .arg("~")
            .arg(capacity)
            .arg("*")
            .arg(&fields[..]);
        cmd.arg("at_ms").arg(v.at_ms).arg("cost").arg(v.cost);
        self.command::<Value>(&cmd).await.map(drop)
    }

    /// The newest `count` violations, newest first.
    pub async fn recent_violations(&self, count: usize) -> Result<Vec<Violation>, StoreError> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(keys::VIOLATIONS).arg("+").arg("-").arg("COUNT").arg(count);
        let reply: redis::streams::StreamRangeReply = self.command(&cmd).await?;
        let field = |id: &redis::streams::StreamId, k: &str| id.get::<String>(k).unwrap_or_default();
        Ok(reply
            .ids
            .iter()
            .map(|id| Violation {
                rule: field(id, "rule"),
                identity: field(id, "identity"),
                path: field(id, "path"),
                at_ms: id.get("at_ms").unwrap_or(0),
                cost: id.get("cost").unwrap_or(0),
            })
            .collect())
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        key: &str,
        limit: &Limit,
        op: &str,
        now: Option<Micros>,
        cost: u64,
        at: Micros,
    ) -> Result<T, StoreError> {
        let s = &self.scripts;
        let (script, params): (&Script, [u64; 3]) = match limit.algorithm() {
            Algorithm::TokenBucket => (
                &s.token_bucket,
                [limit.capacity(), limit.token_unit(), limit.token_rate()],
            ),
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                (&s.gcra, [limit.capacity(), limit.interval(), limit.max_delay()])
            }
            Algorithm::FixedWindow => (&s.fixed_window, [limit.window(), 0, 0]),
            Algorithm::SlidingWindowLog => (&s.sliding_window_log, [limit.window(), 0, 0]),
            Algorithm::SlidingWindowCounter => (&s.sliding_window_counter, [limit.window(), 0, 0]),
        };
        let mut invocation = script.prepare_invoke();
        for suffix in keys::state_suffixes(limit.algorithm()) {
            invocation.key(format!("{key}{suffix}"));
        }
        invocation
            .arg(op)
            .arg(now.map_or(String::new(), |n| n.to_string()))
            .arg(cost)
            .arg(limit.limit());
        invocation.arg(&params[..]).arg(at);
        match self.connection()? {
            Connection::Single(mut c) => invoke(&invocation, &mut c).await,
            Connection::Cluster(mut c) => invoke(&invocation, &mut c).await,
        }
    }
}

async fn invoke<T: redis::FromRedisValue, C: ConnectionLike + Send>(
    invocation: &redis::ScriptInvocation<'_>,
    connection: &mut C,
) -> Result<T, StoreError> {
    invocation.invoke_async(connection).await.map_err(|e| match e.kind() {
        redis::ErrorKind::TypeError | redis::ErrorKind::ResponseError => StoreError::Protocol(e.to_string()),
        _ => unavailable(e),
    })
}

/// A pub/sub connection to `url` subscribed to the rules channel.
async fn subscribe(url: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let client = redis::Client::open(url)?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(keys::RULES_CHANNEL).await?;
    Ok(pubsub)
}
