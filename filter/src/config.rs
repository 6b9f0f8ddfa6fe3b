//! The filter's JSON plugin configuration, validated once at `on_configure`.

use sluice_core::algorithm::concurrency::MAX_SLOTS;
use sluice_core::headers::HeaderMode;
use sluice_core::json;
use sluice_core::rules::FailureMode;

/// Why a configuration is refused: the field and the problem, for one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the check service is.
    pub check: Check,
    /// Which request headers carry which identity.
    pub identities: Identities,
    /// The local prefilter bucket; absent disables it.
    pub local: Option<Local>,
    /// What to do when the check service fails.
    pub failure: Failure,
    /// Which rate-limit headers to send.
    pub headers: HeaderMode,
    /// Whether a CORS request's response (one whose request has `Origin`) names the headers
    /// the filter adds in `Access-Control-Expose-Headers`, so that a page on another origin
    /// can read them (`cors_expose`, on unless false).
    pub cors_expose: bool,
    /// Leased quotas: the filter matches the service's rules itself and spends leases of
    /// leased rules locally; absent, every request is an exact check.
    pub lease: Option<Lease>,
    /// Costs learnt after the response, spent at the service; absent, none are.
    pub debit: Option<Debit>,
    /// Concurrency slots the check took, given back when each request ends and renewed
    /// while it runs; absent, a slot is never given back and frees only when it expires.
    pub concurrency: Option<Concurrency>,
    /// Who keeps the local and fallback buckets and the breaker: the process (every worker
    /// of one Envoy or Nginx together) or each worker. Absent: the host's default
    /// ([`Share::default_on`]), which the root settles at configuration.
    pub share: Option<Share>,
    /// Slots of each shared table of buckets or leases (`share: process`).
    pub slots: u64,
}

/// Who keeps the filter's local state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Every worker of the process, in the host's shared data: one proxy is one participant.
    Process,
    /// Each worker its own: with N workers, N times the local rates.
    Worker,
}

impl Share {
    /// Who keeps the local state when the configuration does not say, on a host that is
    /// ngx_wasm_module or not. Envoy's shared data is always there: the process. In Nginx it
    /// needs an `shm_kv` zone that an nginx.conf written before `share` (or without it) does
    /// not declare, and ngx_wasm_module traps on shared data without one, taking the worker
    /// down: there each worker, unless the configuration asks for the process.
    pub fn default_on(nginx: bool) -> Share {
        if nginx {
            Share::Worker
        } else {
            Share::Process
        }
    }

    fn from_name(name: &str) -> Option<Share> {
        match name {
            "process" => Some(Share::Process),
            "worker" => Some(Share::Worker),
            _ => None,
        }
    }
}

/// Slots in each shared table of buckets, unless the configuration says.
pub const DEFAULT_SLOTS: u64 = 4_096;

fn default_debit_path() -> String {
    "/v1/debit".into()
}

/// A cost learnt only once the upstream answers (an LLM API's tokens): the response header
/// that names it, spent at the service by the root on its next tick.
#[derive(Debug, Clone)]
pub struct Debit {
    /// The response header holding the request's whole cost, e.g. `x-tokens-used`: the
    /// request already spent 1, the rest is debited.
    pub header: String,
    /// The service's debit endpoint (`POST`).
    pub path: String,
    /// The root context's timer (ms) when leases do not set it: debits go out on it.
    pub tick_ms: u64,
}

fn default_slots_path() -> String {
    "/v1/slots".into()
}

fn default_slots_tick_ms() -> u64 {
    10
}

fn default_in_flight_expiry_ms() -> u64 {
    10_000
}

/// Requests in flight: the concurrency rules' slots, which the root gives back for the
/// requests that ended and renews for those still running, on its tick; and the filter's own
/// limit, when `local` says one.
#[derive(Debug, Clone)]
pub struct Concurrency {
    /// The service's slots endpoint (`POST`).
    pub path: String,
    /// The root context's timer (ms): a slot is given back at most this long after its
    /// request ended, so it sets how much of the limit a backend sees used.
    pub tick_ms: u64,
    /// The filter's own limit on each client's requests in flight, in front of the check.
    pub local: Option<LocalConcurrency>,
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency {
            path: default_slots_path(),
            tick_ms: default_slots_tick_ms(),
            local: None,
        }
    }
}

