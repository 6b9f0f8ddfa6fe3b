//! Limit state per key, in memory, with a bound on the number of keys: the filter's local
//! and fallback buckets, and each shard of the service's memory store and fallback buckets.
//!
//! Every entry carries the time its state becomes indistinguishable from a fresh one
//! ([`Limit::expires_after`]); an expired entry decides as a fresh one would. When the bound
//! is reached, the expired entries are dropped, and with them the live entries expiring
//! soonest, so that an eighth of the bound is free: one pass for every eighth of the bound
//! of new keys, not a scan of the whole map for each (at 100,000 keys that scan cost 0.4 ms a
//! new key natively). Under a flood of distinct keys memory stays bounded, and what is
//! forgotten is the state closest to being forgotten anyway; an evicted key only gets a fresh
//! (full) quota back, erring towards admitting.

use std::collections::HashMap;

use crate::algorithm::{Decision, Limit, State};
use crate::evict::{evict_lowest, EVICT_SHARE};
use crate::time::Micros;

struct Entry {
    state: State,
    expires_at: Micros,
}

/// Keyed limit states, at most `max_keys` of them.
pub struct StateMap {
    max_keys: usize,
    entries: HashMap<Box<str>, Entry>,
    /// Passes made to make room (for the tests' count of work).
    passes: u64,
}

impl StateMap {
    /// An empty map that holds at most `max_keys` (at least 1) keys.
    pub fn new(max_keys: usize) -> StateMap {
        StateMap {
            max_keys: max_keys.max(1),
            entries: HashMap::new(),
            passes: 0,
        }
    }

    /// Decides a request of `cost` against `limit` under `key` at `now`, keeping the new
    /// state. A key seen for the first time is kept only when admitted (a denial changed
    /// nothing a fresh state would not show again).
    pub fn decide(&mut self, key: &str, limit: &Limit, cost: u64, now: Micros) -> Decision {
        if let Some(entry) = self.entries.get_mut(key) {
            if entry.expires_at <= now {
                entry.state = State::Fresh;
            }
            let decision = limit.decide(&mut entry.state, now, cost);
            entry.expires_at = now.saturating_add(limit.expires_after(&entry.state, now));
            return decision;
        }
        let mut state = State::Fresh;
        let decision = limit.decide(&mut state, now, cost);
        if decision.allowed {
            if self.entries.len() >= self.max_keys {
                self.make_room(now);
            }
            let expires_at = now.saturating_add(limit.expires_after(&state, now));
            self.entries.insert(key.into(), Entry { state, expires_at });
        }
        decision
    }

    /// The state under `key` at `now`: a copy, fresh when the key is unknown or expired.
    /// With [`StateMap::keep`], for deciding several keys together ([`crate::algorithm::decide_all`]).
    pub fn state(&self, key: &str, now: Micros) -> State {
        match self.entries.get(key) {
            Some(entry) if entry.expires_at > now => entry.state.clone(),
            _ => State::Fresh,
        }
    }

    /// Keeps `state` under `key` as decided at `now` by `limit`, making room as
    /// [`StateMap::decide`] does for a new key.
    pub fn keep(&mut self, key: &str, limit: &Limit, state: State, now: Micros) {
        let expires_at = now.saturating_add(limit.expires_after(&state, now));
        if let Some(entry) = self.entries.get_mut(key) {
            *entry = Entry { state, expires_at };
            return;
        }
        if self.entries.len() >= self.max_keys {
            self.make_room(now);
        }
        self.entries.insert(key.into(), Entry { state, expires_at });
    }

    /// Forgets `key`'s state (its next decision starts fresh); whether it was held.
    pub fn remove(&mut self, key: &str) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Drops every entry expired at `now`; returns how many keys remain.
    pub fn sweep(&mut self, now: Micros) -> usize {
        self.entries.retain(|_, e| e.expires_at > now);
        self.entries.len()
    }

