//! Pure rate-limiting logic shared by every part of Sluice.
//!
//! No I/O, no clock, no globals: time is always an argument. The check service, the
//! proxy-wasm filter and both client SDKs call this crate, so a decision, a header or a
//! backoff delay is computed the same way everywhere.

pub mod algorithm;
pub mod backoff;
pub mod headers;
pub mod pacing;
pub mod retry;
pub mod rules;
pub mod wire;

pub use algorithm::{Algorithm, Decision, Limit, LimitError, Micros, State};
pub use backoff::{Backoff, BackoffPolicy, Jitter, RandomSource, SplitMix64};
pub use headers::{parse_headers, write_headers, HeaderBuf, HeaderMode, Quota, RateLimitInfo};
pub use pacing::{Pacer, PacerConfig};
pub use retry::{BudgetConfig, RetryBudget};