/// The filter's own limit on requests in flight (`filter/src/local_in_flight.rs`): at most `limit`
/// at once for each client by `by`, counted by every worker of the process together
/// (`share: process`) or by each worker.
#[derive(Debug, Clone)]
pub struct LocalConcurrency {
    /// The identity a client is counted by (`ip`, `user`, `api_key` or `tier`; a request
    /// without it is counted by its IP, or not at all).
    pub by: String,
    /// Requests in flight at once, at most.
    pub limit: u64,
    /// How long a slot outlives its last renewal (ms): only a worker that died holding it
    /// (an Nginx worker process) leaves one to expire; a running request's is renewed.
    pub expiry_ms: u64,
    /// A worker's own count (`share: worker`): at most this many clients.
    pub max_keys: usize,
}

fn default_rules_path() -> String {
    "/v1/rules".into()
}
fn default_lease_path() -> String {
    "/v1/lease".into()
}
/// Twice a second: a rule changed at the service reaches the filter within a second, the
/// call included (an unchanged set costs a `304` with no body).
fn default_poll_ms() -> u64 {
    500
}
fn default_tick_ms() -> u64 {
    50
}

/// Leasing: where the rules and leases come from, and how often the filter asks.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The service's rules for proxies (`GET`).
    pub rules_path: String,
    /// The service's lease endpoint (`POST`).
    pub lease_path: String,
    /// How often the rules are asked for (ms); a change reaches the filter within this.
    pub poll_ms: u64,
    /// The root context's timer (ms): leases are asked for and given back on it.
    pub tick_ms: u64,
}

fn default_authority() -> String {
    "sluice-check".into()
}
fn default_path() -> String {
    "/v1/check".into()
}
fn default_wait_path() -> String {
    "/v1/wait".into()
}
fn default_timeout() -> u32 {
    25
}

/// The check service.
#[derive(Debug, Clone, Default)]
pub struct Check {
    /// Envoy cluster name, or `host:port` for Nginx.
    pub cluster: String,
    /// `:authority` of the check call.
    pub authority: String,
    /// Path of the check endpoint.
    pub path: String,
    /// Path of the service's wait endpoint, which holds a shaped request: the filter calls
    /// `{wait_path}?ms={delay_ms}` and forwards the request when the answer comes.
    pub wait_path: String,
    /// Timeout of the check call in milliseconds.
    pub timeout_ms: u32,
    /// The credential the check service asks for (its `--data-token-file`), sent on every
    /// call to it; absent, calls carry none.
    pub token: Option<String>,
    /// The header that carries `token`: `authorization` (the default) sends
    /// `Bearer <token>`, any other header the token alone.
    pub token_header: String,
}

fn default_token_header() -> String {
    "authorization".into()
}

impl Config {
    /// The root context's timer, when leases, debits or concurrency slots need one: the
    /// shortest of theirs.
    pub fn tick_ms(&self) -> Option<u64> {
        let lease = self.lease.as_ref().map(|l| l.tick_ms);
        let debit = self.debit.as_ref().map(|d| d.tick_ms);
        let concurrency = self.concurrency.as_ref().map(|c| c.tick_ms);
        lease.into_iter().chain(debit).chain(concurrency).min()
    }
}

impl Check {
    /// The header a call to the service carries its credential in, and its value.
    pub fn credential(&self) -> Option<(&str, String)> {
        let token = self.token.as_deref()?;
        let value = if self.token_header.eq_ignore_ascii_case("authorization") {
            format!("Bearer {token}")
        } else {
            token.to_owned()
        };
        Some((self.token_header.as_str(), value))
    }
}

/// Identity sources.
#[derive(Debug, Clone, Default)]
pub struct Identities {
    /// Client IP.
    pub ip: Option<IpSource>,
    /// The user id.
    pub user: Option<Source>,
    /// The API key.
    pub api_key: Option<Source>,
    /// The plan tier.
    pub tier: Option<Source>,
}

fn default_xff() -> String {
    "x-forwarded-for".into()
}

