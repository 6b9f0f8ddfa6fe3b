//! The host's clock.

use sluice_core::time::micros_from_duration;
use sluice_core::Micros;

use crate::host;

/// Now in unix microseconds, from the host clock (0 if the host has none to give).
pub fn now_us() -> Micros {
    host::now_ns().map_or(0, |ns| micros_from_duration(std::time::Duration::from_nanos(ns)))
}
