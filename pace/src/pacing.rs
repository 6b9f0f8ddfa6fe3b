//! Client-side pacing: when may the next request go so that the client stays under the
//! quota the server advertises.
//!
//! An SDK's queue keeps one [`Pacer`] per quota (host, or host + policy) and, for every
//! request: asks [`Pacer::next_send_at`], waits until then (or, on `None`, until a response
//! arrives), sends and calls [`Pacer::on_send`], which returns the request's ticket, then
//! calls [`Pacer::observe`] with the parsed response headers and that ticket, or
//! [`Pacer::on_failure`] with it if no response came. It asks again
//! after every `observe`/`on_failure`, since the answer may move earlier. Retries go
//! through the queue like any other request.
//!
//! # Strategy
//!
//! * **Nothing known yet**: the first request goes at once; the others wait for its
//!   answer (one probe), so a burst of queued requests never floods a server whose quota
//!   is unknown. A server that answers without rate-limit headers is met with a slow start
//!   (the in-flight window grows with each admission) until it refuses a request; from its
//!   refusals the rate it allows is learned (`pacing/silent.rs`), and [`Pacer::adapts`]
//!   tells the SDKs to queue a refused request again rather than retry it.
//! * **Budget**: the pacer keeps a *lower bound* of what the server still holds. From a
//!   response it knows `remaining` at that moment; it subtracts every request that was in
//!   flight when that request was sent or sent after it (the server may have counted them
//!   all after its answer; the ticket tells which, so an answer that arrives after a later
//!   request's is not taken for newer than it is), and adds the long-run
//!   refill `window / limit` per request (plus a `margin_percent` safety margin) when the
//!   IETF `RateLimit-Policy` gave a window — capped at the capacity *before* the requests
//!   the server may not have counted yet are deducted, since a server that has not seen
//!   them sits full and loses that refill — and the whole quota once the advertised reset
//!   has passed (a new window). For a token bucket, GCRA or fixed window seen by one client
//!   this is a true lower bound, so a paced client is not refused. Each response gives a
//!   new bound; the pacer keeps it beside the best of the older ones (an older bound may
//!   be higher now, the newer one refills sooner) and uses whichever allows a request
//!   first; it starts over from the response on a denial.
//! * **Spreading**: within the budget, requests are spread over the time to reset, one per
//!   `min(window / limit, reset / remaining)` — a client-side GCRA — except that up to
//!   `max(reserve, excess)` may go back to back, `excess` being the part of `remaining`
//!   that the spread rate would not use before the reset. So a token bucket's burst is
//!   used at once and the rest follows at the refill rate, while a fixed window's quota is
//!   spread over the window instead of being spent in the first second.
//! * **Remaining 0**: wait for the refill (when the window is known) or for the reset.
//!   Against a fixed window, the refill assumption is wrong: a busy client then sees one
//!   429 near the end of a window, whose `Retry-After` holds it until the reset; as that
//!   `Retry-After` reaches the reset, the quota is taken to return only at its resets from
//!   then on (until an answer shows a refill a second or more before one), so a connection
//!   sees that 429 once, not once a window.
//! * **No window, an epoch reset** (slowapi, Flask-Limiter, express-rate-limit's legacy
//!   headers, whose resets are late by up to a second): the window is learned from how the
//!   reset instant moves from one window to the next, and then bounds the budget instead of
//!   the advertised reset (`pacing/learned.rs`).
//! * **Retry-After**: nothing is sent before it passes.
//! * **Round trips**: a response does not say when within its round trip the server
//!   decided, so the bound takes the latest moment, its arrival. With the budget spent, the
//!   next request therefore waits a whole interval after the answer: one connection with a
//!   round trip `r` sends one request per `interval + r`, not per `interval`. No client
//!   that is never refused can do better without knowing the server's clock.
//!
//! * **Units**: a quota may count tokens or bytes rather than requests; a request then
//!   spends what the caller expects it to ([`Pacer::on_send_cost`]), the answer's
//!   `remaining` correcting the estimate. [`BucketPacer`] paces a bucket on all of its
//!   quotas at once: a request goes when each allows what it is expected to spend.
//!
//! All times are the client's clock in milliseconds (any epoch, the same for every call).

use std::collections::BTreeMap;

use crate::headers::RateLimitInfo;

mod bucket;
mod learned;
mod silent;

pub use bucket::{BucketPacer, Cost};
use learned::{Answered, Learner};
use silent::Silent;

