//! The `sluice-service` binary as a user runs it: --help, the example rules, file reloads
//! (a broken file keeps the old rules) and graceful shutdown.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_testkit::{free_port, wait_for_port, Child};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-service");

fn start(args: &[&str]) -> (Child, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let child = Child::spawn(
        "sluice-service",
        Command::new(BIN).args(["--listen", &listen]).args(args),
    );
    wait_for_port(port, Duration::from_secs(20));
    (child, port)
}

fn check(port: u16, ip: &str) -> Value {
    let body = json!({"identities": {"ip": ip}, "method": "GET", "path": "/"});
    let out = Command::new("curl")
        .args([
            "-s",
            "-XPOST",
            &format!("http://127.0.0.1:{port}/v1/check"),
            "-d",
            &body.to_string(),
        ])
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad answer {:?}: {e}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn help_explains_every_flag() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--rules",
        "--store",
        "--admin-token-file",
        "--log-format",
        "--store-timeout-ms",
        "--breaker-failures",
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

#[test]
fn rule_file_changes_are_reloaded_and_broken_files_ignored() {
    let dir = std::env::temp_dir().join(format!("sluice-reload-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    let rule = |limit: u32| {
        format!("[[rule]]\nname = \"r{limit}\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n")
    };
    std::fs::write(&file, rule(1)).unwrap();
    let (_child, port) = start(&["--rules", file.to_str().unwrap()]);
    assert_eq!(check(port, "a")["policy"], "r1");

    std::fs::write(&file, rule(2)).unwrap();
    let started = Instant::now();
    while check(port, "b")["policy"] != "r2" {
        assert!(started.elapsed() < Duration::from_secs(10), "file change not picked up");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&file, "[[rule]]\nname = \"broken\"\nby = \"ip\"\nlimit = \n").unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(check(port, "c")["policy"], "r2", "a broken file replaced the rules");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigterm_stops_gracefully_and_bad_flags_explain_themselves() {
    let (mut child, _port) = start(&[]);
    child.terminate();
    assert!(!child.is_running());
    let out = Command::new(BIN)
        .args(["--rules", "/nonexistent/rules.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/rules.toml"));
}
