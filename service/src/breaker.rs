//! The node's circuit breaker around its store: core's [`sluice_core::breaker::Breaker`]
//! (after `failures` consecutive errors callers fail fast for `cooldown`, then one probe is
//! let through and its success closes it again) shared by every request of the node,
//! on a monotonic clock, logging when it opens and closes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use sluice_core::breaker::BreakerState;
use sluice_core::Micros;

/// A breaker shared by all requests of a node.
#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<sluice_core::Breaker>,
    /// Closed with no failure counted: `allow` and `success` have nothing to do, so the
    /// path of a healthy store takes no lock.
    clean: AtomicBool,
    epoch: Instant,
    cooldown: Duration,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            inner: Mutex::new(sluice_core::Breaker::new(threshold, Micros::from_duration(cooldown))),
            clean: AtomicBool::new(true),
            epoch: Instant::now(),
            cooldown,
        }
    }

    fn now(&self) -> Micros {
        Micros::from_duration(self.epoch.elapsed())
    }

    fn lock(&self) -> MutexGuard<'_, sluice_core::Breaker> {
        // Every update replaces the breaker's fields whole: a poisoned lock is safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may go to the store now; after the cooldown exactly one caller probes.
    pub fn allow(&self) -> bool {
        self.clean.load(Ordering::Acquire) || self.lock().allow(self.now())
    }

    /// Records a successful call: closes the breaker.
    pub fn success(&self) {
        if self.clean.load(Ordering::Acquire) {
            return;
        }
        let mut breaker = self.lock();
        let was = breaker.state();
        breaker.success();
        self.clean.store(true, Ordering::Release);
        drop(breaker);
        if !was.is_closed() {
            tracing::info!("store recovered: circuit breaker closed");
        }
    }

    /// Records a failed call: opens the breaker at the threshold (or again after a failed probe).
    pub fn failure(&self) {
        let mut breaker = self.lock();
        let was = breaker.state();
        breaker.failure(self.now());
        self.clean.store(false, Ordering::Release);
        let (state, failures) = (breaker.state(), breaker.failures());
        drop(breaker);
        if was.is_closed() && !state.is_closed() {
            tracing::warn!(
                failures,
                cooldown_ms = self.cooldown.as_millis() as u64,
                "store failing: circuit breaker open"
            );
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        if self.clean.load(Ordering::Acquire) {
            return BreakerState::Closed;
        }
        self.lock().state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_at_threshold_probes_after_cooldown_and_closes_on_success() {
        let b = Breaker::new(3, Duration::ZERO);
        b.failure();
        b.failure();
        assert_eq!(b.state(), BreakerState::Closed);
        b.failure();
        assert_eq!(b.state().name(), "open");
        assert!(b.allow(), "cooldown of zero: the probe goes");
        assert!(!b.allow(), "only one probe at a time");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.failure();
        assert_eq!(b.state().name(), "open");
        assert!(b.allow());
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow() && b.allow());
    }

    #[test]
    fn stays_open_during_cooldown() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        b.failure();
        assert!(!b.allow());
    }

    #[test]
    fn failures_below_the_threshold_are_forgotten_on_success() {
        let b = Breaker::new(2, Duration::from_secs(3600));
        b.failure();
        b.success();
        b.failure();
        assert!(b.allow(), "one failure since the last success");
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