/// Tuning of a [`Pacer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacerConfig {
    /// Requests that may always go back to back, within the budget, before spreading.
    pub reserve: u64,
    /// Added to the advertised per-request interval `window / limit`, in percent (and at
    /// least 1 ms when not 0), against rounding and clock drift.
    pub margin_percent: u64,
}

impl Default for PacerConfig {
    fn default() -> Self {
        PacerConfig {
            reserve: 10,
            margin_percent: 5,
        }
    }
}

/// The pacing state of one quota.
///
/// A quota is counted in units: requests, or tokens, bytes… A request spends `cost` units
/// ([`Pacer::on_send_cost`]; 1 for [`Pacer::on_send`]), and the bound is kept in units.
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    config: PacerConfig,
    /// What the last response with a quota said, and the budget bound derived from one.
    known: Option<Known>,
    /// Whether any response was observed.
    answered: bool,
    /// The requests sent and not yet answered, by ticket.
    outstanding: BTreeMap<u64, Sent>,
    /// Requests sent, ever: the next ticket.
    sends: u64,
    /// Units sent, ever (marks which sends an anchor has seen).
    units: u64,
    /// Nothing goes before this (`Retry-After`).
    retry_at_ms: u64,
    /// Client-side GCRA theoretical arrival time.
    tat_ms: u64,
    /// The window learned from the answers' reset instants when the headers give none.
    learner: Learner,
    /// A refusal said the quota returns only at its reset (a fixed window), though a window
    /// was given: no refill is assumed until an answer shows one.
    whole_at_reset: bool,
    /// The last answer's remaining and its reset instant.
    last_seen: Option<(u64, u64)>,
    /// The rate learned from refusals while no answer gave a quota.
    silent: Silent,
}

/// A request in flight.
#[derive(Debug, Clone, Copy)]
struct Sent {
    /// The units of the others unanswered when it was sent (the server may have decided
    /// those after it).
    overlapping: u64,
    /// Its own cost.
    cost: u64,
    /// [`Pacer::units`] once it was sent: what was sent after it is the difference.
    units_after: u64,
    /// When it was sent.
    at_ms: u64,
}

/// `units` per `every_ms` milliseconds: a refill or a spacing, kept as a ratio so that a
/// quota of many units per millisecond (tokens) is not rounded to one per millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rate {
    every_ms: u64,
    units: u64,
}

/// A refill step is made of as many units as take at least this long, so that the 1 ms
/// margin of a step stays small against it.
const MIN_STEP_MS: u64 = 20;

impl Rate {
    /// The time `n` units take, in whole milliseconds (rounded down: a spacing, not a bound).
    fn time_for(self, n: u64) -> u64 {
        u64::try_from(u128::from(n) * u128::from(self.every_ms) / u128::from(self.units.max(1))).unwrap_or(u64::MAX)
    }

    /// Whether `self` is slower (more time per unit) than `other`.
    fn slower_than(self, other: Rate) -> bool {
        u128::from(self.every_ms) * u128::from(other.units) > u128::from(other.every_ms) * u128::from(self.units)
    }
}

#[derive(Debug, Clone)]
struct Known {
    policy: Option<String>,
    /// The most the server was seen to hold at once: an estimate of its capacity.
    capacity: u64,
    /// The long-run refill, margin included, in steps of whole units.
    refill: Option<Rate>,
    /// The GCRA spacing and how many units may go back to back.
    spread: Rate,
    tolerance: u64,
    /// Two lower bounds of the budget, the best one kept and the newest; the budget is at
    /// least the higher of the two (an older bound may be higher now, a newer one refills
    /// sooner).
    anchors: [Anchor; 2],
    /// The advertised reset, when the quota is whole again, and how many units the server
    /// may have counted by then: those pending at the response and sent since.
    reset_at_ms: Option<u64>,
    reset_in_flight: u64,
    reset_units: u64,
    /// The ticket of the request whose answer gave the reset.
    reset_ticket: u64,
}

