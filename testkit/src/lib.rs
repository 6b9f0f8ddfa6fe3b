//! Test fixtures: free loopback ports, child processes killed when the fixture drops (even
//! when a test panics), and real `redis-server` instances and clusters on loopback.

mod process;
mod redis;

pub use process::{free_port, wait_for_port, Child, Stopped};
pub use redis::{RedisCluster, RedisServer};
