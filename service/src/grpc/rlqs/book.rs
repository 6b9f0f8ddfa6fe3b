//! The node's book of subscribed buckets, over every RLQS stream it serves, and the tick
//! that keeps their assignments: every bucket due (new, ending, outgrown, or under changed
//! rules) is leased in one store exchange per tick, then each stream gets its actions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sluice_core::lease::lease_end;
use sluice_core::lease::wire::{LeaseAsk, LeaseRequest, LeaseReturn};
use sluice_core::rules::{Rule, RuleSet};
use sluice_core::time::instant_ms;
use sluice_core::Micros;
use tokio::sync::mpsc;

use super::assign::{self, Strategy, SECOND_MS};
use super::bucket::{self, BucketKey, Quota};
use super::{action, Answer, Limits, UnknownBuckets};
use crate::metrics::RlqsStats;
use crate::node::Node;

/// A renewal is sent this long before the assignment it follows ends.
pub const RENEW_MARGIN_MS: u64 = 500;
/// How long a blanket answer (an unknown or refused bucket) lasts, and a refusal for want
/// of units before the bucket asks again.
const BLANKET_TTL_S: u64 = 30;
const DENIED_TTL_S: u64 = 2;
/// Most grants one tick asks for: the rest wait for the next tick.
pub const MAX_ASKS_PER_TICK: usize = 4_096;
/// After a failed exchange, the tick waits this long before asking again.
const RETRY_AFTER_FAILURE_MS: u64 = 1_000;
/// How long an answer may take to reach Envoy: what an old bucket may still spend of its
/// refills after its replacement is sent.
const DELIVERY_MS: u64 = 100;
/// Most units one grant asks for.
const MAX_WANT: u64 = 1_000_000_000;

/// A bucket one stream subscribed.
struct Bucket {
    quota: Quota,
    /// Requests a second its latest report showed (allowed and denied).
    demand_per_s: u64,
    /// When a report last showed it in use (or it was subscribed).
    used_at_ms: u64,
    /// A report came since its assignment was made: the next tick checks it still fits.
    reported: bool,
    assigned: Option<Assigned>,
}

/// The assignment a bucket holds.
#[derive(Debug, Clone, Copy)]
struct Assigned {
    strategy: Strategy,
    /// The lease that paid for its last seconds (0: none).
    lease: u64,
    /// The end its leases paid for (when it was sent plus its TTL).
    paid_until_ms: u64,
    /// When to send the next one.
    renew_at_ms: u64,
}

/// One stream's buckets and the way to its client.
struct Stream {
    domain: String,
    out: mpsc::Sender<Answer>,
    buckets: HashMap<BucketKey, Bucket>,
}

#[derive(Default)]
struct State {
    streams: HashMap<u64, Stream>,
    buckets: usize,
    /// The rules the assignments were made under.
    rules: Option<Arc<RuleSet>>,
    retry_at_ms: u64,
}

/// A grant to ask for in this tick.
struct Due {
    stream: u64,
    key: BucketKey,
    ask: LeaseAsk,
    wanted: Strategy,
    ttl_s: u64,
    /// The assignment it extends, if it keeps the same bucket.
    extends: Option<Assigned>,
    /// What the assignment it replaces paid for and cannot spend any more.
    back: Option<LeaseReturn>,
}

/// The book.
pub struct Book {
    node: Arc<Node>,
    limits: Limits,
    unknown: UnknownBuckets,
    state: Mutex<State>,
    next_stream: AtomicU64,
}

/// A usage report of one bucket.
pub struct Usage {
    /// Its id.
    pub key: BucketKey,
    /// Requests it allowed and denied since its last report.
    pub used: u64,
    /// Over how long.
    pub elapsed_ms: u64,
}

impl Book {
    /// An empty book for `node`.
    pub fn new(node: Arc<Node>, limits: Limits, unknown: UnknownBuckets) -> Book {
        Book {
            node,
            limits,
            unknown,
            state: Mutex::new(State::default()),
            next_stream: AtomicU64::new(1),
        }
    }