    /// Keys held (expired or not).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Frees room in one pass: every expired entry, and at least an eighth of the bound in
    /// all, the live entries expiring soonest making up the rest.
    fn make_room(&mut self, now: Micros) {
        self.passes += 1;
        let count = (self.max_keys / EVICT_SHARE).max(1);
        // Ranked by raw microseconds: the lease book ranks by milliseconds through the same code.
        evict_lowest(
            &mut self.entries,
            count,
            Some(now.as_u64()),
            |e| e.expires_at.as_u64(),
            |_, _| {},
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::time::Micros;

    #[test]
    fn bounded_under_a_flood_and_still_limits() {
        let limit = Limit::builder(Algorithm::TokenBucket, 1, Micros::SECOND)
            .burst(2)
            .build()
            .unwrap();
        let mut map = StateMap::new(1_000);
        for i in 0..50_000u64 {
            map.decide(
                &format!("10.0.{}.{}", i / 256, i % 256),
                &limit,
                1,
                Micros::new(1_000 + i),
            );
        }
        assert!(map.len() <= 1_000);
        assert!(map.decide("x", &limit, 1, Micros::ZERO).allowed && map.decide("x", &limit, 1, Micros::ZERO).allowed);
        assert!(!map.decide("x", &limit, 1, Micros::ZERO).allowed);
    }

    #[test]
    fn makes_room_with_expired_entries_first_then_the_one_expiring_soonest() {
        let limit = Limit::builder(Algorithm::SlidingWindowLog, 1, 10 * Micros::SECOND)
            .build()
            .unwrap();
        let mut map = StateMap::new(2);
        assert!(map.decide("a", &limit, 1, Micros::ZERO).allowed); // expires at 10 s
        assert!(map.decide("b", &limit, 1, Micros::SECOND).allowed); // at 11 s
        assert!(map.decide("c", &limit, 1, 2 * Micros::SECOND).allowed); // evicts a
        assert_eq!(map.len(), 2);
        assert!(!map.decide("b", &limit, 1, 3 * Micros::SECOND).allowed, "b is kept");
        assert!(
            map.decide("a", &limit, 1, 3 * Micros::SECOND).allowed,
            "a was forgotten"
        );
        assert!(map.decide("d", &limit, 1, 20 * Micros::SECOND).allowed);
        assert_eq!(map.len(), 1, "every expired entry went at once");
    }

    #[test]
    fn a_flood_at_the_bound_makes_room_an_eighth_at_a_time_without_forgetting_more() {
        let limit = Limit::builder(Algorithm::TokenBucket, 1, 60 * Micros::SECOND)
            .build()
            .unwrap();
        let mut map = StateMap::new(800);
        // Every key decided at the same instant: all expire together (a millisecond clock
        // gives a flood such ties), and only as many as needed may go.
        for i in 0..1_800u64 {
            assert!(map.decide(&format!("k{i}"), &limit, 1, Micros::new(1_000)).allowed);
            assert!(map.len() <= 800);
        }
        assert!(
            map.passes <= 1_000 / 100 + 1,
            "{} passes for 1,000 keys past the bound",
            map.passes
        );
        assert!(
            map.len() > 700,
            "an eighth freed at a time, not everything tied: {}",
            map.len()
        );
        assert!(
            !map.decide("k1799", &limit, 1, Micros::new(1_000)).allowed,
            "the newest key is kept"
        );
    }

    #[test]
    fn expired_state_is_fresh_again_and_swept() {
        let limit = Limit::builder(Algorithm::FixedWindow, 1, Micros::SECOND)
            .build()
            .unwrap();
        let mut map = StateMap::new(1_000);
        assert!(map.decide("k", &limit, 1, Micros::ZERO).allowed);
        assert!(!map.decide("k", &limit, 1, Micros::new(10)).allowed);
        assert!(map.decide("k", &limit, 1, Micros::SECOND).allowed);
        assert_eq!(map.sweep(Micros::SECOND), 1);
        assert_eq!(map.sweep(2 * Micros::SECOND), 0);
        assert!(map.is_empty());
    }

    #[test]
    fn a_first_denial_keeps_nothing_and_kept_state_decides_next() {
        let limit = Limit::builder(Algorithm::SlidingWindowLog, 1, Micros::SECOND)
            .build()
            .unwrap();
        let mut map = StateMap::new(1_000);
        assert!(!map.decide("big", &limit, 2, Micros::ZERO).allowed);
        assert!(map.is_empty());
        let mut state = map.state("k", Micros::new(5));
        assert!(limit.decide(&mut state, Micros::new(5), 1).allowed);
        map.keep("k", &limit, state, Micros::new(5));
        assert!(
            !map.decide("k", &limit, 1, Micros::new(6)).allowed,
            "the kept admission counts"
        );
        assert_eq!(
            map.state("k", Micros::new(5) + Micros::SECOND),
            State::Fresh,
            "and expires"
        );
    }
}
