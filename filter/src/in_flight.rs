//! The concurrency slots this worker's requests hold (`POST /v1/slots`).
//!
//! A check that took slots answers them; the stream records them here and marks them ended
//! when it ends, whatever way it ends (its log callback comes for a response sent, a client
//! gone, an upstream reset, a local reply). The root, on its tick, gives back the slots of
//! the requests that ended and renews the slots of those still running once a third of a
//! slot's window has passed, so a slot outlives its request only if this proxy dies. Not
//! the stream itself: a stream's call ends with the stream (see [`crate::debits`]). The
//! releases of a tick go in one call (a batch), so a request costs the proxy one call.
//!
//! One call at a time per request: a renewal's answer names the slots' new times, which the
//! release that follows must use; a request that ends while its renewal is out is given
//! back on the tick after the answer.

use std::collections::BTreeMap;

#[cfg(test)]
use sluice_core::wire::MAX_BATCH;
use sluice_core::wire::{CheckRequest, Slot, SlotsCall, SlotsRequest, SlotsResponse};

use crate::config::Concurrency;

/// Most requests holding slots at once in one worker; past it a request's slots are not
/// recorded (and counted lost): they expire at the service.
const MAX_HELD: usize = 10_000;

/// One request's slots.
struct Held {
    request: CheckRequest,
    slots: Vec<Slot>,
    /// When they were taken or last renewed (ms).
    renewed_ms: u64,
    ended: bool,
    /// A renewal call is out.
    renewing: bool,
}

/// A call the root sends now: its body, and what it carries: one request's renewal (its
/// hold id), or the releases of `requests` requests that ended.
pub struct Out {
    pub body: Vec<u8>,
    pub renew: Option<u64>,
    pub requests: u64,
}

/// The slots every request of this worker holds, by the stream's hold id.
pub struct InFlight {
    pub config: Concurrency,
    held: BTreeMap<u64, Held>,
    next: u64,
    /// Renewal calls out: call token → hold id.
    renewals: BTreeMap<u32, u64>,
    /// Requests whose slots a renewal found expired at the service, since last taken.
    pub expired: u64,
}

impl InFlight {
    pub fn new(config: Concurrency) -> InFlight {
        InFlight {
            config,
            held: BTreeMap::new(),
            next: 0,
            renewals: BTreeMap::new(),
            expired: 0,
        }
    }

    /// Records a request's slots, taken at `now_ms`; its hold id, or `None` when full.
    pub fn hold(&mut self, request: CheckRequest, slots: Vec<Slot>, now_ms: u64) -> Option<u64> {
        if self.held.len() >= MAX_HELD {
            return None;
        }
        self.next += 1;
        let held = Held {
            request,
            slots,
            renewed_ms: now_ms,
            ended: false,
            renewing: false,
        };
        self.held.insert(self.next, held);
        Some(self.next)
    }

    /// The request `id` ended: its slots go back on the next tick.
    pub fn end(&mut self, id: u64) {
        if let Some(held) = self.held.get_mut(&id) {
            held.ended = true;
        }
    }

    /// The calls to send now: the releases of every request that ended, batched (forgotten
    /// here once sent), and a renewal of every running request whose slots are a third of
    /// their window old, one call each (its answer names the slots' new times).
    pub fn due(&mut self, now_ms: u64) -> Vec<Out> {
        let mut out = Vec::new();
        let mut releases = Vec::new();
        self.held.retain(|&id, held| {
            if held.renewing {
                return true;
            }
            if held.ended && held.slots.is_empty() {
                self.expired += 1;
                return false; // every slot expired at the service: nothing to give back
            }
            if held.ended {
                releases.push(SlotsRequest {
                    request: std::mem::take(&mut held.request),
                    slots: std::mem::take(&mut held.slots),
                    renew: false,
                });
                return false;
            }
            let window_ms = held.slots.iter().map(|s| s.window_ms).min().unwrap_or(0);
            if now_ms.saturating_sub(held.renewed_ms) * 3 >= window_ms {
                let call = SlotsRequest {
                    request: held.request.clone(),
                    slots: held.slots.clone(),
                    renew: true,
                };
                out.push(Out {
                    body: call.to_json().into_bytes(),
                    renew: Some(id),
                    requests: 1,
                });
            }
            true
        });
        for (body, requests) in SlotsCall::batches(&releases) {
            out.push(Out {
                body: body.into_bytes(),
                renew: None,
                requests: requests as u64,
            });
        }
        out
    }

    /// A renewal of request `id` went out as call `token` (one that did not is tried on the
    /// next tick).
    pub fn renewing(&mut self, token: u32, id: u64) {
        if let Some(held) = self.held.get_mut(&id) {
            held.renewing = true;
            self.renewals.insert(token, id);
        }
    }

