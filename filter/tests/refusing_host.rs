//! A host that refuses the filter's host calls with statuses the proxy-wasm SDK does not
//! expect (its wrappers `panic!` on them): the filter goes on without the call and never
//! traps, on both hosts.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sluice_harness::abi::{LogLevel, Status};
use sluice_harness::{CallResponse, Flavor, HarnessError, Host, HostOptions, Outcome};

const RULES: &str = r#"{"rule": [
  {"name": "per-ip", "by": "ip", "algorithm": "fixed_window", "limit": 100, "window": "1m", "lease": true}
]}"#;

/// Leasing, and a local prefilter that lets 3 requests of a client through at once.
fn configuration(flavor: Flavor) -> Value {
    let mut config = config_in(flavor);
    config["lease"] = json!({"tick_ms": 50, "poll_ms": 1000});
    config["local"] = json!({"by": "ip", "rate_per_s": 1, "burst": 3, "max_keys": 100});
    config
}

/// A started filter on a host whose functions in `refused` answer only their status.
fn refusing_host(flavor: Flavor, refused: &[(&str, Status)]) -> Result<Host, HarnessError> {
    let options = HostOptions {
        flavor,
        refused_calls: refused.iter().map(|(f, s)| ((*f).to_owned(), *s)).collect(),
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin(), options)?;
    host.start(b"", configuration(flavor).to_string().as_bytes())?;
    Ok(host)
}

/// Answers every pending call: the rules, a lease of each unit asked for, `check`.
fn serve(host: &mut Host, check: &CallResponse) -> Result<(), HarnessError> {
    for call in host.pending_calls() {
        let reply = match call.header(":path") {
            Some("/v1/rules") => CallResponse::new(200, RULES),
            Some("/v1/lease") => {
                let asked: Value = serde_json::from_slice(&call.body).unwrap_or_default();
                let asks = asked["grants"].as_array().map_or(0, Vec::len);
                let grant = json!({"lease": 1, "units": 5, "expires_in_ms": 10_000, "limit": 100,
                                   "remaining": 90, "reset_after_ms": 50_000, "window_ms": 60_000});
                let body = json!({"rules_version": 1, "returned": [], "grants": vec![grant; asks]});
                CallResponse::new(200, body.to_string())
            }
            _ => check.clone(),
        };
        host.respond_call(call.token, reply)?;
    }
    Ok(())
}

/// A request forwarded for `ip` (none: the connection's address counts); its stream.
fn send(host: &mut Host, ip: &str) -> Result<u32, HarnessError> {
    let s = host.new_stream()?;
    host.set_property(s, "source.address", "127.0.0.1:5555");
    let headers = [(":method", "GET"), (":path", "/"), (":authority", "example.com")];
    let mut headers: Vec<(&str, &str)> = headers.to_vec();
    headers.push(("x-forwarded-for", ip));
    host.request_headers(s, &headers, true)?;
    Ok(s)
}

/// Every host call of the traffic path: rules and leases polled, a request checked and
/// allowed (resumed, headers added to its response), one denied (a 429), one whose check
/// times out (the failure policy), one decided by a lease, and a client over its local rate.
fn traffic(host: &mut Host) -> Result<(), HarnessError> {
    let (allow, deny) = (answer(true, 99, 60_000, 0), answer(false, 0, 60_000, 0));
    host.advance(Duration::from_millis(50))?;
    serve(host, &allow)?;
    let mut streams = vec![send(host, "9.9.9.9, 203.0.113.1")?];
    serve(host, &allow)?;
    streams.push(send(host, "9.9.9.9, 203.0.113.2")?);
    serve(host, &deny)?;
    streams.push(send(host, "9.9.9.9, 203.0.113.3")?);
    host.advance(Duration::from_millis(50))?; // the check times out; leases are asked for
    serve(host, &allow)?;
    streams.push(send(host, "9.9.9.9, 203.0.113.1")?);
    for _ in 0..4 {
        streams.push(send(host, "")?);
        serve(host, &allow)?;
    }
    for s in streams {
        if host.stream(s).is_some_and(|st| st.local_response.is_none()) {
            host.response_headers(s, &[(":status", "200")], false)?;
        }
        host.finish_stream(s)?;
    }
    Ok(())
}

