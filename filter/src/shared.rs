//! State shared by the root context and every stream of one VM: the configuration, the
//! local and fallback buckets, the breaker over the check service, the leases, the metric
//! ids. With `share: process` (the default) the buckets, the breaker and the leases are kept
//! in the host's shared
//! data, under keys of this configuration's own (`sluice/<hash of the configuration>/…`),
//! so that every worker of the process decides on the same ones.

use sluice_core::rules::FailureMode;
use sluice_core::{Breaker, Micros};

use crate::breaker::CheckBreaker;
use crate::buckets::{BucketSpec, Buckets};
use crate::config::{Config, Share};
use crate::debits::Debits;
use crate::in_flight::InFlight;
use crate::leases::Leasing;
use crate::local_in_flight::LocalInFlight;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, SharedData};
use crate::slots::fnv1a;

/// Keys the fallback buckets hold when the configuration has no local prefilter.
const FALLBACK_MAX_KEYS: usize = 100_000;

/// The VM's shared state.
pub struct Shared {
    pub config: Config,
    /// The local prefilter; `None` when the configuration has none.
    pub local: Option<Buckets>,
    /// The buckets that decide while failing open.
    pub fallback: Buckets,
    pub breaker: CheckBreaker,
    pub metrics: Metrics,
    /// Leased quotas, when the configuration asks for them.
    pub leasing: Option<Leasing>,
    /// Costs learnt after the response, when the configuration names their header.
    pub debits: Option<Debits>,
    /// The concurrency slots this worker's requests hold.
    pub in_flight: Option<InFlight>,
    /// The filter's own limit on each client's requests in flight.
    pub local_in_flight: Option<LocalInFlight>,
    /// Whether a check's slots came with no `concurrency` configuration (said once).
    pub said_no_concurrency: bool,
    /// Whether this worker has looked at its host for the `trusted_hops` warning
    /// ([`crate::identity::warn_of_trust_in_envoy`]), which it does on its first request.
    pub host_looked_at: bool,
    /// The VM's memory as last counted into `metrics.vm_memory_bytes`.
    pub memory_counted: usize,
}

impl Shared {
    /// Counts what the VM's memory grew by since it was last counted (a compare a request;
    /// a host call only when it grew).
    pub fn count_memory(&mut self, p: &mut impl Proxy, now_bytes: usize) {
        if now_bytes > self.memory_counted {
            p.count(self.metrics.vm_memory_bytes, (now_bytes - self.memory_counted) as u64);
            self.memory_counted = now_bytes;
        }
    }
}

/// The shared-data keys' prefix for the configuration `bytes`: a configuration of its own
/// never reads another's state, and workers of the same one read the same.
pub fn scope(bytes: &[u8]) -> String {
    format!("sluice/{:016x}/", fnv1a(bytes))
}

impl Shared {
    /// The state for a validated configuration counting into `metrics`, its shared keys
    /// under `scope` ([`scope`]), or why it cannot be had.
    pub fn new(config: Config, metrics: Metrics, scope: &str) -> Result<Shared, String> {
        let process = config.share == Some(Share::Process);
        let table = |name: &str| process.then(|| (format!("{scope}{name}"), config.slots));
        let local_table = table("local/");
        // Only a filter failing open decides by the fallback buckets.
        let fallback_table = table("fallback/").filter(|_| config.failure.mode == FailureMode::Open);
        let local = config.local.as_ref().and_then(|l| {
            Buckets::new(BucketSpec {
                rate_per_s: l.rate_per_s,
                burst: l.burst,
                max_keys: l.max_keys,
                shared: local_table.as_ref().map(|(p, n)| (p.as_str(), *n)),
            })
        });
        let fb = &config.failure.fallback;
        let fallback = Buckets::new(BucketSpec {
            rate_per_s: fb.rate_per_s,
            burst: fb.burst,
            max_keys: config.local.as_ref().map_or(FALLBACK_MAX_KEYS, |l| l.max_keys),
            shared: fallback_table.as_ref().map(|(p, n)| (p.as_str(), *n)),
        })
        .ok_or("failure.fallback: invalid rate")?;
        let settings = &config.failure.breaker;
        let cooldown = Micros::from_ms(settings.cooldown_ms);
        let probe_deadline = cooldown.saturating_add(Micros::from_ms(2 * u64::from(config.check.timeout_ms)));
        let breaker = CheckBreaker::new(
            Breaker::new(settings.failures, cooldown),
            process.then(|| (format!("{scope}breaker"), probe_deadline)),
        );
        let leasing = config.lease.clone().map(|l| Leasing::new(l, metrics, table("lease/")));
        let debits = config.debit.clone().map(Debits::new);
        let in_flight = config.concurrency.clone().map(InFlight::new);
        let local_in_flight = match config.concurrency.as_ref().and_then(|c| c.local.as_ref()) {
            Some(local) => {
                Some(LocalInFlight::new(local, table("in_flight/")).ok_or("concurrency.local: invalid limit")?)
            }
            None => None,
        };
        Ok(Shared {
            config,
            local,
            fallback,
            breaker,
            metrics,
            leasing,
            debits,
            in_flight,
            local_in_flight,
            said_no_concurrency: false,
            host_looked_at: false,
            memory_counted: 0,
        })
    }

    /// Makes the process's tables and breaker in shared data, before traffic: the keys not
    /// made (0 when every one is there, or the state is the worker's).
    pub fn create(&self, p: &mut impl SharedData) -> u64 {
        let local = self.local.as_ref().map_or(0, |l| l.create(p));
        let leases = self.leasing.as_ref().map_or(0, |l| l.create(p));
        let in_flight = self.local_in_flight.as_ref().map_or(0, |l| l.create(p));
        local + self.fallback.create(p) + leases + in_flight + u64::from(!self.breaker.create(p))
    }
}
