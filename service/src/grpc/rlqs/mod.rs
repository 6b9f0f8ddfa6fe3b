//! Envoy's rate limit quota service (RLQS,
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`): Envoy's
//! `envoy.filters.http.rate_limit_quota` reports how each of its buckets is used, and
//! Sluice answers with **assignments**, token buckets Envoy enforces locally, each one a lease
//! of the bucket's rule quota ([`crate::exchange::exchange`]), so every Envoy of every node
//! together stays within the bound docs/design.md states for leases.
//!
//! [`bucket`] maps a `BucketId` to a rule and an identity, [`assign`] sizes assignments, and
//! `book` holds every stream's buckets and renews their assignments on a tick, deciding each
//! bucket's step in `walk`.

pub mod assign;
mod book;
pub mod bucket;
mod walk;

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

pub use book::{Book, Usage, MAX_ASKS_PER_TICK, TICK};
pub use walk::RENEW_MARGIN_MS;

use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use super::envoy::service::rate_limit_quota::v3::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::node::Node;

/// How many buckets a node follows, and for how long unused.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Buckets one stream may subscribe; usages of more are ignored.
    pub buckets_per_stream: usize,
    /// Buckets the node follows over all its streams.
    pub buckets_per_node: usize,
    /// A bucket whose reports show no request for this long is abandoned.
    pub idle_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            buckets_per_stream: 10_000,
            buckets_per_node: 200_000,
            idle_ms: 60_000,
        }
    }
}

/// What a bucket no leased rule matches is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UnknownBuckets {
    /// `abandon`: Envoy forgets the bucket and its own `no_assignment_behavior` decides its
    /// requests (and subscribes it again on the next one).
    #[default]
    Abandon,
    /// `ALLOW_ALL` for 30 s at a time.
    Allow,
    /// `DENY_ALL` for 30 s at a time.
    Deny,
}

/// An answer on a stream.
pub type Answer = Result<RateLimitQuotaResponse, Status>;

/// The service: one task per stream reads its reports into the [`Book`].
#[derive(Clone)]
pub struct QuotaService {
    book: Arc<Book>,
}

impl QuotaService {
    /// A service over `node`; its book's tick runs until `stop` says so.
    pub fn start(
        node: Arc<Node>,
        limits: Limits,
        unknown: UnknownBuckets,
        mut stop: watch::Receiver<bool>,
    ) -> QuotaService {
        let book = Arc::new(Book::new(node, limits, unknown));
        let ticking = book.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            tokio::pin!(stopped);
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => ticking.tick().await,
                    () = &mut stopped => return,
                }
            }
        });
        QuotaService { book }
    }

    /// The book, for metrics and tests.
    pub fn book(&self) -> &Arc<Book> {
        &self.book
    }
}

/// Forgets a stream when its reading task ends, however it ends.
struct Closing(Arc<Book>, u64);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Pin<Box<dyn Stream<Item = Answer> + Send + 'static>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let mut reports = request.into_inner();
        let first = reports
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before its first usage report"))?;
        if first.domain.is_empty() {
            return Err(Status::invalid_argument(
                "the stream's first usage report must name its domain (RateLimitQuotaUsageReports.domain)",
            ));
        }
        let (out, answers) = mpsc::channel(64);
        let domain = first.domain.clone();
        let id = self.book.open(domain.clone(), out.clone());
        let book = self.book.clone();
        tokio::spawn(async move {
            let _closing = Closing(book.clone(), id);
            let mut next = Some(first);
            while let Some(message) = next {
                if !message.domain.is_empty() && message.domain != domain {
                    let why = format!(
                        "a stream keeps its first domain ({domain:?}, not {:?}): open another stream for another domain",
                        message.domain
                    );
                    let _ = out.send(Err(Status::invalid_argument(why))).await;
                    return;
                }
                read(&book, id, message.bucket_quota_usages);
                next = reports.message().await.ok().flatten();
            }
        });
        let answers = tokio_stream::wrappers::ReceiverStream::new(answers);
        Ok(Response::new(Box::pin(answers)))
    }
}

/// Hands a message's usages to the book; ill-formed ones are counted and skipped.
fn read(book: &Book, stream: u64, usages: Vec<BucketQuotaUsage>) {
    let mut malformed = 0;
    let read: Vec<Usage> = usages
        .into_iter()
        .filter_map(|u| {
            let key = u
                .bucket_id
                .as_ref()
                .map_or(Err(bucket::Malformed::Empty), |b| bucket::key_of(&b.bucket));
            let key = key
                .map_err(|why| tracing::debug!(stream, why = why.label(), "RLQS: a usage skipped"))
                .ok();
            malformed += usize::from(key.is_none());
            let elapsed = u.time_elapsed.unwrap_or_default();
            let elapsed_ms = u64::try_from(elapsed.seconds).unwrap_or(0).saturating_mul(1_000)
                + u64::try_from(elapsed.nanos / 1_000_000).unwrap_or(0);
            Some(Usage {
                key: key?,
                used: u.num_requests_allowed.saturating_add(u.num_requests_denied),
                elapsed_ms,
            })
        })
        .collect();
    book.stats()
        .ignored
        .fetch_add(malformed as u64, std::sync::atomic::Ordering::Relaxed);
    let over = book.report(stream, read);
    if malformed + over > 0 {
        tracing::warn!(stream, malformed, over_the_limits = over, "RLQS: bucket usages ignored");
    }
}

/// Building the answers.
mod action {
    use std::collections::HashMap;

    use super::super::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as Proto};
    use super::super::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
    use super::super::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
        AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
    };
    use super::super::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
    use super::super::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
    use super::assign::{Strategy, NEVER_S};
    use super::bucket::BucketKey;

    /// One bucket's action.
    pub type Action = BucketAction;

    fn id(key: &BucketKey) -> Option<BucketId> {
        let bucket: HashMap<String, String> = key.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Some(BucketId { bucket })
    }

    fn seconds(s: u64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration {
            seconds: i64::try_from(s).unwrap_or(i64::MAX),
            nanos: 0,
        })
    }

    /// Enforce `strategy` on the bucket for `ttl_s` seconds.
    pub fn assign(key: &BucketKey, strategy: Strategy, ttl_s: u64) -> Action {
        let strategy = match strategy {
            Strategy::Bucket { burst, per_s } => Proto::TokenBucket(TokenBucket {
                max_tokens: u32::try_from(burst).unwrap_or(u32::MAX),
                tokens_per_fill: Some(u32::try_from(per_s.max(1)).unwrap_or(u32::MAX)),
                fill_interval: if per_s == 0 {
                    Some(prost_types::Duration {
                        seconds: NEVER_S,
                        nanos: 0,
                    })
                } else {
                    seconds(1)
                },
            }),
            Strategy::DenyAll => Proto::BlanketRule(BlanketRule::DenyAll as i32),
            Strategy::AllowAll => Proto::BlanketRule(BlanketRule::AllowAll as i32),
        };
        BucketAction {
            bucket_id: id(key),
            bucket_action: Some(Kind::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: seconds(ttl_s),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        }
    }

    /// Forget the bucket.
    pub fn abandon(key: &BucketKey) -> Action {
        BucketAction {
            bucket_id: id(key),
            bucket_action: Some(Kind::AbandonAction(AbandonAction {})),
        }
    }

    /// One message carrying `actions`.
    pub fn response(actions: Vec<Action>) -> RateLimitQuotaResponse {
        RateLimitQuotaResponse { bucket_action: actions }
    }
}
