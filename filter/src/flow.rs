//! One request's way through the filter: identities, local bucket, leases, check call,
//! answer. Each step is handed the VM's [`Shared`] state (borrowed once per callback by
//! [`crate::stream::Stream`]) and the [`Proxy`], so it runs natively in unit tests.

use std::collections::BTreeMap;

use sluice_core::headers::{
    denial_body, expose_headers, format_headers, write_headers, HeaderBuf, Quota, EXPOSE_HEADERS,
};
use sluice_core::identity::{bounded, ip_key};
use sluice_core::lease::book::QuotaKey;
use sluice_core::rules::host::is_host;
use sluice_core::rules::FailureMode;
use sluice_core::wire::{check_method, CheckRequest, MAX_HOLD_MS};
use sluice_core::{Decision, Micros};

use crate::answer::{read_answer, Failure};
use crate::breaker::Permit;
use crate::buckets;
use crate::debits;
use crate::identity::{check_path, header_text, request_ip, warn_of_trust_in_envoy};
use crate::leases::ByLease;
use crate::proxy::{Action, LogLevel, Proxy};
use crate::shared::Shared;

#[cfg(test)]
mod tests;

/// The check asks for the brief answer (RFC 7240; the service leaves out each rule's own
/// result, which the filter does not read: most of what it parsed).
const BRIEF: [(&str, &str); 1] = [("prefer", "return=minimal")];

const UNAVAILABLE: &str =
    r#"{"status":"error","code":503,"message":"Rate limit service unavailable. Please retry later."}"#;

/// One request's state between its callbacks.
#[derive(Default)]
pub struct Flow {
    identities: BTreeMap<String, String>,
    /// The key of the local and fallback buckets.
    bucket_key: Option<String>,
    /// The leased quotas of a request sent to the exact check, to remember one it refuses.
    leased: Vec<QuotaKey>,
    /// When the check call went out.
    called_at: Micros,
    /// The check's body, kept for its one retry; whether it was retried.
    check_body: Vec<u8>,
    retried: bool,
    /// The call out is the half-open breaker's probe.
    probe: bool,
    /// The call went out on a breaker with no failure counted: its success is not reported
    /// ([`crate::breaker::Permit::Clean`]).
    clean: bool,
    /// The call out is the wait call holding a shaped request.
    holding: bool,
    /// Headers to add to the upstream's response (one buffer, no allocation a header).
    response_headers: HeaderBuf,
    /// The request as a debit would name it, while a cost learnt after the response may come.
    debit: Option<CheckRequest>,
    /// The checked request, kept while its answer may name concurrency slots to give back.
    checked: Option<CheckRequest>,
    /// Its slots' record ([`crate::in_flight`]), marked ended with the stream.
    holding_slots: Option<u64>,
    /// Its slot of the filter's own limit on requests in flight ([`crate::local_in_flight`]),
    /// given back with the stream.
    in_flight: Option<u64>,
    /// The request is a CORS one whose response names the filter's headers to its page
    /// ([`is_cors`]); read with the request's headers, the only time Envoy lends them.
    cors: bool,
}

impl Flow {
    /// The request's headers: decided here (a local bucket, a lease, the breaker), or paused
    /// for the check call's answer.
    pub fn on_request_headers(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) -> Action {
        if !std::mem::replace(&mut s.host_looked_at, true) {
            if let Some(ip) = &s.config.identities.ip {
                warn_of_trust_in_envoy(p, ip);
            }
        }
        self.read_identities(s, p);
        self.cors = s.config.cors_expose && is_cors(p);
        if let Some(action) = self.by_local_bucket(s, p, now) {
            return action;
        }
        if let Some(action) = self.by_in_flight(s, p, now) {
            return action;
        }
        // The method, path and host cost three host calls a request (each a value the host
        // copies into the module). A request decided by leases whose rules look at none of
        // them is matched without: they are read only if it goes on to the check.
        let skip_target = s.debits.is_none() && s.leasing.as_ref().is_some_and(|l| l.ignores_target());
        let identities = std::mem::take(&mut self.identities);
        let request = if skip_target {
            CheckRequest {
                identities,
                method: "GET".into(),
                path: "/".into(),
                cost: 1,
                host: None,
            }
        } else {
            request_of(p, identities)
        };
        if s.debits.is_some() {
            self.debit = Some(CheckRequest {
                cost: 0,
                ..request.clone()
            });
        }
        if let Some(action) = self.by_lease(s, p, &request, now) {
            return action;
        }
        let request = if skip_target {
            request_of(p, request.identities)
        } else {
            request
        };
        self.check(s, p, &request, now)
    }

