//! Time units: every duration and instant in Sluice is whole microseconds, the type
//! [`Micros`]; milliseconds and seconds appear only at the edges (headers, the wire,
//! configuration, the Redis scripts' arguments), as plain `u64` fields whose names end in
//! `_ms` or `_s`, and they cross into and out of [`Micros`] only here.
//!
//! Rounding follows one rule: a wait is rounded up (a client that waits that long is never
//! early), an instant is rounded down (a timestamp never lies in the future).
//!
//! The arithmetic is exactly `u64`'s (the Redis Lua scripts mirror it number for number):
//! `+`, `-`, `*` and `/` overflow as `u64` does, the `saturating_*` and `checked_*` methods
//! are `u64`'s. An interval times a count is `Micros * u64`; how many intervals fit in a span
//! is `Micros / Micros`, a plain `u64`.

use std::ops::{Add, AddAssign, Div, Mul, Rem, Sub, SubAssign};
use std::time::Duration;

/// A point in time (since any fixed epoch) or a duration, in whole microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Micros(u64);

impl Micros {
    /// No time at all; also the epoch.
    pub const ZERO: Micros = Micros(0);
    /// The largest representable time.
    pub const MAX: Micros = Micros(u64::MAX);
    /// One microsecond.
    pub const MICROSECOND: Micros = Micros(1);
    /// One millisecond.
    pub const MILLISECOND: Micros = Micros(1_000);
    /// One second.
    pub const SECOND: Micros = Micros(1_000_000);

    /// `us` microseconds: raw storage and the Redis scripts' encoding, which count in
    /// microseconds.
    pub const fn new(us: u64) -> Micros {
        Micros(us)
    }

    /// The number of microseconds: raw storage and the Redis scripts' encoding.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Milliseconds (an edge's `_ms`), saturating at [`Micros::MAX`].
    pub const fn from_ms(ms: u64) -> Micros {
        Micros(ms.saturating_mul(Micros::MILLISECOND.0))
    }

    /// Seconds (an edge's `_s`), saturating at [`Micros::MAX`].
    pub const fn from_secs(s: u64) -> Micros {
        Micros(s.saturating_mul(Micros::SECOND.0))
    }