    /// Whether call `token` is a renewal that has not been answered.
    pub fn is_renewal(&self, token: u32) -> bool {
        self.renewals.contains_key(&token)
    }

    /// The answer to call `token`, if it was a renewal (`answer` `None`: it failed, and the
    /// slots keep their times). Whether the token was one.
    pub fn renewed(&mut self, token: u32, answer: Option<SlotsResponse>, now_ms: u64) -> bool {
        let Some(id) = self.renewals.remove(&token) else {
            return false;
        };
        let Some(held) = self.held.get_mut(&id) else {
            return true;
        };
        held.renewing = false;
        if let Some(answer) = answer {
            // A slot the service no longer has expired: there is nothing to give back.
            held.slots = answer.slots;
            held.renewed_ms = now_ms;
            if held.slots.is_empty() && !held.ended {
                held.ended = true;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CheckRequest {
        CheckRequest {
            method: "GET".into(),
            path: "/".into(),
            cost: 1,
            ..CheckRequest::default()
        }
    }

    fn slot(at: u64) -> Slot {
        Slot {
            rule: "gpu".into(),
            at,
            window_ms: 3_000,
        }
    }

    /// The releases a batch call carries.
    fn released(out: &Out) -> Vec<SlotsRequest> {
        match SlotsCall::from_json(&out.body).unwrap() {
            SlotsCall::Batch(batch) => batch,
            SlotsCall::One(one) => panic!("a release not batched: {one:?}"),
        }
    }

    #[test]
    fn ended_requests_are_given_back_once_in_one_call_and_a_running_one_renewed_by_a_third_of_its_window() {
        let mut f = InFlight::new(Concurrency::default());
        let a = f.hold(request(), vec![slot(1)], 0).unwrap();
        let b = f.hold(request(), vec![slot(2)], 0).unwrap();
        let c = f.hold(request(), vec![slot(3)], 0).unwrap();
        assert!(f.due(999).is_empty(), "nothing ended, nothing a third old");
        f.end(a);
        f.end(c);
        let out = f.due(1_000);
        assert_eq!(out.len(), 2, "one batch of releases, one renewal");
        let release = out.iter().find(|o| o.renew.is_none()).unwrap();
        assert_eq!(release.requests, 2);
        let sent = released(release);
        assert_eq!(
            sent.iter().map(|r| (r.renew, r.slots.clone())).collect::<Vec<_>>(),
            vec![(false, vec![slot(1)]), (false, vec![slot(3)])]
        );
        let renew = out.iter().find(|o| o.renew == Some(b)).unwrap();
        assert!(SlotsRequest::from_json(&renew.body).unwrap().renew);
        assert!(f.due(1_001).iter().all(|o| o.renew.is_some()), "given back once");
        // The renewal is out: b waits for its answer, even once ended.
        f.renewing(7, b);
        f.end(b);
        assert!(f.due(5_000).is_empty());
        let answer = SlotsResponse {
            slots: vec![slot(4_000)],
            found: 1,
        };
        assert!(f.renewed(7, Some(answer), 5_000));
        let out = f.due(5_001);
        assert_eq!(
            released(&out[0])[0].slots,
            vec![slot(4_000)],
            "released under its new time"
        );
        assert!(!f.renewed(7, None, 5_002), "not a renewal's token any more");
    }

    #[test]
    fn more_releases_than_a_batch_holds_go_in_several() {
        let mut f = InFlight::new(Concurrency::default());
        for i in 0..MAX_BATCH as u64 + 1 {
            let id = f.hold(request(), vec![slot(i)], 0).unwrap();
            f.end(id);
        }
        let out = f.due(1);
        let sizes: Vec<u64> = out.iter().map(|o| o.requests).collect();
        assert_eq!(sizes, vec![MAX_BATCH as u64, 1]);
        assert_eq!(released(&out[0]).len(), MAX_BATCH);
    }

    #[test]
    fn a_request_whose_slots_expired_at_the_service_is_counted_and_not_given_back() {
        let mut f = InFlight::new(Concurrency::default());
        let a = f.hold(request(), vec![slot(1)], 0).unwrap();
        assert!(f.due(1_000).iter().all(|o| o.renew == Some(a)));
        f.renewing(3, a);
        let none = SlotsResponse {
            slots: Vec::new(),
            found: 0,
        };
        assert!(f.renewed(3, Some(none), 1_100));
        assert!(f.due(1_200).is_empty(), "nothing to give back");
        assert_eq!(f.expired, 1);
    }
}
