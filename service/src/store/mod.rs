//! Stores: where limit state, the published rule set and the violations log live. One
//! enum, matched per call, so the hot path pays no boxing or dynamic dispatch. Everything
//! a node knows of Redis is under this folder; the memory store does the same in-process.
//!
//! Contract shared by every store:
//! - `decide_all` decides one request against every rule it matches, all-or-nothing, as
//!   [`sluice_core::algorithm::decide_all`] does: it reads the states, decides each at the
//!   store's own clock, and, only when every enforced rule admits the request, writes the
//!   new states with an expiry of [`Limit::expires_after`], as one atomic step per store
//!   round trip. The memory store takes one critical section; a single Redis runs one
//!   script; a Redis Cluster runs one script per slot involved, concurrently, and when one
//!   slot's rules deny, gives back what the others admitted (see [`redis`]);
//! - errors are [`StoreError`]; the caller applies each rule's failure policy;
//! - the published rule set carries a version that every change bumps, and a change names
//!   the version it replaces (compare-and-set), so no update is lost;
//! - the violations log keeps the newest `capacity` entries.

pub mod keys;
pub mod memory;
pub mod redis;

use serde::{Deserialize, Serialize};
use sluice_core::algorithm::Part;
use sluice_core::lease::Grant;
use sluice_core::{Decision, Limit, Micros};

/// One rule of a request, as a store decides it: where its state lives and its limit.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// The limit's key prefix ([`keys::Keys::limit`]).
    pub key: &'a str,
    /// The limit, and whether the rule is a shadow rule.
    pub part: Part<'a>,
}

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
    /// The store cannot be used as configured (an address or a file the operator gave).
    #[error("store misconfigured: {0}")]
    Config(String),
}

/// The rule set published to every node, and its version (1 for the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Bumped by every change.
    pub version: u64,
    /// The rules, as TOML.
    pub text: String,
}

/// What a compare-and-set of the published rules did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Stored as this version.
    Done(u64),
    /// Another change came first: this is the version now published.
    Conflict(u64),
}

/// One denial, as the violations log keeps it.
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

/// The store a node runs on.
pub enum Store {
    /// In-process, sharded; the default.
    Memory(memory::MemoryStore),
    /// Redis or Redis Cluster, one Lua script per decision.
    Redis(Box<redis::RedisStore>),
}

/// The names of a store no other deployment shares (the memory store's).
static DEFAULT_KEYS: std::sync::LazyLock<keys::Keys> = std::sync::LazyLock::new(keys::Keys::default);

impl Store {
    /// Its names, under the deployment's prefix (`--store-prefix`; the memory store, which
    /// no one shares, the default's).
    pub fn keys(&self) -> &keys::Keys {
        match self {
            Store::Memory(_) => &DEFAULT_KEYS,
            Store::Redis(r) => r.keys(),
        }
    }

    /// Decides one request against every item, each at its part's cost, all-or-nothing
    /// (see the module's contract); the decisions come back in the items' order.
    pub async fn decide_all(&self, items: &[Item<'_>]) -> Result<Vec<Stamped>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.decide_all(items)),
            Store::Redis(r) => r.decide_all(items).await,
        }
    }

    /// The decisions `items` would get now (as [`Store::decide_all`]), keeping nothing: a
    /// peek at the quotas.
    pub async fn peek_all(&self, items: &[Item<'_>]) -> Result<Vec<Decision>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.decide_all_now(items, false)),
            Store::Redis(r) => r.peek_all(items).await,
        }
    }

