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
    let mut host = common::host_with(&config, Flavor::Envoy);
    assert!(host.logs().iter().all(|l| !l.message.contains("invalid")));
    assert!(
        yaml.contains("payload_in_metadata: jwt_payload"),
        "jwt_authn writes what the filter reads"
    );
    let jwt = "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload";
    reads_the_trusted_user(&mut host, &format!("{jwt}.sub"));
}

/// The example's filter takes the user from property `path`, never from the `x-user-id` a
/// client sends, and sends the service its token.
fn reads_the_trusted_user(host: &mut sluice_harness::Host, path: &str) {
    let s = host.new_stream().expect("stream");
    host.set_property(s, "source.address", "203.0.113.5:4000");
    host.set_property(s, path, "alice");
    let headers = [
        (":method", "GET"),
        (":path", "/"),
        (":authority", "x"),
        ("x-user-id", "mallory"),
    ];
    host.request_headers(s, &headers, true).expect("headers");
    let (call, body) = common::the_call(host);
    assert_eq!(body["identities"]["user"], "alice");
    assert_eq!(
        call.header("authorization"),
        Some("Bearer the-token-in-the-nodes-data-token-file")
    );
}

#[test]
fn nginx_example_configuration_starts_the_filter() {
    let conf = example("nginx.conf");
    let config: Value = serde_json::from_str(between(&conf, "proxy_wasm sluice '", "';")).expect("JSON");
    assert_eq!(config["check"]["cluster"], "127.0.0.1:8081");
    let mut host = common::host_with(&config, Flavor::Nginx);
    assert!(
        conf.contains("ssl_verify_client"),
        "Nginx verifies the certificate the user comes from"
    );
    reads_the_trusted_user(&mut host, "ngx.ssl_client_s_dn");
}
