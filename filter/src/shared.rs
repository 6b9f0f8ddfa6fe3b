//! State shared by the root context and every stream of one VM: the configuration, the
//! local and fallback buckets, the breaker over the check service, the metric ids.

use sluice_core::breaker::Breaker;
use sluice_core::Micros;

use crate::buckets::Buckets;
use crate::config::Config;
use crate::debits::Debits;
use crate::leases::Leasing;
use crate::metrics::Metrics;

/// Keys the fallback buckets hold when the configuration has no local prefilter.
const FALLBACK_MAX_KEYS: usize = 100_000;

/// The VM's shared state.
pub struct Shared {
    pub config: Config,
    /// The local prefilter; `None` when the configuration has none.
    pub local: Option<Buckets>,
    /// The buckets that decide while failing open.
    pub fallback: Buckets,
    pub breaker: Breaker,
    pub metrics: Metrics,
    /// Leased quotas, when the configuration asks for them.
    pub leasing: Option<Leasing>,
    /// Costs learnt after the response, when the configuration names their header.
    pub debits: Option<Debits>,
}

impl Shared {
    /// The state for a validated configuration counting into `metrics`, or why it cannot be
    /// had.
    pub fn new(config: Config, metrics: Metrics) -> Result<Shared, String> {
        let local = config
            .local
            .as_ref()
            .and_then(|l| Buckets::new(l.rate_per_s, l.burst, l.max_keys));
        let fb = &config.failure.fallback;
        let max_keys = config.local.as_ref().map_or(FALLBACK_MAX_KEYS, |l| l.max_keys);
        let fallback = Buckets::new(fb.rate_per_s, fb.burst, max_keys).ok_or("failure.fallback: invalid rate")?;
        let settings = &config.failure.breaker;
        let breaker = Breaker::new(settings.failures, Micros::from_ms(settings.cooldown_ms));
        let leasing = config.lease.clone().map(|l| Leasing::new(l, metrics));
        let debits = config.debit.clone().map(Debits::new);
        Ok(Shared {
            config,
            local,
            fallback,
            breaker,
            metrics,
            leasing,
            debits,
        })
    }
}
