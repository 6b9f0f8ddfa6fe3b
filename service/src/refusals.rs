//! Refusals a node remembers, so that a flood on a spent quota costs the store nothing.
//!
//! When the store refuses a limit and says when the same request could pass again
//! (`retry_after`), the node refuses that limit's key itself until then, without a store call
//! ([`Refusals::settles`], before [`crate::decide::decide_limits`] asks the store). It never
//! admits anything by memory: an admission is always the store's. It never refuses past the
//! store's wait: other nodes can only spend more meanwhile. What would change the store's
//! answer sooner is forgotten: a reset, on every node ([`Refusals::forget`], announced over
//! the store's pub/sub); an override or a rules change, by the limit itself — a refusal is
//! remembered with the limit it was decided by, and settles only a request decided by the
//! same one. A request of several limits is settled only when a remembered refusal of an
//! enforced (not shadow) limit refuses it alone, at a cost no smaller than the one refused:
//! the store would refuse it whole, and a refused request consumes nothing.
//!
//! Bounded: at most `max` keys (a full shard first drops what has expired, then remembers
//! nothing new until something does); 0 remembers nothing.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sluice_core::{Decision, Limit, Micros};

use crate::store::Item;

/// Shards of the memory, each under its own lock.
const SHARDS: usize = 16;

/// A refusal as the store made it.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    /// The limit and cost it was decided by.
    limit: Limit,
    cost: u64,
    /// When (the node's clock), and what the store answered.
    at: Micros,
    decision: Decision,
}

impl Refusal {
    /// The store's answer as of `now`: its waits counted down; `None` once it may pass.
    fn at(&self, now: Micros) -> Option<Decision> {
        let elapsed = now.saturating_sub(self.at);
        let retry_after = self.decision.retry_after.saturating_sub(elapsed);
        (retry_after > Micros::ZERO).then_some(Decision {
            retry_after,
            reset_after: self.decision.reset_after.saturating_sub(elapsed),
            ..self.decision
        })
    }
}

/// The refusals a node remembers, by limit key.
pub struct Refusals {
    shards: Box<[Mutex<HashMap<String, Refusal>>]>,
    hasher: RandomState,
    per_shard: usize,
    len: AtomicUsize,
}

impl Refusals {
    /// A memory of at most `max` refusals (0: none).
    pub fn new(max: usize) -> Refusals {
        Refusals {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard: max.div_ceil(SHARDS),
            len: AtomicUsize::new(0),
        }
    }

