//! The client's overhead per request against plain `reqwest`, on a local server that sends
//! the rate-limit headers of a quota that never runs out.

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderValue;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use sluice_client::Client;
use sluice_core::headers::{format_headers, HeaderMode, Quota};

async fn hello() -> axum::response::Response {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let quota = Quota {
        policy: "bench",
        limit: 1_000_000_000,
        remaining: 999_999_999,
        reset_after_ms: 1_000,
        window_ms: 1_000,
        retry_after_ms: None,
        now_ms,
    };
    let mut headers = Vec::new();
    format_headers(&quota, HeaderMode::All, &mut headers);
    let mut response = "hello".into_response();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn overhead(c: &mut Criterion) {
    // The server on its own thread; the clients on a current-thread runtime.
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let listener = server
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let url = format!("http://{}/hello", listener.local_addr().expect("address"));
    server.spawn(async move { axum::serve(listener, Router::new().route("/hello", get(hello))).await });

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let plain = reqwest::Client::new();
    let sluice = Client::builder().http_client(plain.clone()).build().expect("client");

    let mut group = c.benchmark_group("request");
    group.bench_function("reqwest", |b| {
        b.iter(|| {
            rt.block_on(async {
                let response = plain.get(&url).send().await.expect("response");
                response.bytes().await.expect("body")
            })
        })
    });
    group.bench_function("sluice_client", |b| {
        b.iter(|| {
            rt.block_on(async {
                let response = sluice.send(sluice.get(&url)).await.expect("response");
                response.into_inner().bytes().await.expect("body")
            })
        })
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
