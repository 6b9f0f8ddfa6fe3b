//! `sluice-core` for Python, through PyO3: the extension module `sluice_client._core`.
//!
//! The Python package `sluice-client` (`python/sluice_client/`) is a thin layer over httpx
//! and requests; every decision it makes — what a response's rate-limit headers say, when a
//! bucket's next request may go, how long to back off, whether the retry budget allows one
//! more — is made here, by the same code as the Rust and JavaScript SDKs', so the three
//! behave the same. Python only queues, sleeps and sends.
//!
//! Times are milliseconds as Python `int`s; a negative or oversized one is refused by PyO3
//! with an `OverflowError`, never wrapped.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use pyo3::prelude::*;

mod limiter;
mod pacer;
mod quota;
mod retry;

/// The extension module: its classes and functions are re-exported by `sluice_client`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<quota::RateLimitInfo>()?;
    m.add_class::<quota::UnitQuota>()?;
    m.add_function(wrap_pyfunction!(quota::parse_headers, m)?)?;
    m.add_class::<pacer::Cost>()?;
    m.add_class::<pacer::Pacer>()?;
    m.add_class::<retry::Rng>()?;
    m.add_class::<retry::Backoff>()?;
    m.add_class::<retry::RetryBudget>()?;
    m.add_function(wrap_pyfunction!(retry::is_idempotent, m)?)?;
    m.add_function(wrap_pyfunction!(retry::defaults, m)?)?;
    m.add_class::<limiter::Limiter>()?;
    m.add_class::<limiter::Decision>()?;
    Ok(())
}
