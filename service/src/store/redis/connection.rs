//! One live connection to the store, the `WAIT` its decisions may share, and the only
//! place a Redis error becomes a [`StoreError`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, ScriptInvocation};
use tokio::sync::oneshot;

use crate::store::StoreError;

/// The connection itself: multiplexed, reconnecting on its own.
#[derive(Clone)]
pub(super) enum Kind {
    /// One server (or the master Sentinel names).
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

/// How a connection runs the check (`super::library` loads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `FCALL <library>_<op>`.
    Functions,
    /// `EVALSHA` of the check script.
    Script,
}

/// A connection, what a decision must wait for, and whom to tell when a call fails.
#[derive(Clone)]
pub(super) struct Connection {
    pub(super) kind: Kind,
    /// How the check runs on it: as Functions or as the script (`super::library`).
    pub(super) engine: Engine,
    /// With `--store-wait-replicas` (one server or Sentinel).
    replicas: Option<Arc<Replicas>>,
    /// Woken when a call finds the store unreachable or read-only (Sentinel follows).
    failed: Option<Arc<tokio::sync::Notify>>,
}

impl Connection {
    pub(super) fn new(kind: Kind) -> Connection {
        Connection {
            kind,
            engine: Engine::Script,
            replicas: None,
            failed: None,
        }
    }

    /// Makes every decision wait until `wanted` replicas have it, each wait bounded by
    /// `timeout`, through `barrier`: a second connection to the same server, which writes
    /// `barrier_key`.
    pub(super) fn waiting_for(
        mut self,
        wanted: u32,
        timeout: Duration,
        barrier: ConnectionManager,
        barrier_key: String,
    ) -> Connection {
        self.replicas = Some(Arc::new(Replicas {
            wanted,
            timeout,
            barrier,
            barrier_key,
            waiting: Mutex::new(Waiting::default()),
        }));
        self
    }

    /// Tells `failed` of every call that finds the store unreachable or read-only.
    pub(super) fn reporting_to(mut self, failed: Arc<tokio::sync::Notify>) -> Connection {
        self.failed = Some(failed);
        self
    }

    /// Runs a script whose writes need no replica's acknowledgement (the rules'
    /// publication; [`Connection::decide`] for decisions).
    pub(super) async fn run<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let reply = match self.kind.clone() {
            Kind::Single(mut c) => invocation.invoke_async(&mut c).await,
            Kind::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        reply.map_err(|e| self.failure(e))
    }

    /// Runs a decision script; with `--store-wait-replicas`, then waits until that many
    /// replicas have its writes. A decision they do not acknowledge in time is a store
    /// failure (the rule's failure policy answers), since a failover could lose it.
    pub(super) async fn decide<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let reply = self.run(invocation).await?;
        if let Some(replicas) = &self.replicas {
            replicas.acknowledged().await?;
        }
        Ok(reply)
    }

    /// Sends a decision's command (an `FCALL`), then waits for replicas as
    /// [`Connection::decide`] does.
    pub(super) async fn decide_cmd<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let reply = self.query(cmd).await?;
        if let Some(replicas) = &self.replicas {
            replicas.acknowledged().await?;
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

/// `WAIT` shared by concurrent decisions, a group commit. `WAIT` only counts its own
/// connection's writes and blocks that whole connection meanwhile, so it is not sent on the
/// connection the decisions use: a second connection writes a barrier key and waits for
/// that write, which Redis runs after every decision that had already answered. Each round
/// covers every decision that asked before it began: a burst waits for one replication
/// round trip or two, and decisions keep flowing meanwhile.
struct Replicas {
    wanted: u32,
    timeout: Duration,
    barrier: ConnectionManager,
    /// The key the barrier writes ([`crate::store::keys::Keys::wait_barrier`]).
    barrier_key: String,
    waiting: Mutex<Waiting>,
}

/// Decisions waiting for the next round, and whether a round is under way.
#[derive(Default)]
struct Waiting {
    next: Vec<oneshot::Sender<Result<u32, String>>>,
    running: bool,
}

impl Replicas {
    /// Returns once a barrier written after the call began has reached `wanted` replicas.
    async fn acknowledged(self: &Arc<Self>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.next.push(tx);
            !std::mem::replace(&mut waiting.running, true)
        };
        if start {
            tokio::spawn(self.clone().rounds());
        }
        let acknowledged = rx
            .await
            .map_err(|_| StoreError::Unavailable("the wait for replicas was given up".into()))?
            .map_err(StoreError::Unavailable)?;
        if acknowledged < self.wanted {
            return Err(StoreError::Unavailable(format!(
                "{acknowledged} of {} replicas acknowledged the decision within {:?}",
                self.wanted, self.timeout
            )));
        }
        Ok(())
    }

    /// Runs rounds for everyone waiting, then for whoever came meanwhile, until no one
    /// waits.
    async fn rounds(self: Arc<Self>) {
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        loop {
            let batch = {
                let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                if waiting.next.is_empty() {
                    waiting.running = false;
                    return;
                }
                std::mem::take(&mut waiting.next)
            };
            let mut round = redis::pipe();
            round
                .cmd("SET")
                .arg(&self.barrier_key)
                .arg(1)
                .arg("PX")
                .arg(60_000)
                .ignore()
                .cmd("WAIT")
                .arg(self.wanted)
                .arg(timeout_ms);
            let mut barrier = self.barrier.clone();
            let reply: Result<(u32,), String> = round.query_async(&mut barrier).await.map_err(|e| e.to_string());
            let reply = reply.map(|(acknowledged,)| acknowledged);
            for tx in batch {
                let _ = tx.send(reply.clone());
            }
        }
    }
}
