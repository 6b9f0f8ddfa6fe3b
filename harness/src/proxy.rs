//! Proxy mode: a real HTTP/1.1 proxy that runs a module on every request.
//!
//! One thread owns the VM (as each Envoy worker owns one); the network side runs on tokio
//! and talks to it by messages, so a request paused on a check call never blocks others.
//! Calls the module dispatches go over real HTTP (pooled keep-alive connections) to the
//! named clusters with their timeouts; a failed or timed-out call is delivered with no
//! headers, as Envoy does. The clock is real, and ticks fire on time.
//!
//! With no module the proxy only forwards, which is the baseline a module's cost is measured
//! against. An optional admin listener answers `GET /stats` (like Envoy's admin port) with
//! requests, calls, the VM's linear memory and the module's metrics, as JSON.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::oneshot;

use crate::{CallResponse, Flavor, HarnessError, Host, HostOptions, Outcome};

/// How to run the proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The module; `None` forwards every request untouched (the baseline for benchmarks).
    pub wasm: Option<Vec<u8>>,
    /// The plugin configuration handed to `proxy_on_configure`.
    pub plugin_config: Vec<u8>,
    /// Where requests the module lets through go.
    pub upstream: SocketAddr,
    /// Cluster name → its endpoints for dispatched calls (Nginx flavour: `host:port` works
    /// as is). Calls take the endpoints in turn; one that refuses the connection passes the
    /// call to the next, as Envoy's connect-failure retry does.
    pub clusters: HashMap<String, Vec<SocketAddr>>,
    /// Which host to imitate.
    pub flavor: Flavor,
    /// Where to answer `GET /stats`, if anywhere.
    pub admin: Option<SocketAddr>,
}

/// What the proxy has done so far, as `GET /stats` on the admin listener reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyStats {
    /// Requests received from clients.
    pub requests: u64,
    /// Calls the module dispatched (check calls, for Sluice's filter).
    pub calls: u64,
    /// Dispatched calls that failed or timed out.
    pub calls_failed: u64,
    /// Size of the VM's linear memory in bytes (0 with no module).
    pub vm_memory_bytes: u64,
    /// The module's counters and gauges by name.
    pub metrics: BTreeMap<String, i64>,
}

impl ProxyStats {
    /// The stats as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests,
            "calls": self.calls,
            "calls_failed": self.calls_failed,
            "vm_memory_bytes": self.vm_memory_bytes,
            "metrics": self.metrics,
        })
    }
}

/// Headers between the network and the VM: values as the bytes that came (a proxy passes
/// obs-text, 0x80–0xFF, on to the module).
type Headers = crate::state::HeaderMap;

enum Verdict {
    Forward {
        stream: u32,
        headers: Headers,
    },
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
}

enum Cmd {
    Request {
        headers: Headers,
        peer: SocketAddr,
        reply: oneshot::Sender<Verdict>,
    },
    Response {
        stream: u32,
        headers: Headers,
        reply: oneshot::Sender<Headers>,
    },
    Abort {
        stream: u32,
    },
    CallDone {
        token: u32,
        response: Option<CallResponse>,
    },
    Stats {
        reply: oneshot::Sender<ProxyStats>,
    },
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Runs the proxy on `listener` until the process ends.
pub async fn serve(config: ProxyConfig, listener: tokio::net::TcpListener) -> Result<(), HarnessError> {
    Proxy::start(config).await?.serve(listener).await
}

/// A proxy whose module is loaded and configured, and whose admin listener is up: ready
/// for traffic. Bind the traffic listener after this, so that a client that can connect
/// never waits for the module to compile.
pub struct Proxy {
    config: ProxyConfig,
    vm: Option<mpsc::Sender<Cmd>>,
    requests: Arc<AtomicU64>,
}

impl Proxy {
    /// Compiles and configures the module on its VM thread; starts the admin listener.
    pub async fn start(config: ProxyConfig) -> Result<Proxy, HarnessError> {
        let vm = match &config.wasm {
            Some(wasm) => Some(start_vm(wasm, &config)?),
            None => None,
        };
        let requests = Arc::new(AtomicU64::new(0));
        if let Some(addr) = config.admin {
            let admin = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| HarnessError::Load(format!("cannot listen on the admin address {addr}: {e}")))?;
            tokio::spawn(serve_admin(admin, vm.clone(), requests.clone()));
        }
        Ok(Proxy { config, vm, requests })
    }

