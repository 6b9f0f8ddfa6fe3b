//! One limit of `sluice-core` (any algorithm), for servers and tests written in Python:
//! the test suite's local server enforces its quota with it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use sluice_core::{Algorithm, Limit, Micros, State};

/// `limit` requests per `window_ms` with `algorithm` (`token_bucket`, `gcra`,
/// `leaky_bucket`, `fixed_window`, `sliding_window_log`, `sliding_window_counter`);
/// `burst` 0 means `limit`.
#[pyclass(module = "sluice_client._core")]
#[derive(Debug, Clone)]
pub struct Limiter {
    limit: Limit,
    state: State,
}

/// The outcome of [`Limiter::decide`].
#[pyclass(frozen, module = "sluice_client._core")]
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    /// Whether the request may pass.
    #[pyo3(get)]
    allowed: bool,
    /// Requests per window.
    #[pyo3(get)]
    limit: u64,
    /// Requests left after this one.
    #[pyo3(get)]
    remaining: u64,
    /// Milliseconds until the quota is whole again (rounded up).
    #[pyo3(get)]
    reset_after_ms: u64,
    /// Milliseconds to wait before the same request would pass (0 when allowed).
    #[pyo3(get)]
    retry_after_ms: u64,
}

#[pymethods]
impl Limiter {
    #[new]
    #[pyo3(signature = (algorithm, limit, window_ms, burst = 0))]
    fn new(algorithm: &str, limit: u64, window_ms: u64, burst: u64) -> PyResult<Limiter> {
        let algorithm: Algorithm = algorithm.parse().map_err(|e| PyValueError::new_err(format!("{e}")))?;
        let limit = Limit::builder(algorithm, limit, Micros::from_ms(window_ms))
            .burst(burst)
            .build()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Limiter {
            limit,
            state: State::default(),
        })
    }

    /// Decides a request of weight `cost` (at least 1) at `now_ms` (any monotonic clock).
    #[pyo3(signature = (now_ms, cost = 1))]
    fn decide(&mut self, now_ms: u64, cost: u64) -> Decision {
        let d = self.limit.decide(&mut self.state, Micros::from_ms(now_ms), cost.max(1));
        Decision {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_ms: d.reset_after.wait_ms(),
            retry_after_ms: d.retry_after.wait_ms(),
        }
    }
}
