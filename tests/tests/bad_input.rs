//! The whole chain fed bad input: malformed and oversized headers, a flood of distinct
//! client IPs, malformed check bodies, admin calls without the token, a rules file broken
//! mid-run. Nothing panics, nothing is lost, and memory stays bounded.

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_tests::chain::{Chain, Options, ProxyHost, FILTER, RULES};
use sluice_tests::http::{http, raw, send, send_bytes};

#[test]
fn malformed_and_oversized_headers_are_answered_and_the_proxy_goes_on() {
    let mut chain = Chain::with(Options {
        rules: RULES.replace("limit     = 10", "limit     = 1000"),
        trusted_hops: 1,
        ..Options::default()
    });
    let long_key = "k".repeat(10_000);
    let commas = ",".repeat(8_000);
    let many_hops = (0..500)
        .map(|i| format!("10.0.{}.{}", i / 250, i % 250))
        .collect::<Vec<_>>()
        .join(", ");
    // Odd but well-formed: the filter decides, well within the limits, so each passes.
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("xff not an address", vec![("x-forwarded-for", "not-an-ip")]),
        ("xff empty", vec![("x-forwarded-for", "")]),
        ("xff only commas", vec![("x-forwarded-for", &commas)]),
        ("xff 500 hops", vec![("x-forwarded-for", &many_hops)]),
        (
            "xff ipv6 and port",
            vec![("x-forwarded-for", "[2001:db8::1]:443, 2001:db8::2")],
        ),
        ("api key of 10 kB", vec![("x-api-key", &long_key)]),
        ("api key of spaces", vec![("x-api-key", "   ")]),
        ("user id with quotes", vec![("x-user-id", "\"};{\\\"")]),
        ("tier unknown", vec![("x-tier", "platinum")]),
    ];
    for (what, headers) in &cases {
        let r = http(chain.proxies[0], "GET", "/api/x", headers);
        assert_eq!(r.status, 200, "{what}: {}", r.body);
    }
    // Bytes no correct client sends: each gets a status line, never a silent close.
    let garbage: [(&[u8], u16); 6] = [
        (b"GARBAGE\r\n\r\n", 400),
        // obs-text in a value is legal on the wire: it reaches the filter, which decides.
        (
            b"GET /x HTTP/1.1\r\nhost: a\r\nx-api-key: \xff\xfe\r\nconnection: close\r\n\r\n",
            200,
        ),
        (
            b"GET /x HTTP/1.1\r\nhost: a\r\nx-forwarded-for: 1.2.3.4\x00evil\r\nconnection: close\r\n\r\n",
            400,
        ),
        (
            b"GET /x HTTP/1.1\r\nhost: a\r\nx-tier: platinum\x7f\r\nconnection: close\r\n\r\n",
            400,
        ),
        (
            b"GET /x HTTP/1.1\r\nhost: a\r\nbad header name: 1\r\nconnection: close\r\n\r\n",
            400,
        ),
        (
            b"GET /x HTTP/1.1\r\nhost: a\r\ncontent-length: nope\r\nconnection: close\r\n\r\n",
            400,
        ),
    ];
    for (bytes, expected) in garbage {
        let r = raw(chain.proxies[1], bytes);
        assert_eq!(r.status, expected, "{:?}: {}", String::from_utf8_lossy(bytes), r.body);
    }
    // A client that leaves in the middle of its headers.
    abandon(chain.proxies[1], b"GET /x HTTP/1.1\r\nhost: a\r\nx-forwarded-for: 1.2.");
    // 100 kB of headers in 100 fields: over the proxy's field count, a 431.
    let big = "v".repeat(1_000);
    let many: Vec<(String, &str)> = (0..100).map(|i| (format!("x-h{i}"), big.as_str())).collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        raw(chain.proxies[0], &request_bytes(&refs)).status,
        431,
        "100 kB of headers"
    );
    // Both proxies and both nodes are still up and deciding.
    chain.assert_proxies_up();
    chain.assert_nodes_up();
    for i in 0..2 {
        assert_eq!(
            chain.proxy_stats(i)["calls_failed"].as_u64(),
            Some(0),
            "no check call failed"
        );
    }
}

