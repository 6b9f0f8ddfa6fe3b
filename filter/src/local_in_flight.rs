//! The filter's own limit on each client's requests in flight (`concurrency.local`), with no
//! store: decided before the check, so a client over it costs the service nothing.
//!
//! It is sluice-core's concurrency limit (a slot is a sliding-log entry whose time is when
//! its request took it or last renewed it; see `sluice_core::algorithm::concurrency`), kept
//! by the worker ([`StateMap`]) or by every worker of the process together (`share:
//! process`, [`table::InFlightTable`] in the host's shared data). A request takes a slot with
//! its headers and gives it back in its log callback, which every kind of stream end
//! reaches, at once: a shared-data write, not a call. The root's tick renews the slots of
//! requests still running once a third of the expiry has passed, so only a worker that died
//! holding slots (an Nginx worker process; Envoy's workers are threads, and its shared data
//! dies with them) leaves them to expire.

mod table;

use std::collections::BTreeMap;

use sluice_core::{Algorithm, Decision, Limit, Micros, State, StateMap};

use crate::config::LocalConcurrency;
use crate::proxy::SharedData;
use table::InFlightTable;

/// Most requests holding a slot at once in one worker; past it a request's slot is not
/// recorded (counted lost): it expires.
const MAX_HELD: usize = 100_000;

/// Where the clients' slots are kept.
enum Kept {
    /// This worker's own count, by client.
    Worker(StateMap),
    /// Every worker's, in shared data.
    Process(InFlightTable),
}

/// The limit, the clients' slots, and the slots this worker's requests hold.
pub struct LocalInFlight {
    /// The identity a client is counted by.
    pub by: String,
    limit: Limit,
    kept: Kept,
    /// This worker's requests holding a slot, by hold id: the client and the slot's time.
    held: BTreeMap<u64, (String, Micros)>,
    next: u64,
    /// No slot is due for renewal before this (the tick looks at the holds only then).
    next_due: Micros,
}

/// A request's slot taken or refused.
pub struct Taken {
    pub decision: Decision,
    /// The hold id to end the request with; `None` when refused, or admitted without a
    /// record (the worker's table of holds full).
    pub hold: Option<u64>,
}

impl LocalInFlight {
    /// The limit `config` describes, kept in shared data under `shared` (key prefix, keys)
    /// or by the worker; `None` when no concurrency limit has that size.
    pub fn new(config: &LocalConcurrency, shared: Option<(String, u64)>) -> Option<LocalInFlight> {
        let limit = Limit::builder(Algorithm::Concurrency, config.limit, Micros::from_ms(config.expiry_ms))
            .build()
            .ok()?;
        let kept = match shared {
            Some((prefix, keys)) => Kept::Process(InFlightTable::new(prefix, limit, keys)),
            None => Kept::Worker(StateMap::new(config.max_keys)),
        };
        Some(LocalInFlight {
            by: config.by.clone(),
            limit,
            kept,
            held: BTreeMap::new(),
            next: 0,
            next_due: Micros::MAX,
        })
    }

    /// Makes the process's table before traffic; how many keys the host would not make.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        match &self.kept {
            Kept::Worker(_) => 0,
            Kept::Process(table) => table.create(p),
        }
    }

    /// Takes a slot for `client` at `now`.
    pub fn take(&mut self, p: &mut impl SharedData, client: &str, now: Micros) -> Taken {
        let decision = match &mut self.kept {
            Kept::Worker(states) => states.decide(client, &self.limit, 1, now),
            Kept::Process(table) => table.take(p, client, now),
        };
        let hold = (decision.allowed && self.held.len() < MAX_HELD).then(|| {
            self.next += 1;
            self.held.insert(self.next, (client.to_owned(), now));
            self.next_due = self.next_due.min(now.saturating_add(self.third()));
            self.next
        });
        Taken { decision, hold }
    }

    /// The request holding `hold` ended: its slot goes back now. Whether one was freed (not
    /// when it had expired).
    pub fn end(&mut self, p: &mut impl SharedData, hold: u64, now: Micros) -> bool {
        let Some((client, at)) = self.held.remove(&hold) else {
            return false;
        };
        self.change(p, &client, now, |limit, state| limit.release(state, at, 1)) > 0
    }

    /// Renews the slot of every running request whose slot is a third of the expiry old;
    /// how many had expired (their slot lost: the worker was stalled past the expiry).
    pub fn renew_due(&mut self, p: &mut impl SharedData, now: Micros) -> u64 {
        if now < self.next_due {
            return 0;
        }
        let third = self.third();
        let due: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, (_, at))| now.saturating_sub(*at) >= third)
            .map(|(&hold, _)| hold)
            .collect();
        let mut lost = 0;
        for hold in due {
            let Some((client, at)) = self.held.get(&hold).cloned() else {
                continue;
            };
            let moved = self.change(p, &client, now, |limit, state| limit.renew(state, at, now, 1));
            if moved > 0 {
                self.held.insert(hold, (client, now));
            } else {
                lost += 1;
                self.held.remove(&hold);
            }
        }
        let oldest = self.held.values().map(|&(_, at)| at).min();
        self.next_due = oldest.map_or(Micros::MAX, |at| at.saturating_add(third));
        lost
    }

    /// A third of the expiry: a running request's slot is renewed once this old.
    fn third(&self) -> Micros {
        Micros::new(self.limit.window().as_u64() / 3)
    }

    /// Applies `change` to `client`'s slots at `now`; what it answered (the slots it touched).
    fn change(
        &mut self,
        p: &mut impl SharedData,
        client: &str,
        now: Micros,
        change: impl Fn(&Limit, &mut State) -> u64,
    ) -> u64 {
        let limit = self.limit;
        match &mut self.kept {
            Kept::Worker(states) => {
                let mut state = states.state(client, now);
                let touched = change(&limit, &mut state);
                if touched > 0 {
                    states.keep(client, &limit, state, now);
                }
                touched
            }
            Kept::Process(table) => table.change(p, client, now, |state| change(&limit, state)),
        }
    }

    /// Slots of dead holders this worker dropped since last asked (the process's table).
    pub fn take_expired(&mut self) -> u64 {
        match &mut self.kept {
            Kept::Worker(_) => 0,
            Kept::Process(table) => std::mem::take(&mut table.expired),
        }
    }
}

#[cfg(test)]
mod tests;
