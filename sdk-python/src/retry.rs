//! When a request is retried and after how long: `sluice_core`'s backoff schedule placed
//! after the server's floor, the retry budget, which methods are idempotent, and the
//! defaults every SDK shares.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_core::backoff::{Backoff as CoreBackoff, BackoffPolicy, Jitter, SplitMix64};
use sluice_pace::pacing::PacerConfig;
use sluice_pace::retry::{self, BudgetConfig, RetryBudget as CoreBudget};

/// A source of jitter shared by a client's retries (SplitMix64; not for secrets).
#[pyclass(module = "sluice_client._core")]
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

#[pymethods]
impl Rng {
    /// A generator seeded with `seed` (equal seeds give equal schedules).
    #[new]
    fn new(seed: u64) -> Rng {
        Rng(SplitMix64(seed))
    }
}

fn jitter_named(name: &str) -> PyResult<Jitter> {
    match name {
        "full" => Ok(Jitter::Full),
        "decorrelated" => Ok(Jitter::Decorrelated),
        other => Err(PyValueError::new_err(format!(
            "unknown jitter {other:?}: use \"full\" or \"decorrelated\""
        ))),
    }
}

fn jitter_name(jitter: Jitter) -> &'static str {
    match jitter {
        Jitter::Full => "full",
        Jitter::Decorrelated => "decorrelated",
    }
}

/// The retry schedule of one request: full or decorrelated jitter after the server's floor.
#[pyclass(module = "sluice_client._core")]
#[derive(Debug, Clone)]
pub struct Backoff(CoreBackoff);

#[pymethods]
impl Backoff {
    /// A fresh schedule; `jitter` is `"full"` or `"decorrelated"`.
    #[new]
    fn new(base_ms: u64, cap_ms: u64, max_retries: u32, max_elapsed_ms: u64, jitter: &str) -> PyResult<Backoff> {
        Ok(Backoff(CoreBackoff::new(BackoffPolicy {
            base_ms,
            cap_ms,
            max_retries,
            max_elapsed_ms,
            jitter: jitter_named(jitter)?,
        })))
    }
    /// The delay before the next retry in milliseconds — `floor_ms` (what the server asked
    /// for) plus jitter — or `None` to give up.
    fn next_delay(&mut self, elapsed_ms: u64, floor_ms: Option<u64>, mut rng: PyRefMut<'_, Rng>) -> Option<u64> {
        retry::retry_delay(&mut self.0, elapsed_ms, floor_ms, &mut rng.0)
    }
    /// Retries granted so far.
    #[getter]
    fn retries(&self) -> u32 {
        self.0.retries()
    }
}

/// A client's retry budget: retries at most `ratio` of requests, plus `min_retries`.
/// Safe to share between threads.
#[pyclass(frozen, module = "sluice_client._core")]
#[derive(Debug)]
pub struct RetryBudget(CoreBudget);

#[pymethods]
impl RetryBudget {
    /// A full budget.
    #[new]
    fn new(ratio: f64, min_retries: u32) -> RetryBudget {
        RetryBudget(CoreBudget::new(BudgetConfig { ratio, min_retries }))
    }
    /// Records a new request (not a retry).
    fn deposit(&self) {
        self.0.deposit();
    }
    /// Takes one retry; `False` when none is left.
    fn try_withdraw(&self) -> bool {
        self.0.try_withdraw()
    }
    /// Whole retries available now.
    #[getter]
    fn available(&self) -> u64 {
        self.0.available()
    }
}

/// Whether `method` may be sent twice with the same effect (GET, HEAD, OPTIONS, PUT, DELETE).
#[pyfunction]
pub fn is_idempotent(method: &str) -> bool {
    retry::is_idempotent(method)
}

/// The SDKs' shared defaults: `{"backoff": {...}, "budget": {...}, "pacer": {...}}`, with
/// the Rust SDK's field names. The Python options start from these.
#[pyfunction]
pub fn defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let b = retry::client_backoff();
    let backoff = PyDict::new(py);
    backoff.set_item("base_ms", b.base_ms)?;
    backoff.set_item("cap_ms", b.cap_ms)?;
    backoff.set_item("max_retries", b.max_retries)?;
    backoff.set_item("max_elapsed_ms", b.max_elapsed_ms)?;
    backoff.set_item("jitter", jitter_name(b.jitter))?;
    let budget = BudgetConfig::default();
    let budget_dict = PyDict::new(py);
    budget_dict.set_item("ratio", budget.ratio)?;
    budget_dict.set_item("min_retries", budget.min_retries)?;
    let pacer = PacerConfig::default();
    let pacer_dict = PyDict::new(py);
    pacer_dict.set_item("reserve", pacer.reserve)?;
    pacer_dict.set_item("margin_percent", pacer.margin_percent)?;
    let all = PyDict::new(py);
    all.set_item("backoff", backoff)?;
    all.set_item("budget", budget_dict)?;
    all.set_item("pacer", pacer_dict)?;
    Ok(all)
}
