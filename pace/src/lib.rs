//! The clients' side of Sluice: what an SDK computes the same way in every language.
//!
//! No I/O, no clock, no globals: time is always an argument, as in `sluice-core`, which it
//! builds on (the backoff schedule, RFC 3339 times). The Rust SDK calls it directly, the
//! JavaScript SDK through wasm-bindgen, the Python SDK through PyO3.
//!
//! - [`headers`]: reading any server's rate-limit headers into [`RateLimitInfo`] (the IETF
//!   `RateLimit`/`RateLimit-Policy` pair, `X-RateLimit-*` and its variants, `Retry-After`);
//! - [`pacing`]: when the next request may go to stay under the advertised quota;
//! - [`retry`]: what is retried, after how long (never before the server's `Retry-After`),
//!   and the retry budget.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod headers;
pub mod pacing;
pub mod retry;

pub use headers::{parse_headers, RateLimitInfo};
pub use pacing::{Pacer, PacerConfig};
pub use retry::{BudgetConfig, RetryBudget};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
