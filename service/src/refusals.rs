//! Refusals a node remembers, so that a flood on a spent quota costs the store nothing.
//!
//! When the store refuses a limit and says when the same request could pass again
//! (`retry_after`), the node refuses that limit's key itself until then, without a store call
//! ([`Refusals::settles`], before [`crate::decide::decide_limits`] asks the store). It never
//! admits anything by memory: an admission is always the store's. It never refuses past the
//! store's wait: other nodes can only spend more meanwhile. What would change the store's
//! answer sooner is forgotten: a reset, on every node ([`Refusals::forget`], announced over
//! the store's pub/sub); an override or a rules change, by the limit itself — a refusal is
//! remembered with the limit it was decided by, and settles only a request decided by the
//! same one. A request of several limits is settled only when a remembered refusal of an
//! enforced (not shadow) limit refuses it alone, at a cost no smaller than the one refused:
//! the store would refuse it whole, and a refused request consumes nothing.
//!
//! When the wait runs out, one request asks the store again (the *probe*) and the others of
//! that key wait for its answer ([`Settled::Wait`], at most the probe's window, the store's
//! timeout): refused again, they are refused by the new refusal; admitted (a bucket refilled
//! one request), one of them probes again, and only if that one is admitted too do they all
//! ask the store themselves. So a flood costs the store one or two calls per node per wait,
//! not one per request in flight when the wait ends.
//!
//! Bounded: at most `max` keys (a full shard first drops what has expired, then remembers
//! nothing new until something does); 0 remembers nothing.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sluice_core::algorithm::Algorithm;
use sluice_core::{Decision, Limit, Micros};
use tokio::sync::watch;

use crate::store::Item;

/// Shards of the memory, each under its own lock.
const SHARDS: usize = 16;

/// A refusal as the store made it.
#[derive(Debug)]
struct Refusal {
    /// The limit and cost it was decided by.
    limit: Limit,
    cost: u64,
    /// When (the node's clock), and what the store answered.
    at: Micros,
    decision: Decision,
    /// The request asking the store again once the wait ran out, if one is.
    probe: Option<Probe>,
    /// Whether a probe was admitted since ([`Refusals::admitted`]).
    admitted: bool,
    /// What the store answered, in the same call, for the request's other limits (with the
    /// units a refused request did not take), by key: a request settled here answers
    /// them too, as the store would (Envoy builds its `x-ratelimit-*` headers from every
    /// descriptor's status).
    companions: Vec<(String, Decision)>,
}

/// A request gone to the store for a key whose wait ran out: the others wait for it until
/// `until`. Its answer replaces or removes the refusal, which drops `answered` and so
/// wakes them.
#[derive(Debug)]
struct Probe {
    until: Micros,
    answered: watch::Sender<()>,
}

/// What a remembered refusal says of a request ([`Refusals::settles`]).
#[derive(Debug)]
pub enum Settled {
    /// The store would refuse it: the index of the limit that refuses, the store's answer
    /// as of now, and what the store last answered for each of the other limits beside this
    /// refusal (by index; `None` where it did not).
    Refused(usize, Decision, Vec<Option<Decision>>),
    /// Another request is asking the store for one of its limits: wait for the answer (the
    /// receiver's sender is dropped), at most the probe's window, then look again.
    Wait(watch::Receiver<()>),
    /// Ask the store (as the probe of any limit whose wait ran out).
    Ask,
}

impl Refusal {
    /// The store's answer as of `now`: its waits counted down; `None` once it may pass.
    fn at(&self, now: Micros) -> Option<Decision> {
        let d = aged(&self.decision, now.saturating_sub(self.at));
        (d.retry_after > Micros::ZERO).then_some(d)
    }

    /// What the store answered for the request's limit `key` beside this refusal, as of
    /// `now`; `None` for a key it did not answer with it.
    fn companion(&self, key: &str, now: Micros) -> Option<Decision> {
        let (_, d) = self.companions.iter().find(|(k, _)| k == key)?;
        Some(aged(d, now.saturating_sub(self.at)))
    }
}

/// `d` as of `elapsed` later: its waits counted down.
fn aged(d: &Decision, elapsed: Micros) -> Decision {
    Decision {
        retry_after: d.retry_after.saturating_sub(elapsed),
        reset_after: d.reset_after.saturating_sub(elapsed),
        ..*d
    }
}