/// A lower bound of the server's budget: at `at_ms` it held at least `base` units, before
/// the units it may count later (`pending` then, and every one sent since `units`).
///
/// Those requests are taken as counted as late as possible: the refill is capped at the
/// capacity *before* they are deducted, because a server that has not seen them yet sits
/// full and loses the refill (a slow server would otherwise refuse a paced client).
#[derive(Debug, Clone, Copy)]
struct Anchor {
    base: i64,
    at_ms: u64,
    pending: u64,
    units: u64,
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Anchor {
    /// The units deducted from the base when our units sent are `units`.
    fn spent(&self, units: u64) -> i64 {
        signed(self.pending.saturating_add(units.saturating_sub(self.units)))
    }

    fn level(&self, units: u64) -> i64 {
        self.base.saturating_sub(self.spent(units))
    }
}

impl Known {
    /// `a` moved to `t` (not before its own time): the refill added, capped; and, once the
    /// reset has passed, the whole quota if that is more.
    fn anchor_at(&self, a: Anchor, t: u64, units: u64) -> Anchor {
        let mut moved = a;
        let cap = signed(self.capacity);
        if let Some(r) = self.refill {
            let steps = t.saturating_sub(moved.at_ms) / r.every_ms.max(1);
            moved.base = moved.base.saturating_add(signed(steps.saturating_mul(r.units)));
            moved.at_ms = moved.at_ms.saturating_add(steps.saturating_mul(r.every_ms));
        }
        if moved.base >= cap {
            (moved.base, moved.at_ms) = (cap, t.max(a.at_ms));
        }
        if self.reset_at_ms.is_some_and(|reset| t >= reset) {
            let whole = Anchor {
                base: cap,
                at_ms: t,
                pending: self.reset_in_flight,
                units: self.reset_units,
            };
            if whole.level(units) > moved.level(units) {
                moved = whole;
            }
        }
        moved
    }

    /// The earliest time from `t` on at which anchor `a` allows `cost` more units, if the
    /// refill or the reset can make it so without an answer.
    fn time_for(&self, a: Anchor, t: u64, units: u64, cost: u64) -> Option<u64> {
        let now = self.anchor_at(a, t, units);
        let level = now.level(units);
        let need = signed(cost);
        if level >= need {
            return Some(t);
        }
        // The refill raises the bound only until the base is full; past that, only answers
        // (or the reset) can.
        let missing = u64::try_from(i128::from(need) - i128::from(level)).unwrap_or(u64::MAX);
        let headroom = signed(self.capacity).saturating_sub(now.spent(units));
        let refill = self
            .refill
            .filter(|_| now.base < signed(self.capacity) && headroom >= need)
            .map(|r| {
                let steps = missing.div_ceil(r.units.max(1));
                now.at_ms.saturating_add(steps.saturating_mul(r.every_ms))
            });
        let reset = self
            .reset_at_ms
            .filter(|&r| self.anchor_at(a, r.max(t), units).level(units) >= need);
        let at = match (refill, reset) {
            (Some(x), Some(y)) => x.min(y),
            (x, y) => x.or(y)?,
        };
        Some(at.max(t))
    }

    /// Moves both anchors to `t`.
    fn advance(&mut self, t: u64, units: u64) {
        for i in 0..self.anchors.len() {
            if t >= self.anchors[i].at_ms {
                self.anchors[i] = self.anchor_at(self.anchors[i], t, units);
            }
        }
        if self.reset_at_ms.is_some_and(|reset| t >= reset) {
            self.reset_at_ms = None; // applied: it is in the anchors now, or was less
        }
    }
}

impl Pacer {
    /// A pacer that knows nothing yet, with the default [`PacerConfig`].
    pub fn new() -> Pacer {
        Pacer::default()
    }

    /// A pacer with the given tuning.
    pub fn with_config(config: PacerConfig) -> Pacer {
        Pacer {
            config,
            ..Pacer::default()
        }
    }

    /// The tuning.
    pub fn config(&self) -> &PacerConfig {
        &self.config
    }

    /// Whether the rate is being learned from the server's refusals, its answers giving no
    /// quota: a refused request is then queued again, its wait this pacer's, rather than
    /// retried on the retry budget.
    pub fn adapts(&self) -> bool {
        self.known.is_none() && self.silent.adapts()
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.outstanding.len() as u64
    }

    /// The units of the requests sent and not yet answered.
    fn units_in_flight(&self) -> u64 {
        self.outstanding.values().fold(0, |n, s| n.saturating_add(s.cost))
    }

    /// Records that a request was sent at `now_ms`; returns its ticket, to pass to
    /// [`Pacer::observe`] or [`Pacer::on_failure`].
    pub fn on_send(&mut self, now_ms: u64) -> u64 {
        self.on_send_cost(now_ms, 1)
    }

