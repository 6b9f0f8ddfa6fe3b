//! Leases every worker of the process shares: a fixed table of slots in the host's shared
//! data, one quota's [`Held`] lease a slot, each read and written with compare-and-swap.
//!
//! Every worker spends from the same units, and the first worker whose timer finds a quota
//! due marks its grant as asked, in the slot, before it calls: the process asks, renews and
//! gives back once for all its workers. An ask whose worker is gone is taken as lost after
//! [`sluice_core::lease::held::ASK_LOST_MS`]. A worker's timer looks after the quotas it
//! spent from (at most `max_quotas` of them; one past that is decided exactly).
//!
//! A worker's timer looks at a quota's slot (a shared-data read) only when its last sight of
//! it says something may be due ([`Held::wake_ms`]), or that it may be forgotten: every
//! write it makes (a spend, a grant) sights it. Another worker's write may make it due
//! earlier, but then that worker's own sight says so, and its timer acts.
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

/// A quota this worker looks after: when it last spent from it, and when its timer should
/// next read its slot.
#[derive(Debug, Clone, Copy)]
struct Watch {
    used_ms: u64,
    look_ms: u64,
}

/// A quota's state as a worker last wrote or read it: when its timer has something to do
/// ([`Held::wake_ms`]), and from when another quota may take its slot.
#[derive(Debug, Clone, Copy)]
struct Sight {
    wake_ms: u64,
    vacant_from_ms: u64,
}

impl Sight {
    fn of(held: &Held, config: &BookConfig, now_ms: u64) -> Sight {
        Sight {
            wake_ms: held.wake_ms(config, now_ms),
            vacant_from_ms: held.vacant_from_ms(),
        }
    }

    /// From when a worker that last spent from the quota at `used_ms` may forget it.
    fn forget_ms(&self, used_ms: u64) -> u64 {
        self.vacant_from_ms.max(used_ms.saturating_add(FORGET_MS))
    }

    /// When the timer of a worker that last spent at `used_ms` looks at the slot again.
    fn look_ms(&self, used_ms: u64) -> u64 {
        self.wake_ms.min(self.forget_ms(used_ms))
    }
}

/// The process's leases, as one worker reaches them.
pub struct LeaseTable {
    /// Every slot's key is the prefix and its index.
    prefix: String,
    slots: u64,
    config: BookConfig,
    /// The quotas this worker spent from: its timer looks after them. (Ordered: a few string
    /// comparisons a request cost less than hashing the key.)
    known: BTreeMap<QuotaKey, Watch>,
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
            let take = self.update(p, quota, now_ms, |h, l| h.spend(1, now_ms, l));
            self.know(quota, now_ms, take.as_ref().map(|(_, sight)| *sight));
            let refusal = match take.map(|(take, _)| take) {
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
                let put = self.update(p, quota, now_ms, |h, l| h.put_back(quota, left.lease, 1, now_ms, l));
                self.sighted(quota, put.map(|(_, sight)| sight));
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
        let refused = self.update(p, quota, now_ms, |h, _| h.refused(&config, retry_ms, reset_ms, now_ms));
        self.sighted(quota, refused.map(|(_, sight)| sight));
    }

    /// The grants to ask for and the units to give back now (see `LeaseBook::due`), of the
    /// quotas this worker looks after and whose time to be looked at came; those it has not
    /// spent from for a while, and whose slots are vacant, it forgets.
    pub fn due(&mut self, p: &mut impl SharedData, now_ms: u64) -> (Vec<LeaseAsk>, Vec<LeaseReturn>) {
        let (config, max) = (self.config, self.config.max_items_per_call.max(1));
        let mut asks = Vec::new();
        let mut known = std::mem::take(&mut self.known);
        known.retain(|quota, watch| {
            if now_ms < watch.look_ms {
                return true;
            }
            let room = asks.len() < max;
            let due = self.update(p, quota, now_ms, |h, l| h.due(quota, &config, room, now_ms, l));
            let Some((ask, sight)) = due else {
                // The slot is another quota's, or every race was lost: look again next time.
                return now_ms < watch.used_ms.saturating_add(FORGET_MS);
            };
            asks.extend(ask);
            watch.look_ms = sight.look_ms(watch.used_ms);
            now_ms < sight.forget_ms(watch.used_ms)
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
            self.sighted(&quota, taken.as_ref().map(|(_, sight)| *sight));
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
            let failed = self.update(p, &quota, now_ms, |h, _| h.failed());
            self.sighted(&quota, failed.map(|(_, sight)| sight));
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

    /// Notes that this worker spent from `quota` (or tried to), unless it looks after
    /// `max_quotas` already, and what it saw of its slot.
    fn know(&mut self, quota: &QuotaKey, now_ms: u64, sight: Option<Sight>) {
        let watch = Watch {
            used_ms: now_ms,
            look_ms: sight.map_or(now_ms, |s| s.look_ms(now_ms)),
        };
        if let Some(known) = self.known.get_mut(quota) {
            *known = watch;
        } else if self.known.len() < self.config.max_quotas {
            self.known.insert(quota.clone(), watch);
        }
    }

    /// What this worker saw of `quota`'s slot as it wrote it (`None`: it could not): its
    /// timer looks at it again when that says.
    fn sighted(&mut self, quota: &QuotaKey, sight: Option<Sight>) {
        if let Some(watch) = self.known.get_mut(quota) {
            watch.look_ms = sight.map_or(0, |s| s.look_ms(watch.used_ms));
        }
    }

    /// Applies `f` to `quota`'s lease in its slot and writes it back (compare-and-swap, at
    /// most [`TRIES`] rounds); what `f` answered and the state it left, or `None` when the
    /// slot is another quota's, absent, or every round was lost. A vacant slot's quota is
    /// ended and replaced.
    fn update<R>(
        &mut self,
        p: &mut impl SharedData,
        quota: &QuotaKey,
        now_ms: u64,
        mut f: impl FnMut(&mut Held, &mut Ledger) -> R,
    ) -> Option<(R, Sight)> {
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
                return Some((answer, Sight::of(&held, &self.config, now_ms)));
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
