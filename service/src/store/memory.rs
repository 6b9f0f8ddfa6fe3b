//! The in-process counter store: sharded maps of limit state with bounded memory.
//!
//! Each key hashes to one of [`SHARDS`] mutex-guarded [`StateMap`]s, so concurrent checks
//! rarely contend. A shard bounds its keys as core's map does (expired entries first, then
//! the one expiring soonest); expired entries are also swept periodically.
//!
//! The published rules and the violations log live here too, for the one node that uses
//! the store.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

use sluice_core::{Limit, Micros, StateMap};

use super::{Publish, Published, Stamped, Violation};
use crate::clock::Clock;

/// Number of shards; a power of two.
pub const SHARDS: usize = 64;

/// Sharded in-memory store.
pub struct MemoryStore {
    shards: Box<[Mutex<StateMap>]>,
    hasher: RandomState,
    clock: Clock,
    published: Mutex<Option<Published>>,
    violations: Mutex<VecDeque<Violation>>,
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys.
    pub fn new(max_keys: usize) -> MemoryStore {
        let per_shard = (max_keys / SHARDS).max(16);
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(StateMap::new(per_shard))).collect(),
            hasher: RandomState::new(),
            clock: Clock::default(),
            published: Mutex::new(None),
            violations: Mutex::new(VecDeque::new()),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, StateMap> {
        let i = self.hasher.hash_one(key) as usize & (SHARDS - 1);
        // A panic while holding a shard lock cannot leave an entry half-written (states are
        // replaced whole), so a poisoned lock is safe to keep using.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides at the store's clock.
    pub fn decide(&self, key: &str, limit: &Limit, cost: u64) -> Stamped {
        let now = self.clock.now_us();
        Stamped {
            decision: self.decide_at(key, limit, cost, now),
            at: now,
        }
    }

    /// Decides at an explicit time (tests and the fallback buckets).
    pub fn decide_at(&self, key: &str, limit: &Limit, cost: u64, now: Micros) -> sluice_core::Decision {
        self.shard(key).decide(key, limit, cost, now)
    }

    /// Gives back `cost` admitted at `at`.
    pub fn refund(&self, key: &str, limit: &Limit, at: Micros, cost: u64) {
        self.shard(key).refund(key, limit, at, cost);
    }

    /// Drops every expired entry; returns how many keys remain.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).sweep(now))
            .sum()
    }

    /// The published rules, if any.
    pub fn published_rules(&self) -> Option<Published> {
        self.published.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Publishes `text` as the next version if `expected` is the current one (or `None`).
    pub fn publish_rules(&self, text: &str, expected: Option<u64>) -> Publish {
        let mut published = self.published.lock().unwrap_or_else(PoisonError::into_inner);
        let current = published.as_ref().map_or(0, |p| p.version);
        if expected.is_some_and(|e| e != current) {
            return Publish::Conflict(current);
        }
        *published = Some(Published {
            version: current + 1,
            text: text.to_owned(),
        });
        Publish::Done(current + 1)
    }

    /// Appends to the violations ring, keeping the newest `capacity`.
    pub fn record_violation(&self, v: Violation, capacity: usize) {
        let mut ring = self.violations.lock().unwrap_or_else(PoisonError::into_inner);
        while ring.len() >= capacity.max(1) {
            ring.pop_front();
        }
        ring.push_back(v);
    }

    /// The newest `count` violations, newest first.
    pub fn recent_violations(&self, count: usize) -> Vec<Violation> {
        let ring = self.violations.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter().rev().take(count).cloned().collect()
    }

    /// Keys currently held (expired or not).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    /// Whether the store holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Algorithm;

    #[test]
    fn memory_stays_bounded_under_a_flood_of_distinct_keys() {
        let store = MemoryStore::new(SHARDS * 100);
        let limit = Limit::builder(Algorithm::TokenBucket, 10, 60_000_000).build().unwrap();
        for i in 0..100_000 {
            store.decide_at(&format!("k{i}"), &limit, 1, 1_000_000 + i);
        }
        assert!(store.len() <= SHARDS * 100, "{} keys held", store.len());
        assert!(
            store.len() >= SHARDS * 50,
            "{} keys held: eviction too eager",
            store.len()
        );
    }

    #[test]
    fn expired_state_is_fresh_again_and_swept() {
        let store = MemoryStore::new(1_000);
        let limit = Limit::builder(Algorithm::FixedWindow, 1, 1_000_000).build().unwrap();
        assert!(store.decide_at("k", &limit, 1, 0).allowed);
        assert!(!store.decide_at("k", &limit, 1, 10).allowed);
        assert!(store.decide_at("k", &limit, 1, 1_000_000).allowed);
        assert_eq!(store.len(), 1);
        // The clock of `sweep` is the real one, far past these test times.
        assert_eq!(store.sweep(), 0);
    }

    #[test]
    fn refund_restores_quota() {
        let store = MemoryStore::new(1_000);
        let limit = Limit::builder(Algorithm::SlidingWindowLog, 1, 1_000_000)
            .build()
            .unwrap();
        assert!(store.decide_at("k", &limit, 1, 5).allowed);
        store.refund("k", &limit, 5, 1);
        assert!(store.decide_at("k", &limit, 1, 6).allowed);
    }
}
