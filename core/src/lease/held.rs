//! One quota's lease as its holder keeps it: the lease's units and end, the lease a renewal
//! replaced, the spending rate that sizes the next ask, and whether the quota is spent.
//!
//! [`super::book::LeaseBook`] keeps one [`Held`] per quota in a map. A filter whose workers
//! share their leases keeps each in the host's shared data instead, read and written whole
//! ([`Held::encode`], [`Held::decode`]), and every worker decides by the same methods: the
//! book's rules are written once.

mod wake;

use super::lease_size;
use super::wire::{LeaseAsk, LeaseGranted, LeaseReturn, MAX_LEASE_ITEMS, MAX_WANT};
use crate::time::Micros;

/// A quota the book holds leases of: a rule's name and the identity value it limits.
pub type QuotaKey = (String, String);

/// A grant asked for and not answered within this long is taken as lost (ms): the worker
/// that asked may be gone (a proxy ends a worker's VM mid-call), and the quota may be asked
/// for again.
pub const ASK_LOST_MS: u64 = 10_000;

/// Tuning of a [`super::book::LeaseBook`], and of each quota it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookConfig {
    /// Quotas held at most; past that the least recently used eighth is given back and
    /// forgotten.
    pub max_quotas: usize,
    /// A lease is renewed when it would run out within this long at its spending rate, or
    /// ends within it (ms); within half its length at most, so a short lease is not renewed
    /// as soon as it is granted.
    pub renew_ahead_ms: u64,
    /// Unspent units go back this long before a lease ends (ms): the service takes nothing
    /// back after the end, and the call takes time.
    pub return_margin_ms: u64,
    /// Leases are sized for this long at the spending rate (ms), or for the length of the
    /// quota's last lease when that is longer (a lease lasts what the rule's `lease_ttl`
    /// gives: sizing it for its whole life spares calls).
    pub horizon_ms: u64,
    /// A quota used within this long keeps a lease (of at least one unit) even when it was
    /// idle the last whole second, so a client that comes back now and then finds a unit in
    /// hand (ms; 0, the default: a quota idle a whole second lets its lease go). For a holder
    /// with no exact path to fall back on (a region's node); it costs a renewal a lease.
    pub keep_warm_ms: u64,
    /// Most asks, and most returns, one call carries: the rest wait for the next call.
    /// [`MAX_LEASE_ITEMS`], the default, is what `POST /v1/lease` takes.
    pub max_items_per_call: usize,
    /// Units a lease asks for at least (1, the default): more spares a holder whose quota's
    /// first request waited for its lease a second wait for the next (a region's node).
    pub min_lease_units: u64,
    /// A quota whose grant brought less than was asked, which leaves it empty (or whose exact
    /// check refused, see [`super::book::LeaseBook::refused`]), is spent for a while: once its units in
    /// hand are gone [`super::book::LeaseBook::spend`] answers [`super::book::Spend::Exhausted`] without a call, and no
    /// grant is asked for meanwhile (true, the default). A holder whose calls carry many quotas at a fixed pace (a region's node)
    /// may turn it off: asking for a spent quota costs it no call.
    pub remember_spent: bool,
}

impl Default for BookConfig {
    fn default() -> Self {
        BookConfig {
            max_quotas: 10_000,
            renew_ahead_ms: 250,
            return_margin_ms: 100,
            horizon_ms: 1_000,
            min_lease_units: 1,
            remember_spent: true,
            keep_warm_ms: 0,
            max_items_per_call: MAX_LEASE_ITEMS,
        }
    }
}

