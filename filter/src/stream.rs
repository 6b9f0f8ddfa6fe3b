//! One HTTP stream: identities, local bucket, check call, answer.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use sluice_core::breaker::BreakerState;
use sluice_core::headers::{denial_body, format_headers, Quota};
use sluice_core::identity::{bounded, ip_key};
use sluice_core::lease::book::QuotaKey;
use sluice_core::rules::host::is_host;
use sluice_core::rules::FailureMode;
use sluice_core::time::instant_ms;
use sluice_core::wire::{check_method, CheckRequest, MAX_HOLD_MS};
use sluice_core::{Decision, Micros};

use crate::answer::{read_answer, Failure};
use crate::buckets;
use crate::clock::now_us;
use crate::debits;
use crate::host::{
    self, add_response_header, log, property, request_header, request_ip, respond, response_header, resume_request,
};
use crate::identity::check_path;
use crate::leases::ByLease;
use crate::metrics::Metrics;
use crate::shared::Shared;

const UNAVAILABLE: &str =
    r#"{"status":"error","code":503,"message":"Rate limit service unavailable. Please retry later."}"#;

/// The HTTP context of one stream.
pub struct Stream {
    shared: Rc<RefCell<Shared>>,
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
    /// The call out is the wait call holding a shaped request.
    holding: bool,
    /// Headers to add to the upstream's response.
    response_headers: Vec<(&'static str, String)>,
    /// The request as a debit would name it, while a cost learnt after the response may come.
    debit: Option<CheckRequest>,
}

impl Stream {
    pub fn new(shared: Rc<RefCell<Shared>>) -> Stream {
        Stream {
            shared,
            identities: BTreeMap::new(),
            bucket_key: None,
            leased: Vec::new(),
            called_at: 0,
            check_body: Vec::new(),
            retried: false,
            probe: false,
            holding: false,
            response_headers: Vec::new(),
            debit: None,
        }
    }

    fn read_identities(&mut self) {
        let shared = self.shared.clone();
        let s = shared.borrow();
        let ids = &s.config.identities;
        if let Some(source) = &ids.ip {
            if let Some(ip) = request_ip(source) {
                self.identities.insert("ip".into(), ip_key(ip, source.ipv6_prefix));
            }
        }
        for (name, src) in [("user", &ids.user), ("api_key", &ids.api_key), ("tier", &ids.tier)] {
            let value = src.as_ref().and_then(|src| match (&src.header, &src.property) {
                (Some(header), _) => request_header(header),
                (None, Some(path)) => property(path),
                (None, None) => None,
            });
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                self.identities.insert(name.into(), bounded(&v).into_owned());
            }
        }
        let by = s.config.local.as_ref().map_or("ip", |l| l.by.as_str());
        self.bucket_key = self.identities.get(by).or_else(|| self.identities.get("ip")).cloned();
    }

    /// Answers 429 with headers describing `quota`.
    fn deny(&self, quota: &Quota<'_>) {
        let mode = self.shared.borrow().config.headers;
        let mut headers = Vec::with_capacity(8);
        format_headers(quota, mode, &mut headers);
        headers.push(("content-type", "application/json".into()));
        let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = denial_body(quota.retry_after_ms.unwrap_or(1_000));
        respond(429, pairs, body.as_bytes());
    }

    /// Answers 429 for a local or fallback bucket's denial `d`.
    fn deny_by_bucket(&self, d: &Decision, policy: &'static str, now: Micros) {
        self.deny(&Quota::from_decision(
            policy,
            d,
            instant_ms(buckets::WINDOW),
            instant_ms(now),
        ));
    }

    /// The check service failed (or the breaker is open): apply the failure policy.
    /// Returns whether the stream may go on.
    fn fail(&mut self, now: Micros, why: &str) -> bool {
        let mut s = self.shared.borrow_mut();
        let metrics = s.metrics;
        log(
            LogLevel::Debug,
            &format!(
                "sluice-filter: check failed ({why}); failing {:?}",
                s.config.failure.mode
            ),
        );
        if s.config.failure.mode == FailureMode::Closed {
            drop(s);
            Metrics::bump(metrics.failed_closed);
            let headers = vec![("content-type", "application/json"), ("retry-after", "1")];
            respond(503, headers, UNAVAILABLE.as_bytes());
            return false;
        }
        let key = self.bucket_key.clone().unwrap_or_else(|| "-".into());
        let d = s.fallback.take(&key, now);
        drop(s);
        Metrics::bump(metrics.failed_open);
        if d.allowed {
            return true;
        }
        self.deny_by_bucket(&d, "fallback", now);
        false
    }