    /// The answer to this stream's call; whether the request goes on now.
    pub fn on_call_response(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) -> bool {
        std::mem::take(&mut self.holding) || self.on_check_answer(s, p, now)
    }

    /// The upstream's response headers: the quota's headers added, a debit queued.
    pub fn on_response_headers(&mut self, s: &mut Shared, p: &mut impl Proxy) -> Action {
        if !self.response_headers.is_empty() && self.cors {
            let names = self.response_headers.iter().map(|(name, _)| name);
            if let Some(value) = expose_headers(p.response_header(EXPOSE_HEADERS).as_deref(), names) {
                p.set_response_header(EXPOSE_HEADERS, &value);
            }
        }
        for (name, value) in self.response_headers.iter() {
            p.add_response_header(name, value);
        }
        self.response_headers.clear();
        self.queue_debit(s, p);
        Action::Continue
    }

    /// Whether the stream's end has anything to do ([`Flow::on_log`]): when not, its
    /// callback spares the clock's read.
    pub fn holds_anything(&self) -> bool {
        self.probe || self.holding_slots.is_some() || self.in_flight.is_some()
    }

    /// The stream ended: a probe that never got its answer frees the breaker, and the
    /// request's concurrency slots go back.
    pub fn on_log(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) {
        if self.probe {
            s.breaker.release_probe(p, now);
        }
        if let (Some(id), Some(in_flight)) = (self.holding_slots.take(), s.in_flight.as_mut()) {
            in_flight.end(id);
        }
        if let (Some(hold), Some(local)) = (self.in_flight.take(), s.local_in_flight.as_mut()) {
            if local.end(p, hold, now) {
                p.count(s.metrics.in_flight_ended, 1);
            }
            p.count(s.metrics.in_flight_expired, local.take_expired());
        }
    }

