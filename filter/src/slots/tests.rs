//! The shared table natively, over an in-memory shared data with Envoy's CAS, and with a
//! rival worker that writes between a read and its write.

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_core::{Algorithm, Limit, Micros};

use super::{SlotTable, TRIES};
use crate::proxy::SharedData;

/// Shared data as Envoy keeps it; `rival` writes every key before each of the next `n` sets.
#[derive(Default)]
pub(crate) struct Memory {
    pub(crate) map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    pub(crate) rival: usize,
    pub(crate) sets: usize,
}

impl SharedData for Memory {
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.map.get(key).cloned()
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> bool {
        self.sets += 1;
        self.next_cas += 1;
        if self.rival > 0 {
            self.rival -= 1;
            if let Some(entry) = self.map.get_mut(key) {
                entry.1 = self.next_cas; // another worker's write: same value, new CAS
                self.next_cas += 1;
            }
        }
        match self.map.get(key) {
            Some((_, current)) if cas != 0 && cas != *current => false,
            _ => {
                self.map.insert(key.to_owned(), (value.to_vec(), self.next_cas));
                true
            }
        }
    }
}

fn table(slots: u64, rate: u64, burst: u64) -> SlotTable {
    let limit = Limit::builder(Algorithm::TokenBucket, rate, Micros::SECOND)
        .burst(burst)
        .build()
        .expect("limit");
    SlotTable::new("sluice/test/l".into(), limit, slots)
}

fn created(t: &SlotTable) -> Memory {
    let mut m = Memory::default();
    assert_eq!(t.create(&mut m), 0);
    m
}

#[test]
fn a_client_alone_gets_its_burst_then_its_rate() {
    let t = table(64, 2, 5);
    let mut m = created(&t);
    assert_eq!(m.map.len(), 64, "every slot made at configuration");
    let at = |ms: u64| Micros::from_ms(1_000_000 + ms);
    let admitted = (0..20).filter(|_| t.take(&mut m, "203.0.113.9", at(0)).allowed).count();
    assert_eq!(admitted, 5, "the burst, no more");
    let d = t.take(&mut m, "203.0.113.9", at(0));
    assert_eq!(d.retry_after, Micros::from_ms(500), "one token every half second");
    assert!(t.take(&mut m, "203.0.113.9", at(500)).allowed);
    assert!(!t.take(&mut m, "203.0.113.9", at(500)).allowed);
    assert!(
        t.take(&mut m, "198.51.100.1", at(500)).allowed,
        "another client, its own slots"
    );
    assert_eq!(m.map.len(), 64, "the table never grows");
}

#[test]
fn creating_again_keeps_what_another_worker_wrote() {
    let t = table(8, 1, 3);
    let mut m = created(&t);
    for _ in 0..3 {
        assert!(t.take(&mut m, "k", Micros::SECOND).allowed);
    }
    assert_eq!(t.create(&mut m), 0, "a second worker configures");
    assert!(
        !t.take(&mut m, "k", Micros::SECOND).allowed,
        "the spent bucket stayed spent"
    );
}

#[test]
fn lost_races_retry_and_past_the_tries_refuse() {
    let t = table(16, 1, 10);
    let mut m = created(&t);
    m.rival = 3;
    assert!(
        t.take(&mut m, "k", Micros::SECOND).allowed,
        "decided after three lost races"
    );
    m.rival = usize::MAX;
    let sets = m.sets;
    let d = t.take(&mut m, "k", Micros::SECOND);
    assert!(!d.allowed, "contention past the tries is refused");
    assert!(m.sets - sets <= 2 * TRIES, "bounded work: {} sets", m.sets - sets);
}

#[test]
fn a_garbled_slot_reads_as_a_full_bucket_and_is_made_whole() {
    let t = table(4, 1, 2);
    let mut m = created(&t);
    for v in m.map.values_mut() {
        v.0 = b"not a bucket".to_vec();
    }
    assert!(t.take(&mut m, "k", Micros::SECOND).allowed);
    assert!(t.take(&mut m, "k", Micros::SECOND).allowed);
    assert!(!t.take(&mut m, "k", Micros::SECOND).allowed);
}

proptest! {
    /// Any number of clients over a table of a few slots (so that they collide), requests in
    /// any order and time, rival writes at random: no client is admitted past its own
    /// bucket's bound, `burst + rate × T`.
    #[test]
    fn no_client_is_admitted_past_its_bound_however_keys_collide(
        slots in 2u64..12,
        rate in 1u64..20,
        burst in 1u64..10,
        clients in 1usize..40,
        requests in prop::collection::vec((0usize..40, 0u64..100, 0usize..3), 1..400),
    ) {
        let t = table(slots, rate, burst);
        let mut m = created(&t);
        let start = Micros::from_secs(1_000);
        let mut now = start;
        let mut admitted: HashMap<usize, u64> = HashMap::new();
        for (client, step_ms, rival) in requests {
            now = now.saturating_add(Micros::from_ms(step_ms));
            m.rival = rival;
            let client = client % clients;
            if t.take(&mut m, &format!("client-{client}"), now).allowed {
                *admitted.entry(client).or_default() += 1;
            }
        }
        let elapsed = now.saturating_sub(start);
        let bound = burst + (rate * elapsed.as_u64()) / 1_000_000;
        for (client, n) in admitted {
            prop_assert!(n <= bound, "client {client}: {n} admitted, bound {bound}");
        }
    }

    /// A client whose two slots no other client shares is never refused early: the table
    /// decides as a bucket of its own would.
    #[test]
    fn a_client_without_collisions_decides_as_its_own_bucket(
        rate in 1u64..20,
        burst in 1u64..10,
        steps in prop::collection::vec(0u64..300, 1..200),
    ) {
        let t = table(1_024, rate, burst);
        let mut m = created(&t);
        let limit = *t.limit();
        let mut own = sluice_core::State::Fresh;
        let mut now = Micros::from_secs(1_000);
        for step_ms in steps {
            now = now.saturating_add(Micros::from_ms(step_ms));
            let want = limit.decide(&mut own, now, 1).allowed;
            prop_assert_eq!(t.take(&mut m, "alone", now).allowed, want);
        }
    }
}

/// ngx_wasm_module's create-if-absent, losing to another worker that made the key between
/// this worker's read and write.
struct LostCreate {
    made_by_the_other: bool,
}

impl SharedData for LostCreate {
    fn shared_get(&self, _key: &str) -> Option<(Vec<u8>, u32)> {
        self.made_by_the_other.then(|| (Vec::new(), 1))
    }

    fn shared_set(&mut self, _key: &str, _value: &[u8], cas: u32) -> bool {
        assert_eq!(cas, 0, "a create");
        self.made_by_the_other = true; // it was there first: CAS mismatch
        false
    }
}

#[test]
fn a_slot_another_worker_made_meanwhile_is_not_missing() {
    let mut p = LostCreate {
        made_by_the_other: false,
    };
    assert!(super::create(&mut p, "sluice/test/l0"));
}
