//! One `[[rule]]` checked field by field and turned into a ready-to-match [`Rule`].

use std::collections::BTreeMap;

use super::duration::{lease_length, parse_duration};
use super::file::RuleSpec;
use super::glob::Glob;
use super::global::{global, Global};
use super::RulesError;
use crate::algorithm::{Algorithm, Limit, LimitError, UnknownAlgorithm};
use crate::time::Micros;
use crate::wire::{is_token, MAX_HOLD_MS, MAX_IDENTITY_BYTES, MAX_METHOD_BYTES, MAX_PATH_BYTES};

/// Longest rule name, in bytes.
pub const MAX_RULE_NAME_BYTES: usize = 128;

/// What a rule limits by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The client IP (`ip`).
    Ip,
    /// The authenticated user (`user`).
    User,
    /// The API key (`api_key`).
    ApiKey,
    /// The plan tier (`tier`).
    Tier,
    /// Any other identity the proxy extracts; holds the whole lower-cased key,
    /// `header:<name>`, as it appears in a check request's `identities`.
    Header(String),
    /// One bucket for everyone (`global`); its identity value is `"global"`.
    Global,
}

impl Identity {
    /// Parses the `by` field: `ip`, `user`, `api_key`, `tier`, `header:<name>` or `global`.
    ///
    /// The header name must be an HTTP token; it is lower-cased.
    pub fn parse(s: &str) -> Result<Identity, String> {
        Ok(match s {
            "ip" => Identity::Ip,
            "user" => Identity::User,
            "api_key" => Identity::ApiKey,
            "tier" => Identity::Tier,
            "global" => Identity::Global,
            _ => match s.strip_prefix("header:") {
                Some(name) if is_token(name) && s.len() <= MAX_IDENTITY_BYTES => {
                    Identity::Header(format!("header:{}", name.to_ascii_lowercase()))
                }
                Some(name) => {
                    return Err(format!(
                        "{s:?}: header name {name:?} must be an HTTP token (letters, digits, -, _ ...) \
                         and the whole identity at most {MAX_IDENTITY_BYTES} bytes"
                    ))
                }
                None => {
                    return Err(format!(
                        "{s:?} is not an identity: use ip, user, api_key, tier, header:<name> or global"
                    ))
                }
            },
        })
    }

    /// The key of this identity in a check request's `identities` (`global` for [`Identity::Global`]).
    pub fn key(&self) -> &str {
        match self {
            Identity::Ip => "ip",
            Identity::User => "user",
            Identity::ApiKey => "api_key",
            Identity::Tier => "tier",
            Identity::Header(key) => key,
            Identity::Global => "global",
        }
    }
}

/// What to do when no decision can be had: a rule's `failure` when the service's counter
/// store is unreachable, the filter's `failure.mode` when the check service is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FailureMode {
    /// Decide from a local fallback bucket (`"open"`, the default).
    #[default]
    Open,
    /// Deny (`"closed"`).
    Closed,
}

impl FailureMode {
    /// The mode called `name` (`open` or `closed`).
    pub fn from_name(name: &str) -> Option<FailureMode> {
        match name {
            "open" => Some(FailureMode::Open),
            "closed" => Some(FailureMode::Closed),
            _ => None,
        }
    }
}

/// What a rule does with a request that lacks its identity (`when_missing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenMissing {
    /// The rule does not apply (`"skip"`, the default, as envoyproxy/ratelimit does).
    #[default]
    Skip,
    /// Every such request counts in one bucket of the rule, identity [`MISSING`] (`"shared"`).
    Shared,
    /// The rule refuses the request (`"deny"`).
    Deny,
}

/// The identity of the bucket that requests without a rule's identity share (`shared`), or
/// that a `deny` rule refuses them under. A client that sends this value itself joins that
/// bucket, which it could do anyway by sending nothing.
pub const MISSING: &str = "(none)";