    /// A [`Duration`] (sub-microsecond parts dropped), saturating at [`Micros::MAX`].
    pub fn from_duration(d: Duration) -> Micros {
        Micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// As a [`Duration`], for the standard library's and tokio's timers.
    pub const fn to_duration(self) -> Duration {
        Duration::from_micros(self.0)
    }

    /// A duration in whole milliseconds, rounded up: a wait of 1 µs is 1 ms, never 0.
    pub const fn wait_ms(self) -> u64 {
        self.0.div_ceil(Micros::MILLISECOND.0)
    }

    /// An instant, or a span that must not be overstated (an elapsed time, a window, a
    /// lease's life), in whole milliseconds, rounded down.
    pub const fn instant_ms(self) -> u64 {
        self.0 / Micros::MILLISECOND.0
    }

    /// Whether this is no time at all.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self + rhs`, saturating at [`Micros::MAX`].
    pub const fn saturating_add(self, rhs: Micros) -> Micros {
        Micros(self.0.saturating_add(rhs.0))
    }

    /// `self - rhs`, saturating at [`Micros::ZERO`].
    pub const fn saturating_sub(self, rhs: Micros) -> Micros {
        Micros(self.0.saturating_sub(rhs.0))
    }

    /// `self × n`, saturating at [`Micros::MAX`].
    pub const fn saturating_mul(self, n: u64) -> Micros {
        Micros(self.0.saturating_mul(n))
    }

    /// `self + rhs`, or `None` on overflow.
    pub const fn checked_add(self, rhs: Micros) -> Option<Micros> {
        match self.0.checked_add(rhs.0) {
            Some(us) => Some(Micros(us)),
            None => None,
        }
    }

    /// `self - rhs`, or `None` below zero.
    pub const fn checked_sub(self, rhs: Micros) -> Option<Micros> {
        match self.0.checked_sub(rhs.0) {
            Some(us) => Some(Micros(us)),
            None => None,
        }
    }

    /// `self × n`, or `None` on overflow.
    pub const fn checked_mul(self, n: u64) -> Option<Micros> {
        match self.0.checked_mul(n) {
            Some(us) => Some(Micros(us)),
            None => None,
        }
    }

    /// `self / n`, rounded up (`n` must not be 0, as for `u64`).
    pub const fn div_ceil(self, n: u64) -> Micros {
        Micros(self.0.div_ceil(n))
    }
}

impl Add for Micros {
    type Output = Micros;
    fn add(self, rhs: Micros) -> Micros {
        Micros(self.0 + rhs.0)
    }
}

impl AddAssign for Micros {
    fn add_assign(&mut self, rhs: Micros) {
        self.0 += rhs.0;
    }
}

impl Sub for Micros {
    type Output = Micros;
    fn sub(self, rhs: Micros) -> Micros {
        Micros(self.0 - rhs.0)
    }
}

impl SubAssign for Micros {
    fn sub_assign(&mut self, rhs: Micros) {
        self.0 -= rhs.0;
    }
}

/// A count of intervals: `interval × n`.
impl Mul<u64> for Micros {
    type Output = Micros;
    fn mul(self, n: u64) -> Micros {
        Micros(self.0 * n)
    }
}

/// A count of intervals: `n × interval`.
impl Mul<Micros> for u64 {
    type Output = Micros;
    fn mul(self, interval: Micros) -> Micros {
        Micros(self * interval.0)
    }
}

/// A share of a span: `span / n`, rounded down.
impl Div<u64> for Micros {
    type Output = Micros;
    fn div(self, n: u64) -> Micros {
        Micros(self.0 / n)
    }
}

/// How many whole intervals fit in a span, rounded down.
impl Div for Micros {
    type Output = u64;
    fn div(self, interval: Micros) -> u64 {
        self.0 / interval.0
    }
}

/// What is left of a span after its whole intervals.
impl Rem for Micros {
    type Output = Micros;
    fn rem(self, interval: Micros) -> Micros {
        Micros(self.0 % interval.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_round_up_and_instants_round_down() {
        assert_eq!(Micros::new(0).wait_ms(), 0);
        assert_eq!(Micros::new(1).wait_ms(), 1);
        assert_eq!(Micros::new(1_000).wait_ms(), 1);
        assert_eq!(Micros::new(1_001).wait_ms(), 2);
        assert_eq!(Micros::new(1_999).instant_ms(), 1);
        assert_eq!(Micros::from_ms(3), Micros::new(3_000));
        assert_eq!(Micros::from_ms(u64::MAX), Micros::MAX);
        assert_eq!(Micros::from_secs(2), Micros::new(2_000_000));
        assert_eq!(Micros::from_secs(u64::MAX), Micros::MAX);
        assert_eq!(Micros::from_duration(Duration::from_nanos(2_999)), Micros::new(2));
        assert_eq!(Micros::from_duration(Duration::MAX), Micros::MAX);
        assert_eq!(Micros::new(2_500).to_duration(), Duration::from_micros(2_500));
    }

    #[test]
    fn arithmetic_is_u64s() {
        let (a, b) = (Micros::new(7_000), Micros::new(3_000));
        assert_eq!(a + b, Micros::new(10_000));
        assert_eq!(a - b, Micros::new(4_000));
        assert_eq!(b * 3, Micros::new(9_000));
        assert_eq!(3 * b, Micros::new(9_000));
        assert_eq!(a / 2, Micros::new(3_500));
        assert_eq!(a / b, 2);
        assert_eq!(a % b, Micros::new(1_000));
        assert_eq!(a.div_ceil(3), Micros::new(2_334));
        assert_eq!(b.saturating_sub(a), Micros::ZERO);
        assert_eq!(Micros::MAX.saturating_add(a), Micros::MAX);
        assert_eq!(Micros::MAX.saturating_mul(2), Micros::MAX);
        assert_eq!(b.checked_sub(a), None);
        assert_eq!(Micros::MAX.checked_add(a), None);
        assert_eq!(Micros::MAX.checked_mul(2), None);
        assert_eq!(a.checked_sub(b), Some(Micros::new(4_000)));
    }
}
