//! `sluice-noop`: the ceiling a check is measured against (BENCHMARKS.md, scripts/bench-service).
//! The service's HTTP stack — tokio's multi-thread runtime, axum's router with the same body
//! limit, hyper, mimalloc — answering `POST /v1/check` as a no-op: it reads the body and
//! answers a fixed check answer of a real one's size. What a check costs beyond this is
//! Sluice's own work (parsing, matching, deciding, the answer's JSON), not HTTP's.
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::routing::{get, post};
use axum::Router;
use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A no-op check service: the HTTP ceiling of sluice-service.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
}

/// A one-rule check answer as sluice-service writes it (its size is what matters).
const ANSWER: &str = r#"{"allowed":true,"limit":50000000,"remaining":49999993,"reset_after_ms":52081,"retry_after_ms":0,"reset_at":1795621140,"policy":"per-ip","window_ms":60000,"rules":[{"name":"per-ip","allowed":true,"limit":50000000,"remaining":49999993,"reset_after_ms":52081}],"delay_ms":0,"degraded":false}"#;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let app = Router::new()
                .route(
                    "/v1/check",
                    post(|body: Bytes| async move {
                        std::hint::black_box(body);
                        ([(header::CONTENT_TYPE, "application/json")], ANSWER)
                    }),
                )
                .route("/healthz", get(|| async { "ok" }))
                .layer(DefaultBodyLimit::max(16 * 1024)); // the service's BODY_LIMIT
            let listener = tokio::net::TcpListener::bind(args.listen).await?;
            axum::serve(listener, app).await?;
            Ok(())
        })
}
