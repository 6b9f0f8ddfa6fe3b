//! Latency histograms in atomics: an observation adds to one bucket, the count and the sum,
//! and takes no lock (`prometheus-client`'s `Histogram` takes a mutex per observation).
//! `sluice_store_latency_seconds` is one; `sluice_check_duration_seconds` is one per API.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Histogram bucket upper bounds in seconds.
pub(super) const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// One histogram of durations, shared by its clones.
#[derive(Debug, Clone, Default)]
pub(super) struct Latency(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    /// Observations in each bucket of [`BUCKETS`] and no lower one (not cumulative).
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Latency {
    pub(super) fn observe(&self, d: Duration) {
        let c = &self.0;
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|bound| secs <= *bound) {
            c.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        c.count.fetch_add(1, Ordering::Relaxed);
        c.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn encode_into(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        let c = &self.0;
        let buckets =
            std::array::from_fn::<_, { BUCKETS.len() }, _>(|i| (BUCKETS[i], c.buckets[i].load(Ordering::Relaxed)));
        // Read after the buckets, and never below them: `+Inf` is the largest bucket.
        let in_buckets: u64 = buckets.iter().map(|b| b.1).sum();
        let count = c.count.load(Ordering::Relaxed).max(in_buckets);
        let sum = c.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, encoder: MetricEncoder<'_>) -> fmt::Result {
        self.encode_into(encoder)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The API a check came in by, the `api` label of `sluice_check_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/check` (and the proxy filter's checks).
    Http = 0,
    /// Envoy's rate limit service, `ShouldRateLimit`.
    GrpcRls = 1,
    /// Envoy's rate limit quota service: one store exchange that decides a tick's assignments.
    Rlqs = 2,
}

const APIS: [&str; 3] = ["http", "grpc_rls", "rlqs"];

/// `sluice_check_duration_seconds`, a histogram per [`Api`].
#[derive(Debug, Clone, Default)]
pub(super) struct CheckLatency([Latency; 3]);

/// The label of `sluice_check_duration_seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ApiLabel {
    api: &'static str,
}

impl CheckLatency {
    pub(super) fn of(&self, api: Api) -> &Latency {
        &self.0[api as usize]
    }
}

impl TypedMetric for CheckLatency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for CheckLatency {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        for (api, latency) in APIS.into_iter().zip(&self.0) {
            latency.encode_into(encoder.encode_family(&ApiLabel { api })?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Times a check from its making to its drop, into its API's histogram.
#[must_use = "the check is timed until this is dropped"]
pub struct CheckTimer<'a> {
    latency: &'a Latency,
    started: Instant,
}

impl<'a> CheckTimer<'a> {
    pub(super) fn start(latency: &'a Latency) -> Self {
        CheckTimer {
            latency,
            started: Instant::now(),
        }
    }
}

impl Drop for CheckTimer<'_> {
    fn drop(&mut self) {
        self.latency.observe(self.started.elapsed());
    }
}
