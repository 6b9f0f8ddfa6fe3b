//! A concurrency rule in two real Envoys of four workers each, over Redis: the upstream,
//! which counts the requests it holds, never sees more than the limit of one identity in
//! flight and sees the limit used; a client that hangs up frees its slot at once; and the
//! slots of an Envoy killed while holding them come back within the rule's window. And the
//! filter's own limit (`concurrency.local`, no store) across the four workers of one Envoy.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sluice_tests::chain::{Chain, Options, ProxyHost};

/// The most of one identity's requests in flight.
const LIMIT: u64 = 8;
/// How long the upstream holds each request.
const HOLD: Duration = Duration::from_millis(200);
/// How long the upstream holds a long request: past the window, so only renewals keep its slot.
const LONG: Duration = Duration::from_millis(3_000);
/// How long a slot outlives its holder's last renewal.
const WINDOW: Duration = Duration::from_secs(2);

const RULES: &str = r#"
[[rule]]
name      = "in-flight"
by        = "ip"
algorithm = "concurrency"
limit     = 8
window    = "2s"
"#;

/// An upstream that holds every request [`HOLD`] and counts those it holds; a sampler
/// records the count every millisecond.
struct Upstream {
    port: u16,
    in_flight: Arc<AtomicU64>,
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let in_flight = Arc::new(AtomicU64::new(0));
        let counted = in_flight.clone();
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let counted = counted.clone();
                thread::spawn(move || serve(conn, &counted));
            }
        });
        let (samples, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (kept, stopped, read) = (samples.clone(), stop.clone(), in_flight.clone());
        thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let sample = (Instant::now(), read.load(Ordering::SeqCst));
                kept.lock().expect("samples").push(sample);
                thread::sleep(Duration::from_millis(1));
            }
        });
        Upstream {
            port,
            in_flight,
            samples,
            stop,
        }
    }

    /// The samples taken from `from` for `long`: when (after `from`) and the count.
    fn between(&self, from: Instant, long: Duration) -> Vec<(Duration, u64)> {
        let samples = self.samples.lock().expect("samples");
        samples
            .iter()
            .filter(|(t, _)| *t >= from && *t < from + long)
            .map(|(t, n)| (*t - from, *n))
            .collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers each request of a keep-alive connection after [`HOLD`] (`/long`: [`LONG`]),
/// counted while held.
fn serve(mut conn: TcpStream, in_flight: &AtomicU64) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").map_or(0, |i| i + 4);
        let long = buf.starts_with(b"GET /long ");
        buf.drain(..end);
        in_flight.fetch_add(1, Ordering::SeqCst);
        thread::sleep(if long { LONG } else { HOLD });
        // Out of flight before the answer leaves: the slot is given back only after it.
        in_flight.fetch_sub(1, Ordering::SeqCst);
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        if conn.write_all(answer).is_err() {
            return;
        }
    }
}

/// One GET of `/work` through the proxy on `port`: its status, or `None` when the
/// connection failed.
fn get(port: u16) -> Option<u16> {
    get_path(port, "/work")
}

fn get_path(port: u16, path: &str) -> Option<u16> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: sluice.test\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).ok()?;
    let line = String::from_utf8_lossy(answer.get(..12)?).into_owned();
    line.get(9..12)?.parse().ok()
}

/// [`LIMIT`] requests of `path` at once, alternating between `ports`: their statuses once
/// all are answered.
fn at_once(ports: [u16; 2], path: &'static str) -> thread::JoinHandle<Vec<Option<u16>>> {
    thread::spawn(move || {
        let each: Vec<thread::JoinHandle<Option<u16>>> = (0..LIMIT as usize)
            .map(|i| thread::spawn(move || get_path(ports[i % 2], path)))
            .collect();
        each.into_iter().map(|t| t.join().expect("client")).collect()
    })
}