/// Generous per IP; 3 a minute per user and per API key.
const PER_IDENTITY: &str = r#"
[[rule]]
name      = "per-ip"
by        = "ip"
algorithm = "sliding_window_log"
limit     = 1000
window    = "1m"

[[rule]]
name      = "per-user"
by        = "user"
algorithm = "sliding_window_log"
limit     = 3
window    = "1m"

[[rule]]
name      = "per-key"
by        = "api_key"
algorithm = "sliding_window_log"
limit     = 3
window    = "1m"
"#;

/// GET /api through `port` with byte-valued headers; the status and the policy header.
fn get_bytes(port: u16, headers: &[(&str, &[u8])]) -> (u16, String) {
    let r = send_bytes(port, "GET", "/api", headers, b"");
    (r.status, r.header("ratelimit-policy").unwrap_or_default().to_owned())
}

/// Whether a 429 came from the filter's local bucket.
fn local_denial(answer: &(u16, String)) -> bool {
    answer.0 == 429 && answer.1.starts_with("\"local\"")
}

#[test]
fn what_a_client_sends_cannot_open_the_filters_breaker_on_envoy_or_nginx() {
    // A breaker that opens after 3 failures: were any of the requests below a failure of the
    // check service, it would open, and the fallback (50/s) would admit what the service
    // denies.
    for host in [ProxyHost::Envoy, ProxyHost::Nginx] {
        let mut chain = Chain::with(Options {
            rules: PER_IDENTITY.to_owned(),
            filter: FILTER.replace("\"failures\": 1000", "\"failures\": 3"),
            host,
            trusted_hops: 1,
            ..Options::default()
        });
        let proxy = chain.proxies[0];
        let long_method = "A".repeat(40);
        let long_path = format!("/{}", "p".repeat(9_000));
        let long_user = "u".repeat(1_000);
        let requests: [(&str, &str, &[u8], &str); 5] = [
            (long_method.as_str(), "/api", b"", ""),
            ("PROPFIND", long_path.as_str(), b"", ""),
            ("GET", "/api", long_user.as_bytes(), ""),
            ("GET", "/api", b"\xff\xfe\x01", ""),
            ("DELETE", "/api?x=\u{1}", b"", "caf\u{e9}"),
        ];
        // Each kind three times in a row: three consecutive failures would open the breaker.
        for (i, (method, path, user, key)) in requests.iter().enumerate() {
            for round in 0..3 {
                let ip = format!("192.0.2.{}", 10 + round * 10 + i);
                let mut headers: Vec<(&str, &[u8])> = vec![("x-forwarded-for", ip.as_bytes())];
                if !user.is_empty() {
                    headers.push(("x-user-id", user));
                }
                if !key.is_empty() {
                    headers.push(("x-api-key", key.as_bytes()));
                }
                let r = send_bytes(proxy, method, path, &headers, b"");
                assert!(r.status < 500, "{host:?}: {method} {:.40}: {}", path, r.status);
            }
        }
        // The service still decides: a user is held to its rule's 3, named in the 429.
        let steady: &[(&str, &[u8])] = &[("x-user-id", b"steady"), ("x-forwarded-for", b"192.0.2.99")];
        let answers: Vec<(u16, String)> = (0..4).map(|_| get_bytes(proxy, steady)).collect();
        let codes: Vec<u16> = answers.iter().map(|a| a.0).collect();
        assert_eq!(codes, [200, 200, 200, 429], "{host:?}: {answers:?}");
        assert!(answers[3].1.starts_with("\"per-user\""), "{host:?}: {answers:?}");
        chain.assert_proxies_up();
    }
}

