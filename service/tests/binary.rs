//! The `sluice-service` binary as a user runs it: --help, the example rules, file reloads
//! (a broken file keeps the old rules), graceful shutdown, and the gRPC API on an
//! envoyproxy/ratelimit configuration file.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_testkit::{free_port, wait_for_port, Child, ScratchDir};

/// How long a SIGTERMed service may take before it is SIGKILLed.
const GRACE: Duration = Duration::from_secs(5);

const BIN: &str = env!("CARGO_BIN_EXE_sluice-service");

fn start(args: &[&str]) -> (Child, u16) {
    start_with(args, Stdio::inherit())
}

/// Starts the binary with its stderr (where it logs) sent to `log`.
fn start_with(args: &[&str], log: Stdio) -> (Child, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let child = Child::spawn(
        "sluice-service",
        Command::new(BIN).args(["--listen", &listen]).args(args).stderr(log),
    );
    wait_for_port(port, Duration::from_secs(20));
    (child, port)
}

fn curl(args: &[&str]) -> Vec<u8> {
    Command::new("curl").arg("-s").args(args).output().expect("curl").stdout
}

fn check(port: u16, ip: &str) -> Value {
    let body = json!({"identities": {"ip": ip}, "method": "GET", "path": "/"});
    let out = curl(&[
        "-XPOST",
        &format!("http://127.0.0.1:{port}/v1/check"),
        "-d",
        &body.to_string(),
    ]);
    serde_json::from_slice(&out).unwrap_or_else(|e| panic!("bad answer {:?}: {e}", String::from_utf8_lossy(&out)))
}

/// The value of `sluice_rules_reloads_total{result="error"}` on GET /metrics.
fn reload_errors(port: u16) -> u64 {
    let text = String::from_utf8(curl(&[&format!("http://127.0.0.1:{port}/metrics")])).expect("utf-8 metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(r#"sluice_rules_reloads_total{result="error"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no reload error counter in {text}"))
}

/// Polls `condition` every 50 ms; panics with `what` if it does not hold within 10 s.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn help_explains_every_flag() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--otlp-endpoint",
        "--rules",
        "--store",
        "--admin-listen",
        "--admin-token-file",
        "--data-token-file",
        "--tls-cert",
        "--tls-client-ca",
        "--header-timeout-ms",
        "--max-connections",
        "--max-waits",
        "--ipv6-prefix",
        "--log-format",
        "--store-timeout-ms",
        "--breaker-failures",
        "--rules-poll-ms",
        "--store-prefix",
        "check-rules",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn example_rules_answer_checks() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    let (_child, port) = start(&["--rules", rules]);
    let answers: Vec<bool> = (0..6).map(|_| check(port, "7.7.7.7")["allowed"] == true).collect();
    assert_eq!(
        answers,
        [true, true, true, true, true, false],
        "per-ip admits 5 per 10s"
    );
    let denied = check(port, "7.7.7.7");
    assert_eq!(denied["policy"], "per-ip");
}

/// Containers are configured by environment: every flag is also `SLUICE_<FLAG>`, and a flag
/// given on the command line wins over its variable.
#[test]
fn every_flag_is_also_read_from_a_sluice_environment_variable() {
    let dir = ScratchDir::new("env");
    let token = dir.join("admin-token");
    std::fs::write(&token, "env-admin-token").unwrap();
    let (port, admin) = (free_port(), free_port());
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    let _child = Child::spawn(
        "sluice-service",
        Command::new(BIN)
            .env("SLUICE_LISTEN", "127.0.0.1:1") // overridden by --listen below
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("SLUICE_RULES", rules)
            .env("SLUICE_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
            .env("SLUICE_ADMIN_TOKEN_FILE", &token)
            .env("SLUICE_NODE_NAME", "from-the-environment")
            .env("SLUICE_STORE_BATCHING", "false"),
    );
    wait_for_port(port, Duration::from_secs(20));
    wait_for_port(admin, Duration::from_secs(20));
    assert_eq!(check(port, "8.8.8.8")["policy"], "per-ip", "SLUICE_RULES read");
    let node = curl(&[
        "-H",
        "authorization: Bearer env-admin-token",
        &format!("http://127.0.0.1:{admin}/v1/admin/node"),
    ]);
    let node: Value = serde_json::from_slice(&node).unwrap();
    assert_eq!(node["node"], "from-the-environment", "{node}");
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for var in [
        "SLUICE_STORE",
        "SLUICE_GLOBAL_STORE",
        "SLUICE_RLQS",
        "SLUICE_ADMIN_READ_TOKEN_FILE",
    ] {
        assert!(help.contains(&format!("[env: {var}=")), "--help does not name {var}");
    }
}

#[test]
fn rule_file_changes_are_reloaded_and_broken_files_ignored() {
    let dir = ScratchDir::new("reload");
    let file = dir.join("rules.toml");
    let rule = |limit: u32| {
        format!("[[rule]]\nname = \"r{limit}\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n")
    };
    std::fs::write(&file, rule(1)).unwrap();
    let (_child, port) = start(&["--rules", file.to_str().unwrap()]);
    assert_eq!(check(port, "a")["policy"], "r1");

    std::fs::write(&file, rule(2)).unwrap();
    wait_until("file change not picked up", || check(port, "b")["policy"] == "r2");
    let errors = reload_errors(port);
    std::fs::write(&file, "[[rule]]\nname = \"broken\"\nby = \"ip\"\nlimit = \n").unwrap();
    // Only once the node has read and refused the broken file does "old rules kept" mean anything.
    wait_until("broken file never refused", || reload_errors(port) > errors);
    assert_eq!(check(port, "c")["policy"], "r2", "a broken file replaced the rules");
}

/// No silent configuration: a SLUICE_* variable that no flag reads (a misspelt name, a secret
/// given inline where only its `_FILE` form exists) stops the node at start with one line
/// naming it, before it listens; the node never starts open with the setting ignored.
#[test]
fn an_unknown_or_inline_secret_variable_stops_the_node_with_one_line() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    for (name, said) in [
        ("SLUICE_DATA_TOKEN", "set SLUICE_DATA_TOKEN_FILE to its path"),
        ("SLUICE_STORE_TIMOUT_MS", "did you mean SLUICE_STORE_TIMEOUT_MS?"),
    ] {
        let port = free_port();
        let dir = ScratchDir::new("environment");
        let log = dir.join("stderr");
        let mut node = Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--rules", rules])
            .env(name, "a-value")
            .env("RUST_BACKTRACE", "1")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = node.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let _ = node.kill();
                panic!("the node started with {name} set, ignoring it");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(name) && stderr.contains(said), "{name}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            !stderr.contains("a-value"),
            "the value, maybe a secret, is never printed: {stderr}"
        );
    }
}

