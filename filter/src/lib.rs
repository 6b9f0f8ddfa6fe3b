//! Sluice's proxy-wasm rate-limit filter for Envoy and Nginx (ngx_wasm_module).
//!
//! Per request: read the identities, take a token from the client's local bucket (a local
//! deny answers 429 at once), then ask the check service (`POST /v1/check`) and pause until
//! it answers: 429 with the rate-limit headers, or forward (after a shaping delay, if any)
//! and add the headers to the response. When the check service fails, the failure policy
//! answers, and a circuit breaker stops calling a dead service.
//!
//! The host calls the module's exports (`exports`), which reach its contexts: one root
//! context per VM (`root`) builds the state its streams share (`shared`: the
//! configuration, the buckets, the breaker, the metric ids); each HTTP stream gets a
//! `stream` context over it, which borrows that state once per callback and hands it to the
//! request's `flow`: the decisions, over a `proxy::Proxy` (the ABI's in `host`, a fake in
//! the unit tests). The modules depend one way: `root` → `stream` → `flow` → `answer`,
//! `proxy`, `metrics`, `shared`, `buckets`, `identity`, `config`, `leases`, `debits`;
//! `leases` → `book` → `lease_table` → `slots` (the process's leases in shared data);
//! `root`, `stream` → `host`, `clock` (the ABI, only they call it); `exports` → `root`,
//! `stream`, `host`; `host`, `proxy` → `header_pairs` (a header map in the ABI's form).
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod answer;
mod book;
mod breaker;
pub mod buckets;
mod clock;
pub mod config;
mod credit;
mod debits;
// The two modules that may use `unsafe` (the workspace denies it), the two sides of the
// proxy-wasm ABI: `exports` names the functions the host calls (`#[no_mangle]`), and `host`
// calls the ABI's imports itself, through raw pointers, so that no status a host answers traps.
#[allow(unsafe_code)]
mod exports;
mod flow;
mod header_pairs;
#[allow(unsafe_code)]
mod host;
pub mod identity;
mod in_flight;
mod lease_table;
mod leases;
mod local_in_flight;
mod metrics;
mod proxy;
mod root;
mod shared;
mod slots;
mod stream;
