//! Regions: one limit across several regions, with no request waiting on the WAN.
//!
//! A node in a region keeps regional rules in its region's store, as any node does. For a
//! rule marked `global`, the node leases units of the quota from the global store in the
//! background, the way a proxy leases from its region ([`refill`]), and decides requests
//! from what it holds ([`decide`]), in memory, with `sluice_core`'s lease book — the
//! filter's book. Units are debited from the global quota when they are leased, so the sum
//! over regions never exceeds the limit (see `docs/design.md`, Regions). When the global
//! store cannot be reached, each rule's `on_global_unreachable` policy applies.

pub mod decide;
pub mod refill;
pub mod sublease;

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sluice_core::lease::book::{BookConfig, LeaseBook};
use tokio::sync::{watch, Notify};

use self::sublease::Subleases;

use crate::metrics::{encode_family, encode_one};
use crate::store::Store;

/// Leases proxies may hold at once of a node's units of global quotas.
const MAX_SUBLEASES: usize = 100_000;

/// Settings of a node's region.
#[derive(Debug, Clone)]
pub struct RegionConfig {
    /// The region's name, for logs and metrics.
    pub name: String,
    /// How often the node looks at its book for leases to ask for or give back.
    pub tick: Duration,
    /// Longest wait for a call to the global store.
    pub timeout: Duration,
    /// A quota used within this long keeps a lease between visits, so a client that comes
    /// back now and then finds a unit here instead of a WAN round trip. Costs a renewal per
    /// quota and lease.
    pub keep_warm: Duration,
    /// Checks waiting at once for a cold quota's first lease; past it a cold check is
    /// refused (and counted) instead of waiting.
    pub max_cold_waits: usize,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            name: "local".into(),
            tick: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            keep_warm: Duration::from_secs(10),
            max_cold_waits: 4_096,
        }
    }
}

/// A node's view of the global store: its leases of global quotas, and whether the store
/// answers.
pub struct Region {
    /// Settings.
    pub config: RegionConfig,
    /// The global store, over the WAN.
    global: Store,
    /// The leases this node holds of global quotas.
    book: Mutex<LeaseBook>,
    /// Whether the last call to the global store was answered (shared with the metrics).
    link_up: Arc<AtomicBool>,
    /// A ping of the global store is in flight (while the link is down).
    probing: AtomicBool,
    /// Bumped each time an exchange with the global store ends: cold checks wait on it.
    landed: watch::Sender<u64>,
    /// Wakes the refill task before its tick: a cold check is waiting.
    wake: Notify,
    /// Checks waiting for a cold quota's first lease now.
    cold_waits: AtomicUsize,
    /// The leases proxies hold of this node's units ([`sublease`]).
    subleases: Mutex<Subleases>,
    /// What the metrics count (shared with them).
    counters: Arc<Counters>,
}

/// What the region's metrics count.
#[derive(Debug, Default)]
struct Counters {
    calls_ok: AtomicU64,
    calls_failed: AtomicU64,
    units_granted: AtomicU64,
    units_returned: AtomicU64,
    from_pool: AtomicU64,
    refused_empty: AtomicU64,
    refused_cut_off: AtomicU64,
    decided_alone: AtomicU64,
    cold_admitted: AtomicU64,
    cold_over_cap: AtomicU64,
    cold_timed_out: AtomicU64,
    units_handed_on: AtomicU64,
    units_taken_back: AtomicU64,
}

/// How a check's global rules were decided, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From the units the node holds.
    Pool,
    /// Refused: the node held no units for a quota (the link up, or the policy `spend`).
    Empty,
    /// Refused: the global store is cut off and the rule's policy is `closed`.
    CutOff,
    /// Decided alone in the region's store with the rule's share (policy `share`).
    Alone,
    /// From a cold quota's first lease, which the check waited for (one WAN round trip).
    Cold,
    /// Refused: a cold quota, and already `max_cold_waits` checks waiting.
    ColdOverCap,
    /// Refused: a cold quota whose first lease did not come within the region's timeout.
    ColdTimedOut,
}

impl Source {
    /// Every source, in the order the metrics list them.
    const ALL: [Source; 7] = [
        Source::Pool,
        Source::Empty,
        Source::CutOff,
        Source::Alone,
        Source::Cold,
        Source::ColdOverCap,
        Source::ColdTimedOut,
    ];

    /// The source as the `source` label of `sluice_global_checks_total` says it.
    fn label(self) -> &'static str {
        match self {
            Source::Pool => "pool",
            Source::Empty => "empty",
            Source::CutOff => "cut_off",
            Source::Alone => "alone",
            Source::Cold => "cold",
            Source::ColdOverCap => "cold_over_cap",
            Source::ColdTimedOut => "cold_timed_out",
        }
    }
}

impl EncodeLabelValue for Source {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        fmt::Write::write_str(encoder, self.label())
    }
}

