//! The WAN link delays both directions, keeps bytes in order, and can be cut and restored.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use sluice_testkit::WanLink;

/// A line echo server on loopback.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                for line in BufReader::new(conn).lines().map_while(Result::ok) {
                    if writeln!(out, "{line}").is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `n` lines one at a time, each after the answer to the last; each round trip's time.
fn round_trips(addr: SocketAddr, n: usize) -> std::io::Result<Vec<Duration>> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = stream.try_clone()?;
    let mut lines = BufReader::new(stream).lines();
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        writeln!(out, "line {i}")?;
        let back = lines.next().ok_or(std::io::ErrorKind::UnexpectedEof)??;
        assert_eq!(back, format!("line {i}"), "bytes arrive whole and in order");
        times.push(t.elapsed());
    }
    Ok(times)
}

#[test]
fn every_round_trip_takes_at_least_the_latency_both_ways() {
    let link = WanLink::start(echo_server(), Duration::from_millis(50)).unwrap();
    for (i, took) in round_trips(link.addr(), 5).unwrap().into_iter().enumerate() {
        assert!(
            took >= Duration::from_millis(100),
            "round trip {i} took {took:?}: less than 50 ms each way"
        );
    }
}

#[test]
fn a_cut_link_closes_its_connections_and_refuses_new_ones_until_restored() {
    let echo = echo_server();
    let link = WanLink::start(echo, Duration::from_millis(5)).unwrap();
    let stream = TcpStream::connect(link.addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = stream.try_clone().unwrap();
    let mut lines = BufReader::new(stream).lines();
    writeln!(out, "before").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "before");

    link.cut();
    let _ = writeln!(out, "during");
    assert!(
        !matches!(lines.next(), Some(Ok(_))),
        "an open connection gets nothing through a cut link"
    );
    assert!(
        round_trips(link.addr(), 1).is_err(),
        "a new connection is closed at once"
    );

    link.restore();
    assert!(round_trips(link.addr(), 3).is_ok(), "restored: relayed again");
}

/// A cut tells how long the oldest bytes it dropped had been on the link: zero when all
/// had arrived, at least the time since they were sent when some had not.
#[test]
fn a_cut_says_how_long_the_bytes_it_dropped_had_been_on_the_link() {
    let link = WanLink::start(echo_server(), Duration::from_millis(400)).unwrap();
    assert!(round_trips(link.addr(), 1).is_ok());
    let stream = TcpStream::connect(link.addr()).unwrap();
    let mut out = stream.try_clone().unwrap();
    let sent = Instant::now();
    writeln!(out, "never delivered").unwrap();
    thread::sleep(Duration::from_millis(150));
    let lag = link.cut();
    // It reached the link a moment after it was sent (the relay's thread read it then).
    assert!(
        lag >= Duration::from_millis(100) && lag <= sent.elapsed(),
        "the line sent {:?} ago had been on the link {lag:?}",
        sent.elapsed()
    );

    let idle = WanLink::start(echo_server(), Duration::from_millis(5)).unwrap();
    assert!(round_trips(idle.addr(), 2).is_ok());
    thread::sleep(Duration::from_millis(50));
    assert_eq!(idle.cut(), Duration::ZERO, "nothing was on the link");
}
