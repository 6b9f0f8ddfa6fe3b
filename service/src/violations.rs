//! The violations log: every denial, written off the hot path.
//!
//! Checks hand a [`Violation`] to a bounded channel (dropped and counted if full); a
//! background task appends it to a ring buffer (memory store) or to a capped Redis stream
//! (`XADD sluice:violations MAXLEN ~ N`), where every node's denials meet.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::store::{Store, StoreError};

/// The Redis stream holding violations.
pub const STREAM: &str = "sluice:violations";

/// One denial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The rule that denied.
    pub rule: String,
    /// The identity it limited.
    pub identity: String,
    /// When, unix ms.
    pub at_ms: u64,
    /// The request's cost.
    pub cost: u64,
    /// The request's path.
    pub path: String,
}

/// The log: a sender for the hot path and the storage behind it.
pub struct Violations {
    tx: mpsc::Sender<Violation>,
    ring: Arc<Mutex<VecDeque<Violation>>>,
    capacity: usize,
    dropped: AtomicU64,
}

impl Violations {
    /// Starts the writer task; `capacity` bounds the ring buffer and the Redis stream.
    pub fn start(store: Arc<Store>, capacity: usize) -> Violations {
        let (tx, mut rx) = mpsc::channel::<Violation>(4096);
        let ring = Arc::new(Mutex::new(VecDeque::with_capacity(capacity.min(4096))));
        let writer_ring = ring.clone();
        tokio::spawn(async move {
            while let Some(v) = rx.recv().await {
                if let Store::Redis(r) = &*store {
                    let fields = [("rule", v.rule.as_str()), ("identity", &v.identity), ("path", &v.path)];
                    let mut cmd = redis::cmd("XADD");
                    cmd.arg(STREAM)
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(capacity)
                        .arg("*")
                        .arg(&fields[..]);
                    cmd.arg("at_ms").arg(v.at_ms).arg("cost").arg(v.cost);
                    if let Err(e) = r.query::<redis::Value>(&cmd).await {
                        tracing::debug!(error = %e, "violation not written to Redis");
                    }
                } else {
                    let mut ring = writer_ring.lock().unwrap_or_else(|p| p.into_inner());
                    if ring.len() >= capacity {
                        ring.pop_front();
                    }
                    ring.push_back(v);
                }
            }
        });
        Violations {
            tx,
            ring,
            capacity,
            dropped: AtomicU64::new(0),
        }
    }

    /// Records a denial without waiting; drops it (counted) if the writer is behind.
    pub fn record(&self, v: Violation) {
        if self.tx.try_send(v).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The most recent violations (newest first), optionally of one identity.
    pub async fn recent(
        &self,
        store: &Store,
        identity: Option<&str>,
        count: usize,
    ) -> Result<Vec<Violation>, StoreError> {
        let keep = |v: &Violation| identity.is_none_or(|i| v.identity == i);
        if let Store::Redis(r) = store {
            let mut cmd = redis::cmd("XREVRANGE");
            cmd.arg(STREAM).arg("+").arg("-").arg("COUNT").arg(self.capacity);
            let reply: redis::streams::StreamRangeReply = r.query(&cmd).await?;
            let field = |id: &redis::streams::StreamId, k: &str| id.get::<String>(k).unwrap_or_default();
            return Ok(reply
                .ids
                .iter()
                .map(|id| Violation {
                    rule: field(id, "rule"),
                    identity: field(id, "identity"),
                    path: field(id, "path"),
                    at_ms: id.get("at_ms").unwrap_or(0),
                    cost: id.get("cost").unwrap_or(0),
                })
                .filter(keep)
                .take(count)
                .collect());
        }
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        Ok(ring.iter().rev().filter(|v| keep(v)).take(count).cloned().collect())
    }

    /// Violations dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
