//! Child processes and ports.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Ports [`free_port`] draws from: below the kernel's ephemeral range (32768–60999 on
/// Linux), from which `bind(":0")` and every outgoing connection take their local ports.
const PORTS: std::ops::Range<u16> = 12_000..32_000;

/// A port on 127.0.0.1 that is free now and that no other call in this process returned.
///
/// Given ports are bound by a server some time later. Taken from the ephemeral range (as
/// `bind(":0")` does), one could meanwhile become another port's `:0` or an outgoing
/// connection's local port, and the server would fail to start; so ports come at random
/// from `PORTS` (below the ephemeral range) instead (test processes run in parallel draw independently: 20,000 ports
/// keep their collisions rare), never the same twice in a process, and only if they bind now.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    let span = u64::from(PORTS.end - PORTS.start);
    for attempt in 0u32..10_000 {
        let draw = RandomState::new().hash_one(attempt) % span;
        let port = PORTS.start + u16::try_from(draw).unwrap_or(0);
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() && claim(port) {
            given.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {PORTS:?}");
}

/// Claims `port` for this process among the test processes that run at once (nextest runs
/// each test in its own): a file named for it in a directory they share, made only if none
/// is there, or if the one there is older than a test run lasts. Two processes drawing the
/// same port between one's draw and its server's bind made that server fail to start (seen:
/// "Address already in use" in a full run); now the second draws again.
fn claim(port: u16) -> bool {
    const HELD_FOR: Duration = Duration::from_secs(15 * 60);
    let dir = std::env::temp_dir().join("sluice-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(port.to_string());
    let made = std::fs::OpenOptions::new().write(true).create_new(true).open(&file);
    match made {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let age = std::fs::metadata(&file)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok());
            // A stale claim is taken over (written again: its time is now).
            age.is_some_and(|age| age > HELD_FOR) && std::fs::write(&file, b"").is_ok()
        }
        // No shared directory to claim in: the draw alone, as before.
        Err(_) => true,
    }
}

/// Waits until something accepts connections on 127.0.0.1:`port`; panics after `timeout`.
pub fn wait_for_port(port: u16, timeout: Duration) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < timeout,
            "nothing listens on 127.0.0.1:{port} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a process stopped by [`Child::stop`] ended.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// Its exit status.
    pub status: ExitStatus,
    /// Whether it outlived the grace period and had to be SIGKILLed.
    pub killed: bool,
    /// Time from SIGTERM to its end.
    pub took: Duration,
}

/// A child process that is killed when dropped.
pub struct Child {
    name: String,
    inner: Option<std::process::Child>,
}

impl Child {
    /// Spawns `command`; panics with a hint if the program is missing.
    pub fn spawn(name: &str, command: &mut Command) -> Child {
        let inner = command.spawn().unwrap_or_else(|e| {
            panic!("cannot start {name} ({command:?}): {e}; run scripts/setup to install what the tests need")
        });
        Child {
            name: name.to_owned(),
            inner: Some(inner),
        }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.inner.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the process with SIGTERM and waits up to 5 s for it to exit, then kills it.
    pub fn terminate(&mut self) {
        let _ = self.stop(Duration::from_secs(5));
    }

    /// Sends SIGTERM, waits up to `grace` for the process to exit, then SIGKILLs it; says
    /// how it ended. `None` if it had already been stopped through this handle (or could not
    /// be waited for).
    pub fn stop(&mut self, grace: Duration) -> Option<Stopped> {
        let mut c = self.inner.take()?;
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(Stopped {
                    status,
                    killed: false,
                    took: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let status = c.wait().ok()?;
        Some(Stopped {
            status,
            killed: true,
            took: start.elapsed(),
        })
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.inner.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The process id, unless stopped through this handle (a process that crashed keeps
    /// it: use [`Child::is_running`] to tell).
    pub fn id(&self) -> Option<u32> {
        self.inner.as_ref().map(std::process::Child::id)
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}
