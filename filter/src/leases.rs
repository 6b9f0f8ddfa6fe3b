//! Leased quotas in the filter: the service's rules, polled, so that a request is matched
//! to its rules here, and a book of leases (`sluice_core::lease::book`) that streams spend
//! and the root's timer renews and gives back. A request all of whose rules are leased and
//! held is decided here, without a call; any other goes to the exact check.

use std::collections::BTreeMap;

use sluice_core::lease::book::{Left, QuotaKey, Spend};
use sluice_core::lease::wire::{LeaseAsk, LeaseRequest, LeaseResponse};
use sluice_core::rules::RuleSet;
use sluice_core::wire::CheckResponse;

use crate::book::Book;
use crate::config::Lease;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, SharedData};

/// Bytes of a rules or lease answer read at most.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A request's decision by leases.
#[derive(Debug)]
pub enum ByLease {
    /// Every quota it matches had a unit, now spent (none when no rule limits it): what each
    /// holds.
    Allowed(Vec<(QuotaKey, Left)>),
    /// A quota it matches is spent (a grant brought nothing, or a check refused it) for
    /// `retry_after_ms` more: refuse it without a call.
    Refused {
        rule: String,
        left: Left,
        retry_after_ms: u64,
    },
    /// Decide it exactly: no rules known yet, a rule that is not leased or that refuses a
    /// request without its identity, or a quota without a unit in hand (then asked for on
    /// the timer). The leased quotas it matches, for [`Leasing::refused`].
    Check(Vec<QuotaKey>),
}

/// A call of the root's in flight.
#[derive(Debug, Clone)]
pub enum Pending {
    /// `GET` of the rules.
    Rules,
    /// `POST` of a lease call: the grants asked for, when it went out (ms), and the leases
    /// it gives back with their units.
    Lease {
        asks: Vec<LeaseAsk>,
        sent_ms: u64,
        returns: (u64, u64),
    },
}

/// A call the root should send.
#[derive(Debug, Clone)]
pub struct Out {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Vec<u8>>,
    /// `If-None-Match` for the rules.
    pub etag: Option<String>,
    pub pending: Pending,
}

/// The filter's leases and the rules they follow.
pub struct Leasing {
    config: Lease,
    metrics: Metrics,
    rules: Option<RuleSet>,
    /// The rules are known and none names a method, host or path (worked out as they come,
    /// not a request).
    ignores_target: bool,
    etag: Option<String>,
    book: Book,
    calls: Vec<(u32, Pending)>,
    polled_ms: Option<u64>,
}

impl Leasing {
    /// Leasing as `config` says, counting into `metrics`; its book the process's, in
    /// `shared` slots under that key prefix, or the worker's own when `None`.
    pub fn new(config: Lease, metrics: Metrics, shared: Option<(String, u64)>) -> Leasing {
        Leasing {
            config,
            metrics,
            rules: None,
            ignores_target: false,
            etag: None,
            book: Book::new(shared),
            calls: Vec::new(),
            polled_ms: None,
        }
    }

    /// Whether the rules are known and none looks at a request's method, host or path: a
    /// request is then matched without them, and reading them (three host calls) waits for
    /// a request that goes to the check.
    pub fn ignores_target(&self) -> bool {
        self.ignores_target
    }

    /// A request's decision by leases (see [`ByLease`]).
    pub fn decide(
        &mut self,
        proxy: &mut impl Proxy,
        identities: &BTreeMap<String, String>,
        method: &str,
        host: Option<&str>,
        path: &str,
        now_ms: u64,
    ) -> ByLease {
        let Some(rules) = self.rules.as_ref() else {
            return ByLease::Check(Vec::new());
        };
        let mut quotas: Vec<QuotaKey> = Vec::new();
        let mut all_leased = true;
        for (rule, identity) in rules.matching_host(identities, method, host, path) {
            if rule.lease_ttl.is_none() || rule.refuses(identity) {
                all_leased = false;
            } else {
                quotas.push((rule.name.clone(), identity.to_owned()));
            }
        }
        if !all_leased {
            return ByLease::Check(quotas);
        }
        let spent = self.book.spend(proxy, &quotas, now_ms);
        self.report(proxy);
        match spent {
            Spend::Spent(left) => ByLease::Allowed(quotas.into_iter().zip(left).collect()),
            Spend::Exhausted {
                quota,
                left,
                retry_after_ms,
            } => ByLease::Refused {
                rule: quotas.swap_remove(quota).0,
                left,
                retry_after_ms,
            },
            Spend::Missing => ByLease::Check(quotas),
        }
    }

    /// An exact check refused the request whose leased quotas were `quotas` by `rule`
    /// (`answer` says when to retry and when it is whole): that quota is spent, so the
    /// requests after it are refused here, without a call, and its lease is not asked for
    /// meanwhile (see `LeaseBook::refused`).
    pub fn refused(
        &mut self,
        p: &mut impl SharedData,
        quotas: &[QuotaKey],
        rule: &str,
        answer: &CheckResponse,
        now_ms: u64,
    ) {
        if let Some(quota) = quotas.iter().find(|(r, _)| r == rule) {
            let after = (answer.retry_after_ms, answer.reset_after_ms);
            self.book.refused(p, quota, after, now_ms);
        }
    }

