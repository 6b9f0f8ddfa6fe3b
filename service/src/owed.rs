//! What the fallback admitted while the store could not answer, spent in the store once it
//! answers again.
//!
//! A rule that fails open is decided by the node's fallback buckets while the store is away
//! (seeded with the store's last answer, shared among the live nodes: [`crate::decide`]).
//! Those admissions happened; the store, or the replica promoted in its place, never saw
//! them. So the node keeps what each key's fallback admitted and, when a store call succeeds
//! again, takes it from the store (`Store::take`: whatever is left, never a refusal): the
//! check that succeeded, its own keys' before it answers ([`crate::decide`]), the others
//! beside it ([`crate::housekeeping::settle_owed`]). So the quota goes on from what was
//! really admitted rather than handing out its remainder a second time. Each node knows
//! only its own: until the last node is back, the first can spend what the store still
//! shows of a key another's fallback has admitted (at most that node's share). Bounded by
//! `--max-keys`: past it, admissions are not kept (and counted in
//! `sluice_fallback_unsettled_units_total`; those spent in
//! `sluice_fallback_settled_units_total`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use sluice_core::Limit;
use tokio::sync::Notify;

/// Units admitted by the fallback, by limit key, not yet spent in the store.
pub struct Owed {
    units: Mutex<HashMap<String, (Limit, u64)>>,
    max: usize,
    /// Whether anything is owed (read on every store answer, without the lock).
    any: AtomicBool,
    /// Wakes [`crate::housekeeping::settle_owed`] when the store answers with something owed.
    due: Notify,
}

impl Owed {
    /// Remembers at most `max` keys.
    pub fn new(max: usize) -> Owed {
        Owed {
            units: Mutex::new(HashMap::new()),
            max,
            any: AtomicBool::new(false),
            due: Notify::new(),
        }
    }

    /// The fallback admitted `units` of `limit` under `key`. False when the memory is full
    /// and they are not kept.
    pub fn add(&self, key: &str, limit: &Limit, units: u64) -> bool {
        let mut owed = self.units.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((l, n)) = owed.get_mut(key) {
            (*l, *n) = (*limit, n.saturating_add(units));
        } else if owed.len() < self.max {
            owed.insert(key.to_owned(), (*limit, units));
        } else {
            return false;
        }
        self.any.store(true, Ordering::Release);
        true
    }

    /// The store answered: if anything is owed, [`crate::housekeeping::settle_owed`] spends
    /// it now.
    pub fn store_answered(&self) {
        if self.any.load(Ordering::Acquire) {
            self.due.notify_one();
        }
    }

    /// Waits until a store answer finds something owed.
    pub async fn due(&self) {
        self.due.notified().await;
    }

    /// What is owed for `keys`, taken out (the rest stays owed).
    pub fn take_keys<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Vec<(String, Limit, u64)> {
        let mut owed = self.units.lock().unwrap_or_else(|p| p.into_inner());
        let taken = keys
            .into_iter()
            .filter_map(|key| owed.remove_entry(key))
            .map(|(key, (limit, units))| (key, limit, units))
            .collect();
        self.any.store(!owed.is_empty(), Ordering::Release);
        taken
    }

    /// Everything owed, taken out.
    pub fn take_all(&self) -> Vec<(String, Limit, u64)> {
        let mut owed = self.units.lock().unwrap_or_else(|p| p.into_inner());
        self.any.store(false, Ordering::Release);
        owed.drain().map(|(key, (limit, units))| (key, limit, units)).collect()
    }

    /// How many keys are owed for.
    pub fn len(&self) -> usize {
        self.units.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing is owed.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }
}