    /// Records that a request expected to spend `cost` units was sent at `now_ms`; returns
    /// its ticket. The answer corrects the estimate: its `remaining` is what the server
    /// counted.
    pub fn on_send_cost(&mut self, now_ms: u64, cost: u64) -> u64 {
        let ticket = self.sends;
        let units = self.units;
        if let Some(k) = &mut self.known {
            k.advance(now_ms, units);
        }
        let overlapping = self.units_in_flight();
        self.units = self.units.saturating_add(cost);
        let sent = Sent {
            overlapping,
            cost,
            units_after: self.units,
            at_ms: now_ms,
        };
        self.outstanding.insert(ticket, sent);
        self.sends = self.sends.saturating_add(1);
        self.silent.on_send(now_ms);
        let spacing = self.known.as_ref().map_or(0, |k| self.spread(k).0.time_for(cost));
        self.tat_ms = self.tat_ms.max(now_ms).saturating_add(spacing);
        ticket
    }

    /// Records that the request with `ticket` ended without a response (a network error
    /// or timeout).
    pub fn on_failure(&mut self, ticket: u64) {
        self.outstanding.remove(&ticket);
    }

    /// Records a response's quota (see [`crate::headers::parse_headers`]), received at
    /// `now_ms`, to the request with `ticket`.
    pub fn observe(&mut self, info: &RateLimitInfo, now_ms: u64, ticket: u64) {
        // The units the server may have decided after this request: those unanswered when
        // it was sent (over several connections a server may take them in any order), and
        // every one sent after it. A ticket never issued is taken as the latest; one
        // answered before, as the earliest.
        let (overlapping, later, cost, sent_ms) = match self.outstanding.remove(&ticket) {
            Some(s) => (s.overlapping, self.units.saturating_sub(s.units_after), s.cost, s.at_ms),
            None if ticket >= self.sends => (self.units_in_flight(), 0, 1, now_ms),
            None => (self.units_in_flight(), self.units, 1, 0),
        };
        // The earliest request the server may have counted before this one: itself, or one
        // sent before it and unanswered still.
        let first_ms = self
            .outstanding
            .first_key_value()
            .filter(|(&t, _)| t < ticket)
            .map_or(sent_ms, |(_, s)| s.at_ms.min(sent_ms));
        let pending = overlapping.saturating_add(later);
        self.answered = true;
        if let Some(retry) = info.retry_after_ms {
            self.retry_at_ms = self.retry_at_ms.max(now_ms.saturating_add(retry));
        }
        let Some(remaining) = info.remaining else {
            if self.known.is_none() {
                self.silent.observe(&silent::Answer {
                    ticket,
                    sent_ms,
                    now_ms,
                    refused: info.refused,
                    retry_at_ms: info.retry_after_ms.map(|_| self.retry_at_ms),
                    in_flight: self.outstanding.len() as u64,
                    next_ticket: self.sends,
                });
            }
            return; // no quota in this response: keep what we knew
        };
        let reset_after = info.reset_after_ms;
        // Same quota, no refusal: the old bounds still hold (a refusal starts over). The
        // request spent its cost, unless refused.
        let denied = info.retry_after_ms.is_some();
        self.learner.observe(&Answered {
            info,
            now_ms,
            sent_ms,
            first_ms,
            rivals: pending,
            cost,
            denied,
        });
        if let Some((window, limit)) = self.learner.spacing() {
            // Spread from this request on, the first one included.
            let spacing = u128::from(self.with_margin(window)) * u128::from(cost) / u128::from(limit.max(1));
            let next = sent_ms.saturating_add(u64::try_from(spacing).unwrap_or(u64::MAX));
            self.tat_ms = self.tat_ms.max(next);
        }
        let kept = self.known.take().filter(|k| k.policy == info.policy && !denied);
        let own = if denied { cost.min(1) } else { cost };
        let capacity = kept
            .as_ref()
            .map_or(0, |k| k.capacity)
            .max(remaining.saturating_add(own));
        self.whole_at_reset = self.refills_at_reset(info, now_ms, remaining, denied);
        self.last_seen = reset_after.map(|r| (remaining, now_ms.saturating_add(r)));
        let refill = match (info.limit, info.window_ms) {
            (Some(limit), Some(window)) if limit > 0 && window > 0 && !self.whole_at_reset => {
                Some(self.refill(limit, window, capacity))
            }
            _ => None,
        };
        // Until the reset, `remaining` spread evenly; never slower than the refill rate.
        let per_remaining = reset_after.filter(|_| remaining > 0).map(|r| Rate {
            every_ms: r,
            units: remaining,
        });
        let spread = match (refill, per_remaining) {
            (Some(a), Some(b)) if a.slower_than(b) => b,
            (a, b) => a.or(b).unwrap_or(Rate { every_ms: 0, units: 1 }),
        };
        // What the refill rate would not use before the reset may go at once.
        let excess = match (refill, reset_after) {
            (Some(r), Some(reset)) => remaining.saturating_sub((reset / r.every_ms.max(1)).saturating_mul(r.units)),
            _ => 0,
        };
        let fresh = Anchor {
            base: signed(remaining),
            at_ms: now_ms,
            pending,
            units: self.units,
        };
        // The reset, and those the server may have counted after this answer, in the next
        // window perhaps.
        let mut reset = (
            reset_after.map(|r| now_ms.saturating_add(r)),
            pending,
            self.units,
            ticket,
        );
        let anchors = match kept {
            Some(mut k) => {
                k.refill = refill;
                k.advance(now_ms, self.units);
                let [a, b] = k.anchors;
                let best = if a.level(self.units) > b.level(self.units) {
                    a
                } else {
                    b
                };
                // The answer to an earlier request may arrive after a later one's, its reset
                // older than the server's: then the quota is whole at the later of the two.
                if k.reset_ticket > ticket && k.reset_at_ms > reset.0 {
                    reset = (k.reset_at_ms, k.reset_in_flight, k.reset_units, k.reset_ticket);
                }
                [best, fresh]
            }
            None => [fresh, fresh],
        };
        self.known = Some(Known {
            policy: info.policy.clone(),
            capacity,
            refill,
            spread,
            tolerance: self.config.reserve.max(excess).max(1),
            anchors,
            reset_at_ms: reset.0,
            reset_in_flight: reset.1,
            reset_units: reset.2,
            reset_ticket: reset.3,
        });
        // The spacing may have changed with this answer: the GCRA's credit is the new one's
        // (a spacing read from an answer with little left would otherwise hold the next
        // requests for seconds after the quota is whole again).
        if let Some(k) = &self.known {
            let (spread, tolerance) = self.spread(k);
            self.tat_ms = self.tat_ms.min(now_ms.saturating_add(spread.time_for(tolerance)));
        }
    }

