//! `ShouldRateLimit`: a request's descriptors → the configured limits → one all-or-nothing
//! store decision → per-descriptor statuses and Sluice's rate-limit headers.

use std::borrow::Cow;
use std::sync::Arc;

use crate::grpc::descriptors::{DescriptorLimit, DescriptorSet, Unit};
use sluice_core::headers::{format_headers, HeaderMode, Quota};
use sluice_core::rules::FailureMode;
use sluice_core::wire::{headline, MAX_COST};
use sluice_core::Decision;
use tonic::{Request, Response, Status};

use super::envoy::config::core::v3::HeaderValue;
use super::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use super::envoy::r#type::v3::RateLimitUnit;
use super::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use super::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use super::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use super::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::decide::{count, decide_limits, settle, verdict, Matched, Target};
use crate::metrics::Api;
use crate::node::Node;
use crate::trace;

/// Descriptors per request, and entries per descriptor, accepted at most.
const MAX_DESCRIPTORS: usize = 64;
const MAX_ENTRIES: usize = 32;
/// Bytes of one entry's key or value accepted at most.
const MAX_ENTRY_BYTES: usize = 1_024;

/// Which answers carry Sluice's rate-limit headers in `response_headers_to_add`.
///
/// The descriptor statuses always carry the limit, what remains and the reset; Envoy can
/// turn them into `X-RateLimit-*` headers itself (`enable_x_ratelimit_headers`). What only
/// Sluice adds is the IETF `RateLimit`/`RateLimit-Policy` pair and `Retry-After`: about 230
/// bytes on every answer that carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AnswerHeaders {
    /// None: the statuses alone (envoyproxy/ratelimit's default).
    Never,
    /// On an OVER_LIMIT answer only, where `Retry-After` tells the client when to come back.
    #[default]
    Refusals,
    /// On every answer.
    Always,
}

/// The rate limit service.
pub struct RateLimiter {
    node: Arc<Node>,
    headers: AnswerHeaders,
}

impl RateLimiter {
    /// A service deciding over `node`'s store by `descriptors` (put in force on `node`,
    /// where a reload replaces them: [`Node::set_descriptors`]), adding headers to the
    /// answers `headers` names.
    pub fn new(node: Arc<Node>, descriptors: Arc<DescriptorSet>, headers: AnswerHeaders) -> RateLimiter {
        node.set_descriptors(descriptors);
        RateLimiter::on_node(node, headers)
    }

    /// A service deciding by the descriptor set in force on `node` (put there, and
    /// reloaded, by [`Node::set_descriptors`]).
    pub fn on_node(node: Arc<Node>, headers: AnswerHeaders) -> RateLimiter {
        RateLimiter { node, headers }
    }

    /// The node it decides over.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

/// A descriptor that falls under a limit (configured, or the request's own), as the
/// decision step carries it.
struct Limited<'a> {
    /// The descriptor's place in the request.
    index: usize,
    limit: &'a DescriptorLimit,
    matched: Matched<'a>,
}

/// A limit a request sets for one of its descriptors: requests per unit.
type RequestLimit = (u64, Unit);

/// The limits of the request's descriptors and their counters' identities: the
/// configured ones, each replaced by the descriptor's own limit when it sets one.
fn limits_of<'s>(
    descriptors: &'s DescriptorSet,
    domain: &str,
    asked: &[Descriptor<'_>],
) -> Vec<Option<(Cow<'s, DescriptorLimit>, String)>> {
    let configured = descriptors.limits_for(domain, asked.iter().map(|d| d.entries.as_slice()));
    configured
        .into_iter()
        .zip(asked)
        .map(|(found, d)| {
            let overridden = d
                .own
                .and_then(|(per, unit)| descriptors.overridden(domain, &d.entries, per, unit));
            match overridden {
                Some((limit, identity)) => Some((Cow::Owned(limit), identity)),
                None => found.map(|(limit, identity)| (Cow::Borrowed(limit), identity)),
            }
        })
        .collect()
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let span = (self.node.config.traces).start("grpc", &trace::GrpcMetadata(request.metadata()));
        let answer = trace::within(span.as_ref(), self.decide(request.into_inner())).await;
        if let Ok(answer) = &answer {
            let answer = answer.get_ref();
            trace::finish(
                span,
                shown_rule(&answer.statuses),
                answer.overall_code == Code::Ok as i32,
            );
        }
        answer
    }
}

