//! Time units: every duration and instant in Sluice is whole microseconds ([`Micros`]);
//! milliseconds and seconds appear only at the edges (headers, the wire, configuration).
//!
//! Rounding follows one rule: a wait is rounded up (a client that waits that long is never
//! early), an instant is rounded down (a timestamp never lies in the future).

use std::time::Duration;

/// A point in time or a duration, in microseconds.
pub type Micros = u64;

/// Microseconds in one millisecond.
pub const MICROS_PER_MS: Micros = 1_000;

/// Microseconds in one second.
pub const MICROS_PER_S: Micros = 1_000_000;

/// A duration in whole milliseconds, rounded up: a wait of 1 µs is 1 ms, never 0.
pub const fn wait_ms(us: Micros) -> u64 {
    us.div_ceil(MICROS_PER_MS)
}

/// An instant, or a span that must not be overstated (an elapsed time, a window, a lease's
/// life), in whole milliseconds, rounded down.
pub const fn instant_ms(us: Micros) -> u64 {
    us / MICROS_PER_MS
}

/// Milliseconds as microseconds, saturating at `u64::MAX`.
pub const fn micros_from_ms(ms: u64) -> Micros {
    ms.saturating_mul(MICROS_PER_MS)
}

/// A [`Duration`] as microseconds (sub-microsecond parts dropped), saturating at `u64::MAX`.
pub fn micros_from_duration(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_round_up_and_instants_round_down() {
        assert_eq!(wait_ms(0), 0);
        assert_eq!(wait_ms(1), 1);
        assert_eq!(wait_ms(1_000), 1);
        assert_eq!(wait_ms(1_001), 2);
        assert_eq!(instant_ms(1_999), 1);
        assert_eq!(micros_from_ms(3), 3_000);
        assert_eq!(micros_from_ms(u64::MAX), u64::MAX);
        assert_eq!(micros_from_duration(Duration::from_nanos(2_999)), 2);
        assert_eq!(micros_from_duration(Duration::MAX), u64::MAX);
    }
}