    /// Whether the quota returns only at its reset, as a fixed window's: a refusal whose
    /// `Retry-After` reaches its reset says so (a bucket's names the refill of one request,
    /// sooner, though whole seconds may round both alike); an answer whose remaining rose a
    /// second or more before the last answer's reset shows a refill, and says otherwise.
    fn refills_at_reset(&self, info: &RateLimitInfo, now_ms: u64, remaining: u64, denied: bool) -> bool {
        if denied {
            let whole =
                matches!((info.retry_after_ms, info.reset_after_ms), (Some(retry), Some(reset)) if retry >= reset);
            return self.whole_at_reset || (whole && info.window_ms.is_some());
        }
        // A whole second before the reset, which rounding cannot explain.
        let refilled = self
            .last_seen
            .is_some_and(|(before, reset_at)| remaining > before && now_ms.saturating_add(1_000) < reset_at);
        self.whole_at_reset && !refilled
    }

    /// The refill of `limit` units per `window` ms in steps of at least [`MIN_STEP_MS`]
    /// (but never more units than `capacity`), each step's time with the margin.
    fn refill(&self, limit: u64, window: u64, capacity: u64) -> Rate {
        let units = MIN_STEP_MS.saturating_mul(limit).div_ceil(window).min(capacity).max(1);
        let step = u64::try_from((u128::from(window) * u128::from(units)).div_ceil(u128::from(limit)));
        Rate {
            every_ms: self.with_margin(step.unwrap_or(u64::MAX)),
            units,
        }
    }

    fn with_margin(&self, interval: u64) -> u64 {
        let pct = self.config.margin_percent;
        if pct == 0 {
            return interval;
        }
        interval.saturating_add((interval.saturating_mul(pct) / 100).max(1))
    }

    /// The earliest time at which the next request may be sent: `now_ms` or later, or
    /// `None` to wait until an in-flight request is answered. Never `None` when nothing is
    /// in flight.
    pub fn next_send_at(&self, now_ms: u64) -> Option<u64> {
        self.next_send_at_cost(now_ms, 1)
    }

