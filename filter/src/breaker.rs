//! The circuit breaker over the check service (`sluice_core::breaker`), kept by the worker
//! or by the whole process.
//!
//! The process's lives in one shared-data key: each step reads it, decides on it as the
//! worker's own would, and writes it back with compare-and-swap only when it changed (a
//! closed breaker with no failures is read, never written, and its call's success is not
//! reported: the check path costs one read). Every worker counts into the same failures,
//! so a stalled service costs the process `failures` requests the timeout, whatever number
//! of workers it runs, and only the worker whose write moved the breaker to half-open sends
//! the probe. A probe whose worker never reports (a worker that died with it) is given up
//! after the cooldown and twice the check timeout, and the next call probes.

use sluice_core::{Breaker, BreakerState, Micros};

use crate::proxy::SharedData;
use crate::slots::TRIES;

/// Whether a call may go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// No: the breaker is open, or its probe is out.
    Skip,
    /// Yes.
    Call,
    /// Yes, and the breaker had counted no failure: the call's success has nothing to clear,
    /// so the stream need not report it (see [`CheckBreaker::success`]).
    Clean,
    /// Yes, as the half-open breaker's one probe.
    Probe,
}

/// The breaker, the worker's or the process's.
pub enum CheckBreaker {
    Worker(Breaker),
    Process {
        key: String,
        /// Threshold and cooldown; its state is read from `key` each time.
        settings: Breaker,
        /// How long a probe may be out before the next call probes instead.
        probe_deadline: Micros,
    },
}

impl CheckBreaker {
    /// A breaker of `settings`; the process's under shared-data `key` when given.
    pub fn new(settings: Breaker, shared: Option<(String, Micros)>) -> CheckBreaker {
        match shared {
            Some((key, probe_deadline)) => CheckBreaker::Process {
                key,
                settings,
                probe_deadline,
            },
            None => CheckBreaker::Worker(settings),
        }
    }

    /// Makes the process's breaker before traffic (kept when another worker made it);
    /// whether it is there.
    pub fn create(&self, p: &mut impl SharedData) -> bool {
        match self {
            CheckBreaker::Worker(_) => true,
            CheckBreaker::Process { key, .. } => crate::slots::create(p, key),
        }
    }

    /// Whether a call may go out at `now`.
    pub fn allow(&mut self, p: &mut impl SharedData, now: Micros) -> Permit {
        let permit = |b: &mut Breaker| match (b.allow(now), b.state()) {
            (false, _) => Permit::Skip,
            (true, BreakerState::HalfOpen) => Permit::Probe,
            (true, BreakerState::Closed) if b.failures() == 0 => Permit::Clean,
            (true, _) => Permit::Call,
        };
        self.step(p, now, permit).unwrap_or(Permit::Skip)
    }

    /// A call succeeded: the failures counted so far are cleared. A call that went out on a
    /// [`Permit::Clean`] breaker is not reported (its stream skips this): it clears no
    /// failure it saw, and in the process's breaker the report would cost a read of the
    /// shared slot on every answer. Failures other calls met while it was out stay counted
    /// until a call that saw them succeeds.
    pub fn success(&mut self, p: &mut impl SharedData, now: Micros) {
        self.step(p, now, Breaker::success);
    }

    /// A call failed at `now`.
    pub fn failure(&mut self, p: &mut impl SharedData, now: Micros) {
        self.step(p, now, |b| b.failure(now));
    }

    /// The probe ended without an outcome (see `Breaker::release_probe`).
    pub fn release_probe(&mut self, p: &mut impl SharedData, now: Micros) {
        self.step(p, now, |b| b.release_probe(now));
    }

    /// Runs `f` on the breaker; `None` when the process's could not be written in
    /// [`TRIES`] rounds (the step is then lost: a failure not counted, a call skipped).
    fn step<R>(&mut self, p: &mut impl SharedData, now: Micros, f: impl Fn(&mut Breaker) -> R) -> Option<R> {
        let (key, settings, deadline) = match self {
            CheckBreaker::Worker(b) => return Some(f(b)),
            CheckBreaker::Process {
                key,
                settings,
                probe_deadline,
            } => (key.as_str(), settings, *probe_deadline),
        };
        for _ in 0..TRIES {
            let (bytes, cas) = p.shared_get(key).unwrap_or_default();
            let (failures, state, since) = decode(&bytes, now, deadline);
            let mut b = settings.clone().with_state(failures, state);
            let out = f(&mut b);
            if (b.failures(), b.state()) == (failures, state) {
                return Some(out);
            }
            let since = if b.state() == state { since } else { now };
            if p.shared_set(key, &encode(&b, since), cas) {
                return Some(out);
            }
        }
        None
    }
}

/// A breaker in 13 bytes: its failures, its state (0 closed, 1 open, 2 half-open) and a
/// time (the end of the cooldown when open, the probe's start when half-open).
fn encode(b: &Breaker, since: Micros) -> Vec<u8> {
    let (kind, at) = match b.state() {
        BreakerState::Closed => (0u8, Micros::ZERO),
        BreakerState::Open { until } => (1, until),
        BreakerState::HalfOpen => (2, since),
    };
    let mut out = b.failures().to_le_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(&at.as_u64().to_le_bytes());
    out
}

