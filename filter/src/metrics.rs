//! The filter's metrics, defined once per VM. A metric the host refuses has id 0 and is
//! skipped: metrics never fail a request. They are counted through the proxy
//! ([`crate::proxy::Proxy::count`]).

use crate::host::{self, MetricType};

/// Metric ids (0: undefined).
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    pub allowed: u32,
    pub denied_local: u32,
    pub denied_global: u32,
    /// Refused without a call: a leased quota the service said is spent, until it said.
    pub denied_spent: u32,
    pub failed_open: u32,
    pub failed_closed: u32,
    pub delayed: u32,
    /// Allowed by a lease held here, without a call.
    pub leased: u32,
    /// Sent to the exact check (a call went out).
    pub checked: u32,
    /// Check calls sent again after a failure that came at once (a refused connection).
    pub check_retries: u32,
    /// Leases granted with units, and the units they brought; of them, those granted while
    /// the quota's previous lease still ran (renewals).
    pub leases_granted: u32,
    pub lease_units_granted: u32,
    pub leases_renewed: u32,
    /// Units spent by requests decided here: one per quota of each.
    pub lease_units_spent: u32,
    /// Leases given back before their end, and their unspent units, counted when the
    /// service answered the call that carried them.
    pub leases_returned: u32,
    pub lease_units_returned: u32,
    /// Leases that ended with units neither spent nor given back (their end came, or the
    /// call giving them back failed), and those units.
    pub leases_expired: u32,
    pub lease_units_expired: u32,
    pub check_latency_ms: u32,
    /// Costs learnt after the response and sent to the service, and the units they carried.
    pub debits: u32,
    pub debit_units: u32,
    /// Debits lost: the queue full, the call not sent, or no answer from the service.
    pub debits_failed: u32,
    /// Requests' concurrency slots taken (named by a check's answer), given back (a call
    /// sent), and those not (no configuration, the table full, a call not sent, expired
    /// before a renewal): those expire at the service. Held now: taken less the other two.
    pub slots_taken: u32,
    pub slots_released: u32,
    pub slots_lost: u32,
    /// The filter's own limit on requests in flight (`concurrency.local`): requests refused
    /// by it, slots taken and given back (held now: taken less ended and expired), and slots
    /// a worker found expired (their holder died, an Nginx worker process, or stalled).
    pub denied_in_flight: u32,
    pub in_flight_taken: u32,
    pub in_flight_ended: u32,
    pub in_flight_expired: u32,
    /// The VMs' linear memory, summed over the plugin's VMs (every worker's): each adds what
    /// its memory grew by, seen at its next request. Wasm memory never shrinks, so a counter.
    pub vm_memory_bytes: u32,
}

impl Metrics {
    /// Defines every metric with the host.
    pub fn define() -> Metrics {
        let counter = |name: &str| host::define_metric(MetricType::Counter, name);
        Metrics {
            allowed: counter("sluice_filter_requests_allowed"),
            denied_local: counter("sluice_filter_requests_denied_local"),
            denied_global: counter("sluice_filter_requests_denied_global"),
            denied_spent: counter("sluice_filter_requests_denied_spent"),
            failed_open: counter("sluice_filter_requests_failed_open"),
            failed_closed: counter("sluice_filter_requests_failed_closed"),
            delayed: counter("sluice_filter_requests_delayed"),
            leased: counter("sluice_filter_requests_leased"),
            checked: counter("sluice_filter_requests_checked"),
            check_retries: counter("sluice_filter_check_retries"),
            leases_granted: counter("sluice_filter_leases_granted"),
            lease_units_granted: counter("sluice_filter_lease_units_granted"),
            leases_renewed: counter("sluice_filter_leases_renewed"),
            lease_units_spent: counter("sluice_filter_lease_units_spent"),
            leases_returned: counter("sluice_filter_leases_returned"),
            lease_units_returned: counter("sluice_filter_lease_units_returned"),
            leases_expired: counter("sluice_filter_leases_expired"),
            lease_units_expired: counter("sluice_filter_lease_units_expired"),
            check_latency_ms: host::define_metric(MetricType::Histogram, "sluice_filter_check_latency_ms"),
            debits: counter("sluice_filter_debits"),
            debit_units: counter("sluice_filter_debit_units"),
            debits_failed: counter("sluice_filter_debits_failed"),
            slots_taken: counter("sluice_filter_slots_taken"),
            slots_released: counter("sluice_filter_slots_released"),
            slots_lost: counter("sluice_filter_slots_lost"),
            denied_in_flight: counter("sluice_filter_requests_denied_in_flight"),
            in_flight_taken: counter("sluice_filter_in_flight_taken"),
            in_flight_ended: counter("sluice_filter_in_flight_ended"),
            in_flight_expired: counter("sluice_filter_in_flight_expired"),
            vm_memory_bytes: counter("sluice_filter_vm_memory_bytes"),
        }
    }
}
