//! The retry budget: retries may be at most a share of the requests, so that a fleet of
//! clients does not multiply the load on a server that is recovering.

use std::sync::atomic::{AtomicU64, Ordering};

/// Tokens are counted in thousandths, so that a 10 % ratio deposits 100 per request.
const SCALE: u64 = 1_000;

/// How many retries the client's retry budget allows.
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

/// A token bucket of retries shared by every request of a client: each new request
/// deposits `ratio` of a token, each retry takes one whole token; the balance starts at
/// `min_retries` and never exceeds it (nor `ratio`, for ratios above that). So the retries
/// never exceed `min_retries + ratio × requests`.
#[derive(Debug)]
pub struct RetryBudget {
    deposit: u64,
    cap: u64,
    balance: AtomicU64,
}

impl RetryBudget {
    /// A full budget.
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

    #[test]
    fn starts_with_the_minimum_then_refills_at_the_ratio() {
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
    fn never_saves_up_more_than_the_minimum() {
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
    fn a_zero_budget_never_retries() {
        let budget = RetryBudget::new(BudgetConfig {
            ratio: 0.0,
            min_retries: 0,
        });
        budget.deposit();
        assert!(!budget.try_withdraw());
    }
}
