//! The heaviest hitters of a stream in bounded memory: the Space-Saving summary (Metwally,
//! Agrawal and El Abbadi, "Efficient computation of frequent and top-k elements in data
//! streams", ICDT 2005).
//!
//! A summary of capacity `k` keeps at most `k` keys, each with a count and an error. A key
//! already kept adds to its count; a new key takes a free entry, or replaces the entry with
//! the smallest count `m` and starts from `m` (its error `m`). After `n` offers:
//!
//! - every key's true count lies in `[count − error, count]`: a kept count never
//!   undercounts, and overcounts by at most its error;
//! - every error, and the smallest count, is at most `n / k`;
//! - so every key whose true count is more than `n / k` is kept.
//!
//! The service uses it for the clients a rule refuses most (`GET /v1/admin/top`). Pure: no
//! clock, no I/O; an offer costs `O(k)`.

use std::num::NonZeroUsize;

/// One key kept by a [`SpaceSaving`] summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// The key.
    pub key: String,
    /// Its count: never less than its true count, at most `error` more.
    pub count: u64,
    /// How much `count` may overcount.
    pub error: u64,
}

/// A Space-Saving summary of at most `capacity` keys (see the module's documentation).
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: NonZeroUsize,
    entries: Vec<Counted>,
    total: u64,
}

impl SpaceSaving {
    /// An empty summary keeping at most `capacity` keys.
    pub fn new(capacity: NonZeroUsize) -> SpaceSaving {
        SpaceSaving {
            capacity,
            entries: Vec::with_capacity(capacity.get()),
            total: 0,
        }
    }

    /// The most keys kept.
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// The sum of every weight offered (`n`).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counts `weight` occurrences of `key`.
    pub fn offer(&mut self, key: &str, weight: u64) {
        self.total = self.total.saturating_add(weight);
        if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
            e.count = e.count.saturating_add(weight);
            return;
        }
        if self.entries.len() < self.capacity.get() {
            self.entries.push(Counted {
                key: key.to_owned(),
                count: weight,
                error: 0,
            });
            return;
        }
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            min.key.clear();
            min.key.push_str(key);
            min.error = min.count;
            min.count = min.count.saturating_add(weight);
        }
    }

    /// The keys kept, the highest count first (ties by key).
    pub fn top(&self) -> Vec<&Counted> {
        let mut top: Vec<&Counted> = self.entries.iter().collect();
        top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        top
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn summary(k: usize) -> SpaceSaving {
        SpaceSaving::new(NonZeroUsize::new(k).unwrap_or(NonZeroUsize::MIN))
    }

    #[test]
    fn exact_while_there_is_room() {
        let mut s = summary(3);
        for key in ["a", "b", "a", "c", "a", "b"] {
            s.offer(key, 1);
        }
        let top: Vec<(&str, u64, u64)> = s.top().iter().map(|e| (e.key.as_str(), e.count, e.error)).collect();
        assert_eq!(top, [("a", 3, 0), ("b", 2, 0), ("c", 1, 0)]);
        assert_eq!(s.total(), 6);
    }

    #[test]
    fn a_new_key_replaces_the_smallest_and_carries_its_count_as_error() {
        let mut s = summary(2);
        for key in ["a", "a", "a", "b", "c"] {
            s.offer(key, 1);
        }
        let top: Vec<(&str, u64, u64)> = s.top().iter().map(|e| (e.key.as_str(), e.count, e.error)).collect();
        assert_eq!(top, [("a", 3, 0), ("c", 2, 1)]);
        assert_eq!(s.capacity(), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// The guarantee: `true ≤ count ≤ true + error` for every key kept, and every key
        /// whose true count is above `n / k` kept.
        #[test]
        fn counts_bound_the_truth_and_heavy_keys_are_kept(
            k in 1usize..8,
            stream in proptest::collection::vec((0u8..20, 1u64..4), 0..400),
        ) {
            let mut s = summary(k);
            let mut truth: HashMap<String, u64> = HashMap::new();
            for (key, weight) in &stream {
                let key = format!("id-{key}");
                s.offer(&key, *weight);
                *truth.entry(key).or_default() += weight;
            }
            let n: u64 = stream.iter().map(|(_, w)| w).sum();
            prop_assert_eq!(s.total(), n);
            let top = s.top();
            prop_assert!(top.len() <= k);
            prop_assert_eq!(top.iter().map(|e| e.count).sum::<u64>(), n);
            for e in &top {
                let t = truth.get(&e.key).copied().unwrap_or(0);
                prop_assert!(t <= e.count && e.count <= t + e.error, "{:?} true {}", e, t);
                prop_assert!(e.error * k as u64 <= n, "error {} above n/k", e.error);
            }
            for (key, t) in &truth {
                if t * k as u64 > n {
                    prop_assert!(top.iter().any(|e| &e.key == key), "{} ({} of {}) missing", key, t, n);
                }
            }
        }
    }
}
