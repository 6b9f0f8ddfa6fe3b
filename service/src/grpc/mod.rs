//! Envoy's rate limit service API over gRPC: `envoy.service.ratelimit.v3.RateLimitService`
//! and the standard health service, so Envoy's `envoy.filters.http.ratelimit` (as Istio,
//! Envoy Gateway, Contour and others configure it) can use Sluice in place of
//! envoyproxy/ratelimit or Limitador.
//!
//! Requests are matched against an envoyproxy/ratelimit configuration ([`config`],
//! `sluice_core::descriptors`) and decided like the HTTP check ([`crate::check::decide`]):
//! all of a request's descriptors in one store call, all-or-nothing.

pub mod config;
mod rls;

use std::future::Future;
use std::sync::Arc;

use sluice_core::descriptors::DescriptorSet;
use tokio::net::TcpListener;

use crate::node::Node;

pub use rls::RateLimiter;

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
    /// `envoy.service.ratelimit.v3`.
    pub mod service {
        /// `envoy.service.ratelimit`.
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
}

use envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// Serves the rate limit and health services on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    descriptors: Arc<DescriptorSet>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitServiceServer<RateLimiter>>().await;
    // TCP_NODELAY, as tonic sets when it binds itself (a listener handed in gets none): an
    // answer goes out as several HTTP/2 frames in separate writes, and with Nagle's algorithm
    // the later ones waited for the client's delayed ACK — 40 ms a call, measured.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(RateLimitServiceServer::new(RateLimiter::new(node, descriptors)))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