    /// As [`Pacer::next_send_at`], for a request expected to spend `cost` units.
    pub fn next_send_at_cost(&self, now_ms: u64, cost: u64) -> Option<u64> {
        let floor = now_ms.max(self.retry_at_ms);
        let Some(k) = &self.known else {
            if !self.answered {
                return self.outstanding.is_empty().then_some(floor);
            }
            let probing = self
                .silent
                .probes_from()
                .is_some_and(|t| self.outstanding.range(t..).next().is_some());
            return self.silent.next_send_at(floor, self.outstanding.len() as u64, probing);
        };
        if self.learner.knows() {
            // The learned window bounds the budget; nothing is spread.
            return self.learner.time_for(floor, self.units_in_flight(), cost);
        }
        let (spread, tolerance) = self.spread(k);
        let gcra = self.tat_ms.saturating_sub(spread.time_for(tolerance.saturating_sub(1)));
        let from = floor.max(gcra);
        let budget = self.budget_at(k, from, cost);
        match budget {
            Some(t) => Some(t),
            // Nothing in flight to learn from: try at the reset, or now.
            None if self.outstanding.is_empty() => Some(k.reset_at_ms.map_or(from, |r| r.max(from))),
            None => None,
        }
    }

    /// The GCRA spacing and how many may go back to back: the quota's, or while the window
    /// is guessed, the guess spread evenly, one at a time ([`learned`]).
    fn spread(&self, k: &Known) -> (Rate, u64) {
        match self.learner.spacing() {
            Some((window, limit)) => {
                let guess = Rate {
                    every_ms: self.with_margin(window),
                    units: limit.max(1),
                };
                // Never slower than the answer's own spacing, what remains until its reset.
                (if guess.slower_than(k.spread) { k.spread } else { guess }, 1)
            }
            None => (k.spread, k.tolerance),
        }
    }

    /// How long to wait from `now_ms` before the next send (0 = now); `None` as in
    /// [`Pacer::next_send_at`].
    pub fn delay_ms(&self, now_ms: u64) -> Option<u64> {
        self.next_send_at(now_ms).map(|t| t.saturating_sub(now_ms))
    }

