//! Leases every worker of the process shares: a fixed table of slots in the host's shared
//! data, one quota's [`Held`] lease a slot, each read and written with compare-and-swap.
//!
//! Every worker spends from the same units, and the first worker whose timer finds a quota
//! due marks its grant as asked, in the slot, before it calls: the process asks, renews and
//! gives back once for all its workers. An ask whose worker is gone is taken as lost after
//! [`sluice_core::lease::held::ASK_LOST_MS`]. A worker's timer looks after the quotas it
//! spent from (at most `max_quotas` of them; one past that is decided exactly).
//!
//! A quota's slot is its hash's. A slot another quota holds (a live lease, an ask out, a use
//! within the last second) is not taken from it: the newcomer is decided exactly until the
//! slot is vacant. A race lost [`TRIES`] times decides exactly too, and a grant that cannot
//! be written goes straight back. So a collision costs calls, never a unit more than the
//! service granted.

use std::collections::BTreeMap;

use sluice_core::lease::book::{BookConfig, Left, QuotaKey, Spend, Tally};
use sluice_core::lease::held::{Held, Ledger, Take};
use sluice_core::lease::wire::{LeaseAsk, LeaseGranted, LeaseReturn};

use crate::proxy::SharedData;
use crate::slots::{create, fnv1a_parts, slot_key, TRIES};

/// A worker that has not spent from a quota for this long, while its slot is vacant, stops
/// looking after it (ms).
const FORGET_MS: u64 = 10_000;

/// The process's leases, as one worker reaches them.
pub struct LeaseTable {
    /// Every slot's key is the prefix and its index.
    prefix: String,
    slots: u64,
    config: BookConfig,
    /// The quotas this worker spent from, and when it last did: its timer looks after them.
    /// (Ordered: a few string comparisons a request cost less than hashing the key.)
    known: BTreeMap<QuotaKey, u64>,
    /// What this worker's writes left to give back and to count.
    ledger: Ledger,
}

impl LeaseTable {
    /// `slots` (at least 1) leases under the shared-data keys `{prefix}{index}`.
    pub fn new(prefix: String, slots: u64, config: BookConfig) -> LeaseTable {
        LeaseTable {
            prefix,
            slots: slots.max(1),
            config,
            known: BTreeMap::new(),
            ledger: Ledger::default(),
        }
    }

