//! When a request is retried, and after how long.
//!
//! The schedule itself is `sluice-core`'s [`Backoff`]; this module decides which requests
//! and outcomes may be retried and places the jittered delay after the server's floor.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Method, Request, StatusCode};
use sluice_core::backoff::{Backoff, BackoffPolicy, RandomSource, SplitMix64};
use sluice_core::headers::RateLimitInfo;

/// The header that makes a non-idempotent request safe to retry.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

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

/// The client's default schedule: full jitter over `1 s · 2^n`, at most 20 s each, at most
/// 5 retries within 60 s. A one-second base spreads a fleet that was refused at the same
/// moment over a whole second rather than a tenth of one.
pub fn default_backoff() -> BackoffPolicy {
    BackoffPolicy {
        base_ms: 1_000,
        cap_ms: 20_000,
        max_retries: 5,
        max_elapsed_ms: 60_000,
        ..BackoffPolicy::default()
    }
}

impl RetryPolicy {
    /// Whether `request` may be sent more than once: an idempotent method (GET, HEAD,
    /// OPTIONS, PUT, DELETE) or an `Idempotency-Key` header, unless `non_idempotent` is set.
    pub fn allows(&self, request: &Request) -> bool {
        let idempotent = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
        );
        self.non_idempotent || idempotent || request.headers().contains_key(IDEMPOTENCY_KEY)
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

/// What the server asked for: its `Retry-After`, or, when it reports the quota spent, the
/// time to its reset.
pub fn server_floor_ms(info: &RateLimitInfo) -> Option<u64> {
    info.retry_after_ms
        .or_else(|| info.reset_after_ms.filter(|_| info.remaining == Some(0)))
}

/// The delay in milliseconds before the next retry, or `None` to give up.
///
/// `floor_ms` (see [`server_floor_ms`]) is waited in full and the jittered backoff comes on
/// top of it, so that clients refused with the same `Retry-After` do not all come back at
/// the same instant; the retry still never starts after `max_elapsed_ms`.
pub fn schedule(
    backoff: &mut Backoff,
    elapsed_ms: u64,
    floor_ms: Option<u64>,
    rng: &mut impl RandomSource,
) -> Option<u64> {
    let floor = floor_ms.unwrap_or(0);
    let jitter = backoff.next_delay(elapsed_ms.saturating_add(floor), None, rng)?;
    Some(floor.saturating_add(jitter))
}

/// A retry about to be waited for, as reported to a [`RetryHook`].
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

    #[test]
    fn the_floor_is_waited_and_jitter_comes_on_top() {
        let mut backoff = Backoff::new(default_backoff());
        let mut rng = SplitMix64(9);
        let d = schedule(&mut backoff, 0, Some(1_000), &mut rng).unwrap();
        assert!((1_000..=2_000).contains(&d), "{d}");
        // A floor beyond the elapsed-time limit gives up.
        assert_eq!(schedule(&mut backoff, 0, Some(61_000), &mut rng), None);
    }

    #[test]
    fn a_spent_quota_gives_its_reset_as_floor() {
        let info = RateLimitInfo {
            remaining: Some(0),
            reset_after_ms: Some(700),
            ..RateLimitInfo::default()
        };
        assert_eq!(server_floor_ms(&info), Some(700));
        let left = RateLimitInfo {
            remaining: Some(3),
            ..info.clone()
        };
        assert_eq!(server_floor_ms(&left), None);
        let asked = RateLimitInfo {
            retry_after_ms: Some(2_000),
            ..info
        };
        assert_eq!(server_floor_ms(&asked), Some(2_000));
    }
}
