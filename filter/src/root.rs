//! The root context: reads the configuration and builds the VM's [`Shared`] state, then
//! gives every HTTP stream a [`Stream`] over it. Its tick sends the debits the streams queued
//! and the lease calls, and its call answers go to them. Each callback borrows the shared
//! state once.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use sluice_core::lease::book::QuotaKey;
use sluice_core::wire::{CheckResponse, SlotsResponse};
use sluice_core::Micros;

use crate::clock::now_us;
use crate::config::{Config, Share};
use crate::host::{self, log, Abi};
use crate::leases::MAX_ANSWER_BYTES;
use crate::metrics::Metrics;
use crate::proxy::{LogLevel, Proxy};
use crate::shared::{scope, Shared};
use crate::stream::{with_shared, Stream};

/// The root context.
#[derive(Default)]
pub struct Root {
    shared: Option<Rc<RefCell<Shared>>>,
    /// The tick period asked of the host, once asked.
    tick: Option<Duration>,
    /// Whether a stream was refused its context for want of a configuration (said once).
    said_unconfigured: bool,
}

/// The answer to the root's call `token` (a body of `body` bytes).
fn answered(s: &mut Shared, p: &mut impl Proxy, token: u32, body: usize, now: Micros) {
    if let Some(quotas) = s.debits.as_mut().and_then(|d| d.answered(token)) {
        debit_answered(s, p, &quotas, now);
        return;
    }
    if let Some(in_flight) = s.in_flight.as_mut().filter(|f| f.is_renewal(token)) {
        let answer = (status(p) == 200)
            .then(|| p.call_body(body.min(MAX_ANSWER_BYTES)))
            .and_then(|body| SlotsResponse::from_json(&body).ok());
        in_flight.renewed(token, answer, now.instant_ms());
        return;
    }
    let status = status(p);
    let etag = p.call_header("etag").and_then(entity_tag);
    let body = if body > 0 {
        p.call_body(body.min(MAX_ANSWER_BYTES))
    } else {
        Vec::new()
    };
    if let Some(leasing) = s.leasing.as_mut() {
        leasing.answered(p, token, (status, etag, &body), now.instant_ms());
    }
}

/// `config` with its `share` settled: what it says, else the host's default
/// ([`Share::default_on`]). On ngx_wasm_module that default is each worker, which the log
/// says once, with the two lines that make it the process: an nginx.conf that predates
/// `share` keeps serving, and whoever reads its log learns what to add.
fn settle_share(mut config: Config) -> Config {
    if config.share.is_some() {
        return config;
    }
    let nginx = host::is_ngx_wasm_module();
    if nginx {
        log(
            LogLevel::Error,
            "sluice-filter: the configuration does not say \"share\": on Nginx each worker keeps \
             its own local buckets and breaker, so N workers allow N times the local rates. For \
             one participant per Nginx, add `shm_kv sluice 32m eviction=none;` to nginx.conf's \
             `wasm { }` block and \"share\": \"process\" to the filter's configuration \
             (\"share\": \"worker\" keeps this and says nothing)",
        );
    }
    config.share = Some(Share::default_on(nginx));
    config
}

/// An `ETag` as RFC 9110 writes one (`"…"` or `W/"…"`, visible ASCII inside), to be sent
/// back as `if-none-match`; anything else (a CR or LF that would split the header, a NUL)
/// is not an entity tag and is not sent back.
fn entity_tag(raw: Vec<u8>) -> Option<String> {
    let quoted = raw.strip_prefix(b"W/").unwrap_or(&raw);
    let inner = quoted.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let etagc = |b: &u8| *b == 0x21 || (0x23..=0x7e).contains(b);
    inner.iter().all(etagc).then(|| String::from_utf8(raw).ok()).flatten()
}

/// The answered call's status (0: none came).
fn status(p: &impl Proxy) -> u16 {
    p.call_header(":status")
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
        .unwrap_or(0)
}