    /// Serves `listener` until the process ends.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> Result<(), HarnessError> {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (vm, client, upstream, requests) = (
                self.vm.clone(),
                client.clone(),
                self.config.upstream,
                self.requests.clone(),
            );
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    requests.fetch_add(1, Ordering::Relaxed);
                    handle(req, peer, vm.clone(), client.clone(), upstream)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

/// Loads the module and starts the thread that owns its VM.
fn start_vm(wasm: &[u8], config: &ProxyConfig) -> Result<mpsc::Sender<Cmd>, HarnessError> {
    let (tx, rx) = mpsc::channel::<Cmd>();
    let options = HostOptions {
        flavor: config.flavor,
        clusters: config.clusters.keys().cloned().collect(),
        start_time_ns: now_ns(),
        refused_calls: Vec::new(),
    };
    let mut host = Host::new(wasm, options)?;
    host.start(b"", &config.plugin_config)?;
    let runtime = tokio::runtime::Handle::current();
    let clusters = config.clusters.clone();
    let vm_tx = tx.clone();
    std::thread::Builder::new()
        .name("wasm-vm".into())
        .spawn(move || vm_loop(host, rx, vm_tx, clusters, runtime, call_client()))
        .map_err(|e| HarnessError::Load(format!("cannot start the VM thread: {e}")))?;
    Ok(tx)
}

/// The admin listener: `GET /stats` answers [`ProxyStats`] as JSON; anything else is 404.
async fn serve_admin(listener: tokio::net::TcpListener, vm: Option<mpsc::Sender<Cmd>>, requests: Arc<AtomicU64>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (vm, requests) = (vm.clone(), requests.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (vm, requests) = (vm.clone(), requests.clone());
                async move {
                    if req.uri().path() != "/stats" {
                        return Ok::<_, Infallible>(text(404, "the admin listener answers GET /stats"));
                    }
                    let mut stats = match vm {
                        Some(vm) => {
                            let (reply, answer) = oneshot::channel();
                            if vm.send(Cmd::Stats { reply }).is_err() {
                                return Ok(text(503, "the wasm VM stopped"));
                            }
                            answer.await.unwrap_or_default()
                        }
                        None => ProxyStats::default(),
                    };
                    stats.requests = requests.load(Ordering::Relaxed);
                    let mut r = Response::new(Full::new(Bytes::from(stats.to_json().to_string())));
                    r.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(status: u16, msg: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{msg}\n"))));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    r
}

async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    vm: Option<mpsc::Sender<Cmd>>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    upstream: SocketAddr,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let Some(vm) = vm else {
        return Ok(forward(&client, upstream, parts, body).await);
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/".to_owned(), |p| p.as_str().to_owned());
    let authority = parts
        .headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_owned();
    let mut headers: Headers = vec![
        (":method".into(), parts.method.as_str().as_bytes().to_vec()),
        (":path".into(), path.into_bytes()),
        (":authority".into(), authority.into_bytes()),
    ];
    headers.extend(header_pairs(&parts.headers));
    let (reply, verdict) = oneshot::channel();
    if vm.send(Cmd::Request { headers, peer, reply }).is_err() {
        return Ok(text(503, "the wasm VM stopped"));
    }
    let (stream, headers) = match verdict.await {
        Ok(Verdict::Forward { stream, headers }) => (stream, headers),
        Ok(Verdict::Respond { status, headers, body }) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    hyper::header::HeaderName::try_from(k),
                    hyper::header::HeaderValue::try_from(v),
                ) {
                    r.headers_mut().append(k, v);
                }
            }
            return Ok(r);
        }
        Err(_) => return Ok(text(500, "the wasm VM dropped the request")),
    };
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut builder = Request::builder().method(parts.method.clone());
    let mut path = "/".to_owned();
    for (k, v) in &headers {
        match k.as_str() {
            ":path" => path = String::from_utf8_lossy(v).into_owned(),
            ":method" | ":authority" | ":scheme" => {}
            _ => builder = builder.header(k.as_str(), v.as_slice()),
        }
    }
    let upstream_req = match builder.uri(format!("http://{upstream}{path}")).body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => {
            let _ = vm.send(Cmd::Abort { stream });
            return Ok(text(400, &format!("cannot forward: {e}")));
        }
    };
    let resp = match client.request(upstream_req).await {
        Ok(r) => r,
        Err(e) => {
            let _ = vm.send(Cmd::Abort { stream });
            return Ok(text(502, &format!("upstream {upstream} failed: {e}")));
        }
    };
    let (rparts, rbody) = resp.into_parts();
    let rbody = rbody.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut rheaders: Headers = vec![(":status".into(), rparts.status.as_str().as_bytes().to_vec())];
    rheaders.extend(header_pairs(&rparts.headers));
    let (reply, changed) = oneshot::channel();
    let rheaders = if vm
        .send(Cmd::Response {
            stream,
            headers: rheaders.clone(),
            reply,
        })
        .is_ok()
    {
        changed.await.unwrap_or(rheaders)
    } else {
        rheaders
    };
    let mut r = Response::new(Full::new(rbody));
    *r.status_mut() = rparts.status;
    for (k, v) in rheaders {
        if k.starts_with(':') {
            continue;
        }
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::try_from(k),
            hyper::header::HeaderValue::try_from(v),
        ) {
            r.headers_mut().append(k, v);
        }
    }
    Ok(r)
}