/// The limit a traced answer names: the first that refused, else the one with the least
/// left.
fn shown_rule(statuses: &[DescriptorStatus]) -> Option<&str> {
    let limited = || statuses.iter().filter(|s| s.current_limit.is_some());
    limited()
        .find(|s| s.code == Code::OverLimit as i32)
        .or_else(|| limited().min_by_key(|s| s.limit_remaining))
        .and_then(|s| Some(s.current_limit.as_ref()?.name.as_str()))
}

impl RateLimiter {
    /// `ShouldRateLimit` itself.
    async fn decide(&self, req: RateLimitRequest) -> Result<Response<RateLimitResponse>, Status> {
        let asked = validate(&req)?;
        let node = &*self.node;
        let _timer = node.metrics.time_check(Api::GrpcRls);
        let now = node.clock.now();
        let now_ms = now.instant_ms();
        let descriptors = node.descriptors();
        let limits = limits_of(&descriptors, &req.domain, &asked);
        let mut statuses: Vec<DescriptorStatus> = asked.iter().map(|_| ok_status()).collect();
        let mut overall = Code::Ok;
        // Counted limits go to the store; unlimited ones are OK and a limit of 0 refuses.
        let mut limited: Vec<Limited<'_>> = Vec::with_capacity(limits.len());
        for (index, found) in limits.iter().enumerate() {
            let Some((limit, identity)) = found else { continue };
            match limit.limit {
                Some(counted) => limited.push(Limited {
                    index,
                    limit,
                    matched: Matched {
                        name: &limit.name,
                        identity: Cow::Borrowed(identity),
                        window_ms: counted.window().instant_ms(),
                        global: None,
                        target: Target {
                            key: node.store.keys().limit(&limit.name, identity),
                            limit: counted,
                            shadow: limit.shadow,
                            failure: limit.failure,
                            cost: asked[index].cost,
                        },
                        decision: None,
                        at: None,
                    },
                }),
                None if limit.unlimited => statuses[index].limit_remaining = u32::MAX,
                None => {
                    count(node, &limit.name, identity, verdict(false, limit.shadow), false);
                    if !limit.shadow {
                        statuses[index].code = Code::OverLimit as i32;
                        overall = Code::OverLimit;
                    }
                }
            }
        }
        // A request one limit refuses outright consumes nothing elsewhere.
        let degraded = !limited.is_empty()
            && overall == Code::Ok
            && decide_limits(node, limited.iter_mut().map(|l| &mut l.matched)).await;
        if let Some(closed) = limited
            .iter()
            .find(|l| degraded && l.limit.failure == FailureMode::Closed && !l.limit.shadow)
        {
            return Err(Status::unavailable(format!(
                "the counter store cannot answer and limit {:?} fails closed",
                closed.limit.name
            )));
        }
        settle(node, limited.iter().map(|l| &l.matched), degraded, "", now_ms);
        for l in &limited {
            let Some(d) = &l.matched.decision else { continue };
            let over = !d.allowed && !l.limit.shadow;
            if over {
                overall = Code::OverLimit;
            }
            if let Some(status) = statuses.get_mut(l.index) {
                *status = status_of(l.limit, d, over);
            }
        }
        // The limit whose headers the response carries, as the HTTP check's answer shows it.
        let shown = headline(&limited, |l| Some((l.matched.decision.as_ref()?, l.limit.shadow)));
        let wanted = match self.headers {
            AnswerHeaders::Never => false,
            AnswerHeaders::Refusals => overall == Code::OverLimit,
            AnswerHeaders::Always => true,
        };
        let response_headers_to_add = shown
            .filter(|_| wanted)
            .and_then(|l| Some(headers(l.limit, l.matched.decision.as_ref()?, now_ms)))
            .unwrap_or_default();
        Ok(Response::new(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}

/// A descriptor's entries, `(key, value)`.
type Entries<'a> = Vec<(&'a str, &'a str)>;

/// The descriptors' entries, what the request costs each (its own `hits_addend`, else
/// the request's; 0 means 1) and the limit each sets itself, or what is wrong with the
/// request.
fn validate(req: &RateLimitRequest) -> Result<Vec<Descriptor<'_>>, Status> {
    if req.domain.is_empty() {
        return Err(Status::invalid_argument(
            "the domain is empty: name the configuration domain",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument("no descriptors: send at least one"));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "{} descriptors: at most {MAX_DESCRIPTORS} per request",
            req.descriptors.len()
        )));
    }
    let request_cost = u64::from(req.hits_addend.max(1));
    let mut all = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has {} entries: give 1 to {MAX_ENTRIES}",
                d.entries.len()
            )));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for e in &d.entries {
            if e.key.is_empty() || e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i}: an entry's key is empty or a key or value is over {MAX_ENTRY_BYTES} bytes"
                )));
            }
            entries.push((e.key.as_str(), e.value.as_str()));
        }
        let cost = d.hits_addend.map_or(request_cost, |h| u64::from(h.max(1)));
        if cost > MAX_COST {
            return Err(Status::invalid_argument(format!(
                "descriptor {i}: hits_addend {cost} is over {MAX_COST}, the most one request may cost"
            )));
        }
        all.push(Descriptor {
            entries,
            cost,
            own: d.limit.as_ref().map(|l| request_limit(i, l)).transpose()?,
        });
    }
    Ok(all)
}

