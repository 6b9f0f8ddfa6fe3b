//! Proxy mode: a real HTTP/1.1 proxy that runs a module on every request.
//!
//! One worker thread owns the VM and every connection, as each Envoy worker does: the
//! network runs on that thread's own tokio runtime and calls into the VM directly, so a
//! request costs no hand-off between threads, and a request paused on a check call waits
//! on the worker's event loop without blocking others. Calls the module dispatches go over
//! real HTTP (pooled keep-alive connections) to the named clusters with their timeouts; a
//! failed or timed-out call is delivered with no headers, as Envoy does. The clock is real,
//! and ticks fire on time.
//!
//! With no module the proxy only forwards, on the same worker: the baseline a module's cost
//! is measured against. An optional admin listener answers `GET /stats` (like Envoy's admin
//! port) with requests, calls, the VM's linear memory and the module's metrics, as JSON.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::{oneshot, Notify};

use crate::{Flavor, HarnessError, Host, HostOptions};

mod calls;
mod envoy;
mod nginx;
mod vm;

use vm::{Disposition, Step, Vm};

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
    /// as is). Calls take the endpoints in turn, as Envoy's round robin does; as in Envoy, a
    /// call an endpoint refuses is not tried on another: the module gets Envoy's 503.
    pub clusters: HashMap<String, Vec<SocketAddr>>,
    /// Which host to imitate.
    pub flavor: Flavor,
    /// Envoy flavour: the proxies in front whose `x-forwarded-for` entries Envoy trusts
    /// (`xff_num_trusted_hops`, with `use_remote_address: true`): the client's address is
    /// the one this many entries from the right of the header as it came.
    pub xff_num_trusted_hops: u32,
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

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Runs the proxy on `listener` until the process ends.
pub async fn serve(config: ProxyConfig, listener: tokio::net::TcpListener) -> Result<(), HarnessError> {
    Proxy::start(config).await?.serve(listener).await
}

/// A proxy whose module is loaded and configured on its worker, and whose admin listener is
/// up: ready for traffic. Bind the traffic listener after this, so that a client that can
/// connect never waits for the module to compile. Dropping it stops the worker.
pub struct Proxy {
    listener: oneshot::Sender<std::net::TcpListener>,
    stopped: oneshot::Receiver<HarnessError>,
}

impl Proxy {
    /// Starts the worker thread: compiles and configures the module there, and serves the
    /// admin listener.
    pub async fn start(config: ProxyConfig) -> Result<Proxy, HarnessError> {
        let admin = match config.admin {
            Some(addr) => Some(
                std::net::TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| HarnessError::Load(format!("cannot listen on the admin address {addr}: {e}")))?,
            ),
            None => None,
        };
        let (ready_tx, ready) = oneshot::channel();
        let (listener, listener_rx) = oneshot::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("proxy-worker".into())
            .spawn(move || run_worker(config, admin, ready_tx, listener_rx, stopped_tx))
            .map_err(|e| HarnessError::Load(format!("cannot start the proxy's worker thread: {e}")))?;
        ready.await.unwrap_or_else(|_| Err(worker_gone()))?;
        Ok(Proxy { listener, stopped })
    }

    /// Serves `listener` on the worker until the process ends.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> Result<(), HarnessError> {
        let listener = listener
            .into_std()
            .map_err(|e| HarnessError::Load(format!("cannot hand the listener to the worker: {e}")))?;
        self.listener.send(listener).map_err(|_| worker_gone())?;
        Err(self.stopped.await.unwrap_or_else(|_| worker_gone()))
    }
}

fn worker_gone() -> HarnessError {
    HarnessError::Load("the proxy's worker thread stopped".into())
}