impl Region {
    /// A region leasing from `global`. The link counts as up until a call fails.
    pub fn new(global: Store, config: RegionConfig) -> Region {
        let book = BookConfig {
            // A renewal must land before the lease runs out: a WAN round trip (two when the
            // exchange gives units back first), a tick, and room for a slow call; and before
            // the proxies leasing through the node renew theirs (their leases end
            // `sublease::KEEP_MS` before the node's, and they renew 250 ms ahead of that).
            // Half the lease at most: 500 ms for the default 1 s. (Returns go 100 ms before a
            // lease ends, which covers a one-way trip of up to 100 ms less a tick: the global
            // store's end is later than the node's by that trip.)
            renew_ahead_ms: 1_000,
            keep_warm_ms: u64::try_from(config.keep_warm.as_millis()).unwrap_or(u64::MAX),
            // An exchange is the node's own store calls, not `POST /v1/lease`: it may carry
            // more than a proxy's call, so many warm quotas renew in time (1,024 a tick is
            // about 20,000 a second at the default tick).
            max_items_per_call: 1_024,
            // A cold quota's first lease is the decision of the check that waited for it
            // plus a few units for the requests after it, so they do not wait again.
            min_lease_units: 8,
            // One exchange a tick carries every quota's asks: asking for a spent one costs no
            // call, and a check waiting cold is answered by the next exchange.
            remember_spent: false,
            ..BookConfig::default()
        };
        Region {
            config,
            global,
            book: Mutex::new(LeaseBook::new(book)),
            link_up: Arc::new(AtomicBool::new(true)),
            probing: AtomicBool::new(false),
            landed: watch::channel(0).0,
            wake: Notify::new(),
            cold_waits: AtomicUsize::new(0),
            subleases: Mutex::new(Subleases::new(MAX_SUBLEASES)),
            counters: Arc::default(),
        }
    }

    /// Whether the last call to the global store was answered.
    pub fn link_up(&self) -> bool {
        self.link_up.load(Ordering::SeqCst)
    }

    fn book(&self) -> MutexGuard<'_, LeaseBook> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn subleases(&self) -> MutexGuard<'_, Subleases> {
        self.subleases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_link(&self, up: bool) {
        if self.link_up.swap(up, Ordering::SeqCst) != up {
            if up {
                tracing::info!(region = %self.config.name, "the global store answers again; sharing resumes");
            } else {
                tracing::warn!(region = %self.config.name, "the global store cannot be reached; global rules follow on_global_unreachable");
            }
        }
    }

    /// Counts a check's global rules decided from `source`.
    pub fn count(&self, source: Source) {
        self.counters.checks(source).fetch_add(1, Ordering::Relaxed);
    }

    /// A place among the checks waiting for a cold quota's lease, if one is free; held
    /// until dropped.
    fn cold_wait(&self) -> Option<ColdWait<'_>> {
        let before = self.cold_waits.fetch_add(1, Ordering::SeqCst);
        let wait = ColdWait(&self.cold_waits);
        (before < self.config.max_cold_waits).then_some(wait)
    }

    /// Tells cold checks an exchange with the global store ended.
    fn landed(&self) {
        self.landed.send_modify(|n| *n += 1);
    }

    /// Registers the region's metrics, the series `sluice_global_*{region}`, in the node's
    /// `registry` (prefix `sluice`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        let region = (Cow::Borrowed("region"), Cow::Owned(self.config.name.clone()));
        registry
            .sub_registry_with_prefix("global")
            .sub_registry_with_label(region)
            .register_collector(Box::new(RegionMetrics {
                link_up: self.link_up.clone(),
                counters: self.counters.clone(),
            }));
    }
}

impl Counters {
    /// The counter of checks decided from `source`.
    fn checks(&self, source: Source) -> &AtomicU64 {
        match source {
            Source::Pool => &self.from_pool,
            Source::Empty => &self.refused_empty,
            Source::CutOff => &self.refused_cut_off,
            Source::Alone => &self.decided_alone,
            Source::Cold => &self.cold_admitted,
            Source::ColdOverCap => &self.cold_over_cap,
            Source::ColdTimedOut => &self.cold_timed_out,
        }
    }
}

/// A region's metrics, read at each scrape from the atomics the region bumps.
#[derive(Debug)]
struct RegionMetrics {
    link_up: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

/// The `result` label of `sluice_global_lease_calls_total`.
#[derive(EncodeLabelSet)]
struct CallResult {
    result: &'static str,
}

/// The `kind` label of `sluice_global_lease_units_total` and `sluice_global_sublease_units_total`.
#[derive(EncodeLabelSet)]
struct UnitsKind {
    kind: &'static str,
}

/// The `source` label of `sluice_global_checks_total`.
#[derive(EncodeLabelSet)]
struct CheckSource {
    source: Source,
}

impl Collector for RegionMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let c = &self.counters;
        let get = |v: &AtomicU64| ConstCounter::new(v.load(Ordering::Relaxed));
        let e = &mut encoder;
        encode_one(
            e,
            "link_up",
            "Whether the last call to the global store was answered.",
            ConstGauge::new(i64::from(self.link_up.load(Ordering::SeqCst))),
        )?;
        encode_family(
            e,
            "lease_calls",
            "Lease calls to the global store by result.",
            [
                (CallResult { result: "ok" }, get(&c.calls_ok)),
                (CallResult { result: "failed" }, get(&c.calls_failed)),
            ],
        )?;
        encode_family(
            e,
            "lease_units",
            "Units of global quotas leased by this node, and given back.",
            [
                (UnitsKind { kind: "granted" }, get(&c.units_granted)),
                (UnitsKind { kind: "returned" }, get(&c.units_returned)),
            ],
        )?;
        encode_family(
            e,
            "sublease_units",
            "Units of global quotas this node handed on to proxies leasing through it, and took back.",
            [
                (UnitsKind { kind: "handed_on" }, get(&c.units_handed_on)),
                (UnitsKind { kind: "taken_back" }, get(&c.units_taken_back)),
            ],
        )?;
        encode_family(
            e,
            "checks",
            "Checks with global rules, by how those were decided.",
            Source::ALL.map(|source| (CheckSource { source }, get(c.checks(source)))),
        )
    }
}

/// A check's place among those waiting for a cold quota's lease.
struct ColdWait<'a>(&'a AtomicUsize);

impl Drop for ColdWait<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
