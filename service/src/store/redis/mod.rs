//! The Redis store: every check is one atomic Lua script per slot, on a single node or a
//! cluster.
//!
//! One script decides a request against all its rules, all-or-nothing, mirroring
//! `sluice-core`'s `decide_all` and state machines decision for decision (a differential
//! test enforces it); it reads the clock with `TIME` so nodes with skewed clocks agree, and
//! sets a TTL on every key it writes. On a single Redis a check is one round trip, and a
//! denial writes nothing. On a cluster, keys are grouped by slot (one identity's rules share
//! one, see [`keys`]); the groups run concurrently, each all-or-nothing, and when one
//! group's rules deny the request, the groups that admitted it are refunded, so the request
//! consumes nothing once the refunds land (a crash in between errs toward denying).
//! Connections are multiplexed and reconnect on their own; every call is bounded by a
//! response timeout. A node that starts while Redis is down connects in the background
//! ([`RedisStore::start`]) and answers `Unavailable` meanwhile, so each rule's failure
//! policy applies. A connection that keeps failing is rebuilt (a password rotated: the file
//! is read again), and with Sentinel the master is followed. The address forms are in `address.rs` ([`Address`]); TLS, credentials, Sentinel and
//! reconnecting in `link.rs`; the one place a Redis error becomes a store error in
//! `connection`. The published rules change by compare-and-set in one script and are
//! announced by pub/sub; the violations log is a capped stream.

mod address;
mod batch;
// A file of its own so that sluice-load (load/) can include it too.
#[path = "../lua/check_script.rs"]
mod check_script;
mod connection;
mod library;
mod link;
pub mod reply;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use futures_util::future::join_all;
use futures_util::StreamExt;

use redis::{Script, Value};
use sluice_core::algorithm::{passes, Part};
use sluice_core::lease::Grant;
use sluice_core::text::push_u64;
use sluice_core::{Algorithm, Decision, Limit, Micros};

pub use self::address::{redact, Address, AddressError, Deployment};
use self::batch::Batcher;
pub use self::check_script::check_script;
pub use self::connection::Engine;
use self::connection::{Connection, Kind};
use self::library::CheckCall;
use self::link::Link;
pub use self::link::RedisOptions;
use super::keys::{self, Keys};
use super::{Item, Publish, Published, Stamped, StoreError, Violation};

/// Publishes a rule set if the version is the expected one, and announces it.
/// What a reset announces on the rules channel before the key it reset (a new rules
/// version is announced as its number).
const RESET_ANNOUNCED: &str = "reset:";

/// KEYS: rules text, version. ARGV: text, expected version ("" for any), channel.
/// Returns {1, new version} or {0, current version}.
const PUBLISH_RULES: &str = r#"
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= current then
  return {0, current}
end
redis.call('SET', KEYS[1], ARGV[1])
local version = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[3], version)
return {1, version}
"#;

/// Records a member's demand for a limit (`per_s:until_ms`, until by Redis's clock), drops
/// the expired ones, and answers the total of the rest.
const SHARE_DEMAND: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + ttl))
local total = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local per_s, until_ms = string.match(all[i + 1], '^(%d+):(%d+)$')
  if per_s and tonumber(until_ms) > now then
    total = total + tonumber(per_s)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return total
"#;

/// The loaded scripts.
struct Scripts {
    check: Script,
    publish_rules: Script,
    share_demand: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            check: Script::new(&check_script()),
            publish_rules: Script::new(PUBLISH_RULES),
            share_demand: Script::new(SHARE_DEMAND),
        }
    }
}

/// A Redis, Redis Cluster or Sentinel-managed store.
pub struct RedisStore {
    /// The connection, once the first one is up; replaced when Sentinel names a new master.
    live: Arc<ArcSwapOption<Connection>>,
    /// Why there is no connection yet, for `/readyz` and every call meanwhile.
    not_yet: Arc<Mutex<String>>,
    link: Arc<Link>,
    scripts: Scripts,
    /// Its names, under the deployment's prefix.
    keys: Keys,
    /// Checks waiting for the call in flight to their shard; `None` without batching.
    batcher: Option<Arc<Batcher>>,
    /// The clock its scripts decide by: 0 for Redis's `TIME`, else the µs a test set
    /// ([`RedisStore::set_clock`]).
    clock: AtomicU64,
}

