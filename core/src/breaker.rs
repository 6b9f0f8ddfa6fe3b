//! A circuit breaker, time passed in: closed → open after `threshold` consecutive failures
//! → half-open (exactly one probe) once the cooldown has passed → closed on a success, or
//! open again for another cooldown when the probe fails.
//!
//! The filter keeps one per VM around its check calls; the service keeps one per node around
//! its store calls (behind a lock, with its own clock).

use crate::time::Micros;

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go out.
    Closed,
    /// Calls are skipped until the given time.
    Open {
        /// When a probe may go.
        until: Micros,
    },
    /// One probe is out; other calls are skipped until its outcome.
    HalfOpen,
}

impl BreakerState {
    /// Lower-case name, as the service's `/readyz` reports it.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// Whether calls go out unguarded.
    pub fn is_closed(self) -> bool {
        self == BreakerState::Closed
    }
}

/// One breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cooldown: Micros,
    failures: u32,
    state: BreakerState,
}

impl Breaker {
    /// Opens after `threshold` (at least 1) consecutive failures, for `cooldown`.
    pub fn new(threshold: u32, cooldown: Micros) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            failures: 0,
            state: BreakerState::Closed,
        }
    }

    /// This breaker as it stood elsewhere: `failures` consecutive failures and `state` (a
    /// breaker kept outside the process's memory — the filter's, in a proxy's shared data —
    /// is read back with it, decided on, and written again).
    pub fn with_state(self, failures: u32, state: BreakerState) -> Breaker {
        Breaker {
            failures,
            state,
            ..self
        }
    }

    /// Whether a call may go out at `now`; after the cooldown exactly one probe does.
    pub fn allow(&mut self, now: Micros) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen;
                true
            }
            _ => false,
        }
    }

    /// A call succeeded: the breaker closes.
    pub fn success(&mut self) {
        self.failures = 0;
        self.state = BreakerState::Closed;
    }

    /// A call failed at `now`: the breaker opens at the threshold, or again after a probe.
    pub fn failure(&mut self, now: Micros) {
        self.failures = self.failures.saturating_add(1);
        if self.state == BreakerState::HalfOpen || self.failures >= self.threshold {
            self.state = BreakerState::Open {
                until: now.saturating_add(self.cooldown),
            };
        }
    }

    /// The probe's call ended without an outcome, or with one that says nothing of the
    /// callee's health: the next call probes instead (a half-open breaker would otherwise
    /// wait for an answer that never comes, skipping calls forever).
    pub fn release_probe(&mut self, now: Micros) {
        if self.state == BreakerState::HalfOpen {
            self.state = BreakerState::Open { until: now };
        }
    }

    /// Consecutive failures counted since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The current state (an open breaker past its cooldown stays `Open` until [`Breaker::allow`]).
    pub fn state(&self) -> BreakerState {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle() {
        let mut b = Breaker::new(2, Micros::SECOND);
        b.failure(Micros::ZERO);
        assert!(b.allow(Micros::ZERO));
        b.failure(Micros::ZERO);
        assert_eq!(b.state(), BreakerState::Open { until: Micros::SECOND });
        assert!(!b.allow(Micros::new(999_999)));
        assert!(b.allow(Micros::SECOND));
        assert!(!b.allow(Micros::SECOND), "one probe only");
        b.failure(Micros::new(1_000_001));
        assert!(!b.allow(Micros::new(1_500_000)));
        assert!(b.allow(Micros::new(2_000_001)));
        b.success();
        assert!(b.allow(Micros::new(2_000_001)) && b.allow(Micros::new(2_000_001)));
    }

    #[test]
    fn opens_at_threshold_probes_after_cooldown_and_closes_on_success() {
        let mut b = Breaker::new(3, Micros::ZERO);
        b.failure(Micros::ZERO);
        b.failure(Micros::ZERO);
        assert!(b.state().is_closed());
        b.failure(Micros::ZERO);
        assert_eq!(b.state().name(), "open");
        assert!(b.allow(Micros::ZERO), "cooldown of zero: the probe goes");
        assert!(!b.allow(Micros::ZERO), "only one probe at a time");
        assert_eq!(b.state().name(), "half_open");
        b.failure(Micros::ZERO);
        assert_eq!(b.state().name(), "open");
        assert!(b.allow(Micros::ZERO));
        b.success();
        assert_eq!(b.state().name(), "closed");
        assert_eq!(b.failures(), 0);
        assert!(b.allow(Micros::ZERO) && b.allow(Micros::ZERO));
    }

    #[test]
    fn a_released_probe_lets_the_next_call_probe() {
        let mut b = Breaker::new(1, Micros::SECOND);
        b.failure(Micros::ZERO);
        assert!(b.allow(Micros::SECOND), "the probe");
        assert!(!b.allow(Micros::new(1_000_001)));
        b.release_probe(Micros::new(1_000_002));
        assert!(b.allow(Micros::new(1_000_002)), "a new probe");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.release_probe(Micros::new(1_000_003));
        b.success();
        b.release_probe(Micros::new(1_000_004));
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "only a half-open breaker has a probe to release"
        );
    }

    #[test]
    fn a_breaker_read_back_decides_as_the_one_it_was() {
        let mut kept = Breaker::new(2, Micros::SECOND);
        kept.failure(Micros::ZERO);
        kept.failure(Micros::ZERO);
        let mut read = Breaker::new(2, Micros::SECOND).with_state(kept.failures(), kept.state());
        assert!(!read.allow(Micros::new(999_999)));
        assert!(read.allow(Micros::SECOND), "the probe, after the same cooldown");
        assert_eq!(read.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn a_cooldown_past_the_end_of_time_saturates() {
        let mut b = Breaker::new(1, Micros::MAX);
        b.failure(Micros::new(5));
        assert_eq!(b.state(), BreakerState::Open { until: Micros::MAX });
        assert!(!b.allow(Micros::MAX - Micros::new(1)));
    }
}
