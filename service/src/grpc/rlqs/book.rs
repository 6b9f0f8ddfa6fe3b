//! The node's book of subscribed buckets, over every RLQS stream it serves, and the tick
//! that keeps their assignments: every bucket due (new, ending, outgrown, or under changed
//! rules) is leased in one store exchange per tick, then each stream gets its actions.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::join_all;
use sluice_core::lease::wire::LeaseRequest;
use sluice_core::rules::RuleSet;
use sluice_core::Micros;
use tokio::sync::mpsc;

use super::assign::{self, Strategy};
use super::bucket::{self, BucketKey, Resolved};
use super::walk::{self, Bucket, Due, Share, Step, Walk};
use super::{action, Answer, Limits, UnknownBuckets};
use crate::metrics::RlqsStats;
use crate::node::Node;
use crate::store::keys::Keys;
use crate::store::within;

/// Most grants one tick asks for: the rest wait for the next tick.
pub const MAX_ASKS_PER_TICK: usize = 4_096;
/// After a failed exchange, the tick waits this long before asking again.
const RETRY_AFTER_FAILURE_MS: u64 = 1_000;
/// How often a quota's demand is told to the store, and how long what a node told counts.
const DEMAND_EVERY_MS: u64 = 1_000;
const DEMAND_TTL_MS: u64 = 3_000;
/// How long a quota counts as contended after a grant for it came back short.
const CONTENDED_MS: u64 = 5_000;

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
    /// The contended quotas this node's buckets hold, by limit key ([`Keys::limit`]). An
    /// uncontended quota needs no sharing: every bucket gets what it asks for.
    shares: HashMap<String, Share>,
    /// The rules the assignments were made under.
    rules: Option<Arc<RuleSet>>,
    retry_at_ms: u64,
}

