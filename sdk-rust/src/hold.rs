//! Holds over a whole host. A server that says its limit covers every route of the client
//! (Discord's global limit: `X-RateLimit-Global: true`) makes every bucket of that host wait
//! out its `Retry-After`, not only the bucket of the route that was refused.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Hosts held at most; past that, holds that have ended are dropped, then all.
const MAX_HOSTS: usize = 1_024;

/// When each held host may be called again.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    until: Mutex<HashMap<String, Instant>>,
}

impl Holds {
    /// Holds every request to `host` (a [`crate::bucket_key`]) for `ms` from now, or
    /// longer if it is held longer already.
    pub(crate) fn hold(&self, host: String, ms: u64) {
        let until = Instant::now() + Duration::from_millis(ms);
        let mut holds = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if holds.len() >= MAX_HOSTS {
            let now = Instant::now();
            holds.retain(|_, until| *until > now);
            if holds.len() >= MAX_HOSTS {
                holds.clear();
            }
        }
        let slot = holds.entry(host).or_insert(until);
        *slot = (*slot).max(until);
    }

    /// Waits until `host` is not held.
    pub(crate) async fn wait(&self, host: &str) {
        loop {
            let until = self
                .until
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(host)
                .copied();
            match until {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => return,
            }
        }
    }
}