#[test]
fn header_values_that_are_not_utf8_reach_the_filter_and_are_limited_as_their_own_identities() {
    // Local buckets of 20 refilling at 1/s: a client that spent its bucket is held by the
    // filter alone, as long as the filter keeps its state.
    let mut chain = Chain::with(Options {
        rules: PER_IDENTITY.to_owned(),
        filter: FILTER.replace(
            "\"rate_per_s\": 1000, \"burst\": 1000",
            "\"rate_per_s\": 1, \"burst\": 20",
        ),
        trusted_hops: 1,
        ..Options::default()
    });
    let proxy = chain.proxies[0]; // the local buckets live in this proxy's VM
    let limited: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.7")];
    let mut spent = 0;
    while !local_denial(&get_bytes(proxy, limited)) {
        spent += 1;
        assert!(spent <= 100, "the local bucket never ran out");
    }
    let limited_at = Instant::now();

    // Each non-UTF-8 user and key is an identity of its own: limited at 3, not bypassing
    // the rule, and distinct from a value differing in one byte.
    for (header, value, other, rule) in [
        ("x-user-id", &b"\xff\xfe"[..], &b"\xff\xfd"[..], "per-user"),
        ("x-api-key", b"caf\xe9", b"caf\xe8", "per-key"),
    ] {
        let headers: &[(&str, &[u8])] = &[(header, value), ("x-forwarded-for", b"192.0.2.1")];
        let answers: Vec<(u16, String)> = (0..4).map(|_| get_bytes(proxy, headers)).collect();
        let codes: Vec<u16> = answers.iter().map(|a| a.0).collect();
        assert_eq!(codes, [200, 200, 200, 429], "{header}: {answers:?}");
        assert!(
            answers[3].1.starts_with(&format!("\"{rule}\"")),
            "{header}: {answers:?}"
        );
        let (status, _) = get_bytes(proxy, &[(header, other), ("x-forwarded-for", b"192.0.2.1")]);
        assert_eq!(status, 200, "{header}: a value one byte apart is another identity");
    }
    // Bytes in the forwarding header: left of the trusted hop they change nothing (the
    // limited client stays limited); in the client's entry, the address is not an IP and
    // the connection's is used.
    let junk_left = get_bytes(proxy, &[("x-forwarded-for", b"\xfe\xff, 198.51.100.7")]);
    assert!(local_denial(&junk_left), "{junk_left:?}");
    let junk_entry = get_bytes(proxy, &[("x-forwarded-for", b"198.51.100.7\xff")]);
    assert_eq!(junk_entry.0, 200, "{junk_entry:?}");

    // The filter kept its buckets through all of it: the limited client gets no more than
    // what its bucket refilled since (1/s), where a fresh bucket would pass all 15.
    let allowed = (0..15).filter(|_| get_bytes(proxy, limited).0 == 200).count();
    let refilled = limited_at.elapsed().as_secs_f64().ceil() as usize;
    assert!(
        allowed <= refilled,
        "the limited client passed {allowed} times; its bucket refilled {refilled} tokens"
    );
    chain.assert_proxies_up();
    chain.assert_nodes_up();
}