/// One quota's lease and spending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// The lease's id, units left, and when it ends (proxy clock); no lease when `id` is
    /// `None`.
    pub(super) id: Option<u64>,
    pub(super) units: u64,
    pub(super) ends_ms: u64,
    /// The lease a renewal replaced, while it still has units and runs: spent first, so a
    /// renewal costs no call of its own to give its units back.
    pub(super) drain: Option<Drain>,
    /// What the quota held for this proxy: what it had left at the grant plus the lease's
    /// units, less what this proxy spent since (the headers' `remaining`).
    pub(super) remaining: u64,
    /// The rule's limit and window, and when the quota is whole again (proxy clock).
    pub(super) limit: u64,
    pub(super) window_ms: u64,
    pub(super) reset_at_ms: u64,
    /// How long its last lease lasted (ms).
    pub(super) last_ttl_ms: u64,
    /// Units the lease came with (0: none left to grant, or no lease).
    pub(super) granted_units: u64,
    /// The quota is spent until then (proxy clock; 0: not spent): its last grant brought
    /// less than was asked, or an exact check refused it.
    pub(super) spent_until_ms: u64,
    /// A grant was asked for and not answered yet, and when (see [`ASK_LOST_MS`]).
    pub(super) asked: bool,
    pub(super) asked_ms: u64,
    /// That grant was asked while a lease with units was live: it renews it.
    pub(super) renewing: bool,
    /// Units spent in the current second, and the rate of the last whole one.
    pub(super) spent_this_s: u64,
    pub(super) second: u64,
    pub(super) rate_per_s: u64,
    /// When it was last used, for eviction.
    pub(super) used_ms: u64,
    /// Units handed on since the lease was granted, and when it was (see
    /// [`super::book::LeaseBook::hand_on`]): holders that lease come in lumps, so their demand is
    /// measured over the lease, not over the last second.
    pub(super) handed: u64,
    pub(super) granted_at_ms: u64,
}

/// A replaced lease's units, spent before the new lease's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Drain {
    pub(super) id: u64,
    pub(super) units: u64,
    pub(super) ends_ms: u64,
}

impl Drain {
    /// Whether it can give `units` at `now_ms`.
    pub(super) fn has(&self, units: u64, now_ms: u64) -> bool {
        now_ms < self.ends_ms && self.units >= units
    }
}

impl Held {
    pub(super) fn live(&self, now_ms: u64) -> bool {
        self.id.is_some() && now_ms < self.ends_ms
    }

    /// Whether a live lease, the replaced one first, has `units` at `now_ms`.
    pub(super) fn has(&self, units: u64, now_ms: u64) -> bool {
        self.drain.is_some_and(|d| d.has(units, now_ms)) || (self.live(now_ms) && self.units >= units)
    }

    /// Takes `units` at `now_ms` from the replaced lease if it has them, else from the
    /// lease; the lease they came from.
    pub(super) fn take(&mut self, units: u64, now_ms: u64) -> u64 {
        self.remaining = self.remaining.saturating_sub(units);
        match &mut self.drain {
            Some(d) if d.has(units, now_ms) => {
                d.units -= units;
                d.id
            }
            _ => {
                self.units -= units;
                self.id.unwrap_or_default()
            }
        }
    }

    pub(super) fn spent(&self, now_ms: u64) -> bool {
        now_ms < self.spent_until_ms
    }

    /// What the quota holds after a spend at `now_ms`, as this holder sees it.
    pub(super) fn left(&self, now_ms: u64) -> Left {
        Left {
            remaining: self.remaining,
            limit: self.limit,
            reset_after_ms: self.reset_at_ms.saturating_sub(now_ms),
            window_ms: self.window_ms,
            lease: self.id.unwrap_or_default(),
        }
    }

    /// The spending rate at `now_ms` (units a second): the last whole second's count, or
    /// this one's when it is already higher; 0 once a whole second passed without a spend,
    /// so a quota nobody uses stops asking for leases.
    pub(super) fn rate_at(&self, now_ms: u64) -> u64 {
        let second = now_ms / 1_000;
        if second == self.second {
            self.rate_per_s.max(self.spent_this_s)
        } else if second == self.second + 1 {
            self.spent_this_s
        } else {
            0
        }
    }