/// The worker thread: its runtime, its VM, its connections, until the [`Proxy`] is dropped.
fn run_worker(
    config: ProxyConfig,
    admin: Option<std::net::TcpListener>,
    ready: oneshot::Sender<Result<(), HarnessError>>,
    listener: oneshot::Receiver<std::net::TcpListener>,
    mut stopped: oneshot::Sender<HarnessError>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(HarnessError::Load(format!(
                "cannot start the worker's runtime: {e}"
            ))));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let worker = match Worker::new(&config) {
            Ok(w) => Rc::new(w),
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        if let Some(admin) = admin {
            match tokio::net::TcpListener::from_std(admin) {
                Ok(admin) => drop(tokio::task::spawn_local(serve_admin(admin, worker.clone()))),
                Err(e) => {
                    let _ = ready.send(Err(HarnessError::Load(format!("cannot serve the admin listener: {e}"))));
                    return;
                }
            }
        }
        if worker.vm.is_some() {
            tokio::task::spawn_local(ticks(worker.clone()));
        }
        if ready.send(Ok(())).is_err() {
            return;
        }
        let serving = async {
            let listener = listener.await.map_err(|_| worker_gone())?;
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| HarnessError::Load(format!("cannot serve the listener: {e}")))?;
            accept(listener, worker).await;
            Ok::<(), HarnessError>(())
        };
        tokio::select! {
            r = serving => if let Err(e) = r { let _ = stopped.send(e); },
            () = stopped.closed() => {}
        }
    });
}

/// Accepts connections and serves each on the worker.
async fn accept(listener: tokio::net::TcpListener, worker: Rc<Worker>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let worker = worker.clone();
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |req| {
                worker.requests.set(worker.requests.get() + 1);
                handle(req, peer, worker.clone())
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// What the worker thread holds: the VM (none: forward only) and the clients.
struct Worker {
    vm: Option<RefCell<Vm>>,
    upstream: SocketAddr,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    calls: calls::CallClient,
    requests: Cell<u64>,
    /// The tick the tick task sleeps toward, and the nudge when the module moves it.
    tick_at: Cell<Option<u64>>,
    tick_moved: Notify,
}

impl Worker {
    fn new(config: &ProxyConfig) -> Result<Worker, HarnessError> {
        let vm = match &config.wasm {
            Some(wasm) => {
                let options = HostOptions {
                    flavor: config.flavor,
                    clusters: config.clusters.keys().cloned().collect(),
                    start_time_ns: now_ns(),
                    ..HostOptions::default()
                };
                let mut host = Host::new(wasm, options)?;
                host.start(b"", &config.plugin_config)?;
                Some(RefCell::new(Vm::new(
                    host,
                    config.clusters.clone(),
                    config.xff_num_trusted_hops,
                )))
            }
            None => None,
        };
        Ok(Worker {
            vm,
            upstream: config.upstream,
            client: Client::builder(TokioExecutor::new()).build_http(),
            calls: calls::call_client(),
            requests: Cell::new(0),
            tick_at: Cell::new(None),
            tick_moved: Notify::new(),
        })
    }
}

/// Runs `f` on the VM (`None` with no module): ticks due first, then [`settle`].
fn with_vm<R>(worker: &Rc<Worker>, f: impl FnOnce(&mut Vm) -> R) -> Option<R> {
    let mut vm = worker.vm.as_ref()?.try_borrow_mut().ok()?;
    vm.fire_ticks();
    let r = f(&mut vm);
    settle(worker, vm);
    Some(r)
}

/// After the module ran: the streams it released get their verdicts, the calls it
/// dispatched start, and the tick task learns of a moved tick.
fn settle(worker: &Rc<Worker>, mut vm: RefMut<'_, Vm>) {
    vm.release_ready();
    let calls = vm.new_calls();
    if vm.next_tick_ns() != worker.tick_at.get() {
        worker.tick_moved.notify_one();
    }
    drop(vm);
    for call in calls {
        tokio::task::spawn_local(call_out(worker.clone(), call));
    }
}

/// Makes a call on the worker and hands its answer (or its failure) to the VM.
async fn call_out(worker: Rc<Worker>, call: calls::Call) {
    let token = call.call.token;
    let response = calls::make(&worker.calls, call).await;
    let Some(mut vm) = worker.vm.as_ref().and_then(|vm| vm.try_borrow_mut().ok()) else {
        return;
    };
    vm.fire_ticks();
    vm.call_done(token, response);
    settle(&worker, vm);
}

/// Fires the module's ticks on time while no request comes.
async fn ticks(worker: Rc<Worker>) {
    loop {
        let next = worker.vm.as_ref().and_then(|vm| vm.borrow().next_tick_ns());
        worker.tick_at.set(next);
        match next {
            Some(at) => {
                let wait = Duration::from_nanos(at.saturating_sub(now_ns()));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = worker.tick_moved.notified() => {}
                }
            }
            None => worker.tick_moved.notified().await,
        }
        with_vm(&worker, |_| ());
    }
}

/// Ends a stream whose request is dropped before its response went through the module (the
/// client left, or forwarding failed), as a proxy does when a downstream resets.
struct OpenStream {
    worker: Rc<Worker>,
    stream: Option<u32>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            with_vm(&self.worker, |vm| vm.abort(s));
        }
    }
}

