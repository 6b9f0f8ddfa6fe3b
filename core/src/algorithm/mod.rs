//! Rate-limiting algorithms as pure state machines.
//!
//! Every algorithm is driven the same way: [`Limit::decide`] takes the stored [`State`], the
//! current time and the request's cost, and returns a [`Decision`], updating the state only
//! when the request is admitted. Time is always passed in, in microseconds since any fixed
//! epoch, so the same code runs in the service, the filter, the SDKs and the tests.
//!
//! All arithmetic is on integers that stay below 2^53, so the Redis Lua scripts (whose
//! numbers are doubles) reach exactly the same decisions; [`LimitBuilder::build`] rejects limits
//! whose numbers would break that promise.

mod all;
pub mod concurrency;
mod fixed_window;
mod gcra;
mod sliding_window_counter;
mod sliding_window_log;
mod token_bucket;

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::time::Micros;

pub use all::{decide_all, passes, Part};

/// The largest integer every number in a decision must stay below (2^53): doubles, and so
/// Redis Lua, represent every integer up to it exactly.
pub const EXACT_LIMIT: u64 = 1 << 53;

/// Which algorithm a rule uses; the names are those of the rule file and the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Algorithm {
    /// Bursts up to `burst`, long-run rate `limit / window`.
    TokenBucket,
    /// GCRA meter; in shaping mode requests are delayed up to `max_delay` instead of denied.
    LeakyBucket,
    /// At most `limit` per aligned window.
    FixedWindow,
    /// Exact: at most `limit` in any window of length `window`.
    SlidingWindowLog,
    /// Weighted previous window plus current window stays within `limit`.
    SlidingWindowCounter,
    /// Generic cell rate algorithm: a token bucket kept as one timestamp.
    Gcra,
    /// At most `limit` requests in flight at once; a slot is given back when its request
    /// ends, or `window` after its holder last renewed it (see [`concurrency`]).
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 7] = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::Gcra,
        Algorithm::Concurrency,
    ];

    /// The name used in rule files and on the wire.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that is not one of [`Algorithm::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown algorithm {0:?}: expected one of token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter, gcra, concurrency")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// The outcome of one check against one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// Whether the request may pass (possibly after `delay`).
    pub allowed: bool,
    /// The configured limit: requests (cost units) per window.
    pub limit: u64,
    /// Cost units still available right after this decision.
    pub remaining: u64,
    /// Time until the quota is whole again (or, for windows, until the window ends).
    pub reset_after: Micros,
    /// Shortest wait after which the same request would be allowed; 0 when allowed.
    pub retry_after: Micros,
    /// How long to hold an admitted request before forwarding it (shaping only).
    pub delay: Micros,
}

/// Why a set of limit parameters cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LimitError {
    /// `limit` is zero.
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// `window` is shorter than one millisecond or not a whole number of milliseconds.
    #[error("window must be a whole number of milliseconds, at least 1ms")]
    BadWindow,
    /// The emission interval `window / limit` is below one microsecond.
    #[error("limit {limit} per {window_ms}ms is more than one request per microsecond")]
    TooFast {
        /// The configured limit.
        limit: u64,
        /// The configured window in milliseconds.
        window_ms: u64,
    },
    /// The numbers would exceed 2^53 inside the algorithm, where Lua loses exactness.
    #[error("{field} is too large for this window: {detail}")]
    TooLarge {
        /// The field to lower: `limit`, `burst`, `window` or `max_delay`.
        field: &'static str,
        /// What overflowed.
        detail: String,
    },
}

/// Validated parameters of one limit, with the derived numbers every decision needs.
///
/// Build it with [`Limit::builder`]; the accessors expose the derived numbers so that the Redis
/// scripts can be called with exactly what the Rust state machine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    algorithm: Algorithm,
    limit: u64,
    window: Micros,
    capacity: u64,
    shaping: bool,
    max_delay: Micros,
    /// GCRA emission interval: `ceil(window / limit)`.
    interval: Micros,
    /// Token bucket: one token is `unit` scaled units; the bucket refills `rate` per µs.
    unit: u64,
    rate: u64,
}

