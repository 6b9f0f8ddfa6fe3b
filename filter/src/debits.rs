//! Costs learnt after the response — an LLM API's tokens, in a response header — spent at
//! the service (`POST /v1/debit`).
//!
//! A stream queues its debit when the response's headers come; the root sends the queue on
//! its next tick. Not the stream itself: a stream's call ends with the stream (Envoy cancels
//! it), and ngx_wasm_module dispatches no call from a response phase. When the service says
//! a debit spent a leased quota, the quota is refused here until it refills (as an exact
//! check's refusal marks it, `crate::leases::Leasing::refused`).

use std::collections::{BTreeMap, VecDeque};

use sluice_core::lease::book::QuotaKey;
use sluice_core::wire::{CheckRequest, MAX_COST};

use crate::config::Debit;

/// Most debits waiting for a tick; past it a debit is dropped (and counted).
const MAX_QUEUED: usize = 10_000;

/// One debit: the request's body for the service, and the leased quotas it spent.
pub struct Queued {
    pub body: Vec<u8>,
    pub quotas: Vec<QuotaKey>,
}

/// The debits waiting for a tick, and those sent, by call token.
pub struct Debits {
    pub config: Debit,
    queue: VecDeque<Queued>,
    sent: BTreeMap<u32, Vec<QuotaKey>>,
}

/// The cost beyond the request's own 1 that a response header's `value` names: `None` for
/// nothing more to spend or a value that is not a whole number. Capped at the service's
/// largest cost.
pub fn extra_cost(value: &str) -> Option<u64> {
    let whole = value.trim().parse::<u64>().ok()?;
    Some(whole.saturating_sub(1).min(MAX_COST)).filter(|c| *c > 0)
}

impl Debits {
    pub fn new(config: Debit) -> Debits {
        Debits {
            config,
            queue: VecDeque::new(),
            sent: BTreeMap::new(),
        }
    }

    /// Queues a debit of `request` (its cost the extra to spend); whether it found room.
    pub fn queue(&mut self, request: &CheckRequest, quotas: Vec<QuotaKey>) -> bool {
        if self.queue.len() >= MAX_QUEUED {
            return false;
        }
        self.queue.push_back(Queued {
            body: request.to_json().into_bytes(),
            quotas,
        });
        true
    }

    /// The debits to send now, oldest first.
    pub fn due(&mut self) -> Vec<Queued> {
        self.queue.drain(..).collect()
    }

    /// A debit went out as call `token`.
    pub fn sent(&mut self, token: u32, quotas: Vec<QuotaKey>) {
        self.sent.insert(token, quotas);
    }

    /// The leased quotas of the debit call `token` answered; `None` when it is not a debit's.
    pub fn answered(&mut self, token: u32) -> Option<Vec<QuotaKey>> {
        self.sent.remove(&token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extra_cost_is_the_whole_less_the_one_the_request_spent() {
        assert_eq!(extra_cost("90"), Some(89));
        assert_eq!(extra_cost(" 2 "), Some(1));
        assert_eq!(extra_cost("1"), None);
        assert_eq!(extra_cost("0"), None);
        assert_eq!(extra_cost("-5"), None);
        assert_eq!(extra_cost("12.5"), None);
        assert_eq!(extra_cost("lots"), None);
        assert_eq!(extra_cost("99999999999999"), Some(MAX_COST));
    }
}
