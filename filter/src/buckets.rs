//! Token buckets per key, one rate for all of them (the local prefilter, the fallback while
//! failing open), kept by the worker or by the whole process.
//!
//! A worker's own buckets ([`StateMap`]) are bounded in keys: a flood of random keys costs at
//! most `max_keys` entries, and an evicted key only gets a fresh, full bucket back. The
//! process's (`slots::SlotTable`) are a fixed table in the host's shared data that never admits
//! a key past its bucket's bound; a collision can only refuse early. A worker takes the
//! process's tokens a few at a time, and spends those in hand without a call
//! (`credit.rs`).

use sluice_core::{Algorithm, Decision, Limit, Micros, StateMap};

use crate::credit::Credit;
use crate::proxy::SharedData;
use crate::slots::SlotTable;

/// The buckets' window: their rate is per second.
pub const WINDOW: Micros = Micros::SECOND;

/// Keyed buckets.
pub enum Buckets {
    /// This worker's own.
    Worker {
        /// Every bucket's.
        limit: Limit,
        /// By key.
        states: StateMap,
    },
    /// Every worker's, in shared data, with the tokens this worker has in hand.
    Process(SlotTable, Credit),
}

/// What a table of buckets is: its rate and burst, and where it is kept.
pub struct BucketSpec<'a> {
    /// Tokens a second.
    pub rate_per_s: u64,
    /// Tokens at most.
    pub burst: u64,
    /// A worker's: at most this many keys.
    pub max_keys: usize,
    /// The process's: this many slots under this shared-data key prefix; `None`, the
    /// worker's.
    pub shared: Option<(&'a str, u64)>,
}

impl Buckets {
    /// The buckets `spec` describes; `None` when no token bucket has that rate and burst.
    pub fn new(spec: BucketSpec<'_>) -> Option<Buckets> {
        let limit = Limit::builder(Algorithm::TokenBucket, spec.rate_per_s, WINDOW)
            .burst(spec.burst)
            .build()
            .ok()?;
        Some(match spec.shared {
            Some((prefix, slots)) => Buckets::Process(
                SlotTable::new(prefix.to_owned(), limit, slots),
                Credit::new(spec.burst, spec.max_keys),
            ),
            None => Buckets::Worker {
                limit,
                states: StateMap::new(spec.max_keys),
            },
        })
    }

    /// The buckets' limit (for headers).
    pub fn limit(&self) -> &Limit {
        match self {
            Buckets::Worker { limit, .. } => limit,
            Buckets::Process(table, _) => table.limit(),
        }
    }

    /// Makes the process's table before traffic; how many slots the host would not make.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        match self {
            Buckets::Worker { .. } => 0,
            Buckets::Process(table, _) => table.create(p),
        }
    }

    /// Takes one token from `key`'s bucket at `now`.
    pub fn take(&mut self, p: &mut impl SharedData, key: &str, now: Micros) -> Decision {
        match self {
            Buckets::Worker { limit, states } => states.decide(key, limit, 1, now),
            Buckets::Process(table, credit) => {
                if credit.spend(key, now) {
                    return in_hand(table.limit());
                }
                let (decision, taken) = table.take_up_to(p, key, now, credit.chunk(key, now));
                if taken > 1 {
                    credit.hold(key, taken - 1, now);
                }
                decision
            }
        }
    }
}

/// The decision for a token spent from those in hand: admitted (what the table holds is not
/// read, so nothing is said of it).
fn in_hand(limit: &Limit) -> Decision {
    Decision {
        allowed: true,
        limit: limit.limit(),
        remaining: 0,
        reset_after: Micros::ZERO,
        retry_after: Micros::ZERO,
        delay: Micros::ZERO,
    }
}