    /// Refusals remembered now (some may have run out and not been dropped yet).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first of `items` a remembered refusal settles at `now` (an enforced limit, the
    /// same limit, a cost at least the one refused, within the store's wait): its index, and
    /// the store's answer as of now.
    pub fn settles(&self, items: &[Item<'_>], now: Micros) -> Option<(usize, Decision)> {
        if self.per_shard == 0 || self.is_empty() {
            return None;
        }
        items.iter().enumerate().find_map(|(i, item)| {
            let part = &item.part;
            if part.shadow || part.cost == 0 {
                return None;
            }
            let shard = self.shard(item.key).lock().unwrap_or_else(|p| p.into_inner());
            let r = shard.get(item.key)?;
            let same = r.limit == *part.limit && part.cost >= r.cost;
            same.then(|| r.at(now)).flatten().map(|d| (i, d))
        })
    }

    /// What the store decided for `items` at `now`: an enforced refusal with a wait is
    /// remembered; an admission forgets the key.
    pub fn remember(&self, items: &[Item<'_>], decisions: &[Decision], now: Micros) {
        if self.per_shard == 0 {
            return;
        }
        for (item, d) in items.iter().zip(decisions) {
            let part = &item.part;
            if d.allowed {
                if !self.is_empty() {
                    self.forget(item.key);
                }
                continue;
            }
            if part.shadow || part.cost == 0 || d.retry_after == Micros::ZERO {
                continue;
            }
            let refusal = Refusal {
                limit: *part.limit,
                cost: part.cost,
                at: now,
                decision: *d,
            };
            let mut shard = self.shard(item.key).lock().unwrap_or_else(|p| p.into_inner());
            if shard.len() >= self.per_shard && !shard.contains_key(item.key) {
                let before = shard.len();
                shard.retain(|_, r| r.at(now).is_some());
                self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
                if shard.len() >= self.per_shard {
                    continue;
                }
            }
            if shard.insert(item.key.to_owned(), refusal).is_none() {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Forgets the refusal of `key` (a reset).
    pub fn forget(&self, key: &str) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if shard.remove(key).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Refusal>> {
        let i = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        &self.shards[i]
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::algorithm::Part;
    use sluice_core::{Algorithm, State};

    use super::*;

    fn limit(n: u64) -> Limit {
        Limit::builder(Algorithm::FixedWindow, n, Micros::SECOND)
            .build()
            .expect("valid")
    }

    fn item<'a>(key: &'a str, limit: &'a Limit, cost: u64, shadow: bool) -> Item<'a> {
        Item {
            key,
            part: Part { limit, shadow, cost },
        }
    }

    /// The store's decision for `cost` on a spent fixed window at `now`.
    fn refused(limit: &Limit, cost: u64, now: Micros) -> Decision {
        let mut state = limit.with_remaining(0, now);
        let d = limit.decide(&mut state, now, cost);
        assert!(!d.allowed && d.retry_after > Micros::ZERO, "{d:?}");
        d
    }

    #[test]
    fn a_refusal_settles_the_same_limit_until_its_wait_and_no_longer() {
        let (l, now) = (limit(10), Micros::from_ms(100));
        let memory = Refusals::new(100);
        let d = refused(&l, 1, now);
        memory.remember(&[item("k", &l, 1, false)], &[d], now);
        let wait = d.retry_after;
        let later = now.saturating_add(Micros::from_ms(300));
        let (i, answer) = memory.settles(&[item("k", &l, 1, false)], later).expect("settled");
        assert_eq!(i, 0);
        assert_eq!(answer.retry_after, wait.saturating_sub(Micros::from_ms(300)));
        assert!(!answer.allowed);
        // At the wait's end the store decides again.
        assert!(memory
            .settles(&[item("k", &l, 1, false)], now.saturating_add(wait))
            .is_none());
        // Another limit (an override), a smaller cost, a shadow, another key: the store's.
        let other = limit(20);
        assert!(memory.settles(&[item("k", &other, 1, false)], later).is_none());
        assert!(memory.settles(&[item("k", &l, 1, true)], later).is_none());
        assert!(memory.settles(&[item("j", &l, 1, false)], later).is_none());
        let d3 = refused(&l, 3, now);
        memory.remember(&[item("k3", &l, 3, false)], &[d3], now);
        assert!(memory.settles(&[item("k3", &l, 2, false)], later).is_none());
        assert!(memory.settles(&[item("k3", &l, 4, false)], later).is_some());
    }

    #[test]
    fn an_admission_or_a_reset_forgets_and_the_memory_is_bounded() {
        let (l, now) = (limit(10), Micros::from_ms(100));
        let memory = Refusals::new(SHARDS); // one a shard
        let d = refused(&l, 1, now);
        memory.remember(&[item("k", &l, 1, false)], &[d], now);
        let mut admitted = l.decide(&mut State::Fresh, now, 1);
        admitted.allowed = true;
        memory.remember(&[item("k", &l, 1, false)], &[admitted], now);
        assert!(memory.settles(&[item("k", &l, 1, false)], now).is_none());
        memory.remember(&[item("k", &l, 1, false)], &[d], now);
        memory.forget("k");
        assert!(memory.settles(&[item("k", &l, 1, false)], now).is_none());
        assert!(memory.is_empty());
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            memory.remember(&[item(key, &l, 1, false)], &[d], now);
        }
        assert!(memory.len() <= SHARDS, "{} remembered", memory.len());
        // Once they have run out, new refusals take their place.
        let later = now.saturating_add(d.retry_after);
        memory.remember(&[item("new", &l, 1, false)], &[refused(&l, 1, later)], later);
        assert!(memory.settles(&[item("new", &l, 1, false)], later).is_some());
        let nothing = Refusals::new(0);
        nothing.remember(&[item("k", &l, 1, false)], &[d], now);
        assert!(nothing.settles(&[item("k", &l, 1, false)], now).is_none());
    }
}
