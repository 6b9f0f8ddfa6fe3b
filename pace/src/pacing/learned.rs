//! Learning the window a header family leaves out, from how its reset moves.
//!
//! slowapi, Flask-Limiter and express-rate-limit's legacy headers give the limit, what
//! remains and when the window ends, as an epoch (an instant: [`RateLimitInfo::reset_is_instant`]),
//! never the window itself, and their reset is late: slowapi names one second after the
//! window's end, Flask-Limiter that rounded down to the second, express-rate-limit the end
//! rounded up. A client that waits for it loses up to a window each time. What the answers
//! do say: every answer of one window names the same instant, and the request a new window
//! counts first finds the quota whole (its `remaining` and its own cost make the limit) at
//! a reset that moved. For a client alone on the quota, a window began between the send of
//! that request and its answer's arrival, so:
//!
//! * a window is at most the time from the send of one window's first request to the
//!   arrival of the next window's first answer (an upper bound, `upper`), whatever the
//!   window's alignment and however late the reset;
//! * it is more than the time from the arrival of a window's first answer to the send of a
//!   request counted in that same window (a lower bound, `lower`).
//!
//! Before the first bound is known the quota is spread evenly over the first answer's reset
//! delay (the *guess*, at least the window when the reset is late), one request at a time:
//! then a new window begins before the quota is spent, and its first answer gives `upper`.
//! From then on every unit spent counts, at the latest, `upper` after its answer arrived (a
//! fixed window's unit leaves when its window ends, a moving window's one window after it
//! was counted); a new window's first answer clears them all but those counted in the new
//! window whose answers came first (answers arrive in any order). So all but the last unit of a
//! window go at once, and the last one goes halfway between the bounds: counted in the old
//! window, it raises `lower`; the first of a new one, it lowers `upper`. It is never refused
//! either way, and the bounds close in on the window in a few windows.
//!
//! A token bucket's epoch reset (when it will be full) looks like a window's at first but
//! moves later with every unit spent, a little at a time: a reset that moves by less than a
//! second, yet by more than the clocks' difference, names no window and ends the learning.
//! And only the request counted first finds the quota whole. An answer naming a moved
//! reset with less left is the new window's too, but does not start it: it could be its
//! first only had the requests in flight been counted before it, which a bucket whose
//! reset jumped with many answers at once also fits. (Taking either for a new window once
//! admitted a request the bucket refused.)
//!
//! A refusal, a window given by the headers, a reset given as a delay, a reset that moved
//! less than a window or later as the quota was spent, or bounds that cross end the
//! learning: the pacer then paces on the advertised reset, as before.

use std::collections::VecDeque;

use crate::headers::RateLimitInfo;

/// Units remembered at most: a quota larger than this is paced on the advertised reset.
const MAX_LOG: u64 = 100_000;

/// How far two answers' reset instants may differ and still name the same one: an SDK
/// reads the headers and tells the pacer a moment apart, on clocks of its own (a wall clock
/// for the epoch, a monotonic one for the pacer), later on a busy machine.
const SAME_RESET_MS: u64 = 250;

/// How far an epoch reset moves from one window to the next, at least: a whole window, a
/// second or more (a shorter window is not learned), less the clocks' difference. A reset
/// that moves less, but more than [`SAME_RESET_MS`], names no window: a token bucket's.
const MOVED_MS: u64 = 1_000 - SAME_RESET_MS;

/// Added to the learned window: the SDKs' clocks count whole milliseconds, rounded down.
const CLOCK_MS: u64 = 2;

#[derive(Debug, Clone, Default)]
enum Phase {
    /// No answer with a whole window yet.
    #[default]
    Waiting,
    /// A window's first answer gave its reset delay: spread over that; the window is more
    /// than `lower_ms`.
    Guessing { guess_ms: u64, lower_ms: u64 },
    /// The window is known to lie in `(lower_ms, upper_ms]`.
    Learned { lower_ms: u64, upper_ms: u64 },
    /// The answers do not fit the model: pace on the advertised reset.
    Off,
}