    /// Takes up to `want` units of `limit` under `key` now, whatever is left of them, and
    /// never refuses: a cost learnt only after the request passed (the tokens an answer
    /// used). What is beyond the quota is not carried as a debt: the quota is empty, and the
    /// next request is refused until it refills.
    pub async fn take(&self, key: &str, limit: &Limit, want: u64) -> Result<Grant, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.take(key, limit, want)),
            Store::Redis(r) => r.take(key, limit, want).await,
        }
    }

    /// Grants up to `want` units of `limit` under `key` for `ttl` as the lease `id` (see
    /// `sluice_core::lease`): the most the limit admits now, taken at once.
    pub async fn grant(&self, key: &str, limit: &Limit, want: u64, ttl: Micros, id: u64) -> Result<Grant, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.grant(key, limit, want, ttl, id)),
            Store::Redis(r) => r.grant(key, limit, (want, ttl), id).await,
        }
    }

    /// Gives back up to `unspent` units of the lease `id` of `key` while it lasts; never
    /// more than it still holds. The units taken back.
    pub async fn give_back(&self, key: &str, limit: &Limit, id: u64, unspent: u64) -> Result<u64, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.give_back(key, limit, id, unspent)),
            Store::Redis(r) => r.give_back(key, limit, id, unspent).await,
        }
    }

    /// A concurrency limit's slots under `key` taken or last renewed at `at`, up to `cost`
    /// of them: given back when their request ended (`renew` false), or moved to now while
    /// it runs (`renew` true). The slots found (0: expired or given back already), and the
    /// store's time, a renewed slot's new name.
    pub async fn slots(
        &self,
        key: &str,
        limit: &Limit,
        at: Micros,
        cost: u64,
        renew: bool,
    ) -> Result<(u64, Micros), StoreError> {
        match self {
            Store::Memory(m) => Ok(m.slots(key, limit, at, cost, renew)),
            Store::Redis(r) => r.slots(key, limit, at, cost, renew).await,
        }
    }

    /// Records that `member` (a node) wants `per_s` units a second of the limit `key` for the
    /// next `ttl_ms`, and answers what every member whose record has not expired wants in
    /// all. The memory store serves one node, so its total is that node's own.
    pub async fn share_demand(&self, key: &str, member: &str, per_s: u64, ttl_ms: u64) -> Result<u64, StoreError> {
        match self {
            Store::Memory(_) => Ok(per_s),
            Store::Redis(r) => r.share_demand(key, member, per_s, ttl_ms).await,
        }
    }

    /// The published rule set, if any was published.
    pub async fn published_rules(&self) -> Result<Option<Published>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.published_rules()),
            Store::Redis(r) => r.published_rules().await,
        }
    }

    /// Publishes `text` as the next version, if the version published now is `expected`
    /// (`None`: whatever it is).
    pub async fn publish_rules(&self, text: &str, expected: Option<u64>) -> Result<Publish, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.publish_rules(text, expected)),
            Store::Redis(r) => r.publish_rules(text, expected).await,
        }
    }

    /// Wakes `notify` whenever another node publishes rules, and calls `reset` with the key
    /// of every reset (Redis pub/sub, resubscribing after a disconnect; a message can still
    /// be lost, so callers poll the rules too). The memory store has no other nodes: nothing
    /// to wait for.
    pub fn notify_rule_changes(
        &self,
        notify: std::sync::Arc<tokio::sync::Notify>,
        reset: std::sync::Arc<dyn Fn(&str) + Send + Sync>,
    ) {
        if let Store::Redis(r) = self {
            r.notify_rule_changes(notify, reset);
        }
    }

    /// Appends `v` to the violations log, which keeps the newest `capacity`.
    pub async fn record_violation(&self, v: &Violation, capacity: usize) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.record_violation(v.clone(), capacity);
                Ok(())
            }
            Store::Redis(r) => r.record_violation(v, capacity).await,
        }
    }

    /// The newest violations first, at most `scan` of them read from the log.
    pub async fn recent_violations(&self, scan: usize) -> Result<Vec<Violation>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.recent_violations(scan)),
            Store::Redis(r) => r.recent_violations(scan).await,
        }
    }

    /// Forgets the limit state under `key` (a [`keys::Keys::limit`] key), whatever its
    /// algorithm: the next request starts from a whole quota. Whether there was any.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.reset(key)),
            Store::Redis(r) => r.reset(key).await,
        }
    }

    /// The deployment, for the console: `memory`, `redis`, `redis-cluster` or
    /// `redis-sentinel`.
    pub fn deployment(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(r) => match r.address().deployment {
                redis::Deployment::Single { .. } => "redis",
                redis::Deployment::Cluster => "redis-cluster",
                redis::Deployment::Sentinel { .. } => "redis-sentinel",
            },
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

/// A store call given up after `timeout`: no answer in time is [`StoreError::Unavailable`],
/// as a refused connection is.
pub async fn within<T>(
    timeout: std::time::Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable(format!("no answer within {timeout:?}"))))
}

/// Decision for a request the store could not decide and whose rule fails closed.
pub fn closed_decision(limit: &Limit) -> Decision {
    let retry = Micros::SECOND.min(limit.window());
    Decision {
        allowed: false,
        limit: limit.limit(),
        remaining: 0,
        reset_after: retry,
        retry_after: retry,
        delay: Micros::ZERO,
    }
}