/// A hyper header map as name/bytes pairs, every value kept.
fn header_pairs(headers: &hyper::HeaderMap) -> impl Iterator<Item = (String, Vec<u8>)> + '_ {
    headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
}

/// Forwards a request untouched (the proxy with no module).
async fn forward(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    upstream: SocketAddr,
    parts: hyper::http::request::Parts,
    body: Incoming,
) -> Response<Full<Bytes>> {
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = Request::builder().method(parts.method.clone());
    for (k, v) in &parts.headers {
        builder = builder.header(k, v);
    }
    let request = match builder.uri(format!("http://{upstream}{path}")).body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => return text(400, &format!("cannot forward: {e}")),
    };
    match client.request(request).await {
        Ok(resp) => {
            let (rparts, rbody) = resp.into_parts();
            let rbody = rbody.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            Response::from_parts(rparts, Full::new(rbody))
        }
        Err(e) => text(502, &format!("upstream {upstream} failed: {e}")),
    }
}

/// The VM thread: owns the host, applies commands, fires ticks, starts calls.
fn vm_loop(
    host: Host,
    rx: mpsc::Receiver<Cmd>,
    tx: mpsc::Sender<Cmd>,
    clusters: HashMap<String, Vec<SocketAddr>>,
    runtime: tokio::runtime::Handle,
    calls: CallClient,
) {
    let mut vm = Vm {
        host,
        tx,
        clusters,
        runtime,
        calls,
        waiting: HashMap::new(),
        calling: HashSet::new(),
        turn: 0,
        stats: ProxyStats::default(),
    };
    loop {
        let wait = vm
            .host
            .next_tick_ns()
            .map(|t| Duration::from_nanos(t.saturating_sub(now_ns())));
        let cmd = match wait {
            Some(w) => match rx.recv_timeout(w) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            },
        };
        vm.fire_ticks();
        match cmd {
            Some(Cmd::Request { headers, peer, reply }) => vm.request(headers, peer, reply),
            Some(Cmd::Response { stream, headers, reply }) => vm.response(stream, headers, reply),
            Some(Cmd::Abort { stream }) => vm.abort(stream),
            Some(Cmd::CallDone { token, response }) => vm.call_done(token, response),
            Some(Cmd::Stats { reply }) => vm.stats(reply),
            None => {}
        }
        vm.release_ready();
        vm.start_calls();
    }
}

