//! Counter stores: where limit state lives. One enum, matched per call, so the hot path
//! pays no boxing or dynamic dispatch.
//!
//! Contract shared by every store:
//! - `decide` is atomic per key: it reads the state, applies [`Limit::decide`] (or the Lua
//!   script that mirrors it) at the store's own clock, and writes the new state with an
//!   expiry of [`Limit::expires_after`], as one step;
//! - it returns the time it used, so that a refund can name the admission it undoes;
//! - errors are [`StoreError`]; the caller applies the rule's failure policy.

pub mod memory;
pub mod redis;

use sluice_core::{Decision, Limit, Micros};

/// A decision and the store time (unix µs) at which it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamped {
    /// The algorithm's decision.
    pub decision: Decision,
    /// The store's clock when deciding, in unix microseconds.
    pub at: Micros,
}

/// Why a store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is unreachable, timed out, or its circuit breaker is open.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something this node cannot read.
    #[error("store returned an unexpected reply: {0}")]
    Protocol(String),
}

/// The counter store a node runs on.
pub enum Store {
    /// In-process, sharded; the default.
    Memory(memory::MemoryStore),
    /// Redis or Redis Cluster, one Lua script per decision.
    Redis(Box<redis::RedisStore>),
}

impl Store {
    /// Decides one request of `cost` against `limit` under `key`, atomically.
    pub async fn decide(&self, key: &str, limit: &Limit, cost: u64) -> Result<Stamped, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.decide(key, limit, cost)),
            Store::Redis(r) => r.decide(key, limit, cost).await,
        }
    }

    /// Gives back `cost` admitted at `at` because another rule of the request denied it.
    pub async fn refund(&self, key: &str, limit: &Limit, at: Micros, cost: u64) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.refund(key, limit, at, cost);
                Ok(())
            }
            Store::Redis(r) => r.refund(key, limit, at, cost).await,
        }
    }

    /// Whether the store answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(r) => r.ping().await,
        }
    }

    /// A short name for logs and `/readyz`.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }
}

/// Decision for a request the store could not decide and whose rule fails closed.
pub fn closed_decision(limit: &Limit) -> Decision {
    let retry = 1_000_000.min(limit.window());
    Decision {
        allowed: false,
        limit: limit.limit(),
        remaining: 0,
        reset_after: retry,
        retry_after: retry,
        delay: 0,
    }
}
