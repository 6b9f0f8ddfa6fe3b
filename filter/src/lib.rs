//! Sluice's proxy-wasm rate-limit filter for Envoy and Nginx (ngx_wasm_module).
//!
//! Per request: read the identities, take a token from the client's local bucket (a local
//! deny answers 429 at once), then ask the check service (`POST /v1/check`) and pause until
//! it answers: 429 with the rate-limit headers, or forward (after a shaping delay, if any)
//! and add the headers to the response. When the check service fails, the failure policy
//! answers, and a circuit breaker stops calling a dead service.
//!
//! One root context per VM holds the configuration, the buckets and the breaker; each HTTP
//! stream gets a [`stream::Stream`] context.

pub mod breaker;
pub mod buckets;
pub mod config;
pub mod identity;
mod root;
mod stream;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::default()) });
}}
