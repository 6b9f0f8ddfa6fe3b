//! The node's clock: unix microseconds that never go backwards, and the one place a test
//! sets the time ([`Clock::set`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_core::Micros;

/// A wall clock guarded against steps backwards (NTP corrections), shared by a node.
#[derive(Debug, Default)]
pub struct Clock {
    last: AtomicU64,
    /// A time a test holds the clock at (0: the wall's).
    held: AtomicU64,
}

impl Clock {
    /// Current unix time, never less than a previous reading.
    pub fn now(&self) -> Micros {
        let held = self.held.load(Ordering::Relaxed);
        if held != 0 {
            return Micros::new(held);
        }
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(Micros::ZERO, Micros::from_duration);
        let prev = self.last.fetch_max(wall.as_u64(), Ordering::Relaxed);
        wall.max(Micros::new(prev))
    }

    /// Holds the clock at `now` (a test's time) until set again; `None`: the wall's time
    /// again.
    pub fn set(&self, now: Option<Micros>) {
        self.held.store(now.unwrap_or(Micros::ZERO).as_u64(), Ordering::Relaxed);
    }
}
