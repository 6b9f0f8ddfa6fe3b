//! Pacing one bucket on every quota its server counts: requests, and each quota counted in
//! other units (OpenAI's and Anthropic's tokens, an IETF policy's `qu`), each its own
//! [`Pacer`]. A request goes when every quota allows what it is expected to spend.

use std::collections::BTreeMap;

use super::{Pacer, PacerConfig};
use crate::headers::RateLimitInfo;

/// Quotas in other units followed at most: a server naming more is paced on the first ones.
const MAX_UNITS: usize = 8;

/// What a request is expected to spend of the quotas counted in other units than requests,
/// e.g. `Cost::new().with("tokens", 1_200)`. A unit not named costs 1, so that a spent quota
/// still holds requests until it resets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cost(Vec<(String, u64)>);

impl Cost {
    /// No expected cost: 1 of every unit.
    pub fn new() -> Cost {
        Cost::default()
    }

    /// This cost, expecting `amount` of `unit` (replacing what it said of `unit`).
    pub fn with(mut self, unit: &str, amount: u64) -> Cost {
        self.0.retain(|(u, _)| u != unit);
        self.0.push((unit.to_owned(), amount));
        self
    }

    /// The expected amount of `unit` (1 when not given).
    pub fn of(&self, unit: &str) -> u64 {
        self.0.iter().find(|(u, _)| u == unit).map_or(1, |&(_, n)| n)
    }
}

/// The pacer of one quota in other units, and its tickets of the requests in flight.
#[derive(Debug, Clone)]
struct UnitPacer {
    unit: String,
    pacer: Pacer,
    /// Request ticket → this pacer's ticket.
    tickets: BTreeMap<u64, u64>,
}

/// The pacing of one bucket: its requests quota and every quota in other units that its
/// responses report (see [`RateLimitInfo::quotas`]). Used as a [`Pacer`] is, with a
/// request's expected [`Cost`]; the answers correct the estimates, their `remaining` being
/// what the server counted.
#[derive(Debug, Clone, Default)]
pub struct BucketPacer {
    config: PacerConfig,
    requests: Pacer,
    units: Vec<UnitPacer>,
    /// The requests in flight and their expected costs.
    in_flight: BTreeMap<u64, Cost>,
}

impl BucketPacer {
    /// A pacer that knows nothing yet.
    pub fn new(config: PacerConfig) -> BucketPacer {
        BucketPacer {
            config,
            requests: Pacer::with_config(config),
            ..BucketPacer::default()
        }
    }

    /// Whether the requests quota is learned from refusals ([`Pacer::adapts`]): a refused
    /// request is then queued again rather than retried.
    pub fn adapts(&self) -> bool {
        self.requests.adapts()
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.requests.in_flight()
    }

    /// The units of the quotas followed besides requests.
    pub fn units(&self) -> impl Iterator<Item = &str> {
        self.units.iter().map(|u| u.unit.as_str())
    }

    /// The earliest time at which a request of `cost` may go, `now_ms` or later, or `None`
    /// to wait for an answer (never `None` when nothing is in flight).
    pub fn next_send_at(&self, now_ms: u64, cost: &Cost) -> Option<u64> {
        // Each quota's earliest time from the latest so far, until they agree (a budget
        // only grows while nothing is sent, so this settles at once in practice).
        let mut at = now_ms;
        for _ in 0..4 {
            let mut latest = self.requests.next_send_at(at)?;
            for u in &self.units {
                latest = latest.max(u.pacer.next_send_at_cost(at, cost.of(&u.unit))?);
            }
            if latest == at {
                break;
            }
            at = latest;
        }
        Some(at)
    }

    /// Records that a request of `cost` was sent at `now_ms`; returns its ticket.
    pub fn on_send(&mut self, now_ms: u64, cost: &Cost) -> u64 {
        let ticket = self.requests.on_send(now_ms);
        for u in &mut self.units {
            let own = u.pacer.on_send_cost(now_ms, cost.of(&u.unit));
            u.tickets.insert(ticket, own);
        }
        self.in_flight.insert(ticket, cost.clone());
        ticket
    }

    /// Records that the request with `ticket` got no response.
    pub fn on_failure(&mut self, ticket: u64) {
        self.requests.on_failure(ticket);
        for u in &mut self.units {
            if let Some(own) = u.tickets.remove(&ticket) {
                u.pacer.on_failure(own);
            }
        }
        self.in_flight.remove(&ticket);
    }

