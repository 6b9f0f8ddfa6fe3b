//! The in-process counter store: sharded maps of limit state with bounded memory.
//!
//! Each key hashes to one of [`SHARDS`] mutex-guarded [`StateMap`]s, so concurrent checks
//! rarely contend. A shard bounds its keys as core's map does (expired entries first, then
//! the one expiring soonest); expired entries are also swept periodically.
//!
//! The published rules and the violations log live here too, for the one node that uses
//! the store.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sluice_core::algorithm::{decide_all, passes, Part};
use sluice_core::lease::{self, Grant};
use sluice_core::{Decision, Limit, Micros, State, StateMap};

use super::{keys, Item, Publish, Published, Stamped, Violation};
use crate::clock::Clock;

/// Number of shards; a power of two.
pub const SHARDS: usize = 64;

/// Sharded in-memory store.
pub struct MemoryStore {
    shards: Box<[Mutex<StateMap>]>,
    hasher: RandomState,
    clock: Arc<Clock>,
    published: Mutex<Option<Published>>,
    violations: Mutex<VecDeque<Violation>>,
    /// What each lease still holds.
    leases: Mutex<LeaseTable>,
}

/// What each live lease still holds ([`keys::lease`] → units, granted at, end), at most
/// `max` of them, with their ends in order: ended records are dropped from the front, never
/// found by a scan, and a grant that would find no room is refused before it takes anything
/// (an unrecorded lease's units could never come back).
struct LeaseTable {
    records: HashMap<String, (u64, Micros, Micros)>,
    by_end: BTreeSet<(Micros, String)>,
    max: usize,
}

impl LeaseTable {
    fn new(max: usize) -> LeaseTable {
        LeaseTable {
            records: HashMap::new(),
            by_end: BTreeSet::new(),
            max,
        }
    }

    /// Drops the records of leases ended before `now`; whether one more fits.
    fn has_room(&mut self, now: Micros) -> bool {
        while let Some((end, _)) = self.by_end.first() {
            if *end >= now {
                break;
            }
            if let Some((_, key)) = self.by_end.pop_first() {
                self.records.remove(&key);
            }
        }
        self.records.len() < self.max
    }

    fn add(&mut self, record: String, units: u64, now: Micros, end: Micros) {
        let held = self.records.entry(record.clone()).or_insert((0, now, end));
        held.0 += units;
        self.by_end.insert((held.2, record));
    }

