//! End-to-end fixtures for Sluice: the whole chain as real processes on loopback, and a
//! plain HTTP/1.1 client that can also send what a correct client never would.
// Test support: a failed fixture is a failed test, so it may panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod build;
pub mod chain;
pub mod dns;
pub mod envoy;
pub mod http;
pub mod regions;