    /// The rate at `now_ms` (units a second) of the units handed on since the lease was
    /// granted, over at least a second.
    pub(super) fn handed_rate_at(&self, now_ms: u64) -> u64 {
        let over_ms = now_ms.saturating_sub(self.granted_at_ms).max(1_000);
        self.handed.saturating_mul(1_000) / over_ms
    }

    pub(super) fn count(&mut self, now_ms: u64, units: u64) {
        let second = now_ms / 1_000;
        if second != self.second {
            self.rate_per_s = if second == self.second + 1 {
                self.spent_this_s
            } else {
                0
            };
            (self.second, self.spent_this_s) = (second, 0);
        }
        self.spent_this_s += units;
    }

    /// Spends `units` at `now_ms` from a live lease that has them, the replaced one first;
    /// or says why not (see [`Take`]). A spend, or a miss, counts as demand, so the next ask
    /// fits it.
    pub fn spend(&mut self, units: u64, now_ms: u64, ledger: &mut Ledger) -> Take {
        self.used_ms = now_ms;
        if self.has(units, now_ms) {
            let lease = self.take(units, now_ms);
            self.count(now_ms, units);
            ledger.tally.units_spent += units;
            return Take::Spent(Left {
                lease,
                ..self.left(now_ms)
            });
        }
        if self.spent(now_ms) {
            return Take::Exhausted {
                left: Left {
                    remaining: 0,
                    ..self.left(now_ms)
                },
                retry_after_ms: self.spent_until_ms - now_ms,
            };
        }
        self.count(now_ms, units);
        Take::Missing
    }

    /// Puts `units` back into the lease `lease` they were taken from, if it still runs
    /// (see [`super::book::LeaseBook::put_back`]); when it was replaced, they go back to the
    /// store with the next call. Whether they went back into the lease.
    pub fn put_back(&mut self, quota: &QuotaKey, lease: u64, units: u64, now_ms: u64, ledger: &mut Ledger) -> bool {
        ledger.tally.units_spent -= units.min(ledger.tally.units_spent);
        if self.id == Some(lease) && self.live(now_ms) {
            self.units += units;
        } else if let Some(d) = self.drain.as_mut().filter(|d| d.id == lease && now_ms < d.ends_ms) {
            d.units += units;
        } else {
            if self.id != Some(lease) {
                end_units(ledger, quota, (lease, units), true);
            }
            return false; // an ended lease: the store takes nothing back any more
        }
        self.remaining = self.remaining.saturating_add(units);
        true
    }

    /// An exact check refused the quota at `now_ms` (see [`super::book::LeaseBook::refused`]).
    pub fn refused(&mut self, config: &BookConfig, retry_after_ms: u64, reset_after_ms: u64, now_ms: u64) {
        if config.remember_spent {
            let until = now_ms.saturating_add(spent_for(retry_after_ms, reset_after_ms, self.last_ttl_ms));
            self.spent_until_ms = self.spent_until_ms.max(until);
        }
    }

    /// Whether a grant was asked for at `now_ms` and may still be answered.
    pub(super) fn asking(&self, now_ms: u64) -> bool {
        self.asked && now_ms < self.asked_ms.saturating_add(ASK_LOST_MS)
    }

    /// The quota's part of [`super::book::LeaseBook::due`] at `now_ms`: ends what ends (its
    /// units into `ledger`'s returns) and, when `room` and the quota needs one, marks a
    /// grant as asked and gives it.
    pub fn due(
        &mut self,
        quota: &QuotaKey,
        config: &BookConfig,
        room: bool,
        now_ms: u64,
        ledger: &mut Ledger,
    ) -> Option<LeaseAsk> {
        let c = config;
        if self
            .drain
            .is_some_and(|d| now_ms + c.return_margin_ms >= d.ends_ms || d.units == 0)
        {
            end_drain(ledger, quota, self.drain.take(), now_ms);
        }
        let held = self.live(now_ms) && self.granted_units > 0;
        let ending = self.live(now_ms) && now_ms + c.return_margin_ms >= self.ends_ms;
        if ending || (self.id.is_some() && !self.live(now_ms)) {
            end_lease(ledger, quota, self, now_ms);
            (self.id, self.units) = (None, 0);
        }
        if !self.needs_grant(c, now_ms) || self.asking(now_ms) || !room {
            return None;
        }
        (self.asked, self.asked_ms, self.renewing) = (true, now_ms, held);
        let horizon_ms = c.horizon_ms.max(self.last_ttl_ms);
        let want = lease_size(self.demand_at(now_ms), Micros::from_ms(horizon_ms), u64::MAX).max(c.min_lease_units);
        Some(LeaseAsk {
            rule: quota.0.clone(),
            identity: quota.1.clone(),
            want: want.min(MAX_WANT),
        })
    }

