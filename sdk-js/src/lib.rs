//! `sluice-core` for JavaScript, through `wasm-bindgen`.
//!
//! The npm package `sluice-client` (in this directory) is a thin layer over `fetch`; every
//! decision it makes — what a response's rate-limit headers say, when the next request may
//! go, how long to back off, whether the retry budget allows one more — is made here, by
//! the same code as the Rust SDK's, so both SDKs behave the same.
//!
//! Numbers cross the boundary as JavaScript numbers (`f64`): milliseconds and counts far
//! below 2^53. Negative, NaN or infinite inputs count as 0.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sluice_core::backoff::{Backoff as CoreBackoff, BackoffPolicy, Jitter, SplitMix64};
use sluice_core::headers::{self, HeaderMode};
use sluice_core::{Algorithm, Limit, Micros, State};
use sluice_pace::headers::{self as read, RateLimitInfo};
use sluice_pace::pacing::{BucketPacer, Cost, PacerConfig};
use sluice_pace::retry::{self, BudgetConfig, RetryBudget as CoreBudget};
use wasm_bindgen::prelude::*;

/// A JavaScript number as a count or a duration in milliseconds.
fn whole(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x as u64 // saturating
    } else {
        0
    }
}

fn num(x: u64) -> f64 {
    x as f64
}

/// The quota a response advertises (see `sluice_pace::headers::RateLimitInfo`); every
/// field is `undefined` when the response did not say.
#[wasm_bindgen]
#[derive(Debug, Clone, Default)]
pub struct Quota(RateLimitInfo);

#[wasm_bindgen]
impl Quota {
    /// Requests per window.
    #[wasm_bindgen(getter)]
    pub fn limit(&self) -> Option<f64> {
        self.0.limit.map(num)
    }
    /// Requests left.
    #[wasm_bindgen(getter)]
    pub fn remaining(&self) -> Option<f64> {
        self.0.remaining.map(num)
    }
    /// Milliseconds until the quota resets.
    #[wasm_bindgen(getter, js_name = resetAfterMs)]
    pub fn reset_after_ms(&self) -> Option<f64> {
        self.0.reset_after_ms.map(num)
    }
    /// Milliseconds the server asked the client to wait.
    #[wasm_bindgen(getter, js_name = retryAfterMs)]
    pub fn retry_after_ms(&self) -> Option<f64> {
        self.0.retry_after_ms.map(num)
    }
    /// The IETF policy name.
    #[wasm_bindgen(getter)]
    pub fn policy(&self) -> Option<String> {
        self.0.policy.clone()
    }
    /// The policy's window in milliseconds.
    #[wasm_bindgen(getter, js_name = windowMs)]
    pub fn window_ms(&self) -> Option<f64> {
        self.0.window_ms.map(num)
    }
    /// The limit covers every route of the client (Discord's `X-RateLimit-Global`).
    #[wasm_bindgen(getter)]
    pub fn global(&self) -> bool {
        self.0.global
    }
    /// The IETF partition key (`pk`) of the policy, as sent.
    #[wasm_bindgen(getter)]
    pub fn partition(&self) -> Option<String> {
        self.0.partition.clone()
    }
    /// The bucket the server counts this response in: the policy, with its partition key.
    #[wasm_bindgen(getter, js_name = bucketName)]
    pub fn bucket_name(&self) -> Option<String> {
        self.0.bucket_name()
    }
    /// The units of the quotas reported besides requests (`tokens`, …), for `unitQuota`.
    #[wasm_bindgen(getter)]
    pub fn units(&self) -> Vec<String> {
        self.0.quotas.iter().map(|q| q.unit.clone()).collect()
    }
    /// The quota counted in `unit`, if the response reported one (its `limit`,
    /// `remaining`, `resetAfterMs`, `windowMs` and `policy` in that unit).
    #[wasm_bindgen(js_name = unitQuota)]
    pub fn unit_quota(&self, unit: &str) -> Option<Quota> {
        self.0.quota(unit).map(|q| Quota(q.to_info()))
    }
    /// What the server asked the client to wait before retrying: its `Retry-After`, or the
    /// reset of a spent quota.
    #[wasm_bindgen(js_name = serverFloorMs)]
    pub fn server_floor_ms(&self) -> Option<f64> {
        retry::server_floor_ms(&self.0).map(num)
    }
}