/// What the answers' reset instants taught of the window (see the module's docs).
#[derive(Debug, Clone, Default)]
pub(super) struct Learner {
    phase: Phase,
    limit: u64,
    /// The latest reset instant named, and the remaining of the answer that named it.
    reset_at_ms: Option<u64>,
    remaining: u64,
    /// The current window's first request: sent no earlier than this, answered then.
    window_sent_ms: u64,
    window_arrived_ms: u64,
    /// Units spent in the current window, or in the next one before its first answer came:
    /// (answer arrival, units, the reset instant the answer named), oldest first.
    log: VecDeque<(u64, u64, u64)>,
}

/// One answered request, as the learner reads it.
pub(super) struct Answered<'a> {
    pub info: &'a RateLimitInfo,
    pub now_ms: u64,
    /// When the request was sent.
    pub sent_ms: u64,
    /// When it was sent, or an earlier request unanswered then and still now (which the
    /// server may have counted first).
    pub first_ms: u64,
    /// Units the server may have counted before this one: in flight when it was sent, or
    /// sent after it.
    pub rivals: u64,
    pub cost: u64,
    pub denied: bool,
}

impl Learner {
    /// While the learner guesses: the window guessed and the limit, to spread the quota
    /// evenly over it, one request at a time.
    pub(super) fn spacing(&self) -> Option<(u64, u64)> {
        match self.phase {
            Phase::Guessing { guess_ms, .. } => Some((guess_ms, self.limit)),
            _ => None,
        }
    }

    /// Whether the learned window replaces the advertised reset ([`Learner::time_for`]).
    pub(super) fn knows(&self) -> bool {
        matches!(self.phase, Phase::Learned { .. })
    }