    /// What it did (the node's metrics).
    pub fn stats(&self) -> &RlqsStats {
        &self.node.metrics.rlqs
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a stream of `domain` whose actions go to `out`; its id.
    pub fn open(&self, domain: String, out: mpsc::Sender<Answer>) -> u64 {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state();
        state.streams.insert(
            id,
            Stream {
                domain,
                out,
                buckets: HashMap::new(),
            },
        );
        self.stats()
            .streams
            .store(state.streams.len() as u64, Ordering::Relaxed);
        id
    }

    /// Forgets stream `id` and its buckets. Their leases run to their end: Envoy keeps
    /// enforcing an assignment after its stream ends, until the assignment's TTL.
    pub fn close(&self, id: u64) {
        let mut state = self.state();
        if let Some(stream) = state.streams.remove(&id) {
            state.buckets -= stream.buckets.len();
        }
        self.stats()
            .streams
            .store(state.streams.len() as u64, Ordering::Relaxed);
        self.stats().buckets.store(state.buckets as u64, Ordering::Relaxed);
    }

    /// Reads `usages` of stream `id`: subscribes new buckets (past the stream's or the
    /// node's bucket limit they are ignored) and updates each one's demand. The number of
    /// usages ignored for the limits.
    pub fn report(&self, id: u64, usages: Vec<Usage>) -> usize {
        let now_ms = self.now_ms();
        let (rules, _) = self.node.rules_in_force();
        let mut state = self.state();
        let State { streams, buckets, .. } = &mut *state;
        let Some(stream) = streams.get_mut(&id) else { return 0 };
        let mut ignored = 0;
        for usage in usages {
            self.stats().reports.fetch_add(1, Ordering::Relaxed);
            let demand_per_s = assign::demand_per_s(usage.used, usage.elapsed_ms);
            if let Some(b) = stream.buckets.get_mut(&usage.key) {
                b.demand_per_s = demand_per_s;
                b.reported = true;
                if usage.used > 0 {
                    b.used_at_ms = now_ms;
                }
                continue;
            }
            if stream.buckets.len() >= self.limits.buckets_per_stream || *buckets >= self.limits.buckets_per_node {
                ignored += 1;
                continue;
            }
            let quota = bucket::resolve(&usage.key, &stream.domain, &rules, self.node.config.ipv6_prefix);
            let first = match &quota {
                Quota::Of { rule, .. } => rules.rule(rule).map_or(0, |r| room(r).per_s / 8),
                _ => 0,
            };
            stream.buckets.insert(
                usage.key,
                Bucket {
                    quota,
                    demand_per_s: demand_per_s.max(first),
                    used_at_ms: now_ms,
                    reported: false,
                    assigned: None,
                },
            );
            *buckets += 1;
        }
        self.stats().ignored.fetch_add(ignored as u64, Ordering::Relaxed);
        self.stats().buckets.store(*buckets as u64, Ordering::Relaxed);
        ignored
    }

    fn now_ms(&self) -> u64 {
        instant_ms(self.node.clock.now_us())
    }

    /// One tick: the due buckets' grants in one store exchange, then every stream's actions.
    pub async fn tick(&self) {
        let now_us = self.node.clock.now_us();
        let now_ms = instant_ms(now_us);
        let (rules, _) = self.node.rules_in_force();
        let (due, mut answers) = self.due(&rules, now_us);
        if !due.is_empty() {
            let req = LeaseRequest {
                grants: due.iter().map(|d| d.ask.clone()).collect(),
                returns: due.iter().filter_map(|d| d.back.clone()).collect(),
            };
            let timeout = self.node.config.store_timeout;
            let exchanged = crate::lease::exchange(&self.node.store, &rules, now_ms, &req, timeout, |r| {
                r.lease_ttl.map(|_| ttl_us(r))
            })
            .await;
            self.stats().exchanges.fetch_add(1, Ordering::Relaxed);
            self.stats().grants.fetch_add(due.len() as u64, Ordering::Relaxed);
            match exchanged {
                Ok((grants, _)) => {
                    let mut state = self.state();
                    for (d, g) in due.into_iter().zip(grants) {
                        // The store's clock may end the lease a little sooner than planned.
                        let ttl_s = d.ttl_s.min(g.expires_in_ms / SECOND_MS);
                        let Some(b) = state.bucket(d.stream, &d.key) else {
                            continue;
                        };
                        if ttl_s == 0 {
                            // Too late in the window for a whole second: ask again once it turns.
                            if let Some(a) = &mut b.assigned {
                                a.renew_at_ms = now_ms + RENEW_MARGIN_MS;
                            }
                            continue;
                        }
                        let strategy = match d.extends {
                            Some(a) if g.units >= d.ask.want => a.strategy,
                            _ => assign::fit(g.units, d.wanted, ttl_s),
                        };
                        let ttl_s = if strategy == Strategy::DenyAll {
                            ttl_s.min(DENIED_TTL_S)
                        } else {
                            ttl_s
                        };
                        b.assigned = Some(Assigned {
                            strategy,
                            lease: g.lease,
                            paid_until_ms: now_ms + ttl_s * SECOND_MS,
                            renew_at_ms: (now_ms + ttl_s * SECOND_MS).saturating_sub(RENEW_MARGIN_MS),
                        });
                        answers
                            .entry(d.stream)
                            .or_default()
                            .push(action::assign(&d.key, strategy, ttl_s));
                        self.count(strategy);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, buckets = due.len(), "RLQS: no assignments this tick (each bucket's current one runs to its end, then Envoy's expired_assignment_behavior applies)");
                    self.state().retry_at_ms = now_ms + RETRY_AFTER_FAILURE_MS;
                }
            }
        }
        self.send(answers);
    }

    fn count(&self, strategy: Strategy) {
        self.stats().assignments.fetch_add(1, Ordering::Relaxed);
        if strategy == Strategy::DenyAll {
            self.stats().denials.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The grants due now, and the actions that need none (abandons and blankets), by stream.
    fn due(&self, rules: &Arc<RuleSet>, now_us: Micros) -> (Vec<Due>, HashMap<u64, Vec<action::Action>>) {
        let now_ms = instant_ms(now_us);
        let mut state = self.state();
        let rules_changed = !state.rules.as_ref().is_some_and(|r| Arc::ptr_eq(r, rules));
        state.rules = Some(rules.clone());
        let asking = now_ms >= state.retry_at_ms;
        let (mut due, mut answers) = (Vec::new(), HashMap::<u64, Vec<action::Action>>::new());
        let mut dropped = 0;
        for (&id, stream) in &mut state.streams {
            let mut actions = Vec::new();
            stream.buckets.retain(|key, b| {
                if rules_changed {
                    b.quota = bucket::resolve(key, &stream.domain, rules, self.node.config.ipv6_prefix);
                    b.assigned = None;
                }
                if now_ms.saturating_sub(b.used_at_ms) >= self.limits.idle_ms {
                    actions.push(action::abandon(key));
                    return false;
                }
                // Between renewals, only a report can make a bucket outgrow its assignment.
                let outgrown = std::mem::take(&mut b.reported)
                    && b.assigned
                        .is_some_and(|a| !fits(rules, &b.quota, a.strategy, b.demand_per_s));
                let renew = outgrown || b.assigned.is_none_or(|a| now_ms >= a.renew_at_ms);
                let blanket = |b: &mut Bucket, strategy, actions: &mut Vec<_>| {
                    if b.assigned.is_none_or(|a| now_ms >= a.renew_at_ms) {
                        b.assigned = Some(Assigned {
                            strategy,
                            lease: 0,
                            paid_until_ms: now_ms,
                            renew_at_ms: now_ms + BLANKET_TTL_S * SECOND_MS - RENEW_MARGIN_MS,
                        });
                        actions.push(action::assign(key, strategy, BLANKET_TTL_S));
                    }
                    true
                };
                match &b.quota {
                    Quota::Unknown => match self.unknown {
                        UnknownBuckets::Abandon => {
                            actions.push(action::abandon(key));
                            false
                        }
                        UnknownBuckets::Allow => blanket(b, Strategy::AllowAll, &mut actions),
                        UnknownBuckets::Deny => blanket(b, Strategy::DenyAll, &mut actions),
                    },
                    Quota::Refused => blanket(b, Strategy::DenyAll, &mut actions),
                    Quota::Of { rule, identity } if renew && asking && due.len() < MAX_ASKS_PER_TICK => {
                        if let Some(d) = ask(rules, rule, identity, b, outgrown, now_us) {
                            due.push(Due {
                                stream: id,
                                key: key.clone(),
                                ..d
                            });
                        }
                        true
                    }
                    Quota::Of { .. } => true,
                }
            });
            dropped += actions.iter().filter(|a| action::is_abandon(a)).count();
            if !actions.is_empty() {
                answers.insert(id, actions);
            }
        }
        state.buckets -= dropped;
        self.stats().abandoned.fetch_add(dropped as u64, Ordering::Relaxed);
        self.stats().buckets.store(state.buckets as u64, Ordering::Relaxed);
        (due, answers)
    }

    /// Sends each stream its actions. A stream whose client does not keep up loses them: its
    /// buckets keep their current assignments until they end (the next renewal is re-sent).
    fn send(&self, answers: HashMap<u64, Vec<action::Action>>) {
        if answers.is_empty() {
            return;
        }
        let state = self.state();
        for (id, actions) in answers {
            let Some(stream) = state.streams.get(&id) else { continue };
            if stream.out.try_send(Ok(action::response(actions))).is_err() {
                tracing::debug!(
                    stream = id,
                    "RLQS: a stream's client is not reading its answers; dropped"
                );
            }
        }
    }
}

impl State {
    fn bucket(&mut self, stream: u64, key: &BucketKey) -> Option<&mut Bucket> {
        self.streams.get_mut(&stream)?.buckets.get_mut(key)
    }
}

/// The grant bucket `b` of `rule`/`identity` needs now (`None`: none can be made before its
/// window turns, or none is needed). Its stream and key are filled in by the caller.
///
/// A renewal extends the bucket Envoy has; only a report showing the demand outgrew it
/// (`outgrown`) replaces it. Were a bucket replaced at every renewal while the quota cannot
/// pay for the plan at once, each replacement would cost a new burst and a second paid
/// ahead, and the client would settle well under the rule's rate.
fn ask(rules: &RuleSet, rule: &str, identity: &str, b: &Bucket, outgrown: bool, now_us: Micros) -> Option<Due> {
    let now_ms = instant_ms(now_us);
    let r = rules.rule(rule)?;
    let limit = rules.limit_for(r, identity, now_ms);
    let ttl_s = (lease_end(&limit, now_us, ttl_us(r)) - now_us) / 1_000_000;
    if ttl_s == 0 {
        return None; // the last second of a window: the next window pays for what follows
    }
    let end_ms = now_ms + ttl_s * SECOND_MS;
    let planned = assign::plan(b.demand_per_s, room(r), ttl_s);
    let extends = b
        .assigned
        .filter(|a| matches!(a.strategy, Strategy::Bucket { per_s, .. } if per_s > 0) && a.paid_until_ms > now_ms)
        .filter(|a| !outgrown || assign::fits(a.strategy, planned));
    let wanted = extends.map_or(planned, |a| a.strategy);
    let want = match extends {
        Some(a) => assign::extension(a.strategy, a.paid_until_ms, end_ms),
        None => wanted.units(ttl_s),
    };
    // A new bucket replaces the old one when Envoy receives it: the refills the old one was
    // paid for after that go back (its unspent tokens cannot: Envoy may have spent them).
    let back = match (extends, b.assigned) {
        (None, Some(a)) if a.lease != 0 => {
            let unspent = assign::refills(a.strategy, now_ms + DELIVERY_MS, a.paid_until_ms);
            (unspent > 0).then(|| LeaseReturn {
                rule: rule.to_owned(),
                identity: identity.to_owned(),
                lease: a.lease,
                unspent,
            })
        }
        _ => None,
    };
    (want > 0).then(|| Due {
        stream: 0,
        key: BucketKey::new(),
        ask: LeaseAsk {
            rule: rule.to_owned(),
            identity: identity.to_owned(),
            want: want.min(MAX_WANT),
        },
        wanted,
        ttl_s,
        extends,
        back,
    })
}

/// How long an assignment of `rule` lasts: its `lease_ttl` in whole seconds (Envoy reads no
/// finer), at least one.
pub fn ttl_us(rule: &Rule) -> Micros {
    let ttl = rule.lease_ttl.unwrap_or(1_000_000);
    (ttl / 1_000_000).max(1) * 1_000_000
}

/// What `rule`'s quota can give a bucket.
fn room(rule: &Rule) -> assign::Room {
    let per_s = u128::from(rule.limit.limit()) * 1_000 / u128::from(rule.window_ms.max(1));
    assign::Room {
        per_s: u64::try_from(per_s).unwrap_or(u64::MAX),
        capacity: rule.limit.capacity(),
    }
}

/// Whether a bucket's `current` strategy still fits its demand (see [`assign::fits`]).
fn fits(rules: &RuleSet, quota: &Quota, current: Strategy, demand_per_s: u64) -> bool {
    let Quota::Of { rule, .. } = quota else { return true };
    let Some(r) = rules.rule(rule) else { return true };
    let ttl_s = ttl_us(r) / 1_000_000;
    assign::fits(current, assign::plan(demand_per_s, room(r), ttl_s))
}

/// How often the tick runs.
pub const TICK: Duration = Duration::from_millis(100);
