//! The filter's own in-flight limit natively: two workers over one in-memory shared data
//! (Envoy's CAS, with a rival worker's writes), and a worker's own count.

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_core::Micros;

use super::LocalInFlight;
use crate::config::LocalConcurrency;
use crate::slots::tests::Memory;

const MS: Micros = Micros::MILLISECOND;

fn config(limit: u64) -> LocalConcurrency {
    LocalConcurrency {
        by: "user".into(),
        limit,
        expiry_ms: 3_000,
        max_keys: 1_000,
    }
}

/// A worker of a process whose table has `keys` keys.
fn process(limit: u64, keys: u64) -> LocalInFlight {
    LocalInFlight::new(&config(limit), Some(("sluice/test/in_flight/".into(), keys))).expect("limit")
}

fn created(worker: &LocalInFlight) -> Memory {
    let mut m = Memory::default();
    assert_eq!(worker.create(&mut m), 0);
    m
}

#[test]
fn the_workers_of_a_process_share_one_limit_and_a_slot_comes_back_once() {
    let (mut a, mut b) = (process(3, 64), process(3, 64));
    let mut m = created(&a);
    let t = Micros::from_secs(1_000);
    let first = a.take(&mut m, "alice", t).hold.expect("admitted");
    assert!(b.take(&mut m, "alice", t + MS).hold.is_some());
    assert!(a.take(&mut m, "alice", t + 2 * MS).hold.is_some());
    let refused = b.take(&mut m, "alice", t + 3 * MS);
    assert!(
        !refused.decision.allowed && refused.hold.is_none(),
        "three in flight across both"
    );
    assert_eq!(refused.decision.retry_after, Micros::SECOND, "look again soon");
    assert!(
        b.take(&mut m, "bob", t + 3 * MS).decision.allowed,
        "another client's own"
    );
    assert!(a.end(&mut m, first, t + 4 * MS), "given back");
    assert!(!a.end(&mut m, first, t + 4 * MS), "once");
    assert!(b.take(&mut m, "alice", t + 5 * MS).decision.allowed, "the slot freed");
    assert!(!a.take(&mut m, "alice", t + 6 * MS).decision.allowed);
    assert_eq!(m.map.len(), 64, "the table never grows");
}

#[test]
fn a_dead_workers_slots_expire_and_a_running_requests_are_renewed() {
    let (mut dies, mut lives) = (process(2, 8), process(2, 8));
    let mut m = created(&lives);
    let t = Micros::from_secs(1_000);
    dies.take(&mut m, "alice", t);
    let running = lives.take(&mut m, "alice", t).hold.expect("admitted");
    drop(dies); // its requests never end
    for step in 1..=5 {
        assert_eq!(lives.renew_due(&mut m, t + step * Micros::SECOND), 0);
    }
    let later = t + 5 * Micros::SECOND;
    assert!(
        lives.take(&mut m, "alice", later).decision.allowed,
        "the dead one's expired"
    );
    assert_eq!(lives.take_expired(), 1, "and was counted");
    assert!(
        !lives.take(&mut m, "alice", later + MS).decision.allowed,
        "the running request's slot, renewed, still counts"
    );
    assert!(lives.end(&mut m, running, later + 2 * MS));
}

#[test]
fn lost_races_are_tried_again_and_past_the_tries_refused() {
    let mut w = process(5, 4);
    let mut m = created(&w);
    let t = Micros::from_secs(1_000);
    m.rival = 3;
    assert!(
        w.take(&mut m, "alice", t).decision.allowed,
        "decided after three lost races"
    );
    m.rival = usize::MAX;
    let d = w.take(&mut m, "alice", t);
    assert!(
        !d.decision.allowed && d.hold.is_none(),
        "contention past the tries is refused"
    );
}

#[test]
fn a_workers_own_count_limits_it_alone() {
    let mut w = LocalInFlight::new(&config(1), None).expect("limit");
    let mut m = Memory::default();
    let t = Micros::from_secs(1_000);
    let hold = w.take(&mut m, "alice", t).hold.expect("admitted");
    assert!(!w.take(&mut m, "alice", t).decision.allowed);
    assert!(w.end(&mut m, hold, t + MS));
    assert!(w.take(&mut m, "alice", t + 2 * MS).decision.allowed);
    assert!(m.map.is_empty(), "no shared data");
}

proptest! {
    /// Requests of a few clients over two workers and a table of few keys (so that clients
    /// share keys), in any order, ending in any order, with rival writes: a request is
    /// admitted exactly when its client has fewer than `limit` in flight (races lost fewer
    /// times than the tries).
    #[test]
    fn each_client_has_at_most_its_limit_in_flight_and_uses_it(
        limit in 1u64..5,
        keys in 1u64..4,
        steps in prop::collection::vec((0usize..6, any::<bool>(), 0usize..2, 0usize..3), 1..300),
    ) {
        let mut workers = [process(limit, keys), process(limit, keys)];
        let mut m = created(&workers[0]);
        let mut now = Micros::from_secs(1_000);
        let mut running: Vec<(usize, usize, u64)> = Vec::new(); // (client, worker, hold)
        let mut in_flight: HashMap<usize, u64> = HashMap::new();
        for (client, start, worker, rival) in steps {
            now += MS;
            if start || running.is_empty() {
                m.rival = rival;
                let taken = workers[worker].take(&mut m, &format!("client-{client}"), now);
                let held = in_flight.entry(client).or_default();
                prop_assert_eq!(taken.decision.allowed, *held < limit, "client {} with {} in flight", client, held);
                if let Some(hold) = taken.hold {
                    *held += 1;
                    prop_assert!(*held <= limit);
                    running.push((client, worker, hold));
                }
            } else {
                let (client, worker, hold) = running.remove(client % running.len());
                m.rival = 0;
                prop_assert!(workers[worker].end(&mut m, hold, now));
                *in_flight.entry(client).or_default() -= 1;
            }
        }
    }
}
