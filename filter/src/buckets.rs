//! Token buckets per key, kept in the VM's memory with a bound on the number of keys.
//!
//! When the bound is reached, expired buckets (full again, so equal to fresh ones) are
//! dropped first; if none is expired, an arbitrary bucket is evicted. A flood of random
//! keys therefore costs at most `max_keys` entries, and an evicted key only gets a fresh
//! (full) bucket back: the prefilter errs towards letting the check service decide.

use std::collections::HashMap;

use sluice_core::{Algorithm, Decision, Limit, Micros, State};

struct Entry {
    state: State,
    expires_at: Micros,
}

/// Keyed buckets.
pub struct Buckets {
    limit: Limit,
    max_keys: usize,
    entries: HashMap<Box<str>, Entry>,
}

impl Buckets {
    /// Buckets of `burst` refilling at `rate_per_s`, at most `max_keys` of them.
    pub fn new(rate_per_s: u64, burst: u64, max_keys: usize) -> Option<Buckets> {
        let limit = Limit::new(Algorithm::TokenBucket, rate_per_s, 1_000_000, burst, false, 0).ok()?;
        Some(Buckets {
            limit,
            max_keys: max_keys.max(1),
            entries: HashMap::new(),
        })
    }

    /// The bucket's limit (for headers).
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Takes one token from `key`'s bucket at `now`.
    pub fn take(&mut self, key: &str, now: Micros) -> Decision {
        if let Some(e) = self.entries.get_mut(key) {
            let d = self.limit.decide(&mut e.state, now, 1);
            e.expires_at = now + self.limit.expires_after(&e.state, now);
            return d;
        }
        let mut state = State::Fresh;
        let d = self.limit.decide(&mut state, now, 1);
        if self.entries.len() >= self.max_keys {
            self.entries.retain(|_, e| e.expires_at > now);
            if self.entries.len() >= self.max_keys {
                if let Some(victim) = self.entries.keys().next().cloned() {
                    self.entries.remove(&victim);
                }
            }
        }
        let expires_at = now + self.limit.expires_after(&state, now);
        self.entries.insert(key.into(), Entry { state, expires_at });
        d
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_under_a_flood_and_still_limits() {
        let mut b = Buckets::new(1, 2, 1_000).unwrap();
        for i in 0..50_000u64 {
            b.take(&format!("10.0.{}.{}", i / 256, i % 256), 1_000 + i);
        }
        assert!(b.len() <= 1_000);
        assert!(b.take("x", 0).allowed && b.take("x", 0).allowed);
        assert!(!b.take("x", 0).allowed);
    }
}