/// Sends `bytes` and hangs up.
fn abandon(port: u16, bytes: &[u8]) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.write_all(bytes).expect("send");
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn request_bytes(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut s = String::from("GET /x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// Runs `sluice-load` against proxy `port`: `requests` distinct client IPs from `offset`
/// on, offered at 10,000/s (the benchmark's rate; a debug chain on a loaded machine takes
/// longer, and the count, not the rate, is what the test needs); returns its report.
fn flood(port: u16, offset: u64, requests: u64) -> String {
    let out = Command::new(sluice_tests::chain::binary("sluice-load"))
        .args(["--target", &format!("http://127.0.0.1:{port}"), "--mode", "get"])
        .args(["--rate", "10000", "--connections", "32"])
        .args(["--requests", &requests.to_string(), "--duration", "600s"])
        .args(["--keys", "16777216", "--key-offset", &offset.to_string()])
        .output()
        .expect("cannot run sluice-load");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sluice-load failed: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

fn count(report: &str, prefix: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} in {report}"))
}

/// Local buckets the flood test caps the filter at.
const MAX_KEYS: u64 = 2_000;

#[test]
fn floods_of_new_client_ips_past_the_key_cap_leave_filter_and_service_memory_bounded() {
    // Local buckets capped at 2,000 clients; each flood brings 4 times as many new ones.
    let chain = Chain::with(Options {
        rules: RULES.replace("limit     = 10", "limit     = 1000"),
        filter: FILTER.replace("\"max_keys\": 10000", &format!("\"max_keys\": {MAX_KEYS}")),
        trusted_hops: 1,
        // The nodes' fallback buckets (seeded from each store answer, for a failover) capped
        // alike.
        node_args: vec!["--max-keys", "2000"],
        ..Options::default()
    });
    let vm = || chain.proxy_stats(0)["vm_memory_bytes"].as_u64().expect("vm memory");
    // Read once the allocators have given back what the flood's requests used in passing.
    let service = || {
        std::thread::sleep(Duration::from_secs(2));
        Chain::rss_bytes(&chain.nodes[0]) + Chain::rss_bytes(&chain.nodes[1])
    };

    // Warm-up: the first flood fills the caps and the allocators' pools.
    let warm = flood(chain.proxies[0], 0, 4 * MAX_KEYS);
    let (vm_warm, service_warm) = (vm(), service());
    let start = Instant::now();
    let second = flood(chain.proxies[0], 8_000_000, 4 * MAX_KEYS);
    let elapsed = start.elapsed().as_secs_f64();
    let (vm_after, service_after) = (vm(), service());

    let sent = count(&second, "requests");
    let kib = |b: u64| b / 1024;
    println!(
        "flood of new client IPs: warm-up {} requests; measured {sent} distinct IPs in {elapsed:.1} s \
         ({:.0}/s); filter VM {} → {} KiB; service RSS (2 nodes) {} → {} KiB",
        count(&warm, "requests"),
        sent as f64 / elapsed,
        kib(vm_warm),
        kib(vm_after),
        kib(service_warm),
        kib(service_after)
    );
    assert_eq!(
        count(&second, "status        2xx"),
        sent,
        "every new client is allowed: {second}"
    );
    assert_eq!(sent, 4 * MAX_KEYS, "the whole flood was sent: {second}");
    // Bounded per new client: the filter's map holds at most MAX_KEYS buckets. Measured
    // growth is 0-64 KiB for the filter's VM, 64 bytes a client allowed for allocator noise.
    let per_client = 64 * sent;
    assert!(
        vm_after.saturating_sub(vm_warm) <= per_client,
        "filter VM grew {vm_warm} → {vm_after} for {sent} new clients"
    );
    // Each node's fallback buckets (what the store last said of each key it decided, for a
    // failover) hold at most its --max-keys: counted by the node itself. (Its RSS, read
    // before, moved by allocator noise alone: it grew 130-390 bytes a client beside other
    // tests, and 53 with the cap taken away.)
    for node in 0..2 {
        let keys = chain.node_metric(node, "sluice_fallback_keys").expect("fallback keys");
        assert!(
            (1.0..=MAX_KEYS as f64).contains(&keys),
            "node {node}'s fallback holds {keys} keys after {sent} new clients (at most {MAX_KEYS})"
        );
    }
}

/// POSTs `body` to `/v1/check` of node 0.
fn check(chain: &Chain, body: &[u8]) -> (u16, serde_json::Value) {
    let r = send(
        chain.node_ports[0],
        "POST",
        "/v1/check",
        &[("content-type", "application/json")],
        body,
    );
    let v = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("answer is not JSON ({e}): {:?}", r.body));
    (r.status, v)
}

#[test]
fn malformed_check_bodies_get_a_400_that_names_the_problem() {
    let chain = Chain::start();
    let long = format!(
        r#"{{"identities": {{"ip": "{}"}}, "method": "GET", "path": "/"}}"#,
        "1".repeat(300)
    );
    let huge = format!(
        r#"{{"identities": {{"ip": "{}"}}, "method": "GET", "path": "/"}}"#,
        "1".repeat(20_000)
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", b"{\"identities\": {".to_vec(), "found the end"),
        ("not an object", b"[1, 2]".to_vec(), "JSON object"),
        ("not JSON", b"hello".to_vec(), "JSON object"),
        ("empty", Vec::new(), "found the end"),
        (
            "identities a number",
            br#"{"identities": 5, "method": "GET", "path": "/"}"#.to_vec(),
            "identities",
        ),
        (
            "unknown field",
            br#"{"identities": {}, "method": "GET", "path": "/", "weight": 2}"#.to_vec(),
            "weight",
        ),
        (
            "cost absurd",
            br#"{"identities": {}, "method": "GET", "path": "/", "cost": 99999999999}"#.to_vec(),
            "cost",
        ),
        (
            "cost negative",
            br#"{"identities": {}, "method": "GET", "path": "/", "cost": -1}"#.to_vec(),
            "cost",
        ),
        ("identity too long", long.into_bytes(), "256"),
        ("not UTF-8", b"{\"identities\": {\"ip\": \"\xff\"}}".to_vec(), "UTF-8"),
    ];
    for (what, body, names) in &cases {
        let (status, v) = check(&chain, body);
        assert_eq!(status, 400, "{what}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(names),
            "{what}: the error {error:?} should name {names:?}"
        );
    }
    let (status, v) = check(&chain, huge.as_bytes());
    assert_eq!(status, 413, "{v}");
    // The node is fine and decides as before.
    let (status, v) = check(
        &chain,
        br#"{"identities": {"ip": "192.0.2.1"}, "method": "GET", "path": "/"}"#,
    );
    assert_eq!(
        (status, v["allowed"].as_bool(), v["limit"].as_u64()),
        (200, Some(true), Some(10))
    );
}

#[test]
fn admin_calls_without_the_right_token_are_401_and_change_nothing() {
    let chain = Chain::start();
    let port = chain.admin_ports[1];
    let new_rules = RULES.replace("limit     = 10", "limit     = 1");
    let override_body =
        br#"{"rule": "global-ip", "identity": "127.0.0.1", "limit": 5, "until": "2099-01-01T00:00:00Z"}"#;
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer "),
        Some("Basic Y2hhaW4tYWRtaW4tdG9rZW4="),
    ] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let calls = [
            send(port, "GET", "/v1/admin/rules", &headers, b""),
            send(port, "PUT", "/v1/admin/rules", &headers, new_rules.as_bytes()),
            send(port, "POST", "/v1/admin/overrides", &headers, override_body),
            send(
                port,
                "DELETE",
                "/v1/admin/overrides?rule=global-ip&identity=1",
                &headers,
                b"",
            ),
            send(port, "GET", "/v1/admin/violations", &headers, b""),
        ];
        for r in &calls {
            assert_eq!(r.status, 401, "{auth:?}: {}", r.body);
            assert!(
                r.body.contains("token"),
                "{auth:?}: the error says what is missing: {}",
                r.body
            );
        }
    }
    // Nothing changed: ten requests still pass.
    std::thread::sleep(Duration::from_millis(600));
    let codes: Vec<u16> = (0..11)
        .map(|i| http(chain.proxies[i % 2], "GET", "/", &[]).status)
        .collect();
    assert_eq!(codes.iter().filter(|&&s| s == 200).count(), 10, "{codes:?}");
    // And the right token works.
    let (k, v) = Chain::bearer();
    let r = send(port, "GET", "/v1/admin/rules", &[(k, &v)], b"");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("global-ip"), "{}", r.body);
}

