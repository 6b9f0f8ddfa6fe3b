//! Pure rate-limiting logic shared by every part of Sluice.
//!
//! No I/O, no clock, no globals: time is always an argument. The check service, the
//! proxy-wasm filter and the client SDKs (through `sluice-pace`) call this crate, so a
//! decision, a header or a backoff delay is computed the same way everywhere.
//!
//! # The modules, by who uses them
//!
//! **Deciding** — the check service and the filter:
//! - [`algorithm`]: the seven algorithms as state machines ([`Limit`], [`State`], [`Decision`]);
//! - [`state_map`]: limit state per key with bounded memory (the filter's buckets, the
//!   service's memory store and fallback buckets);
//! - [`lease`]: leased quotas — units granted ahead of use, what each algorithm guarantees;
//! - [`breaker`]: the circuit breaker around a call that may fail (the filter's check
//!   calls, the service's store calls);
//! - [`rules`]: the rule file, its validation and matching a request to its rules;
//! - [`path`]: the canonical form of a request path, which rules are matched against;
//! - [`identity`]: identity values bounded by digest, client addresses grouped by prefix;
//! - [`wire`]: the `POST /v1/check` request and answer;
//! - [`headers`]: the rate-limit headers and the 429 body the filter and the service send;
//! - [`space_saving`]: the heaviest hitters in bounded memory (the console's top refused).
//!
//! **Backing off** — the service's reconnects and the clients' retries: [`backoff`], jittered
//! exponential backoff after a failure.
//!
//! The clients' side — reading any server's rate-limit headers, pacing under the quota,
//! retrying — is `sluice-pace` (`pace/`), over this crate.
//!
//! **Basics** — everyone: [`time`] (microseconds and the conversions at the edges),
//! [`text`] (UTF-8-safe truncation) and [`json`] (the small JSON reader and writer: the one
//! codec of the check and lease calls, on both sides, and the filter's configuration).
//!
//! # Features
//!
//! - `serde`: serde derives on the rules and client types, and `RuleSet::to_json` through
//!   serde_json. Off by default: the filter and the SDKs compile no serde at all
//!   (`scripts/test` fails if the filter's dependencies ever name it).
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

// Backing off.
pub mod backoff;

// Basics.
pub mod json;
pub mod text;
pub mod time;

pub use algorithm::{Algorithm, Decision, Limit, LimitBuilder, LimitError, State};
pub use backoff::{Backoff, BackoffPolicy, Jitter, RandomSource, SplitMix64};
pub use breaker::{Breaker, BreakerState};
pub use headers::{write_headers, HeaderBuf, HeaderMode, Quota};
pub use state_map::StateMap;
pub use time::Micros;
