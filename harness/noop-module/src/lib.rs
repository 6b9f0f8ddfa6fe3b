//! A proxy-wasm module that does nothing: every request and response goes on at once.
//!
//! The baseline of `scripts/bench-envoy` and `scripts/bench-real-nginx`: loaded where
//! Sluice's filter is, with the same VM configuration, it costs a proxy what any proxy-wasm
//! filter costs before it does any work (a VM per worker, a context per stream, a call into
//! the VM per callback), so the filter's own cost is what it adds to this.
//!
//! It speaks the proxy-wasm ABI 0.2.1 itself, as the filter does (`filter/src/exports.rs`),
//! without the SDK: it exports every callback Envoy and ngx_wasm_module may call, each
//! answering what the SDK answers by default (`Continue`, `true`), and calls the host for
//! nothing: it reads no configuration, header or property, and keeps no state.

// The module's only `unsafe`: the exports' `#[no_mangle]` names, which the host calls.
#[allow(unsafe_code, reason = "`#[no_mangle]` exports are the proxy-wasm ABI the host calls")]
mod exports;
