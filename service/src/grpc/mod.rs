//! Envoy's rate limit service API over gRPC: `envoy.service.ratelimit.v3.RateLimitService`
//! and the standard health service, so Envoy's `envoy.filters.http.ratelimit` (as Istio,
//! Envoy Gateway, Contour and others configure it) can use Sluice in place of
//! envoyproxy/ratelimit or Limitador.
//!
//! Requests are matched against an envoyproxy/ratelimit configuration ([`config`],
//! `crate::grpc::descriptors`) and decided like the HTTP check ([`crate::decide::decide_limits`]):
//! all of a request's descriptors in one store call, all-or-nothing.

pub mod config;
pub mod descriptors;
pub mod rlqs;
mod rls;

use std::sync::Arc;

use tokio::sync::watch;

use crate::edge::Edge;
use crate::node::Node;

pub use rls::{AnswerHeaders, RateLimiter};

/// The messages of Envoy's API (compiled from `service/proto` by `build.rs`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod envoy {
    /// `envoy.config.core.v3`.
    pub mod config {
        /// `envoy.config.core`.
        pub mod core {
            /// `envoy.config.core.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// `envoy.extensions.common.ratelimit.v3`.
    pub mod extensions {
        /// `envoy.extensions.common`.
        pub mod common {
            /// `envoy.extensions.common.ratelimit`.
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// `envoy.type`.
    pub mod r#type {
        /// `envoy.type.v3`.
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    /// `envoy.service`.
    pub mod service {
        /// `envoy.service.rate_limit_quota`.
        pub mod rate_limit_quota {
            /// `envoy.service.rate_limit_quota.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
        /// `envoy.service.ratelimit`.
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
}

use envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// Serves `limiter`, the quota service if given, and the health service on `listener`
/// through `edge` until `stop` says so. With a data token set, a call without it is
/// `UNAUTHENTICATED` and decides nothing (the health service answers anyone).
pub async fn serve(
    listener: impl Into<crate::listen::Listener>,
    limiter: RateLimiter,
    quota: Option<rlqs::QuotaService>,
    edge: Edge,
    stop: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitServiceServer<RateLimiter>>().await;
    let keep_alive = Some(edge.header_timeout);
    let gate: Arc<Node> = limiter.node().clone();
    let authenticate = move |call: tonic::Request<()>| {
        let given = call.metadata().get(gate.config.token_header.as_str());
        if gate.authenticated(given.map(|v| v.as_bytes())) {
            Ok(call)
        } else {
            Err(tonic::Status::unauthenticated(
                "missing or wrong credential: send the token of the node's --data-token-file",
            ))
        }
    };
    let quota = match quota {
        Some(q) => {
            health
                .set_serving::<RateLimitQuotaServiceServer<rlqs::QuotaService>>()
                .await;
            Some(RateLimitQuotaServiceServer::with_interceptor(q, authenticate.clone()))
        }
        None => None,
    };
    let rate_limits = RateLimitServiceServer::with_interceptor(limiter, authenticate);
    let mut stopped = stop.clone();
    tonic::transport::Server::builder()
        .http2_keepalive_interval(keep_alive)
        .http2_keepalive_timeout(keep_alive)
        .add_service(health_service)
        .add_service(rate_limits)
        .add_optional_service(quota)
        .serve_with_incoming_shutdown(edge.incoming(listener, stop), async move {
            if stopped.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await
}
