//! Tokens a worker took from the process's shared buckets ahead of a client's requests, so
//! that most of them cost no shared-data call: a read and a compare-and-swap write of two
//! slots (four host calls) is most of what a local prefilter shared by the process costs a
//! request in Envoy (BENCHMARKS-LOG.md, "Where a leased request's time goes").
//!
//! A worker that finds no token in hand for a client it saw within [`HOLD`] takes a few at
//! once from the table ([`Credit::chunk`]: a thirty-second of the burst, 1 for a burst under
//! 64, so a small bucket stays exact) and spends the rest on the client's next requests to
//! it; a client it has not seen takes one, so a client that comes once strands nothing. The
//! table never gives a token twice, so no client is admitted past its bucket. What taking
//! ahead costs is the other way: tokens another worker holds for a client that went
//! elsewhere refuse it early, by at most `chunk − 1` a worker, and for at most [`HOLD`]: then
//! they lapse (the bucket refills them at its rate meanwhile).
//!
//! A worker remembers at most [`MAX_CLIENTS`] clients (fewer when the configuration's
//! `max_keys` says so), and clears those it saw more than [`HOLD`] ago at most once a
//! [`HOLD`] when it is full: a flood of new clients costs a few kilobytes of the VM's memory
//! (a real Envoy's VMs stay flat over 100,000 new clients, `tests/tests/envoy.rs`) and takes
//! tokens one at a time, as without credit.

use std::collections::BTreeMap;

use sluice_core::Micros;

/// How long tokens taken ahead stay in hand.
pub const HOLD: Micros = Micros::SECOND;

/// The share of the burst taken at once, and the most taken at once.
const CHUNK_SHARE: u64 = 32;
const MAX_CHUNK: u64 = 64;

/// Clients a worker remembers at most: the hot ones a worker sees again within a second are
/// few, and each costs the VM's memory for good (it never shrinks).
pub const MAX_CLIENTS: usize = 256;

/// Tokens in hand for a client, until when (the client was seen within [`HOLD`] before).
#[derive(Debug, Clone, Copy)]
struct Tokens {
    left: u64,
    until: Micros,
}

/// One worker's tokens in hand, by client key.
#[derive(Debug)]
pub struct Credit {
    chunk: u64,
    max_keys: usize,
    held: BTreeMap<String, Tokens>,
    /// When the clients seen too long ago were last cleared.
    cleared: Micros,
}

impl Credit {
    /// Credit for buckets of `burst` tokens, for at most `max_keys` clients at once.
    pub fn new(burst: u64, max_keys: usize) -> Credit {
        Credit {
            chunk: (burst / CHUNK_SHARE).clamp(1, MAX_CHUNK),
            max_keys: max_keys.min(MAX_CLIENTS),
            held: BTreeMap::new(),
            cleared: Micros::ZERO,
        }
    }

    /// Tokens to take from the table at once for `key`, which has none in hand: a chunk
    /// for a client seen within [`HOLD`], one for another (remembered from now on, room
    /// permitting).
    pub fn chunk(&mut self, key: &str, now: Micros) -> u64 {
        if let Some(t) = self.held.get_mut(key) {
            let seen = now < t.until;
            t.until = now.saturating_add(HOLD);
            return if seen { self.chunk } else { 1 };
        }
        if self.held.len() >= self.max_keys && now >= self.cleared.saturating_add(HOLD) {
            self.held.retain(|_, t| now < t.until);
            self.cleared = now;
        }
        if self.held.len() < self.max_keys {
            let seen = Tokens {
                left: 0,
                until: now.saturating_add(HOLD),
            };
            self.held.insert(key.to_owned(), seen);
        }
        1
    }

    /// Spends one of `key`'s tokens in hand at `now`; whether it had one.
    pub fn spend(&mut self, key: &str, now: Micros) -> bool {
        match self.held.get_mut(key) {
            Some(t) if now < t.until && t.left > 0 => {
                t.left -= 1;
                true
            }
            _ => false,
        }
    }

    /// `left` more tokens taken for `key` at `now` (after [`Credit::chunk`] said to take
    /// them), in hand from now on.
    pub fn hold(&mut self, key: &str, left: u64, now: Micros) {
        if let Some(t) = self.held.get_mut(key) {
            *t = Tokens {
                left,
                until: now.saturating_add(HOLD),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Micros {
        Micros::from_ms(ms)
    }

    #[test]
    fn a_small_burst_takes_one_token_at_a_time() {
        for (burst, chunk) in [(63, 1), (400, 12), (1_000_000, MAX_CHUNK)] {
            let mut c = Credit::new(burst, 10);
            assert_eq!(c.chunk("a", at(0)), 1, "a client not seen before takes one");
            assert_eq!(c.chunk("a", at(10)), chunk, "burst {burst}");
        }
    }

    #[test]
    fn tokens_in_hand_are_spent_once_and_lapse() {
        let mut c = Credit::new(400, 10);
        assert!(!c.spend("a", at(0)), "nothing in hand");
        assert_eq!(c.chunk("a", at(0)), 1);
        assert_eq!(c.chunk("a", at(5)), 12);
        c.hold("a", 2, at(5));
        assert!(c.spend("a", at(10)) && c.spend("a", at(20)));
        assert!(!c.spend("a", at(30)), "both spent");
        assert!(!c.spend("b", at(30)), "another client's");
        c.hold("b", 5, at(30));
        assert!(!c.spend("b", at(40)), "b was never seen: nothing held for it");
        assert_eq!(c.chunk("a", at(30)), 12);
        c.hold("a", 5, at(100));
        assert!(!c.spend("a", at(100).saturating_add(HOLD)), "lapsed");
        assert_eq!(c.chunk("a", at(200).saturating_add(HOLD)), 1, "not seen for too long");
    }

    #[test]
    fn a_worker_remembers_a_bounded_number_of_clients() {
        let mut c = Credit::new(400, 1_000_000);
        for i in 0..2 * MAX_CLIENTS {
            c.chunk(&i.to_string(), at(0));
        }
        assert_eq!(c.held.len(), MAX_CLIENTS, "the bound holds");
        assert_eq!(c.chunk("new", at(500)), 1);
        assert_eq!(c.chunk("new", at(600)), 1, "no room yet: one token at a time");
        // Once those seen lapse, the next new client clears them, at most once a second.
        c.chunk("newer", at(0).saturating_add(HOLD));
        assert_eq!(c.held.len(), 1);
        assert_eq!(c.chunk("newer", at(10).saturating_add(HOLD)), 12);
    }
}
