//! The filter's book of leases: the worker's own ([`LeaseBook`]), or the process's, kept in
//! the host's shared data ([`LeaseTable`]) so that one proxy leases once for all its
//! workers. Both decide by sluice-core's rules (`sluice_core::lease::held`).

use sluice_core::lease::book::{BookConfig, LeaseBook, QuotaKey, Spend, Tally};
use sluice_core::lease::wire::{LeaseAsk, LeaseGranted, LeaseReturn};

use crate::lease_table::LeaseTable;
use crate::proxy::SharedData;

/// A book of leases.
pub enum Book {
    /// This worker's own.
    Worker(LeaseBook),
    /// Every worker's, in shared data.
    Process(LeaseTable),
}

impl Book {
    /// The process's table of `slots` under the shared-data key prefix `shared`, or the
    /// worker's own book when `None`.
    pub fn new(shared: Option<(String, u64)>) -> Book {
        let config = BookConfig::default();
        match shared {
            Some((prefix, slots)) => Book::Process(LeaseTable::new(prefix, slots, config)),
            None => Book::Worker(LeaseBook::new(config)),
        }
    }

    /// Makes the process's table before traffic; how many slots the host would not make.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        match self {
            Book::Worker(_) => 0,
            Book::Process(table) => table.create(p),
        }
    }

    /// Spends one unit of each of `quotas` at `now_ms`, all or none.
    pub fn spend(&mut self, p: &mut impl SharedData, quotas: &[QuotaKey], now_ms: u64) -> Spend {
        match self {
            Book::Worker(book) => book.spend(quotas, now_ms),
            Book::Process(table) => table.spend(p, quotas, now_ms),
        }
    }

    /// An exact check refused `quota`, saying when to retry and when it is whole again.
    pub fn refused(
        &mut self,
        p: &mut impl SharedData,
        quota: &QuotaKey,
        (retry_ms, reset_ms): (u64, u64),
        now_ms: u64,
    ) {
        match self {
            Book::Worker(book) => book.refused(quota, retry_ms, reset_ms, now_ms),
            Book::Process(table) => table.refused(p, quota, (retry_ms, reset_ms), now_ms),
        }
    }

    /// The grants to ask for and the units to give back now.
    pub fn due(&mut self, p: &mut impl SharedData, now_ms: u64) -> (Vec<LeaseAsk>, Vec<LeaseReturn>) {
        match self {
            Book::Worker(book) => book.due(now_ms),
            Book::Process(table) => table.due(p, now_ms),
        }
    }

    /// The answer to the grants asked for at `asked_at_ms`.
    pub fn granted(
        &mut self,
        p: &mut impl SharedData,
        asks: &[LeaseAsk],
        grants: &[LeaseGranted],
        (asked_at_ms, now_ms): (u64, u64),
    ) {
        match self {
            Book::Worker(book) => book.granted(asks, grants, asked_at_ms, now_ms),
            Book::Process(table) => table.granted(p, asks, grants, (asked_at_ms, now_ms)),
        }
    }

    /// The grants asked for got no answer.
    pub fn failed(&mut self, p: &mut impl SharedData, asks: &[LeaseAsk], now_ms: u64) {
        match self {
            Book::Worker(book) => book.failed(asks),
            Book::Process(table) => table.failed(p, asks, now_ms),
        }
    }

    /// The rules changed: the leases end, and what they did not spend goes back.
    pub fn forget_all(&mut self, p: &mut impl SharedData, now_ms: u64) {
        match self {
            Book::Worker(book) => book.forget_all(now_ms),
            Book::Process(table) => table.forget_all(p, now_ms),
        }
    }

    /// What befell the leases since the last call.
    pub fn take_tally(&mut self) -> Tally {
        match self {
            Book::Worker(book) => book.take_tally(),
            Book::Process(table) => table.take_tally(),
        }
    }
}
