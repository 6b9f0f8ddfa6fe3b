//! A tiny upstream for the demo stack and the end-to-end tests.
//!
//! Every request gets `200 OK` with a small JSON echo of its method, path and request
//! number. `GET /__count` returns how many other requests it has served, and
//! `POST /__reset` sets that count to zero, so a test can see exactly what got through.
//! A request whose query has `tokens=N` is answered with `x-tokens-used: N`, as an LLM API
//! says what an answer cost (the filter's `debit.header`).
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// Demo upstream: answers every request with 200 and counts them (GET /__count, POST /__reset).
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}; is another process using it?", args.listen))?;
    eprintln!("demo upstream listening on http://{}", listener.local_addr()?);
    let served = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let served = served.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, served.clone()));
            // A client that hangs up mid-request is its own business; nothing to report.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(req: Request<Incoming>, served: Arc<AtomicU64>) -> Result<Response<Full<Bytes>>, Infallible> {
    let tokens = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("tokens=")))
        .and_then(|n| n.parse::<u64>().ok());
    let body = match (req.method(), req.uri().path()) {
        (&Method::GET, "/__count") => format!("{{\"served\":{}}}\n", served.load(Ordering::Relaxed)),
        (&Method::POST, "/__reset") => {
            served.store(0, Ordering::Relaxed);
            "{\"served\":0}\n".to_owned()
        }
        (method, path) => {
            let n = served.fetch_add(1, Ordering::Relaxed) + 1;
            let path = path.replace(['"', '\\'], "");
            format!("{{\"upstream\":\"demo\",\"method\":\"{method}\",\"path\":\"{path}\",\"request\":{n}}}\n")
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Some(n) = tokens {
        response
            .headers_mut()
            .insert("x-tokens-used", hyper::header::HeaderValue::from(n));
    }
    Ok(response)
}