    fn read_identities(&mut self, s: &Shared, p: &impl Proxy) {
        let ids = &s.config.identities;
        if let Some(source) = &ids.ip {
            if let Some(ip) = request_ip(p, source) {
                self.identities.insert("ip".into(), ip_key(ip, source.ipv6_prefix));
            }
        }
        for (name, src) in [("user", &ids.user), ("api_key", &ids.api_key), ("tier", &ids.tier)] {
            let value = src.as_ref().and_then(|src| match (&src.header, &src.property) {
                (Some(header), _) => p.request_header(header),
                (None, Some(path)) => p.property(&path.iter().map(String::as_str).collect::<Vec<_>>()),
                (None, None) => None,
            });
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                self.identities.insert(name.into(), bounded(&v).into_owned());
            }
        }
        let by = s.config.local.as_ref().map_or("ip", |l| l.by.as_str());
        self.bucket_key = self.identities.get(by).or_else(|| self.identities.get("ip")).cloned();
    }

    /// The local prefilter: a client over its local rate is answered here, at once.
    fn by_local_bucket(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) -> Option<Action> {
        let (Some(bucket), Some(key)) = (&mut s.local, &self.bucket_key) else {
            return None;
        };
        let d = bucket.take(p, key, now);
        if d.allowed {
            return None;
        }
        p.count(s.metrics.denied_local, 1);
        deny_by_bucket(s, p, &d, ("local", self.cors), now);
        Some(Action::Pause)
    }

    /// The filter's own limit on the client's requests in flight: the request takes a slot it
    /// gives back when its stream ends, or is answered 429 here, at once.
    fn by_in_flight(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) -> Option<Action> {
        let local = s.local_in_flight.as_mut()?;
        let client = self.identities.get(&local.by).or_else(|| self.identities.get("ip"))?;
        let taken = local.take(p, client, now);
        let metrics = s.metrics;
        p.count(metrics.in_flight_expired, local.take_expired());
        if taken.decision.allowed {
            p.count(metrics.in_flight_taken, 1);
            if taken.hold.is_none() {
                p.count(metrics.slots_lost, 1);
            }
            self.in_flight = taken.hold;
            return None;
        }
        p.count(metrics.denied_in_flight, 1);
        // A limit on requests at once has no window: its headers say none.
        let quota = Quota::from_decision("in_flight", &taken.decision, 0, now.instant_ms());
        deny(s, p, &quota, self.cors);
        Some(Action::Pause)
    }

    /// Sends the exact check, or applies the failure policy when it cannot go out.
    fn check(&mut self, s: &mut Shared, p: &mut impl Proxy, request: &CheckRequest, now: Micros) -> Action {
        let permit = s.breaker.allow(p, now);
        if permit == Permit::Skip {
            return self.fail_headers(s, p, now, "circuit breaker open");
        }
        self.probe = permit == Permit::Probe;
        self.clean = permit == Permit::Clean;
        let body = request.to_json().into_bytes();
        let check = &s.config.check;
        match p.call(
            check,
            ("POST", &check.path),
            Some(&body),
            &BRIEF,
            u64::from(check.timeout_ms),
        ) {
            Ok(_) => {
                self.called_at = now;
                self.check_body = body;
                if s.in_flight.is_some() {
                    self.checked = Some(request.clone());
                }
                p.count(s.metrics.checked, 1);
                Action::Pause
            }
            Err(why) => {
                self.probe = false;
                s.breaker.failure(p, now);
                self.fail_headers(s, p, now, &why)
            }
        }
    }

    /// The check service failed (or the breaker is open): apply the failure policy.
    /// Returns whether the stream may go on.
    fn fail(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros, why: &str) -> bool {
        let mode = s.config.failure.mode;
        p.log(
            LogLevel::Debug,
            &format!("sluice-filter: check failed ({why}); failing {mode:?}"),
        );
        if mode == FailureMode::Closed {
            p.count(s.metrics.failed_closed, 1);
            let mut headers = vec![("content-type", "application/json"), ("retry-after", "1")];
            if self.cors {
                headers.push((EXPOSE_HEADERS, "Retry-After"));
            }
            p.respond(503, &headers, UNAVAILABLE.as_bytes());
            return false;
        }
        let key = self.bucket_key.as_deref().unwrap_or("-");
        let d = s.fallback.take(p, key, now);
        p.count(s.metrics.failed_open, 1);
        if d.allowed {
            return true;
        }
        deny_by_bucket(s, p, &d, ("fallback", self.cors), now);
        false
    }

    /// [`Flow::fail`] while the request's headers are being handled: the request goes
    /// on, or stays paused with its answer sent.
    fn fail_headers(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros, why: &str) -> Action {
        if self.fail(s, p, now, why) {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_check_answer(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) -> bool {
        self.probe = false;
        let clean = std::mem::take(&mut self.clean);
        let answer = match read_answer(p) {
            Ok(a) => {
                if !clean {
                    s.breaker.success(p, now);
                }
                a
            }
            Err(Failure::NoAnswer(why)) => {
                s.breaker.failure(p, now);
                if self.retry(s, p, now) {
                    return false; // still paused: the retry's answer decides
                }
                return self.fail(s, p, now, &why);
            }
            Err(Failure::Service(why)) => {
                s.breaker.failure(p, now);
                return self.fail(s, p, now, &why);
            }
            Err(Failure::Request(why)) => {
                s.breaker.release_probe(p, now);
                return self.fail(s, p, now, &why);
            }
        };
        let metrics = s.metrics;
        p.record(
            metrics.check_latency_ms,
            now.saturating_sub(self.called_at).instant_ms(),
        );
        let quota = answer.quota(now.instant_ms());
        if !answer.allowed {
            p.count(metrics.denied_global, 1);
            if let (Some(rule), Some(leasing)) = (&answer.policy, s.leasing.as_mut()) {
                leasing.refused(p, &self.leased, rule, &answer, now.instant_ms());
            }
            deny(s, p, &quota, self.cors);
            return false;
        }
        if answer.policy.is_some() {
            write_headers(&quota, s.config.headers, &mut self.response_headers);
        }
        p.count(metrics.allowed, 1);
        if !answer.slots.is_empty() {
            self.hold_slots(s, p, answer.slots, now);
        }
        if answer.delay_ms > 0 {
            p.count(metrics.delayed, 1);
            return !self.hold(s, p, answer.delay_ms);
        }
        true
    }

    /// Records the concurrency slots the check took, to give them back when the stream ends.
    fn hold_slots(&mut self, s: &mut Shared, p: &mut impl Proxy, slots: Vec<sluice_core::wire::Slot>, now: Micros) {
        let held = match (s.in_flight.as_mut(), self.checked.take()) {
            (Some(in_flight), Some(request)) => in_flight.hold(request, slots, now.instant_ms()),
            _ => None,
        };
        self.holding_slots = held;
        p.count(s.metrics.slots_taken, 1);
        if held.is_some() {
            return;
        }
        p.count(s.metrics.slots_lost, 1);
        if s.in_flight.is_none() && !std::mem::replace(&mut s.said_no_concurrency, true) {
            p.log(
                LogLevel::Warn,
                "sluice-filter: a concurrency rule gave this request a slot, but the configuration has no \
                 \"concurrency\" block: the filter cannot give it back when the request ends, so it frees only \
                 when it expires (the rule's window). Add \"concurrency\": {} to the filter's configuration; said once",
            );
        }
    }

    /// Sends the check once more after a failure that came at once — a refused or reset
    /// connection (a node that went away, a pooled connection it closed), not a stall: the
    /// host picks the cluster's next endpoint. Once per request, only within the first half
    /// of the timeout (with the rest as the retry's own), never as the breaker's probe or
    /// once it opened. Whether the retry went out.
    fn retry(&mut self, s: &mut Shared, p: &mut impl Proxy, now: Micros) -> bool {
        let check = &s.config.check;
        let timeout_ms = u64::from(check.timeout_ms);
        let elapsed_ms = now.saturating_sub(self.called_at).instant_ms();
        if self.retried || self.probe || elapsed_ms * 2 >= timeout_ms || s.breaker.allow(p, now) == Permit::Skip {
            return false;
        }
        self.retried = true;
        let body = std::mem::take(&mut self.check_body);
        let sent = p
            .call(
                check,
                ("POST", &check.path),
                Some(&body),
                &BRIEF,
                timeout_ms - elapsed_ms,
            )
            .is_ok();
        if sent {
            p.count(s.metrics.check_retries, 1);
        }
        sent
    }

    /// The request decided by leases, if it can be (see [`crate::leases`]): it goes on with
    /// the headers of its most restrictive quota, or is refused because a quota is spent.
    /// `None`: check it exactly.
    fn by_lease(&mut self, s: &mut Shared, p: &mut impl Proxy, r: &CheckRequest, now: Micros) -> Option<Action> {
        let leasing = s.leasing.as_mut()?;
        let decided = leasing.decide(
            p,
            &r.identities,
            &r.method,
            r.host.as_deref(),
            &r.path,
            now.instant_ms(),
        );
        let metrics = s.metrics;
        match decided {
            ByLease::Allowed(quotas) => {
                if let Some(((rule, _), left)) = quotas.iter().min_by_key(|(_, l)| l.remaining) {
                    let quota = Quota::from_lease(rule, left, now.instant_ms());
                    write_headers(&quota, s.config.headers, &mut self.response_headers);
                }
                // A debit spends from the request's leased quotas too; without debits they
                // are not needed again.
                if s.debits.is_some() {
                    self.leased = quotas.into_iter().map(|(quota, _)| quota).collect();
                }
                p.count(metrics.allowed, 1);
                p.count(metrics.leased, 1);
                Some(Action::Continue)
            }
            ByLease::Refused {
                rule,
                left,
                retry_after_ms,
            } => {
                p.count(metrics.denied_spent, 1);
                let quota = Quota {
                    retry_after_ms: Some(retry_after_ms),
                    ..Quota::from_lease(&rule, &left, now.instant_ms())
                };
                deny(s, p, &quota, self.cors);
                Some(Action::Pause)
            }
            ByLease::Check(quotas) => {
                self.leased = quotas;
                None
            }
        }
    }

    /// Queues the cost the response's debit header names beyond the request's own (see
    /// [`crate::debits`]), if the request passed and the header is there.
    fn queue_debit(&mut self, s: &mut Shared, p: &mut impl Proxy) {
        let Some(mut request) = self.debit.take() else { return };
        let metrics = s.metrics;
        let Some(debits) = s.debits.as_mut() else { return };
        let Some(cost) = p
            .response_header(&debits.config.header)
            .and_then(|v| debits::extra_cost(&v))
        else {
            return;
        };
        request.cost = cost;
        if debits.queue(&request, std::mem::take(&mut self.leased)) {
            p.count(metrics.debits, 1);
            p.count(metrics.debit_units, cost);
        } else {
            p.count(metrics.debits_failed, 1);
        }
    }

    /// Holds the request `delay_ms` on the service's wait endpoint: the stream stays paused
    /// and the call's answer (or its failure, at the latest `delay_ms + timeout_ms` later)
    /// resumes it, so no host needs to resume a stream from a timer (ngx_wasm_module cannot).
    /// Returns whether the call went out; if not, the request goes on at once: the check
    /// already admitted it, shaping only spaces requests out.
    fn hold(&mut self, s: &Shared, p: &mut impl Proxy, delay_ms: u64) -> bool {
        let delay_ms = delay_ms.min(MAX_HOLD_MS);
        let check = &s.config.check;
        let path = format!("{}?ms={delay_ms}", check.wait_path);
        match p.call(check, ("GET", &path), None, &[], delay_ms + u64::from(check.timeout_ms)) {
            Ok(_) => {
                self.holding = true;
                true
            }
            Err(why) => {
                p.log(
                    LogLevel::Warn,
                    &format!("sluice-filter: cannot hold the request ({why})"),
                );
                false
            }
        }
    }
}

/// The request to check: its `identities`, and its method, path and host as the proxy has
/// them.
fn request_of(p: &impl Proxy, identities: BTreeMap<String, String>) -> CheckRequest {
    // Three of the four are there: one read of the whole map costs what one of them does.
    let headers = p.request_header_pairs();
    let header = |name| headers.get(name).map(|v| header_text(v).into_owned());
    let method = header(":method");
    let method = check_method(method.as_deref().unwrap_or("GET")).to_owned();
    let path = header(":path").map_or_else(|| "/".into(), |path| check_path(&path));
    // The client's `Host`: Nginx hands it over as it came (its `:authority` is the server's
    // own name and port, whatever the client asked for — seen in a real Nginx); Envoy turns
    // it into `:authority` and keeps no `host`. A host that is none (the proxy refuses most
    // such requests first) matches only rules naming no host, as at the service.
    let host = header("host").or_else(|| header(":authority")).filter(|h| is_host(h));
    CheckRequest {
        identities,
        method,
        path,
        cost: 1,
        host,
    }
}

/// Whether the request is a browser's from a page on another origin, whose page sees only
/// the response headers `Access-Control-Expose-Headers` names: it carries `Origin` (sent by
/// every CORS request; the filter cannot wait for `Access-Control-Allow-Origin`, which
/// Envoy's CORS filter, before it in the chain, adds after it). A same-origin request with
/// `Origin` (a POST) gets a header its browser ignores. One header read, with the request's:
/// Envoy answers no request header once the filter's request callback has returned (seen in
/// Envoy 1.40: read on the response, the page read no quota).
fn is_cors(p: &impl Proxy) -> bool {
    p.request_header("origin").is_some()
}

/// Answers 429 with headers describing `quota` (named in `Access-Control-Expose-Headers` for
/// a CORS request, unless the configuration says not to).
fn deny(s: &Shared, p: &mut impl Proxy, quota: &Quota<'_>, cors: bool) {
    let mut headers = Vec::with_capacity(8);
    format_headers(quota, s.config.headers, &mut headers);
    if cors {
        if let Some(names) = expose_headers(None, headers.iter().map(|(name, _)| *name)) {
            headers.push((EXPOSE_HEADERS, names));
        }
    }
    headers.push(("content-type", "application/json".into()));
    let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let body = denial_body(quota.retry_after_ms.unwrap_or(1_000));
    p.respond(429, &pairs, body.as_bytes());
}

/// Answers 429 for a local or fallback bucket's denial `d`.
fn deny_by_bucket(s: &Shared, p: &mut impl Proxy, d: &Decision, (policy, cors): (&'static str, bool), now: Micros) {
    let quota = Quota::from_decision(policy, d, buckets::WINDOW.instant_ms(), now.instant_ms());
    deny(s, p, &quota, cors);
}