/// A descriptor of a request as [`validate`] finds it.
struct Descriptor<'a> {
    /// Its entries, `(key, value)`.
    entries: Entries<'a>,
    /// What the request costs its limit: its own `hits_addend`, else the request's (0 is 1).
    cost: u64,
    /// The limit it sets itself, if any.
    own: Option<RequestLimit>,
}

/// Descriptor `i`'s own limit, or why it cannot be used (its unit unknown).
fn request_limit(i: usize, l: &RateLimitOverride) -> Result<RequestLimit, Status> {
    let unit = match RateLimitUnit::try_from(l.unit) {
        Ok(RateLimitUnit::Second) => Unit::Second,
        Ok(RateLimitUnit::Minute) => Unit::Minute,
        Ok(RateLimitUnit::Hour) => Unit::Hour,
        Ok(RateLimitUnit::Day) => Unit::Day,
        Ok(RateLimitUnit::Week) => Unit::Week,
        Ok(RateLimitUnit::Month) => Unit::Month,
        Ok(RateLimitUnit::Year) => Unit::Year,
        Ok(RateLimitUnit::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "descriptor {i}: its limit's unit is {} (unknown): give SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                l.unit
            )))
        }
    };
    Ok((u64::from(l.requests_per_unit), unit))
}

/// The status of a descriptor no limit applies to.
fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// A descriptor's status from its limit's decision.
fn status_of(limit: &DescriptorLimit, d: &Decision, over: bool) -> DescriptorStatus {
    let unit = match limit.unit {
        Some(Unit::Second) => ProtoUnit::Second,
        Some(Unit::Minute) => ProtoUnit::Minute,
        Some(Unit::Hour) => ProtoUnit::Hour,
        Some(Unit::Day) => ProtoUnit::Day,
        Some(Unit::Week) => ProtoUnit::Week,
        Some(Unit::Month) => ProtoUnit::Month,
        Some(Unit::Year) => ProtoUnit::Year,
        None => ProtoUnit::Unknown,
    };
    let reset = d.reset_after.to_duration();
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(RateLimit {
            name: limit.name.clone(),
            requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
            unit: unit as i32,
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(prost_types::Duration {
            seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
        }),
    }
}

/// Sluice's rate-limit headers for `limit`'s decision (`RateLimit`, `RateLimit-Policy`,
/// `X-RateLimit-*`, and `Retry-After` on a denial), for Envoy to add to the response.
fn headers(limit: &DescriptorLimit, d: &Decision, now_ms: u64) -> Vec<HeaderValue> {
    let window_ms = limit.limit.map_or(0, |l| l.window().instant_ms());
    let quota = Quota {
        policy: &limit.name,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after.wait_ms(),
        window_ms,
        retry_after_ms: (!d.allowed).then(|| d.retry_after.wait_ms()),
        now_ms,
    };
    let mut out = Vec::new();
    format_headers(&quota, HeaderMode::All, &mut out);
    out.into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_owned(),
            value,
            ..HeaderValue::default()
        })
        .collect()
}
