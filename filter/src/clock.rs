//! The host's clock.

use sluice_core::Micros;

use crate::host;

/// Now since the unix epoch, from the host clock (0 if the host has none to give).
pub fn now_us() -> Micros {
    host::now_ns().map_or(Micros::ZERO, |ns| {
        Micros::from_duration(std::time::Duration::from_nanos(ns))
    })
}
