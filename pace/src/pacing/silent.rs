//! Pacing a server that refuses without advertising a quota: Django REST framework's
//! throttles send only `Retry-After` on a 429; slowapi and Flask-Limiter with their headers
//! off (their default) send nothing at all. The rate is learned from what the server admits
//! between its refusals.
//!
//! * **Before the first refusal**, slow start: one request until the first answer, then
//!   each admission lets the in-flight window grow by a quarter of a request (1¼ sends for
//!   each answer), never past twice what was in flight. A burst to a server that refuses
//!   past `L` therefore overshoots by about `L / 4` (a doubling window would by `L`).
//! * **A refusal starts an episode**: nothing is sent until the server takes requests
//!   again. With `Retry-After`, until then (the pacer's floor); without, one probe after a
//!   hold (one learned interval, or 100 ms before a rate is learned) that triples with each
//!   probe refused. The refusals of requests sent before the episode began are its own.
//! * **The first admission of a request sent after the episode began reopens** the server:
//!   the requests it admitted since the last reopen (or the first send), over the time from
//!   that reopen's send to this one's, is the rate it allows. A client that was refused at
//!   both ends used all of it; a hold that overshot the reopen makes it a lower bound.
//! * **From a reopen** requests go one per learned interval, and the rate rises as CUBIC's
//!   does past its plateau, by `(t / 10 s)³` of itself, at most to double: a raised limit is
//!   found, and a rate just learned is not refused again at once.
//!
//! The AWS SDKs' "adaptive" retry mode, the anchor, takes 0.7 of its measured *sending* rate
//! on a throttle and grows back along a cubic: a client that burst at a hundred times the
//! server's rate needs about thirteen throttles to come down to it. Counting admissions
//! brings it there at the first reopen.

/// The hold before the first probe when no rate is learned yet.
const FIRST_HOLD_MS: u64 = 500;

/// Each refused probe multiplies the hold by this.
const HOLD_FACTOR: u64 = 2;

/// The longest hold between probes.
const MAX_HOLD_MS: u64 = 60_000;

/// The time over which the learned rate doubles (CUBIC's convex growth: `(t / P)³`).
const GROWTH_MS: u64 = 10_000;

/// Without `Retry-After`, the learned rate grows by itself in this time, linearly...
const FAST_GROWTH_MS: u64 = 2_000;

/// ...to at most this many times itself.
const FAST_MAX: u64 = 2;

/// After a refusal near the rate (reopened at the first probe), the client goes on at this
/// percentage of the rate it kept when refused.
const NEAR_PERCENT: u64 = 85;

/// The learning state of one quota whose server advertises nothing.
#[derive(Debug, Clone, Default)]
pub(super) struct Silent {
    /// Slow start: requests that may be in flight, in quarters (0: not yet grown, one).
    window_q: u64,
    /// The refusal being waited out.
    episode: Option<Episode>,
    /// The send of the last reopen's request, or of the first request.
    since_ms: Option<u64>,
    /// Requests admitted since `since_ms` (until the next refusal).
    admitted: u64,
    /// The rate learned at the last reopen.
    learned: Option<Learned>,
    /// Nothing goes before this: the learned spacing.
    next_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Episode {
    /// Requests from this ticket on were sent after the refusal: their answers tell whether
    /// the server takes requests again.
    first_ticket: u64,
    /// No probe before this.
    hold_until_ms: u64,
    /// The hold if the probe is refused too.
    next_hold_ms: u64,
    /// Probes refused: none when the server took requests again at the first probe or at
    /// its `Retry-After`.
    refused_probes: u32,
    /// The spacing the client kept when refused, in µs, if it was pacing.
    paced_us: Option<u64>,
    /// The admissions the rate is learned from: since the last reopen, up to the refusal.
    streak: u64,
}

#[derive(Debug, Clone, Copy)]
struct Learned {
    /// Microseconds a request at the reopen.
    interval_us: u64,
    /// The reopen's send, from which the rate grows.
    from_ms: u64,
    /// Found by refused probes, the rate is a lower bound, and grows fast; found at the
    /// first probe or at `Retry-After`, it is close, and grows slowly.
    fast: bool,
}

/// An answer without a quota, as the pacer saw it.
pub(super) struct Answer {
    pub ticket: u64,
    pub sent_ms: u64,
    pub now_ms: u64,
    /// The server refused it (a 429).
    pub refused: bool,
    /// Its `Retry-After`, as the instant it ends.
    pub retry_at_ms: Option<u64>,
    /// Requests still in flight.
    pub in_flight: u64,
    /// The ticket the next request will get.
    pub next_ticket: u64,
}

impl Learned {
    /// The spacing at `now_ms`: the learned interval, shortened as the rate grows.
    fn interval_ms(&self, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.from_ms);
        let us = if !self.fast {
            let t = u128::from(elapsed.min(GROWTH_MS));
            let p3 = u128::from(GROWTH_MS).pow(3);
            u128::from(self.interval_us) * p3 / (p3 + t.pow(3))
        } else {
            let t = u128::from(elapsed.min(FAST_GROWTH_MS * (FAST_MAX - 1)));
            let p = u128::from(FAST_GROWTH_MS);
            u128::from(self.interval_us) * p / (p + t)
        };
        u64::try_from(us.div_ceil(1_000)).unwrap_or(u64::MAX)
    }
}