#[test]
fn a_rules_file_broken_mid_run_keeps_the_old_rules_until_it_is_fixed() {
    // How long a node may take to notice a saved file: a liveness bound (no figure is
    // promised), generous for a loaded machine.
    let notice = Duration::from_secs(10);
    let mut chain = Chain::start();
    let reloads = |result: &str| chain.nodes_metric(&format!("sluice_rules_reloads_total{{result=\"{result}\"}}"));
    let file = chain.rules_file();
    for broken in [
        "[[rule]]\nname = \"half\nlimit = ",                                 // malformed TOML
        &RULES.replace("limit     = 10", "limit     = -5"),                  // absurd number
        &RULES.replace("window    = \"1m\"", "window    = \"1 fortnight\""), // bad window
        &RULES.replace("by        = \"ip\"", "by        = \"ip\"\ncolour = \"red\""), // unknown field
    ] {
        let errors = reloads("error");
        std::fs::write(&file, broken).expect("write rules");
        let started = Instant::now();
        // Each node notices and refuses it.
        while reloads("error") < errors + 2.0 {
            assert!(started.elapsed() < notice, "{broken:?} was not noticed");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The old rules stay: the same limit answers.
        let r = http(chain.proxies[0], "GET", "/", &[]);
        assert_eq!(r.header("x-ratelimit-limit"), Some("10"), "after {broken:?}");
    }
    chain.assert_nodes_up();
    // Fixed with a new limit: it takes effect.
    std::fs::write(&file, RULES.replace("limit     = 10", "limit     = 50")).expect("write rules");
    let started = Instant::now();
    loop {
        let r = http(chain.proxies[1], "GET", "/", &[]);
        if r.header("x-ratelimit-limit") == Some("50") {
            break;
        }
        assert!(started.elapsed() < notice, "the fixed file was not loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn check_config_runs_the_filters_own_validation_like_nginx_t_cannot() {
    let dir = std::env::temp_dir().join(format!("sluice-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let check_on = |config: &str, flavor: &str| {
        let file = dir.join("filter.json");
        std::fs::write(&file, config).expect("write config");
        let out = Command::new(sluice_tests::chain::binary("sluice-harness"))
            .arg("check-config")
            .arg("--wasm")
            .arg(sluice_tests::chain::filter_wasm())
            .arg("--config")
            .arg(&file)
            .args(["--host-flavor", flavor])
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("run sluice-harness");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let check = |config: &str| check_on(config, "envoy");
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/filter.json"))
        .expect("examples/filter.json");
    let (ok, stderr) = check(&example);
    assert!(ok, "the example configuration is refused: {stderr}");
    for (config, named) in [
        (r#"{"check": {"cluster": "c", "timeout_ms": 0}}"#, "check.timeout_ms"),
        (
            r#"{"check": {"cluster": "c"}, "failure": {"mode": "maybe"}}"#,
            "failure.mode: \"maybe\" is not one of open or closed",
        ),
        (
            r#"{"check": {"cluster": "c"}, "local": {"by": "ip", "rate_per_s": -5}}"#,
            "local.rate_per_s: expected an unsigned integer, found -5",
        ),
        ("not json", "configuration refused"),
    ] {
        let (ok, stderr) = check(config);
        assert!(!ok, "{config} accepted");
        assert!(
            stderr.contains(named),
            "{config}: the error does not name {named:?}: {stderr}"
        );
        // One line saying what is wrong, not a stack trace, however the environment is set.
        assert!(
            stderr.contains("error: ") && !stderr.contains("backtrace"),
            "{config}: {stderr}"
        );
    }
    // A check address Nginx cannot dial: the filter's own check passes, the host traps on
    // the first request (measured in a real Nginx: every request a 500). Envoy would take it
    // as a cluster name.
    let bad_port = r#"{"check": {"cluster": "127.0.0.1:66000"}}"#;
    let (ok, stderr) = check_on(bad_port, "nginx");
    assert!(!ok && stderr.contains("invalid port"), "{stderr}");
    let (ok, stderr) = check_on(bad_port, "envoy");
    assert!(ok, "{stderr}");
    let (ok, stderr) = check_on(r#"{"check": {"cluster": "127.0.0.1:8081"}}"#, "nginx");
    assert!(ok, "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `check-config --nginx-conf` runs the filter in an Nginx with the zones that nginx.conf
/// declares (issue 65): `share: process` without an `shm_kv sluice` zone is refused before a
/// deploy (in Nginx it takes every worker down), a configuration that does not say `share`
/// is accepted there with the filter's one error naming the zone, and examples/nginx.conf
/// has the zone.
#[test]
fn check_config_told_the_nginx_conf_finds_the_zone_missing() {
    let dir = std::env::temp_dir().join(format!("sluice-check-zone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let no_zone = dir.join("nginx.conf");
    std::fs::write(
        &no_zone,
        "events {}\nwasm { module sluice /x.wasm; } # shm_kv sluice 4m;\n",
    )
    .expect("nginx.conf");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/nginx.conf");
    let check = |config: &str, nginx_conf: &std::path::Path| {
        let file = dir.join("filter.json");
        std::fs::write(&file, config).expect("write config");
        let out = Command::new(sluice_tests::chain::binary("sluice-harness"))
            .args(["check-config", "--wasm"])
            .arg(sluice_tests::chain::filter_wasm())
            .arg("--config")
            .arg(&file)
            .arg("--nginx-conf")
            .arg(nginx_conf)
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("run sluice-harness");
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), said)
    };
    let process = r#"{"check": {"cluster": "127.0.0.1:8081"}, "share": "process"}"#;
    let unsaid = r#"{"check": {"cluster": "127.0.0.1:8081"}}"#;
    let (ok, said) = check(process, &no_zone);
    assert!(!ok && said.contains("shm_kv"), "{said}");
    let (ok, said) = check(unsaid, &no_zone);
    assert!(ok && said.contains("shm_kv sluice 32m eviction=none;"), "{said}");
    let (ok, said) = check(process, std::path::Path::new(example));
    assert!(ok && !said.contains("shm_kv"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}
