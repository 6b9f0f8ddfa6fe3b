//! Per-request cost of hosting a module: the probe's no-op path and its "read every header,
//! add one" path, in library mode (one stream's hooks on the virtual clock) and in proxy
//! mode (a real HTTP request through the proxy to a local upstream, one at a time).
//!
//! `cargo bench -p sluice-harness --bench per_request`

// `criterion_group!` writes an undocumented `pub fn`.
#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_harness::proxy::{serve, ProxyConfig};
use sluice_harness::{Flavor, Host, HostOptions};

const HEADERS: [(&str, &str); 8] = [
    (":method", "GET"),
    (":path", "/api/search?q=sluice"),
    (":authority", "api.example.test"),
    ("user-agent", "bench/1.0"),
    ("accept", "*/*"),
    ("x-forwarded-for", "203.0.113.9"),
    ("x-user-id", "42"),
    ("x-probe", "noop"),
];

fn one_stream(host: &mut Host, headers: &[(&str, &str)]) {
    let s = host.new_stream().unwrap();
    host.request_headers(s, headers, true).unwrap();
    host.response_headers(s, &[(":status", "200"), ("content-length", "0")], true)
        .unwrap();
    host.finish_stream(s).unwrap();
}

fn library(c: &mut Criterion) {
    let mut host = common::host_with("", HostOptions::default());
    let mut add = HEADERS;
    add[7] = ("x-probe", "add");
    let mut g = c.benchmark_group("harness_library");
    g.bench_function("noop_module", |b| b.iter(|| one_stream(&mut host, &HEADERS)));
    g.bench_function("read_all_headers_add_one", |b| b.iter(|| one_stream(&mut host, &add)));
    g.finish();
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// `iters` requests one after another over a kept-alive connection; their total time.
async fn sequential(client: &HttpClient, addr: SocketAddr, mode: &'static str, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let req = Request::get(format!("http://{addr}/api/search?q=sluice"))
            .header("x-forwarded-for", "203.0.113.9")
            .header("x-user-id", "42")
            .header("x-probe", mode)
            .body(Full::default())
            .unwrap();
        let resp = client.request(req).await.unwrap();
        resp.into_body().collect().await.unwrap();
    }
    start.elapsed()
}

fn proxy(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (proxy_addr, upstream_addr) = rt.block_on(async {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = upstream.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = listener.local_addr().unwrap();
        let config = ProxyConfig {
            wasm: Some(common::wasm().to_vec()),
            plugin_config: Vec::new(),
            upstream: upstream_addr,
            clusters: HashMap::new(),
            flavor: Flavor::Envoy,
            admin: None,
            xff_num_trusted_hops: 0,
        };
        tokio::spawn(async move { serve(config, listener).await });
        (proxy_addr, upstream_addr)
    });
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut g = c.benchmark_group("harness_proxy");
    g.measurement_time(Duration::from_secs(5));
    let (rt, client) = (&rt, &client);
    let run = |addr, mode| move |iters| rt.block_on(sequential(client, addr, mode, iters));
    g.bench_function("direct_to_upstream_baseline", |b| {
        b.iter_custom(run(upstream_addr, "noop"))
    });
    g.bench_function("noop_module", |b| b.iter_custom(run(proxy_addr, "noop")));
    g.bench_function("read_all_headers_add_one", |b| b.iter_custom(run(proxy_addr, "add")));
    g.finish();
}

criterion_group!(benches, library, proxy);
criterion_main!(benches);
