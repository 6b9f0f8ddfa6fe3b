//! The violations log: every denial, written off the hot path.
//!
//! Checks hand a [`Violation`] to a bounded channel (dropped and counted if full); a
//! background task appends it to the store's log ([`Store::record_violation`]): a ring
//! buffer in the memory store, a capped stream in Redis, where every node's denials meet.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

pub use crate::store::Violation;
use crate::store::{Store, StoreError};

/// The log: a sender for the hot path and the storage behind it.
pub struct Violations {
    tx: mpsc::Sender<Violation>,
    capacity: usize,
    dropped: AtomicU64,
}

impl Violations {
    /// Starts the writer task; `capacity` bounds the log.
    pub fn start(store: Arc<Store>, capacity: usize) -> Violations {
        let (tx, mut rx) = mpsc::channel::<Violation>(4096);
        tokio::spawn(async move {
            while let Some(v) = rx.recv().await {
                if let Err(e) = store.record_violation(&v, capacity).await {
                    tracing::debug!(error = %e, "violation not written to the store");
                }
            }
        });
        Violations {
            tx,
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

    /// The most recent violations (newest first), optionally of one rule and one identity.
    pub async fn recent(
        &self,
        store: &Store,
        rule: Option<&str>,
        identity: Option<&str>,
        count: usize,
    ) -> Result<Vec<Violation>, StoreError> {
        let keep = |v: &Violation| identity.is_none_or(|i| v.identity == i) && rule.is_none_or(|r| v.rule == r);
        let scan = if identity.is_some() || rule.is_some() {
            self.capacity
        } else {
            count
        };
        let all = store.recent_violations(scan).await?;
        Ok(all.into_iter().filter(keep).take(count).collect())
    }

    /// Violations dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
