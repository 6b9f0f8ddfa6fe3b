//! The plugin configurations in examples/envoy.yaml and examples/nginx.conf start the filter.

mod common;

use serde_json::Value;
use sluice_harness::Flavor;

fn example(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/").to_owned() + name;
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
    let to = text[from..]
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {start:?}"))
        + from;
    &text[from..to]
}

#[test]
fn envoy_example_configuration_starts_the_filter() {
    let yaml = example("envoy.yaml");
    let config: Value = serde_json::from_str(between(&yaml, "value: |", "vm_config:")).expect("JSON");
    assert_eq!(config["check"]["cluster"], "sluice_check");
    assert!(yaml.contains("- name: sluice_check"), "the check cluster is defined");
    let host = common::host_with(&config, Flavor::Envoy);
    assert!(host.logs().iter().all(|l| !l.message.contains("invalid")));
}

#[test]
fn nginx_example_configuration_starts_the_filter() {
    let conf = example("nginx.conf");
    let config: Value = serde_json::from_str(between(&conf, "proxy_wasm sluice '", "';")).expect("JSON");
    assert_eq!(config["check"]["cluster"], "127.0.0.1:8081");
    common::host_with(&config, Flavor::Nginx);
}