    /// The answer `g` to `ask`, asked at `asked_at_ms` (see [`super::book::LeaseBook::granted`]).
    pub fn granted(
        &mut self,
        ask: &LeaseAsk,
        g: &LeaseGranted,
        config: &BookConfig,
        (asked_at_ms, now_ms): (u64, u64),
        ledger: &mut Ledger,
    ) {
        let quota = (ask.rule.clone(), ask.identity.clone());
        self.asked = false;
        self.spent_until_ms = spent_until(config, ask, g, asked_at_ms);
        if g.units == 0 && self.live(now_ms) && self.units > 0 {
            // A renewal that brought nothing: the lease in hand is kept, and spent first.
            self.renewing = false;
            return;
        }
        end_drain(ledger, &quota, self.drain.take(), now_ms);
        match self.id {
            // A renewal: the replaced lease's units are spent first, until it ends.
            Some(id) if g.units > 0 && self.live(now_ms) && self.units > 0 => {
                self.drain = Some(Drain {
                    id,
                    units: self.units,
                    ends_ms: self.ends_ms,
                });
            }
            _ => end_lease(ledger, &quota, self, now_ms),
        }
        if g.units > 0 && std::mem::take(&mut self.renewing) {
            ledger.tally.renewed += 1;
        }
        self.id = Some(g.lease);
        (self.units, self.granted_units) = (g.units, g.units);
        self.remaining = g.remaining.saturating_add(g.units);
        (self.limit, self.window_ms) = (g.limit, g.window_ms);
        self.reset_at_ms = now_ms.saturating_add(g.reset_after_ms);
        self.ends_ms = asked_at_ms.saturating_add(g.expires_in_ms);
        self.last_ttl_ms = g.expires_in_ms;
        (self.handed, self.granted_at_ms) = (0, now_ms);
    }

    /// The grant asked for got no answer: it may be asked again.
    pub fn failed(&mut self) {
        self.asked = false;
    }

    /// Ends the quota's leases at `now_ms`, the replaced one too: what they did not spend
    /// goes into `ledger`'s returns (see [`super::book::LeaseBook::forget_all`]).
    pub fn end(&self, quota: &QuotaKey, now_ms: u64, ledger: &mut Ledger) {
        end_drain(ledger, quota, self.drain, now_ms);
        end_lease(ledger, quota, self, now_ms);
    }

    /// Whether another quota may take this one's place at `now_ms` (in a fixed table of
    /// them): see [`Held::vacant_from_ms`].
    pub fn vacant(&self, now_ms: u64) -> bool {
        now_ms >= self.vacant_from_ms()
    }
}

/// What [`Held::spend`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// The units were spent; what the quota holds now.
    Spent(Left),
    /// No live lease has the units: nothing was spent; decide exactly.
    Missing,
    /// The quota is spent for `retry_after_ms` more: refuse without a call.
    Exhausted {
        /// What it holds, for the refusal's headers.
        left: Left,
        /// Milliseconds until it may grant again.
        retry_after_ms: u64,
    },
}

/// What ending and renewing leases leave to do and to count: the units to give back with the
/// next call, and the [`Tally`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Units to give back with the next call.
    pub returns: Vec<LeaseReturn>,
    /// What befell the leases.
    pub tally: Tally,
}