/// A request's expected cost from JavaScript: `units[i]` goes with `amounts[i]`.
fn cost(units: Vec<String>, amounts: Vec<f64>) -> Cost {
    units
        .iter()
        .zip(amounts)
        .fold(Cost::new(), |cost, (unit, amount)| cost.with(unit, whole(amount)))
}

/// Reads a response's rate-limit headers (`X-RateLimit-*`, IETF `RateLimit` /
/// `RateLimit-Policy`, `Retry-After` and common variants); `names[i]` goes with
/// `values[i]`. Malformed values are ignored, never an error.
#[wasm_bindgen(js_name = parseHeaders)]
pub fn parse_headers(status: u16, names: Vec<String>, values: Vec<String>, now_ms: f64) -> Quota {
    let pairs = names.iter().zip(&values).map(|(n, v)| (n.as_str(), v.as_str()));
    Quota(read::parse_headers(status, pairs, whole(now_ms)))
}

/// The headers a server sends for a quota (`mode`: `all`, `legacy`, `ietf` or `none`), as
/// `[name, value, name, value, …]`; `retryAfterMs` only on a denial.
#[wasm_bindgen(js_name = formatHeaders)]
#[allow(clippy::too_many_arguments)]
pub fn format_headers(
    mode: &str,
    policy: &str,
    limit: f64,
    remaining: f64,
    reset_after_ms: f64,
    window_ms: f64,
    retry_after_ms: Option<f64>,
    now_ms: f64,
) -> Result<Vec<String>, JsError> {
    let mode = match mode {
        "all" => HeaderMode::All,
        "legacy" => HeaderMode::Legacy,
        "ietf" => HeaderMode::Ietf,
        "none" => HeaderMode::None,
        other => {
            return Err(JsError::new(&format!(
                "unknown header mode {other:?}: use all, legacy, ietf or none"
            )))
        }
    };
    let quota = headers::Quota {
        policy,
        limit: whole(limit),
        remaining: whole(remaining),
        reset_after_ms: whole(reset_after_ms),
        window_ms: whole(window_ms),
        retry_after_ms: retry_after_ms.map(whole),
        now_ms: whole(now_ms),
    };
    let mut out = Vec::new();
    headers::format_headers(&quota, mode, &mut out);
    Ok(out.into_iter().flat_map(|(n, v)| [n.to_owned(), v]).collect())
}

/// Whether `method` may be sent twice with the same effect (GET, HEAD, OPTIONS, PUT, DELETE).
#[wasm_bindgen(js_name = isIdempotent)]
pub fn is_idempotent(method: &str) -> bool {
    retry::is_idempotent(method)
}

/// The SDKs' defaults, as JSON: `{"backoff": {...}, "budget": {...}, "pacer": {...}}`.
///
/// The JavaScript options start from these, so both SDKs share one set of defaults.
#[wasm_bindgen(js_name = defaultsJson)]
pub fn defaults_json() -> String {
    let b = retry::client_backoff();
    let budget = BudgetConfig::default();
    let pacer = PacerConfig::default();
    let jitter = match b.jitter {
        Jitter::Full => "full",
        Jitter::Decorrelated => "decorrelated",
    };
    format!(
        r#"{{"backoff":{{"baseMs":{},"capMs":{},"maxRetries":{},"maxElapsedMs":{},"jitter":"{jitter}"}},"budget":{{"ratio":{},"minRetries":{}}},"pacer":{{"reserve":{},"marginPercent":{}}}}}"#,
        b.base_ms,
        b.cap_ms,
        b.max_retries,
        b.max_elapsed_ms,
        budget.ratio,
        budget.min_retries,
        pacer.reserve,
        pacer.margin_percent
    )
}