/// The service answered a debit: a leased quota it says is spent is refused here until it
/// refills; a debit it did not take is counted as lost.
fn debit_answered(s: &mut Shared, p: &mut impl Proxy, quotas: &[QuotaKey], now: Micros) {
    let status = status(p);
    let answer = (status == 200)
        .then(|| p.call_body(MAX_ANSWER_BYTES))
        .and_then(|body| CheckResponse::from_json(&body).ok());
    let Some(answer) = answer else {
        p.log(
            LogLevel::Warn,
            &format!("sluice-filter: debit not taken (status {status})"),
        );
        p.count(s.metrics.debits_failed, 1);
        return;
    };
    if let (false, Some(rule), Some(leasing)) = (answer.allowed, &answer.policy, s.leasing.as_mut()) {
        leasing.refused(p, quotas, rule, &answer, now.instant_ms());
    }
}

/// Sends every queued debit (`crate::debits`).
fn send_debits(s: &mut Shared, p: &mut impl Proxy) {
    let Some(debits) = s.debits.as_mut() else { return };
    let check = &s.config.check;
    for debit in debits.due() {
        let request = ("POST", debits.config.path.as_str());
        match p.call(check, request, Some(&debit.body), &[], u64::from(check.timeout_ms)) {
            Ok(token) => debits.sent(token, debit.quotas),
            Err(why) => {
                p.log(LogLevel::Warn, &format!("sluice-filter: debit not sent ({why})"));
                p.count(s.metrics.debits_failed, 1);
            }
        }
    }
}

/// Gives back the slots of the requests that ended and renews those still running
/// (`crate::in_flight`), and renews the running requests' slots of the filter's own limit
/// (`crate::local_in_flight`).
fn send_slot_calls(s: &mut Shared, p: &mut impl Proxy, now: Micros) {
    if let Some(local) = s.local_in_flight.as_mut() {
        let lost = local.renew_due(p, now);
        p.count(s.metrics.slots_lost, lost);
        p.count(s.metrics.in_flight_expired, local.take_expired());
    }
    let Some(in_flight) = s.in_flight.as_mut() else { return };
    let check = &s.config.check;
    let due = in_flight.due(now.instant_ms());
    p.count(s.metrics.slots_lost, std::mem::take(&mut in_flight.expired));
    for out in due {
        let request = ("POST", in_flight.config.path.as_str());
        match (
            p.call(check, request, Some(&out.body), &[], u64::from(check.timeout_ms)),
            out.renew,
        ) {
            (Ok(token), Some(id)) => in_flight.renewing(token, id),
            (Ok(_), None) => p.count(s.metrics.slots_released, out.requests),
            (Err(why), renew) => {
                p.log(LogLevel::Warn, &format!("sluice-filter: slots call not sent ({why})"));
                if renew.is_none() {
                    p.count(s.metrics.slots_lost, out.requests);
                }
            }
        }
    }
}

/// Asks for the rules and for leases, and gives back what leases will not spend.
fn send_lease_calls(s: &mut Shared, p: &mut impl Proxy, now: Micros) {
    let Some(leasing) = s.leasing.as_mut() else { return };
    let check = &s.config.check;
    for out in leasing.due(p, now.instant_ms()) {
        let etag = out.etag.as_deref().map(|e| ("if-none-match", e));
        let extra: Vec<(&str, &str)> = etag.into_iter().collect();
        let request = (out.method, out.path.as_str());
        match p.call(check, request, out.body.as_deref(), &extra, u64::from(check.timeout_ms)) {
            Ok(token) => leasing.sent(token, out.pending),
            Err(why) => {
                p.log(LogLevel::Debug, &format!("sluice-filter: lease call not sent ({why})"));
                leasing.not_sent(p, &out.pending, now.instant_ms());
            }
        }
    }
}