/// One validated rule, ready to match: its glob is compiled and its [`Limit`] built.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Unique name; the policy name in headers and the first part of its limit keys.
    pub name: String,
    /// What it limits by.
    pub by: Identity,
    /// Path glob.
    pub path: Glob,
    /// Upper-case methods; empty means every method.
    pub methods: Vec<String>,
    /// Hosts (lower case, no port; `*.domain` for its subdomains); empty means every host.
    pub hosts: Vec<String>,
    /// Required tier, if any.
    pub tier: Option<String>,
    /// The validated limit (windows in microseconds).
    pub limit: Limit,
    /// The window in milliseconds (for headers and the wire).
    pub window_ms: u64,
    /// Store-failure policy.
    pub failure: FailureMode,
    /// Count, never deny.
    pub shadow: bool,
    /// How long a lease of this rule's quota lasts, when proxies may lease it.
    pub lease_ttl: Option<Micros>,
    /// How regions share the limit, when it is one limit across every region.
    pub global: Option<Global>,
    /// What a request without the rule's identity does.
    pub when_missing: WhenMissing,
}

impl Rule {
    /// The identity value this rule limits `identities` by. When the request does not carry
    /// it (an empty value counts as absent): `None` if the rule skips such requests, else
    /// [`MISSING`]. `global` rules always get `"global"`.
    pub fn identity_in<'a>(&self, identities: &'a BTreeMap<String, String>) -> Option<&'a str> {
        match &self.by {
            Identity::Global => Some("global"),
            by => match identities.get(by.key()).map(String::as_str).filter(|v| !v.is_empty()) {
                Some(value) => Some(value),
                None if self.when_missing == WhenMissing::Skip => None,
                None => Some(MISSING),
            },
        }
    }

    /// Whether this rule refuses a request it matched with `identity` outright: a `deny`
    /// rule whose identity the request lacks. No counter is touched.
    pub fn refuses(&self, identity: &str) -> bool {
        self.when_missing == WhenMissing::Deny && identity == MISSING
    }

    /// Whether the path, method and tier conditions hold (the identity is checked apart).
    /// A path with a trailing `/` matches as itself or without it: most servers serve
    /// `/api/search/` as `/api/search` (Express's and Flask's defaults do), so a rule on the
    /// one holds the other, and the slash steps around nothing.
    /// A rule naming `hosts` applies only to a request whose `host` is one of them (without
    /// its port, whatever the case); a request without a host, only to rules naming none.
    pub fn applies(&self, identities: &BTreeMap<String, String>, method: &str, host: Option<&str>, path: &str) -> bool {
        self.mismatch(identities, method, host, path).is_none()
    }

    /// The first condition of [`Rule::applies`] the request fails, or `None` when it
    /// applies: the one test behind both matching and explaining, so they cannot drift.
    pub fn mismatch<'a>(
        &'a self,
        identities: &'a BTreeMap<String, String>,
        method: &'a str,
        host: Option<&'a str>,
        path: &'a str,
    ) -> Option<Mismatch<'a>> {
        if !(self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))) {
            return Some(Mismatch::Method {
                method,
                methods: &self.methods,
            });
        }
        if !(self.hosts.is_empty()
            || host.is_some_and(|h| self.hosts.iter().any(|entry| super::host::matches(entry, h))))
        {
            return Some(Mismatch::Host {
                host,
                hosts: &self.hosts,
            });
        }
        if let Some(tier) = self
            .tier
            .as_deref()
            .filter(|t| identities.get("tier").map(String::as_str) != Some(*t))
        {
            return Some(Mismatch::Tier {
                tier,
                given: identities.get("tier").map(String::as_str),
            });
        }
        let without_slash = path.strip_suffix('/').filter(|p| !p.is_empty());
        if !(self.path.matches(path) || without_slash.is_some_and(|p| self.path.matches(p))) {
            return Some(Mismatch::Path {
                path,
                glob: self.path.as_str(),
            });
        }
        None
    }

    /// Whether the rule applies to the request and the identity it limits it by, or the
    /// first reason it does not: [`Rule::mismatch`], then [`Rule::identity_in`].
    pub fn explain<'a>(
        &'a self,
        identities: &'a BTreeMap<String, String>,
        method: &'a str,
        host: Option<&'a str>,
        path: &'a str,
    ) -> Result<&'a str, Mismatch<'a>> {
        if let Some(why) = self.mismatch(identities, method, host, path) {
            return Err(why);
        }
        self.identity_in(identities)
            .ok_or(Mismatch::MissingIdentity { key: self.by.key() })
    }

    /// Whether the rule applies whatever the request's method, host and path: its path glob
    /// matches every path and it names no methods and no hosts.
    pub fn ignores_target(&self) -> bool {
        self.path.matches_any() && self.methods.is_empty() && self.hosts.is_empty()
    }

    /// What the rule matches, for people: its methods (none: every method), hosts, path
    /// glob and tier, e.g. `GET POST /api/*` or `POST on api.example.com /login tier=free`.
    pub fn conditions(&self) -> String {
        let mut out = self.methods.join(" ");
        if !self.hosts.is_empty() {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str("on ");
            out.push_str(&self.hosts.join(","));
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(self.path.as_str());
        if let Some(tier) = &self.tier {
            out.push_str(" tier=");
            out.push_str(tier);
        }
        out
    }
}

