//! The root context: configuration, shared per-VM state and metrics.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel, MetricType};
use sluice_core::Micros;

use crate::breaker::Breaker;
use crate::buckets::Buckets;
use crate::config::Config;
use crate::stream::Stream;

/// Metric ids, defined once per VM.
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    pub allowed: u32,
    pub denied_local: u32,
    pub denied_global: u32,
    pub failed_open: u32,
    pub failed_closed: u32,
    pub delayed: u32,
    pub check_latency_ms: u32,
}

impl Metrics {
    fn define() -> Metrics {
        let counter = |name: &str| hostcalls::define_metric(MetricType::Counter, name).unwrap_or(0);
        Metrics {
            allowed: counter("sluice_filter_requests_allowed"),
            denied_local: counter("sluice_filter_requests_denied_local"),
            denied_global: counter("sluice_filter_requests_denied_global"),
            failed_open: counter("sluice_filter_requests_failed_open"),
            failed_closed: counter("sluice_filter_requests_failed_closed"),
            delayed: counter("sluice_filter_requests_delayed"),
            check_latency_ms: hostcalls::define_metric(MetricType::Histogram, "sluice_filter_check_latency_ms")
                .unwrap_or(0),
        }
    }

    /// Adds one to counter `id` (0: undefined, ignored).
    pub fn bump(id: u32) {
        if id != 0 {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }
}

/// State shared by the root and every stream of one VM.
pub struct Shared {
    pub config: Config,
    pub local: Option<Buckets>,
    pub fallback: Buckets,
    pub breaker: Breaker,
    pub metrics: Metrics,
}

/// The root context.
#[derive(Default)]
pub struct Root {
    shared: Option<Rc<RefCell<Shared>>>,
}

/// Now in unix microseconds, from the host clock.
pub fn now_us() -> Micros {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_micros() as u64)
}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let bytes = if size == 0 {
            None
        } else {
            self.get_plugin_configuration()
        };
        let Some(bytes) = bytes else {
            log(
                LogLevel::Error,
                "sluice-filter: no plugin configuration; give at least {\"check\": {\"cluster\": \"...\"}}",
            );
            return false;
        };
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log(LogLevel::Error, &format!("sluice-filter: configuration refused: {e}"));
                return false;
            }
        };
        let local = config
            .local
            .as_ref()
            .and_then(|l| Buckets::new(l.rate_per_s, l.burst, l.max_keys));
        let fb = &config.failure.fallback;
        let max_keys = config.local.as_ref().map_or(100_000, |l| l.max_keys);
        let Some(fallback) = Buckets::new(fb.rate_per_s, fb.burst, max_keys) else {
            log(
                LogLevel::Error,
                "sluice-filter: configuration refused: failure.fallback: invalid rate",
            );
            return false;
        };
        let breaker = Breaker::new(config.failure.breaker.failures, config.failure.breaker.cooldown_ms);
        log(
            LogLevel::Info,
            &format!("sluice-filter: configured, checking with {}", config.check.cluster),
        );
        self.shared = Some(Rc::new(RefCell::new(Shared {
            config,
            local,
            fallback,
            breaker,
            metrics: Metrics::define(),
        })));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Stream::new(shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