impl Root {
    /// The plugin's configuration (`size` bytes) came: whether the filter takes it.
    pub fn on_configure(&mut self, size: usize) -> bool {
        let bytes = if size == 0 { None } else { host::plugin_configuration() };
        let Some(bytes) = bytes else {
            log(
                LogLevel::Error,
                "sluice-filter: no plugin configuration; give at least {\"check\": {\"cluster\": \"...\"}}",
            );
            return false;
        };
        let shared = Config::parse(&bytes)
            .map_err(|e| e.to_string())
            .map(settle_share)
            .and_then(|config| Shared::new(config, Metrics::define(), &scope(&bytes)));
        let shared = match shared {
            Ok(s) => s,
            Err(e) => {
                log(LogLevel::Error, &format!("sluice-filter: configuration refused: {e}"));
                return false;
            }
        };
        // Before traffic: the process's buckets and breaker (a host without shared data for
        // them fails here, at configuration: ngx_wasm_module traps without an `shm_kv` zone).
        let missing = shared.create(&mut Abi);
        if missing > 0 {
            log(
                LogLevel::Warn,
                &format!(
                    "sluice-filter: the host did not make {missing} shared-data keys; they are made on \
                     first use (ngx_wasm_module: is the `shm_kv` zone large enough?)"
                ),
            );
        }
        log(
            LogLevel::Info,
            &format!(
                "sluice-filter: configured (share: {:?}), checking with {}",
                shared.config.share.unwrap_or(Share::Process),
                shared.config.check.cluster
            ),
        );
        if let Some(tick_ms) = shared.config.tick_ms() {
            self.tick_every(Duration::from_millis(tick_ms));
        }
        self.shared = Some(Rc::new(RefCell::new(shared)));
        true
    }

    /// Asks the host for a tick every `period`, from the root context (the only one
    /// ngx_wasm_module allows) and once: ngx_wasm_module traps on a second period, so a root
    /// configured again keeps its first and says so.
    fn tick_every(&mut self, period: Duration) {
        match self.tick {
            None => {
                host::set_tick_period(period);
                self.tick = Some(period);
            }
            Some(first) if first != period => log(
                LogLevel::Warn,
                &format!(
                    "sluice-filter: configured again with a tick of {} ms; keeping the first, \
                     {} ms (a host sets a root's tick once)",
                    period.as_millis(),
                    first.as_millis()
                ),
            ),
            Some(_) => {}
        }
    }

    /// Sends the debits the streams queued, asks for the rules and for leases, and gives
    /// back what leases will not spend.
    pub fn on_tick(&mut self) {
        let Some(shared) = &self.shared else { return };
        with_shared(shared, |s| {
            send_debits(s, &mut Abi);
            send_slot_calls(s, &mut Abi, now_us());
            send_lease_calls(s, &mut Abi, now_us());
        });
    }

    /// The answer to a rules, lease or debit call of the timer's (`token`, a body of
    /// `body` bytes).
    pub fn on_http_call_response(&mut self, token: u32, body: usize) {
        let Some(shared) = &self.shared else { return };
        with_shared(shared, |s| answered(s, &mut Abi, token, body, now_us()));
    }

    /// A new HTTP stream's context; `None` before a configuration was taken, said once for
    /// the root (its streams are not limited), not once a request.
    pub fn create_http_context(&mut self) -> Option<Stream> {
        let Some(shared) = self.shared.clone() else {
            if !self.said_unconfigured {
                self.said_unconfigured = true;
                log(
                    LogLevel::Error,
                    "sluice-filter: its streams are not limited: the plugin took no configuration \
                     (its error is logged above); said once",
                );
            }
            return None;
        };
        Some(Stream::new(shared))
    }
}

#[cfg(test)]
mod tests {
    use super::entity_tag;

    #[test]
    fn only_an_entity_tag_is_sent_back() {
        for good in ["\"7\"", "W/\"7\"", "\"\"", "\"a-b_c!\""] {
            assert_eq!(entity_tag(good.into()).as_deref(), Some(good), "{good}");
        }
        for bad in [
            "7",
            "\"7",
            "\"7\"\r\nx-evil: 1",
            "\"7\r\n\"",
            "\"a b\"",
            "\"a\"b\"",
            "\"\0\"",
            "w/\"7\"",
        ] {
            assert_eq!(entity_tag(bad.into()), None, "{bad:?}");
        }
    }
}
