//! No client steps around a limit, and no stranger spends one: the whole chain (filter in the
//! harness proxy, on both host flavors, two nodes over Redis) against the ways a client can
//! spell the same request differently — path variants, long keys that share a prefix, the
//! addresses of one IPv6 /64, IPv4-mapped addresses — and a caller without the data token.

use sluice_tests::chain::{Chain, Options, ProxyHost};
use sluice_tests::http::{http, send};

/// The rules: `/api/search*` by IP, `/keyed*` by API key, `/v6*` by IP, 3 an hour each.
const RULES: &str = include_str!("../step-around.toml");

fn chain(host: ProxyHost) -> Chain {
    Chain::with(Options {
        rules: RULES.to_owned(),
        host,
        trusted_hops: 1,
        ..Options::default()
    })
}

/// Status of `GET path` through proxy 0 from client `ip` (the trusted forwarding header).
fn get(chain: &Chain, path: &str, ip: &str, headers: &[(&str, &str)]) -> u16 {
    let mut all = vec![("x-forwarded-for", ip)];
    all.extend_from_slice(headers);
    http(chain.proxies[0], "GET", path, &all).status
}

const VARIANTS: [&str; 10] = [
    "/api/search/",
    "/api/search//",
    "//api/search",
    "/api//search",
    "/api/%73earch",
    "/api/./search",
    "/api/x/../search",
    "/%61pi/search",
    "/api/%2e/search?q=1",
    "/API/../api/search",
];

fn path_variants_share_the_limit(host: ProxyHost) {
    let chain = chain(host);
    let client = "203.0.113.1";
    for _ in 0..3 {
        assert_eq!(get(&chain, "/api/search", client, &[]), 200);
    }
    for variant in VARIANTS {
        assert_eq!(
            get(&chain, variant, client, &[]),
            429,
            "{host:?}: {variant} stepped around the limit"
        );
    }
    // Another client is untouched, and a path the rule does not cover is not limited.
    assert_eq!(get(&chain, "/api/search", "203.0.113.2", &[]), 200);
    assert_eq!(get(&chain, "/api/other", client, &[]), 200);
}

#[test]
fn path_variants_share_the_limit_envoy() {
    path_variants_share_the_limit(ProxyHost::Envoy);
}

#[test]
fn path_variants_share_the_limit_nginx() {
    path_variants_share_the_limit(ProxyHost::Nginx);
}

#[test]
fn path_variants_share_the_limit_real_envoy() {
    path_variants_share_the_limit(ProxyHost::RealEnvoy);
}

fn identities_name_one_client_each(host: ProxyHost) {
    let chain = chain(host);
    // Two keys longer than the wire bound that share their first 300 bytes: two clients.
    let (a, b) = (format!("{}A", "k".repeat(300)), format!("{}B", "k".repeat(300)));
    for _ in 0..3 {
        assert_eq!(get(&chain, "/keyed", "198.51.100.1", &[("x-api-key", &a)]), 200);
    }
    assert_eq!(get(&chain, "/keyed", "198.51.100.1", &[("x-api-key", &a)]), 429);
    assert_eq!(
        get(&chain, "/keyed", "198.51.100.1", &[("x-api-key", &b)]),
        200,
        "{host:?}: a key was refused for another key's spending"
    );

    // Five addresses of one /64 are one client; the next /64 is another.
    let codes: Vec<u16> = (1..=5)
        .map(|i| get(&chain, "/v6", &format!("2001:db8:1:2::{i:x}"), &[]))
        .collect();
    assert_eq!(codes, [200, 200, 200, 429, 429], "{host:?}: one /64, five buckets");
    assert_eq!(get(&chain, "/v6", "2001:db8:1:3::1", &[]), 200);

    // An IPv4-mapped address is the IPv4 address.
    let codes: Vec<u16> = [
        "::ffff:198.51.100.9",
        "198.51.100.9",
        "::ffff:198.51.100.9",
        "198.51.100.9",
    ]
    .iter()
    .map(|ip| get(&chain, "/v6", ip, &[]))
    .collect();
    assert_eq!(
        codes,
        [200, 200, 200, 429],
        "{host:?}: ::ffff:a.b.c.d and a.b.c.d are two clients"
    );
}

#[test]
fn identities_name_one_client_each_envoy() {
    identities_name_one_client_each(ProxyHost::Envoy);
}

#[test]
fn identities_name_one_client_each_nginx() {
    identities_name_one_client_each(ProxyHost::Nginx);
}

#[test]
fn identities_name_one_client_each_real_envoy() {
    identities_name_one_client_each(ProxyHost::RealEnvoy);
}

#[test]
fn only_callers_with_the_data_token_reach_the_data_api() {
    let token = "data-token-for-the-chain";
    let chain = Chain::with(Options {
        rules: RULES.to_owned(),
        data_token: Some(token.into()),
        ..Options::default()
    });
    // The filter sends the token: traffic through the proxies is decided as before.
    for _ in 0..3 {
        assert_eq!(http(chain.proxies[0], "GET", "/api/search", &[]).status, 200);
    }
    assert_eq!(http(chain.proxies[1], "GET", "/api/search", &[]).status, 429);

    // A stranger at the node spends nothing, with or without a guess.
    let node = chain.node_ports[0];
    let check = br#"{"identities": {"ip": "9.9.9.9"}, "method": "GET", "path": "/api/search"}"#;
    let lease = br#"{"grants": [{"rule": "search", "identity": "9.9.9.9", "want": 1000}]}"#;
    for auth in [None, Some("Bearer wrong"), Some(token), Some("Bearer ")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        for (method, path, body) in [
            ("POST", "/v1/check", &check[..]),
            ("POST", "/v1/lease", &lease[..]),
            ("GET", "/v1/wait?ms=1", &b""[..]),
            ("GET", "/v1/rules", &b""[..]),
        ] {
            let r = send(node, method, path, &headers, body);
            assert_eq!(r.status, 401, "{auth:?} {path}: {}", r.body);
            assert!(
                r.body.contains("--data-token-file"),
                "the error says what to send: {}",
                r.body
            );
        }
    }
    let unauthenticated = chain.node_metric(0, "sluice_unauthenticated_total").expect("series");
    assert!(unauthenticated >= 16.0, "refusals are counted: {unauthenticated}");
    // With the token a caller is served; health and metrics stay open; admin is elsewhere.
    let bearer = format!("Bearer {token}");
    let r = send(node, "POST", "/v1/check", &[("authorization", &bearer)], check);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("\"allowed\":true"),
        "9.9.9.9 spent nothing before: {}",
        r.body
    );
    assert_eq!(http(node, "GET", "/healthz", &[]).status, 200);
    assert_eq!(
        http(node, "GET", "/v1/admin/rules", &[]).status,
        404,
        "admin is not on the data listener"
    );
    let (k, v) = Chain::bearer();
    assert_eq!(
        http(chain.admin_ports[0], "GET", "/v1/admin/rules", &[(k, &v)]).status,
        200
    );
}