impl Ledger {
    /// Adds `other`'s returns and tally to these.
    pub fn merge(&mut self, other: Ledger) {
        self.returns.extend(other.returns);
        let (t, o) = (&mut self.tally, other.tally);
        t.renewed += o.renewed;
        t.expired += o.expired;
        t.units_expired += o.units_expired;
        t.units_spent += o.units_spent;
    }
}

/// What a quota holds after a spend, as this proxy sees it (for the response headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// What the quota had left when the lease was granted, with the lease's units, less
    /// what this proxy spent since: other proxies' spending shows at the next grant.
    pub remaining: u64,
    /// The rule's limit per window.
    pub limit: u64,
    /// Milliseconds from the spend until the quota is whole again (as the grant said it).
    pub reset_after_ms: u64,
    /// The rule's window in milliseconds.
    pub window_ms: u64,
    /// The lease the units came from.
    pub lease: u64,
}

/// What befell the book's leases since [`super::book::LeaseBook::take_tally`] was last called, for
/// metrics. A lease granted with units ends one of three ways: spent out, given back (in
/// [`super::book::LeaseBook::due`]'s returns; whether they reached the service is the caller's to
/// know), or expired — its end came with units neither spent nor given back, which come
/// back to the quota only as it refills or its window turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Leases granted with units while the quota held a live lease that had come with
    /// units (the grant was asked for before that lease ended or was given back).
    pub renewed: u64,
    /// Leases found ended with units left.
    pub expired: u64,
    /// The units those leases had left.
    pub units_expired: u64,
    /// Units spent: one per quota of each request decided by leases.
    pub units_spent: u64,
}

/// Until when a quota granted `g` for `ask` (asked at `asked_at_ms`) is spent: 0 when the
/// grant brought all that was asked. A grant takes all the quota holds up to the ask, so a
/// short one leaves it empty: then no grant is asked for, and once the units in hand are
/// spent requests are refused without a call, for [`spent_for`]. Counted from when the
/// call went out, the earliest moment the service's answer could count from.
fn spent_until(config: &BookConfig, ask: &LeaseAsk, g: &LeaseGranted, asked_at_ms: u64) -> u64 {
    if !config.remember_spent || g.units >= ask.want {
        return 0;
    }
    asked_at_ms.saturating_add(spent_for(g.retry_after_ms, g.reset_after_ms, g.expires_in_ms))
}

/// How long an empty quota stays spent: until the service may grant one unit again
/// (`retry_after_ms`), and no sooner than it is whole again (`reset_after_ms`) or a lease's
/// length (`lease_ms`) has passed, whichever comes first. Asking for every unit as it comes
/// back would cost a call a unit (a token bucket refills one at a time); what comes back
/// meanwhile waits for the next grant, which takes up to all the quota holds, so the rate
/// the quota admits is kept.
fn spent_for(retry_after_ms: u64, reset_after_ms: u64, lease_ms: u64) -> u64 {
    retry_after_ms.max(reset_after_ms.min(lease_ms))
}

/// Ends `h`'s lease: what it did not spend goes back with the next call if it is still
/// live, and is tallied as expired if it is not.
fn end_lease(ledger: &mut Ledger, quota: &QuotaKey, h: &Held, now_ms: u64) {
    if let Some(id) = h.id {
        end_units(ledger, quota, (id, h.units), h.live(now_ms));
    }
}

/// Ends `drain`, a lease a renewal replaced, as [`end_lease`] ends a lease.
fn end_drain(ledger: &mut Ledger, quota: &QuotaKey, drain: Option<Drain>, now_ms: u64) {
    if let Some(d) = drain {
        end_units(ledger, quota, (d.id, d.units), now_ms < d.ends_ms);
    }
}

