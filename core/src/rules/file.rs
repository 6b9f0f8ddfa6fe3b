//! The rule file as written: TOML (or JSON) with `[[rule]]` and `[[override]]` tables.
//!
//! TOML is read through serde (its errors carry the line); JSON, which proxies fetch from
//! `GET /v1/rules`, through [`RuleFile::read`], so that the filter carries no serde
//! deserializer. Both read the same fields with the same defaults: the tests read every
//! field written one way back the other way.

use crate::json::{Json, JsonError};

/// The whole file, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct RuleFile {
    /// The rules, in evaluation order.
    #[cfg_attr(feature = "serde", serde(default, rename = "rule"))]
    pub rules: Vec<RuleSpec>,
    /// Temporary per-identity limits.
    #[cfg_attr(
        feature = "serde",
        serde(default, rename = "override", skip_serializing_if = "Vec::is_empty")
    )]
    pub overrides: Vec<OverrideSpec>,
}

fn star() -> String {
    "*".to_owned()
}
fn open() -> String {
    "open".to_owned()
}
fn zero_duration() -> String {
    "0ms".to_owned()
}
#[cfg(feature = "serde")]
fn is_star(s: &str) -> bool {
    s == "*"
}
#[cfg(feature = "serde")]
fn is_open(s: &str) -> bool {
    s == "open"
}
#[cfg(feature = "serde")]
fn is_zero_duration(s: &str) -> bool {
    s == "0ms"
}
#[cfg(feature = "serde")]
fn is_false(b: &bool) -> bool {
    !*b
}
#[cfg(feature = "serde")]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One `[[rule]]` as written; see docs/design.md for each field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct RuleSpec {
    /// Unique; the RateLimit policy name.
    pub name: String,
    /// Identity: `ip`, `user`, `api_key`, `tier`, `header:<name>` or `global`.
    pub by: String,
    /// Glob on the path; default `*`.
    #[cfg_attr(feature = "serde", serde(default = "star", skip_serializing_if = "is_star"))]
    pub path: String,
    /// Methods the rule applies to; empty means all.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Vec::is_empty"))]
    pub methods: Vec<String>,
    /// Hosts the rule applies to (the request's `Host`, port and case ignored; `*.domain`
    /// for its subdomains); empty means all.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Vec::is_empty"))]
    pub hosts: Vec<String>,
    /// The path glob matches whatever the case of ASCII letters; default off.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
    pub case_insensitive_paths: bool,
    /// What a request without the rule's identity does: `skip` the rule (default),
    /// count it in one `shared` bucket, or `deny` it.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub when_missing: Option<String>,
    /// Applies only when the request's `tier` identity equals this.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub tier: Option<String>,
    /// Algorithm name.
    pub algorithm: String,
    /// Requests (cost units) per window.
    pub limit: u64,
    /// Window duration, e.g. `1m`.
    pub window: String,
    /// Bucket capacity; 0 means `limit`.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_zero"))]
    pub burst: u64,
    /// `open` or `closed` when the store is unreachable; default `open`.
    #[cfg_attr(feature = "serde", serde(default = "open", skip_serializing_if = "is_open"))]
    pub failure: String,
    /// Leaky bucket only: delay instead of reject.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
    pub shaping: bool,
    /// Longest shaping delay; default `0ms`.
    #[cfg_attr(
        feature = "serde",
        serde(default = "zero_duration", skip_serializing_if = "is_zero_duration")
    )]
    pub max_delay: String,
    /// Count but never deny.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
    pub shadow: bool,
    /// Proxies may hold leases of this rule's quota and decide locally (see
    /// `sluice_core::lease`); default off: every request is an exact call.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
    pub lease: bool,
    /// How long a lease lasts; default `1s`.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub lease_ttl: Option<String>,
    /// One limit across every region: each region leases its share of the quota from the
    /// global store in the background (see `docs/design.md`, Regions); default off.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
    pub global: bool,
    /// How long a region's lease of a global quota lasts; default `1s`.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub global_ttl: Option<String>,
    /// What a region does when the global store cannot be reached: `spend` (default),
    /// `share` or `closed`.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub on_global_unreachable: Option<String>,
    /// With `share`: the percent of the limit a cut-off region may admit alone.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub global_share: Option<u64>,
}

/// One `[[override]]` as written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct OverrideSpec {
    /// The rule's name.
    pub rule: String,
    /// The identity value (e.g. the user id).
    pub identity: String,
    /// The limit that replaces the rule's for this identity.
    pub limit: u64,
    /// RFC 3339 end, e.g. `2026-12-31T00:00:00Z`.
    pub until: String,
}

impl RuleFile {
    /// Reads the JSON form, `{"rule": [...], "override": [...]}`, field for field as the
    /// TOML form is read.
    pub fn read(doc: &Json<'_>) -> Result<RuleFile, JsonError> {
        let mut f = doc.object()?;
        let file = RuleFile {
            rules: f.opt("rule", |v| v.each(RuleSpec::read)).unwrap_or_default(),
            overrides: f.opt("override", |v| v.each(OverrideSpec::read)).unwrap_or_default(),
        };
        f.finish().map(|()| file)
    }
}

impl RuleSpec {
    fn read(v: &Json<'_>) -> Result<RuleSpec, JsonError> {
        let mut f = v.object()?;
        let flag = |f: &mut crate::json::Fields<'_, '_>, name| f.opt(name, Json::bool).unwrap_or(false);
        let spec = RuleSpec {
            name: f.req("name", Json::string),
            by: f.req("by", Json::string),
            path: f.opt("path", Json::string).unwrap_or_else(star),
            methods: f.opt("methods", |v| v.each(Json::string)).unwrap_or_default(),
            hosts: f.opt("hosts", |v| v.each(Json::string)).unwrap_or_default(),
            case_insensitive_paths: flag(&mut f, "case_insensitive_paths"),
            when_missing: f.opt("when_missing", Json::string),
            tier: f.opt("tier", Json::string),
            algorithm: f.req("algorithm", Json::string),
            limit: f.req("limit", Json::u64),
            window: f.req("window", Json::string),
            burst: f.opt("burst", Json::u64).unwrap_or(0),
            failure: f.opt("failure", Json::string).unwrap_or_else(open),
            shaping: flag(&mut f, "shaping"),
            max_delay: f.opt("max_delay", Json::string).unwrap_or_else(zero_duration),
            shadow: flag(&mut f, "shadow"),
            lease: flag(&mut f, "lease"),
            lease_ttl: f.opt("lease_ttl", Json::string),
            global: flag(&mut f, "global"),
            global_ttl: f.opt("global_ttl", Json::string),
            on_global_unreachable: f.opt("on_global_unreachable", Json::string),
            global_share: f.opt("global_share", Json::u64),
        };
        f.finish().map(|()| spec)
    }
}

impl OverrideSpec {
    fn read(v: &Json<'_>) -> Result<OverrideSpec, JsonError> {
        let mut f = v.object()?;
        let spec = OverrideSpec {
            rule: f.req("rule", Json::string),
            identity: f.req("identity", Json::string),
            limit: f.req("limit", Json::u64),
            until: f.req("until", Json::string),
        };
        f.finish().map(|()| spec)
    }
}
