//! Sluice's check service: stateless nodes that decide rate limits over a counter store.
//!
//! The binary (`sluice-service`) wires these modules together: [`http`] serves
//! `POST /v1/check` and the admin API, [`check`] evaluates a request against the rules,
//! [`store`] holds the counters (memory, Redis, Redis Cluster), [`breaker`] and
//! [`store::memory`] fallback buckets keep answering when the store does not.

pub mod breaker;
pub mod check;
pub mod clock;
pub mod http;
pub mod metrics;
pub mod node;
pub mod rules_source;
pub mod store;
pub mod violations;