/// The book.
pub struct Book {
    node: Arc<Node>,
    limits: Limits,
    unknown: UnknownBuckets,
    state: Mutex<State>,
    next_stream: AtomicU64,
    /// This node's name among those sharing a quota's demand in the store.
    member: String,
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
            member: format!("{:016x}", RandomState::new().hash_one(std::process::id())),
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
        let State {
            streams,
            buckets,
            shares,
            ..
        } = &mut *state;
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
            let quota_key = quota_key(&quota, self.node.store.keys());
            let first = match &quota {
                Resolved::Of { rule, .. } => {
                    let contended = shares.contains_key(&quota_key);
                    rules.rule(rule).map_or(0, |r| walk::first_demand(r, contended))
                }
                _ => 0,
            };
            stream.buckets.insert(
                usage.key,
                Bucket {
                    quota_key,
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
        self.node.clock.now().instant_ms()
    }

    /// One tick: the due buckets' grants in one store exchange, then every stream's actions.
    pub async fn tick(&self) {
        let now = self.node.clock.now();
        let now_ms = now.instant_ms();
        let (rules, _) = self.node.rules_in_force();
        self.tell_demands(now_ms).await;
        let (due, mut answers) = self.due(&rules, now);
        if !due.is_empty() {
            self.exchange(&rules, due, now_ms, &mut answers).await;
        }
        self.send(answers);
    }

    /// Leases what `due` asks in one store exchange and records each bucket's new assignment,
    /// adding the actions to send to `answers`.
    async fn exchange(
        &self,
        rules: &RuleSet,
        due: Vec<Due>,
        now_ms: u64,
        answers: &mut HashMap<u64, Vec<action::Action>>,
    ) {
        let req = LeaseRequest {
            grants: due.iter().map(|d| d.ask.clone()).collect(),
            returns: due.iter().filter_map(|d| d.back.clone()).collect(),
        };
        let timeout = self.node.config.store_timeout;
        let exchanged = {
            let _timer = self.node.metrics.time_check(crate::metrics::Api::Rlqs);
            crate::exchange::exchange(&self.node.store, rules, now_ms, &req, timeout, |r| {
                r.lease_ttl.map(|_| walk::assignment_ttl(r))
            })
            .await
        };
        let stats = self.stats();
        stats.exchanges.fetch_add(1, Ordering::Relaxed);
        stats.grants.fetch_add(due.len() as u64, Ordering::Relaxed);
        let (grants, returned) = match exchanged {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %e, buckets = due.len(), "RLQS: no assignments this tick (each bucket's current one runs to its end, then Envoy's expired_assignment_behavior applies)");
                self.state().retry_at_ms = now_ms + RETRY_AFTER_FAILURE_MS;
                return;
            }
        };
        stats
            .units_granted
            .fetch_add(grants.iter().map(|g| g.units).sum(), Ordering::Relaxed);
        stats.units_returned.fetch_add(returned.iter().sum(), Ordering::Relaxed);
        let mut state = self.state();
        for (d, g) in due.into_iter().zip(grants) {
            if g.units < d.ask.want || g.remaining < d.ask.want {
                let share = state
                    .shares
                    .entry(self.node.store.keys().limit(&d.ask.rule, &d.ask.identity))
                    .or_default();
                share.contended_until_ms = now_ms + CONTENDED_MS;
            }
            let Some(b) = state.bucket(d.stream, &d.key) else {
                continue;
            };
            if let Some((strategy, ttl_s)) = walk::settle(b, &d, &g, now_ms) {
                answers
                    .entry(d.stream)
                    .or_default()
                    .push(action::assign(&d.key, strategy, ttl_s));
                self.count(strategy);
            }
        }
    }

    /// Tells the store, once a second per contended quota, what this node's buckets want of
    /// it, and learns what every node's want (one call per quota, all at once).
    async fn tell_demands(&self, now_ms: u64) {
        let telling: Vec<(String, u64)> = {
            let mut state = self.state();
            let State { streams, shares, .. } = &mut *state;
            shares.retain(|_, s| s.contended_until_ms > now_ms);
            let mut sums: HashMap<&str, u64> = HashMap::new();
            for b in streams.values().flat_map(|s| s.buckets.values()) {
                if shares
                    .get(&b.quota_key)
                    .is_some_and(|s| now_ms >= s.told_at_ms + DEMAND_EVERY_MS)
                {
                    let sum = sums.entry(&b.quota_key).or_default();
                    *sum = sum.saturating_add(b.demand_per_s);
                }
            }
            sums.into_iter().map(|(k, sum)| (k.to_owned(), sum)).collect()
        };
        if telling.is_empty() {
            return;
        }
        let store = &self.node.store;
        let timeout = self.node.config.store_timeout;
        let told = join_all(telling.iter().map(|(key, sum)| async move {
            let call = store.share_demand(key, &self.member, *sum, DEMAND_TTL_MS);
            within(timeout, call).await.ok()
        }))
        .await;
        let mut state = self.state();
        for ((key, sum), total) in telling.into_iter().zip(told) {
            if let Some(share) = state.shares.get_mut(&key) {
                share.total = Some(total.map_or(sum, |t| t.max(sum))); // unheard: as if alone
                share.told_at_ms = now_ms;
            }
        }
    }

    fn count(&self, strategy: Strategy) {
        self.stats().assignments.fetch_add(1, Ordering::Relaxed);
        if strategy == Strategy::DenyAll {
            self.stats().denials.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The grants due now, and the actions that need none (abandons and blankets), by stream.
    fn due(&self, rules: &Arc<RuleSet>, now: Micros) -> (Vec<Due>, HashMap<u64, Vec<action::Action>>) {
        let mut state = self.state();
        let rules_changed = !state.rules.as_ref().is_some_and(|r| Arc::ptr_eq(r, rules));
        state.rules = Some(rules.clone());
        let State {
            streams,
            shares,
            buckets,
            retry_at_ms,
            ..
        } = &mut *state;
        let walk = Walk {
            rules,
            shares,
            now,
            asking: now.instant_ms() >= *retry_at_ms,
            unknown: self.unknown,
            idle_ms: self.limits.idle_ms,
        };
        let (mut due, mut answers) = (Vec::new(), HashMap::<u64, Vec<action::Action>>::new());
        let mut dropped = 0;
        for (&id, stream) in streams.iter_mut() {
            let mut actions = Vec::new();
            stream.buckets.retain(|key, b| {
                if rules_changed {
                    b.quota = bucket::resolve(key, &stream.domain, rules, self.node.config.ipv6_prefix);
                    b.quota_key = quota_key(&b.quota, self.node.store.keys());
                    b.assigned = None;
                }
                match walk.step(key, b, due.len() < MAX_ASKS_PER_TICK) {
                    Step::Keep => true,
                    Step::Say(action) => {
                        actions.push(action);
                        true
                    }
                    Step::Drop(action) => {
                        actions.push(action);
                        dropped += 1;
                        false
                    }
                    Step::Ask(d) => {
                        due.push(Due {
                            stream: id,
                            key: key.clone(),
                            ..d
                        });
                        true
                    }
                }
            });
            if !actions.is_empty() {
                answers.insert(id, actions);
            }
        }
        *buckets -= dropped;
        self.stats().abandoned.fetch_add(dropped as u64, Ordering::Relaxed);
        self.stats().buckets.store(*buckets as u64, Ordering::Relaxed);
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

/// The limit key of `quota` among `keys`, if it is a rule's.
fn quota_key(quota: &Resolved, keys: &Keys) -> String {
    match quota {
        Resolved::Of { rule, identity } => keys.limit(rule, identity),
        _ => String::new(),
    }
}

impl State {
    fn bucket(&mut self, stream: u64, key: &BucketKey) -> Option<&mut Bucket> {
        self.streams.get_mut(&stream)?.buckets.get_mut(key)
    }
}

/// How often the tick runs.
pub const TICK: Duration = Duration::from_millis(100);