/// The refusals a node remembers, by limit key.
pub struct Refusals {
    shards: Box<[Mutex<HashMap<String, Refusal>>]>,
    hasher: RandomState,
    per_shard: usize,
    len: AtomicUsize,
    /// How long a probe is waited for: the longest a store call takes.
    probe_window: Micros,
}

impl Refusals {
    /// A memory of at most `max` refusals (0: none), whose probes are waited for at most
    /// `probe_window` (the store's timeout).
    pub fn new(max: usize, probe_window: Duration) -> Refusals {
        Refusals {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard: max.div_ceil(SHARDS),
            len: AtomicUsize::new(0),
            probe_window: Micros::from_duration(probe_window),
        }
    }

    /// How long a [`Settled::Wait`] lasts at most.
    pub fn probe_window(&self) -> Duration {
        Duration::from_micros(self.probe_window.as_u64())
    }

    /// Refusals remembered now (some may have run out and not been dropped yet).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the refusals remembered say of `items` at `now`. A refusal speaks for an
    /// enforced limit, the same limit, at a cost at least the one refused: within the
    /// store's wait it refuses ([`Settled::Refused`], the first such); past it, the first
    /// request becomes its probe ([`Settled::Ask`]) and the others [`Settled::Wait`] for it.
    pub fn settles(&self, items: &[Item<'_>], now: Micros) -> Settled {
        if self.per_shard == 0 || self.is_empty() {
            return Settled::Ask;
        }
        let mut probing: Vec<&str> = Vec::new();
        let mut settled = Settled::Ask;
        for (i, item) in items.iter().enumerate() {
            let part = &item.part;
            if part.shadow || part.cost == 0 {
                continue;
            }
            let mut shard = self.shard(item.key).lock().unwrap_or_else(|p| p.into_inner());
            let Some(r) = shard.get_mut(item.key) else { continue };
            if r.limit != *part.limit || part.cost < r.cost {
                continue;
            }
            if let Some(d) = r.at(now) {
                let others = items
                    .iter()
                    .enumerate()
                    .map(|(j, other)| (j != i).then(|| r.companion(other.key, now)).flatten())
                    .collect();
                settled = Settled::Refused(i, d, others);
                break;
            }
            match &r.probe {
                Some(p) if p.until > now => {
                    if matches!(settled, Settled::Ask) {
                        settled = Settled::Wait(p.answered.subscribe());
                    }
                }
                _ => {
                    r.probe = Some(Probe {
                        until: now.saturating_add(self.probe_window),
                        answered: watch::channel(()).0,
                    });
                    probing.push(item.key);
                }
            }
        }
        if !matches!(settled, Settled::Ask) {
            // This request does not go to the store after all: another may probe.
            for key in probing {
                let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = shard.get_mut(key) {
                    r.probe = None;
                }
            }
        }
        settled
    }

    /// What the store decided for `items` at `now` (as the request is answered: a refused
    /// request's other limits with what it did not take): an enforced refusal with a wait is
    /// remembered, with the other limits' answers; an admission forgets the key.
    pub fn remember(&self, items: &[Item<'_>], decisions: &[Decision], now: Micros) {
        if self.per_shard == 0 {
            return;
        }
        for (i, (item, d)) in items.iter().zip(decisions).enumerate() {
            let part = &item.part;
            if d.allowed {
                if !self.is_empty() {
                    self.admitted(item.key, now);
                }
                continue;
            }
            // A concurrency refusal stands only until some request ends, which no time says.
            let frees_by_time = part.limit.algorithm() != Algorithm::Concurrency;
            if part.shadow || part.cost == 0 || d.retry_after == Micros::ZERO || !frees_by_time {
                continue;
            }
            let refusal = Refusal {
                limit: *part.limit,
                cost: part.cost,
                at: now,
                decision: *d,
                probe: None,
                admitted: false,
                companions: items
                    .iter()
                    .zip(decisions)
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, (other, d))| (other.key.to_owned(), *d))
                    .collect(),
            };
            let mut shard = self.shard(item.key).lock().unwrap_or_else(|p| p.into_inner());
            if shard.len() >= self.per_shard && !shard.contains_key(item.key) {
                let before = shard.len();
                shard.retain(|_, r| r.at(now).is_some());
                self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
                if shard.len() >= self.per_shard {
                    continue;
                }
            }
            if shard.insert(item.key.to_owned(), refusal).is_none() {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Forgets the refusal of `key` (a reset).
    pub fn forget(&self, key: &str) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if shard.remove(key).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The store admitted a request of `key` at `now`. A refusal still within its wait is
    /// forgotten (the admission was of another cost or limit). One past its wait is kept
    /// once, its probe answered: the requests that waited for it send one probe more rather
    /// than all going to the store, since on a flooded quota the next is refused again; a
    /// second admission forgets it.
    fn admitted(&self, key: &str, now: Micros) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let Some(r) = shard.get_mut(key) else { return };
        if r.at(now).is_none() && !r.admitted {
            r.admitted = true;
            r.probe = None;
        } else if shard.remove(key).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The store could not answer the probe of `items`' keys: the next request probes.
    pub fn unanswered(&self, items: &[Item<'_>]) {
        if self.per_shard == 0 || self.is_empty() {
            return;
        }
        for item in items {
            let mut shard = self.shard(item.key).lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = shard.get_mut(item.key) {
                r.probe = None;
            }
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Refusal>> {
        let i = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        &self.shards[i]
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::algorithm::Part;
    use sluice_core::{Algorithm, State};

    use super::*;

    fn limit(n: u64) -> Limit {
        Limit::builder(Algorithm::FixedWindow, n, Micros::SECOND)
            .build()
            .expect("valid")
    }

    fn item<'a>(key: &'a str, limit: &'a Limit, cost: u64, shadow: bool) -> Item<'a> {
        Item {
            key,
            part: Part { limit, shadow, cost },
        }
    }

    /// The refusal that settles `items` at `now`, if one does (never a wait here).
    fn refused_by(memory: &Refusals, items: &[Item<'_>], now: Micros) -> Option<(usize, Decision)> {
        match memory.settles(items, now) {
            Settled::Refused(i, d, _) => Some((i, d)),
            Settled::Ask => None,
            Settled::Wait(_) => panic!("a wait where no probe was sent"),
        }
    }

    /// The store's decision for `cost` on a spent fixed window at `now`.
    fn refused(limit: &Limit, cost: u64, now: Micros) -> Decision {
        let mut state = limit.with_remaining(0, now);
        let d = limit.decide(&mut state, now, cost);
        assert!(!d.allowed && d.retry_after > Micros::ZERO, "{d:?}");
        d
    }

    #[test]
    fn a_refusal_settles_the_same_limit_until_its_wait_and_no_longer() {
        let (l, now) = (limit(10), Micros::from_ms(100));
        let memory = Refusals::new(100, Duration::from_millis(50));
        let d = refused(&l, 1, now);
        memory.remember(&[item("k", &l, 1, false)], &[d], now);
        let wait = d.retry_after;
        let later = now.saturating_add(Micros::from_ms(300));
        let (i, answer) = refused_by(&memory, &[item("k", &l, 1, false)], later).expect("settled");
        assert_eq!(i, 0);
        assert_eq!(answer.retry_after, wait.saturating_sub(Micros::from_ms(300)));
        assert!(!answer.allowed);
        // At the wait's end the store decides again.
        assert!(refused_by(&memory, &[item("k", &l, 1, false)], now.saturating_add(wait)).is_none());
        // Another limit (an override), a smaller cost, a shadow, another key: the store's.
        let other = limit(20);
        assert!(refused_by(&memory, &[item("k", &other, 1, false)], later).is_none());
        assert!(refused_by(&memory, &[item("k", &l, 1, true)], later).is_none());
        assert!(refused_by(&memory, &[item("j", &l, 1, false)], later).is_none());
        let d3 = refused(&l, 3, now);
        memory.remember(&[item("k3", &l, 3, false)], &[d3], now);
        assert!(refused_by(&memory, &[item("k3", &l, 2, false)], later).is_none());
        assert!(refused_by(&memory, &[item("k3", &l, 4, false)], later).is_some());
    }

    #[test]
    fn past_the_wait_one_request_probes_and_the_others_wait_for_its_answer() {
        let (l, now) = (limit(10), Micros::from_ms(100));
        let memory = Refusals::new(100, Duration::from_millis(50));
        let k = [item("k", &l, 1, false)];
        let d = refused(&l, 1, now);
        memory.remember(&k, &[d], now);
        let end = now.saturating_add(d.retry_after);
        assert!(
            matches!(memory.settles(&k, end), Settled::Ask),
            "the first past the wait probes"
        );
        let Settled::Wait(waiting) = memory.settles(&k, end) else {
            panic!("the others wait for the probe")
        };
        assert!(waiting.has_changed().is_ok(), "not answered yet");
        // Refused again: the waiters wake to the new refusal.
        let again = refused(&l, 1, end);
        memory.remember(&k, &[again], end);
        assert!(waiting.has_changed().is_err(), "woken");
        assert!(matches!(memory.settles(&k, end), Settled::Refused(0, _, _)));
        // Past that wait the store fails the probe: the next request probes.
        let end = end.saturating_add(again.retry_after);
        assert!(matches!(memory.settles(&k, end), Settled::Ask));
        assert!(matches!(memory.settles(&k, end), Settled::Wait(_)));
        memory.unanswered(&k);
        assert!(matches!(memory.settles(&k, end), Settled::Ask));
        // A probe not answered within its window is taken over.
        let late = end.saturating_add(Micros::from_ms(50));
        assert!(matches!(memory.settles(&k, late), Settled::Ask));
        // Admitted: the waiters wake and ask the store themselves.
        let Settled::Wait(waiting) = memory.settles(&k, late) else {
            panic!("the others wait for the probe")
        };
        let mut admitted = l.decide(&mut State::Fresh, late, 1);
        admitted.allowed = true;
        memory.remember(&k, &[admitted], late);
        assert!(waiting.has_changed().is_err(), "woken");
        // ... and one of them probes again: on a flood the next is refused.
        assert!(matches!(memory.settles(&k, late), Settled::Ask));
        let Settled::Wait(waiting) = memory.settles(&k, late) else {
            panic!("the others wait for the second probe")
        };
        // Admitted twice: forgotten, every request asks the store.
        memory.remember(&k, &[admitted], late);
        assert!(waiting.has_changed().is_err(), "woken");
        assert!(matches!(memory.settles(&k, late), Settled::Ask));
        assert!(matches!(memory.settles(&k, late), Settled::Ask));
        // A request settled by another limit does not hold the probe of its first one.
        let j = [item("j", &l, 1, false)];
        memory.remember(&j, &[refused(&l, 1, late)], late);
        memory.remember(&k, &[refused(&l, 1, now)], now);
        let both = [item("k", &l, 1, false), item("j", &l, 1, false)];
        assert!(matches!(memory.settles(&both, late), Settled::Refused(1, _, _)));
        assert!(matches!(memory.settles(&k, late), Settled::Ask), "k's probe was let go");
    }

    #[test]
    fn an_admission_or_a_reset_forgets_and_the_memory_is_bounded() {
        let (l, now) = (limit(10), Micros::from_ms(100));
        let memory = Refusals::new(SHARDS, Duration::from_millis(50)); // one a shard
        let d = refused(&l, 1, now);
        memory.remember(&[item("k", &l, 1, false)], &[d], now);
        let mut admitted = l.decide(&mut State::Fresh, now, 1);
        admitted.allowed = true;
        memory.remember(&[item("k", &l, 1, false)], &[admitted], now);
        assert!(refused_by(&memory, &[item("k", &l, 1, false)], now).is_none());
        memory.remember(&[item("k", &l, 1, false)], &[d], now);
        memory.forget("k");
        assert!(refused_by(&memory, &[item("k", &l, 1, false)], now).is_none());
        assert!(memory.is_empty());
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            memory.remember(&[item(key, &l, 1, false)], &[d], now);
        }
        assert!(memory.len() <= SHARDS, "{} remembered", memory.len());
        // Once they have run out, new refusals take their place.
        let later = now.saturating_add(d.retry_after);
        memory.remember(&[item("new", &l, 1, false)], &[refused(&l, 1, later)], later);
        assert!(refused_by(&memory, &[item("new", &l, 1, false)], later).is_some());
        let nothing = Refusals::new(0, Duration::from_millis(50));
        nothing.remember(&[item("k", &l, 1, false)], &[d], now);
        assert!(refused_by(&nothing, &[item("k", &l, 1, false)], now).is_none());
    }
}