/// [`LIMIT`] connections to `port` that send a request and never read its answer (dropped:
/// they hang up).
fn hung(port: u16) -> Vec<TcpStream> {
    (0..LIMIT)
        .map(|_| {
            let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            conn.write_all(b"GET /work HTTP/1.1\r\nhost: sluice.test\r\n\r\n")
                .expect("send");
            conn
        })
        .collect()
}

/// The most and the mean the upstream held in the three seconds from a second after `started`.
fn held(upstream: &Upstream, started: Instant) -> (u64, f64) {
    let steady = upstream.between(started + Duration::from_secs(1), Duration::from_secs(3));
    let most = steady.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let mean = steady.iter().map(|(_, n)| *n).sum::<u64>() as f64 / steady.len().max(1) as f64;
    (most, mean)
}

/// `clients` threads sending to each of `ports` in turn until `stop`, each waiting 50 ms
/// after a refusal; the requests answered 200.
fn clients(ports: [u16; 2], clients: usize, stop: &Arc<AtomicBool>) -> Vec<thread::JoinHandle<u64>> {
    (0..clients)
        .map(|i| {
            let (port, stop) = (ports[i % 2], stop.clone());
            thread::spawn(move || {
                let mut passed = 0;
                while !stop.load(Ordering::Relaxed) {
                    match get(port) {
                        Some(200) => passed += 1,
                        _ => thread::sleep(Duration::from_millis(50)),
                    }
                }
                passed
            })
        })
        .collect()
}