/// The parameters of a [`Limit`] before validation: start with [`Limit::builder`], set what
/// differs from the defaults (no burst beyond `limit`, no shaping), then [`LimitBuilder::build`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build`"]
pub struct LimitBuilder {
    algorithm: Algorithm,
    limit: u64,
    window: Micros,
    burst: u64,
    max_delay: Option<Micros>,
}

impl LimitBuilder {
    /// The bucket capacity of the bucket algorithms (`token_bucket`, `gcra`, `leaky_bucket`);
    /// 0, the default, means `limit`.
    pub fn burst(self, burst: u64) -> LimitBuilder {
        LimitBuilder { burst, ..self }
    }

    /// With `Some(max_delay)`, a `leaky_bucket` holds an excess request up to `max_delay`
    /// instead of denying it (the other algorithms ignore it); `None`, the default, denies.
    pub fn shaping(self, max_delay: Option<Micros>) -> LimitBuilder {
        LimitBuilder { max_delay, ..self }
    }

    /// Validates the parameters and derives the numbers every decision needs.
    pub fn build(self) -> Result<Limit, LimitError> {
        let LimitBuilder {
            algorithm,
            limit,
            window,
            burst,
            max_delay,
        } = self;
        if limit == 0 {
            return Err(LimitError::ZeroLimit);
        }
        if window < Micros::MILLISECOND || !(window % Micros::MILLISECOND).is_zero() {
            return Err(LimitError::BadWindow);
        }
        let window_ms = window.instant_ms();
        if limit > window.as_u64() {
            return Err(LimitError::TooFast { limit, window_ms });
        }
        let capacity = if burst == 0 { limit } else { burst };
        let (shaping, max_delay) = match max_delay {
            Some(max_delay) if algorithm == Algorithm::LeakyBucket => (true, max_delay),
            _ => (false, Micros::ZERO),
        };
        let interval = window.div_ceil(limit);
        let g = gcd(window.as_u64(), limit);
        let (unit, rate) = (window.as_u64() / g, limit / g);
        let too_large = |field, detail: String| Err(LimitError::TooLarge { field, detail });
        if window.as_u64() >= EXACT_LIMIT / 4 {
            return too_large("window", format!("{window_ms}ms is longer than 2^51 µs"));
        }
        if max_delay.as_u64() >= EXACT_LIMIT / 4 {
            return too_large("max_delay", "longer than 2^51 µs".into());
        }
        match algorithm {
            Algorithm::TokenBucket if capacity.checked_mul(unit).is_none_or(|v| v >= EXACT_LIMIT) => too_large(
                "burst",
                format!("capacity {capacity} × {unit} scaled units per token reaches 2^53"),
            ),
            Algorithm::Gcra | Algorithm::LeakyBucket
                if capacity
                    .checked_mul(interval.as_u64())
                    .is_none_or(|v| v >= EXACT_LIMIT / 4) =>
            {
                too_large(
                    "burst",
                    format!("capacity {capacity} × interval {}µs reaches 2^51", interval.as_u64()),
                )
            }
            Algorithm::SlidingWindowCounter if limit.checked_mul(window_ms).is_none_or(|v| v >= EXACT_LIMIT) => {
                too_large("limit", format!("limit {limit} × {window_ms}ms reaches 2^53"))
            }
            Algorithm::Concurrency if limit > concurrency::MAX_SLOTS => too_large(
                "limit",
                format!(
                    "{limit} requests in flight: a concurrency rule holds at most {} (each check reads the slots held)",
                    concurrency::MAX_SLOTS
                ),
            ),
            _ => Ok(Limit {
                algorithm,
                limit,
                window,
                capacity,
                shaping,
                max_delay,
                interval,
                unit,
                rate,
            }),
        }
    }
}