    /// The earliest time from `t` on at which the bound allows `cost` more units.
    fn budget_at(&self, k: &Known, t: u64, cost: u64) -> Option<u64> {
        k.anchors
            .iter()
            .filter_map(|&a| k.time_for(a, t, self.units, cost))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(limit: u64, remaining: u64, reset_ms: u64, window_ms: Option<u64>) -> RateLimitInfo {
        RateLimitInfo {
            limit: Some(limit),
            remaining: Some(remaining),
            reset_after_ms: Some(reset_ms),
            window_ms,
            ..Default::default()
        }
    }

    #[test]
    fn unknown_quota_probes_once_then_retry_after_holds() {
        let mut p = Pacer::new();
        assert_eq!(p.next_send_at(1_000), Some(1_000));
        let probe = p.on_send(1_000);
        assert_eq!(p.next_send_at(1_001), None, "one probe until the quota is known");
        p.observe(
            &RateLimitInfo {
                retry_after_ms: Some(2_000),
                ..Default::default()
            },
            1_010,
            probe,
        );
        assert_eq!(p.next_send_at(1_020), Some(3_010));
        // A server without quota headers is met with a slow start: its answer let one
        // more go beside the next.
        p.on_send(3_010);
        assert_eq!(p.next_send_at(3_011), Some(3_011));
        p.on_send(3_011);
        assert_eq!(p.next_send_at(3_012), None);
    }

    #[test]
    fn remaining_zero_without_a_window_waits_for_the_reset_which_restores_the_quota() {
        let mut p = Pacer::new();
        let probe = p.on_send(0);
        p.observe(&info(5, 4, 10_000, None), 10, probe);
        let mut tickets = Vec::new();
        for _ in 0..4 {
            let t = p.next_send_at(10).unwrap();
            tickets.push(p.on_send(t));
        }
        // Four sent against four remaining, nothing answered: only answers can tell more,
        // or the reset.
        assert_eq!(p.next_send_at(20), Some(10_010));
        for ticket in tickets {
            p.observe(&info(5, 0, 9_990, None), 20, ticket);
        }
        assert_eq!(p.next_send_at(20), Some(10_010));
        // After the reset the whole quota (5, as seen) is back, less the three that were
        // unanswered when the last answer's request was sent: the server may have counted
        // those after it, in the new window. Answers then tell the rest.
        let mut sent = Vec::new();
        while p.next_send_at(10_010) == Some(10_010) && sent.len() < 10 {
            sent.push(p.on_send(10_010));
        }
        assert_eq!(sent.len(), 2);
        p.observe(&info(5, 3, 10_000, None), 10_020, sent[1]);
        assert_eq!(p.next_send_at(10_020), Some(10_020));
    }

    #[test]
    fn budget_goes_at_once_then_the_refill_rate() {
        let mut p = Pacer::new();
        let probe = p.on_send(0);
        // 50 per second (20 ms each, 21 with the margin), 3 left, full in 60 ms.
        p.observe(&info(50, 3, 60, Some(1_000)), 1, probe);
        for _ in 0..3 {
            assert_eq!(p.next_send_at(1), Some(1));
            p.on_send(1);
        }
        assert_eq!(p.next_send_at(1), Some(22));
        let fourth = p.on_send(22);
        // Four unanswered fill the four the server was seen to hold: a server that has not
        // counted them yet sits full and refills nothing, so only an answer tells more.
        assert_eq!(p.next_send_at(22), None);
        // The last one, answered at 30 with nothing left and the quota whole at 50: then the
        // server holds its four, less the three still unanswered.
        p.observe(&info(50, 0, 20, Some(1_000)), 30, fourth);
        assert_eq!(p.next_send_at(30), Some(50));
    }

    #[test]
    fn a_fixed_window_quota_is_spread_after_the_reserve() {
        let mut p = Pacer::with_config(PacerConfig {
            reserve: 3,
            margin_percent: 5,
        });
        let probe = p.on_send(0);
        // 100 per minute, 99 left for 60 s: 630 ms per request, about 4 spare at once.
        p.observe(&info(100, 99, 60_000, Some(60_000)), 0, probe);
        let mut now = 0;
        let mut at_once = 0;
        while p.next_send_at(now) == Some(0) {
            p.on_send(0);
            at_once += 1;
        }
        assert_eq!(at_once, 4);
        let next = p.next_send_at(now).unwrap();
        assert!((500..=700).contains(&next), "{next}");
        now = next;
        p.on_send(now);
        assert_eq!(p.next_send_at(now), Some(now + 606));
    }

    #[test]
    fn nothing_in_flight_never_waits_for_an_answer() {
        let mut p = Pacer::new();
        let probe = p.on_send(0);
        p.observe(&info(1, 0, 1_000, None), 0, probe);
        let lost = p.on_send(5);
        p.on_failure(lost);
        assert!(p.next_send_at(6).is_some());
        assert_eq!(p.delay_ms(6), Some(994));
    }

    #[test]
    fn a_late_answer_to_an_earlier_request_is_not_taken_for_newer() {
        let mut p = Pacer::new();
        let probe = p.on_send(0);
        // No window, 2 left until the reset at 10 s.
        p.observe(&info(10, 2, 10_000, None), 0, probe);
        let a = p.on_send(1);
        let b = p.on_send(1);
        assert_eq!(p.next_send_at(2), Some(10_000), "two sent against two remaining");
        // The server decided a then b; b's answer arrives first, then a's, which does not
        // count b.
        p.observe(&info(10, 0, 9_990, None), 5, b);
        p.observe(&info(10, 1, 9_990, None), 6, a);
        let next = p.next_send_at(7).unwrap();
        assert!(
            next >= 9_990,
            "a's stale remaining 1 was spent by b, yet the next send is at {next}"
        );
    }

    #[test]
    fn an_answer_decided_before_an_earlier_request_is_not_taken_for_newer() {
        let mut p = Pacer::new();
        let probe = p.on_send(0);
        p.observe(&info(10, 2, 10_000, None), 0, probe);
        let a = p.on_send(1);
        let b = p.on_send(1);
        // Over two connections the server decided b first (1 left), then a (0 left); a's
        // answer arrives first, then b's with its stale 1.
        p.observe(&info(10, 0, 9_990, None), 5, a);
        p.observe(&info(10, 1, 9_990, None), 6, b);
        let next = p.next_send_at(7).unwrap();
        assert!(
            next >= 9_990,
            "b's stale remaining 1 was spent by a, yet the next send is at {next}"
        );
    }
}
