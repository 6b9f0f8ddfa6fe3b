//! The Redis store: every decision is one atomic Lua script, on a single node or a cluster.
//!
//! Scripts mirror `sluice-core`'s state machines decision for decision (a differential test
//! enforces it); they read the clock with `TIME` so nodes with skewed clocks agree, and set
//! a TTL on every key they write. Keys share the hash tag `sluice:{<rule>:<identity>}` so a
//! limit's keys live in one cluster slot. Connections are multiplexed and reconnect on their
//! own; every call is bounded by a response timeout.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use sluice_core::{Algorithm, Decision, Limit, Micros};

use super::{Stamped, StoreError};

const COMMON: &str = include_str!("lua/common.lua");

/// The loaded scripts, one per state shape.
struct Scripts {
    token_bucket: Script,
    gcra: Script,
    fixed_window: Script,
    sliding_window_log: Script,
    sliding_window_counter: Script,
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
        }
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A Redis or Redis Cluster counter store.
pub struct RedisStore {
    connection: Connection,
    scripts: Scripts,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl RedisStore {
    /// Connects to `redis://HOST:PORT` or `redis+cluster://H1:P1,H2:P2,...`.
    ///
    /// `timeout` bounds connecting and every reply, so a dead Redis costs at most that.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        let connection = if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{}", n.trim())).collect();
            let client = ClusterClientBuilder::new(nodes)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(2)
                .build()
                .map_err(unavailable)?;
            Connection::Cluster(client.get_async_connection().await.map_err(unavailable)?)
        } else if url.starts_with("redis://") {
            let client = redis::Client::open(url).map_err(unavailable)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(timeout)
                .set_response_timeout(timeout)
                .set_number_of_retries(1);
            Connection::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(unavailable)?,
            )
        } else {
            return Err(StoreError::Unavailable(format!(
                "{url:?} is not a Redis address: use redis://HOST:PORT or redis+cluster://H1:P1,H2:P2"
            )));
        };
        Ok(RedisStore {
            connection,
            scripts: Scripts::new(),
        })
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
        self.query::<String>(&redis::cmd("PING")).await.map(drop)
    }

    /// The connection for commands outside the scripts (rules, violations).
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        match self.connection.clone() {
            Connection::Single(mut c) => cmd.query_async(&mut c).await,
            Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
        .map_err(unavailable)
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
        let (script, suffixes, params): (&Script, &[&str], [u64; 3]) = match limit.algorithm() {
            Algorithm::TokenBucket => (
                &s.token_bucket,
                &[":tb"],
                [limit.capacity(), limit.token_unit(), limit.token_rate()],
            ),
            Algorithm::Gcra | Algorithm::LeakyBucket => (
                &s.gcra,
                &[":tat"],
                [limit.capacity(), limit.interval(), limit.max_delay()],
            ),
            Algorithm::FixedWindow => (&s.fixed_window, &[":fw"], [limit.window(), 0, 0]),
            Algorithm::SlidingWindowLog => (&s.sliding_window_log, &[":log", ":logm"], [limit.window(), 0, 0]),
            Algorithm::SlidingWindowCounter => (&s.sliding_window_counter, &[":swc"], [limit.window(), 0, 0]),
        };
        let mut invocation = script.prepare_invoke();
        for suffix in suffixes {
            invocation.key(format!("{key}{suffix}"));
        }
        invocation
            .arg(op)
            .arg(now.map_or(String::new(), |n| n.to_string()))
            .arg(cost)
            .arg(limit.limit());
        invocation.arg(&params[..]).arg(at);
        match self.connection.clone() {
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