impl Silent {
    /// Whether a refusal was seen: the quota is being learned, and a refused request is
    /// held here rather than retried.
    pub(super) fn adapts(&self) -> bool {
        self.learned.is_some() || self.episode.is_some()
    }

    /// The first ticket that probes the current episode, if one is being waited out.
    pub(super) fn probes_from(&self) -> Option<u64> {
        self.episode.map(|e| e.first_ticket)
    }

    /// A request was sent at `now_ms`.
    pub(super) fn on_send(&mut self, now_ms: u64) {
        self.since_ms.get_or_insert(now_ms);
        if let Some(l) = &self.learned {
            self.next_ms = self.next_ms.max(now_ms).saturating_add(l.interval_ms(now_ms));
        }
    }

    /// An answer without a quota.
    pub(super) fn observe(&mut self, a: &Answer) {
        if a.refused {
            self.refused(a);
        } else {
            self.admitted(a);
        }
    }

    fn refused(&mut self, a: &Answer) {
        if let Some(e) = &mut self.episode {
            if a.ticket >= e.first_ticket {
                // The probe was refused too: hold longer.
                e.hold_until_ms = a.retry_at_ms.unwrap_or(a.now_ms.saturating_add(e.next_hold_ms));
                e.next_hold_ms = e.next_hold_ms.saturating_mul(HOLD_FACTOR).min(MAX_HOLD_MS);
                e.first_ticket = a.next_ticket;
                e.refused_probes = e.refused_probes.saturating_add(1);
            }
            return; // one sent before the episode began: its refusal is the episode's
        }
        let hold = self.learned.map_or(FIRST_HOLD_MS, |l| l.interval_ms(a.now_ms));
        self.episode = Some(Episode {
            first_ticket: a.next_ticket,
            hold_until_ms: a.retry_at_ms.unwrap_or(a.now_ms.saturating_add(hold)),
            next_hold_ms: hold.max(1).saturating_mul(HOLD_FACTOR).min(MAX_HOLD_MS),
            streak: self.admitted,
            refused_probes: 0,
            paced_us: self.learned.map(|l| l.interval_ms(a.now_ms).saturating_mul(1_000)),
        });
    }

    fn admitted(&mut self, a: &Answer) {
        let Some(e) = &mut self.episode else {
            self.admitted = self.admitted.saturating_add(1);
            if self.learned.is_none() {
                let cap = a.in_flight.saturating_add(1).saturating_mul(8);
                self.window_q = self.window_q.max(4).saturating_add(1).min(cap.max(4));
            }
            return;
        };
        if a.ticket < e.first_ticket {
            // Sent before the refusal, decided before it: part of the streak.
            e.streak = e.streak.saturating_add(1);
            return;
        }
        // The server takes requests again: its rate is what it admitted since the last reopen.
        let since = self.since_ms.unwrap_or(a.sent_ms);
        let span_us = u128::from(a.sent_ms.saturating_sub(since)) * 1_000;
        let measured = u64::try_from(span_us / u128::from(e.streak.max(1))).unwrap_or(u64::MAX);
        // Reopened at once, the client was refused just past the server's rate: the rate it
        // kept, less a little, unless the admissions show more (a client that sent slower
        // than the server allows for most of the span counts its own rate).
        let near = e.refused_probes == 0;
        let kept = e
            .paced_us
            .filter(|_| near)
            .map(|us| us.saturating_mul(100) / NEAR_PERCENT);
        let learned = Learned {
            interval_us: kept.map_or(measured, |k| k.min(measured)).max(1),
            from_ms: a.sent_ms,
            // Only the first rate, learned from a burst and probes far apart, can be far
            // below the server's: later ones are measured while pacing near it.
            fast: !near && self.learned.is_none(),
        };
        self.next_ms = self
            .next_ms
            .max(a.sent_ms.saturating_add(learned.interval_ms(a.sent_ms)));
        self.learned = Some(learned);
        self.episode = None;
        self.since_ms = Some(a.sent_ms);
        self.admitted = 1;
    }

