//! The node's clock: unix microseconds that never go backwards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_core::time::micros_from_duration;
use sluice_core::Micros;

/// A wall clock guarded against steps backwards (NTP corrections), shared by a node.
#[derive(Debug, Default)]
pub struct Clock {
    last: AtomicU64,
}

impl Clock {
    /// Current unix time in microseconds, never less than a previous reading.
    pub fn now_us(&self) -> Micros {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, micros_from_duration);
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        wall.max(prev)
    }
}