#[test]
fn sigterm_stops_gracefully_and_bad_flags_explain_themselves() {
    let dir = ScratchDir::new("shutdown");
    let log = dir.join("service.log");
    let file = std::fs::File::create(&log).unwrap();
    let (mut child, _port) = start_with(&["--log-format", "json"], file.into());
    let stopped = child.stop(GRACE).expect("the service was running");
    assert!(!stopped.killed, "still running {GRACE:?} after SIGTERM: {stopped:?}");
    assert!(
        stopped.status.success(),
        "SIGTERM must end in exit status 0: {stopped:?}"
    );
    let messages: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["fields"]["message"].as_str().map(str::to_owned))
        .collect();
    let at = |m: &str| messages.iter().position(|x| x.starts_with(m));
    let (shutting_down, ended) = (at("shutting down"), at("stopped"));
    assert!(
        shutting_down.is_some() && ended > shutting_down,
        "no \"shutting down\" then \"stopped\" in the log: {messages:?}"
    );
    // A start-up error is one line naming the cause, not a stack trace, even where the
    // environment asks Rust for backtraces.
    let out = Command::new(BIN)
        .args(["--rules", "/nonexistent/rules.toml"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot read /nonexistent/rules.toml"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn the_grpc_api_serves_an_envoyproxy_ratelimit_file_and_stops_gracefully() {
    use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use sluice_service::grpc::envoy::service::ratelimit::v3::RateLimitRequest;

    let grpc_port = free_port();
    let yaml = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ratelimit.yaml");
    let grpc = format!("127.0.0.1:{grpc_port}");
    let (mut child, _port) = start(&["--rules", yaml, "--grpc-listen", &grpc]);
    wait_for_port(grpc_port, Duration::from_secs(20));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let codes: Vec<i32> = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.unwrap();
        let mut codes = Vec::new();
        for address in ["198.51.100.1", "203.0.113.7"] {
            let request = RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "remote_address".into(),
                        value: address.into(),
                    }],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 0,
            };
            codes.push(
                client
                    .should_rate_limit(request)
                    .await
                    .unwrap()
                    .into_inner()
                    .overall_code,
            );
        }
        codes
    });
    assert_eq!(codes, [1, 2], "OK for an address, OVER_LIMIT for the blocked one");
    let stopped = child.stop(GRACE).expect("the service was running");
    assert!(stopped.status.success() && !stopped.killed, "{stopped:?}");

    let out = Command::new(BIN).args(["--descriptors", yaml]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --grpc-listen"));
}