/// Where the client IP comes from.
#[derive(Debug, Clone)]
pub struct IpSource {
    /// The forwarding header.
    pub header: String,
    /// Proxies in front that append to the header (Envoy's `xff_num_trusted_hops`): with N,
    /// the client is the Nth address from the right; with 0 the header is ignored and the
    /// connection's `source.address` is used.
    pub trusted_hops: u32,
    /// IPv6 clients are counted by their network of this many bits (a /64 is what one
    /// subscriber is handed); 128 counts each address. IPv4-mapped addresses are IPv4.
    pub ipv6_prefix: u8,
}

fn default_ipv6_prefix() -> u8 {
    sluice_core::identity::DEFAULT_IPV6_PREFIX
}

/// Where an identity comes from: a request header, or a host property that a trusted layer
/// of the proxy sets (exactly one of the two).
#[derive(Debug, Clone)]
pub struct Source {
    /// Header name. Trust it only when the proxy strips it from clients' requests and a
    /// trusted layer sets it.
    pub header: Option<String>,
    /// Property path, e.g. Envoy's `["metadata", "filter_metadata",
    /// "envoy.filters.http.jwt_authn", "jwt_payload", "sub"]` (a verified JWT's subject) or
    /// ngx_wasm_module's `["ngx", "remote_user"]` (an Nginx variable).
    pub property: Option<Vec<String>>,
}

fn default_max_keys() -> usize {
    100_000
}
fn default_by() -> String {
    "ip".into()
}

/// The local prefilter.
#[derive(Debug, Clone)]
pub struct Local {
    /// The identity the buckets are keyed by.
    pub by: String,
    /// Refill rate per second.
    pub rate_per_s: u64,
    /// Capacity.
    pub burst: u64,
    /// Most keys kept; beyond, buckets are evicted.
    pub max_keys: usize,
}

/// Failure policy.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `open` lets traffic through (with the fallback bucket); `closed` answers 503.
    pub mode: FailureMode,
    /// Per-key bucket deciding while failing open.
    pub fallback: Rate,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
}

impl Default for Failure {
    fn default() -> Self {
        Failure {
            mode: FailureMode::Open,
            fallback: Rate::default(),
            breaker: BreakerConfig::default(),
        }
    }
}

/// A rate and a burst.
#[derive(Debug, Clone)]
pub struct Rate {
    /// Per second.
    pub rate_per_s: u64,
    /// Capacity.
    pub burst: u64,
}

impl Default for Rate {
    fn default() -> Self {
        Rate {
            rate_per_s: 50,
            burst: 100,
        }
    }
}

/// Breaker settings.
#[derive(Debug, Clone)]
pub struct BreakerConfig {
    /// Consecutive failures that open it.
    pub failures: u32,
    /// How long it stays open before a probe.
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            cooldown_ms: 1_000,
        }
    }
}

fn header_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(ConfigError(format!("{field}: {name:?} is not a header name")));
    }
    Ok(())
}

/// Whether `value` can go into a call's header as it is: printable ASCII, no spaces.
fn printable(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_graphic())
}

/// An endpoint's path: from `/`, without a query, [`printable`] (the `:path` of a call).
fn endpoint(field: &str, path: &str) -> Result<(), ConfigError> {
    if !path.starts_with('/') || path.contains('?') || !printable(path) {
        return Err(ConfigError(format!(
            "{field}: {path:?} must start with / and have no query, space or control character"
        )));
    }
    Ok(())
}

/// An identity the filter reads (`local.by`, `concurrency.local.by`).
fn identity_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if !["ip", "user", "api_key", "tier"].contains(&name) {
        return Err(ConfigError(format!(
            "{field}: {name:?} is not one of ip, user, api_key, tier"
        )));
    }
    Ok(())
}

fn range(field: &str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError(format!("{field}: {v} is out of range {lo}..={hi}")));
    }
    Ok(())
}

impl Source {
    fn validate(&self, field: &str) -> Result<(), ConfigError> {
        match (&self.header, &self.property) {
            (Some(h), None) => header_name(&format!("{field}.header"), h),
            (None, Some(path)) => {
                let ok = (1..=16).contains(&path.len())
                    && path
                        .iter()
                        .all(|p| !p.is_empty() && p.len() <= 256 && !p.contains('\0'));
                if ok {
                    Ok(())
                } else {
                    Err(ConfigError(format!(
                        "{field}.property: give 1 to 16 non-empty path segments, e.g. [\"ngx\", \"remote_user\"]"
                    )))
                }
            }
            _ => Err(ConfigError(format!(
                "{field}: give exactly one of \"header\" or \"property\""
            ))),
        }
    }
}

