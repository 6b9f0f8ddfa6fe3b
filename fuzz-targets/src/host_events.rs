//! The `host_events` target: the filter module run in the harness (sluice-harness, two
//! workers sharing one process's data), driven by a sequence of host events the input
//! spells. Besides the traffic a proxy delivers (streams, headers and bodies of any bytes,
//! answers of any content to the calls the module made, the clock), raw calls of its
//! exports that no well-behaved host makes: a context never created or already deleted, a
//! call token never issued or answered twice, a body size beyond the buffer, callbacks in
//! any order. And a hostile host: shared data overwritten with any bytes (as a corrupted
//! or foreign writer would leave it), buffers reported longer than they are. What must hold:
//! the module never traps, every answer it gives itself is a 429 or a 503, and its memory
//! stays within [`MAX_MEMORY`].

use std::sync::OnceLock;
use std::time::Duration;

use sluice_harness::{CallResponse, Flavor, HarnessError, Host, HostOptions, Outcome, Plugin, SharedData};

/// Events read from one input, at most.
const MAX_EVENTS: usize = 96;

/// The module's linear memory after any input's events, at most: what it grows to is bounded
/// by its tables (16 slots here, `max_keys` 4), not by what the events send.
const MAX_MEMORY: usize = 16 << 20;

/// The configurations an input starts the filter with: the check path alone; leases,
/// debits, a local bucket and a limit on requests in flight shared by the process, and
/// concurrency slots given back; each worker its own.
const CONFIGS: [&str; 3] = [
    r#"{"check": {"cluster": "sluice_check", "timeout_ms": 25}, "identities": {"user": {"header": "x-user-id"}}}"#,
    r#"{"check": {"cluster": "sluice_check"}, "identities": {"ip": {}, "user": {"header": "x-user-id"}},
        "local": {"by": "ip", "rate_per_s": 5, "burst": 5, "max_keys": 4},
        "lease": {"tick_ms": 10, "poll_ms": 10}, "debit": {"header": "x-tokens-used"}, "slots": 16,
        "concurrency": {"tick_ms": 10, "local": {"by": "user", "limit": 2, "expiry_ms": 1000}},
        "share": "process"}"#,
    r#"{"check": {"cluster": "sluice_check"}, "identities": {"api_key": {"header": "x-api-key"}},
        "local": {"by": "api_key", "rate_per_s": 1, "burst": 1}, "failure": {"mode": "closed",
        "breaker": {"failures": 1, "cooldown_ms": 5}}, "share": "worker"}"#,
];

/// Answers a call may get: the service's, right and wrong, and whatever the input says.
const BODIES: [&str; 7] = [
    r#"{"allowed": true, "limit": 10, "remaining": 9, "reset_after_ms": 1000, "policy": "p"}"#,
    r#"{"allowed": true, "slots": [{"rule": "gpu", "at": 5, "window_ms": 30}]}"#,
    r#"{"allowed": false, "limit": 10, "remaining": 0, "retry_after_ms": 700, "reset_after_ms": 700}"#,
    r#"{"allowed": true, "delay_ms": 30}"#,
    r#"{"rule": [{"name": "per-ip", "by": "ip", "algorithm": "fixed_window", "limit": 3, "window": "1s", "lease": true}]}"#,
    r#"{"rules_version": 1, "returned": [], "grants": [{"lease": 1, "units": 2, "expires_in_ms": 50, "limit": 3, "remaining": 1, "reset_after_ms": 900, "window_ms": 1000}]}"#,
    r#"{"allowed": tru"#,
];

const HEADER_NAMES: [&str; 9] = [
    ":path",
    ":method",
    ":authority",
    ":status",
    "x-forwarded-for",
    "x-user-id",
    "x-api-key",
    "x-tokens-used",
    "content-length",
];