/// Why a rule does not apply to a request ([`Rule::explain`]); its `Display` says it to
/// a person, e.g. `method GET is not POST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch<'a> {
    /// The request's method is not among the rule's.
    Method {
        /// The request's method.
        method: &'a str,
        /// The rule's methods.
        methods: &'a [String],
    },
    /// The request's host is not among the rule's (or it has none).
    Host {
        /// The request's host, if it named one.
        host: Option<&'a str>,
        /// The rule's hosts.
        hosts: &'a [String],
    },
    /// The request's tier is not the rule's.
    Tier {
        /// The rule's tier.
        tier: &'a str,
        /// The request's `tier` identity, if any.
        given: Option<&'a str>,
    },
    /// The request's path does not match the rule's glob.
    Path {
        /// The canonical path.
        path: &'a str,
        /// The rule's glob.
        glob: &'a str,
    },
    /// The request lacks the identity the rule limits by, and the rule skips such requests.
    MissingIdentity {
        /// The identity's key (`ip`, `user`, `header:x-team`, …).
        key: &'a str,
    },
}

impl std::fmt::Display for Mismatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Method { method, methods } => write!(f, "method {method} is not {}", methods.join(" or ")),
            Mismatch::Host { host: None, hosts } => write!(f, "no host given; the rule is for {}", hosts.join(", ")),
            Mismatch::Host { host: Some(h), hosts } => write!(f, "host {h} is not {}", hosts.join(", ")),
            Mismatch::Tier { tier, given: None } => write!(f, "no tier identity; the rule is for tier {tier}"),
            Mismatch::Tier { tier, given: Some(g) } => write!(f, "tier {g} is not {tier}"),
            Mismatch::Path { path, glob } => write!(f, "path {path} does not match {glob}"),
            Mismatch::MissingIdentity { key } => {
                write!(f, "no {key} identity, and the rule skips requests without it")
            }
        }
    }
}

/// How errors name a rule: its name in quotes, or `#<n>` (1-based) when it has none.
pub(crate) fn rule_label(spec: &RuleSpec, index: usize) -> String {
    if spec.name.trim().is_empty() {
        format!("#{}", index + 1)
    } else {
        format!("{:?}", spec.name)
    }
}

/// The rule-file field a [`LimitError`] is about.
pub(crate) fn limit_error_field(e: &LimitError) -> &'static str {
    match e {
        LimitError::ZeroLimit | LimitError::TooFast { .. } => "limit",
        LimitError::BadWindow => "window",
        LimitError::TooLarge { field, .. } => field,
    }
}

