//! Client-side pacing: when may the next request go so that the client stays under the
//! quota the server advertises.
//!
//! Strategy: while the last response said requests `remaining` and fewer than that are in
//! flight, send at once (the server granted them). When that budget is spent, send at the
//! advertised long-run rate, one request every `window / limit` plus a 5% margin (at least
//! 1 ms) for network jitter; without a rate, spread over the time to reset. A `Retry-After`
//! holds everything until it passes. A new window (reset passed) restores the budget.
//! The SDKs' queues call [`Pacer::next_send_at`] before each send and [`Pacer::on_send`]
//! and [`Pacer::observe`] around it.

use crate::headers::RateLimitInfo;

/// The pacing state of one bucket (host + policy, or a caller's key).
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    last: Option<Observed>,
    in_flight: u64,
    last_send_ms: Option<u64>,
    retry_at_ms: u64,
}

#[derive(Debug, Clone)]
struct Observed {
    remaining: Option<u64>,
    reset_at_ms: Option<u64>,
    interval_ms: Option<u64>,
}

impl Pacer {
    /// A pacer that knows nothing yet: the first request goes at once.
    pub fn new() -> Pacer {
        Pacer::default()
    }

    /// Records that a request was sent at `now_ms`.
    pub fn on_send(&mut self, now_ms: u64) {
        self.in_flight += 1;
        self.last_send_ms = Some(now_ms);
    }

    /// Records a response's quota, received at `now_ms`; it completes one sent request.
    pub fn observe(&mut self, info: &RateLimitInfo, now_ms: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(retry) = info.retry_after_ms {
            self.retry_at_ms = self.retry_at_ms.max(now_ms.saturating_add(retry));
        }
        if info.remaining.is_none() && info.reset_after_ms.is_none() && info.limit.is_none() {
            return;
        }
        let interval_ms = match (info.limit, info.window_ms, info.remaining, info.reset_after_ms) {
            (Some(limit), Some(window), _, _) if limit > 0 => Some(window.div_ceil(limit)),
            (_, _, Some(remaining), Some(reset)) => Some(reset / remaining.saturating_add(1)),
            _ => None,
        }
        .map(|i| i + (i / 20).max(1));
        self.last = Some(Observed {
            remaining: info.remaining,
            reset_at_ms: info.reset_after_ms.map(|r| now_ms.saturating_add(r)),
            interval_ms,
        });
    }

    /// Records a request that ended without a response (an error): it is no longer in flight.
    pub fn on_failure(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The earliest time (unix ms) at which the next request may be sent.
    pub fn next_send_at(&self, now_ms: u64) -> u64 {
        let floor = now_ms.max(self.retry_at_ms);
        let Some(obs) = &self.last else { return floor };
        if obs.reset_at_ms.is_some_and(|reset| now_ms >= reset) {
            return floor; // a new window: the budget is whole again
        }
        if obs.remaining.is_none_or(|r| r > self.in_flight) {
            return floor;
        }
        match (obs.interval_ms, self.last_send_ms, obs.reset_at_ms) {
            (Some(interval), Some(last), _) => floor.max(last.saturating_add(interval)),
            (None, _, Some(reset)) => floor.max(reset),
            _ => floor,
        }
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, Limit, State};

    fn info(limit: u64, remaining: u64, reset_ms: u64, window_ms: u64) -> RateLimitInfo {
        RateLimitInfo {
            limit: Some(limit),
            remaining: Some(remaining),
            reset_after_ms: Some(reset_ms),
            window_ms: Some(window_ms),
            ..Default::default()
        }
    }

    #[test]
    fn unknown_quota_sends_at_once_and_retry_after_holds() {
        let mut p = Pacer::new();
        assert_eq!(p.next_send_at(1_000), 1_000);
        p.on_send(1_000);
        p.observe(
            &RateLimitInfo {
                retry_after_ms: Some(2_000),
                ..Default::default()
            },
            1_010,
        );
        assert_eq!(p.next_send_at(1_020), 3_010);
    }

    #[test]
    fn budget_then_rate() {
        let mut p = Pacer::new();
        p.on_send(0);
        p.observe(&info(50, 2, 1_000, 1_000), 1);
        assert_eq!(p.next_send_at(1), 1);
        p.on_send(1);
        p.on_send(1);
        // Two in flight against two remaining: wait one interval (20ms + 1ms margin).
        assert_eq!(p.next_send_at(2), 22);
    }

    /// A simulated token-bucket server (50/s, burst 10) paced by the Pacer, one request at a
    /// time with 1ms latency: no request is ever refused, and most of the rate is used.
    #[test]
    fn paced_client_never_exceeds_a_token_bucket() {
        let limit = Limit::new(Algorithm::TokenBucket, 50, 1_000_000, 10, false, 0).unwrap();
        let mut state = State::Fresh;
        let mut pacer = Pacer::new();
        let mut now = 0u64;
        for _ in 0..200 {
            now = pacer.next_send_at(now);
            pacer.on_send(now);
            let d = limit.decide(&mut state, (now + 1) * 1_000, 1);
            assert!(d.allowed, "server refused a paced request at {now}ms");
            now += 2;
            pacer.observe(&info(50, d.remaining, d.reset_after.div_ceil(1_000), 1_000), now);
        }
        // 200 requests: 10 from the burst, 190 at 50/s = 3.8s; pacing margin allows ~5% more.
        assert!(now <= 4_100, "took {now}ms");
    }
}
