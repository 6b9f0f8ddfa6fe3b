//! The root context: reads the configuration and builds the VM's [`Shared`] state, then
//! gives every HTTP stream a [`Stream`] over it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

use sluice_core::time::instant_ms;
use sluice_core::wire::CheckResponse;

use crate::clock::now_us;
use crate::config::Config;
use crate::host::{self, call_response_body, call_response_header, log};
use crate::leases::MAX_ANSWER_BYTES;
use crate::metrics::Metrics;
use crate::shared::Shared;
use crate::stream::Stream;

/// The root context.
#[derive(Default)]
pub struct Root {
    shared: Option<Rc<RefCell<Shared>>>,
}

impl Context for Root {
    /// The answer to a rules, lease or debit call of the timer's.
    fn on_http_call_response(&mut self, token: u32, _headers: usize, body: usize, _trailers: usize) {
        let Some(shared) = &self.shared else { return };
        let debit = shared.borrow_mut().debits.as_mut().and_then(|d| d.answered(token));
        if let Some(quotas) = debit {
            debit_answered(&mut shared.borrow_mut(), &quotas);
            return;
        }
        let status = call_response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        let etag = call_response_header("etag").and_then(|e| String::from_utf8(e).ok());
        let body = if body > 0 {
            call_response_body(body.min(MAX_ANSWER_BYTES))
        } else {
            Vec::new()
        };
        if let Some(leasing) = shared.borrow_mut().leasing.as_mut() {
            leasing.answered(token, status, etag, &body, instant_ms(now_us()));
        }
    }
}

impl Root {
    /// Sends every queued debit (`crate::debits`).
    fn send_debits(&mut self, shared: &Rc<RefCell<Shared>>) {
        let (due, check, path, metrics) = {
            let mut s = shared.borrow_mut();
            let Some(debits) = s.debits.as_mut() else { return };
            let (due, path) = (debits.due(), debits.config.path.clone());
            (due, s.config.check.clone(), path, s.metrics)
        };
        for debit in due {
            let sent = host::call(
                self,
                &check,
                ("POST", &path),
                Some(&debit.body),
                &[],
                u64::from(check.timeout_ms),
            );
            let mut s = shared.borrow_mut();
            match (sent, s.debits.as_mut()) {
                (Ok(token), Some(debits)) => debits.sent(token, debit.quotas),
                (Err(why), _) => {
                    log(LogLevel::Warn, &format!("sluice-filter: debit not sent ({why})"));
                    Metrics::bump(metrics.debits_failed);
                }
                (Ok(_), None) => {}
            }
        }
    }
}

/// The service answered a debit: a leased quota it says is spent is refused here until it
/// refills; a debit it did not take is counted as lost.
fn debit_answered(s: &mut Shared, quotas: &[sluice_core::lease::book::QuotaKey]) {
    let status = call_response_header(":status")
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
        .unwrap_or(0);
    let answer = (status == 200)
        .then(|| call_response_body(MAX_ANSWER_BYTES))
        .and_then(|body| CheckResponse::from_json(&body).ok());
    let Some(answer) = answer else {
        log(
            LogLevel::Warn,
            &format!("sluice-filter: debit not taken (status {status})"),
        );
        Metrics::bump(s.metrics.debits_failed);
        return;
    };
    if let (false, Some(rule), Some(leasing)) = (answer.allowed, &answer.policy, s.leasing.as_mut()) {
        leasing.refused(quotas, rule, &answer, instant_ms(now_us()));
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let bytes = if size == 0 { None } else { host::plugin_configuration() };
        let Some(bytes) = bytes else {
            log(
                LogLevel::Error,
                "sluice-filter: no plugin configuration; give at least {\"check\": {\"cluster\": \"...\"}}",
            );
            return false;
        };
        let shared = match Config::parse(&bytes).map_err(|e| e.to_string()).and_then(Shared::new) {
            Ok(s) => s,
            Err(e) => {
                log(LogLevel::Error, &format!("sluice-filter: configuration refused: {e}"));
                return false;
            }
        };
        log(
            LogLevel::Info,
            &format!(
                "sluice-filter: configured, checking with {}",
                shared.config.check.cluster
            ),
        );
        if let Some(tick_ms) = shared.config.tick_ms() {
            // The root context is where every host allows a timer (ngx_wasm_module included).
            host::set_tick_period(Duration::from_millis(tick_ms));
        }
        self.shared = Some(Rc::new(RefCell::new(shared)));
        true
    }

    /// Asks for the rules and for leases, gives back what leases will not spend, and sends
    /// the debits the streams queued.
    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else { return };
        self.send_debits(&shared);
        let now_ms = instant_ms(now_us());
        let (due, check) = {
            let mut s = shared.borrow_mut();
            let due = s.leasing.as_mut().map(|l| l.due(now_ms)).unwrap_or_default();
            (due, s.config.check.clone())
        };
        for out in due {
            let etag = out.etag.as_deref().map(|e| ("if-none-match", e));
            let extra: Vec<(&str, &str)> = etag.into_iter().collect();
            let sent = host::call(
                self,
                &check,
                (out.method, &out.path),
                out.body.as_deref(),
                &extra,
                u64::from(check.timeout_ms),
            );
            let mut s = shared.borrow_mut();
            let Some(leasing) = s.leasing.as_mut() else { return };
            match sent {
                Ok(token) => leasing.sent(token, out.pending),
                Err(why) => {
                    log(LogLevel::Debug, &format!("sluice-filter: lease call not sent ({why})"));
                    leasing.not_sent(&out.pending);
                }
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Stream::new(shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
