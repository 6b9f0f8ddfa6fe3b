//! When a request is retried, and after how long.
//!
//! The schedule, the server's floor, which methods are idempotent and the retry budget are
//! `sluice-core`'s (shared with the JavaScript SDK); this module applies them to `reqwest`
//! requests and outcomes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Request, StatusCode};
use sluice_core::backoff::{BackoffPolicy, RandomSource, SplitMix64};
pub use sluice_pace::retry::IDEMPOTENCY_KEY;
use sluice_pace::retry::{client_backoff, is_idempotent};

/// Which requests and outcomes are retried, and on what schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The backoff schedule: base, cap, max retries, max elapsed time and jitter.
    pub backoff: BackoffPolicy,
    /// Response statuses that are retried (default: 429 and 503).
    pub statuses: Vec<StatusCode>,
    /// Whether a failure to connect is retried (default: yes).
    pub connection_errors: bool,
    /// Whether requests that are neither idempotent nor carry an `Idempotency-Key` are
    /// retried too (default: no).
    pub non_idempotent: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            backoff: default_backoff(),
            statuses: vec![StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE],
            connection_errors: true,
            non_idempotent: false,
        }
    }
}

/// The client's default schedule (`sluice_pace::retry::client_backoff`): full jitter over
/// `1 s · 2^n`, at most 20 s each, at most 5 retries within 60 s.
pub fn default_backoff() -> BackoffPolicy {
    client_backoff()
}

impl RetryPolicy {
    /// Whether `request` may be sent more than once: an idempotent method (GET, HEAD,
    /// OPTIONS, PUT, DELETE) or an `Idempotency-Key` header, unless `non_idempotent` is set.
    pub fn allows(&self, request: &Request) -> bool {
        self.non_idempotent
            || is_idempotent(request.method().as_str())
            || request.headers().contains_key(IDEMPOTENCY_KEY)
    }

    /// Whether a response with `status` is worth retrying.
    pub fn retries_status(&self, status: StatusCode) -> bool {
        self.statuses.contains(&status)
    }

    /// Whether a request that failed with `error` is worth retrying.
    pub fn retries_error(&self, error: &reqwest::Error) -> bool {
        self.connection_errors && error.is_connect()
    }
}

/// A retry about to be waited for, as reported to a [`RetryHook`]. A request refused by a
/// server that advertises no quota goes back to its bucket's queue instead, which learns
/// the server's rate from the refusals and holds it for as long as that takes: it is
/// reported with a `delay` of zero (the wait is the queue's) and spends no retry budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryEvent {
    /// The bucket the request belongs to.
    pub key: String,
    /// Which retry this is (1 for the first).
    pub retry: u32,
    /// How long the client will wait before sending it.
    pub delay: Duration,
    /// The status that caused it, or `None` for a connection error.
    pub status: Option<StatusCode>,
    /// What the server asked for (`Retry-After`, or the reset of a spent quota).
    pub floor: Option<Duration>,
}

/// Called with every scheduled retry, before the wait (for logs, metrics and tests).
pub type RetryHook = Arc<dyn Fn(&RetryEvent) + Send + Sync>;

/// A seed that differs between clients and processes: the clock, the process id and a
/// per-process counter, mixed.
pub fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut mix = SplitMix64(nanos ^ u64::from(std::process::id()).rotate_left(32) ^ count.rotate_left(48));
    mix.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::Method;

    fn request(method: Method, key: bool) -> Request {
        let mut req = Request::new(method, "http://127.0.0.1/".parse().unwrap());
        if key {
            req.headers_mut().insert(IDEMPOTENCY_KEY, "k1".parse().unwrap());
        }
        req
    }

    #[test]
    fn only_idempotent_or_keyed_requests_are_retried() {
        let policy = RetryPolicy::default();
        for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::PUT, Method::DELETE] {
            assert!(policy.allows(&request(m, false)));
        }
        assert!(!policy.allows(&request(Method::POST, false)));
        assert!(!policy.allows(&request(Method::PATCH, false)));
        assert!(policy.allows(&request(Method::POST, true)));
        let lax = RetryPolicy {
            non_idempotent: true,
            ..RetryPolicy::default()
        };
        assert!(lax.allows(&request(Method::POST, false)));
    }
}
