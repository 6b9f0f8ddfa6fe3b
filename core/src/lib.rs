//! Pure rate-limiting logic shared by every part of Sluice.
//!
//! No I/O, no clock, no globals: time is always an argument. The check service, the
//! proxy-wasm filter and both client SDKs call this crate, so a decision, a header or a
//! backoff delay is computed the same way everywhere.
//!
//! # The modules, by who uses them
//!
//! **Deciding** — the check service and the filter:
//! - [`algorithm`]: the six algorithms as state machines ([`Limit`], [`State`], [`Decision`]);
//! - [`state_map`]: limit state per key with bounded memory (the filter's buckets, the
//!   service's memory store and fallback buckets);
//! - [`lease`]: leased quotas — units granted ahead of use, what each algorithm guarantees;
//! - [`breaker`]: the circuit breaker around a call that may fail (the filter's check
//!   calls, the service's store calls);
//! - [`rules`]: the rule file, its validation and matching a request to its rules (and
//!   explaining why a rule does not match);
//! - [`space_saving`]: the heaviest hitters of a stream in bounded memory (the clients a
//!   rule refuses most);
//! - [`path`]: the canonical form of a request path, which rules are matched against;
//! - [`identity`]: identity values bounded by digest, client addresses grouped by prefix;
//! - [`wire`]: the `POST /v1/check` request and answer;
//! - [`headers`] (formatting): the rate-limit headers and the 429 body the filter sends.
//!
//! **Pacing and retrying** — the client SDKs (Rust, and JavaScript through wasm-bindgen):
//! - [`headers`] (parsing): reading any server's rate-limit headers into [`RateLimitInfo`];
//! - [`pacing`]: when the next request may go to stay under the advertised quota;
//! - [`backoff`]: jittered exponential backoff after a failure;
//! - [`retry`]: what is retried, after how long, and the retry budget.
//!
//! **Basics** — everyone: [`time`] (microseconds and the conversions at the edges),
//! [`text`] (UTF-8-safe truncation) and [`json`] (the small JSON reader and writer with which
//! the filter reads its configuration and the service's answers, and writes its calls).
//!
//! # Features
//!
//! - `serde`: serde derives on the wire, rules and client types; the service's side of the
//!   wire (`CheckRequest::from_json`, `LeaseRequest::from_json`, `RuleSet::to_json`) through
//!   serde_json. Off by default: the filter and the SDKs compile no
//!   serde at all (`scripts/test` fails if the filter's dependencies ever name it).
//! - `toml` (with `serde`): reading and writing TOML rule files, the service's.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// Deciding.
pub mod algorithm;
pub mod breaker;
mod evict;
pub mod headers;
pub mod identity;
pub mod lease;
pub mod path;
pub mod rules;
pub mod space_saving;
pub mod state_map;
pub mod wire;

// Pacing and retrying.
pub mod backoff;
pub mod pacing;
pub mod retry;

// Basics.
pub mod json;
pub mod text;
pub mod time;

pub use algorithm::{Algorithm, Decision, Limit, LimitBuilder, LimitError, State};
pub use backoff::{Backoff, BackoffPolicy, Jitter, RandomSource, SplitMix64};
pub use breaker::{Breaker, BreakerState};
pub use headers::{parse_headers, write_headers, HeaderBuf, HeaderMode, Quota, RateLimitInfo};
pub use pacing::{Pacer, PacerConfig};
pub use retry::{BudgetConfig, RetryBudget};
pub use state_map::StateMap;
pub use time::Micros;
