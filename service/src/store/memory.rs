//! The in-process counter store: sharded maps of limit state with bounded memory.
//!
//! Each key hashes to one of [`SHARDS`] mutex-guarded maps, so concurrent checks rarely
//! contend. Every entry carries the time its state becomes indistinguishable from fresh
//! ([`Limit::expires_after`]); expired entries are swept periodically and whenever a shard
//! reaches its capacity. If a shard is full of live entries, the one expiring soonest is
//! evicted: under a flood of distinct keys memory stays bounded, and what is forgotten is
//! the state closest to being forgotten anyway.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

use sluice_core::{Limit, Micros, State};

use super::Stamped;
use crate::clock::Clock;

/// Number of shards; a power of two.
pub const SHARDS: usize = 64;

/// One shard: key → entry.
type Shard = HashMap<Box<str>, Entry>;

struct Entry {
    state: State,
    expires_at: Micros,
}

/// Sharded in-memory store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    per_shard_cap: usize,
    clock: Clock,
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys.
    pub fn new(max_keys: usize) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard_cap: (max_keys / SHARDS).max(16),
            clock: Clock::default(),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
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
        let mut shard = self.shard(key);
        if let Some(entry) = shard.get_mut(key) {
            if entry.expires_at <= now {
                entry.state = State::Fresh;
            }
            let decision = limit.decide(&mut entry.state, now, cost);
            entry.expires_at = now + limit.expires_after(&entry.state, now);
            return decision;
        }
        let mut state = State::Fresh;
        let decision = limit.decide(&mut state, now, cost);
        if decision.allowed {
            if shard.len() >= self.per_shard_cap {
                make_room(&mut shard, now);
            }
            let expires_at = now + limit.expires_after(&state, now);
            shard.insert(key.into(), Entry { state, expires_at });
        }
        decision
    }

    /// Gives back `cost` admitted at `at`.
    pub fn refund(&self, key: &str, limit: &Limit, at: Micros, cost: u64) {
        if let Some(entry) = self.shard(key).get_mut(key) {
            limit.refund(&mut entry.state, at, cost);
        }
    }

    /// Drops every expired entry; returns how many keys remain.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        self.shards
            .iter()
            .map(|s| {
                let mut shard = s.lock().unwrap_or_else(|p| p.into_inner());
                shard.retain(|_, e| e.expires_at > now);
                shard.len()
            })
            .sum()
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

/// Frees at least one slot: expired entries first, else the live one expiring soonest.
fn make_room(shard: &mut Shard, now: Micros) {
    let before = shard.len();
    shard.retain(|_, e| e.expires_at > now);
    if shard.len() < before {
        return;
    }
    if let Some(victim) = shard.iter().min_by_key(|(_, e)| e.expires_at).map(|(k, _)| k.clone()) {
        shard.remove(&victim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Algorithm;

    #[test]
    fn memory_stays_bounded_under_a_flood_of_distinct_keys() {
        let store = MemoryStore::new(SHARDS * 100);
        let limit = Limit::new(Algorithm::TokenBucket, 10, 60_000_000, 0, false, 0).unwrap();
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
        let limit = Limit::new(Algorithm::FixedWindow, 1, 1_000_000, 0, false, 0).unwrap();
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
        let limit = Limit::new(Algorithm::SlidingWindowLog, 1, 1_000_000, 0, false, 0).unwrap();
        assert!(store.decide_at("k", &limit, 1, 5).allowed);
        store.refund("k", &limit, 5, 1);
        assert!(store.decide_at("k", &limit, 1, 6).allowed);
    }
}
