//! The harness in proxy mode: real HTTP through the probe module to a real upstream, with
//! dispatched calls going to a real backend over loopback.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_harness::proxy::{serve, ProxyConfig};
use sluice_harness::Flavor;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Serves `answer` on a free loopback port; returns its address.
async fn server<F, Fut>(answer: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// The upstream: counts requests and echoes the request headers it received as `name: value`
/// lines (a value that is not text with its bytes escaped: `caf\xe9`).
async fn upstream(count: Arc<AtomicUsize>) -> SocketAddr {
    server(move |req: Request<Incoming>| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            let mut lines = String::new();
            for (k, v) in req.headers() {
                let value = v
                    .to_str()
                    .map_or_else(|_| v.as_bytes().escape_ascii().to_string(), str::to_owned);
                lines.push_str(&format!("{k}: {value}\n"));
            }
            Response::new(Full::new(Bytes::from(lines)))
        }
    })
    .await
}

/// A call the backend holds until the test releases it.
#[derive(Default)]
struct Hold {
    arrived: Notify,
    release: Notify,
}

/// The cluster `backend`: `/slow?ms=N` answers after N ms, `/hold` when released, anything
/// else at once.
async fn backend(hold: Arc<Hold>) -> SocketAddr {
    server(move |req: Request<Incoming>| {
        let hold = hold.clone();
        async move {
            let path = req.uri().to_string();
            if let Some(ms) = path.strip_prefix("/slow?ms=").and_then(|ms| ms.parse().ok()) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if path == "/hold" {
                hold.arrived.notify_one();
                hold.release.notified().await;
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut r = Response::new(Full::new(Bytes::from(format!(
                "pong to {}",
                String::from_utf8_lossy(&body)
            ))));
            r.headers_mut().insert("x-backend", "yes".parse().unwrap());
            r
        }
    })
    .await
}

struct Stack {
    proxy: SocketAddr,
    admin: SocketAddr,
    upstream_requests: Arc<AtomicUsize>,
    hold: Arc<Hold>,
    client: Client<HttpConnector, Full<Bytes>>,
}

async fn stack(plugin_config: &str) -> Stack {
    let wasm = tokio::task::spawn_blocking(|| common::wasm().to_vec()).await.unwrap();
    stack_with(Some(wasm), plugin_config).await
}

/// The proxy in front of the counting upstream, running `wasm` (or no module).
async fn stack_with(wasm: Option<Vec<u8>>, plugin_config: &str) -> Stack {
    let upstream_requests = Arc::new(AtomicUsize::new(0));
    let up = upstream(upstream_requests.clone()).await;
    let hold = Arc::new(Hold::default());
    let backend = backend(hold.clone()).await;
    // The cluster's first endpoint refuses connections: calls must pass to the second.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let config = ProxyConfig {
        wasm,
        plugin_config: plugin_config.as_bytes().to_vec(),
        upstream: up,
        clusters: HashMap::from([("backend".to_owned(), vec![free, backend])]),
        flavor: Flavor::Envoy,
        admin: Some(admin),
        xff_num_trusted_hops: 0,
    };
    tokio::spawn(async move { serve(config, listener).await });
    Stack {
        proxy,
        admin,
        upstream_requests,
        hold,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl Stack {
    async fn get(&self, headers: &[(&str, &str)]) -> Answer {
        self.get_from(self.proxy, "/hello", headers).await
    }

    async fn get_from(&self, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::get(format!("http://{addr}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self.client.request(req.body(Full::default()).unwrap()).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }
}

fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pass_through_the_module_both_ways() {
    let s = stack("").await;
    let a = s.get(&[("x-probe", "add"), ("x-one", "1")]).await;
    assert_eq!(a.status, 200);
    // The upstream saw the header the module added on the way in...
    assert!(a.body.contains("x-probe-count: "), "{}", a.body);
    assert!(a.body.contains("x-one: 1"), "{}", a.body);
    // ...and the response hook ran on the way back.
    assert_eq!(header(&a, "x-probe-response"), Some("add 200"));
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_values_with_obs_text_pass_through_the_module_as_bytes() {
    let s = stack("").await;
    let obs = hyper::header::HeaderValue::from_bytes(b"caf\xe9").unwrap();
    let req = Request::get(format!("http://{}/hello", s.proxy))
        .header("x-probe", "noop")
        .header("x-obs", obs);
    let resp = s.client.request(req.body(Full::default()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    // The proxy forwards the module's header map: the value's bytes were in it.
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("x-obs: caf\\xe9\n"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_response_never_reaches_the_upstream() {
    let s = stack("").await;
    let a = s.get(&[("x-probe", "respond")]).await;
    assert_eq!((a.status, a.body.as_str()), (418, "short and stout"));
    assert_eq!(header(&a, "x-probe"), Some("teapot"));
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatched_calls_go_over_real_http_to_the_cluster() {
    let s = stack("").await;
    let a = s.get(&[("x-probe", "call")]).await;
    assert_eq!(a.status, 200);
    assert!(a.body.contains("x-call-status: 200"), "{}", a.body);
    assert!(a.body.contains("x-call-body: pong to ping"), "{}", a.body);
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_timeout_arrives_without_headers() {
    let s = stack("").await;
    let a = s
        .get(&[
            ("x-probe", "call"),
            ("x-call-path", "/slow?ms=3000"),
            ("x-timeout-ms", "100"),
        ])
        .await;
    assert_eq!((a.status, a.body.as_str()), (504, "call timed out"));
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_a_call_does_not_block_others() {
    let s = Arc::new(stack("").await);
    let held = {
        let s = s.clone();
        tokio::spawn(async move {
            s.get(&[("x-probe", "call"), ("x-call-path", "/hold"), ("x-timeout-ms", "60000")])
                .await
        })
    };
    s.hold.arrived.notified().await;
    // The held request is paused in the VM on its call; others must still get through.
    let quick = async {
        for _ in 0..20 {
            assert_eq!(s.get(&[("x-probe", "noop")]).await.status, 200);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), quick)
        .await
        .expect("quick requests waited behind the paused one");
    assert!(!held.is_finished());
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 20);
    s.hold.release.notify_one();
    let a = held.await.unwrap();
    assert_eq!(a.status, 200);
    assert!(a.body.contains("x-call-body: pong to ping"), "{}", a.body);
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_run_on_the_real_clock() {
    let s = stack("tick=20").await;
    let a = s.get(&[("x-probe", "pause")]).await;
    assert_eq!(a.status, 200, "the tick resumed the paused request");
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_module_every_request_is_forwarded_untouched() {
    let s = stack_with(None, "").await;
    let a = s.get(&[("x-probe", "respond"), ("x-one", "1")]).await;
    // The probe module would have answered 418; with no module the upstream answers.
    assert_eq!(a.status, 200);
    assert!(a.body.contains("x-one: 1"), "{}", a.body);
    assert!(!a.body.contains("x-probe-count"), "{}", a.body);
    assert_eq!(s.upstream_requests.load(Ordering::SeqCst), 1);
    let stats = s.get_from(s.admin, "/stats", &[]).await;
    let stats: serde_json::Value = serde_json::from_str(&stats.body).unwrap();
    assert_eq!(
        (stats["requests"].as_u64(), stats["vm_memory_bytes"].as_u64()),
        (Some(1), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_reports_requests_calls_memory_and_metrics() {
    let s = stack("").await;
    s.get(&[("x-probe", "call")]).await;
    s.get(&[("x-probe", "metrics")]).await;
    s.get(&[("x-probe", "metrics")]).await;
    let a = s.get_from(s.admin, "/stats", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(header(&a, "content-type"), Some("application/json"));
    let stats: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    assert_eq!(stats["requests"].as_u64(), Some(3), "{stats}");
    assert_eq!(stats["calls"].as_u64(), Some(1), "{stats}");
    assert_eq!(stats["calls_failed"].as_u64(), Some(0), "{stats}");
    assert_eq!(stats["metrics"]["probe_requests"].as_i64(), Some(2), "{stats}");
    // A wasm page is 64 KiB; a running module has at least one.
    assert!(stats["vm_memory_bytes"].as_u64().unwrap() >= 65_536, "{stats}");
    assert_eq!(s.get_from(s.admin, "/other", &[]).await.status, 404);
}
