//! Every worker's requests in flight by client: a fixed table of keys in the host's shared
//! data, each read and written with compare-and-swap.
//!
//! The ABI cannot delete shared data, so the table never grows: `keys` keys, made when the
//! plugin is configured. A client maps to one key by its hash, and the key holds the slots
//! of every client mapped to it as records of 24 bytes, little-endian: the client's 64-bit
//! hash, the slot's time (µs, when it was taken or last renewed) and how many were taken
//! then. Clients sharing a key are told apart by their whole hash, so a collision costs
//! bytes, not exactness. A change reads the key, hands the client's slots to sluice-core's
//! concurrency limit as its state, and writes the key back with every expired record of
//! any client dropped; a race lost to another worker is tried again, up to [`TRIES`].

use std::collections::VecDeque;

use sluice_core::{Decision, Limit, Micros, State};

use crate::proxy::SharedData;
use crate::slots::{create, fnv1a, slot_key, TRIES};

/// A record's bytes: hash, time, count.
const RECORD: usize = 24;

/// The process's table of slots by client.
pub struct InFlightTable {
    /// Every key is the prefix and its index.
    prefix: String,
    limit: Limit,
    keys: u64,
    /// Slots found expired and dropped by this worker's writes (holders that died without
    /// giving them back), since last taken.
    pub expired: u64,
}

impl InFlightTable {
    /// `keys` (at least 1) keys of `limit`'s slots under the shared-data keys `{prefix}{index}`.
    pub fn new(prefix: String, limit: Limit, keys: u64) -> InFlightTable {
        InFlightTable {
            prefix,
            limit,
            keys: keys.max(1),
            expired: 0,
        }
    }

    /// Makes every key not there yet (see [`crate::slots::SlotTable::create`]); how many the
    /// host would not make.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        (0..self.keys)
            .filter(|&index| !create(p, &slot_key(&self.prefix, index)))
            .count() as u64
    }

    /// Takes a slot for `client` at `now`; refused when every try lost its race.
    pub fn take(&mut self, p: &mut impl SharedData, client: &str, now: Micros) -> Decision {
        let limit = self.limit;
        let mut decision = None;
        let written = self.update(p, client, now, |state| {
            let d = limit.decide(state, now, 1);
            decision = Some(d);
            d.allowed
        });
        match decision {
            Some(d) if written || !d.allowed => d,
            _ => limit.decide(&mut limit.with_remaining(0, now), now, 1),
        }
    }

    /// Applies `change` to `client`'s slots at `now`; what it answered, the slots it touched
    /// (0 as well when every try lost its race).
    pub fn change(
        &mut self,
        p: &mut impl SharedData,
        client: &str,
        now: Micros,
        change: impl Fn(&mut State) -> u64,
    ) -> u64 {
        let mut touched = 0;
        let written = self.update(p, client, now, |state| {
            touched = change(state);
            touched > 0
        });
        if written {
            touched
        } else {
            0
        }
    }

    /// Reads `client`'s key, runs `step` on its slots (whether to write them), and writes the
    /// key back if so; whether it was written. A lost race runs `step` again on what won.
    fn update(
        &mut self,
        p: &mut impl SharedData,
        client: &str,
        now: Micros,
        mut step: impl FnMut(&mut State) -> bool,
    ) -> bool {
        let hash = fnv1a(client.as_bytes());
        let key = slot_key(&self.prefix, hash % self.keys);
        for _ in 0..TRIES {
            let (bytes, cas) = p.shared_get(&key).unwrap_or_default();
            let (mut state, others, expired) = split(&bytes, hash, self.limit.window(), now);
            if !step(&mut state) {
                return false;
            }
            if p.shared_set(&key, &join(others, hash, &state), cas) {
                self.expired += expired;
                return true;
            }
        }
        false
    }
}

/// The records of `bytes` alive at `now` (younger than `window`): `hash`'s as a state, the
/// others' bytes as they were, and the slots of those that expired. A partial record at the
/// end (never written) is dropped.
fn split(bytes: &[u8], hash: u64, window: Micros, now: Micros) -> (State, Vec<u8>, u64) {
    let mut entries = VecDeque::new();
    let mut others = Vec::with_capacity(bytes.len());
    let mut expired = 0u64;
    for record in bytes.chunks_exact(RECORD) {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&record[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let at = Micros::new(word(1));
        if at.saturating_add(window) <= now {
            expired = expired.saturating_add(word(2));
            continue;
        }
        if word(0) == hash {
            entries.push_back((at, word(2)));
        } else {
            others.extend_from_slice(record);
        }
    }
    entries.make_contiguous().sort_unstable();
    let used = entries.iter().fold(0u64, |sum, &(_, n)| sum.saturating_add(n));
    let state = if entries.is_empty() {
        State::Fresh
    } else {
        State::Log { entries, used }
    };
    (state, others, expired)
}

/// `others`' records followed by `hash`'s slots in `state`.
fn join(mut others: Vec<u8>, hash: u64, state: &State) -> Vec<u8> {
    if let State::Log { entries, .. } = state {
        for &(at, n) in entries {
            others.extend_from_slice(&hash.to_le_bytes());
            others.extend_from_slice(&at.as_u64().to_le_bytes());
            others.extend_from_slice(&n.to_le_bytes());
        }
    }
    others
}