#[test]
fn two_envoys_hold_one_identity_to_its_limit_and_free_the_slots_of_one_that_dies() {
    let upstream = Upstream::start();
    let mut chain = Chain::with(Options {
        rules: RULES.to_owned(),
        host: ProxyHost::RealEnvoy,
        envoy_workers: 4,
        upstream: Some(upstream.port),
        envoy_edits: vec![
            (r#""concurrency": {"tick_ms": 50}"#, r#""concurrency": {"tick_ms": 10}"#),
            (
                r#""rate_per_s": 200, "burst": 400"#,
                r#""rate_per_s": 100000, "burst": 100000"#,
            ),
        ],
        ..Options::default()
    });
    let ports = chain.proxies;

    // Requests that run past the window keep their slots: their Envoys renew them.
    let long = at_once(ports, "/long");
    thread::sleep(WINDOW + Duration::from_millis(500));
    assert_eq!(
        upstream.in_flight.load(Ordering::SeqCst),
        LIMIT,
        "the long requests run"
    );
    assert_eq!(
        get(ports[0]),
        Some(429),
        "a request {WINDOW:?} after eight long ones took every slot was admitted: their slots expired while they ran"
    );
    let long = long.join().expect("clients");
    assert!(long.iter().all(|s| *s == Some(200)), "{long:?}");
    thread::sleep(Duration::from_millis(100));

    // Clients that hang up: their slots come back at once, long before the window.
    let hung = hung(ports[1]);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        upstream.in_flight.load(Ordering::SeqCst),
        LIMIT,
        "the eight hold every slot"
    );
    assert_eq!(get(ports[0]), Some(429), "a ninth is refused while they run");
    drop(hung);
    thread::sleep(Duration::from_millis(150));
    let statuses = at_once(ports, "/work").join().expect("clients");
    assert!(
        statuses.iter().all(|s| *s == Some(200)),
        "hung-up clients' slots were not given back within 150 ms (the window is {WINDOW:?}): {statuses:?}"
    );

    // 100 clients over both Envoys: never more than the limit, and the limit used.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let running = clients(ports, 100, &stop);
    thread::sleep(Duration::from_secs(4));
    let (most, mean) = held(&upstream, started);
    println!("two Envoys, 100 clients: at most {most} in flight, {mean:.2} on average");
    assert!(
        most <= LIMIT,
        "the upstream saw {most} of one identity's requests at once"
    );
    assert!(
        mean >= 7.0,
        "only {mean:.2} of {LIMIT} slots used on average while clients waited"
    );

    // One Envoy killed holding slots: the other reaches the limit again within the window.
    let killed = Instant::now();
    chain.envoys[0].child().kill();
    thread::sleep(WINDOW + Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    let passed: u64 = running.into_iter().map(|t| t.join().expect("client")).sum();
    // The dead Envoy's requests stay at the upstream until it answers them: count after.
    let drained = HOLD + Duration::from_millis(100);
    let after_kill = upstream.between(killed, WINDOW + Duration::from_millis(1_500));
    let full_again = after_kill
        .iter()
        .find(|(t, n)| *t >= drained && *n == LIMIT)
        .map(|(t, _)| *t);
    println!("{passed} requests passed; the limit was reached again {full_again:?} after the kill");
    let full_again = full_again.expect("the survivor never reached the limit again after the kill");
    assert!(
        full_again <= WINDOW + Duration::from_millis(700),
        "the dead Envoy's slots came back after {full_again:?}, past the window of {WINDOW:?}"
    );
    assert!(
        full_again >= WINDOW / 2,
        "the survivor had every slot {full_again:?} after the kill, so the dead Envoy held none: the kill tested nothing"
    );
}

/// Rules that never refuse here: the filter's own limit is the one tested.
const GENEROUS: &str = r#"
[[rule]]
name      = "per-ip"
by        = "ip"
algorithm = "token_bucket"
limit     = 1000000
window    = "1s"
"#;

#[test]
fn the_four_workers_of_one_envoy_hold_a_client_to_the_filters_own_in_flight_limit() {
    let upstream = Upstream::start();
    let chain = Chain::with(Options {
        rules: GENEROUS.to_owned(),
        host: ProxyHost::RealEnvoy,
        envoy_workers: 4,
        upstream: Some(upstream.port),
        envoy_edits: vec![
            (
                r#""concurrency": {"tick_ms": 50}"#,
                r#""concurrency": {"tick_ms": 50, "local": {"by": "ip", "limit": 8, "expiry_ms": 1000}}"#,
            ),
            (
                r#""rate_per_s": 200, "burst": 400"#,
                r#""rate_per_s": 100000, "burst": 100000"#,
            ),
        ],
        ..Options::default()
    });
    let port = chain.proxies[0];

    // Requests that run past the expiry keep their slots: their workers renew them.
    let long = at_once([port, port], "/long");
    thread::sleep(Duration::from_millis(2_000));
    assert_eq!(
        upstream.in_flight.load(Ordering::SeqCst),
        LIMIT,
        "the long requests run"
    );
    assert_eq!(
        get(port),
        Some(429),
        "a ninth was admitted while eight ran: the workers count apart, or the slots expired (1 s) while they ran"
    );
    let long = long.join().expect("clients");
    assert!(long.iter().all(|s| *s == Some(200)), "{long:?}");

    // Clients that hang up give their slots back with the stream, not on a tick.
    let hung = hung(port);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(get(port), Some(429), "a ninth is refused while they run");
    drop(hung);
    thread::sleep(Duration::from_millis(50));
    let statuses = at_once([port, port], "/work").join().expect("clients");
    assert!(
        statuses.iter().all(|s| *s == Some(200)),
        "hung-up clients' slots were not given back within 50 ms: {statuses:?}"
    );

    // 100 clients on one Envoy's four workers: never more than the limit, and the limit used.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let running = clients([port, port], 100, &stop);
    thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let (most, mean) = held(&upstream, started);
    let passed: u64 = running.into_iter().map(|t| t.join().expect("client")).sum();
    println!("one Envoy's own limit, 100 clients: at most {most} in flight, {mean:.2} on average; {passed} passed");
    assert!(
        most <= LIMIT,
        "the upstream saw {most} of one client's requests at once"
    );
    assert!(
        mean >= 7.0,
        "only {mean:.2} of {LIMIT} slots used on average while clients waited"
    );
}