/// A source of jitter shared by a client's retries (SplitMix64; not for secrets).
#[wasm_bindgen]
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

#[wasm_bindgen]
impl Rng {
    /// A generator seeded with `seed` (equal seeds give equal schedules).
    #[wasm_bindgen(constructor)]
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64(seed))
    }
}

/// The retry schedule of one request: full or decorrelated jitter after the server's floor.
#[wasm_bindgen]
#[derive(Debug, Clone)]
pub struct Backoff(CoreBackoff);

#[wasm_bindgen]
impl Backoff {
    /// A fresh schedule; `jitter` is `full` or `decorrelated`.
    #[wasm_bindgen(constructor)]
    pub fn new(
        base_ms: f64,
        cap_ms: f64,
        max_retries: f64,
        max_elapsed_ms: f64,
        jitter: &str,
    ) -> Result<Backoff, JsError> {
        let jitter = match jitter {
            "full" => Jitter::Full,
            "decorrelated" => Jitter::Decorrelated,
            other => {
                return Err(JsError::new(&format!(
                    "unknown jitter {other:?}: use full or decorrelated"
                )))
            }
        };
        Ok(Backoff(CoreBackoff::new(BackoffPolicy {
            base_ms: whole(base_ms),
            cap_ms: whole(cap_ms),
            max_retries: u32::try_from(whole(max_retries)).unwrap_or(u32::MAX),
            max_elapsed_ms: whole(max_elapsed_ms),
            jitter,
        })))
    }

    /// The delay before the next retry in milliseconds — `floorMs` (what the server asked
    /// for) plus jitter — or `undefined` to give up.
    #[wasm_bindgen(js_name = nextDelay)]
    pub fn next_delay(&mut self, elapsed_ms: f64, floor_ms: Option<f64>, rng: &mut Rng) -> Option<f64> {
        retry::retry_delay(&mut self.0, whole(elapsed_ms), floor_ms.map(whole), &mut rng.0).map(num)
    }

    /// Retries granted so far.
    #[wasm_bindgen(getter)]
    pub fn retries(&self) -> u32 {
        self.0.retries()
    }
}

/// A client's retry budget: retries at most `ratio` of requests, plus `minRetries`.
#[wasm_bindgen]
#[derive(Debug)]
pub struct RetryBudget(CoreBudget);

#[wasm_bindgen]
impl RetryBudget {
    /// A full budget.
    #[wasm_bindgen(constructor)]
    pub fn new(ratio: f64, min_retries: f64) -> RetryBudget {
        RetryBudget(CoreBudget::new(BudgetConfig {
            ratio,
            min_retries: u32::try_from(whole(min_retries)).unwrap_or(u32::MAX),
        }))
    }
    /// Records a new request (not a retry).
    pub fn deposit(&self) {
        self.0.deposit();
    }
    /// Takes one retry; `false` when none is left.
    #[wasm_bindgen(js_name = tryWithdraw)]
    pub fn try_withdraw(&self) -> bool {
        self.0.try_withdraw()
    }
    /// Whole retries available now.
    #[wasm_bindgen(getter)]
    pub fn available(&self) -> f64 {
        num(self.0.available())
    }
}

/// The pacing state of one bucket: when may its next request go, on every quota its
/// responses report (requests, and tokens or other units at a request's expected cost:
/// `units[i]` is expected to cost `amounts[i]`, any other unit 1).
#[wasm_bindgen]
#[derive(Debug, Clone)]
pub struct Pacer(BucketPacer);

