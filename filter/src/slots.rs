//! Token buckets every worker of the process shares: a fixed table of slots in the host's
//! shared data (Envoy's, for the VMs of one `vm_id`; ngx_wasm_module's `shm_kv` zone), each
//! read and written with compare-and-swap.
//!
//! The ABI cannot delete shared data, so the table never grows: `slots` keys, created when
//! the plugin is configured, whatever number of clients comes. A client's key maps to two
//! slots, and the table is updated conservatively (as a count-min sketch is): the client may
//! spend what its fuller slot holds, and an admission lowers each of its slots to at most
//! what is left. Every slot then holds no more than any client mapped to it would hold in a
//! bucket of its own, so no client is ever admitted past `burst + rate × T`, however the
//! keys collide. What a collision costs is the other way: a client is refused early only
//! when both of its slots are drained by others as well. A write only ever lowers a slot,
//! so a race lost on one slot after another was written costs at most a token, never a
//! token too many; after [`TRIES`] lost races the request is refused.

use sluice_core::text::push_u64;
use sluice_core::{Decision, Limit, Micros, State};

use crate::proxy::SharedData;

/// Compare-and-swap rounds a decision tries before it refuses.
pub const TRIES: usize = 8;

/// A table of shared token buckets.
pub struct SlotTable {
    /// Every slot's key is the prefix and its index.
    prefix: String,
    limit: Limit,
    slots: u64,
}

/// A slot as read: its state and the CAS to write it back with (0: absent).
struct Slot {
    index: u64,
    state: State,
    cas: u32,
}

impl SlotTable {
    /// `slots` (at least 2) buckets of `limit` under the shared-data keys `{prefix}{index}`.
    pub fn new(prefix: String, limit: Limit, slots: u64) -> SlotTable {
        SlotTable {
            prefix,
            limit,
            slots: slots.max(2),
        }
    }

    /// Creates every slot not there yet, so that no decision writes a slot absent — which
    /// Envoy would do unconditionally, whatever another worker wrote meanwhile. Called when
    /// the plugin is configured, before traffic; a slot another worker created is kept.
    /// Returns how many slots the host would not create.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        let mut refused = 0;
        for index in 0..self.slots {
            if !create(p, &self.key(index)) {
                refused += 1;
            }
        }
        refused
    }

    /// Takes one token for `key` at `now`.
    pub fn take(&self, p: &mut impl SharedData, key: &str, now: Micros) -> Decision {
        self.take_up_to(p, key, now, 1).0
    }

    /// Takes `want` tokens for `key` at `now`, or one when the bucket has fewer: the
    /// decision, and how many it took (0 when refused).
    pub fn take_up_to(&self, p: &mut impl SharedData, key: &str, now: Micros, want: u64) -> (Decision, u64) {
        let (a, b) = self.pair(key);
        for _ in 0..TRIES {
            let slots = [self.read(p, a), self.read(p, b)];
            let left_of = |s: &Slot| self.limit.expires_after(&s.state, now);
            let Some(fullest) = slots.iter().min_by_key(|s| left_of(s)) else {
                break;
            };
            let mut state = fullest.state.clone();
            let mut taken = want.max(1);
            let mut decision = self.limit.decide(&mut state, now, taken);
            if !decision.allowed && taken > 1 {
                (state, taken) = (fullest.state.clone(), 1);
                decision = self.limit.decide(&mut state, now, 1);
            }
            if !decision.allowed {
                return (decision, 0); // a refusal changes no slot
            }
            let after = self.limit.expires_after(&state, now);
            let bytes = encode(&state);
            let lowered = slots
                .iter()
                .filter(|s| left_of(s) < after)
                .all(|s| p.shared_set(&self.key(s.index), &bytes, s.cas));
            if lowered {
                return (decision, taken);
            }
        }
        let mut spent = self.limit.with_remaining(0, now);
        (self.limit.decide(&mut spent, now, 1), 0)
    }

    /// The limit of every slot (for headers).
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    fn key(&self, index: u64) -> String {
        slot_key(&self.prefix, index)
    }

    /// `key`'s two slots: two halves of its hash, the second moved on when they meet.
    fn pair(&self, key: &str) -> (u64, u64) {
        let h = fnv1a(key.as_bytes());
        let a = h % self.slots;
        let b = (h >> 32) % self.slots;
        (a, if b == a { (a + 1) % self.slots } else { b })
    }

    /// Slot `index`: absent, empty or unreadable, it is a full bucket.
    fn read(&self, p: &impl SharedData, index: u64) -> Slot {
        let (bytes, cas) = p.shared_get(&self.key(index)).unwrap_or_default();
        Slot {
            index,
            state: decode(&bytes).unwrap_or(State::Fresh),
            cas,
        }
    }
}

/// Makes shared-data `key`, empty, unless it is there; whether it is there now. Another
/// worker configuring at the same moment may make it between the read and the write
/// (ngx_wasm_module then refuses the write, its CAS of 0 asking for an absent key): read
/// again before calling it missing.
pub fn create(p: &mut impl SharedData, key: &str) -> bool {
    p.shared_get(key).is_some() || p.shared_set(key, &[], 0) || p.shared_get(key).is_some()
}

/// A bucket's state as a slot holds it: its scaled tokens and when they were counted, 16
/// bytes little-endian; a fresh bucket is empty.
fn encode(state: &State) -> Vec<u8> {
    match state {
        State::Bucket { tokens, last } => {
            let mut out = tokens.to_le_bytes().to_vec();
            out.extend_from_slice(&last.as_u64().to_le_bytes());
            out
        }
        _ => Vec::new(),
    }
}

/// What [`encode`] wrote; `None` for anything else.
fn decode(bytes: &[u8]) -> Option<State> {
    if bytes.is_empty() {
        return Some(State::Fresh);
    }
    let (tokens, last) = bytes.split_at_checked(8)?;
    Some(State::Bucket {
        tokens: u64::from_le_bytes(tokens.try_into().ok()?),
        last: Micros::new(u64::from_le_bytes(last.try_into().ok()?)),
    })
}

/// Slot `index`'s shared-data key under `prefix`: the prefix, then the index in decimal.
pub fn slot_key(prefix: &str, index: u64) -> String {
    let mut key = String::with_capacity(prefix.len() + 20);
    key.push_str(prefix);
    push_u64(&mut key, index);
    key
}

/// FNV-1a, 64 bits: every worker maps a key to the same slots.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_parts(&[bytes])
}

/// [`fnv1a`] of `parts` one after another, without joining them first.
pub fn fnv1a_parts(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|part| part.iter())
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

#[cfg(test)]
pub(crate) mod tests;