    /// Creates every slot not there yet, before traffic (see `SlotTable::create`); how many
    /// the host would not create.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        (0..self.slots).filter(|&i| !create(p, &self.key_at(i))).count() as u64
    }

    /// What befell the leases this worker wrote since the last call.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.ledger.tally)
    }

    /// Spends one unit of each of `quotas` at `now_ms`, all or none (as
    /// `LeaseBook::spend`): one slot at a time, those spent put back when a later one cannot.
    pub fn spend(&mut self, p: &mut impl SharedData, quotas: &[QuotaKey], now_ms: u64) -> Spend {
        let mut spent: Vec<Left> = Vec::with_capacity(quotas.len());
        for (i, quota) in quotas.iter().enumerate() {
            self.know(quota, now_ms);
            let take = self.update(p, quota, now_ms, |h, l| h.spend(1, now_ms, l));
            let refusal = match take {
                Some(Take::Spent(left)) => {
                    spent.push(left);
                    continue;
                }
                Some(Take::Exhausted { left, retry_after_ms }) => Spend::Exhausted {
                    quota: i,
                    left,
                    retry_after_ms,
                },
                Some(Take::Missing) | None => Spend::Missing,
            };
            for (quota, left) in quotas.iter().zip(&spent) {
                self.update(p, quota, now_ms, |h, l| h.put_back(quota, left.lease, 1, now_ms, l));
            }
            return refusal;
        }
        Spend::Spent(spent)
    }

    /// An exact check refused `quota` (see `LeaseBook::refused`).
    pub fn refused(
        &mut self,
        p: &mut impl SharedData,
        quota: &QuotaKey,
        (retry_ms, reset_ms): (u64, u64),
        now_ms: u64,
    ) {
        let config = self.config;
        self.update(p, quota, now_ms, |h, _| h.refused(&config, retry_ms, reset_ms, now_ms));
    }

    /// The grants to ask for and the units to give back now (see `LeaseBook::due`), of the
    /// quotas this worker looks after; those it has not spent from for a while, and whose
    /// slots are vacant, it forgets.
    pub fn due(&mut self, p: &mut impl SharedData, now_ms: u64) -> (Vec<LeaseAsk>, Vec<LeaseReturn>) {
        let (config, max) = (self.config, self.config.max_items_per_call.max(1));
        let mut asks = Vec::new();
        let mut known = std::mem::take(&mut self.known);
        known.retain(|quota, used_ms| {
            let room = asks.len() < max;
            let due = self.update(p, quota, now_ms, |h, l| {
                (h.due(quota, &config, room, now_ms, l), h.vacant(now_ms))
            });
            let vacant = due.as_ref().is_none_or(|(_, vacant)| *vacant);
            asks.extend(due.and_then(|(ask, _)| ask));
            !vacant || now_ms < used_ms.saturating_add(FORGET_MS)
        });
        self.known = known;
        let returns = &mut self.ledger.returns;
        let later = returns.split_off(returns.len().min(max));
        (asks, std::mem::replace(returns, later))
    }

    /// The answer to the grants asked for at `asked_at_ms` (see `LeaseBook::granted`); a
    /// grant no slot takes goes straight back.
    pub fn granted(
        &mut self,
        p: &mut impl SharedData,
        asks: &[LeaseAsk],
        grants: &[LeaseGranted],
        (asked_at_ms, now_ms): (u64, u64),
    ) {
        let config = self.config;
        for (ask, g) in asks.iter().zip(grants) {
            let quota = (ask.rule.clone(), ask.identity.clone());
            let taken = self.update(p, &quota, now_ms, |h, l| {
                h.granted(ask, g, &config, (asked_at_ms, now_ms), l);
            });
            if taken.is_none() && g.units > 0 {
                self.ledger.returns.push(LeaseReturn {
                    rule: quota.0,
                    identity: quota.1,
                    lease: g.lease,
                    unspent: g.units,
                });
            }
        }
    }

    /// The grants asked for got no answer: they may be asked again.
    pub fn failed(&mut self, p: &mut impl SharedData, asks: &[LeaseAsk], now_ms: u64) {
        for ask in asks {
            let quota = (ask.rule.clone(), ask.identity.clone());
            self.update(p, &quota, now_ms, |h, _| h.failed());
        }
    }

    /// The rules changed: the leases of every quota this worker looks after end, and what
    /// they did not spend goes back with the next call. (A worker that learns of the change
    /// later ends the leases another granted meanwhile: a call more, never a unit more.)
    pub fn forget_all(&mut self, p: &mut impl SharedData, now_ms: u64) {
        for quota in std::mem::take(&mut self.known).into_keys() {
            self.update(p, &quota, now_ms, |h, l| {
                h.end(&quota, now_ms, l);
                *h = Held::default();
            });
        }
    }

    /// Notes that this worker spent from `quota`, unless it looks after `max_quotas` already.
    fn know(&mut self, quota: &QuotaKey, now_ms: u64) {
        if let Some(used_ms) = self.known.get_mut(quota) {
            *used_ms = now_ms;
        } else if self.known.len() < self.config.max_quotas {
            self.known.insert(quota.clone(), now_ms);
        }
    }

    /// Applies `f` to `quota`'s lease in its slot and writes it back (compare-and-swap, at
    /// most [`TRIES`] rounds); what `f` answered, or `None` when the slot is another quota's,
    /// absent, or every round was lost. A vacant slot's quota is ended and replaced.
    fn update<R>(
        &mut self,
        p: &mut impl SharedData,
        quota: &QuotaKey,
        now_ms: u64,
        mut f: impl FnMut(&mut Held, &mut Ledger) -> R,
    ) -> Option<R> {
        let key = self.key(quota);
        for _ in 0..TRIES {
            let (bytes, cas) = p.shared_get(&key)?;
            let mut ledger = Ledger::default();
            let (mut held, ours) = match Held::decode_borrowed(&bytes) {
                Some(((rule, identity), h)) if (rule, identity) == (&quota.0, &quota.1) => (h, true),
                Some(((rule, identity), h)) if h.vacant(now_ms) => {
                    h.end(&(rule.to_owned(), identity.to_owned()), now_ms, &mut ledger);
                    (Held::default(), false)
                }
                Some(_) => return None,
                None => (Held::default(), false),
            };
            let before = ours.then(|| held.clone());
            let answer = f(&mut held, &mut ledger);
            let unchanged = before.is_some_and(|b| b == held);
            if unchanged || p.shared_set(&key, &held.encode(quota), cas) {
                self.ledger.merge(ledger);
                return Some(answer);
            }
        }
        None
    }

    /// `quota`'s slot key.
    fn key(&self, (rule, identity): &QuotaKey) -> String {
        let hash = fnv1a_parts(&[rule.as_bytes(), &[0], identity.as_bytes()]);
        self.key_at(hash % self.slots)
    }

    fn key_at(&self, index: u64) -> String {
        slot_key(&self.prefix, index)
    }
}