/// The exports a host calls once a context exists, with how many arguments follow the
/// context id.
const EXPORTS: [(&str, usize); 13] = [
    ("proxy_on_context_create", 1),
    ("proxy_on_request_headers", 2),
    ("proxy_on_request_body", 2),
    ("proxy_on_request_trailers", 1),
    ("proxy_on_response_headers", 2),
    ("proxy_on_response_body", 2),
    ("proxy_on_response_trailers", 1),
    ("proxy_on_http_call_response", 4),
    ("proxy_on_tick", 0),
    ("proxy_on_log", 0),
    ("proxy_on_done", 0),
    ("proxy_on_delete", 0),
    ("proxy_on_configure", 1),
];

/// Compiles the filter module before the first input (libFuzzer's `-timeout` does not
/// count it: on a busy machine the compilation alone, under ASan, takes longer).
pub fn init() {
    plugin();
}

/// The filter module compiled once: the one at `SLUICE_FILTER_WASM` (scripts/fuzz builds
/// it), else built now as the tests build it.
fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let wasm = match std::env::var_os("SLUICE_FILTER_WASM") {
            Some(path) => std::fs::read(&path).unwrap_or_else(|e| panic!("SLUICE_FILTER_WASM {path:?}: {e}")),
            None => sluice_testkit::wasm_module_bytes("sluice-filter"),
        };
        Plugin::compile(&wasm).expect("the filter module compiles")
    })
}

/// The input, read a little at a time; an input that runs out reads zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }
    fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    /// Up to 255 bytes, or once in 16 a run of one byte up to 64 KiB.
    fn bytes(&mut self) -> Vec<u8> {
        let n = usize::from(self.byte());
        if n >= 240 {
            return vec![self.byte(); usize::from(self.byte()) << 8];
        }
        let n = n.min(self.0.len());
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        taken.to_vec()
    }
}

