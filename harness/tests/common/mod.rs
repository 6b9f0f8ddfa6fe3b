//! Builds the probe module (harness/probe-module, written with the proxy-wasm Rust SDK) for
//! wasm32-wasip1 once per test process.

#![allow(dead_code)]

use std::sync::OnceLock;

use sluice_harness::{Host, HostOptions, Outcome, Plugin};
use sluice_testkit::wasm_module_bytes;

/// The probe module's bytes, built once per test process ([`wasm_module_bytes`]).
pub fn wasm() -> &'static [u8] {
    static WASM: OnceLock<Vec<u8>> = OnceLock::new();
    WASM.get_or_init(|| wasm_module_bytes("sluice-harness-probe"))
}

/// The probe compiled once per test process.
pub fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| Plugin::compile(wasm()).expect("probe compiles"))
}

/// A started host running the probe with `config`.
pub fn host_with(config: &str, options: HostOptions) -> Host {
    let mut host = Host::from_plugin(plugin(), options).expect("probe loads");
    host.start(b"vm-config", config.as_bytes()).expect("probe starts");
    host
}

/// A started Envoy-flavoured host with clusters `backend` only.
pub fn host() -> Host {
    host_with(
        "",
        HostOptions {
            clusters: vec!["backend".into()],
            ..HostOptions::default()
        },
    )
}

/// Opens a stream and delivers `GET /probe` with `x-probe: mode` and `extra` headers.
pub fn request(host: &mut Host, mode: &str, extra: &[(&str, &str)]) -> (u32, Outcome) {
    let s = host.new_stream().expect("stream");
    host.set_property(s, "source.address", "192.0.2.7:4242");
    let mut headers = vec![
        (":method", "GET"),
        (":path", "/probe?q=1"),
        (":authority", "example.test"),
        ("x-probe", mode),
    ];
    headers.extend_from_slice(extra);
    let outcome = host.request_headers(s, &headers, false).expect("request headers");
    (s, outcome)
}

/// A request header of stream `s` as the module left it.
pub fn header(host: &Host, s: u32, name: &str) -> Option<String> {
    host.stream(s)?
        .request_headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}
