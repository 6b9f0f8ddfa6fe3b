//! The node's edge as a stranger meets it, on the real binary: a client that sends half a
//! request is dropped within the header timeout, an idle keep-alive connection only past the
//! (longer) idle timeout;
//! waits past `--max-waits` are refused at once; TLS with client certificates keeps out
//! clients without one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use sluice_testkit::{free_port, wait_for_port, Child, ScratchDir};

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

/// Sends `bytes` and reads until the node closes the connection (or 10 s pass); what was
/// read and how long the node took to close.
fn until_closed(port: u16, bytes: &[u8]) -> (String, Duration) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let started = Instant::now();
    conn.write_all(bytes).expect("write");
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => read.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the node kept the connection open ({e}) after {:?}", started.elapsed()),
        }
    }
    (String::from_utf8_lossy(&read).into_owned(), started.elapsed())
}

#[test]
fn half_a_request_is_dropped_within_the_header_timeout() {
    let (_node, port) = start(&["--header-timeout-ms", "400"]);
    let (read, took) = until_closed(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
    assert!(!read.contains("200 OK"), "half a request is not answered: {read}");
    assert!(
        took >= Duration::from_millis(300),
        "dropped only once the timeout ran: {took:?}"
    );
    assert!(took < Duration::from_secs(4), "dropped within the timeout: {took:?}");

    // Nothing at all, or half an HTTP/2 preface: dropped all the same.
    for bytes in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
        let (_, took) = until_closed(port, bytes);
        assert!(took < Duration::from_secs(4), "{bytes:?}: held {took:?}");
    }
}

/// Reads one response (headers and its `Content-Length` body) from a kept-alive connection.
fn response(conn: &mut TcpStream) -> String {
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&read).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if read.len() >= end + 4 + length {
                return text;
            }
        }
        match conn.read(&mut buf) {
            Ok(0) => panic!("the node closed the connection; read so far: {text:?}"),
            Ok(n) => read.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no whole response ({e}); read so far: {text:?}"),
        }
    }
}

#[test]
fn a_keep_alive_connection_idles_past_the_header_timeout_until_the_idle_timeout() {
    let (_node, port) = start(&["--header-timeout-ms", "300", "--idle-timeout-ms", "2500"]);
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    for gap in [0, 900, 1800] {
        // Idle three header timeouts and more: the connection is still there for the next.
        std::thread::sleep(Duration::from_millis(gap));
        conn.write_all(request).expect("write");
        let read = response(&mut conn);
        assert!(read.starts_with("HTTP/1.1 200"), "after {gap} ms idle: {read}");
    }
    // Past the idle timeout the node closes it.
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let eof = conn.read(&mut buf);
    let took = started.elapsed();
    assert!(matches!(eof, Ok(0)), "the idle connection got {eof:?} after {took:?}");
    assert!(
        took >= Duration::from_millis(2000),
        "closed at the header timeout, not the idle one: {took:?}"
    );
    assert!(
        took < Duration::from_secs(6),
        "closed within the idle timeout: {took:?}"
    );

    // Half a request on a kept-alive connection is due within the header timeout all the same.
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    conn.write_all(request).expect("write");
    assert!(response(&mut conn).starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(500));
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHo").expect("write");
    let started = Instant::now();
    let eof = conn.read(&mut buf);
    let took = started.elapsed();
    assert!(matches!(eof, Ok(0)), "half a request got {eof:?}");
    assert!(
        took < Duration::from_millis(1500),
        "held half a request {took:?}: no header timeout"
    );
}

#[test]
fn connections_past_the_cap_wait_for_a_place() {
    let (_node, port) = start(&["--max-connections", "2", "--header-timeout-ms", "1500"]);
    // Two idle connections hold both places until the header timeout drops them.
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, _, took) = get(port, "/healthz");
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(900),
        "the third connection was served at once ({took:?}): no cap"
    );
    assert!(took < Duration::from_secs(6), "served once a place came back: {took:?}");
    drop(idle);
}

fn get(port: u16, path: &str) -> (u16, String, Duration) {
    let started = Instant::now();
    let raw = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (read, _) = until_closed(port, raw.as_bytes());
    let status = read.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, read, started.elapsed())
}

#[test]
fn waits_past_the_cap_are_refused_at_once_and_counted() {
    let (_node, port) = start(&["--max-waits", "2"]);
    let held: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || get(port, "/v1/wait?ms=2000")))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (status, body, took) = get(port, "/v1/wait?ms=2000");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--max-waits"), "{body}");
    assert!(
        took < Duration::from_millis(1500),
        "refused at once, not held: {took:?}"
    );
    for h in held {
        let (status, body, _) = h.join().expect("wait thread");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(get(port, "/v1/wait?ms=1").0, 200, "the places came back");
    let (_, metrics, _) = get(port, "/metrics");
    assert!(metrics.contains("sluice_waits_refused_total 1\n"), "{metrics}");
}