    /// The earliest time from `floor` on at which the next request may go, or `None` to wait
    /// for an answer: `in_flight` requests are out, `probing` whether one of them probes
    /// the episode.
    pub(super) fn next_send_at(&self, floor: u64, in_flight: u64, probing: bool) -> Option<u64> {
        if let Some(e) = &self.episode {
            return (!probing).then(|| floor.max(e.hold_until_ms));
        }
        if self.learned.is_some() {
            return Some(floor.max(self.next_ms));
        }
        (in_flight.saturating_mul(4) < self.window_q.max(4)).then_some(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(ticket: u64, sent_ms: u64, now_ms: u64, refused: bool, next_ticket: u64) -> Answer {
        Answer {
            ticket,
            sent_ms,
            now_ms,
            refused,
            retry_at_ms: None,
            in_flight: 0,
            next_ticket,
        }
    }

    #[test]
    fn the_rate_is_what_the_server_admitted_between_reopens() {
        let mut s = Silent::default();
        // Ten admitted from 0, the eleventh refused at 10 ms.
        for t in 0..11 {
            s.on_send(t);
        }
        for t in 0..10 {
            s.observe(&answer(t, t, t + 1, false, 11));
        }
        s.observe(&answer(10, 10, 11, true, 11));
        assert!(s.adapts());
        assert_eq!(s.next_send_at(11, 0, false), Some(511), "a probe after 500 ms");
        assert_eq!(s.next_send_at(511, 1, true), None, "one probe at a time");
        // Refused: twice the hold.
        s.observe(&answer(11, 511, 512, true, 12));
        assert_eq!(s.next_send_at(512, 0, false), Some(1_512));
        // Admitted when sent at 1,512: ten in 1.512 s, 151 ms each.
        s.observe(&answer(12, 1_512, 1_513, false, 13));
        assert_eq!(s.next_send_at(1_513, 0, false), Some(1_664));
        // Found by a refused probe, a lower bound: the rate doubles within 2 s.
        s.on_send(1_664);
        assert_eq!(s.next_send_at(1_664, 1, false), Some(1_664 + 141));
        s.on_send(3_512);
        assert_eq!(s.next_send_at(3_512, 1, false), Some(3_512 + 76));
    }

    #[test]
    fn the_learned_rate_grows_along_a_cubic_to_double() {
        let l = Learned {
            interval_us: 100_000,
            from_ms: 0,
            fast: false,
        };
        assert_eq!(l.interval_ms(0), 100);
        assert_eq!(l.interval_ms(1_000), 100, "a plateau at first");
        assert_eq!(l.interval_ms(5_000), 89);
        assert_eq!(l.interval_ms(10_000), 50);
        assert_eq!(l.interval_ms(60_000), 50, "at most double");
    }

    #[test]
    fn slow_start_grows_a_quarter_an_admission_and_stays_near_what_is_used() {
        let mut s = Silent::default();
        assert_eq!(s.next_send_at(0, 1, false), None, "one at a time at first");
        s.observe(&Answer {
            in_flight: 3,
            ..answer(0, 0, 1, false, 1)
        });
        assert_eq!(s.next_send_at(1, 1, false), Some(1), "1¼: a second may go");
        assert_eq!(s.next_send_at(1, 2, false), None);
        // A client that sends one at a time keeps a window of two.
        for t in 1..100 {
            s.observe(&answer(t, t, t, false, t + 1));
        }
        assert_eq!(s.next_send_at(100, 1, false), Some(100));
        assert_eq!(s.next_send_at(100, 2, false), None);
    }
}