    /// Records a response's quotas, received at `now_ms`, to the request with `ticket`.
    pub fn observe(&mut self, info: &RateLimitInfo, now_ms: u64, ticket: u64) {
        self.requests.observe(info, now_ms, ticket);
        self.in_flight.remove(&ticket);
        for quota in &info.quotas {
            let Some(i) = self.unit_index(&quota.unit, now_ms) else {
                continue;
            };
            let u = &mut self.units[i];
            // A pacer made for this answer never saw the request: a ticket it has not issued
            // is taken as the latest.
            let own = u.tickets.remove(&ticket).unwrap_or(u64::MAX);
            let reported = RateLimitInfo {
                retry_after_ms: info.retry_after_ms,
                ..quota.to_info()
            };
            u.pacer.observe(&reported, now_ms, own);
        }
        // Quotas this answer does not report: the request is answered, with no news of them.
        let silent = RateLimitInfo {
            retry_after_ms: info.retry_after_ms,
            ..RateLimitInfo::default()
        };
        for u in &mut self.units {
            if let Some(own) = u.tickets.remove(&ticket) {
                u.pacer.observe(&silent, now_ms, own);
            }
        }
    }

    /// The pacer of `unit`, made now if new (it counts the requests still in flight at
    /// their expected costs); `None` past [`MAX_UNITS`].
    fn unit_index(&mut self, unit: &str, now_ms: u64) -> Option<usize> {
        if let Some(i) = self.units.iter().position(|u| u.unit == unit) {
            return Some(i);
        }
        if self.units.len() >= MAX_UNITS {
            return None;
        }
        // It bounds the budget but does not spread: the requests quota spreads requests.
        let config = PacerConfig {
            reserve: u64::MAX,
            ..self.config
        };
        let mut made = UnitPacer {
            unit: unit.to_owned(),
            pacer: Pacer::with_config(config),
            tickets: BTreeMap::new(),
        };
        for (&ticket, cost) in &self.in_flight {
            let own = made.pacer.on_send_cost(now_ms, cost.of(unit));
            made.tickets.insert(ticket, own);
        }
        self.units.push(made);
        Some(self.units.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::UnitQuota;

    fn answer(requests_left: u64, tokens_left: u64, tokens_reset_ms: u64) -> RateLimitInfo {
        RateLimitInfo {
            limit: Some(100),
            remaining: Some(requests_left),
            reset_after_ms: Some(60_000),
            quotas: vec![UnitQuota {
                unit: "tokens".into(),
                limit: Some(10_000),
                remaining: Some(tokens_left),
                reset_after_ms: Some(tokens_reset_ms),
                ..UnitQuota::default()
            }],
            ..RateLimitInfo::default()
        }
    }

    #[test]
    fn a_request_waits_for_the_tokens_it_needs_though_requests_are_left() {
        let mut p = BucketPacer::new(PacerConfig::default());
        let big = Cost::new().with("tokens", 3_000);
        let probe = p.on_send(0, &big);
        p.observe(&answer(99, 7_000, 6_000), 10, probe);
        assert_eq!(p.units().collect::<Vec<_>>(), ["tokens"]);
        // 7,000 tokens: two requests of 3,000 go at once, the third waits for the reset.
        for _ in 0..2 {
            assert_eq!(p.next_send_at(10, &big), Some(10));
            p.on_send(10, &big);
        }
        assert_eq!(p.next_send_at(10, &big), None, "only an answer or the reset tells more");
        // A small request still fits in the 1,000 left.
        assert_eq!(p.next_send_at(10, &Cost::new().with("tokens", 900)), Some(10));
    }

    #[test]
    fn the_answer_corrects_the_estimate() {
        let mut p = BucketPacer::new(PacerConfig::default());
        let guess = Cost::new().with("tokens", 5_000);
        let probe = p.on_send(0, &guess);
        p.observe(&answer(99, 9_000, 6_000), 10, probe);
        let sent = p.on_send(10, &guess);
        assert_eq!(p.next_send_at(10, &guess), None, "4,000 left by the estimate");
        // The request spent 200 tokens, not 5,000: the answer says 8,800 are left.
        p.observe(&answer(98, 8_800, 5_990), 20, sent);
        assert_eq!(p.next_send_at(20, &guess), Some(20));
    }

    #[test]
    fn a_unit_learned_late_counts_the_requests_in_flight() {
        let mut p = BucketPacer::new(PacerConfig::default());
        let cost = Cost::new().with("tokens", 400);
        let probe = p.on_send(0, &cost);
        p.observe(&RateLimitInfo::default(), 5, probe); // no quota headers yet
        let a = p.on_send(5, &cost);
        let _b = p.on_send(5, &cost);
        // a's answer is the first to report tokens: b, in flight, may take 400 more.
        p.observe(&answer(97, 800, 6_000), 10, a);
        assert_eq!(p.next_send_at(10, &cost), Some(10));
        p.on_send(10, &cost);
        assert_eq!(p.next_send_at(10, &cost), None, "800 − 400 (b) − 400 (sent) = 0");
    }

    #[test]
    fn a_unit_without_a_cost_costs_one_and_a_spent_one_holds_until_its_reset() {
        let mut p = BucketPacer::new(PacerConfig::default());
        let probe = p.on_send(0, &Cost::new());
        p.observe(&answer(99, 0, 4_000), 10, probe);
        assert_eq!(p.next_send_at(10, &Cost::new()), Some(4_010));
    }
}
