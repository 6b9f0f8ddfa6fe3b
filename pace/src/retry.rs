//! What a client SDK retries, when, and how often: the parts of a retry policy that are
//! the same in every language.
//!
//! The jittered schedule itself is [`Backoff`]; this module places it after the server's
//! floor ([`server_floor_ms`], [`retry_delay`]), says which methods are safe to send twice
//! ([`is_idempotent`]), and keeps the retry budget ([`RetryBudget`]) that stops a fleet of
//! clients multiplying the load on a server that is recovering.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::headers::RateLimitInfo;
use sluice_core::backoff::{Backoff, BackoffPolicy, RandomSource};

/// The header that makes a non-idempotent request safe to retry.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The SDKs' default schedule: full jitter over `1 s · 2^n`, at most 20 s each, at most
/// 5 retries within 60 s.
///
/// A one-second base spreads a fleet that was refused at the same moment over a whole
/// second rather than a tenth of one.
pub fn client_backoff() -> BackoffPolicy {
    BackoffPolicy {
        base_ms: 1_000,
        cap_ms: 20_000,
        max_retries: 5,
        max_elapsed_ms: 60_000,
        ..BackoffPolicy::default()
    }
}

/// Whether `method` may be sent twice with the same effect: GET, HEAD, OPTIONS, PUT, DELETE
/// (case-sensitive, as HTTP methods are).
pub fn is_idempotent(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE")
}

/// What the server asked for: its `Retry-After`, or, when it reports a quota spent
/// (requests, or one counted in other units such as tokens), the time to the latest reset
/// of the spent ones.
pub fn server_floor_ms(info: &RateLimitInfo) -> Option<u64> {
    let requests = info.reset_after_ms.filter(|_| info.remaining == Some(0));
    let others = info
        .quotas
        .iter()
        .filter(|q| q.remaining == Some(0))
        .map(|q| q.reset_after_ms);
    info.retry_after_ms.or_else(|| others.fold(requests, Option::max))
}

/// The delay in milliseconds before the next retry, or `None` to give up.
///
/// `floor_ms` (see [`server_floor_ms`]) is waited in full and the jittered backoff comes on
/// top of it, so that clients refused with the same `Retry-After` do not all come back at
/// the same instant; the retry still never starts after `max_elapsed_ms`.
pub fn retry_delay(
    backoff: &mut Backoff,
    elapsed_ms: u64,
    floor_ms: Option<u64>,
    rng: &mut impl RandomSource,
) -> Option<u64> {
    let floor = floor_ms.unwrap_or(0);
    let jitter = backoff.next_delay(elapsed_ms.saturating_add(floor), None, rng)?;
    Some(floor.saturating_add(jitter))
}

/// Tokens are counted in thousandths, so that a 10 % ratio deposits 100 per request.
const SCALE: u64 = 1_000;

/// How many retries a client's retry budget allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// Retries allowed per request sent, long-run (0.1: at most one retry per ten requests).
    pub ratio: f64,
    /// Retries always available to a client that has sent few requests; also the most
    /// that may accumulate, so that a long quiet period does not save up a storm.
    pub min_retries: u32,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ratio: 0.1,
            min_retries: 10,
        }
    }
}

/// A token bucket of retries shared by every request of a client.
///
/// Each new request deposits `ratio` of a token, each retry takes one whole token; the
/// balance starts at `min_retries` and never exceeds it (nor `ratio`, for ratios above
/// that). So the retries never exceed `min_retries + ratio × requests`.
#[derive(Debug)]
pub struct RetryBudget {
    deposit: u64,
    cap: u64,
    balance: AtomicU64,
}

impl RetryBudget {
    /// A full budget; a negative or non-finite ratio counts as 0.
    pub fn new(config: BudgetConfig) -> RetryBudget {
        let ratio = if config.ratio.is_finite() {
            config.ratio.max(0.0)
        } else {
            0.0
        };
        // Saturating float-to-int conversion: absurd ratios clamp to u64::MAX.
        let deposit = (ratio * SCALE as f64).round() as u64;
        let cap = (u64::from(config.min_retries) * SCALE).max(deposit);
        RetryBudget {
            deposit,
            cap,
            balance: AtomicU64::new(cap),
        }
    }

