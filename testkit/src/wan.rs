//! A WAN link on loopback: a TCP relay that delays every byte by a fixed latency each way
//! and can be cut and restored — the fixture between a region and a global store.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// A relay from its own loopback port to `target`, delaying each direction by `one_way`.
/// Bytes keep their order; bandwidth is not limited. Dropping it closes everything.
pub struct WanLink {
    addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Both ends of every open connection, to close them when the link is cut.
    open: Mutex<Vec<TcpStream>>,
    /// Every delay line's chunks read and not yet written: when each arrived, oldest first.
    lines: Mutex<Vec<Arc<Mutex<VecDeque<Instant>>>>>,
}

impl State {
    fn close_all(&self) {
        for s in self.open.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// How long the oldest bytes still on the link have been on it (zero when none are).
    fn oldest_in_flight(&self) -> Duration {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines
            .iter()
            .filter_map(|l| {
                l.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .front()
                    .map(Instant::elapsed)
            })
            .max()
            .unwrap_or_default()
    }
}

impl WanLink {
    /// Starts relaying connections made to [`WanLink::addr`] to `target`.
    pub fn start(target: SocketAddr, one_way: Duration) -> io::Result<WanLink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            cut: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            lines: Mutex::new(Vec::new()),
        });
        let accepting = state.clone();
        thread::Builder::new()
            .name(format!("wan-link-{}", addr.port()))
            .spawn(move || accept(listener, target, one_way, &accepting))?;
        Ok(WanLink { addr, state })
    }

    /// Where to connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port of [`WanLink::addr`].
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Cuts the link: open connections are closed, new ones are closed as soon as they come.
    /// Returns how long the oldest bytes it dropped had been on it (zero if none): the lag
    /// the link really had, its latency and however late a busy machine ran its threads.
    pub fn cut(&self) -> Duration {
        self.state.cut.store(true, Ordering::SeqCst);
        let lag = self.state.oldest_in_flight();
        self.state.close_all();
        lag
    }

    /// Restores the link: new connections are relayed again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for WanLink {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.close_all();
        let _ = TcpStream::connect(self.addr); // wakes the accept loop to see it stopped
    }
}

fn accept(listener: TcpListener, target: SocketAddr, one_way: Duration, state: &State) {
    for client in listener.incoming() {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if state.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect(target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        if let Err(e) = relay(client, server, one_way, state) {
            eprintln!("wan link {target}: cannot relay a connection: {e}");
        }
    }
}

/// Pumps both directions of one connection, each through its own delay line.
fn relay(client: TcpStream, server: TcpStream, one_way: Duration, state: &State) -> io::Result<()> {
    {
        let mut open = state.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.push(client.try_clone()?);
        open.push(server.try_clone()?);
    }
    delay_line(client.try_clone()?, server.try_clone()?, one_way, state)?;
    delay_line(server, client, one_way, state)
}

/// Reads `from` and writes each chunk to `to` `delay` after it arrived; `from`'s end of
/// stream ends `to`'s writing side, as the relayed peer's would.
fn delay_line(mut from: TcpStream, mut to: TcpStream, delay: Duration, state: &State) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let in_flight = Arc::new(Mutex::new(VecDeque::new()));
    state
        .lines
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(in_flight.clone());
    let arrived = in_flight.clone();
    thread::Builder::new().name("wan-read".into()).spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let now = Instant::now();
            arrived.lock().unwrap_or_else(PoisonError::into_inner).push_back(now);
            if tx.send((now + delay, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    })?;
    thread::Builder::new().name("wan-write".into()).spawn(move || {
        for (due, chunk) in rx {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                return;
            }
            in_flight.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
        }
        let _ = to.shutdown(Shutdown::Write);
    })?;
    Ok(())
}