#[wasm_bindgen]
impl Pacer {
    /// A pacer that knows nothing yet.
    #[wasm_bindgen(constructor)]
    pub fn new(reserve: f64, margin_percent: f64) -> Pacer {
        Pacer(BucketPacer::new(PacerConfig {
            reserve: whole(reserve),
            margin_percent: whole(margin_percent),
        }))
    }
    /// Records a request sent at `nowMs`; returns its ticket for `observe`/`onFailure`.
    #[wasm_bindgen(js_name = onSend)]
    pub fn on_send(&mut self, now_ms: f64, units: Vec<String>, amounts: Vec<f64>) -> f64 {
        num(self.0.on_send(whole(now_ms), &cost(units, amounts)))
    }
    /// Records that the request with `ticket` got no response.
    #[wasm_bindgen(js_name = onFailure)]
    pub fn on_failure(&mut self, ticket: f64) {
        self.0.on_failure(whole(ticket));
    }
    /// Records a response's quota, received at `nowMs`, to the request with `ticket`.
    pub fn observe(&mut self, quota: &Quota, now_ms: f64, ticket: f64) {
        self.0.observe(&quota.0, whole(now_ms), whole(ticket));
    }
    /// Whether the requests quota is learned from the server's refusals, its answers giving
    /// none: a refused request then queues again rather than being retried.
    pub fn adapts(&self) -> bool {
        self.0.adapts()
    }
    /// The earliest time the next request may go (`nowMs` or later), or `undefined` to
    /// wait for an answer to a request in flight.
    #[wasm_bindgen(js_name = nextSendAt)]
    pub fn next_send_at(&self, now_ms: f64, units: Vec<String>, amounts: Vec<f64>) -> Option<f64> {
        self.0.next_send_at(whole(now_ms), &cost(units, amounts)).map(num)
    }
}

/// One limit of `sluice-core` (any algorithm), for servers and tests written in JavaScript.
#[wasm_bindgen]
#[derive(Debug, Clone)]
pub struct Limiter {
    limit: Limit,
    state: State,
}

/// The outcome of [`Limiter::decide`].
#[wasm_bindgen]
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    /// Whether the request may pass.
    pub allowed: bool,
    /// Requests per window.
    pub limit: f64,
    /// Requests left after this one.
    pub remaining: f64,
    /// Milliseconds until the quota is whole again (rounded up).
    #[wasm_bindgen(js_name = resetAfterMs)]
    pub reset_after_ms: f64,
    /// Milliseconds to wait before the same request would pass (0 when allowed; rounded up).
    #[wasm_bindgen(js_name = retryAfterMs)]
    pub retry_after_ms: f64,
}

#[wasm_bindgen]
impl Limiter {
    /// `limit` requests per `windowMs` with `algorithm` (`token_bucket`, `gcra`,
    /// `leaky_bucket`, `fixed_window`, `sliding_window_log`, `sliding_window_counter`);
    /// `burst` 0 means `limit`.
    #[wasm_bindgen(constructor)]
    pub fn new(algorithm: &str, limit: f64, window_ms: f64, burst: f64) -> Result<Limiter, JsError> {
        let algorithm: Algorithm = algorithm.parse().map_err(|e| JsError::new(&format!("{e}")))?;
        let window = Micros::from_ms(whole(window_ms));
        let limit = Limit::builder(algorithm, whole(limit), window)
            .burst(whole(burst))
            .build()
            .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(Limiter {
            limit,
            state: State::default(),
        })
    }

    /// Decides a request of weight `cost` at `nowMs` (any monotonic clock).
    pub fn decide(&mut self, now_ms: f64, cost: f64) -> Decision {
        let d = self
            .limit
            .decide(&mut self.state, Micros::from_ms(whole(now_ms)), whole(cost).max(1));
        Decision {
            allowed: d.allowed,
            limit: num(d.limit),
            remaining: num(d.remaining),
            reset_after_ms: num(d.reset_after.wait_ms()),
            retry_after_ms: num(d.retry_after.wait_ms()),
        }
    }

    /// The window in milliseconds.
    #[wasm_bindgen(getter, js_name = windowMs)]
    pub fn window_ms(&self) -> f64 {
        num(self.limit.window().instant_ms())
    }
}
