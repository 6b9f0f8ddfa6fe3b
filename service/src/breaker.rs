//! A circuit breaker around the store: after `failures` consecutive errors it opens and
//! callers fail fast for `cooldown`; then one probe is let through (half-open), and its
//! success closes the breaker again.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The breaker's state, as `/readyz` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail fast.
    Open,
    /// One probe is in flight.
    HalfOpen,
}

impl BreakerState {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Lock-free breaker shared by all requests of a node.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    epoch: Instant,
    consecutive: AtomicU32,
    /// Nanoseconds since `epoch` when the breaker may let a probe through; 0 when closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            epoch: Instant::now(),
            consecutive: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Whether a call may go to the store now.
    pub fn allow(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        // Open: after the cooldown, exactly one caller becomes the probe.
        self.now() >= until && !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Records a successful call: closes the breaker.
    pub fn success(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("store recovered: circuit breaker closed");
        }
        self.probing.store(false, Ordering::Release);
    }

    /// Records a failed call: opens the breaker at the threshold (or re-opens after a failed probe).
    pub fn failure(&self) {
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        let was_probe = self.probing.swap(false, Ordering::AcqRel);
        if n >= self.threshold || was_probe {
            let until = self.now() + self.cooldown.as_nanos() as u64;
            if self.open_until.swap(until.max(1), Ordering::AcqRel) == 0 {
                tracing::warn!(
                    failures = n,
                    cooldown_ms = self.cooldown.as_millis() as u64,
                    "store failing: circuit breaker open"
                );
            }
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match self.open_until.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            _ if self.probing.load(Ordering::Acquire) => BreakerState::HalfOpen,
            _ => BreakerState::Open,
        }
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
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow(), "cooldown of zero: the probe goes");
        assert!(!b.allow(), "only one probe at a time");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.failure();
        assert_eq!(b.state(), BreakerState::Open);
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
}
