//! The filter's circuit breaker over the check service: closed → open after N consecutive
//! failures → half-open (one probe) after the cooldown → closed on the probe's success.

use sluice_core::Micros;

/// Breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls go out.
    Closed,
    /// Calls are skipped until the given time.
    Open {
        /// When a probe may go.
        until: Micros,
    },
    /// One probe is out.
    HalfOpen,
}

/// A breaker for one VM.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cooldown: Micros,
    failures: u32,
    state: State,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cooldown_ms`.
    pub fn new(threshold: u32, cooldown_ms: u64) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown: cooldown_ms * 1_000,
            failures: 0,
            state: State::Closed,
        }
    }

    /// Whether a call may go out at `now`; after the cooldown exactly one probe does.
    pub fn allow(&mut self, now: Micros) -> bool {
        match self.state {
            State::Closed => true,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen;
                true
            }
            _ => false,
        }
    }

    /// A call succeeded.
    pub fn success(&mut self) {
        self.failures = 0;
        self.state = State::Closed;
    }

    /// A call failed at `now`.
    pub fn failure(&mut self, now: Micros) {
        self.failures = self.failures.saturating_add(1);
        if self.state == State::HalfOpen || self.failures >= self.threshold {
            self.state = State::Open {
                until: now + self.cooldown,
            };
        }
    }

    /// The probe's stream ended before its answer, or the answer says nothing of the
    /// service's health: the next request probes instead (a half-open breaker would
    /// otherwise wait for an answer that never comes, skipping calls forever).
    pub fn release_probe(&mut self, now: Micros) {
        if self.state == State::HalfOpen {
            self.state = State::Open { until: now };
        }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle() {
        let mut b = Breaker::new(2, 1_000);
        b.failure(0);
        assert!(b.allow(0));
        b.failure(0);
        assert_eq!(b.state(), State::Open { until: 1_000_000 });
        assert!(!b.allow(999_999));
        assert!(b.allow(1_000_000));
        assert!(!b.allow(1_000_000), "one probe only");
        b.failure(1_000_001);
        assert!(!b.allow(1_500_000));
        assert!(b.allow(2_000_001));
        b.success();
        assert!(b.allow(2_000_001) && b.allow(2_000_001));
    }

    #[test]
    fn a_released_probe_lets_the_next_request_probe() {
        let mut b = Breaker::new(1, 1_000);
        b.failure(0);
        assert!(b.allow(1_000_000), "the probe");
        assert!(!b.allow(1_000_001));
        b.release_probe(1_000_002);
        assert!(b.allow(1_000_002), "a new probe");
        assert_eq!(b.state(), State::HalfOpen);
        b.release_probe(1_000_003);
        b.success();
        b.release_probe(1_000_004);
        assert_eq!(
            b.state(),
            State::Closed,
            "only a half-open breaker has a probe to release"
        );
    }
}
