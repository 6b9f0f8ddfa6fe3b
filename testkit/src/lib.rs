//! Test fixtures: free loopback ports, child processes killed when the fixture drops (even
//! when a test panics), real `redis-server` instances and clusters on loopback, and the
//! workspace's wasm modules built for the tests that load them, scratch directories, and a
//! WAN link (a delaying TCP relay that can be cut).

mod process;
mod redis;
mod scratch;
mod wan;
mod wasm;

pub use process::{free_port, wait_for_port, Child, Stopped};
pub use redis::{evalsha_calls, reset_stats, script_calls, RedisCluster, RedisServer};
pub use scratch::ScratchDir;
pub use wan::WanLink;
pub use wasm::{wasm_module, wasm_module_bytes};
