//! Builds the filter for wasm32-wasip1 once and drives it in the harness.

#![allow(dead_code)]

use std::sync::OnceLock;

use serde_json::{json, Value};
use sluice_harness::{CallResponse, Flavor, Host, HostOptions, Outcome, PendingCall, Plugin};
use sluice_testkit::wasm_module_bytes;

/// Each function named, run on both hosts as tests `name::envoy` and `name::nginx`.
#[allow(unused_macros)]
macro_rules! on_both_hosts {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn envoy() {
                super::$name(sluice_harness::Flavor::Envoy)
            }
            #[test]
            fn nginx() {
                super::$name(sluice_harness::Flavor::Nginx)
            }
        }
    )*};
}

/// The filter module's bytes, built once per test process ([`wasm_module_bytes`]), or the
/// module at `SLUICE_FILTER_WASM` (to bench another build beside this one).
pub fn wasm() -> &'static [u8] {
    static WASM: OnceLock<Vec<u8>> = OnceLock::new();
    WASM.get_or_init(|| match std::env::var_os("SLUICE_FILTER_WASM") {
        Some(path) => std::fs::read(&path).unwrap_or_else(|e| panic!("SLUICE_FILTER_WASM {path:?}: {e}")),
        None => wasm_module_bytes("sluice-filter"),
    })
}

/// A configuration like docs/design.md's, as JSON.
pub fn config() -> Value {
    json!({
        "check": {"cluster": "sluice_check", "authority": "sluice-check", "path": "/v1/check", "timeout_ms": 25},
        "identities": {"ip": {"header": "x-forwarded-for", "trusted_hops": 1},
                       "user": {"header": "x-user-id"}, "api_key": {"header": "x-api-key"}, "tier": {"header": "x-user-tier"}},
        "local": {"by": "ip", "rate_per_s": 200, "burst": 400, "max_keys": 1000},
        "failure": {"mode": "open", "fallback": {"rate_per_s": 50, "burst": 100},
                    "breaker": {"failures": 3, "cooldown_ms": 1000}},
        "headers": "all"
    })
}

/// The filter compiled once per test process.
pub fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| Plugin::compile(wasm()).expect("module compiles"))
}

/// The filter compiled once per test process to count its instructions.
pub fn metered_plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| Plugin::compile_metered(wasm()).expect("module compiles"))
}

/// A started host running the filter with `config`.
pub fn host_with(config: &Value, flavor: Flavor) -> Host {
    host_of(plugin(), config, flavor)
}

/// A started host running `plugin` with `config`.
pub fn host_of(plugin: &Plugin, config: &Value, flavor: Flavor) -> Host {
    let options = HostOptions {
        flavor,
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin, options).expect("module loads");
    host.start(b"", config.to_string().as_bytes()).expect("filter starts");
    host
}

pub fn host() -> Host {
    host_with(&config(), Flavor::Envoy)
}

/// Where the check service is on `flavor`'s host: an Envoy cluster name, or the `host:port`
/// ngx_wasm_module dispatches to.
pub fn cluster(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Envoy => "sluice_check",
        Flavor::Nginx => "127.0.0.1:8081",
    }
}

/// [`config`] for `flavor`'s host.
pub fn config_in(flavor: Flavor) -> Value {
    let mut config = config();
    config["check"]["cluster"] = cluster(flavor).into();
    if flavor == Flavor::Nginx {
        // As examples/nginx.conf says it, beside its `shm_kv sluice` zone (Nginx's default is
        // each worker: `Share::default_on`).
        config["share"] = "process".into();
    }
    config
}

/// A host of `flavor` running the filter with [`config_in`].
pub fn host_in(flavor: Flavor) -> Host {
    host_with(&config_in(flavor), flavor)
}

/// Opens a stream from `ip` and delivers GET `path` request headers.
pub fn request(host: &mut Host, ip: &str, path: &str, extra: &[(&str, &str)]) -> (u32, Outcome) {
    let extra: Vec<(&str, &[u8])> = extra.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    request_bytes(host, ip.as_bytes(), path, &extra)
}

/// [`request`] with header values as bytes: `x-forwarded-for` is `xff`.
pub fn request_bytes(host: &mut Host, xff: &[u8], path: &str, extra: &[(&str, &[u8])]) -> (u32, Outcome) {
    let s = host.new_stream().expect("stream");
    host.set_property(s, "source.address", "127.0.0.1:5555");
    let mut headers: Vec<(&str, &[u8])> = vec![
        (":method", b"GET"),
        (":path", path.as_bytes()),
        (":authority", b"example.com"),
        ("x-forwarded-for", xff),
    ];
    headers.extend_from_slice(extra);
    let outcome = host.request_headers(s, &headers, true).expect("no trap");
    (s, outcome)
}

/// The single pending check call, with its body parsed.
pub fn the_call(host: &Host) -> (PendingCall, Value) {
    let calls = host.pending_calls();
    assert_eq!(calls.len(), 1, "expected one check call, got {calls:?}");
    let body = serde_json::from_slice(&calls[0].body).expect("check body is JSON");
    (calls[0].clone(), body)
}

/// A check-service answer.
pub fn answer(allowed: bool, remaining: u64, reset_ms: u64, delay_ms: u64) -> CallResponse {
    let body = json!({
        "allowed": allowed, "limit": 100, "remaining": remaining, "reset_after_ms": reset_ms,
        "retry_after_ms": if allowed { 0 } else { reset_ms }, "reset_at": 0, "policy": "search-per-user",
        "window_ms": 60000, "rules": [], "delay_ms": delay_ms, "degraded": false
    });
    CallResponse::new(200, body.to_string())
}

/// The answer to lease call `call`: each grant it asks for, `units` of lease `lease` on (the
/// first's id), lasting `expires_in_ms`; each return taken.
pub fn grant_each(call: &PendingCall, lease: u64, units: u64, expires_in_ms: u64) -> CallResponse {
    let body: Value = serde_json::from_slice(&call.body).expect("JSON");
    let asks = body["grants"].as_array().map_or(0, Vec::len);
    let returns = body["returns"].as_array().map_or(0, Vec::len);
    let grants: Vec<Value> = (0..asks as u64)
        .map(|i| {
            json!({"lease": lease + i, "units": units, "expires_in_ms": expires_in_ms, "limit": 100,
                   "remaining": 50, "reset_after_ms": 50_000, "window_ms": 60_000})
        })
        .collect();
    let answer = json!({"rules_version": 1, "grants": grants, "returned": vec![0; returns]});
    CallResponse::new(200, answer.to_string())
}
