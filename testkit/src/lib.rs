//! Test fixtures: free loopback ports, child processes killed when the fixture drops (even
//! when a test panics), real `redis-server` instances, clusters and Sentinel sets on loopback
//! (in plain text or TLS, open or behind an ACL user) with the TLS material they need, the
//! workspace's wasm modules built for the tests that load them, scratch directories, and a
//! WAN link (a delaying TCP relay that can be cut).
// Test support: a failed fixture is a failed test, so it may panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod process;
mod redis;
mod scratch;
mod sentinel;
mod tls;
mod wan;
mod wasm;

pub use process::{free_port, wait_for_port, Child, Stopped};
pub use redis::{check_calls, reset_stats, script_calls, RedisCluster, RedisOptions, RedisServer};
pub use scratch::ScratchDir;
pub use sentinel::RedisSentinel;
pub use tls::TlsFiles;
pub use wan::WanLink;
pub use wasm::{cargo_env, wasm_module, wasm_module_bytes};
