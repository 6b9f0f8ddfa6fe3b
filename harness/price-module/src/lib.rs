//! A proxy-wasm module that makes one kind of host call K times a request, and nothing else.
//!
//! `scripts/bench-envoy`'s `price:KIND:K` cases load it where Sluice's filter is, with the
//! same VM configuration, at several K: the rate's fall from the no-op module
//! (`harness/noop-module`) as K grows is what one call of that kind costs the host. The
//! plugin configuration is `KIND K`, the kinds being [`Kind`]'s.
//!
//! Like the no-op module and the filter, it speaks the proxy-wasm ABI 0.2.1 itself, without
//! the SDK: what it costs beyond the no-op module is the calls it makes, a loop, and the
//! memory the host hands back (freed at once, as the filter frees it).

// The module's only `unsafe`: the exports the host calls and the imports it calls.
#[allow(unsafe_code, reason = "the proxy-wasm ABI: `#[no_mangle]` exports, `extern` imports")]
mod abi;
mod kind;

pub use kind::Kind;
