//! Sluice's proxy-wasm rate-limit filter for Envoy and Nginx (ngx_wasm_module).
//!
//! Per request: read the identities, take a token from the client's local bucket (a local
//! deny answers 429 at once), then ask the check service (`POST /v1/check`) and pause until
//! it answers: 429 with the rate-limit headers, or forward (after a shaping delay, if any)
//! and add the headers to the response. When the check service fails, the failure policy
//! answers, and a circuit breaker stops calling a dead service.
//!
//! One root context per VM (`root`) builds the state its streams share (`shared`: the
//! configuration, the buckets, the breaker, the metric ids); each HTTP stream gets a
//! `stream` context over it. The modules depend one way: `root` → `stream` → `answer`,
//! `host`, `clock`, `metrics`, `shared`, `buckets`, `identity`, `config`.

mod answer;
pub mod buckets;
mod clock;
pub mod config;
mod host;
pub mod identity;
mod leases;
mod metrics;
mod root;
mod shared;
mod stream;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::default()) });
}}