/// A CA, a server certificate for `localhost` signed by it, and a client certificate signed
/// by it, as PEM files in `dir`; and another CA's client certificate.
struct Pki {
    dir: ScratchDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = ScratchDir::new("sluice-tls");
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let leaf = |name: &str| {
            let key = KeyPair::generate().expect("key");
            let cert = CertificateParams::new(vec![name.to_owned()])
                .expect("params")
                .signed_by(&key, &ca_cert, &ca_key)
                .expect("sign");
            (cert.pem(), key.serialize_pem())
        };
        let (server, server_key) = leaf("localhost");
        let (client, client_key) = leaf("proxy");
        let stranger_key = KeyPair::generate().expect("key");
        let stranger = CertificateParams::new(vec!["stranger".to_owned()])
            .expect("params")
            .self_signed(&stranger_key)
            .expect("self-signed");
        for (name, text) in [
            ("ca.pem", ca_cert.pem()),
            ("server.pem", server),
            ("server.key", server_key),
            ("client.pem", format!("{client}{client_key}")),
            (
                "stranger.pem",
                format!("{}{}", stranger.pem(), stranger_key.serialize_pem()),
            ),
        ] {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).expect("read")
    }

    /// A client trusting the CA, presenting `identity` (a PEM file of `dir`) if given.
    fn client(&self, port: u16, identity: Option<&str>) -> reqwest::blocking::Client {
        let ca = reqwest::Certificate::from_pem(&self.read("ca.pem")).expect("ca");
        let mut b = reqwest::blocking::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(ca)
            .resolve("localhost", ([127, 0, 0, 1], port).into())
            .timeout(Duration::from_secs(5));
        if let Some(name) = identity {
            b = b.identity(reqwest::Identity::from_pem(&self.read(name)).expect("identity"));
        }
        b.build().expect("client")
    }
}

#[test]
fn tls_with_client_certificates_serves_only_the_proxies() {
    let pki = Pki::new();
    let (_node, port) = start(&[
        "--tls-cert",
        &pki.path("server.pem"),
        "--tls-key",
        &pki.path("server.key"),
        "--tls-client-ca",
        &pki.path("ca.pem"),
    ]);
    let url = format!("https://localhost:{port}/healthz");
    let ok = pki
        .client(port, Some("client.pem"))
        .get(&url)
        .send()
        .expect("a proxy's call");
    assert_eq!(ok.status(), 200);
    for (who, identity) in [
        ("no certificate", None),
        ("another CA's certificate", Some("stranger.pem")),
    ] {
        let refused = pki.client(port, identity).get(&url).send();
        assert!(refused.is_err(), "{who}: served {:?}", refused.map(|r| r.status()));
    }
    let plain = get(port, "/healthz");
    assert_ne!(plain.0, 200, "plain HTTP is not served on a TLS listener");
}

#[test]
fn a_tls_file_that_cannot_be_used_is_refused_at_start_naming_it() {
    let pki = Pki::new();
    let out = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--tls-cert",
            &pki.path("server.key"),
            "--tls-key",
            &pki.path("server.key"),
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.key") && err.contains("certificate"), "{err}");
}

/// Sends one HTTP/1.1 request over the Unix socket at `path`, once it accepts (20 s at
/// most), and returns the whole answer.
fn over_unix_socket(path: &std::path::Path, request: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conn = loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(conn) => break conn,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{} never accepted: {e}", path.display()),
        }
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    conn.write_all(request.as_bytes()).expect("write");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("read");
    answer
}

#[test]
fn a_unix_socket_serves_checks_and_replaces_only_a_stale_socket() {
    let dir = ScratchDir::new("unix-listen");
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nname = \"one\"\nby = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n",
    )
    .expect("rules");
    let socket = dir.join("check.sock");
    let listen = format!("unix:{}", socket.display());
    let body = r#"{"identities": {"ip": "203.0.113.9"}, "method": "GET", "path": "/"}"#;
    let check = format!(
        "POST /v1/check HTTP/1.1\r\nHost: sluice-check\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let start = || {
        Child::spawn(
            "sluice-service",
            Command::new(BIN).args(["--listen", &listen, "--rules"]).arg(&rules),
        )
    };
    let mut node = start();
    let first = over_unix_socket(&socket, &check);
    assert!(
        first.starts_with("HTTP/1.1 200") && first.contains(r#""allowed":true"#),
        "{first}"
    );
    let second = over_unix_socket(&socket, &check);
    assert!(
        second.contains(r#""allowed":false"#),
        "the limit of one holds: {second}"
    );
    node.kill();
    assert!(socket.exists(), "a killed node leaves its socket file");

    // A node started again takes the stale socket's place.
    let _node = start();
    let again = over_unix_socket(&socket, &check);
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");

    // Any other file at the path is never removed: the node refuses to start, naming it.
    let not_a_socket = dir.join("rules-copy.toml");
    std::fs::copy(&rules, &not_a_socket).expect("copy");
    let out = Command::new(BIN)
        .args(["--listen", &format!("unix:{}", not_a_socket.display())])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on unix:{}", not_a_socket.display()))
            && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert!(not_a_socket.exists(), "the file is left alone");
}