/// Runs the events `data` spells; panics when the module traps or answers other than 429
/// or 503.
pub fn host_events(data: &[u8]) {
    let mut input = Input(data);
    let flavor = if input.byte() & 1 == 0 {
        Flavor::Envoy
    } else {
        Flavor::Nginx
    };
    let config = CONFIGS[input.below(CONFIGS.len())];
    // An Envoy cluster's name; ngx_wasm_module dispatches to `host:port`.
    let config = match flavor {
        Flavor::Envoy => config.to_owned(),
        Flavor::Nginx => config.replace("sluice_check", "127.0.0.1:8081"),
    };
    let shared = SharedData::default();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let options = HostOptions {
            flavor,
            shared_data: shared.clone(),
            ..HostOptions::default()
        };
        let mut host = Host::from_plugin(plugin(), options).expect("the module instantiates");
        if let Err(e) = host.start(b"", config.as_bytes()) {
            panic!("the filter did not start with {config}: {e}");
        }
        workers.push(host);
    }
    // Each worker's streams (context ids are a worker's own).
    let mut streams = [Vec::new(), Vec::new()];
    for _ in 0..MAX_EVENTS {
        if input.0.is_empty() {
            break;
        }
        let w = input.below(2);
        match event(&mut workers[w], &mut input, &mut streams[w]) {
            Ok(Some(Outcome::LocalResponse(r))) => {
                assert!(
                    [429, 503].contains(&r.status),
                    "the filter answered {}: {r:?}",
                    r.status
                )
            }
            Ok(_) | Err(HarnessError::NoSuchStream(_) | HarnessError::NoSuchCall(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    for host in &mut workers {
        let memory = host.memory_bytes();
        assert!(memory <= MAX_MEMORY, "the module grew to {memory} bytes");
    }
}

/// One event on `host`; a stream's outcome when it has one.
fn event(host: &mut Host, input: &mut Input<'_>, streams: &mut Vec<u32>) -> Result<Option<Outcome>, HarnessError> {
    let eos = input.byte() & 1 == 1;
    match input.below(10) {
        0 => {
            let s = host.new_stream()?;
            host.set_property(s, "source.address", format!("10.0.0.{}:5555", input.byte()));
            streams.push(s);
            Ok(None)
        }
        1 => {
            let s = stream(input, streams);
            host.request_headers(s, &headers(input), eos).map(Some)
        }
        2 => {
            let s = stream(input, streams);
            host.request_body(s, &input.bytes(), eos).map(Some)
        }
        3 => {
            let s = stream(input, streams);
            host.response_headers(s, &headers(input), eos).map(Some)
        }
        4 => {
            let s = stream(input, streams);
            host.response_body(s, &input.bytes(), eos).map(Some)
        }
        5 => host.finish_stream(stream(input, streams)).map(|()| None),
        6 => {
            let calls = host.pending_calls();
            let Some(call) = calls.get(input.below(calls.len().max(1))) else {
                return Ok(None);
            };
            if input.byte() & 3 == 0 {
                return host.fail_call(call.token).map(|()| None);
            }
            host.respond_call(call.token, reply(input)).map(|()| None)
        }
        7 | 8 => host
            .advance(Duration::from_millis(u64::from(input.byte()) * 4))
            .map(|()| None),
        9 if input.byte() < 32 => {
            hostile(host, input);
            Ok(None)
        }
        _ => raw(host, input, streams).map(|_| None),
    }
}

/// The host turns hostile for what follows: a key of its shared data overwritten with any
/// bytes, or every buffer it hands over reported longer than it is (or honest again).
fn hostile(host: &mut Host, input: &mut Input<'_>) {
    if input.byte() & 1 == 0 {
        host.overstate_sizes([0, 0, 1, 8, 4096, u32::MAX][input.below(6)]);
        return;
    }
    let shared = host.shared_data_handle();
    let keys = shared.keys();
    if let Some(key) = keys.get(input.below(keys.len().max(1))) {
        let value = match input.below(3) {
            // The value it held, cut short or with a byte changed: nearly right.
            0 => {
                let mut v = shared.get(key).map(|(v, _)| v).unwrap_or_default();
                let at = input.below(v.len().max(1));
                v.truncate(at.max(usize::from(input.byte() & 1 == 1) * v.len()));
                if let Some(b) = v.get_mut(at) {
                    *b ^= input.byte() | 1;
                }
                v
            }
            _ => input.bytes(),
        };
        shared.corrupt(key, value);
    }
}

/// A raw call of an export, with a context, a token and sizes the input picks.
fn raw(host: &mut Host, input: &mut Input<'_>, streams: &[u32]) -> Result<Option<i32>, HarnessError> {
    let (name, n) = EXPORTS[input.below(EXPORTS.len())];
    let context = match input.below(4) {
        0 => 1,
        1 => stream(input, streams),
        2 => u32::from(input.byte()),
        _ => input.u32(),
    };
    let mut args = vec![context as i32];
    for _ in 0..n {
        args.push(match input.below(4) {
            0 => 0,
            1 => i32::from(input.byte()),
            2 => 1,
            _ => input.u32() as i32,
        });
    }
    let reply = (input.byte() & 1 == 1).then(|| reply(input));
    host.call_export(context, name, &args, reply)
}

/// One of the worker's streams (ended ones included), or once in eight any id.
fn stream(input: &mut Input<'_>, streams: &[u32]) -> u32 {
    let pick = input.byte();
    match streams.len() {
        n if n > 0 && pick < 224 => streams[usize::from(pick) % n],
        _ => u32::from(pick),
    }
}

fn headers(input: &mut Input<'_>) -> Vec<(&'static str, Vec<u8>)> {
    (0..input.below(6))
        .map(|_| (HEADER_NAMES[input.below(HEADER_NAMES.len())], input.bytes()))
        .collect()
}

fn reply(input: &mut Input<'_>) -> CallResponse {
    let status = [200u16, 200, 200, 204, 304, 429, 500, 503][input.below(8)];
    let body = match input.below(BODIES.len() + 1) {
        i if i < BODIES.len() => BODIES[i].as_bytes().to_vec(),
        _ => input.bytes(),
    };
    CallResponse::new(status, body)
}
