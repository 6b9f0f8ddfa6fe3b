//! The client-side queue: one bounded FIFO per bucket, released at the pace that keeps the
//! bucket under the quotas its server advertises (`sluice-core`'s [`BucketPacer`]: requests,
//! and tokens or other units at each request's expected [`Cost`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use reqwest::Url;
use sluice_pace::headers::RateLimitInfo;
use sluice_pace::pacing::{BucketPacer, Cost, PacerConfig};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// How the queues behave; one queue per bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Requests that may wait in one bucket's queue; one more fails with
    /// [`Error::QueueFull`].
    pub capacity: usize,
    /// Requests of one bucket that may be in flight at once; `None` for no limit.
    pub max_in_flight: Option<usize>,
    /// Whether requests are paced by the advertised quota (otherwise only the concurrency
    /// limit holds them).
    pub pacing: bool,
    /// The pacer's tuning.
    pub pacer: PacerConfig,
    /// Buckets kept at most: past that, the least recently used idle bucket (nothing queued
    /// or in flight) is forgotten, so a client that talks to many routes stays bounded. A
    /// forgotten bucket starts over with one probe, as a new one does.
    pub max_buckets: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            capacity: 1_024,
            max_in_flight: None,
            pacing: true,
            pacer: PacerConfig::default(),
            max_buckets: 1_024,
        }
    }
}

/// The host-level bucket of a URL: its host and port (`"api.example.com:443"`), where a
/// route waits until a response names its policy (see [`crate::Client::bucket_for`]).
pub fn bucket_key(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every bucket's queue and pacing state.
#[derive(Debug)]
pub(crate) struct Queues {
    config: QueueConfig,
    start: Instant,
    next_id: AtomicU64,
    buckets: Mutex<HashMap<String, Arc<Bucket>>>,
}

#[derive(Debug)]
struct Bucket {
    state: Mutex<BucketState>,
    /// When it was last asked for (ms since the queues started).
    last_used: AtomicU64,
    /// Woken whenever the head of the queue may be able to go.
    changed: Notify,
}

#[derive(Debug)]
struct BucketState {
    pacer: BucketPacer,
    waiting: VecDeque<u64>,
    in_flight: usize,
}

/// What the head of a queue does next.
enum Step {
    /// Send now, with this pacer ticket.
    Go(u64),
    Sleep(Duration),
    WaitForChange,
}

impl Queues {
    pub(crate) fn new(config: QueueConfig) -> Queues {
        Queues {
            config,
            start: Instant::now(),
            next_id: AtomicU64::new(0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn bucket(&self, key: &str) -> Arc<Bucket> {
        let now = self.now_ms();
        let mut buckets = lock(&self.buckets);
        if let Some(bucket) = buckets.get(key) {
            bucket.last_used.store(now, Ordering::Relaxed);
            return Arc::clone(bucket);
        }
        if buckets.len() >= self.config.max_buckets.max(1) {
            evict_idle(&mut buckets);
        }
        let bucket = Arc::new(Bucket {
            state: Mutex::new(BucketState {
                pacer: BucketPacer::new(self.config.pacer),
                waiting: VecDeque::new(),
                in_flight: 0,
            }),
            last_used: AtomicU64::new(now),
            changed: Notify::new(),
        });
        buckets.insert(key.to_owned(), Arc::clone(&bucket));
        bucket
    }

    /// Buckets held now.
    pub(crate) fn len(&self) -> usize {
        lock(&self.buckets).len()
    }

    /// Hands the host bucket `host` over to the policy bucket `policy` (a host and a
    /// policy, just learned from a response), unless that exists already, and leaves the
    /// host a fresh bucket.
    ///
    /// The host bucket's pacer learned the policy's quota, so the requests it paced and
    /// those that now name the policy stay in one queue with one pacer instead of two
    /// pacers spending the same quota; a route not seen yet starts over with one probe
    /// rather than trusting another route's quota.
    pub(crate) fn hand_over(&self, host: &str, policy: &str) {
        let mut buckets = lock(&self.buckets);
        if let Some(bucket) = buckets.remove(host) {
            buckets.entry(policy.to_owned()).or_insert(bucket);
        }
    }

    /// Requests waiting in `key`'s queue.
    pub(crate) fn waiting(&self, key: &str) -> usize {
        let bucket = lock(&self.buckets).get(key).map(Arc::clone);
        bucket.map_or(0, |b| lock(&b.state).waiting.len())
    }

    /// Waits for the turn of one request of bucket `key` expected to spend `cost`: fails at
    /// once when its queue is full; dropping the future leaves the queue.
    pub(crate) async fn acquire(&self, key: &str, cost: &Cost) -> Result<Permit<'_>> {
        let bucket = self.bucket(key);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = lock(&bucket.state);
            if state.waiting.len() >= self.config.capacity {
                return Err(Error::QueueFull {
                    key: key.to_owned(),
                    capacity: self.config.capacity,
                });
            }
            state.waiting.push_back(id);
        }
        let mut place = Place {
            bucket: &bucket,
            id,
            cost,
            left: false,
        };
        loop {
            let changed = bucket.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable(); // before looking, so no wake-up is missed
            match self.step(&mut place) {
                Step::Go(ticket) => {
                    bucket.changed.notify_waiters(); // the next one is now at the head
                    return Ok(Permit {
                        queues: self,
                        bucket: Arc::clone(&bucket),
                        ticket,
                        done: false,
                    });
                }
                Step::Sleep(delay) => {
                    // Whichever comes first: the pacer's time or a change.
                    let _ = tokio::time::timeout(delay, changed.as_mut()).await;
                }
                Step::WaitForChange => changed.await,
            }
        }
    }

    fn step(&self, place: &mut Place<'_>) -> Step {
        let now = self.now_ms();
        let mut state = lock(&place.bucket.state);
        if state.waiting.front() != Some(&place.id) {
            return Step::WaitForChange;
        }
        if self.config.max_in_flight.is_some_and(|max| state.in_flight >= max) {
            return Step::WaitForChange;
        }
        let at = if self.config.pacing {
            state.pacer.next_send_at(now, place.cost)
        } else {
            Some(now)
        };
        match at {
            Some(at) if at <= now => {
                state.waiting.pop_front();
                let ticket = state.pacer.on_send(now, place.cost);
                state.in_flight += 1;
                place.left = true;
                Step::Go(ticket)
            }
            Some(at) => Step::Sleep(Duration::from_millis(at - now)),
            None => Step::WaitForChange,
        }
    }
}

/// Forgets the least recently used bucket that nothing holds (no request queued, in flight
/// or about to queue); keeps them all when every one is busy.
fn evict_idle(buckets: &mut HashMap<String, Arc<Bucket>>) {
    let idle = buckets
        .iter()
        .filter(|(_, b)| Arc::strong_count(b) == 1)
        .filter(|(_, b)| {
            let state = lock(&b.state);
            state.waiting.is_empty() && state.in_flight == 0
        })
        .min_by_key(|(_, b)| b.last_used.load(Ordering::Relaxed))
        .map(|(key, _)| key.clone());
    if let Some(key) = idle {
        buckets.remove(&key);
    }
}

/// A request's place in a queue; dropping it before its turn gives the place up.
struct Place<'a> {
    bucket: &'a Bucket,
    id: u64,
    cost: &'a Cost,
    left: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let mut state = lock(&self.bucket.state);
        if let Some(i) = state.waiting.iter().position(|&id| id == self.id) {
            state.waiting.remove(i);
        }
        drop(state);
        self.bucket.changed.notify_waiters();
    }
}