/// What the VM thread holds between commands.
struct Vm {
    host: Host,
    /// To send a call's result back to this thread.
    tx: mpsc::Sender<Cmd>,
    clusters: HashMap<String, Vec<SocketAddr>>,
    runtime: tokio::runtime::Handle,
    calls: CallClient,
    /// Paused streams and where their verdict goes.
    waiting: HashMap<u32, oneshot::Sender<Verdict>>,
    /// Calls under way.
    calling: HashSet<u32>,
    /// Round-robin position over a cluster's endpoints.
    turn: usize,
    stats: ProxyStats,
}

impl Vm {
    /// Moves the clock to now and runs the ticks due.
    fn fire_ticks(&mut self) {
        self.host.set_clock(now_ns());
        if let Err(e) = self.host.run_due_ticks() {
            tracing::error!("tick failed: {e}");
        }
    }

    /// A request's headers: forward, answer, or hold until the module resumes it.
    fn request(&mut self, headers: Headers, peer: SocketAddr, reply: oneshot::Sender<Verdict>) {
        let host = &mut self.host;
        let outcome = host.new_stream().and_then(|s| {
            host.set_property(s, "source.address", peer.to_string());
            let refs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
            host.request_headers(s, &refs, false).map(|o| (s, o))
        });
        match outcome {
            Ok((s, Outcome::Continue)) => {
                let headers = host.stream(s).map(|st| st.request_headers.clone()).unwrap_or_default();
                let _ = reply.send(Verdict::Forward { stream: s, headers });
            }
            Ok((s, Outcome::LocalResponse(r))) => {
                let _ = reply.send(Verdict::Respond {
                    status: r.status,
                    headers: r.headers,
                    body: r.body,
                });
                let _ = host.finish_stream(s);
            }
            Ok((s, Outcome::Pause)) => {
                self.waiting.insert(s, reply);
            }
            Err(e) => {
                tracing::error!("module failed on request headers: {e}");
                let _ = reply.send(Verdict::Respond {
                    status: 500,
                    headers: vec![],
                    body: b"wasm module failed\n".to_vec(),
                });
            }
        }
    }

    /// The upstream's response headers, as the module changes them; the stream ends.
    fn response(&mut self, stream: u32, headers: Headers, reply: oneshot::Sender<Headers>) {
        let refs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
        let changed = match self.host.response_headers(stream, &refs, false) {
            Ok(_) => self
                .host
                .stream(stream)
                .map(|s| s.response_headers.clone())
                .unwrap_or(headers),
            Err(e) => {
                tracing::error!("module failed on response headers: {e}");
                headers
            }
        };
        let _ = reply.send(changed);
        let _ = self.host.finish_stream(stream);
    }

    /// The client went away.
    fn abort(&mut self, stream: u32) {
        self.waiting.remove(&stream);
        let _ = self.host.finish_stream(stream);
    }

    /// A dispatched call ended: its response, or a failure (no headers).
    fn call_done(&mut self, token: u32, response: Option<CallResponse>) {
        self.calling.remove(&token);
        let result = match response {
            Some(r) => self.host.respond_call(token, r),
            None => {
                self.stats.calls_failed += 1;
                self.host.fail_call(token)
            }
        };
        if let Err(e) = result {
            tracing::debug!("call {token} not delivered: {e}");
        }
    }

    fn stats(&mut self, reply: oneshot::Sender<ProxyStats>) {
        let host = &mut self.host;
        self.stats.vm_memory_bytes = host.memory_bytes() as u64;
        self.stats.metrics = host
            .metric_names()
            .into_iter()
            .filter_map(|name| host.metric(&name).map(|v| (name, v)))
            .collect();
        let _ = reply.send(self.stats.clone());
    }

    /// Sends the verdict of every held stream the module resumed or answered since.
    fn release_ready(&mut self) {
        let host = &mut self.host;
        let ready: Vec<u32> = self
            .waiting
            .keys()
            .copied()
            .filter(|s| {
                host.stream(*s)
                    .is_none_or(|st| st.request_resumes > 0 || st.local_response.is_some())
            })
            .collect();
        for s in ready {
            let Some(reply) = self.waiting.remove(&s) else { continue };
            match host.stream(s).cloned() {
                Some(st) if st.local_response.is_some() => {
                    if let Some(r) = st.local_response {
                        let _ = reply.send(Verdict::Respond {
                            status: r.status,
                            headers: r.headers,
                            body: r.body,
                        });
                    }
                    let _ = host.finish_stream(s);
                }
                Some(st) => {
                    let _ = reply.send(Verdict::Forward {
                        stream: s,
                        headers: st.request_headers,
                    });
                }
                None => {}
            }
        }
    }

