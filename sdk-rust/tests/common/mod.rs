//! Local HTTP servers for the tests. [`Server`] enforces a token bucket with `sluice-core`
//! and sends the docs/design.md headers, and offers routes that deny a set number of requests or
//! hold them until released. [`Scripted`] answers with header lines written out in the
//! test, so that what the SDK reads does not come from `sluice-core`'s formatter.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use sluice_core::headers::{format_headers, HeaderMode, Quota};
use sluice_core::{Algorithm, Limit, Micros};
use tokio::sync::Semaphore;

/// What the server saw.
pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<ServerState>,
}

pub struct ServerState {
    limit: Limit,
    /// `/limited`'s rate per second and burst.
    per_second: u64,
    burst: u64,
    bucket: Mutex<sluice_core::State>,
    started: Instant,
    /// Requests that reached any route.
    pub hits: AtomicUsize,
    /// 429s sent.
    pub denials: AtomicUsize,
    /// `/deny-first` refuses this many requests (with `Retry-After: 1`) before admitting.
    pub deny_first: AtomicUsize,
    /// When each 429 was sent and each admitted request arrived (`/limited`: when it was
    /// decided), in order.
    pub log: Mutex<Vec<(Instant, u16)>>,
    /// `/gate` holds requests until permits are added.
    pub gate: Semaphore,
}

impl Server {
    /// A server whose `/limited` allows `limit` per second with a burst of `burst`.
    pub async fn start(limit: u64, burst: u64) -> Server {
        let per_second = limit;
        let limit = Limit::builder(Algorithm::TokenBucket, limit, Micros::SECOND)
            .burst(burst)
            .build()
            .expect("valid limit");
        let state = Arc::new(ServerState {
            limit,
            per_second,
            burst,
            bucket: Mutex::new(sluice_core::State::default()),
            started: Instant::now(),
            hits: AtomicUsize::new(0),
            denials: AtomicUsize::new(0),
            deny_first: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
        });
        let app = Router::new()
            .route("/limited", any(limited))
            .route("/silent", any(silent))
            .route("/deny-first", any(deny_first))
            .route("/gate", any(gate))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server { addr, state }
    }

    /// A server whose `/deny-first` refuses the first `n` requests.
    pub async fn denying(n: usize) -> Server {
        let server = Server::start(50, 10).await;
        server.state.deny_first.store(n, Ordering::SeqCst);
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    pub fn denials(&self) -> usize {
        self.state.denials.load(Ordering::SeqCst)
    }

    /// The requests `/limited` admitted, over the most its token bucket can admit in the
    /// span from the first of them to the last (`burst + limit · span`): at most 1, and 1
    /// for a client that used the whole quota. Both from the server's clock, in this run.
    pub fn admitted_ratio(&self) -> f64 {
        let log = self.state.log.lock().expect("lock");
        let admitted: Vec<Instant> = log.iter().filter(|&&(_, s)| s == 200).map(|&(t, _)| t).collect();
        let (Some(first), Some(last)) = (admitted.first(), admitted.last()) else {
            return 0.0;
        };
        let span = last.duration_since(*first).as_secs_f64();
        admitted.len() as f64 / (self.state.burst as f64 + self.state.per_second as f64 * span)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64
}

fn reply(status: StatusCode, quota: &Quota<'_>) -> Response {
    let mut headers = Vec::new();
    format_headers(quota, HeaderMode::All, &mut headers);
    let mut response = (status, "ok").into_response();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// `/limited`'s bucket, saying nothing of it: a bare 429 or 200 (as Flask-Limiter and
/// slowapi do by default).
async fn silent(State(s): State<Arc<ServerState>>) -> Response {
    s.hits.fetch_add(1, Ordering::SeqCst);
    let mut bucket = s.bucket.lock().expect("lock");
    let at = Instant::now();
    let allowed = s
        .limit
        .decide(&mut bucket, Micros::from_duration(at.duration_since(s.started)), 1)
        .allowed;
    drop(bucket);
    s.log.lock().expect("lock").push((at, if allowed { 200 } else { 429 }));
    if allowed {
        (StatusCode::OK, "ok").into_response()
    } else {
        s.denials.fetch_add(1, Ordering::SeqCst);
        (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response()
    }
}

async fn limited(State(s): State<Arc<ServerState>>) -> Response {
    s.hits.fetch_add(1, Ordering::SeqCst);
    // The clock is read under the bucket's lock: a handler descheduled between reading it
    // and locking would decide at a time older than the bucket's last decision, refusing a
    // request its refill allowed (seen once in CI, on a loaded machine).
    let mut bucket = s.bucket.lock().expect("lock");
    let at = Instant::now();
    let now = Micros::from_duration(at.duration_since(s.started));
    let d = s.limit.decide(&mut bucket, now, 1);
    drop(bucket);
    s.log
        .lock()
        .expect("lock")
        .push((at, if d.allowed { 200 } else { 429 }));
    let quota = Quota {
        policy: "test",
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after.wait_ms(),
        window_ms: s.limit.window().instant_ms(),
        retry_after_ms: (!d.allowed).then(|| d.retry_after.wait_ms()),
        now_ms: unix_ms(),
    };
    if d.allowed {
        reply(StatusCode::OK, &quota)
    } else {
        s.denials.fetch_add(1, Ordering::SeqCst);
        reply(StatusCode::TOO_MANY_REQUESTS, &quota)
    }
}

async fn deny_first(State(s): State<Arc<ServerState>>) -> Response {
    let n = s.hits.fetch_add(1, Ordering::SeqCst);
    let denied = n < s.deny_first.load(Ordering::SeqCst);
    let quota = Quota {
        policy: "test",
        limit: 100,
        remaining: if denied { 0 } else { 50 },
        reset_after_ms: 1_000,
        window_ms: 1_000,
        retry_after_ms: denied.then_some(1_000),
        now_ms: unix_ms(),
    };
    let status = if denied {
        s.denials.fetch_add(1, Ordering::SeqCst);
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    s.log.lock().expect("lock").push((Instant::now(), status.as_u16()));
    reply(status, &quota)
}

async fn gate(State(s): State<Arc<ServerState>>) -> Response {
    s.hits.fetch_add(1, Ordering::SeqCst);
    if let Ok(permit) = s.gate.acquire().await {
        permit.forget();
    }
    (StatusCode::OK, "released").into_response()
}

/// A server that answers its n-th request (any method and path) with `answers[n]`, or
/// the last one once they run out: the status line and header lines exactly as written in
/// the test, then `Content-Length: 0` and `Connection: close`.
pub struct Scripted {
    pub addr: SocketAddr,
    /// When each request's head had arrived, in order.
    pub arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Scripted {
    pub fn start(answers: &'static [&'static [&'static str]]) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&arrivals);
        // One connection at a time is enough: each test client sends one request at a time.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear(); // up to the empty line that ends the head
                }
                let n = {
                    let mut log = log.lock().expect("lock");
                    log.push(Instant::now());
                    log.len() - 1
                };
                let head = answers[n.min(answers.len() - 1)].join("\r\n");
                let _ = write!(&stream, "{head}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            }
        });
        Scripted { addr, arrivals }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The time from the arrival of request `i` to that of request `i + 1`.
    pub fn gap(&self, i: usize) -> Duration {
        let arrivals = self.arrivals.lock().expect("lock");
        arrivals[i + 1].duration_since(arrivals[i])
    }
}

/// Waits (a bounded number of times) until `cond` holds; panics if it never does.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never happened: {what}");
}