/// Checks every field of the rule at `index` (0-based) and builds it.
pub(crate) fn validate_rule(spec: &RuleSpec, index: usize) -> Result<Rule, RulesError> {
    let fail = |field, message: String| RulesError::Rule {
        rule: rule_label(spec, index),
        field,
        message,
    };
    if spec.name.trim().is_empty() {
        return Err(fail("name", "must not be empty".into()));
    }
    if spec.name.len() > MAX_RULE_NAME_BYTES || spec.name.chars().any(char::is_control) {
        return Err(fail(
            "name",
            format!("must be at most {MAX_RULE_NAME_BYTES} bytes of printable characters"),
        ));
    }
    let by = Identity::parse(&spec.by).map_err(|m| fail("by", m))?;
    if spec.path.is_empty() {
        return Err(fail(
            "path",
            "must not be empty; use \"*\" (the default) for every path".into(),
        ));
    }
    if spec.path.len() > MAX_PATH_BYTES {
        return Err(fail(
            "path",
            format!("is {} bytes; at most {MAX_PATH_BYTES}", spec.path.len()),
        ));
    }
    let mut methods = Vec::with_capacity(spec.methods.len());
    for m in &spec.methods {
        if m.len() > MAX_METHOD_BYTES || !is_token(m) {
            return Err(fail(
                "methods",
                format!("{m:?} is not an HTTP method (a token of 1 to {MAX_METHOD_BYTES} bytes)"),
            ));
        }
        methods.push(m.to_ascii_uppercase());
    }
    let hosts = spec
        .hosts
        .iter()
        .map(|h| super::host::rule_host(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|m| fail("hosts", m))?;
    if let Some(tier) = &spec.tier {
        if tier.is_empty() || tier.len() > MAX_IDENTITY_BYTES {
            return Err(fail(
                "tier",
                format!("must be 1 to {MAX_IDENTITY_BYTES} bytes; leave it out to apply to every tier"),
            ));
        }
    }
    let algorithm: Algorithm = spec
        .algorithm
        .parse()
        .map_err(|e: UnknownAlgorithm| fail("algorithm", e.to_string()))?;
    let window_ms = parse_duration(&spec.window).map_err(|m| fail("window", m))?;
    if window_ms == 0 {
        return Err(fail("window", "must be at least 1ms".into()));
    }
    let uses_burst = matches!(
        algorithm,
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket
    );
    if spec.burst != 0 && !uses_burst {
        return Err(fail(
            "burst",
            format!("{algorithm} has no burst; only token_bucket, gcra and leaky_bucket do (leave it out or 0)"),
        ));
    }
    let Some(failure) = FailureMode::from_name(&spec.failure) else {
        return Err(fail(
            "failure",
            format!("{:?} is not \"open\" or \"closed\"", spec.failure),
        ));
    };
    if spec.shaping && algorithm != Algorithm::LeakyBucket {
        return Err(fail("shaping", format!("only leaky_bucket can shape, not {algorithm}")));
    }
    let max_delay_ms = parse_duration(&spec.max_delay).map_err(|m| fail("max_delay", m))?;
    if spec.shaping && max_delay_ms == 0 {
        return Err(fail(
            "max_delay",
            "shaping = true needs how long a request may be held, e.g. max_delay = \"2s\"".into(),
        ));
    }
    if spec.shaping && max_delay_ms > MAX_HOLD_MS {
        return Err(fail(
            "max_delay",
            format!("{max_delay_ms} ms is longer than a request may be held ({MAX_HOLD_MS} ms)"),
        ));
    }
    let limit = Limit::builder(algorithm, spec.limit, Micros::from_ms(window_ms))
        .burst(spec.burst)
        .shaping(spec.shaping.then_some(Micros::from_ms(max_delay_ms)))
        .build()
        .map_err(|e| fail(limit_error_field(&e), e.to_string()))?;
    let lease_ttl = lease_ttl(spec, &limit).map_err(|(field, message)| fail(field, message))?;
    let global = global(spec, &limit).map_err(|(field, message)| fail(field, message))?;
    let when_missing = match spec.when_missing.as_deref() {
        None | Some("skip") => WhenMissing::Skip,
        Some("shared") => WhenMissing::Shared,
        Some("deny") => WhenMissing::Deny,
        Some(other) => {
            return Err(fail(
                "when_missing",
                format!("{other:?} is not \"skip\", \"shared\" or \"deny\""),
            ))
        }
    };
    if when_missing != WhenMissing::Skip && by == Identity::Global {
        return Err(fail(
            "when_missing",
            "a rule by global always has its identity; leave when_missing out".into(),
        ));
    }
    let path = if spec.case_insensitive_paths {
        Glob::case_insensitive(&spec.path)
    } else {
        Glob::new(&spec.path)
    };
    Ok(Rule {
        name: spec.name.clone(),
        by,
        path,
        methods,
        hosts,
        tier: spec.tier.clone(),
        limit,
        window_ms,
        failure,
        shadow: spec.shadow,
        lease_ttl,
        global,
        when_missing,
    })
}

/// A leased rule's lease length, or why it cannot be leased.
fn lease_ttl(spec: &RuleSpec, limit: &Limit) -> Result<Option<Micros>, (&'static str, String)> {
    if !spec.lease {
        return match spec.lease_ttl {
            Some(_) => Err((
                "lease_ttl",
                "applies to leased rules: add lease = true, or leave it out".into(),
            )),
            None => Ok(None),
        };
    }
    crate::lease::leasable(limit).map_err(|e| ("lease", e.to_string()))?;
    lease_length(spec.lease_ttl.as_deref(), "lease_ttl").map(Some)
}