    /// [`Stream::fail`] while the request's headers are being handled: the request goes
    /// on, or stays paused with its answer sent.
    fn fail_headers(&mut self, now: Micros, why: &str) -> Action {
        if self.fail(now, why) {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_check_answer(&mut self, now: Micros) -> bool {
        let metrics = self.shared.borrow().metrics;
        self.probe = false;
        let answer = match read_answer() {
            Ok(a) => {
                self.shared.borrow_mut().breaker.success();
                a
            }
            Err(Failure::NoAnswer(why)) => {
                self.shared.borrow_mut().breaker.failure(now);
                if self.retry(now) {
                    return false; // still paused: the retry's answer decides
                }
                return self.fail(now, &why);
            }
            Err(Failure::Service(why)) => {
                self.shared.borrow_mut().breaker.failure(now);
                return self.fail(now, &why);
            }
            Err(Failure::Request(why)) => {
                self.shared.borrow_mut().breaker.release_probe(now);
                return self.fail(now, &why);
            }
        };
        Metrics::record(metrics.check_latency_ms, instant_ms(now.saturating_sub(self.called_at)));
        let quota = answer.quota(instant_ms(now));
        if !answer.allowed {
            Metrics::bump(metrics.denied_global);
            if let (Some(rule), Some(leasing)) = (&answer.policy, self.shared.borrow_mut().leasing.as_mut()) {
                leasing.refused(&self.leased, rule, &answer, instant_ms(now));
            }
            self.deny(&quota);
            return false;
        }
        if answer.policy.is_some() {
            let mode = self.shared.borrow().config.headers;
            format_headers(&quota, mode, &mut self.response_headers);
        }
        Metrics::bump(metrics.allowed);
        if answer.delay_ms > 0 {
            Metrics::bump(metrics.delayed);
            return !self.hold(answer.delay_ms);
        }
        true
    }

    /// Sends the check once more after a failure that came at once — a refused or reset
    /// connection (a node that went away, a pooled connection it closed), not a stall: the
    /// host picks the cluster's next endpoint. Once per request, only within the first half
    /// of the timeout (with the rest as the retry's own), never as the breaker's probe or
    /// once it opened. Whether the retry went out.
    fn retry(&mut self, now: Micros) -> bool {
        let (path, timeout_ms) = {
            let c = &self.shared.borrow().config.check;
            (c.path.clone(), u64::from(c.timeout_ms))
        };
        let elapsed_ms = instant_ms(now.saturating_sub(self.called_at));
        if self.retried || self.probe || elapsed_ms * 2 >= timeout_ms || !self.shared.borrow_mut().breaker.allow(now) {
            return false;
        }
        self.retried = true;
        let body = std::mem::take(&mut self.check_body);
        let sent = self.call("POST", &path, Some(&body), timeout_ms - elapsed_ms).is_ok();
        if sent {
            let metrics = self.shared.borrow().metrics;
            Metrics::bump(metrics.check_retries);
        }
        sent
    }

    /// Dispatches a call to the check service's cluster; whether it went out.
    fn call(&mut self, method: &str, path: &str, body: Option<&[u8]>, timeout_ms: u64) -> Result<u32, String> {
        // The host answers a call later, never from inside it: the borrow ends before any callback.
        let shared = self.shared.clone();
        let s = shared.borrow();
        host::call(self, &s.config.check, (method, path), body, &[], timeout_ms)
    }

    /// The request decided by leases, if it can be (see [`crate::leases`]): it goes on with
    /// the headers of its most restrictive quota, or is refused because a quota is spent.
    /// `None`: check it exactly.
    fn by_lease(&mut self, method: &str, host: Option<&str>, path: &str, now: Micros) -> Option<Action> {
        let decided = {
            let mut s = self.shared.borrow_mut();
            let leasing = s.leasing.as_mut()?;
            leasing.decide(&self.identities, method, host, path, instant_ms(now))
        };
        let (mode, metrics) = {
            let s = self.shared.borrow();
            (s.config.headers, s.metrics)
        };
        match decided {
            ByLease::Allowed(quotas) => {
                self.leased = quotas.iter().map(|(quota, _)| quota.clone()).collect();
                if let Some(((rule, _), left)) = quotas.iter().min_by_key(|(_, l)| l.remaining) {
                    let quota = Quota::from_lease(rule, left, instant_ms(now));
                    format_headers(&quota, mode, &mut self.response_headers);
                }
                Metrics::bump(metrics.allowed);
                Metrics::bump(metrics.leased);
                Some(Action::Continue)
            }
            ByLease::Refused {
                rule,
                left,
                retry_after_ms,
            } => {
                Metrics::bump(metrics.denied_spent);
                let quota = Quota {
                    retry_after_ms: Some(retry_after_ms),
                    ..Quota::from_lease(&rule, &left, instant_ms(now))
                };
                self.deny(&quota);
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
    fn queue_debit(&mut self) {
        let Some(mut request) = self.debit.take() else { return };
        let mut s = self.shared.borrow_mut();
        let metrics = s.metrics;
        let Some(debits) = s.debits.as_mut() else { return };
        let Some(cost) = response_header(&debits.config.header).and_then(|v| debits::extra_cost(&v)) else {
            return;
        };
        request.cost = cost;
        if debits.queue(&request, std::mem::take(&mut self.leased)) {
            Metrics::bump(metrics.debits);
            Metrics::add(metrics.debit_units, cost);
        } else {
            Metrics::bump(metrics.debits_failed);
        }
    }

    /// Holds the request `delay_ms` on the service's wait endpoint: the stream stays paused
    /// and the call's answer (or its failure, at the latest `delay_ms + timeout_ms` later)
    /// resumes it, so no host needs to resume a stream from a timer (ngx_wasm_module cannot).
    /// Returns whether the call went out; if not, the request goes on at once: the check
    /// already admitted it, shaping only spaces requests out.
    fn hold(&mut self, delay_ms: u64) -> bool {
        let delay_ms = delay_ms.min(MAX_HOLD_MS);
        let (wait_path, timeout) = {
            let s = self.shared.borrow();
            (s.config.check.wait_path.clone(), s.config.check.timeout_ms)
        };
        let path = format!("{wait_path}?ms={delay_ms}");
        match self.call("GET", &path, None, delay_ms + u64::from(timeout)) {
            Ok(_) => {
                self.holding = true;
                true
            }
            Err(why) => {
                log(
                    LogLevel::Warn,
                    &format!("sluice-filter: cannot hold the request ({why})"),
                );
                false
            }
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, _body: usize, _trailers: usize) {
        let now = now_us();
        if std::mem::take(&mut self.holding) || self.on_check_answer(now) {
            resume_request();
        }
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let now = now_us();
        self.read_identities();
        let metrics = self.shared.borrow().metrics;

        // Local prefilter: a client over its local rate is answered here, at once.
        let local = {
            let mut s = self.shared.borrow_mut();
            match (&mut s.local, &self.bucket_key) {
                (Some(b), Some(key)) => Some(b.take(key, now)),
                _ => None,
            }
        };
        if let Some(d) = local.filter(|d| !d.allowed) {
            Metrics::bump(metrics.denied_local);
            self.deny_by_bucket(&d, "local", now);
            return Action::Pause;
        }

        // Leased quotas: a request whose rules are all leased and held is decided here.
        let method = request_header(":method");
        let method = check_method(method.as_deref().unwrap_or("GET")).to_owned();
        let path = request_header(":path").map_or_else(|| "/".into(), |p| check_path(&p));
        // The client's `Host`: Nginx hands it over as it came (its `:authority` is the
        // server's own name and port, whatever the client asked for — seen in a real Nginx);
        // Envoy turns it into `:authority` and keeps no `host`. A host that is none (the proxy
        // refuses most such requests first) matches only rules naming no host, as at the
        // service.
        let host = request_header("host")
            .or_else(|| request_header(":authority"))
            .filter(|h| is_host(h));
        if self.shared.borrow().debits.is_some() {
            self.debit = Some(CheckRequest {
                identities: self.identities.clone(),
                method: method.clone(),
                path: path.clone(),
                cost: 0,
                host: host.clone(),
            });
        }
        if let Some(action) = self.by_lease(&method, host.as_deref(), &path, now) {
            return action;
        }

        let (allowed, state) = {
            let breaker = &mut self.shared.borrow_mut().breaker;
            (breaker.allow(now), breaker.state())
        };
        if !allowed {
            return self.fail_headers(now, "circuit breaker open");
        }
        self.probe = state == BreakerState::HalfOpen;
        let request = CheckRequest {
            identities: std::mem::take(&mut self.identities),
            method,
            path,
            cost: 1,
            host,
        };
        let body = request.to_json().into_bytes();
        let (path, timeout) = {
            let c = &self.shared.borrow().config.check;
            (c.path.clone(), c.timeout_ms)
        };
        match self.call("POST", &path, Some(&body), u64::from(timeout)) {
            Ok(_) => {
                self.called_at = now;
                self.check_body = body;
                Metrics::bump(metrics.checked);
                Action::Pause
            }
            Err(why) => {
                self.probe = false;
                self.shared.borrow_mut().breaker.failure(now);
                self.fail_headers(now, &why)
            }
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in std::mem::take(&mut self.response_headers) {
            add_response_header(name, &value);
        }
        self.queue_debit();
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.probe {
            let mut s = self.shared.borrow_mut();
            s.breaker.release_probe(now_us()); // ended before its probe's answer
        }
    }
}