    /// Starts the calls the module dispatched since: Envoy's take a cluster's endpoints in
    /// turn; ngx_wasm_module's go to the `host:port` itself.
    fn start_calls(&mut self) {
        for call in self.host.pending_calls() {
            if !self.calling.insert(call.token) {
                continue;
            }
            self.stats.calls += 1;
            let mut endpoints = match self.host.flavor() {
                Flavor::Envoy => self
                    .clusters
                    .get(&call.upstream)
                    .cloned()
                    .or_else(|| call.upstream.parse().ok().map(|a| vec![a])),
                Flavor::Nginx => None,
            };
            if let Some(endpoints) = endpoints.as_mut().filter(|e| !e.is_empty()) {
                self.turn = self.turn.wrapping_add(1);
                let first = self.turn % endpoints.len();
                endpoints.rotate_left(first);
            }
            let (tx, calls) = (self.tx.clone(), self.calls.clone());
            self.runtime.spawn(async move {
                let timeout = Duration::from_millis(u64::from(call.timeout_ms));
                let call_out = async {
                    let endpoints = match endpoints {
                        Some(endpoints) => endpoints,
                        None => resolve(&call.upstream).await,
                    };
                    perform(&calls, &endpoints, &call.headers, call.body).await
                };
                let response = tokio::time::timeout(timeout, call_out).await.ok().flatten();
                let _ = tx.send(Cmd::CallDone {
                    token: call.token,
                    response,
                });
            });
        }
    }
}

/// The client for dispatched calls: kept-alive HTTP/1.1 connections per endpoint, as
/// Envoy's cluster connection pools.
type CallClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn call_client() -> CallClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// One dispatched call to the first endpoint that accepts a connection (pooled
/// connections are reused); `None` on any other failure.
async fn perform(
    client: &CallClient,
    endpoints: &[SocketAddr],
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Option<CallResponse> {
    let body = Bytes::from(body);
    let path = headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map_or("/", |(_, v)| v.as_str());
    for addr in endpoints {
        let mut builder = Request::builder().uri(format!("http://{addr}{path}"));
        for (k, v) in headers {
            builder = match k.as_str() {
                ":method" => builder.method(v.as_str()),
                ":path" => builder,
                ":authority" => builder.header("host", v.as_str()),
                _ => builder.header(k.as_str(), v.as_str()),
            };
        }
        let request = builder.body(Full::new(body.clone())).ok()?;
        let resp = match client.request(request).await {
            Ok(resp) => resp,
            Err(e) if e.is_connect() => {
                tracing::debug!(%addr, "endpoint refused the call's connection: {e}");
                continue;
            }
            Err(e) => {
                tracing::debug!(%addr, "call failed: {e}");
                return None;
            }
        };
        let mut out = vec![(":status".to_owned(), resp.status().as_u16().to_string())];
        for (k, v) in resp.headers() {
            out.push((k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()));
        }
        let body = resp.into_body().collect().await.ok()?.to_bytes().to_vec();
        return Some(CallResponse { headers: out, body });
    }
    None
}

/// An ngx_wasm_module upstream, `host[:port]` (port 80 when none is given), resolved as
/// Nginx does for each call; a name that does not resolve fails the call.
async fn resolve(upstream: &str) -> Vec<SocketAddr> {
    let has_port = match upstream.strip_prefix('[') {
        Some(rest) => rest.contains("]:"),
        None => upstream.contains(':'),
    };
    let target = if has_port {
        upstream.to_owned()
    } else {
        format!("{upstream}:80")
    };
    let resolved = tokio::net::lookup_host(target.as_str()).await;
    match resolved {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            tracing::debug!(%upstream, "cannot resolve the call's upstream: {e}");
            Vec::new()
        }
    }
}