/// envoyproxy/ratelimit YAML naming `limit` requests per hour for `key`.
fn yaml_rules(limit: u32) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: {limit}\n"
    )
}

/// The limit the gRPC API answers a descriptor `k=v` of domain `d` with.
fn grpc_limit(runtime: &tokio::runtime::Runtime, grpc: &str) -> u32 {
    use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use sluice_service::grpc::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use sluice_service::grpc::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use sluice_service::grpc::envoy::service::ratelimit::v3::RateLimitRequest;
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.unwrap();
        let request = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        let answer = client.should_rate_limit(request).await.unwrap().into_inner();
        answer.statuses[0]
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit)
    })
}

/// Issue 40: an envoyproxy/ratelimit YAML `--rules` file reloads as a TOML one does —
/// edited in place, renamed over, its ConfigMap symlink swapped — and a broken, empty or
/// deleted file keeps the limits in force.
#[test]
fn a_yaml_rules_file_reloads_on_every_kind_of_edit() {
    let dir = ScratchDir::new("yaml-reload");
    // A ConfigMap's layout: rl.yaml -> ..data/rl.yaml, ..data -> v1.
    std::fs::create_dir(dir.join("v1")).unwrap();
    std::fs::write(dir.join("v1/rl.yaml"), yaml_rules(1)).unwrap();
    std::os::unix::fs::symlink("v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rl.yaml", dir.join("rl.yaml")).unwrap();
    let log = dir.join("service.log");
    let grpc = format!("127.0.0.1:{}", free_port());
    let (mut child, port) = start_with(
        &[
            "--rules",
            dir.join("rl.yaml").to_str().unwrap(),
            "--grpc-listen",
            &grpc,
            "--log-format",
            "json",
        ],
        std::fs::File::create(&log).unwrap().into(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limit = || grpc_limit(&runtime, &grpc);
    assert_eq!(limit(), 1);

    std::fs::write(dir.join("v1/rl.yaml"), yaml_rules(2)).unwrap();
    wait_until("an edit in place not picked up", || limit() == 2);
    std::fs::write(dir.join("v1/next.yaml"), yaml_rules(3)).unwrap();
    std::fs::rename(dir.join("v1/next.yaml"), dir.join("v1/rl.yaml")).unwrap();
    wait_until("a file renamed over not picked up", || limit() == 3);
    std::fs::create_dir(dir.join("v2")).unwrap();
    std::fs::write(dir.join("v2/rl.yaml"), yaml_rules(4)).unwrap();
    std::os::unix::fs::symlink("v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    wait_until("a symlink swap not picked up", || limit() == 4);

    for (what, text) in [("broken", "domain: d\ndescriptors:\n  - key: [\n"), ("empty", "")] {
        let errors = reload_errors(port);
        std::fs::write(dir.join("v2/rl.yaml"), text).unwrap();
        wait_until(&format!("a {what} file never refused"), || reload_errors(port) > errors);
        assert_eq!(limit(), 4, "a {what} file replaced the limits");
    }
    std::fs::remove_file(dir.join("v2/rl.yaml")).unwrap();
    std::thread::sleep(Duration::from_millis(1_100)); // two looks at it
    assert_eq!(limit(), 4, "a deleted file replaced the limits");
    child.stop(GRACE);
    let text = std::fs::read_to_string(&log).unwrap();
    let reloads: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["fields"].clone())
        .filter(|f| f["message"] == "rules reloaded")
        .collect();
    assert_eq!(reloads.len(), 3, "{text}");
    assert_eq!(
        (&reloads[2]["rules"], &reloads[2]["version"]),
        (&json!(1), &json!(4)),
        "{text}"
    );
    assert!(
        text.contains("at line 3"),
        "the broken file's error names no line: {text}"
    );
    assert!(text.contains("holds no rule") && text.contains("is gone"), "{text}");
    assert!(!text.contains("no --rules file"), "{text}");
}

/// `sluice-service check-rules FILE`: (exit status, stdout, stderr).
fn check_rules(file: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(BIN).arg("check-rules").arg(file).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Issue 40: `check-rules` for CI pipelines — a summary and 0 for a good file; every
/// problem with its line and 1 for a bad one, semantic problems included.
#[test]
fn check_rules_names_every_problem_and_its_line() {
    let examples = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples"));
    let (ok, out, _) = check_rules(&examples.join("rules.toml"));
    assert!(ok && out.ends_with(": valid, 8 rules\n"), "{out}");
    let (ok, out, _) = check_rules(&examples.join("ratelimit.yaml"));
    assert!(ok && out.ends_with(": valid, 5 descriptor limits\n"), "{out}");

    let dir = ScratchDir::new("check-rules");
    let rule = |name: &str, algorithm: &str, limit: u32| {
        format!(
            "[[rule]]\nname = \"{name}\"\nby = \"ip\"\nalgorithm = \"{algorithm}\"\nlimit = {limit}\nwindow = \"1m\"\n"
        )
    };
    let cases: [(&str, String, &[&str]); 5] = [
        ("syntax.toml", format!("{}limit = \n", rule("a", "gcra", 1)), &["line 7:"]),
        (
            // Lines 5 (zero limit), 10 (unknown algorithm), 14 (a second "a").
            "semantic.toml",
            format!("{}{}{}", rule("a", "gcra", 0), rule("b", "gcrb", 1), rule("a", "gcra", 1)),
            &["line 5: rule \"a\": field limit", "line 10: rule \"b\": field algorithm", "line 14: rule \"a\": field name"],
        ),
        (
            "syntax.yaml",
            "domain: d\ndescriptors:\n  - key: [\n".into(),
            &["line 3:"],
        ),
        (
            "unit.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n".into(),
            &["line 5:", "fortnight"],
        ),
        (
            // Lines 8 (a limit without a unit) and 11 (the same key and value twice).
            "tree.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: a\n    value: y\n    descriptors:\n      - key: b\n        rate_limit:\n          requests_per_unit: 3\n  - key: a\n    value: x\n".into(),
            &["line 8:", "d.a_y.b: rate_limit has no unit", "line 11:", "d.a_x: the same key and value appear twice"],
        ),
    ];
    for (name, text, wanted) in cases {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let (ok, _, err) = check_rules(&file);
        assert!(!ok, "{name} passed");
        for w in wanted {
            assert!(err.contains(w), "{name}: no {w:?} in {err}");
        }
    }
}

#[test]
fn a_store_password_never_reaches_the_logs_or_the_errors() {
    let server = sluice_testkit::RedisServer::start_with(
        &sluice_testkit::RedisOptions::default().with_user("sluice", "the-right-one"),
    );
    let dir = ScratchDir::new("store-password");
    let log = dir.join("service.log");
    let file = std::fs::File::create(&log).unwrap();
    let url = format!("redis://sluice:hunter2@127.0.0.1:{}", server.port());
    let (mut child, port) = start_with(&["--store", &url, "--store-timeout-ms", "200"], file.into());
    let ready = || curl(&[&format!("http://127.0.0.1:{port}/readyz")]);
    wait_until("/readyz never said why the login failed", || {
        String::from_utf8_lossy(&ready()).contains("authentication failed")
    });
    let answer = String::from_utf8_lossy(&ready()).into_owned();
    child.stop(GRACE);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("redis://sluice:***@127.0.0.1"), "{text}");
    assert!(
        !text.contains("hunter2") && !answer.contains("hunter2"),
        "{text}\n{answer}"
    );

    // A malformed address is refused at start, its password hidden in the error too.
    let out = Command::new(BIN)
        .args(["--store", "redis://sluice:hunter2@host:port"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is not HOST:PORT"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// `explain` prints what a client sent with its hidden characters written out: an identity
/// ending in a right-to-left override cannot read as another file name, nor reorder the
/// line after it (issue 53).
#[test]
fn explain_writes_out_hidden_characters() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");
    let out = Command::new(BIN)
        .args(["explain", "--rules", rules, "--path", "/search", "--ip", "198.51.100.7"])
        .args(["--identity", "user=\u{202E}gnp.exe"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(printed.contains("identity user: \\u{202e}gnp.exe"), "{printed}");
    assert!(
        !printed.contains('\u{202E}'),
        "the override itself is never printed: {printed}"
    );
}