    fn remove(&mut self, record: &str, end: Micros) {
        self.records.remove(record);
        self.by_end.remove(&(end, record.to_owned()));
    }
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys.
    pub fn new(max_keys: usize) -> MemoryStore {
        let per_shard = (max_keys / SHARDS).max(16);
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(StateMap::new(per_shard))).collect(),
            hasher: RandomState::new(),
            clock: Arc::default(),
            published: Mutex::new(None),
            violations: Mutex::new(VecDeque::new()),
            leases: Mutex::new(LeaseTable::new(max_keys.max(1_024))),
        }
    }

    /// Grants up to `want` units of `limit` under `key` for `ttl` (see `sluice_core::lease`)
    /// as the lease `id`, and records what it holds so that no more than that can come back.
    pub fn grant(&self, key: &str, limit: &Limit, want: u64, ttl: Micros, id: u64) -> Grant {
        let mut shard = self.lock(self.shard_index(key));
        // Read under the key's lock: its decisions are taken in time order (see decide_all).
        let now = self.clock.now();
        let room = self.leases.lock().unwrap_or_else(PoisonError::into_inner).has_room(now);
        let mut state = shard.state(key, now);
        if !room {
            // Nowhere to record it: refused, the state untouched (the proxy checks exactly).
            let mut refused = lease::grant(limit, &mut state, now, want, ttl);
            refused.units = 0;
            return refused;
        }
        let granted = lease::grant(limit, &mut state, now, want, ttl);
        if granted.units > 0 {
            shard.keep(key, limit, state, now);
            drop(shard);
            // Concurrent grants may each have seen room: the table exceeds its bound by at
            // most their number.
            let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
            leases.add(keys::lease(key, id), granted.units, now, granted.expires_at);
        }
        granted
    }

    /// Sets `key`'s quota to `remaining` units left now: what the store last said of it, so a
    /// fallback bucket that takes over when the store fails starts from there rather than
    /// from a whole quota (a second limit in every failover).
    pub fn seed(&self, key: &str, limit: &Limit, remaining: u64) {
        let mut shard = self.lock(self.shard_index(key));
        let now = self.clock.now();
        shard.keep(key, limit, limit.with_remaining(remaining, now), now);
    }

    /// Takes up to `want` units of `limit` under `key` now, whatever is left of them, with no
    /// lease: a cost learnt after the request passed (see `Store::take`).
    pub fn take(&self, key: &str, limit: &Limit, want: u64) -> Grant {
        let mut shard = self.lock(self.shard_index(key));
        let now = self.clock.now();
        let mut state = shard.state(key, now);
        let taken = lease::take(limit, &mut state, now, want);
        if taken.units > 0 {
            shard.keep(key, limit, state, now);
        }
        taken
    }

    /// Gives back up to `unspent` units of the lease `id` of `key`, if it has not ended:
    /// never more than it still holds. The units taken back.
    pub fn give_back(&self, key: &str, limit: &Limit, id: u64, unspent: u64) -> u64 {
        let now = self.clock.now();
        let record = keys::lease(key, id);
        let (back, granted_at, expires_at) = {
            let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(&(held, granted_at, end)) = leases.records.get(&record) else {
                return 0;
            };
            if end < now {
                leases.remove(&record, end);
                return 0;
            }
            let back = unspent.min(held);
            if back == held {
                leases.remove(&record, end);
            } else {
                leases.records.insert(record, (held - back, granted_at, end));
            }
            (back, granted_at, end)
        };
        let mut shard = self.lock(self.shard_index(key));
        let now = now.max(self.clock.now()); // under the key's lock, as every decision
        let mut state = shard.state(key, now);
        if lease::give_back(limit, &mut state, (granted_at, expires_at), back, now) {
            shard.keep(key, limit, state, now);
            back
        } else {
            0
        }
    }

    /// Gives back or renews slots of a concurrency limit: see `Store::slots`.
    pub fn slots(&self, key: &str, limit: &Limit, at: Micros, cost: u64, renew: bool) -> (u64, Micros) {
        let mut shard = self.lock(self.shard_index(key));
        let now = self.clock.now();
        let mut state = shard.state(key, now);
        let found = if renew {
            limit.renew(&mut state, at, now, cost)
        } else {
            limit.release(&mut state, at, cost)
        };
        if found > 0 {
            shard.keep(key, limit, state, now);
        }
        (found, now)
    }

    fn shard_index(&self, key: &str) -> usize {
        self.hasher.hash_one(key) as usize & (SHARDS - 1)
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, StateMap> {
        // A panic while holding a shard lock cannot leave an entry half-written (states are
        // replaced whole), so a poisoned lock is safe to keep using.
        self.shards[shard].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides one request against every item at the store's clock, all-or-nothing.
    pub fn decide_all(&self, items: &[Item<'_>]) -> Vec<Stamped> {
        let (decisions, at) = self.decide_locked(items, || self.clock.now(), true);
        decisions.into_iter().map(|decision| Stamped { decision, at }).collect()
    }

    /// As [`MemoryStore::decide_all`], the decisions only; with `keep` false nothing is
    /// written: the decisions are those the request would get (a request another rule
    /// denies anyway). For the fallback buckets.
    pub fn decide_all_now(&self, items: &[Item<'_>], keep: bool) -> Vec<Decision> {
        self.decide_locked(items, || self.clock.now(), keep).0
    }

    /// Its clock, which a test may hold ([`Clock::set`]).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Decides under one critical section for all the items' keys, at the time `now` reads
    /// once they are locked: two decisions of a key are taken in the order of their times
    /// (a time read before the lock could be older than the key's last decision, and a
    /// window's count or a bucket's refill would be counted from the past). The time used.
    fn decide_locked(&self, items: &[Item<'_>], now: impl FnOnce() -> Micros, keep: bool) -> (Vec<Decision>, Micros) {
        if let ([item], true) = (items, keep) {
            let mut shard = self.lock(self.shard_index(item.key));
            let now = now();
            return (vec![shard.decide(item.key, item.part.limit, item.part.cost, now)], now);
        }
        let shard_of: Vec<usize> = items.iter().map(|i| self.shard_index(i.key)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Locked in ascending order, so two checks never wait on each other in a cycle.
        let mut guards: Vec<MutexGuard<'_, StateMap>> = order.iter().map(|&i| self.lock(i)).collect();
        let now = now();
        let slot = |shard: usize| order.binary_search(&shard).unwrap_or_default();
        let mut states: Vec<State> = items
            .iter()
            .zip(&shard_of)
            .map(|(item, &shard)| guards[slot(shard)].state(item.key, now))
            .collect();
        let parts: Vec<Part<'_>> = items.iter().map(|i| i.part).collect();
        let decisions = decide_all(&parts, &mut states, now);
        if keep && passes(&parts, &decisions) {
            for (((item, &shard), state), d) in items.iter().zip(&shard_of).zip(states).zip(&decisions) {
                if d.allowed {
                    guards[slot(shard)].keep(item.key, item.part.limit, state, now);
                }
            }
        }
        (decisions, now)
    }

    /// Forgets the state under `key`; whether there was any.
    pub fn reset(&self, key: &str) -> bool {
        self.lock(self.shard_index(key)).remove(key)
    }

    /// Drops every expired entry; returns how many keys remain.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).sweep(now))
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
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
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
    use sluice_core::{Algorithm, Limit};

    fn item<'a>(key: &'a str, limit: &'a Limit) -> Item<'a> {
        Item {
            key,
            part: Part {
                limit,
                shadow: false,
                cost: 1,
            },
        }
    }

    fn decide(store: &MemoryStore, key: &str, limit: &Limit, now: Micros) -> bool {
        decide_at(store, &[item(key, limit)], now, true)[0].allowed
    }

    fn decide_at(store: &MemoryStore, items: &[Item<'_>], now: Micros, keep: bool) -> Vec<Decision> {
        store.clock().set(Some(now));
        store.decide_all_now(items, keep)
    }

    #[test]
    fn a_full_lease_table_refuses_grants_it_cannot_record_and_makes_room_as_leases_end() {
        let store = MemoryStore::new(16);
        let limit = Limit::builder(Algorithm::FixedWindow, 1_000, Micros::from_secs(3_600))
            .build()
            .unwrap();
        let ttl = 60_000_000;
        for id in 0..1_024 {
            assert_eq!(store.grant(&format!("k{id}"), &limit, 1, Micros::new(ttl), id).units, 1);
        }
        // The 1,025th lease has nowhere to be recorded: refused, nothing taken.
        assert_eq!(store.grant("victim", &limit, 5, Micros::new(ttl), 9_999).units, 0);
        assert_eq!(store.grant("victim", &limit, 5, Micros::new(ttl), 9_999).units, 0);
        // Every recorded lease can still be given back.
        assert_eq!(store.give_back("k7", &limit, 7, 1), 1);
        // Once there is room again, grants are recorded and returnable.
        let granted = store.grant("victim", &limit, 5, Micros::new(ttl), 10_000);
        assert_eq!(
            (granted.units, granted.decision.remaining),
            (5, 995),
            "the refusals took nothing"
        );
        assert_eq!(store.give_back("victim", &limit, 10_000, 5), 5);
        // Ended leases leave from the front of the table, not by a scan.
        let mut table = LeaseTable::new(2);
        table.add("a".into(), 1, Micros::ZERO, Micros::new(10));
        table.add("b".into(), 1, Micros::ZERO, Micros::new(20));
        assert!(!table.has_room(Micros::new(5)));
        assert!(table.has_room(Micros::new(11)), "a ended");
        assert_eq!(table.records.len(), 1);
        assert_eq!(table.by_end.len(), 1);
    }

    #[test]
    fn memory_stays_bounded_under_a_flood_of_distinct_keys() {
        let store = MemoryStore::new(SHARDS * 100);
        let limit = Limit::builder(Algorithm::TokenBucket, 10, Micros::from_secs(60))
            .build()
            .unwrap();
        for i in 0..100_000 {
            decide(&store, &format!("k{i}"), &limit, Micros::new(1_000_000 + i));
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
        let limit = Limit::builder(Algorithm::FixedWindow, 1, Micros::SECOND)
            .build()
            .unwrap();
        assert!(decide(&store, "k", &limit, Micros::new(1)));
        assert!(!decide(&store, "k", &limit, Micros::new(10)));
        assert!(decide(&store, "k", &limit, Micros::SECOND));
        assert_eq!(store.len(), 1);
        // The real clock again, far past these test times: swept.
        store.clock().set(None);
        assert_eq!(store.sweep(), 0);
    }

    #[test]
    fn several_keys_stay_all_or_nothing_under_concurrency() {
        let store = MemoryStore::new(10_000);
        let shared = Limit::builder(Algorithm::SlidingWindowLog, 1_000, Micros::from_secs(60))
            .build()
            .unwrap();
        let per_user = Limit::builder(Algorithm::FixedWindow, 20, Micros::from_secs(60))
            .build()
            .unwrap();
        let passed = std::sync::atomic::AtomicU64::new(0);
        store.clock().set(Some(Micros::new(1_000)));
        std::thread::scope(|scope| {
            for t in 0..64 {
                let (store, shared, per_user, passed) = (&store, &shared, &per_user, &passed);
                scope.spawn(move || {
                    let user = format!("user-{t}");
                    let items = [item("ip", shared), item(&user, per_user)];
                    for _ in 0..25 {
                        let d = store.decide_all_now(&items, true);
                        if d.iter().all(|d| d.allowed) {
                            passed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        // 1,280 requests the user rules admit; the shared rule admits exactly its 1,000 and
        // was charged for nothing else.
        assert_eq!(passed.into_inner(), 1_000);
        assert!(!decide(&store, "ip", &shared, Micros::new(2_000)));
    }

    #[test]
    fn several_keys_are_all_or_nothing_and_a_peek_keeps_nothing() {
        let store = MemoryStore::new(1_000);
        let ten = Limit::builder(Algorithm::SlidingWindowLog, 10, Micros::SECOND)
            .build()
            .unwrap();
        let one = Limit::builder(Algorithm::TokenBucket, 1, Micros::SECOND)
            .build()
            .unwrap();
        let items = [item("wide", &ten), item("narrow", &one)];
        assert!(decide_at(&store, &items, Micros::new(1), false)
            .iter()
            .all(|d| d.allowed));
        assert!(store.is_empty(), "a peek wrote state");
        assert!(decide_at(&store, &items, Micros::new(1), true)
            .iter()
            .all(|d| d.allowed));
        let denied = decide_at(&store, &items, Micros::new(2), true);
        assert!(denied[0].allowed && !denied[1].allowed);
        for t in 2..11 {
            assert!(
                decide(&store, "wide", &ten, Micros::new(t)),
                "the denied request took from wide at {t}"
            );
        }
        assert!(!decide(&store, "wide", &ten, Micros::new(11)));
    }
}
