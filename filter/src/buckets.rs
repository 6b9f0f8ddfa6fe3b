//! Token buckets per key, one rate for all of them (the local prefilter, the fallback while
//! failing open), with a bound on the number of keys ([`StateMap`]: a flood of random keys
//! costs at most `max_keys` entries, and an evicted key only gets a fresh, full bucket back,
//! so the prefilter errs towards letting the check service decide).

use sluice_core::{Algorithm, Decision, Limit, Micros, StateMap};

/// The buckets' window: their rate is per second.
pub const WINDOW: Micros = Micros::SECOND;

/// Keyed buckets.
pub struct Buckets {
    limit: Limit,
    states: StateMap,
}

impl Buckets {
    /// Buckets of `burst` refilling at `rate_per_s`, at most `max_keys` of them; `None` when
    /// no token bucket has that rate and burst.
    pub fn new(rate_per_s: u64, burst: u64, max_keys: usize) -> Option<Buckets> {
        let limit = Limit::builder(Algorithm::TokenBucket, rate_per_s, WINDOW)
            .burst(burst)
            .build()
            .ok()?;
        Some(Buckets {
            limit,
            states: StateMap::new(max_keys),
        })
    }

    /// The buckets' limit (for headers).
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Takes one token from `key`'s bucket at `now`.
    pub fn take(&mut self, key: &str, now: Micros) -> Decision {
        self.states.decide(key, &self.limit, 1, now)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}