/// The admin listener: `GET /stats` answers [`ProxyStats`] as JSON; anything else is 404.
async fn serve_admin(listener: tokio::net::TcpListener, worker: Rc<Worker>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let worker = worker.clone();
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let worker = worker.clone();
                async move {
                    if req.uri().path() != "/stats" {
                        return Ok::<_, Infallible>(text(404, "the admin listener answers GET /stats"));
                    }
                    let mut stats = with_vm(&worker, Vm::stats).unwrap_or_default();
                    stats.requests = worker.requests.get();
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

/// One request: the module's verdict on its headers, then upstream and the module's view of
/// the response headers.
async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    worker: Rc<Worker>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    if worker.vm.is_none() {
        return Ok(forward(&worker, parts, body).await);
    }
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
    let mut open = OpenStream {
        worker: worker.clone(),
        stream: None,
    };
    let verdict = match with_vm(&worker, |vm| vm.request(&headers, peer)) {
        Some(Step::Now(verdict)) => verdict,
        Some(Step::Paused { stream, verdict }) => {
            open.stream = Some(stream);
            let verdict = verdict.await;
            open.stream = None;
            match verdict {
                Ok(v) => v,
                Err(_) => return Ok(text(500, "the wasm VM dropped the request")),
            }
        }
        None => return Ok(text(503, "the wasm VM is busy")),
    };
    let (stream, headers) = match verdict {
        Disposition::Forward { stream, headers } => (stream, headers),
        Disposition::Respond { status, headers, body } => return Ok(local_response(status, headers, body)),
    };
    open.stream = Some(stream);
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
    let upstream = worker.upstream;
    let upstream_req = match builder.uri(format!("http://{upstream}{path}")).body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => return Ok(text(400, &format!("cannot forward: {e}"))),
    };
    let resp = match worker.client.request(upstream_req).await {
        Ok(r) => r,
        Err(e) => return Ok(text(502, &format!("upstream {upstream} failed: {e}"))),
    };
    let (rparts, rbody) = resp.into_parts();
    let rbody = rbody.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut rheaders: Headers = vec![(":status".into(), rparts.status.as_str().as_bytes().to_vec())];
    rheaders.extend(header_pairs(&rparts.headers));
    open.stream = None;
    let rheaders = match with_vm(&worker, |vm| vm.response(stream, rheaders.clone())) {
        Some(changed) => changed,
        None => rheaders,
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

/// The module's own answer to a request.
fn local_response(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Response<Full<Bytes>> {
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
    r
}

/// A hyper header map as name/bytes pairs, every value kept.
fn header_pairs(headers: &hyper::HeaderMap) -> impl Iterator<Item = (String, Vec<u8>)> + '_ {
    headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
}

/// Forwards a request untouched (the proxy with no module).
async fn forward(worker: &Worker, parts: hyper::http::request::Parts, body: Incoming) -> Response<Full<Bytes>> {
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let upstream = worker.upstream;
    let mut builder = Request::builder().method(parts.method.clone());
    for (k, v) in &parts.headers {
        builder = builder.header(k, v);
    }
    let request = match builder.uri(format!("http://{upstream}{path}")).body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => return text(400, &format!("cannot forward: {e}")),
    };
    match worker.client.request(request).await {
        Ok(resp) => {
            let (rparts, rbody) = resp.into_parts();
            let rbody = rbody.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            Response::from_parts(rparts, Full::new(rbody))
        }
        Err(e) => text(502, &format!("upstream {upstream} failed: {e}")),
    }
}