/// What [`encode`] wrote, at `now`: failures, state and when it began; a probe out for
/// longer than `deadline` reads as a breaker open until now (the next call probes).
/// Anything else reads as closed.
fn decode(bytes: &[u8], now: Micros, deadline: Micros) -> (u32, BreakerState, Micros) {
    let read = || -> Option<(u32, u8, Micros)> {
        let failures = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
        let at = u64::from_le_bytes(bytes.get(5..13)?.try_into().ok()?);
        Some((failures, *bytes.get(4)?, Micros::new(at)))
    };
    match read() {
        Some((failures, 1, until)) => (failures, BreakerState::Open { until }, until),
        Some((failures, 2, since)) if now >= since.saturating_add(deadline) => {
            (failures, BreakerState::Open { until: now }, since)
        }
        Some((failures, 2, since)) => (failures, BreakerState::HalfOpen, since),
        Some((failures, _, _)) => (failures, BreakerState::Closed, Micros::ZERO),
        None => (0, BreakerState::Closed, Micros::ZERO),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Shared data with Envoy's CAS.
    #[derive(Default)]
    struct Memory(HashMap<String, (Vec<u8>, u32)>, u32);

    impl SharedData for Memory {
        fn shared_get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.0.get(key).cloned()
        }
        fn shared_set(&mut self, key: &str, value: &[u8], cas: u32) -> bool {
            if cas != 0 && self.0.get(key).is_some_and(|(_, c)| *c != cas) {
                return false;
            }
            self.1 += 1;
            self.0.insert(key.to_owned(), (value.to_vec(), self.1));
            true
        }
    }

    fn worker() -> CheckBreaker {
        let settings = Breaker::new(3, Micros::SECOND);
        CheckBreaker::new(settings, Some(("sluice/t/breaker".into(), Micros::from_secs(2))))
    }

    #[test]
    fn the_workers_count_into_one_breaker_and_one_of_them_probes() {
        let mut m = Memory::default();
        let (mut a, mut b) = (worker(), worker());
        assert!(a.create(&mut m) && b.create(&mut m));
        let t = Micros::from_secs(100);
        a.failure(&mut m, t);
        b.failure(&mut m, t);
        assert_eq!(a.allow(&mut m, t), Permit::Call, "two failures of three");
        b.failure(&mut m, t);
        assert_eq!(a.allow(&mut m, t), Permit::Skip, "open for every worker after 3 in all");
        assert_eq!(b.allow(&mut m, t), Permit::Skip);
        let later = t.saturating_add(Micros::SECOND);
        assert_eq!(b.allow(&mut m, later), Permit::Probe, "one probe after the cooldown");
        assert_eq!(a.allow(&mut m, later), Permit::Skip, "and only one");
        b.success(&mut m, later);
        assert_eq!(
            a.allow(&mut m, later),
            Permit::Clean,
            "closed for all, its failures cleared"
        );
    }

    #[test]
    fn a_probe_nobody_reports_is_given_up_after_its_deadline() {
        let mut m = Memory::default();
        let (mut a, mut b) = (worker(), worker());
        a.create(&mut m);
        let t = Micros::from_secs(100);
        for _ in 0..3 {
            a.failure(&mut m, t);
        }
        let probe_at = t.saturating_add(Micros::SECOND);
        assert_eq!(a.allow(&mut m, probe_at), Permit::Probe); // and worker a dies
        let before = probe_at.saturating_add(Micros::from_ms(1_999));
        assert_eq!(b.allow(&mut m, before), Permit::Skip);
        let after = probe_at.saturating_add(Micros::from_secs(2));
        assert_eq!(b.allow(&mut m, after), Permit::Probe, "the next call probes");
    }

    #[test]
    fn a_call_goes_out_clean_only_when_no_failure_is_counted() {
        let mut m = Memory::default();
        let (mut a, mut b) = (worker(), worker());
        a.create(&mut m);
        let t = Micros::from_secs(100);
        assert_eq!(a.allow(&mut m, t), Permit::Clean);
        b.failure(&mut m, t);
        assert_eq!(a.allow(&mut m, t), Permit::Call, "another worker's failure to clear");
        a.success(&mut m, t);
        assert_eq!(b.allow(&mut m, t), Permit::Clean, "cleared for every worker");
    }

    #[test]
    fn a_closed_breaker_is_read_and_not_written() {
        let mut m = Memory::default();
        let mut a = worker();
        a.create(&mut m);
        let cas = m.0["sluice/t/breaker"].1;
        for _ in 0..5 {
            assert_eq!(a.allow(&mut m, Micros::SECOND), Permit::Clean);
            a.success(&mut m, Micros::SECOND);
        }
        assert_eq!(m.0["sluice/t/breaker"].1, cas, "no write on the check path");
    }
}