/// Lease `id`'s `units` left at its end: given back with the next call when it still runs
/// (`live`), tallied as expired when not.
fn end_units(ledger: &mut Ledger, (rule, identity): &QuotaKey, (id, units): (u64, u64), live: bool) {
    if units == 0 {
        return;
    }
    if live {
        ledger.returns.push(LeaseReturn {
            rule: rule.clone(),
            identity: identity.clone(),
            lease: id,
            unspent: units,
        });
    } else {
        ledger.tally.expired += 1;
        ledger.tally.units_expired += units;
    }
}

/// The first byte of [`Held::encode`]'s bytes: a layout changed later reads as vacant.
const ENCODING: u8 = 1;

impl Held {
    /// The quota and its state as bytes, for a store shared by several holders (a
    /// process's workers): a version, flags, twenty numbers little-endian, then the rule's
    /// and the identity's lengths and bytes.
    pub fn encode(&self, (rule, identity): &QuotaKey) -> Vec<u8> {
        let flags = u8::from(self.id.is_some())
            | u8::from(self.drain.is_some()) << 1
            | u8::from(self.asked) << 2
            | u8::from(self.renewing) << 3;
        let d = self.drain.unwrap_or(Drain {
            id: 0,
            units: 0,
            ends_ms: 0,
        });
        let numbers = [
            self.id.unwrap_or_default(),
            self.units,
            self.ends_ms,
            d.id,
            d.units,
            d.ends_ms,
            self.remaining,
            self.limit,
            self.window_ms,
            self.reset_at_ms,
            self.last_ttl_ms,
            self.granted_units,
            self.spent_until_ms,
            self.asked_ms,
            self.spent_this_s,
            self.second,
            self.rate_per_s,
            self.used_ms,
            self.handed,
            self.granted_at_ms,
        ];
        let mut out = Vec::with_capacity(2 + 8 * numbers.len() + 8 + rule.len() + identity.len());
        out.extend_from_slice(&[ENCODING, flags]);
        for n in numbers {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for text in [rule, identity] {
            out.extend_from_slice(&u32::try_from(text.len()).unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        out
    }

    /// What [`Held::encode`] wrote; `None` for anything else (an empty or foreign value).
    pub fn decode(bytes: &[u8]) -> Option<(QuotaKey, Held)> {
        let ((rule, identity), held) = Held::decode_borrowed(bytes)?;
        Some(((rule.to_owned(), identity.to_owned()), held))
    }

    /// [`Held::decode`] with the quota's rule and identity borrowed from `bytes`: nothing
    /// allocated (a request's spend reads its slot this way).
    pub fn decode_borrowed(bytes: &[u8]) -> Option<((&str, &str), Held)> {
        let mut r = Reader(bytes);
        let [version, flags] = r.take(2)? else { return None };
        if *version != ENCODING {
            return None;
        }
        let mut n = [0u64; 20];
        for x in &mut n {
            *x = u64::from_le_bytes(r.take(8)?.try_into().ok()?);
        }
        let rule = r.text()?;
        let identity = r.text()?;
        if !r.0.is_empty() {
            return None;
        }
        Some(((rule, identity), Held::from_parts(n, *flags)))
    }

    /// The state [`Held::encode`] wrote as `n` (its twenty numbers, in order) and `flags`.
    fn from_parts(n: [u64; 20], flags: u8) -> Held {
        let bit = |i: u8| flags & (1 << i) != 0;
        Held {
            id: bit(0).then_some(n[0]),
            units: n[1],
            ends_ms: n[2],
            drain: bit(1).then_some(Drain {
                id: n[3],
                units: n[4],
                ends_ms: n[5],
            }),
            remaining: n[6],
            limit: n[7],
            window_ms: n[8],
            reset_at_ms: n[9],
            last_ttl_ms: n[10],
            granted_units: n[11],
            spent_until_ms: n[12],
            asked: bit(2),
            asked_ms: n[13],
            renewing: bit(3),
            spent_this_s: n[14],
            second: n[15],
            rate_per_s: n[16],
            used_ms: n[17],
            handed: n[18],
            granted_at_ms: n[19],
        }
    }
}

/// Bytes read from the front.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    /// A length (4 bytes little-endian) and that many bytes of UTF-8.
    fn text(&mut self) -> Option<&'a str> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?);
        let bytes = self.take(usize::try_from(len).ok()?)?;
        std::str::from_utf8(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn grant(lease: u64, units: u64) -> LeaseGranted {
        LeaseGranted {
            lease,
            units,
            expires_in_ms: 1_000,
            limit: 100,
            remaining: 50,
            reset_after_ms: 1_000,
            window_ms: 1_000,
            retry_after_ms: 0,
        }
    }

    fn ask(want: u64) -> LeaseAsk {
        LeaseAsk {
            rule: "r".into(),
            identity: "i".into(),
            want,
        }
    }

    proptest! {
        #[test]
        fn what_is_encoded_decodes_to_itself(
            n in prop::array::uniform20(any::<u64>()),
            flags in 0u8..16,
            rule in "(?s).{0,20}",
            identity in "(?s).{0,40}",
        ) {
            let held = Held::from_parts(n, flags);
            let quota = (rule, identity);
            let bytes = held.encode(&quota);
            prop_assert_eq!(Held::decode(&bytes), Some((quota, held)));
            // Cut short, or with a byte more, it is nothing.
            prop_assert_eq!(Held::decode(&bytes[..bytes.len() - 1]), None);
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert_eq!(Held::decode(&longer), None);
        }
    }

    #[test]
    fn an_empty_or_foreign_value_is_no_quota() {
        assert_eq!(Held::decode(&[]), None);
        let mut bytes = Held::default().encode(&("r".into(), "i".into()));
        bytes[0] = ENCODING + 1;
        assert_eq!(Held::decode(&bytes), None);
    }

    #[test]
    fn a_quota_is_vacant_only_without_a_lease_an_ask_or_a_use_in_the_last_second() {
        let config = BookConfig::default();
        let quota = ("r".to_owned(), "i".to_owned());
        let mut ledger = Ledger::default();
        let mut h = Held::default();
        assert!(h.vacant(1_000));
        assert_eq!(h.spend(1, 1_000, &mut ledger), Take::Missing);
        assert!(!h.vacant(1_500), "used within the last second");
        let Some(asked) = h.due(&quota, &config, true, 1_500, &mut ledger) else {
            panic!("a quota in use asks for a lease");
        };
        assert!(!h.vacant(2_500), "a grant is asked for");
        assert!(h.vacant(1_500 + ASK_LOST_MS), "an ask never answered is lost");
        h.granted(&asked, &grant(7, asked.want), &config, (1_500, 1_510), &mut ledger);
        assert!(!h.vacant(2_499), "a live lease");
        assert!(h.vacant(2_500), "its lease ended");
    }

    #[test]
    fn units_put_back_go_only_into_the_lease_they_came_from() {
        let config = BookConfig::default();
        let quota = ("r".to_owned(), "i".to_owned());
        let mut ledger = Ledger::default();
        let mut h = Held::default();
        h.granted(&ask(4), &grant(1, 4), &config, (0, 0), &mut ledger);
        let Take::Spent(left) = h.spend(1, 10, &mut ledger) else {
            panic!("a live lease with units spends");
        };
        assert_eq!((left.lease, h.units), (1, 3));
        // Renewed meanwhile: the old lease drains, and takes the unit back while it runs.
        h.granted(&ask(4), &grant(2, 4), &config, (20, 20), &mut ledger);
        assert!(h.put_back(&quota, 1, 1, 30, &mut ledger));
        assert_eq!(h.drain.map(|d| d.units), Some(4));
        // A lease it no longer holds: the unit goes back to the store, not into this lease.
        assert!(!h.put_back(&quota, 9, 1, 30, &mut ledger));
        assert_eq!(h.units, 4);
        assert_eq!(ledger.returns.last().map(|r| (r.lease, r.unspent)), Some((9, 1)));
    }
}
