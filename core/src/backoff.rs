//! Jittered exponential backoff: how long a client waits before retrying.
//!
//! Two jitter strategies from the AWS architecture blog's analysis: *full jitter*
//! (`random(0, min(cap, base·2^n))`, the default: least contention) and *decorrelated
//! jitter* (`min(cap, random(base, 3·previous))`). A server's `Retry-After` is a floor:
//! the client never retries earlier than asked. The random source is passed in.

/// Which jitter to apply to the exponential schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Jitter {
    /// `random(0, min(cap, base · 2^attempt))`.
    #[default]
    Full,
    /// `min(cap, random(base, 3 · previous delay))`.
    Decorrelated,
}

/// The schedule's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct BackoffPolicy {
    /// First delay's scale, in milliseconds.
    pub base_ms: u64,
    /// No computed delay exceeds this (a server's `Retry-After` may).
    pub cap_ms: u64,
    /// Retries after the first attempt; 0 disables retrying.
    pub max_retries: u32,
    /// Give up rather than retry later than this after the first attempt.
    pub max_elapsed_ms: u64,
    /// The jitter strategy.
    pub jitter: Jitter,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            base_ms: 100,
            cap_ms: 10_000,
            max_retries: 5,
            max_elapsed_ms: 30_000,
            jitter: Jitter::Full,
        }
    }
}

/// A source of uniform random numbers; tests pass a seeded one.
pub trait RandomSource {
    /// The next uniformly distributed 64-bit value.
    fn next_u64(&mut self) -> u64;

    /// A uniform value in `[lo, hi]` (inclusive).
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = u128::from(hi - lo) + 1;
        lo + ((u128::from(self.next_u64()) * span) >> 64) as u64
    }
}

/// Any `FnMut() -> u64` closure is a random source (e.g. one wrapping the platform's
/// generator in an SDK).
impl<F: FnMut() -> u64> RandomSource for F {
    fn next_u64(&mut self) -> u64 {
        self()
    }
}

/// SplitMix64: a tiny, fast, well-distributed generator for jitter (not for secrets).
/// Seed it from anything that differs between clients (a clock reading, a process id, the
/// platform's random bytes); equal seeds give equal schedules.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl RandomSource for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The retry state of one request: create one per logical request, ask
/// [`Backoff::next_delay`] after each failed attempt.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: BackoffPolicy,
    retries: u32,
    previous_ms: u64,
}

impl Backoff {
    /// A fresh schedule for one request.
    pub fn new(policy: BackoffPolicy) -> Backoff {
        Backoff {
            policy,
            retries: 0,
            previous_ms: policy.base_ms,
        }
    }

    /// The schedule's parameters.
    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }

    /// Retries granted so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Starts over, as for a new request.
    pub fn reset(&mut self) {
        *self = Backoff::new(self.policy);
    }

    /// The delay in milliseconds before the next retry, or `None` to give up.
    ///
    /// `elapsed_ms` is the time since the first attempt started; `retry_after_ms` what the
    /// server asked for (`Retry-After`), a floor: the delay is never shorter, even beyond
    /// `cap_ms`. Otherwise the delay is jittered ([`Jitter`]) within `[0, cap_ms]` and
    /// within the time left before `max_elapsed_ms`, so that the retry never starts after
    /// it. Gives up when `max_retries` retries were granted, when `max_elapsed_ms` has
    /// passed, or when honouring `retry_after_ms` would start the retry after it.
    pub fn next_delay(
        &mut self,
        elapsed_ms: u64,
        retry_after_ms: Option<u64>,
        rng: &mut impl RandomSource,
    ) -> Option<u64> {
        let p = self.policy;
        if self.retries >= p.max_retries || elapsed_ms > p.max_elapsed_ms {
            return None;
        }
        let left = p.max_elapsed_ms - elapsed_ms;
        let floor = retry_after_ms.unwrap_or(0);
        if floor > left {
            return None;
        }
        let ceiling = p.cap_ms.min(left);
        let jittered = match p.jitter {
            Jitter::Full => {
                let exponential = p.base_ms.saturating_mul(1u64 << self.retries.min(62));
                rng.between(0, exponential.min(ceiling))
            }
            Jitter::Decorrelated => {
                let hi = self.previous_ms.saturating_mul(3).max(p.base_ms);
                rng.between(p.base_ms.min(ceiling), hi.min(ceiling))
            }
        };
        self.retries += 1;
        self.previous_ms = jittered.max(p.base_ms);
        Some(jittered.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_grows_then_caps_and_gives_up() {
        let policy = BackoffPolicy {
            base_ms: 100,
            cap_ms: 1_000,
            max_retries: 6,
            max_elapsed_ms: 60_000,
            ..Default::default()
        };
        let mut b = Backoff::new(policy);
        let mut rng = SplitMix64(7);
        let ceilings = [100, 200, 400, 800, 1_000, 1_000];
        for ceiling in ceilings {
            let d = b.next_delay(0, None, &mut rng).unwrap();
            assert!(d <= ceiling, "{d} > {ceiling}");
        }
        assert_eq!(b.next_delay(0, None, &mut rng), None);
    }

    #[test]
    fn retry_after_is_a_floor_and_max_elapsed_stops() {
        let mut b = Backoff::new(BackoffPolicy::default());
        let mut rng = SplitMix64(1);
        assert!(b.next_delay(0, Some(5_000), &mut rng).unwrap() >= 5_000);
        assert_eq!(b.next_delay(26_000, Some(5_000), &mut rng), None);
        // Without a floor the delay shrinks to fit the time left, then gives up.
        assert!(b.next_delay(29_990, None, &mut rng).unwrap() <= 10);
        assert_eq!(b.next_delay(30_001, None, &mut rng), None);
        b.reset();
        assert_eq!(b.retries(), 0);
        let mut zero = || 0u64;
        assert_eq!(b.next_delay(0, None, &mut zero), Some(0));
    }

    #[test]
    fn between_is_inclusive_and_in_range() {
        let mut rng = SplitMix64(3);
        let mut seen = [false; 3];
        for _ in 0..100 {
            let v = rng.between(5, 7);
            assert!((5..=7).contains(&v));
            seen[(v - 5) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