impl Limit {
    /// A limit of `limit` cost units per `window` for `algorithm`, with no burst beyond
    /// `limit` and no shaping until the builder says otherwise.
    pub fn builder(algorithm: Algorithm, limit: u64, window: Micros) -> LimitBuilder {
        LimitBuilder {
            algorithm,
            limit,
            window,
            burst: 0,
            max_delay: None,
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// Cost units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The window length.
    pub fn window(&self) -> Micros {
        self.window
    }
    /// Bucket capacity (`burst`, or `limit` when burst is 0).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Whether admitted requests may be delayed instead of denied.
    pub fn shaping(&self) -> bool {
        self.shaping
    }
    /// The longest delay a shaping limit imposes.
    pub fn max_delay(&self) -> Micros {
        self.max_delay
    }
    /// GCRA emission interval, `ceil(window / limit)`.
    pub fn interval(&self) -> Micros {
        self.interval
    }
    /// Token bucket: scaled units per token (`window / gcd(window, limit)`).
    pub fn token_unit(&self) -> u64 {
        self.unit
    }
    /// Token bucket: scaled units refilled per microsecond (`limit / gcd(window, limit)`).
    pub fn token_rate(&self) -> u64 {
        self.rate
    }

    /// Decides whether a request of `cost` units may pass at `now`, updating `state` if so.
    ///
    /// A state left by another algorithm (the rule changed) is treated as fresh.
    pub fn decide(&self, state: &mut State, now: Micros, cost: u64) -> Decision {
        let cost = cost.max(1);
        match self.algorithm {
            Algorithm::TokenBucket => token_bucket::decide(self, state, now, cost),
            Algorithm::Gcra | Algorithm::LeakyBucket => gcra::decide(self, state, now, cost),
            Algorithm::FixedWindow => fixed_window::decide(self, state, now, cost),
            Algorithm::SlidingWindowLog => sliding_window_log::decide(self, state, now, cost),
            Algorithm::SlidingWindowCounter => sliding_window_counter::decide(self, state, now, cost),
            Algorithm::Concurrency => concurrency::decide(self, state, now, cost),
        }
    }

    /// A state that has `remaining` cost units left at `at`: a fresh quota less what the
    /// rest would have taken then (for the fallback buckets, from what the store last said).
    pub fn with_remaining(&self, remaining: u64, at: Micros) -> State {
        let mut state = State::Fresh;
        let used = self.capacity.saturating_sub(remaining);
        if used > 0 {
            self.decide(&mut state, at, used);
        }
        state
    }

    /// What a request of cost 1 would get at `now`, keeping nothing: a peek at the quota
    /// ([`peeked`]).
    pub fn peek(&self, state: &State, now: Micros) -> Decision {
        peeked(self.decide(&mut state.clone(), now, 1))
    }

    /// Gives back `cost` units admitted at `admitted_at`, because another rule of the same
    /// request denied it.
    pub fn refund(&self, state: &mut State, admitted_at: Micros, cost: u64) {
        let cost = cost.max(1);
        match self.algorithm {
            Algorithm::TokenBucket => token_bucket::refund(self, state, cost),
            Algorithm::Gcra | Algorithm::LeakyBucket => gcra::refund(self, state, admitted_at, cost),
            Algorithm::FixedWindow => fixed_window::refund(self, state, admitted_at, cost),
            Algorithm::SlidingWindowLog | Algorithm::Concurrency => {
                sliding_window_log::refund(state, admitted_at, cost)
            }
            Algorithm::SlidingWindowCounter => sliding_window_counter::refund(self, state, admitted_at, cost),
        }
    }

    /// A concurrency limit's slots given back: up to `cost` taken or last renewed at `at`;
    /// the slots freed (0 for any other algorithm, and for slots that expired or were given
    /// back already).
    pub fn release(&self, state: &mut State, at: Micros, cost: u64) -> u64 {
        match self.algorithm {
            Algorithm::Concurrency => concurrency::release(state, at, cost.max(1)),
            _ => 0,
        }
    }

    /// A concurrency limit's renewal: moves up to `cost` slots taken or last renewed at `at`
    /// to `now`, so they live another window; the slots moved (0 for any other algorithm,
    /// and for slots that expired or were given back). Giving a slot back is a
    /// [`Limit::refund`] at its time.
    pub fn renew(&self, state: &mut State, at: Micros, now: Micros, cost: u64) -> u64 {
        match self.algorithm {
            Algorithm::Concurrency => concurrency::renew(state, at, now, cost.max(1)),
            _ => 0,
        }
    }

    /// How long after `now` the state is indistinguishable from a fresh one and may be
    /// dropped (the memory store's eviction time and the Redis TTL).
    pub fn expires_after(&self, state: &State, now: Micros) -> Micros {
        match (self.algorithm, state) {
            (Algorithm::TokenBucket, State::Bucket { tokens, last }) => {
                let full = token_bucket::time_to_full(self, *tokens);
                (*last + full).saturating_sub(now)
            }
            (Algorithm::Gcra | Algorithm::LeakyBucket, State::Tat(tat)) => tat.saturating_sub(now),
            (Algorithm::FixedWindow, State::Window { id, .. }) => ((id + 1) * self.window).saturating_sub(now),
            (Algorithm::SlidingWindowLog | Algorithm::Concurrency, State::Log { entries, .. }) => entries
                .back()
                .map_or(Micros::ZERO, |&(ts, _)| (ts + self.window).saturating_sub(now)),
            (Algorithm::SlidingWindowCounter, State::Counter { id, .. }) => {
                ((id + 2) * self.window).saturating_sub(now)
            }
            _ => Micros::ZERO,
        }
    }
}

/// The stored state of one limit key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum State {
    /// Nothing recorded yet: the full quota is available.
    #[default]
    Fresh,
    /// Token bucket: scaled tokens (see [`Limit::token_unit`]) at time `last`.
    Bucket {
        /// Tokens × `token_unit`.
        tokens: u64,
        /// When `tokens` was computed.
        last: Micros,
    },
    /// GCRA and leaky bucket: the theoretical arrival time.
    Tat(Micros),
    /// Fixed window: the aligned window's index and what it admitted.
    Window {
        /// `now / window`.
        id: u64,
        /// Cost admitted in this window.
        count: u64,
    },
    /// Sliding window log and concurrency: admitted (time, cost) pairs, oldest first, and
    /// their total (a concurrency slot's time is when it was taken or last renewed).
    Log {
        /// Admitted (time, cost) pairs, oldest first; one entry per distinct time.
        entries: VecDeque<(Micros, u64)>,
        /// The sum of the entries' costs.
        used: u64,
    },
    /// Sliding window counter: the aligned window's index and the counts of it and the one before.
    Counter {
        /// `now / window`.
        id: u64,
        /// Cost admitted in window `id`.
        current: u64,
        /// Cost admitted in window `id - 1`.
        previous: u64,
    },
}

/// A peek from the decision a request of cost 1 got without keeping it: the same answer,
/// but `remaining` counts the unit it did not take. (A peek is decided at cost 1: "would a
/// request pass now", which cost 0 cannot ask.)
pub fn peeked(mut cost_one: Decision) -> Decision {
    if cost_one.allowed {
        cost_one.remaining += 1;
    }
    cost_one
}

/// A decision that denies; `remaining` and `reset_after` describe the current state.
fn denied(limit: &Limit, remaining: u64, reset_after: Micros, retry_after: Micros) -> Decision {
    Decision {
        allowed: false,
        limit: limit.limit,
        remaining,
        reset_after,
        retry_after,
        delay: Micros::ZERO,
    }
}

/// A decision that admits.
fn admitted(limit: &Limit, remaining: u64, reset_after: Micros) -> Decision {
    Decision {
        allowed: true,
        limit: limit.limit,
        remaining,
        reset_after,
        retry_after: Micros::ZERO,
        delay: Micros::ZERO,
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests;