/// The right to send one request; report how it ended with [`Permit::answered`] or
/// [`Permit::failed`] (dropping it counts as a failure).
#[derive(Debug)]
pub(crate) struct Permit<'a> {
    queues: &'a Queues,
    bucket: Arc<Bucket>,
    /// The pacer's ticket of this request.
    ticket: u64,
    done: bool,
}

impl Permit<'_> {
    /// The request got a response advertising `info`. Returns whether its bucket's pacer
    /// learns the quota from refusals ([`BucketPacer::adapts`]): a refused request then
    /// queues again instead of being retried.
    pub(crate) fn answered(mut self, info: &RateLimitInfo) -> bool {
        self.finish(Some(info))
    }

    /// The request got no response.
    pub(crate) fn failed(mut self) {
        let _ = self.finish(None);
    }

    fn finish(&mut self, info: Option<&RateLimitInfo>) -> bool {
        if self.done {
            return false;
        }
        self.done = true;
        let now = self.queues.now_ms();
        let mut state = lock(&self.bucket.state);
        match info {
            Some(info) => state.pacer.observe(info, now, self.ticket),
            None => state.pacer.on_failure(self.ticket),
        }
        state.in_flight = state.in_flight.saturating_sub(1);
        let adapts = self.queues.config.pacing && state.pacer.adapts();
        drop(state);
        self.bucket.changed.notify_waiters();
        adapts
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let _ = self.finish(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_bucket_goes_to_the_first_policy_and_the_host_starts_over() {
        let queues = Queues::new(QueueConfig::default());
        let host = queues.bucket("api.test:80");
        queues.hand_over("api.test:80", "api.test:80 a");
        assert!(Arc::ptr_eq(&host, &queues.bucket("api.test:80 a")));
        let fresh = queues.bucket("api.test:80");
        assert!(!Arc::ptr_eq(&host, &fresh), "the host starts over");
        // A policy that has a bucket keeps it.
        queues.hand_over("api.test:80", "api.test:80 a");
        assert!(Arc::ptr_eq(&host, &queues.bucket("api.test:80 a")));
        // Nothing to hand over from an unknown host.
        queues.hand_over("other:80", "other:80 a");
        assert!(!Arc::ptr_eq(&host, &queues.bucket("other:80 a")));
    }
}