    /// Records a new request (not a retry).
    pub fn deposit(&self) {
        let _ = self.balance.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
            Some(b.saturating_add(self.deposit).min(self.cap))
        });
    }

    /// Takes one retry from the budget; `false` when none is left.
    pub fn try_withdraw(&self) -> bool {
        self.balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(SCALE))
            .is_ok()
    }

    /// Whole retries currently available.
    pub fn available(&self) -> u64 {
        self.balance.load(Ordering::Acquire) / SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::UnitQuota;
    use sluice_core::backoff::SplitMix64;

    #[test]
    fn only_idempotent_methods_are_safe_to_repeat() {
        for m in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"] {
            assert!(is_idempotent(m), "{m}");
        }
        for m in ["POST", "PATCH", "CONNECT", "get", ""] {
            assert!(!is_idempotent(m), "{m}");
        }
    }

    #[test]
    fn the_floor_is_waited_and_jitter_comes_on_top() {
        let mut backoff = Backoff::new(client_backoff());
        let mut rng = SplitMix64(9);
        let d = retry_delay(&mut backoff, 0, Some(1_000), &mut rng).unwrap();
        assert!((1_000..=2_000).contains(&d), "{d}");
        // A floor beyond the elapsed-time limit gives up.
        assert_eq!(retry_delay(&mut backoff, 0, Some(61_000), &mut rng), None);
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
        // A spent token quota holds as long as it has not reset, requests left or not.
        let tokens = |remaining, reset| UnitQuota {
            unit: "tokens".into(),
            remaining: Some(remaining),
            reset_after_ms: Some(reset),
            ..UnitQuota::default()
        };
        let spent_tokens = RateLimitInfo {
            quotas: vec![tokens(0, 9_000)],
            ..left.clone()
        };
        assert_eq!(server_floor_ms(&spent_tokens), Some(9_000));
        let both = RateLimitInfo {
            quotas: vec![tokens(0, 300)],
            ..info.clone()
        };
        assert_eq!(server_floor_ms(&both), Some(700), "the later reset");
        let tokens_left = RateLimitInfo {
            quotas: vec![tokens(5, 9_000)],
            ..left
        };
        assert_eq!(server_floor_ms(&tokens_left), None);
        let asked = RateLimitInfo {
            retry_after_ms: Some(2_000),
            ..info
        };
        assert_eq!(server_floor_ms(&asked), Some(2_000));
    }

    #[test]
    fn the_budget_starts_with_the_minimum_then_refills_at_the_ratio() {
        let budget = RetryBudget::new(BudgetConfig::default());
        assert_eq!(budget.available(), 10);
        for _ in 0..10 {
            assert!(budget.try_withdraw());
        }
        assert!(!budget.try_withdraw());
        for _ in 0..9 {
            budget.deposit();
        }
        assert!(!budget.try_withdraw(), "nine requests at 10 % do not earn a retry");
        budget.deposit();
        assert!(budget.try_withdraw());
        assert!(!budget.try_withdraw());
    }

    #[test]
    fn the_budget_never_saves_up_more_than_the_minimum() {
        let budget = RetryBudget::new(BudgetConfig {
            ratio: 0.5,
            min_retries: 2,
        });
        for _ in 0..1_000 {
            budget.deposit();
        }
        assert_eq!(budget.available(), 2);
    }

    #[test]
    fn a_zero_or_absurd_budget_never_retries() {
        for ratio in [0.0, -1.0, f64::NAN] {
            let budget = RetryBudget::new(BudgetConfig { ratio, min_retries: 0 });
            budget.deposit();
            assert!(!budget.try_withdraw(), "{ratio}");
        }
    }
}
