//! What a response's rate-limit headers say: `sluice_pace::headers::parse_headers` and the
//! quota it reads, as Python objects.

use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use sluice_pace::headers::{self, RateLimitInfo as CoreInfo, UnitQuota as CoreUnit};
use sluice_pace::retry;

/// The quota a response advertised; a field is `None` when no header gave it. The fields
/// are the requests quota; `quotas` holds those counted in other units (tokens, …).
#[pyclass(frozen, eq, module = "sluice_client._core")]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateLimitInfo(pub CoreInfo);

/// A quota counted in another unit than requests (`tokens`, `input-tokens`, …); its
/// fields are those of `sluice_core::headers::UnitQuota`.
#[pyclass(frozen, eq, get_all, module = "sluice_client._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct UnitQuota {
    /// `tokens`, `input-tokens`, `output-tokens`, or an IETF `qu` such as `content-bytes`.
    unit: String,
    /// Units per window.
    limit: Option<u64>,
    /// Units left.
    remaining: Option<u64>,
    /// Milliseconds until the quota resets.
    reset_after_ms: Option<u64>,
    /// The IETF policy's window in milliseconds.
    window_ms: Option<u64>,
    /// The IETF policy's name.
    policy: Option<String>,
}

impl From<&CoreUnit> for UnitQuota {
    fn from(q: &CoreUnit) -> UnitQuota {
        UnitQuota {
            unit: q.unit.clone(),
            limit: q.limit,
            remaining: q.remaining,
            reset_after_ms: q.reset_after_ms,
            window_ms: q.window_ms,
            policy: q.policy.clone(),
        }
    }
}

#[pymethods]
impl RateLimitInfo {
    /// Requests per window.
    #[getter]
    fn limit(&self) -> Option<u64> {
        self.0.limit
    }
    /// Requests left in the window.
    #[getter]
    fn remaining(&self) -> Option<u64> {
        self.0.remaining
    }
    /// Milliseconds until the quota resets.
    #[getter]
    fn reset_after_ms(&self) -> Option<u64> {
        self.0.reset_after_ms
    }
    /// Milliseconds the server asked the client to wait (`Retry-After`).
    #[getter]
    fn retry_after_ms(&self) -> Option<u64> {
        self.0.retry_after_ms
    }
    /// The name the server gives the quota (IETF policy, Discord bucket, GitHub resource).
    #[getter]
    fn policy(&self) -> Option<String> {
        self.0.policy.clone()
    }
    /// The policy's window in milliseconds.
    #[getter]
    fn window_ms(&self) -> Option<u64> {
        self.0.window_ms
    }
    /// The limit covers every route of the client (Discord's `X-RateLimit-Global`); named
    /// with a trailing underscore because `global` is a Python keyword.
    #[getter]
    fn global_(&self) -> bool {
        self.0.global
    }
    /// The IETF partition key (`pk`) of the policy, as sent.
    #[getter]
    fn partition(&self) -> Option<String> {
        self.0.partition.clone()
    }
    /// The quotas counted in other units than requests, one per unit.
    #[getter]
    fn quotas(&self) -> Vec<UnitQuota> {
        self.0.quotas.iter().map(UnitQuota::from).collect()
    }
    /// The bucket the server counts this response in: the policy, with its partition key.
    #[getter]
    fn bucket_name(&self) -> Option<String> {
        self.0.bucket_name()
    }
    /// What the server asked the client to wait before retrying: its `Retry-After`, or the
    /// reset of a spent quota.
    #[getter]
    fn server_floor_ms(&self) -> Option<u64> {
        retry::server_floor_ms(&self.0)
    }
    /// The quota counted in `unit`, if the response gave one.
    fn quota(&self, unit: &str) -> Option<UnitQuota> {
        self.0.quota(unit).map(UnitQuota::from)
    }
    /// Whether no rate-limit header was read.
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The fields as a dict (`global` under its own name), `quotas` as a list of dicts.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = &self.0;
        let d = PyDict::new(py);
        d.set_item("limit", i.limit)?;
        d.set_item("remaining", i.remaining)?;
        d.set_item("reset_after_ms", i.reset_after_ms)?;
        d.set_item("retry_after_ms", i.retry_after_ms)?;
        d.set_item("policy", i.policy.as_deref())?;
        d.set_item("window_ms", i.window_ms)?;
        d.set_item("global", i.global)?;
        d.set_item("partition", i.partition.as_deref())?;
        let quotas = i
            .quotas
            .iter()
            .map(|q| UnitQuota::from(q).to_dict(py))
            .collect::<PyResult<Vec<_>>>()?;
        d.set_item("quotas", quotas)?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!("RateLimitInfo({:?})", self.0)
    }
}

#[pymethods]
impl UnitQuota {
    /// The fields as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("unit", &self.unit)?;
        d.set_item("limit", self.limit)?;
        d.set_item("remaining", self.remaining)?;
        d.set_item("reset_after_ms", self.reset_after_ms)?;
        d.set_item("window_ms", self.window_ms)?;
        d.set_item("policy", self.policy.as_deref())?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

/// A header name or value as text: `str`, or UTF-8 `bytes` (`None` for other bytes, which
/// no rate-limit header holds).
fn text(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Some(s.to_cow()?.into_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(std::str::from_utf8(b.as_bytes()).ok().map(str::to_owned));
    }
    Err(PyTypeError::new_err(format!(
        "a header name or value must be str or bytes, not {}",
        obj.get_type().name()?
    )))
}

/// One `(name, value)` pair.
fn pair(item: &Bound<'_, PyAny>) -> PyResult<Option<(String, String)>> {
    let (name, value) = if let Ok(t) = item.cast::<PyTuple>() {
        if t.len() != 2 {
            return Err(PyTypeError::new_err("a header must be a (name, value) pair"));
        }
        (t.get_item(0)?, t.get_item(1)?)
    } else {
        let mut it = item.try_iter()?;
        match (it.next(), it.next(), it.next()) {
            (Some(n), Some(v), None) => (n?, v?),
            _ => return Err(PyTypeError::new_err("a header must be a (name, value) pair")),
        }
    };
    Ok(text(&name)?.zip(text(&value)?))
}

/// The client's wall clock in Unix milliseconds.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads a response's rate-limit headers (`X-RateLimit-*`, IETF `RateLimit` /
/// `RateLimit-Policy`, `Retry-After` and the variants real APIs send). `headers` is a
/// mapping or an iterable of `(name, value)` pairs of `str` or `bytes`; repeated lines
/// should come as separate pairs. `now_ms`: Unix milliseconds (default: now), for dates
/// and epoch resets. Malformed values are ignored, never an error.
#[pyfunction]
#[pyo3(signature = (status, headers, now_ms = None))]
pub fn parse_headers(status: u16, headers: &Bound<'_, PyAny>, now_ms: Option<u64>) -> PyResult<RateLimitInfo> {
    let items = if headers.hasattr("items")? {
        headers.call_method0("items")?
    } else {
        headers.clone()
    };
    let mut pairs = Vec::new();
    for item in items.try_iter()? {
        if let Some(p) = pair(&item?)? {
            pairs.push(p);
        }
    }
    let view = pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    Ok(RateLimitInfo(headers::parse_headers(
        status,
        view,
        now_ms.unwrap_or_else(unix_ms),
    )))
}
