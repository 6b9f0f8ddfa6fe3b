//! The host's clock.

use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use sluice_core::time::micros_from_duration;
use sluice_core::Micros;

/// Now in unix microseconds, from the host clock (0 if the host has none to give).
pub fn now_us() -> Micros {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, micros_from_duration)
}