    pub(super) fn observe(&mut self, a: &Answered<'_>) {
        if matches!(self.phase, Phase::Off) {
            return;
        }
        let info = a.info;
        let (Some(limit), Some(remaining), Some(reset)) = (info.limit, info.remaining, info.reset_after_ms) else {
            return; // no quota in this answer: nothing to learn, nothing refuted
        };
        let waiting = matches!(self.phase, Phase::Waiting);
        if a.denied
            || remaining > limit
            || !info.reset_is_instant
            || info.window_ms.is_some()
            || !(1..=MAX_LOG).contains(&limit)
            || (limit != self.limit && !waiting)
        {
            self.off();
            return;
        }
        self.limit = limit;
        let reset_at = a.now_ms.saturating_add(reset);
        // A reset already passed names no window, nor an older one; nor does an answer that
        // counts more than the limit left after this request (slowapi counts a request in a
        // window that ends before it reads what remains: the limit, and a reset a second on).
        if reset == 0
            || remaining.saturating_add(a.cost) > limit
            || self
                .reset_at_ms
                .is_some_and(|r| reset_at.saturating_add(SAME_RESET_MS) < r)
        {
            self.log.push_back((a.now_ms, a.cost, reset_at));
            return;
        }
        let drift = self.reset_at_ms.map_or(0, |r| reset_at.saturating_sub(r));
        if drift > SAME_RESET_MS && drift < MOVED_MS {
            self.off();
            return;
        }
        let moved = drift >= MOVED_MS;
        // Counted first in its window (more than the limit was dealt with above).
        let fresh = remaining.saturating_add(a.cost) >= limit;
        // A new window's answer counted after others (its first requests go out together, and
        // their answers arrive in any order: those answered already with this reset, and its
        // `rivals`) shows as little as the limit less them: less than the old window's latest
        // answer, yet a window's (found at 100,000 cases: 18 at once, 32 a second, 12 left).
        let seen_in_it: u64 = self
            .log
            .iter()
            .filter(|&&(_, _, r)| r.abs_diff(reset_at) <= SAME_RESET_MS)
            .fold(0, |n, &(_, c, _)| n.saturating_add(c));
        let counted_before = a.rivals.saturating_add(seen_in_it);
        let new_window = remaining.saturating_add(a.cost).saturating_add(counted_before) >= limit;
        if moved && remaining < self.remaining && !new_window {
            // The reset moved later as the quota was spent, by more than the requests that
            // could have come first: a bucket, not a window (whose reset moves only as a new
            // window finds the quota whole again).
            self.off();
            return;
        }
        if fresh && (moved || self.reset_at_ms.is_none()) {
            // The first answer of a window.
            let upper = a.now_ms.saturating_sub(self.window_sent_ms).saturating_add(CLOCK_MS);
            self.phase = match self.phase {
                Phase::Waiting => Phase::Guessing {
                    guess_ms: reset,
                    lower_ms: 0,
                },
                Phase::Guessing { lower_ms, .. } => Phase::Learned {
                    lower_ms,
                    upper_ms: upper,
                },
                Phase::Learned { lower_ms, upper_ms } => Phase::Learned {
                    lower_ms,
                    upper_ms: upper_ms.min(upper),
                },
                Phase::Off => Phase::Off,
            };
            (self.window_sent_ms, self.window_arrived_ms) = (a.first_ms, a.now_ms);
            self.log.retain(|&(_, _, r)| r.abs_diff(reset_at) <= SAME_RESET_MS);
        } else if moved {
            // The next window's, counted after its first request, whose answer is to come.
            self.log.push_back((a.now_ms, a.cost, reset_at));
            return;
        } else if !moved && !waiting {
            // Counted in the current window: the window is longer than since its start.
            let since = a.sent_ms.saturating_sub(self.window_arrived_ms);
            if let Phase::Guessing { lower_ms, .. } | Phase::Learned { lower_ms, .. } = &mut self.phase {
                *lower_ms = (*lower_ms).max(since);
            }
        }
        if moved || self.reset_at_ms.is_none() {
            self.reset_at_ms = Some(reset_at);
        }
        self.remaining = remaining;
        if let Phase::Learned { lower_ms, upper_ms } = self.phase {
            if lower_ms >= upper_ms {
                self.off();
                return;
            }
            while self
                .log
                .front()
                .is_some_and(|&(at, _, _)| at.saturating_add(upper_ms) <= a.now_ms)
            {
                self.log.pop_front();
            }
        }
        self.log.push_back((a.now_ms, a.cost, reset_at));
    }

    fn off(&mut self) {
        *self = Learner {
            phase: Phase::Off,
            ..Learner::default()
        };
    }

    /// With the window learned: the earliest time from `t` on at which `cost` more units may
    /// go, `in_flight` units being unanswered; `None` to wait for an answer.
    pub(super) fn time_for(&self, t: u64, in_flight: u64, cost: u64) -> Option<u64> {
        let Phase::Learned { lower_ms, upper_ms } = self.phase else {
            return Some(t);
        };
        let counted = |at: u64| at.saturating_add(upper_ms) > t;
        let live = self
            .log
            .iter()
            .filter(|&&(at, _, _)| counted(at))
            .fold(0u64, |n, &(_, c, _)| n.saturating_add(c));
        let after = live.saturating_add(in_flight).saturating_add(cost);
        if after < self.limit {
            return Some(t);
        }
        if after == self.limit {
            // The window's last unit: the probe, halfway between the bounds.
            let probe = self
                .window_arrived_ms
                .saturating_add(lower_ms + (upper_ms - lower_ms) / 2);
            return Some(t.max(probe));
        }
        // Wait until enough units leave; those in flight leave only by an answer.
        let mut over = after - self.limit;
        for &(at, n, _) in self.log.iter().filter(|&&(at, _, _)| counted(at)) {
            if n >= over {
                return Some(at.saturating_add(upper_ms));
            }
            over -= n;
        }
        (in_flight == 0).then_some(t)
    }
}