/// The traffic reaches every path it is meant to (else refusing a call would prove little).
fn the_traffic_takes_every_path(flavor: Flavor) {
    let mut host = refusing_host(flavor, &[]).expect("filter starts");
    traffic(&mut host).expect("no trap");
    for (metric, count) in [
        ("sluice_filter_requests_allowed", 5),
        ("sluice_filter_requests_leased", 1),
        ("sluice_filter_requests_denied_global", 1),
        ("sluice_filter_requests_denied_local", 1),
        ("sluice_filter_requests_failed_open", 1),
    ] {
        assert_eq!(host.metric(metric), Some(count), "{metric}");
    }
}

/// Each host function the filter calls, and what it logs when refused (`""`: nothing).
const CALLS: [(&str, &str); 12] = [
    ("proxy_log", ""),
    ("proxy_get_header_map_value", ""),
    ("proxy_add_header_map_value", "the host refused a response header"),
    ("proxy_get_buffer_bytes", ""),
    ("proxy_get_property", ""),
    ("proxy_send_local_response", "the host refused a local response"),
    ("proxy_continue_stream", "the host refused resuming the request"),
    ("proxy_get_current_time_nanoseconds", ""),
    ("proxy_set_tick_period_milliseconds", "the host refused the tick period"),
    ("proxy_define_metric", ""),
    ("proxy_increment_metric", ""),
    ("proxy_record_metric", ""),
];

/// What went wrong for `function` refused with `status`, if anything.
fn refused(flavor: Flavor, function: &str, status: Status, logs: &str) -> Option<String> {
    let mut host = match refusing_host(flavor, &[(function, status)]) {
        // Without its configuration the filter refuses to start: refusing, not trapping.
        Err(HarnessError::StartRefused(_)) if function == "proxy_get_buffer_bytes" => return None,
        Err(e) => return Some(format!("start: {}", e.to_string().lines().next().unwrap_or_default())),
        Ok(host) => host,
    };
    if let Err(e) = traffic(&mut host) {
        return Some(e.to_string().lines().next().unwrap_or_default().to_owned());
    }
    let logged = host
        .logs()
        .iter()
        .any(|l| l.level == LogLevel::Warn && l.message.contains(logs));
    (!logs.is_empty() && !logged).then(|| format!("did not log {logs:?}"))
}