impl RedisStore {
    /// Connects to `url` (see [`Address`] for the forms) now: an error if Redis does not
    /// answer.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<RedisStore, StoreError> {
        let store = RedisStore::new(url, options)?;
        let connection = store.link.open().await?;
        store.connected(connection);
        Ok(store)
    }

    /// Like [`RedisStore::connect`], but returns at once and connects in the background,
    /// retrying on a jittered backoff (each failure logged, the last one given by every
    /// call meanwhile as `Unavailable`) until Redis answers. A malformed address, a TLS
    /// file that cannot be read, or a missing password file is an error now.
    pub fn start(url: &str, options: RedisOptions) -> Result<RedisStore, StoreError> {
        let store = RedisStore::new(url, options)?;
        let (link, live, not_yet) = (store.link.clone(), store.live.clone(), store.not_yet.clone());
        tokio::spawn(async move {
            let (mut backoff, mut rng) = link::reconnect_backoff();
            loop {
                match link.open().await {
                    Ok(connection) => {
                        install(&link, &live, connection);
                        tracing::info!(store = %link.address, "connected to Redis");
                        return;
                    }
                    Err(e) => {
                        let wait = Duration::from_millis(backoff.next_delay(0, None, &mut rng).unwrap_or(5_000));
                        tracing::warn!(store = %link.address, retry_in = ?wait, "cannot connect to Redis yet: {e}");
                        if let Ok(mut reason) = not_yet.lock() {
                            *reason = e.to_string();
                        }
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        });
        Ok(store)
    }

    fn new(url: &str, options: RedisOptions) -> Result<RedisStore, StoreError> {
        let address = Address::parse(url).map_err(|e| StoreError::Config(e.to_string()))?;
        let keys = options.keys.clone();
        let batcher = options.batching.then(Arc::default);
        let link = Link::new(address, options)?;
        Ok(RedisStore {
            keys,
            live: Arc::new(ArcSwapOption::empty()),
            not_yet: Arc::new(Mutex::new("connecting in the background".into())),
            link: Arc::new(link),
            scripts: Scripts::new(),
            batcher,
            clock: AtomicU64::new(0),
        })
    }

    fn connected(&self, connection: Connection) {
        install(&self.link, &self.live, connection);
    }

    /// Its names in the store, under the deployment's prefix.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The address, password hidden.
    pub fn address(&self) -> &Address {
        &self.link.address
    }

    /// How the live connection runs the check (`None` before the first is up): as Redis
    /// Functions, or as the script on a Redis without them.
    pub fn engine(&self) -> Option<Engine> {
        self.live.load().as_ref().map(|c| c.engine)
    }

    /// Whether the first connection is up.
    pub fn is_connected(&self) -> bool {
        self.live.load().is_some()
    }

    fn connection(&self) -> Result<Arc<Connection>, StoreError> {
        self.live.load_full().ok_or_else(|| {
            let reason = self.not_yet.lock().map(|r| r.clone()).unwrap_or_default();
            StoreError::Unavailable(format!("not connected to Redis yet: {reason}"))
        })
    }

    /// Decides the scripts at `now`, a test's clock, from now on; `None`: at Redis's
    /// `TIME` again, as a store always does otherwise. The one place a test sets the time.
    pub fn set_clock(&self, now: Option<Micros>) {
        self.clock
            .store(now.unwrap_or(Micros::ZERO).as_u64(), Ordering::Relaxed);
    }

    /// The clock the scripts decide by: `None` for Redis's own.
    fn now(&self) -> Option<Micros> {
        Some(Micros::new(self.clock.load(Ordering::Relaxed))).filter(|now| !now.is_zero())
    }

    /// Decides one request against every item, all-or-nothing: one script per cluster slot
    /// involved, run concurrently.
    pub async fn decide_all(&self, items: &[Item<'_>]) -> Result<Vec<Stamped>, StoreError> {
        let now = self.now();
        let connection = self.connection()?;
        let groups: Vec<Vec<Item<'_>>> = match connection.kind {
            Kind::Single(_) => vec![items.to_vec()],
            Kind::Cluster(_) => by_slot(items)
                .iter()
                .map(|g| g.iter().map(|&i| items[i]).collect())
                .collect(),
        };
        if let [group] = &groups[..] {
            return self.decide_group(&connection, group, "decide", now).await;
        }
        let answers = join_all(groups.iter().map(|g| self.decide_group(&connection, g, "decide", now))).await;
        let passed = answers
            .iter()
            .zip(&groups)
            .all(|(a, g)| a.as_ref().is_ok_and(|s| group_passes(g, s)));
        if !passed {
            // Give back what the groups that admitted the request took, in a task of its
            // own: the refunds land even if this check is given up meanwhile (its timeout).
            let refunds: Vec<Refund> = answers
                .iter()
                .zip(&groups)
                .filter_map(|(answer, group)| {
                    let stamps = answer.as_ref().ok().filter(|s| group_passes(group, s))?;
                    let taken = group.iter().zip(stamps).filter(|(_, s)| s.decision.allowed);
                    Some(Refund {
                        items: taken
                            .map(|(i, _)| (i.key.to_owned(), *i.part.limit, i.part.cost))
                            .collect(),
                        at: stamps.first()?.at,
                    })
                })
                .collect();
            let task = tokio::spawn(refund_all(self.scripts.check.clone(), connection.clone(), refunds));
            if let Err(e) = task.await {
                tracing::debug!(error = %e, "refunds did not finish; quota stays spent");
            }
        }
        // Back in the items' order.
        let mut stamps: Vec<Option<Stamped>> = vec![None; items.len()];
        for (answer, group) in answers.into_iter().zip(by_slot(items)) {
            for (i, stamp) in group.into_iter().zip(answer?) {
                stamps[i] = Some(stamp);
            }
        }
        stamps
            .into_iter()
            .map(|s| s.ok_or_else(|| StoreError::Protocol("a rule got no decision".into())))
            .collect()
    }

    /// The decisions `items` would get now, all-or-nothing as [`RedisStore::decide_all`],
    /// keeping nothing: one script per cluster slot involved.
    pub async fn peek_all(&self, items: &[Item<'_>]) -> Result<Vec<Decision>, StoreError> {
        let connection = self.connection()?;
        let groups: Vec<Vec<usize>> = match connection.kind {
            Kind::Single(_) => vec![(0..items.len()).collect()],
            Kind::Cluster(_) => by_slot(items),
        };
        let peeks = groups.iter().map(|g| {
            let group: Vec<Item<'_>> = g.iter().map(|&i| items[i]).collect();
            let connection = &connection;
            async move { self.decide_group(connection, &group, "peek", self.now()).await }
        });
        let mut decisions = vec![Decision::default(); items.len()];
        for (answer, group) in join_all(peeks).await.into_iter().zip(&groups) {
            for (&i, stamp) in group.iter().zip(answer?) {
                decisions[i] = stamp.decision;
            }
        }
        Ok(decisions)
    }

    /// Decides one item (tests).
    pub async fn decide(&self, key: &str, limit: &Limit, cost: u64) -> Result<Stamped, StoreError> {
        let item = single(key, limit, cost);
        let mut stamps = self.decide_all(&[item]).await?;
        stamps.pop().ok_or_else(|| StoreError::Protocol("no decision".into()))
    }

    /// Gives back `cost` admitted under `key` at `at` (tests; checks refund themselves).
    pub async fn refund(&self, key: &str, limit: &Limit, at: Micros, cost: u64) -> Result<(), StoreError> {
        let item = single(key, limit, cost);
        let call = check_call(&[item], "refund", Some(at), at);
        let connection = self.connection()?;
        library::run::<Value>(&connection, &self.scripts.check, &call)
            .await
            .map(drop)
    }

    /// Grants up to `want` units of `limit` under `key` for `ttl` as the lease `id`: the
    /// most the limit admits now, taken at once and recorded under the lease, so unspent
    /// units can come back.
    pub async fn grant(
        &self,
        key: &str,
        limit: &Limit,
        (want, ttl): (u64, Micros),
        id: u64,
    ) -> Result<Grant, StoreError> {
        self.take_or_grant(key, limit, (want, ttl), Some(id)).await
    }

    /// Takes up to `want` units of `limit` under `key` now, whatever is left of them, with
    /// no lease: a cost learnt after the request passed (see `Store::take`).
    pub async fn take(&self, key: &str, limit: &Limit, want: u64) -> Result<Grant, StoreError> {
        self.take_or_grant(key, limit, (want, Micros::ZERO), None).await
    }

    async fn take_or_grant(
        &self,
        key: &str,
        limit: &Limit,
        (want, ttl): (u64, Micros),
        lease: Option<u64>,
    ) -> Result<Grant, StoreError> {
        let item = single(key, limit, want.max(1));
        let op = if lease.is_some() { "grant" } else { "take" };
        let mut call = check_call(&[item], op, self.now(), ttl);
        if let Some(id) = lease {
            call.keys.push(keys::lease(key, id));
        }
        let reply: Vec<i64> = library::run(&*self.connection()?, &self.scripts.check, &call).await?;
        reply::grant(&reply, limit.limit(), op)
    }

    /// Gives back or renews slots of a concurrency limit: see `Store::slots`.
    pub async fn slots(
        &self,
        key: &str,
        limit: &Limit,
        at: Micros,
        cost: u64,
        renew: bool,
    ) -> Result<(u64, Micros), StoreError> {
        let item = single(key, limit, cost);
        let call = check_call(&[item], if renew { "renew" } else { "release" }, self.now(), at);
        let reply: Vec<i64> = library::run(&*self.connection()?, &self.scripts.check, &call).await?;
        match reply[..] {
            [now, found] => Ok((
                u64::try_from(found).unwrap_or(0),
                Micros::new(u64::try_from(now).unwrap_or(0)),
            )),
            _ => Err(StoreError::Protocol(format!("a slots call answered {reply:?}"))),
        }
    }

    /// Gives back up to `unspent` units of the lease `id` of `key`, if it has not ended;
    /// never more than it still holds. The units taken back.
    pub async fn give_back(&self, key: &str, limit: &Limit, id: u64, unspent: u64) -> Result<u64, StoreError> {
        if unspent == 0 {
            return Ok(0);
        }
        let item = single(key, limit, unspent);
        let mut call = check_call(&[item], "giveback", self.now(), Micros::ZERO);
        call.keys.push(keys::lease(key, id));
        let back: i64 = library::run(&*self.connection()?, &self.scripts.check, &call).await?;
        Ok(u64::try_from(back).unwrap_or(0))
    }

    /// One script call deciding `group` (keys in one slot): `op` is `decide`, or `peek`
    /// to keep nothing.
    async fn decide_group(
        &self,
        connection: &Arc<Connection>,
        group: &[Item<'_>],
        op: &'static str,
        now: Option<Micros>,
    ) -> Result<Vec<Stamped>, StoreError> {
        let call = check_call(group, op, now, Micros::ZERO);
        let reply: Vec<i64> = match &self.batcher {
            // Batched: a decision at Redis's clock, as Functions (the script has no batch).
            Some(batcher) if op == "decide" && now.is_none() && connection.engine == Engine::Functions => {
                let lane = match connection.kind {
                    Kind::Single(_) => 0,
                    Kind::Cluster(_) => group.first().map_or(0, |i| keys::slot(i.key)),
                };
                batcher
                    .decide(lane, &self.live, &self.scripts.check, call, group.len())
                    .await?
            }
            _ => library::run(connection, &self.scripts.check, &call).await?,
        };
        let limits: Vec<u64> = group.iter().map(|item| item.part.limit.limit()).collect();
        reply::decisions(&reply, &limits)
    }

    /// Round trip to Redis.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.command::<String>(&redis::cmd("PING")).await.map(drop)
    }

    async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.connection()?.query(cmd).await
    }

    /// Deletes every key that can hold the state of the limit `key` (one `DEL`: they share
    /// the limit's slot, so a cluster takes it too); whether any existed.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(keys::every_state_key(key));
        let deleted: u64 = self.command(&cmd).await?;
        // Every node forgets a refusal of the key it remembers (`crate::refusals`).
        let mut announce = redis::cmd("PUBLISH");
        announce
            .arg(&self.keys.rules_channel)
            .arg(format!("{RESET_ANNOUNCED}{key}"));
        if let Err(e) = self.command::<u64>(&announce).await {
            tracing::warn!(
                key,
                "reset, but not announced: other nodes may refuse it until their remembered retry_after: {e}"
            );
        }
        Ok(deleted > 0)
    }

    /// The published rule set, if any.
    pub async fn published_rules(&self) -> Result<Option<Published>, StoreError> {
        let mut cmd = redis::cmd("MGET");
        cmd.arg(&self.keys.rules_version).arg(&self.keys.rules);
        let (version, text): (Option<u64>, Option<String>) = self.command(&cmd).await?;
        Ok(version.zip(text).map(|(version, text)| Published { version, text }))
    }

    /// Publishes `text` as the next version if `expected` is current (or `None`), and
    /// announces the new version on the rules channel, in one script.
    pub async fn publish_rules(&self, text: &str, expected: Option<u64>) -> Result<Publish, StoreError> {
        let mut invocation = self.scripts.publish_rules.prepare_invoke();
        invocation
            .key(&self.keys.rules)
            .key(&self.keys.rules_version)
            .arg(text)
            .arg(expected.map_or(String::new(), |v| v.to_string()))
            .arg(&self.keys.rules_channel);
        let (done, version): (u8, u64) = self.connection()?.run(&invocation).await?;
        Ok(if done == 1 {
            Publish::Done(version)
        } else {
            Publish::Conflict(version)
        })
    }

    /// Records `member`'s demand for the limit `key` for `ttl_ms` and answers every live
    /// member's total (see [`crate::store::Store::share_demand`]), in one script.
    pub async fn share_demand(&self, key: &str, member: &str, per_s: u64, ttl_ms: u64) -> Result<u64, StoreError> {
        let mut invocation = self.scripts.share_demand.prepare_invoke();
        invocation
            .key(keys::demand(key))
            .arg(member)
            .arg(per_s)
            .arg(ttl_ms.max(1));
        let total: u64 = self.connection()?.run(&invocation).await?;
        Ok(total)
    }

    /// Subscribes to the rules channel in the background: wakes `notify` on every new rules
    /// version announced, and calls `reset` with the key of every reset; resubscribes after
    /// a lost connection.
    pub fn notify_rule_changes(&self, notify: Arc<tokio::sync::Notify>, reset: Arc<dyn Fn(&str) + Send + Sync>) {
        let link = self.link.clone();
        let channel = self.keys.rules_channel.clone();
        tokio::spawn(async move {
            loop {
                match subscribe(&link, &channel).await {
                    Ok(mut pubsub) => {
                        tracing::debug!(store = %link.address, "subscribed to rule changes");
                        let mut messages = pubsub.on_message();
                        while let Some(message) = messages.next().await {
                            let payload: String = message.get_payload().unwrap_or_default();
                            match payload.strip_prefix(RESET_ANNOUNCED) {
                                Some(key) => reset(key),
                                None => notify.notify_one(),
                            }
                        }
                        tracing::debug!(store = %link.address, "rule change subscription lost; resubscribing");
                    }
                    Err(e) => tracing::debug!(store = %link.address, "cannot subscribe to rule changes: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    /// Appends to the capped violations stream (`XADD … MAXLEN ~ capacity`).
    pub async fn record_violation(&self, v: &Violation, capacity: usize) -> Result<(), StoreError> {
        let fields = [("rule", v.rule.as_str()), ("identity", &v.identity), ("path", &v.path)];
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.keys.violations)
            .arg("MAXLEN")
            .arg("~")
            .arg(capacity)
            .arg("*")
            .arg(&fields[..]);
        cmd.arg("at_ms").arg(v.at_ms).arg("cost").arg(v.cost);
        self.command::<Value>(&cmd).await.map(drop)
    }

    /// The newest `count` violations, newest first.
    pub async fn recent_violations(&self, count: usize) -> Result<Vec<Violation>, StoreError> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(&self.keys.violations).arg("+").arg("-").arg("COUNT").arg(count);
        let reply: redis::streams::StreamRangeReply = self.command(&cmd).await?;
        let field = |id: &redis::streams::StreamId, k: &str| id.get::<String>(k).unwrap_or_default();
        Ok(reply
            .ids
            .iter()
            .map(|id| Violation {
                rule: field(id, "rule"),
                identity: field(id, "identity"),
                path: field(id, "path"),
                at_ms: id.get("at_ms").unwrap_or(0),
                cost: id.get("cost").unwrap_or(0),
            })
            .collect())
    }
}

/// What one slot's rules admitted, to give back: their keys and limits, and when.
struct Refund {
    /// Key, limit and the cost it took.
    items: Vec<(String, Limit, u64)>,
    at: Micros,
}

/// Gives back what every refund's items took, one script call per slot, concurrently.
async fn refund_all(script: Script, connection: Arc<Connection>, refunds: Vec<Refund>) {
    let (script, connection) = (&script, &connection);
    let calls = refunds.iter().map(|refund| async move {
        let items: Vec<Item<'_>> = refund
            .items
            .iter()
            .map(|(key, limit, cost)| Item {
                key,
                part: Part {
                    limit,
                    shadow: false,
                    cost: *cost,
                },
            })
            .collect();
        let call = check_call(&items, "refund", Some(refund.at), refund.at);
        library::run::<Value>(connection, script, &call).await
    });
    for failed in join_all(calls).await.into_iter().filter_map(Result::err) {
        tracing::debug!(error = %failed, "refund failed; quota stays spent");
    }
}

/// The check's call for `group` (keys in one slot): `op` one of the driver's
/// (`lua/check.lua`); `now` an explicit clock (tests) or `None` for Redis's `TIME`; `at` the
/// refund's time or the grant's length.
fn check_call(group: &[Item<'_>], op: &'static str, now: Option<Micros>, at: Micros) -> CheckCall {
    let mut keys = Vec::with_capacity(group.len() * 2 + 1);
    let mut args = Vec::with_capacity(2 + group.len());
    // The scripts count in microseconds.
    args.push(now.map_or(String::new(), |n| n.as_u64().to_string()));
    args.push(at.as_u64().to_string());
    for item in group {
        let limit = item.part.limit;
        for suffix in keys::state_suffixes(limit.algorithm()) {
            keys.push([item.key, suffix].concat());
        }
        let (name, params) = match limit.algorithm() {
            Algorithm::TokenBucket => (
                "token_bucket",
                [limit.capacity(), limit.token_unit(), limit.token_rate()],
            ),
            Algorithm::Gcra | Algorithm::LeakyBucket => (
                "gcra",
                [limit.capacity(), limit.interval().as_u64(), limit.max_delay().as_u64()],
            ),
            Algorithm::FixedWindow => ("fixed_window", [limit.window().as_u64(), 0, 0]),
            Algorithm::SlidingWindowLog => ("sliding_window_log", [limit.window().as_u64(), 0, 0]),
            Algorithm::SlidingWindowCounter => ("sliding_window_counter", [limit.window().as_u64(), 0, 0]),
            Algorithm::Concurrency => ("concurrency", [limit.window().as_u64(), 0, 0]),
        };
        let shadow = if item.part.shadow { ":1" } else { ":0" };
        let cost = item.part.cost.max(1); // as core's `Limit::decide` takes it
                                          // "<name>:<shadow>:<cost>:<limit>:<a>:<b>:<c>", without the formatting machinery.
        let mut value = String::with_capacity(name.len() + 64);
        value.push_str(name);
        value.push_str(shadow);
        for n in [cost, limit.limit()].into_iter().chain(params) {
            value.push(':');
            push_u64(&mut value, n);
        }
        args.push(value);
    }
    CheckCall { op, keys, args }
}

/// An item of one enforced rule: `key` decided on `limit` at `cost`.
fn single<'a>(key: &'a str, limit: &'a Limit, cost: u64) -> Item<'a> {
    Item {
        key,
        part: Part {
            limit,
            shadow: false,
            cost,
        },
    }
}

/// The items' indices grouped by cluster slot, each group in the items' order.
fn by_slot(items: &[Item<'_>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let slot = keys::slot(item.key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Whether a group's script admitted the request (and so wrote its states).
fn group_passes(group: &[Item<'_>], stamps: &[Stamped]) -> bool {
    let parts: Vec<Part<'_>> = group.iter().map(|i| i.part).collect();
    let decisions: Vec<Decision> = stamps.iter().map(|s| s.decision).collect();
    passes(&parts, &decisions)
}

/// Makes `connection` the live one; with Sentinel, starts following the master.
fn install(link: &Arc<Link>, live: &Arc<ArcSwapOption<Connection>>, connection: Connection) {
    let failed = Arc::new(tokio::sync::Notify::new());
    let (link, watched, notify) = (link.clone(), live.clone(), failed.clone());
    match link.address.deployment {
        // The cluster client rediscovers nodes and reconnects on its own.
        Deployment::Cluster => return live.store(Some(Arc::new(connection))),
        Deployment::Sentinel { .. } => tokio::spawn(link::follow(link, watched, notify)),
        Deployment::Single { .. } => tokio::spawn(link::renew(link, watched, notify)),
    };
    live.store(Some(Arc::new(connection.reporting_to(failed))));
}

/// A pub/sub connection subscribed to the rules channel `channel`.
async fn subscribe(link: &Link, channel: &str) -> Result<redis::aio::PubSub, StoreError> {
    let mut pubsub = link.pubsub().await?;
    pubsub.subscribe(channel).await.map_err(|e| link.explain(&e))?;
    Ok(pubsub)
}
