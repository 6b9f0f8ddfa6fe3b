//! Tokens a worker took from the process's shared buckets ahead of a client's requests, so
//! that most of them cost no shared-data call: a read and a compare-and-swap write of two
//! slots (four host calls) is most of what a local prefilter shared by the process costs a
//! request in Envoy (BENCHMARKS-LOG.md, "Where a leased request's time goes").
//!
//! A worker that finds no token in hand takes a few at once from the table ([`Credit::chunk`]:
//! a thirty-second of the burst, 1 for a burst under 64, so a small bucket stays exact) and
//! spends the rest on the client's next requests to it. The table never gives a token twice,
//! so no client is admitted past its bucket. What taking ahead costs is the other way:
//! tokens another worker holds for a client that went elsewhere refuse it early, by at most
//! `chunk − 1` a worker, and for at most [`HOLD`]: then they lapse (the bucket refills them at
//! its rate meanwhile).

use std::collections::BTreeMap;

use sluice_core::Micros;

/// How long tokens taken ahead stay in hand.
pub const HOLD: Micros = Micros::SECOND;

/// The share of the burst taken at once, and the most taken at once.
const CHUNK_SHARE: u64 = 32;
const MAX_CHUNK: u64 = 64;

/// Tokens in hand for a client, until when.
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
}

impl Credit {
    /// Credit for buckets of `burst` tokens, for at most `max_keys` clients at once.
    pub fn new(burst: u64, max_keys: usize) -> Credit {
        Credit {
            chunk: (burst / CHUNK_SHARE).clamp(1, MAX_CHUNK),
            max_keys,
            held: BTreeMap::new(),
        }
    }

    /// Tokens to take from the table at once for a client with none in hand: 1 when there
    /// is no room to hold more.
    pub fn chunk(&mut self, now: Micros) -> u64 {
        if self.held.len() >= self.max_keys {
            self.held.retain(|_, t| now < t.until && t.left > 0);
        }
        if self.held.len() < self.max_keys {
            self.chunk
        } else {
            1
        }
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

    /// `left` more tokens taken for `key` at `now`, in hand from now on.
    pub fn hold(&mut self, key: &str, left: u64, now: Micros) {
        let tokens = Tokens {
            left,
            until: now.saturating_add(HOLD),
        };
        let room = self.held.len() < self.max_keys;
        match self.held.get_mut(key) {
            Some(t) => *t = tokens,
            None if left > 0 && room => {
                self.held.insert(key.to_owned(), tokens);
            }
            None => {}
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
        assert_eq!(Credit::new(63, 10).chunk(at(0)), 1);
        assert_eq!(Credit::new(400, 10).chunk(at(0)), 12);
        assert_eq!(Credit::new(1_000_000, 10).chunk(at(0)), MAX_CHUNK);
    }

    #[test]
    fn tokens_in_hand_are_spent_once_and_lapse() {
        let mut c = Credit::new(400, 10);
        assert!(!c.spend("a", at(0)), "nothing in hand");
        c.hold("a", 2, at(0));
        assert!(c.spend("a", at(10)) && c.spend("a", at(20)));
        assert!(!c.spend("a", at(30)), "both spent");
        assert!(!c.spend("b", at(30)), "another client's");
        c.hold("a", 5, at(100));
        assert!(!c.spend("a", at(100).saturating_add(HOLD)), "lapsed");
    }

    #[test]
    fn no_more_clients_than_max_keys_hold_tokens() {
        let mut c = Credit::new(400, 2);
        c.hold("a", 3, at(0));
        c.hold("b", 3, at(0));
        assert_eq!(c.chunk(at(10)), 1, "full: one token at a time");
        c.hold("c", 3, at(10));
        assert!(!c.spend("c", at(20)), "no room was made");
        // Once a client's tokens lapse, its room is free again.
        assert_eq!(c.chunk(at(0).saturating_add(HOLD)), 12);
    }
}
