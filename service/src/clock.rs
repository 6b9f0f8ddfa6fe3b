//! The node's clock: unix microseconds that never go backwards, and the one place a test
//! sets the time ([`Clock::set`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_core::time::micros_from_duration;
use sluice_core::Micros;

/// A wall clock guarded against steps backwards (NTP corrections), shared by a node.
#[derive(Debug, Default)]
pub struct Clock {
    last: AtomicU64,
    /// A time a test holds the clock at (0: the wall's).
    held: AtomicU64,
}

impl Clock {
    /// Current unix time in microseconds, never less than a previous reading.
    pub fn now_us(&self) -> Micros {
        let held = self.held.load(Ordering::Relaxed);
        if held != 0 {
            return held;
        }
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, micros_from_duration);
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        wall.max(prev)
    }

    /// Holds the clock at `now` (µs, a test's time) until set again; `None`: the wall's
    /// time again.
    pub fn set(&self, now: Option<Micros>) {
        self.held.store(now.unwrap_or(0), Ordering::Relaxed);
    }
}
