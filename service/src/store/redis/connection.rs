//! One live connection to the store, and the only place a Redis error becomes a
//! [`StoreError`].

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, ScriptInvocation};

use crate::store::StoreError;

/// The connection itself: multiplexed, reconnecting on its own.
#[derive(Clone)]
pub(super) enum Kind {
    /// One server (or the master Sentinel names).
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

/// A connection, what a decision must wait for, and whom to tell when a call fails.
#[derive(Clone)]
pub(super) struct Connection {
    pub(super) kind: Kind,
    /// `WAIT` for this many replicas after each decision (0: do not).
    wait_replicas: u32,
    /// `WAIT`'s own timeout.
    wait_timeout: Duration,
    /// Woken when a call finds the store unreachable or read-only (Sentinel follows).
    failed: Option<Arc<tokio::sync::Notify>>,
}

impl Connection {
    pub(super) fn new(kind: Kind, wait_replicas: u32, wait_timeout: Duration) -> Connection {
        Connection {
            kind,
            wait_replicas,
            wait_timeout,
            failed: None,
        }
    }

    /// Tells `failed` of every call that finds the store unreachable or read-only.
    pub(super) fn reporting_to(mut self, failed: Arc<tokio::sync::Notify>) -> Connection {
        self.failed = Some(failed);
        self
    }

    /// Runs a script that reads and writes nothing a failover could lose (or tests).
    pub(super) async fn run<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let reply = match self.kind.clone() {
            Kind::Single(mut c) => invocation.invoke_async(&mut c).await,
            Kind::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        reply.map_err(|e| self.failure(e))
    }

    /// Runs a decision script whose keys live in `slot`, then, with `--store-wait-replicas`,
    /// waits until that many replicas have its writes: a decision they do not acknowledge
    /// in time is a store failure (the rule's failure policy answers), since a failover
    /// could lose it.
    pub(super) async fn decide<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        slot: u16,
    ) -> Result<T, StoreError> {
        let reply = self.run(invocation).await?;
        if self.wait_replicas > 0 {
            let mut wait = redis::cmd("WAIT");
            let timeout_ms = u64::try_from(self.wait_timeout.as_millis()).unwrap_or(u64::MAX).max(1);
            wait.arg(self.wait_replicas).arg(timeout_ms);
            let acknowledged: u32 = match self.kind.clone() {
                Kind::Single(mut c) => wait.query_async(&mut c).await.map_err(|e| self.failure(e))?,
                Kind::Cluster(mut c) => {
                    let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                        slot,
                        SlotAddr::Master,
                    )));
                    let value = c.route_command(&wait, to).await.map_err(|e| self.failure(e))?;
                    redis::from_redis_value(&value).map_err(|e| self.failure(e))?
                }
            };
            if acknowledged < self.wait_replicas {
                return Err(StoreError::Unavailable(format!(
                    "{acknowledged} of {} replicas acknowledged the decision within {:?}",
                    self.wait_replicas, self.wait_timeout
                )));
            }
        }
        Ok(reply)
    }

    /// Sends one command.
    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let reply = match self.kind.clone() {
            Kind::Single(mut c) => cmd.query_async(&mut c).await,
            Kind::Cluster(mut c) => cmd.query_async(&mut c).await,
        };
        reply.map_err(|e| self.failure(e))
    }

    /// A Redis error as a store error: an answer this node cannot read is `Protocol`;
    /// everything else (unreachable, timed out, read-only, loading) is `Unavailable`, and
    /// tells whoever follows the master.
    fn failure(&self, e: RedisError) -> StoreError {
        match e.kind() {
            ErrorKind::TypeError | ErrorKind::ResponseError => StoreError::Protocol(e.to_string()),
            _ => {
                if let Some(failed) = &self.failed {
                    failed.notify_one();
                }
                StoreError::Unavailable(e.to_string())
            }
        }
    }
}
