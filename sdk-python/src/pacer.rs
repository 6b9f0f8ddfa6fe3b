//! When a bucket's next request may go: `sluice_pace::pacing::BucketPacer` and the expected
//! [`Cost`] of a request, as Python objects.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use sluice_pace::pacing::{BucketPacer, Cost as CoreCost, PacerConfig};

use crate::quota::RateLimitInfo;

/// What a request is expected to spend of the quotas counted in other units than requests,
/// e.g. `Cost({"tokens": 1200})`; a unit not named costs 1.
#[pyclass(frozen, module = "sluice_client._core")]
#[derive(Debug, Clone, Default)]
pub struct Cost(CoreCost);

#[pymethods]
impl Cost {
    #[new]
    #[pyo3(signature = (units = None))]
    fn new(units: Option<BTreeMap<String, u64>>) -> Cost {
        let units = units.unwrap_or_default();
        Cost(units.iter().fold(CoreCost::new(), |c, (unit, &n)| c.with(unit, n)))
    }
    /// The expected amount of `unit` (1 when not given).
    fn of(&self, unit: &str) -> u64 {
        self.0.of(unit)
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// The pacing state of one bucket, on every quota its responses report: requests, and
/// tokens or other units at a request's expected [`Cost`]. Times are the caller's
/// monotonic clock in milliseconds.
#[pyclass(module = "sluice_client._core")]
#[derive(Debug, Clone)]
pub struct Pacer(BucketPacer);

/// The cost given, or 1 of every unit.
fn cost_of(cost: Option<PyRef<'_, Cost>>) -> CoreCost {
    cost.map(|c| c.0.clone()).unwrap_or_default()
}

#[pymethods]
impl Pacer {
    /// A pacer that knows nothing yet: its first request goes at once, the others wait for
    /// its answer.
    #[new]
    #[pyo3(signature = (reserve = PacerConfig::default().reserve, margin_percent = PacerConfig::default().margin_percent))]
    fn new(reserve: u64, margin_percent: u64) -> Pacer {
        Pacer(BucketPacer::new(PacerConfig {
            reserve,
            margin_percent,
        }))
    }
    /// The earliest time a request of `cost` may go (`now_ms` or later), or `None` to wait
    /// for an answer to a request in flight.
    #[pyo3(signature = (now_ms, cost = None))]
    fn next_send_at(&self, now_ms: u64, cost: Option<PyRef<'_, Cost>>) -> Option<u64> {
        self.0.next_send_at(now_ms, &cost_of(cost))
    }
    /// Records a request of `cost` sent at `now_ms`; returns its ticket.
    #[pyo3(signature = (now_ms, cost = None))]
    fn on_send(&mut self, now_ms: u64, cost: Option<PyRef<'_, Cost>>) -> u64 {
        self.0.on_send(now_ms, &cost_of(cost))
    }
    /// Records that the request with `ticket` got no response.
    fn on_failure(&mut self, ticket: u64) {
        self.0.on_failure(ticket);
    }
    /// Records a response's quota, received at `now_ms`, to the request with `ticket`.
    fn observe(&mut self, info: PyRef<'_, RateLimitInfo>, now_ms: u64, ticket: u64) {
        self.0.observe(&info.0, now_ms, ticket);
    }
    /// Whether the requests quota is learned from the server's refusals, its answers giving
    /// none: a refused request then queues again rather than being retried.
    #[getter]
    fn adapts(&self) -> bool {
        self.0.adapts()
    }
    /// Requests sent and not yet answered.
    #[getter]
    fn in_flight(&self) -> u64 {
        self.0.in_flight()
    }
}