impl Config {
    /// Parses and validates; the error names the field.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let c = json::parse(bytes)
            .and_then(|doc| Config::read(&doc))
            .map_err(|e| ConfigError(format!("invalid configuration: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.check.cluster.trim().is_empty() {
            return Err(ConfigError(
                "check.cluster: must name the check service's cluster (or host:port)".into(),
            ));
        }
        for (field, value) in [
            ("check.cluster", &self.check.cluster),
            ("check.authority", &self.check.authority),
        ] {
            if !printable(value) {
                return Err(ConfigError(format!(
                    "{field}: {value:?} must be printable ASCII, no spaces"
                )));
            }
        }
        endpoint("check.path", &self.check.path)?;
        endpoint("check.wait_path", &self.check.wait_path)?;
        range("check.timeout_ms", u64::from(self.check.timeout_ms), 1, 60_000)?;
        if let Some(lease) = &self.lease {
            endpoint("lease.rules_path", &lease.rules_path)?;
            endpoint("lease.lease_path", &lease.lease_path)?;
            range("lease.tick_ms", lease.tick_ms, 10, 1_000)?;
            range("lease.poll_ms", lease.poll_ms, lease.tick_ms, 60_000)?;
        }
        if let Some(debit) = &self.debit {
            header_name("debit.header", &debit.header)?;
            endpoint("debit.path", &debit.path)?;
            range("debit.tick_ms", debit.tick_ms, 10, 1_000)?;
        }
        if let Some(concurrency) = &self.concurrency {
            endpoint("concurrency.path", &concurrency.path)?;
            range("concurrency.tick_ms", concurrency.tick_ms, 1, 1_000)?;
            if let Some(local) = &concurrency.local {
                identity_name("concurrency.local.by", &local.by)?;
                range("concurrency.local.limit", local.limit, 1, MAX_SLOTS)?;
                range("concurrency.local.expiry_ms", local.expiry_ms, 1_000, 600_000)?;
                range("concurrency.local.max_keys", local.max_keys as u64, 1, 10_000_000)?;
            }
        }
        header_name("check.token_header", &self.check.token_header)?;
        if let Some(token) = &self.check.token {
            if token.is_empty() || token.len() > 4096 || !printable(token) {
                return Err(ConfigError(
                    "check.token: must be 1 to 4096 printable ASCII characters, no spaces".into(),
                ));
            }
        }
        if let Some(ip) = &self.identities.ip {
            header_name("identities.ip.header", &ip.header)?;
            range("identities.ip.trusted_hops", u64::from(ip.trusted_hops), 0, 16)?;
            range("identities.ip.ipv6_prefix", u64::from(ip.ipv6_prefix), 1, 128)?;
        }
        for (field, src) in [
            ("identities.user", &self.identities.user),
            ("identities.api_key", &self.identities.api_key),
            ("identities.tier", &self.identities.tier),
        ] {
            if let Some(s) = src {
                s.validate(field)?;
            }
        }
        if let Some(local) = &self.local {
            identity_name("local.by", &local.by)?;
            range("local.rate_per_s", local.rate_per_s, 1, 1_000_000)?;
            range("local.burst", local.burst, 1, 10_000_000)?;
            range("local.max_keys", local.max_keys as u64, 1, 10_000_000)?;
        }
        range(
            "failure.fallback.rate_per_s",
            self.failure.fallback.rate_per_s,
            1,
            1_000_000,
        )?;
        range("failure.fallback.burst", self.failure.fallback.burst, 1, 10_000_000)?;
        range(
            "failure.breaker.failures",
            u64::from(self.failure.breaker.failures),
            1,
            1_000,
        )?;
        range(
            "failure.breaker.cooldown_ms",
            self.failure.breaker.cooldown_ms,
            1,
            3_600_000,
        )?;
        range("slots", self.slots, 16, 1 << 20)?;
        Ok(())
    }
}

mod read;

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn what_the_calls_send_as_headers_is_printable() {
        let e = Config::parse(br#"{"check": {"cluster": "c", "path": "/v1/check\r\nx: y"}}"#)
            .expect_err("refused")
            .0;
        assert_eq!(
            e,
            r#"check.path: "/v1/check\r\nx: y" must start with / and have no query, space or control character"#
        );
        let e = Config::parse(br#"{"check": {"cluster": "c", "authority": "a b"}}"#)
            .expect_err("refused")
            .0;
        assert_eq!(e, r#"check.authority: "a b" must be printable ASCII, no spaces"#);
        let every_field = include_bytes!("../../fuzz/corpus/filter_config/every-field.json");
        let config = Config::parse(every_field).expect("the fuzz corpus's every-field seed is valid");
        assert_eq!(config.tick_ms(), Some(10));
        assert!(config.debit.is_some() && config.check.token.is_some() && config.concurrency.is_some());
    }

    #[test]
    fn a_value_of_the_wrong_type_is_named_by_its_whole_path() {
        let one_line = br#"{"check": {"cluster": "c"}, "local": {"by": "ip", "rate_per_s": -5}}"#;
        let e = Config::parse(one_line).expect_err("refused").0;
        assert_eq!(
            e,
            "invalid configuration: local.rate_per_s: expected an unsigned integer, found -5"
        );
        let lines = b"{\n  \"check\": {\"cluster\": \"c\",\n    \"timeout_ms\": \"soon\"}\n}";
        let e = Config::parse(lines).expect_err("refused").0;
        assert_eq!(
            e,
            "invalid configuration: check.timeout_ms: expected an unsigned integer, found a string"
        );
        let e = Config::parse(br#"{"check": {"cluster": "c", "timeout_ms": 5000000000}}"#)
            .expect_err("refused")
            .0;
        assert_eq!(e, "invalid configuration: check.timeout_ms: 5000000000 is too large");
        let e = Config::parse(br#"{"check": {"cluster": "c"}, "headers": "most"}"#)
            .expect_err("refused")
            .0;
        assert_eq!(
            e,
            "invalid configuration: headers: \"most\" is not one of all, legacy, ietf or none"
        );
        let e = Config::parse(br#"{"check": {"cluster": "c"}, "failure": {"breaker": {"failures": 3}}}"#)
            .expect_err("refused")
            .0;
        assert_eq!(
            e,
            "invalid configuration: failure.breaker.cooldown_ms: required but missing"
        );
        let e = Config::parse(br#"{"check": {"cluster": "c", "colour": 1}}"#)
            .expect_err("refused")
            .0;
        assert!(
            e.starts_with("invalid configuration: check: unknown field `colour`, expected one of cluster,"),
            "{e}"
        );
        let e = Config::parse(b"not json").expect_err("refused").0;
        assert_eq!(e, "invalid configuration: expected a value at byte 0");
    }

    #[test]
    fn absent_fields_take_their_defaults() {
        let c = Config::parse(br#"{"check": {"cluster": "c"}, "lease": {}, "identities": {"ip": {}}}"#).expect("valid");
        assert_eq!((c.check.path.as_str(), c.check.timeout_ms), ("/v1/check", 25));
        let lease = c.lease.expect("lease");
        assert_eq!(
            (lease.poll_ms, lease.tick_ms, lease.rules_path.as_str()),
            (500, 50, "/v1/rules")
        );
        let ip = c.identities.ip.expect("ip");
        assert_eq!(
            (ip.header.as_str(), ip.trusted_hops, ip.ipv6_prefix),
            ("x-forwarded-for", 0, 64)
        );
        assert_eq!((c.failure.breaker.failures, c.failure.fallback.burst), (5, 100));
        assert_eq!((c.share, c.slots), (None, 4_096));
    }

    #[test]
    fn share_names_who_keeps_the_local_state() {
        let c = Config::parse(br#"{"check": {"cluster": "c"}, "share": "worker", "slots": 64}"#).expect("valid");
        assert_eq!((c.share, c.slots), (Some(super::Share::Worker), 64));
        let e = Config::parse(br#"{"check": {"cluster": "c"}, "share": "thread"}"#)
            .expect_err("refused")
            .0;
        assert_eq!(
            e,
            "invalid configuration: share: \"thread\" is not one of process or worker"
        );
        let e = Config::parse(br#"{"check": {"cluster": "c"}, "slots": 3}"#)
            .expect_err("refused")
            .0;
        assert_eq!(e, "slots: 3 is out of range 16..=1048576");
    }
}