    /// Makes the process's book in shared data before traffic; how many slots the host
    /// would not make.
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        self.book.create(p)
    }

    /// Counts what befell the book's leases (see `sluice_core::lease::book::Tally`).
    fn report(&mut self, proxy: &mut impl Proxy) {
        let t = self.book.take_tally();
        let m = &self.metrics;
        proxy.count(m.leases_renewed, t.renewed);
        proxy.count(m.leases_expired, t.expired);
        proxy.count(m.lease_units_expired, t.units_expired);
        proxy.count(m.lease_units_spent, t.units_spent);
    }

    /// Counts the leases a lease call gave back: returned when the service answered it,
    /// expired when not (their units come back as the quota refills, as an expired lease's).
    fn gave_back(&self, proxy: &mut impl Proxy, (leases, units): (u64, u64), answered: bool) {
        let m = &self.metrics;
        let (leases_id, units_id) = if answered {
            (m.leases_returned, m.lease_units_returned)
        } else {
            (m.leases_expired, m.lease_units_expired)
        };
        proxy.count(leases_id, leases);
        proxy.count(units_id, units);
    }

    /// The calls to send now: the rules when their poll is due, and a lease call when
    /// leases are to be asked for or given back (one of each in flight at most).
    pub fn due(&mut self, proxy: &mut impl Proxy, now_ms: u64) -> Vec<Out> {
        let mut out = Vec::new();
        let in_flight =
            |calls: &[(u32, Pending)], rules: bool| calls.iter().any(|(_, p)| matches!(p, Pending::Rules) == rules);
        let poll = self.polled_ms.is_none_or(|t| now_ms >= t + self.config.poll_ms);
        if poll && !in_flight(&self.calls, true) {
            self.polled_ms = Some(now_ms);
            out.push(Out {
                method: "GET",
                path: self.config.rules_path.clone(),
                body: None,
                etag: self.etag.clone(),
                pending: Pending::Rules,
            });
        }
        if !in_flight(&self.calls, false) {
            let (grants, returns) = self.book.due(proxy, now_ms);
            self.report(proxy);
            let unspent = returns.iter().fold(0, |n: u64, r| n.saturating_add(r.unspent));
            let given = (returns.len() as u64, unspent);
            if !grants.is_empty() || !returns.is_empty() {
                let request = LeaseRequest { grants, returns };
                out.push(Out {
                    method: "POST",
                    path: self.config.lease_path.clone(),
                    body: Some(request.to_json().into_bytes()),
                    etag: None,
                    pending: Pending::Lease {
                        asks: request.grants,
                        sent_ms: now_ms,
                        returns: given,
                    },
                });
            }
        }
        out
    }

    /// A call went out as `token`.
    pub fn sent(&mut self, token: u32, pending: Pending) {
        self.calls.push((token, pending));
    }

    /// A call could not go out.
    pub fn not_sent(&mut self, proxy: &mut impl Proxy, pending: &Pending, now_ms: u64) {
        if let Pending::Lease { asks, returns, .. } = pending {
            self.book.failed(proxy, asks, now_ms);
            self.gave_back(proxy, *returns, false);
        }
    }

    /// The answer to the call `token` (status 0: none came); whether it was one of ours.
    pub fn answered(
        &mut self,
        proxy: &mut impl Proxy,
        token: u32,
        (status, etag, body): (u16, Option<String>, &[u8]),
        now_ms: u64,
    ) -> bool {
        let Some(i) = self.calls.iter().position(|(t, _)| *t == token) else {
            return false;
        };
        match self.calls.swap_remove(i).1 {
            Pending::Rules => {
                if status == 200 {
                    self.rules_arrived(proxy, etag, body, now_ms);
                }
            }
            Pending::Lease { asks, sent_ms, returns } => {
                let answer = LeaseResponse::from_json(body);
                self.gave_back(proxy, returns, status == 200 && answer.is_ok());
                match answer {
                    Ok(answer) if status == 200 && answer.grants.len() == asks.len() => {
                        let held: Vec<u64> = answer.grants.iter().map(|g| g.units).filter(|&u| u > 0).collect();
                        proxy.count(self.metrics.leases_granted, held.len() as u64);
                        let units = held.iter().fold(0, |n: u64, u| n.saturating_add(*u));
                        proxy.count(self.metrics.lease_units_granted, units);
                        self.book.granted(proxy, &asks, &answer.grants, (sent_ms, now_ms));
                        self.report(proxy);
                        if self.etag.as_deref() != Some(&format!("\"{}\"", answer.rules_version)) {
                            self.polled_ms = None; // the rules changed: ask for them now
                        }
                    }
                    _ => self.book.failed(proxy, &asks, now_ms),
                }
            }
        }
        true
    }

    /// New rules: leases of the old ones go back with the next call.
    fn rules_arrived(&mut self, proxy: &mut impl Proxy, etag: Option<String>, body: &[u8], now_ms: u64) {
        let Ok(rules) = std::str::from_utf8(body)
            .map_err(|_| ())
            .and_then(|t| RuleSet::from_json(t).map_err(|_| ()))
        else {
            return; // keep the rules we have
        };
        if self.rules.is_some() {
            self.book.forget_all(proxy, now_ms);
            self.report(proxy);
        }
        self.ignores_target = rules.ignores_target();
        self.rules = Some(rules);
        self.etag = etag;
    }
}