/// Every call of the traffic path refused with statuses its SDK wrapper panics on.
fn refused_host_calls_never_trap_the_filter(flavor: Flavor) {
    let mut problems = Vec::new();
    for (function, logs) in CALLS {
        for status in [Status::BadArgument, Status::InternalFailure, Status::Unimplemented] {
            if let Some(problem) = refused(flavor, function, status, logs) {
                problems.push(format!("{function} answering {status:?}: {problem}"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A refused resume leaves the request paused, and a refused local response leaves it
/// unanswered, yet the filter goes on deciding the next requests.
fn a_refused_answer_leaves_the_filter_deciding(flavor: Flavor) {
    let refused = [
        ("proxy_send_local_response", Status::NotFound),
        ("proxy_continue_stream", Status::NotFound),
    ];
    let mut host = refusing_host(flavor, &refused).expect("filter starts");
    let (allow, deny) = (answer(true, 99, 60_000, 0), answer(false, 0, 60_000, 0));
    for (reply, metric) in [
        (&deny, "sluice_filter_requests_denied_global"),
        (&allow, "sluice_filter_requests_allowed"),
    ] {
        let s = send(&mut host, "9.9.9.9, 203.0.113.1").expect("no trap");
        assert_eq!(host.stream(s).map(|st| st.request_resumes), Some(0));
        serve(&mut host, reply).expect("no trap");
        assert_eq!(host.metric(metric), Some(1), "{metric}");
        let st = host.stream(s).expect("stream");
        assert_eq!((st.request_resumes, st.local_response.is_none()), (0, true));
    }
    let (s, outcome) = request(&mut host, "9.9.9.9, 203.0.113.4", "/", &[]);
    assert_eq!(outcome, Outcome::Pause, "still checking");
    host.finish_stream(s).expect("no trap");
}

/// A root configured again keeps the tick it asked for first (ngx_wasm_module traps on a
/// second period; found by the `host_events` fuzz target), says so when the new one
/// differs, and goes on deciding with the new configuration.
fn a_root_configured_again_keeps_its_tick(flavor: Flavor) {
    let mut host = refusing_host(flavor, &[]).expect("started");
    host.configure(configuration(flavor).to_string().as_bytes())
        .expect("the same configuration again: no trap");
    let mut faster = configuration(flavor);
    faster["lease"]["tick_ms"] = json!(20);
    host.configure(faster.to_string().as_bytes())
        .expect("a new tick: no trap");
    said_once_and_still_deciding(&mut host, "keeping the first, 50 ms");
}

/// `host` logged `said` once, and its traffic still takes every path.
fn said_once_and_still_deciding(host: &mut Host, said: &str) {
    let times = host.logs().iter().filter(|l| l.message.contains(said)).count();
    assert_eq!(times, 1, "{said:?} in {:#?}", host.logs());
    traffic(host).expect("the traffic still takes every path");
}

/// A root the host creates again (a second `proxy_on_context_create` of its id) is the same
/// root: configured again, it asks for no second tick (ngx_wasm_module would trap; found by
/// the `host_events` fuzz target), and the traffic still takes every path.
fn a_root_created_again_keeps_its_state(flavor: Flavor) {
    let mut host = refusing_host(flavor, &[]).expect("started");
    host.call_export(1, "proxy_on_context_create", &[1, 0], None)
        .expect("no trap");
    host.configure(configuration(flavor).to_string().as_bytes())
        .expect("configured again: no second tick");
    said_once_and_still_deciding(&mut host, "context 1 created again");
}

/// A host asking for more memory than the VM can have gets 0 (the ABI's "no memory"), never
/// a trap, and the filter goes on deciding.
fn memory_the_vm_cannot_have_is_refused_not_a_trap(flavor: Flavor) {
    let mut host = refusing_host(flavor, &[]).expect("starts");
    // 3 GiB (past what the VM may grow to) and 4 GiB − 1 (past any layout on wasm32).
    for size in [0xC000_0000u32, u32::MAX] {
        let answer = host
            .call_export(1, "proxy_on_memory_allocate", &[size as i32], None)
            .expect("no trap")
            .expect("exported");
        assert_eq!(answer, 0, "{size} bytes");
    }
    let answer = host.call_export(1, "proxy_on_memory_allocate", &[16], None);
    assert!(matches!(answer, Ok(Some(p)) if p != 0), "16 bytes: {answer:?}");
    traffic(&mut host).expect("still deciding");
}

/// A hostile host that reports every buffer longer than it allocated: the filter reads and
/// frees none of them past what it gave (the configuration is refused, said by size), and
/// never traps.
fn sizes_past_what_the_host_allocated_are_refused(flavor: Flavor) {
    let options = HostOptions {
        flavor,
        overstated_sizes: 64,
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin(), options).expect("loads");
    let started = host.start(b"", configuration(flavor).to_string().as_bytes());
    assert!(matches!(started, Err(HarnessError::StartRefused(_))), "{started:?}");
    let said = host.logs().iter().any(|l| {
        l.level == LogLevel::Warn && l.message.contains("bytes at") && l.message.contains("the answer is refused")
    });
    assert!(said, "{:#?}", host.logs());
}

/// A root that took no configuration says once that its streams are not limited, not once
/// a stream, and the streams go on unlimited.
fn an_unconfigured_root_says_so_once(flavor: Flavor) {
    let options = HostOptions {
        flavor,
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin(), options).expect("loads");
    let started = host.start(b"", br#"{"check": {}}"#);
    assert!(matches!(started, Err(HarnessError::StartRefused(_))), "{started:?}");
    for _ in 0..5 {
        let (s, outcome) = request(&mut host, "9.9.9.9", "/", &[]);
        assert_eq!(outcome, Outcome::Continue, "not limited");
        host.finish_stream(s).expect("no trap");
    }
    let times = host.logs().iter().filter(|l| l.message.contains("not limited")).count();
    assert_eq!(times, 1, "{:#?}", host.logs());
}

on_both_hosts!(
    sizes_past_what_the_host_allocated_are_refused,
    an_unconfigured_root_says_so_once,
    a_root_configured_again_keeps_its_tick,
    a_root_created_again_keeps_its_state,
    the_traffic_takes_every_path,
    refused_host_calls_never_trap_the_filter,
    a_refused_answer_leaves_the_filter_deciding,
    memory_the_vm_cannot_have_is_refused_not_a_trap,
);
