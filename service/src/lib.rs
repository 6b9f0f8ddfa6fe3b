//! Sluice's check service: stateless nodes that decide rate limits over a counter store.
//!
//! The binary (`sluice-service`) wires these modules together: [`http`] serves
//! `POST /v1/check` and the admin API, [`check`] evaluates a request against the rules
//! ([`decide`] takes the limits it matched to the store at once; [`quota`] peeks at them
//! and debits a cost learnt after the response),
//! [`store`] holds the counters, the published rules and the violations log (memory, Redis,
//! Redis Cluster: all Redis knowledge lives there), [`rules_source`] keeps every node on the
//! published rules, [`housekeeping`] sweeps expired state and overrides, and [`breaker`] and
//! [`store::memory`] fallback buckets keep answering when the store does not. A node in one
//! of several regions decides global rules from quota it leases from a global store in the
//! background ([`region`]). The operator's console reads [`console`] (this node's rates
//! and top refused identities) and the admin API's [`admin`] endpoints. [`trace`] exports a span per check over OTLP
//! when configured.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod admin;
pub mod breaker;
pub mod check;
pub mod clock;
pub mod console;
pub mod decide;
pub mod edge;
pub mod exchange;
pub mod grpc;
pub mod housekeeping;
pub mod http;
pub mod lease;
pub mod listen;
pub mod metrics;
pub mod node;
pub mod owed;
pub mod quota;
pub mod refusals;
pub mod region;
pub mod rules_source;
pub mod slots;
pub mod store;
pub mod trace;
pub mod violations;
