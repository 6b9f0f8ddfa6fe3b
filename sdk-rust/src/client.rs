//! The client: a `reqwest::Client` whose requests wait their turn in their bucket's queue,
//! are retried with backoff, and report the quota of every response.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{IntoUrl, Method, Request, RequestBuilder, StatusCode, Url};
use sluice_core::backoff::{Backoff, BackoffPolicy, SplitMix64};
use sluice_pace::headers::{parse_headers, RateLimitInfo};
use sluice_pace::pacing::{Cost, PacerConfig};
use sluice_pace::retry::{retry_delay, server_floor_ms, BudgetConfig, RetryBudget};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::hold::Holds;
use crate::queue::{bucket_key, QueueConfig, Queues};
use crate::response::Response;
use crate::retry::{self, RetryEvent, RetryHook, RetryPolicy};
use crate::route::Routes;

/// A rate-limit-aware HTTP client; cheap to clone (clones share queues and budget).
///
/// Every request goes through the queue of its bucket (by default the URL's host and
/// port, joined by the policy name its route was last seen under, see
/// [`Client::bucket_for`]; or a key given to [`Client::execute_keyed`]), is paced
/// by the quota that bucket's responses advertise, and is retried on the statuses and
/// errors of its [`RetryPolicy`] while the retry budget allows.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    retry: RetryPolicy,
    budget: RetryBudget,
    queues: Queues,
    routes: Routes,
    holds: Holds,
    rng: Mutex<SplitMix64>,
    on_retry: Option<RetryHook>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("retry", &self.inner.retry)
            .field("budget", &self.inner.budget)
            .field("queues", &self.inner.queues)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client with the defaults of [`ClientBuilder`].
    pub fn new() -> Result<Client> {
        Client::builder().build()
    }

    /// A builder to configure a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The underlying `reqwest` client.
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// Starts a request with the underlying client; send it with [`Client::send`].
    pub fn request(&self, method: Method, url: impl IntoUrl) -> RequestBuilder {
        self.inner.http.request(method, url)
    }

    /// Starts a GET request; send it with [`Client::send`].
    pub fn get(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// Starts a POST request; send it with [`Client::send`].
    pub fn post(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// Builds and sends a request (see [`Client::execute`]).
    pub async fn send(&self, request: RequestBuilder) -> Result<Response> {
        self.execute(request.build().map_err(Error::Build)?).await
    }

    /// Builds and sends a request in bucket `key` (see [`Client::execute_keyed`]).
    pub async fn send_keyed(&self, key: &str, request: RequestBuilder) -> Result<Response> {
        self.execute_keyed(key, request.build().map_err(Error::Build)?).await
    }

    /// Sends a request in its route's bucket: the URL's host and port, joined by the
    /// policy name once a response on the same route (host, port and path) advertised one
    /// (see [`Client::bucket_for`]). Otherwise as [`Client::execute_keyed`].
    pub async fn execute(&self, request: Request) -> Result<Response> {
        self.run(None, request, &Cost::new()).await
    }

    /// Builds and sends a request expected to spend `cost` of quotas counted in other units
    /// than requests, e.g. `Cost::new().with("tokens", 1_200)` for a model call: the
    /// request waits until each quota its bucket's responses report (tokens, input or
    /// output tokens, bytes…) can take it, and the response's figures then correct the
    /// estimate. A unit the cost does not name counts 1. Otherwise as [`Client::send`].
    pub async fn send_with_cost(&self, request: RequestBuilder, cost: &Cost) -> Result<Response> {
        self.run(None, request.build().map_err(Error::Build)?, cost).await
    }

    /// Sends a request in bucket `key`: waits for its turn, sends, reads the quota, and
    /// retries as the [`RetryPolicy`] and the retry budget allow. The final response is
    /// returned whatever its status; an error only when no response came (or the queue
    /// was full).
    pub async fn execute_keyed(&self, key: &str, request: Request) -> Result<Response> {
        self.run(Some(key), request, &Cost::new()).await
    }

    /// The bucket a request to `url` would join now (`"host:port"` or
    /// `"host:port policy"`), for [`Client::queued`].
    pub fn bucket_for(&self, url: &Url) -> String {
        self.inner.routes.bucket(url)
    }

    /// Sends `request`, expected to spend `cost`, in bucket `fixed`, or in its route's bucket.
    async fn run(&self, fixed: Option<&str>, request: Request, cost: &Cost) -> Result<Response> {
        let inner = &*self.inner;
        let started = Instant::now();
        inner.budget.deposit();
        let retryable = inner.retry.allows(&request);
        let mut backoff = Backoff::new(inner.retry.backoff);
        // Retries taken (the schedule may grant one that the budget then refuses).
        let mut retries = 0;
        let mut request = request;
        loop {
            // A body that cannot be copied (a stream) is sent once.
            let copy = if retryable { request.try_clone() } else { None };
            let key = match fixed {
                Some(key) => Cow::Borrowed(key),
                None => Cow::Owned(inner.routes.bucket(request.url())),
            };
            let permit = inner.queues.acquire(&key, cost).await?;
            let host = bucket_key(request.url());
            inner.holds.wait(&host).await;
            let mut requeue = false;
            let attempt = match inner.http.execute(request).await {
                Ok(response) => {
                    let quota = read_quota(&response);
                    requeue = permit.answered(&quota) && quota.refused;
                    if let (true, Some(ms)) = (quota.global, quota.retry_after_ms) {
                        inner.holds.hold(host, ms);
                    }
                    if let Some((host, bucket)) = inner.routes.learn(response.url(), quota.bucket_name().as_deref()) {
                        inner.queues.hand_over(&host, &bucket);
                    }
                    Ok((response, quota))
                }
                Err(error) => {
                    permit.failed();
                    Err(error)
                }
            };
            // `Some(floor)` when the outcome is worth a retry.
            let (status, retry_floor) = match &attempt {
                Ok((response, quota)) => (
                    Some(response.status()),
                    inner
                        .retry
                        .retries_status(response.status())
                        .then(|| server_floor_ms(quota)),
                ),
                Err(error) => (None, inner.retry.retries_error(error).then_some(None)),
            };
            // A refusal from a server that advertises no quota: the bucket's pacer learned
            // from it and holds the bucket, so the request queues again, spending no retry,
            // for as long as the schedule lets a request be retried at all.
            let requeues =
                requeue && retry_floor.is_some() && elapsed_ms(started) <= inner.retry.backoff.max_elapsed_ms;
            let delay = match retry_floor {
                Some(floor) if requeues => Some((Duration::ZERO, floor)),
                Some(floor) if copy.is_some() => self.schedule(&mut backoff, started, floor).map(|d| (d, floor)),
                _ => None,
            };
            let (Some((delay, floor)), Some(copy)) = (delay, copy) else {
                return match attempt {
                    Ok((response, quota)) => Ok(Response::new(response, quota, retries)),
                    Err(error) => Err(Error::Request(error)),
                };
            };
            request = copy;
            retries += 1;
            if let Some(hook) = &inner.on_retry {
                hook(&RetryEvent {
                    key: key.into_owned(),
                    retry: retries,
                    delay,
                    status,
                    floor: floor.map(Duration::from_millis),
                });
            }
            drop(attempt);
            tokio::time::sleep(delay).await;
        }
    }

    /// The delay before the next retry, if the schedule and the budget allow one.
    fn schedule(&self, backoff: &mut Backoff, started: Instant, floor_ms: Option<u64>) -> Option<Duration> {
        let delay = {
            let mut rng = self.inner.rng.lock().unwrap_or_else(PoisonError::into_inner);
            retry_delay(backoff, elapsed_ms(started), floor_ms, &mut *rng)?
        };
        self.inner.budget.try_withdraw().then(|| Duration::from_millis(delay))
    }

    /// Buckets the client holds now (at most [`QueueConfig::max_buckets`] while they
    /// are idle).
    pub fn buckets(&self) -> usize {
        self.inner.queues.len()
    }

    /// Requests waiting in bucket `key`'s queue (not those in flight).
    pub fn queued(&self, key: &str) -> usize {
        self.inner.queues.waiting(key)
    }

    /// Retries the budget allows right now.
    pub fn retries_available(&self) -> u64 {
        self.inner.budget.available()
    }
}

/// Milliseconds since `started`.
fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The quota a response advertises.
fn read_quota(response: &reqwest::Response) -> RateLimitInfo {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let headers = response
        .headers()
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
    parse_headers(response.status().as_u16(), headers, now_ms)
}

/// Configures a [`Client`]. Defaults: a fresh `reqwest::Client`; retries of 429, 503 and
/// connection errors for idempotent or keyed requests on [`retry::default_backoff`]; a
/// budget of 10 % of requests plus 10; queues of 1024 per bucket, paced, without a
/// concurrency limit.
#[derive(Default)]
pub struct ClientBuilder {
    http: Option<reqwest::Client>,
    retry: RetryPolicy,
    budget: BudgetConfig,
    queue: QueueConfig,
    on_retry: Option<RetryHook>,
    seed: Option<u64>,
}

impl ClientBuilder {
    /// Uses this `reqwest` client (timeouts, proxies, TLS… are its own).
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// The whole retry policy.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The backoff schedule (base, cap, max retries, max elapsed, jitter).
    pub fn backoff(mut self, backoff: BackoffPolicy) -> Self {
        self.retry.backoff = backoff;
        self
    }

    /// The statuses that are retried.
    pub fn retry_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.retry.statuses = statuses.into_iter().collect();
        self
    }

    /// Whether connection failures are retried.
    pub fn retry_connection_errors(mut self, yes: bool) -> Self {
        self.retry.connection_errors = yes;
        self
    }

    /// Whether non-idempotent requests without an `Idempotency-Key` are retried too.
    pub fn retry_non_idempotent(mut self, yes: bool) -> Self {
        self.retry.non_idempotent = yes;
        self
    }

    /// The retry budget.
    pub fn retry_budget(mut self, budget: BudgetConfig) -> Self {
        self.budget = budget;
        self
    }

    /// The whole queue configuration.
    pub fn queue(mut self, queue: QueueConfig) -> Self {
        self.queue = queue;
        self
    }

    /// How many requests may wait in one bucket's queue.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue.capacity = capacity;
        self
    }

    /// How many requests of one bucket may be in flight at once.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.queue.max_in_flight = Some(max);
        self
    }

    /// Whether requests are paced by the advertised quota.
    pub fn pacing(mut self, yes: bool) -> Self {
        self.queue.pacing = yes;
        self
    }

    /// The pacer's tuning.
    pub fn pacer(mut self, pacer: PacerConfig) -> Self {
        self.queue.pacer = pacer;
        self
    }

    /// Calls `hook` with every retry scheduled, before waiting for it.
    pub fn on_retry(mut self, hook: impl Fn(&RetryEvent) + Send + Sync + 'static) -> Self {
        self.on_retry = Some(Arc::new(hook));
        self
    }

    /// Seeds the jitter (by default a seed that differs between clients).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The client; fails only if the default `reqwest` client cannot be built.
    pub fn build(self) -> Result<Client> {
        let http = match self.http {
            Some(http) => http,
            None => reqwest::Client::builder().build().map_err(Error::Build)?,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                retry: self.retry,
                budget: RetryBudget::new(self.budget),
                queues: Queues::new(self.queue),
                routes: Routes::default(),
                holds: Holds::default(),
                rng: Mutex::new(SplitMix64(self.seed.unwrap_or_else(retry::fresh_seed))),
                on_retry: self.on_retry,
            }),
        })
    }
}
