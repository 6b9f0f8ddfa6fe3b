//! The rule file as written: TOML (or JSON) with `[[rule]]` and `[[override]]` tables.

use serde::{Deserialize, Serialize};

/// The whole file, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// The rules, in evaluation order.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleSpec>,
    /// Temporary per-identity limits.
    #[serde(default, rename = "override", skip_serializing_if = "Vec::is_empty")]
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
fn is_star(s: &str) -> bool {
    s == "*"
}
fn is_open(s: &str) -> bool {
    s == "open"
}
fn is_zero_duration(s: &str) -> bool {
    s == "0ms"
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One `[[rule]]` as written; see docs/design.md for each field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique; the RateLimit policy name.
    pub name: String,
    /// Identity: `ip`, `user`, `api_key`, `tier`, `header:<name>` or `global`.
    pub by: String,
    /// Glob on the path; default `*`.
    #[serde(default = "star", skip_serializing_if = "is_star")]
    pub path: String,
    /// Methods the rule applies to; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// The path glob matches whatever the case of ASCII letters; default off.
    #[serde(default, skip_serializing_if = "is_false")]
    pub case_insensitive_paths: bool,
    /// What a request without the rule's identity does: `skip` the rule (default),
    /// count it in one `shared` bucket, or `deny` it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_missing: Option<String>,
    /// Applies only when the request's `tier` identity equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Algorithm name.
    pub algorithm: String,
    /// Requests (cost units) per window.
    pub limit: u64,
    /// Window duration, e.g. `1m`.
    pub window: String,
    /// Bucket capacity; 0 means `limit`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub burst: u64,
    /// `open` or `closed` when the store is unreachable; default `open`.
    #[serde(default = "open", skip_serializing_if = "is_open")]
    pub failure: String,
    /// Leaky bucket only: delay instead of reject.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shaping: bool,
    /// Longest shaping delay; default `0ms`.
    #[serde(default = "zero_duration", skip_serializing_if = "is_zero_duration")]
    pub max_delay: String,
    /// Count but never deny.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow: bool,
    /// Proxies may hold leases of this rule's quota and decide locally (see
    /// `sluice_core::lease`); default off: every request is an exact call.
    #[serde(default, skip_serializing_if = "is_false")]
    pub lease: bool,
    /// How long a lease lasts; default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<String>,
    /// One limit across every region: each region leases its share of the quota from the
    /// global store in the background (see `docs/design.md`, Regions); default off.
    #[serde(default, skip_serializing_if = "is_false")]
    pub global: bool,
    /// How long a region's lease of a global quota lasts; default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_ttl: Option<String>,
    /// What a region does when the global store cannot be reached: `spend` (default),
    /// `share` or `closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_global_unreachable: Option<String>,
    /// With `share`: the percent of the limit a cut-off region may admit alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_share: Option<u64>,
}

/// One `[[override]]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
