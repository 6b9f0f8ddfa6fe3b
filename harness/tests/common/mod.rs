//! Builds the probe module (harness/probe-module, written with the proxy-wasm Rust SDK) for
//! wasm32-wasip1 once per test process.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use sluice_harness::{Host, HostOptions, Outcome, Plugin};

/// The probe module's bytes, built by a nested cargo in its own target directory (so it
/// never waits on the outer build's lock).
pub fn wasm() -> &'static [u8] {
    static WASM: OnceLock<Vec<u8>> = OnceLock::new();
    WASM.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let target = root.join("target").join("wasm-modules");
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args([
                "build",
                "-p",
                "sluice-harness-probe",
                "--target",
                "wasm32-wasip1",
                "--release",
            ])
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("cannot run cargo");
        assert!(
            status.success(),
            "building the probe module for wasm32-wasip1 failed (is the target installed? run scripts/setup)"
        );
        let path = target.join("wasm32-wasip1/release/sluice_harness_probe.wasm");
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    })
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
