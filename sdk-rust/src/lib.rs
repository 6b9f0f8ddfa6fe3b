//! `sluice-client`: a [`reqwest`] client that respects the rate limits servers advertise.
//!
//! * Every response's rate-limit headers (`X-RateLimit-*`, IETF `RateLimit` /
//!   `RateLimit-Policy`, `Retry-After`, and the variants real APIs send) are read into a
//!   [`RateLimitInfo`], returned with the [`Response`].
//! * Requests of one bucket (host, port and the policy name the route was last seen
//!   under, by default; or a key of your own) wait in a
//!   bounded FIFO and are released at the pace that keeps them within the advertised
//!   quota; a full queue fails at once with [`Error::QueueFull`], and dropping a waiting
//!   request's future gives its place up. A server that also counts tokens or bytes
//!   ([`RateLimitInfo::quotas`]) is paced on those as well, at the [`Cost`] a request is
//!   expected to spend ([`Client::send_with_cost`]).
//! * 429, 503 and connection failures are retried with jittered exponential backoff (full
//!   jitter by default), never earlier than the server's `Retry-After`; only idempotent
//!   methods or requests with an `Idempotency-Key` header; and only while the retry
//!   budget (10 % of requests plus 10) lasts.
//!
//! The logic (header parsing, backoff schedule, pacing) is `sluice-core`'s; this crate
//! drives it with `tokio` timers.
//!
//! # Example
//!
//! ```no_run
//! use sluice_client::{BackoffPolicy, Client};
//!
//! # async fn demo() -> Result<(), sluice_client::Error> {
//! let client = Client::builder()
//!     .backoff(BackoffPolicy { max_retries: 3, ..sluice_client::default_backoff() })
//!     .queue_capacity(100)
//!     .on_retry(|event| eprintln!("retry {} in {:?}", event.retry, event.delay))
//!     .build()?;
//!
//! let response = client.send(client.get("http://127.0.0.1:8080/api/hello")).await?;
//! let quota = response.quota();
//! println!("{} — {:?} of {:?} left", response.status(), quota.remaining, quota.limit);
//! let body = response.text().await?;
//! # let _ = body;
//! # Ok(())
//! # }
//! ```
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![warn(missing_docs)]

mod client;
mod error;
mod hold;
mod queue;
mod response;
mod retry;
mod route;

pub use client::{Client, ClientBuilder};
pub use error::{Error, Result};
pub use queue::{bucket_key, QueueConfig};
pub use response::Response;
pub use retry::{default_backoff, RetryEvent, RetryHook, RetryPolicy, IDEMPOTENCY_KEY};
pub use sluice_core::backoff::{BackoffPolicy, Jitter};
pub use sluice_pace::headers::{RateLimitInfo, UnitQuota};
pub use sluice_pace::pacing::{Cost, PacerConfig};
pub use sluice_pace::retry::BudgetConfig;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
