//! Wire types of `POST /v1/check`: the request a proxy sends and the decision it gets back.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::algorithm::Decision;
use crate::headers::Quota;
use crate::json::{self, Fields, Json, JsonError};
use crate::rules::host::{is_host, MAX_HOST_BYTES};
use crate::text::truncate;

mod slots;
pub use slots::{Slot, SlotsCall, SlotsRequest, SlotsResponse, MAX_BATCH, MAX_BATCH_BYTES, MAX_SLOTS_A_CALL};

/// The longest a shaped request is held (a rule's `max_delay`, the service's `/v1/wait`):
/// the request holds a proxy stream and a connection meanwhile.
pub const MAX_HOLD_MS: u64 = 60_000;
/// Most identities one request may carry.
pub const MAX_IDENTITIES: usize = 16;
/// Longest identity key or value, in bytes.
pub const MAX_IDENTITY_BYTES: usize = 256;
/// Largest request cost.
pub const MAX_COST: u64 = 1_000_000;
/// Longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest method, in bytes.
pub const MAX_METHOD_BYTES: usize = 16;

/// Whether `s` is a non-empty HTTP token (RFC 9110 `tchar`s), as methods and header names are.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The method a check request carries for `method`: itself when it is an HTTP token of at
/// most [`MAX_METHOD_BYTES`], else `OTHER`. No rule can name such a method, and the service
/// refuses a request that carries one: a caller forwarding a client's method uses this, so
/// that a client cannot make its checks fail.
pub fn check_method(method: &str) -> &str {
    if method.len() <= MAX_METHOD_BYTES && is_token(method) {
        method
    } else {
        "OTHER"
    }
}

/// A check request that cannot be used; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct WireError(pub String);

/// `POST /v1/check` request body.
///
/// `{"identities": {"ip": "203.0.113.9", "user": "42"}, "method": "GET", "path": "/api/search", "cost": 1}`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckRequest {
    /// Identity name (`ip`, `user`, `api_key`, `tier`, `header:<name>`) → value; at most
    /// [`MAX_IDENTITIES`], keys 1 to [`MAX_IDENTITY_BYTES`] bytes, values at most that.
    pub identities: BTreeMap<String, String>,
    /// HTTP method of the request being limited: an HTTP token of 1 to [`MAX_METHOD_BYTES`] bytes.
    pub method: String,
    /// Path of the request being limited: 1 to [`MAX_PATH_BYTES`] bytes.
    pub path: String,
    /// The request's weight, 0..=[`MAX_COST`]; default 1. Cost 0 is a peek: what a request
    /// would get now, spending nothing.
    pub cost: u64,
    /// The request's host (its `Host`/`:authority`; a port is ignored), for rules naming
    /// `hosts`: 1 to [`MAX_HOST_BYTES`] printable bytes. Absent, only rules naming no host
    /// apply.
    pub host: Option<String>,
}

impl CheckRequest {
    /// Parses and validates a request body (a JSON object; see [`CheckRequest::validate`]).
    ///
    /// Every error message starts `invalid check request: ` for JSON problems (naming the
    /// field where there is one, or listing the expected fields for an unknown one) and
    /// names the field and the limit otherwise.
    pub fn from_json(body: &[u8]) -> Result<CheckRequest, WireError> {
        if !matches!(body.trim_ascii_start().first(), Some(b'{') | None) {
            return Err(WireError("invalid check request: expected a JSON object".into()));
        }
        let req = json::parse(body)
            .and_then(|doc| CheckRequest::read(&doc))
            .map_err(|e| WireError(format!("invalid check request: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    /// Reads a request's fields from a JSON object, unvalidated.
    pub(crate) fn read(doc: &Json<'_>) -> Result<CheckRequest, JsonError> {
        let mut f = doc.object()?;
        let req = CheckRequest {
            identities: f.req("identities", read_identities),
            method: f.req("method", Json::string),
            path: f.req("path", Json::string),
            cost: f.opt("cost", Json::u64).unwrap_or(1),
            host: f.opt("host", Json::string),
        };
        f.finish().map(|()| req)
    }

    /// The request as JSON, as [`CheckRequest::from_json`] reads it.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(96 + self.path.len());
        let mut o = json::Object::new(&mut out);
        o.key("identities");
        let mut identities = json::Object::new(o.out());
        for (k, v) in &self.identities {
            identities.str(k, v);
        }
        identities.end();
        o.str("method", &self.method);
        o.str("path", &self.path);
        o.u64("cost", self.cost);
        if let Some(host) = &self.host {
            o.str("host", host);
        }
        o.end();
        out
    }

    /// Checks the limits on sizes and ranges: at most [`MAX_IDENTITIES`] identities, keys 1
    /// to [`MAX_IDENTITY_BYTES`] bytes and values at most that, the method an HTTP token of
    /// at most [`MAX_METHOD_BYTES`] bytes, the path 1 to [`MAX_PATH_BYTES`] bytes and the cost
    /// in 0..=[`MAX_COST`] (0: a peek).
    pub fn validate(&self) -> Result<(), WireError> {
        if self.identities.len() > MAX_IDENTITIES {
            return Err(WireError(format!(
                "identities: {} given; at most {MAX_IDENTITIES}",
                self.identities.len()
            )));
        }
        for (k, v) in &self.identities {
            if k.is_empty() {
                return Err(WireError("identity key is empty".into()));
            }
            if k.len() > MAX_IDENTITY_BYTES {
                return Err(WireError(format!(
                    "identity key `{}…` is {} bytes; at most {MAX_IDENTITY_BYTES}",
                    truncate(k, SHOWN_BYTES),
                    k.len()
                )));
            }
            if v.len() > MAX_IDENTITY_BYTES {
                return Err(WireError(format!(
                    "identity `{}` value is {} bytes; at most {MAX_IDENTITY_BYTES}",
                    truncate(k, SHOWN_BYTES),
                    v.len()
                )));
            }
        }
        if self.method.len() > MAX_METHOD_BYTES || !is_token(&self.method) {
            return Err(WireError(format!(
                "method `{}` is not an HTTP method: 1 to {MAX_METHOD_BYTES} token characters",
                truncate(&self.method, SHOWN_BYTES)
            )));
        }
        if self.path.is_empty() || self.path.len() > MAX_PATH_BYTES {
            return Err(WireError(format!(
                "path is {} bytes; must be 1 to {MAX_PATH_BYTES}",
                self.path.len()
            )));
        }
        if self.cost > MAX_COST {
            return Err(WireError(format!("cost {} out of range 0..={MAX_COST}", self.cost)));
        }
        if let Some(host) = self.host.as_deref().filter(|h| !is_host(h)) {
            return Err(WireError(format!(
                "host `{}` ({} bytes) is not a host: 1 to {MAX_HOST_BYTES} printable bytes without spaces, `/ ? # @ {{ }} ,`",
                truncate(host, SHOWN_BYTES),
                host.len()
            )));
        }
        Ok(())
    }
}

/// A check's `identities`: an object of strings, any number of them ([`CheckRequest::validate`]
/// counts them).
fn read_identities(v: &Json<'_>) -> Result<BTreeMap<String, String>, JsonError> {
    let Json::Object(members) = v else {
        return v.object().map(|_| BTreeMap::new());
    };
    members
        .iter()
        .map(|(k, v)| Ok((k.to_string(), v.string().map_err(|e| e.within(k))?)))
        .collect()
}

/// How much of a refused value an error message shows: enough to recognise it.
const SHOWN_BYTES: usize = 40;

/// One rule's part in a decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleResult {
    /// The rule's name.
    pub name: String,
    /// Whether this rule admitted the request.
    pub allowed: bool,
    /// Its limit.
    pub limit: u64,
    /// What it has left.
    pub remaining: u64,
    /// Milliseconds until it resets.
    pub reset_after_ms: u64,
}

/// `POST /v1/check` response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResponse {
    /// Whether the request may pass.
    pub allowed: bool,
    /// The most restrictive rule's limit.
    pub limit: u64,
    /// Its remaining.
    pub remaining: u64,
    /// Milliseconds until it resets.
    pub reset_after_ms: u64,
    /// Milliseconds to wait before retrying (0 when allowed).
    pub retry_after_ms: u64,
    /// When it resets, unix seconds.
    pub reset_at: u64,
    /// Its name; absent when no rule matched.
    pub policy: Option<String>,
    /// Its window in milliseconds; 0 for a limit on requests in flight (a concurrency
    /// rule), which has none.
    pub window_ms: u64,
    /// Every matching rule's result.
    pub rules: Vec<RuleResult>,
    /// Hold the request this long before forwarding (shaping); at most [`MAX_HOLD_MS`].
    pub delay_ms: u64,
    /// The decision came from a node-local fallback: the store was unreachable.
    pub degraded: bool,
    /// The concurrency slots the request took: the caller gives each back when the request
    /// ends, and renews it while the request runs (`POST /v1/slots`). Empty for a refusal.
    pub slots: Vec<Slot>,
}

impl Default for CheckResponse {
    fn default() -> Self {
        CheckResponse {
            allowed: true,
            limit: 0,
            remaining: 0,
            reset_after_ms: 0,
            retry_after_ms: 0,
            reset_at: 0,
            policy: None,
            window_ms: 0,
            rules: Vec::new(),
            delay_ms: 0,
            degraded: false,
            slots: Vec::new(),
        }
    }
}

/// One matching rule's outcome, as the service evaluated it.
#[derive(Debug, Clone, Copy)]
pub struct RuleOutcome<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The rule's window in milliseconds.
    pub window_ms: u64,
    /// Shadow rules count but never deny.
    pub shadow: bool,
    /// The decision.
    pub decision: Decision,
    /// Decided by the local fallback.
    pub degraded: bool,
}

/// Of several limits, the one whose quota a client is shown (`of` gives each one's decision,
/// if it was decided, and whether it is a shadow): the most restrictive enforced one —
/// refusing first, then the least remaining, then the longest reset. The check's answer and
/// the gRPC service's headers both show this one.
pub fn headline<T>(items: &[T], of: impl Fn(&T) -> Option<(&Decision, bool)>) -> Option<&T> {
    items
        .iter()
        .filter_map(|t| of(t).filter(|(_, shadow)| !shadow).map(|(d, _)| (t, d)))
        .min_by_key(|(_, d)| (d.allowed, d.remaining, std::cmp::Reverse(d.reset_after)))
        .map(|(t, _)| t)
}

impl CheckResponse {
    /// Combines the outcomes of every matching rule into the response.
    ///
    /// Allowed when every non-shadow rule allows. The headline fields describe the most
    /// restrictive non-shadow rule (least remaining, then longest reset; denying rules
    /// first); `retry_after_ms` is the longest among denying rules, `delay_ms` the longest delay.
    pub fn from_outcomes(outcomes: &[RuleOutcome<'_>], now_ms: u64) -> CheckResponse {
        let enforced = || outcomes.iter().filter(|o| !o.shadow);
        let allowed = enforced().all(|o| o.decision.allowed);
        let headline = headline(outcomes, |o| Some((&o.decision, o.shadow)));
        let mut response = CheckResponse {
            allowed,
            retry_after_ms: enforced()
                .filter(|o| !o.decision.allowed)
                .map(|o| o.decision.retry_after.wait_ms())
                .max()
                .unwrap_or(0),
            delay_ms: if allowed {
                enforced().map(|o| o.decision.delay.wait_ms()).max().unwrap_or(0)
            } else {
                0
            },
            degraded: outcomes.iter().any(|o| o.degraded),
            rules: outcomes
                .iter()
                .map(|o| RuleResult {
                    name: o.rule.to_owned(),
                    allowed: o.decision.allowed,
                    limit: o.decision.limit,
                    remaining: o.decision.remaining,
                    reset_after_ms: o.decision.reset_after.wait_ms(),
                })
                .collect(),
            ..CheckResponse::default()
        };
        if let Some(h) = headline {
            response.limit = h.decision.limit;
            response.remaining = h.decision.remaining;
            response.reset_after_ms = h.decision.reset_after.wait_ms();
            response.reset_at = now_ms.saturating_add(response.reset_after_ms).div_ceil(1000);
            response.policy = Some(h.rule.to_owned());
            response.window_ms = h.window_ms;
        }
        response
    }

    /// The quota this answer advertises at `now_ms`: its headline rule's, with
    /// `retry_after_ms` on a denial. When no rule is named, the policy is empty and every
    /// number zero (a denial still carries its `retry_after_ms`).
    pub fn quota(&self, now_ms: u64) -> Quota<'_> {
        let retry_after_ms = (!self.allowed).then_some(self.retry_after_ms);
        match self.policy.as_deref() {
            Some(policy) => Quota {
                policy,
                limit: self.limit,
                remaining: self.remaining,
                reset_after_ms: self.reset_after_ms,
                window_ms: self.window_ms,
                retry_after_ms,
                now_ms,
            },
            None => Quota {
                policy: "",
                limit: 0,
                remaining: 0,
                reset_after_ms: 0,
                window_ms: 0,
                retry_after_ms,
                now_ms,
            },
        }
    }

    /// The answer as JSON, as [`CheckResponse::from_json`] reads it (`policy` absent when
    /// no rule matched).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(160 + 64 * self.rules.len());
        let mut o = json::Object::new(&mut out);
        o.bool("allowed", self.allowed);
        o.u64("limit", self.limit);
        o.u64("remaining", self.remaining);
        o.u64("reset_after_ms", self.reset_after_ms);
        o.u64("retry_after_ms", self.retry_after_ms);
        o.u64("reset_at", self.reset_at);
        if let Some(policy) = &self.policy {
            o.str("policy", policy);
        }
        o.u64("window_ms", self.window_ms);
        o.key("rules");
        json::write_each(o.out(), &self.rules, |out, r| r.write(out));
        o.u64("delay_ms", self.delay_ms);
        o.bool("degraded", self.degraded);
        if !self.slots.is_empty() {
            o.key("slots");
            json::write_each(o.out(), &self.slots, |out, slot| slot.write(out));
        }
        o.end();
        out
    }

    /// Parses a response body leniently: unknown fields are ignored and missing ones
    /// default, except the verdict. A body without `allowed` (`{}`, or whatever a proxy in
    /// between answers) is an error for the caller's failure policy, never an allow.
    ///
    /// Read member by member as the text comes ([`json::read_members`]): the filter reads
    /// one on every checked request.
    pub fn from_json(body: &[u8]) -> Result<CheckResponse, WireError> {
        let mut answer = CheckResponse::default();
        let mut allowed = None;
        json::read_members(body, |name, v| {
            answer.read_member(name, &v, &mut allowed).map_err(|e| e.within(name))
        })
        .and_then(|()| {
            let allowed = allowed.ok_or_else(|| JsonError::new("required but missing").within("allowed"))?;
            Ok(CheckResponse { allowed, ..answer })
        })
        .map_err(|e| WireError(format!("invalid check response: {e}")))
    }

    /// Member `name` of an answer, `v`, read into it (`allowed` into `allowed`): `null` as
    /// absent, a name it does not know ignored (a newer service's).
    fn read_member(&mut self, name: &str, v: &Json<'_>, allowed: &mut Option<bool>) -> Result<(), JsonError> {
        if *v == Json::Null {
            return Ok(());
        }
        match name {
            "allowed" => *allowed = Some(v.bool()?),
            "limit" => self.limit = v.u64()?,
            "remaining" => self.remaining = v.u64()?,
            "reset_after_ms" => self.reset_after_ms = v.u64()?,
            "retry_after_ms" => self.retry_after_ms = v.u64()?,
            "reset_at" => self.reset_at = v.u64()?,
            "policy" => self.policy = Some(v.string()?),
            "window_ms" => self.window_ms = v.u64()?,
            "rules" => self.rules = v.each(RuleResult::read)?,
            "delay_ms" => self.delay_ms = v.u64()?,
            "degraded" => self.degraded = v.bool()?,
            "slots" => self.slots = v.each(Slot::read)?,
            _ => {}
        }
        Ok(())
    }
}

/// A number field of an answer, 0 when absent.
fn number(f: &mut Fields<'_, '_>, name: &'static str) -> u64 {
    f.opt(name, Json::u64).unwrap_or(0)
}

impl RuleResult {
    fn write(&self, out: &mut String) {
        let mut o = json::Object::new(out);
        o.str("name", &self.name);
        o.bool("allowed", self.allowed);
        o.u64("limit", self.limit);
        o.u64("remaining", self.remaining);
        o.u64("reset_after_ms", self.reset_after_ms);
        o.end();
    }

    fn read(v: &Json<'_>) -> Result<RuleResult, JsonError> {
        let mut f = v.object()?;
        let result = RuleResult {
            name: f.opt("name", Json::string).unwrap_or_default(),
            allowed: f.opt("allowed", Json::bool).unwrap_or(false),
            limit: number(&mut f, "limit"),
            remaining: number(&mut f, "remaining"),
            reset_after_ms: number(&mut f, "reset_after_ms"),
        };
        f.finish_lenient().map(|()| result)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::{prop, Strategy};

    use super::*;
    use crate::time::Micros;

    fn req(json: &str) -> Result<CheckRequest, String> {
        CheckRequest::from_json(json.as_bytes()).map_err(|e| e.0)
    }

    #[test]
    fn accepts_design_example_and_defaults_cost() {
        let r =
            req(r#"{"identities":{"ip":"203.0.113.9","user":"42","tier":"free"},"method":"GET","path":"/api/search"}"#)
                .unwrap();
        assert_eq!(r.cost, 1);
        assert_eq!(r.identities["user"], "42");
    }

    #[test]
    fn every_limit_is_named() {
        let big = "x".repeat(257);
        let many: Vec<String> = (0..17).map(|i| format!("\"k{i}\":\"v\"")).collect();
        let cases = [
            (
                r#"{"identities":{},"method":"GET","path":"/","cost":1,"extra":1}"#.to_owned(),
                "unknown field `extra`, expected one of identities, method, path, cost, host",
            ),
            (
                r#"{"identities":{},"method":"GET","path":"/","cost":1000001}"#.to_owned(),
                "cost 1000001 out of range",
            ),
            (
                r#"{"identities":{},"method":"GET","path":"/","cost":-1}"#.to_owned(),
                "cost: expected an unsigned integer, found -1",
            ),
            (
                format!(r#"{{"identities":{{{}}},"method":"GET","path":"/"}}"#, many.join(",")),
                "identities: 17 given",
            ),
            (
                format!(r#"{{"identities":{{"{big}":"v"}},"method":"GET","path":"/"}}"#),
                "is 257 bytes",
            ),
            (
                format!(r#"{{"identities":{{"ip":"{big}"}},"method":"GET","path":"/"}}"#),
                "value is 257 bytes",
            ),
            (r#"{"identities":{},"method":"G T","path":"/"}"#.to_owned(), "method"),
            (
                r#"{"identities":{},"method":"GET","path":""}"#.to_owned(),
                "path is 0 bytes",
            ),
            (
                r#"{"identities":{},"method":"GET"}"#.to_owned(),
                "path: required but missing",
            ),
            ("{not json".to_owned(), "invalid check request"),
        ];
        for (body, want) in cases {
            let err = req(&body).unwrap_err();
            assert!(err.contains(want), "{body}: {err} (wanted {want})");
        }
    }

    fn outcome(rule: &str, allowed: bool, remaining: u64, reset_ms: u64, shadow: bool) -> RuleOutcome<'_> {
        RuleOutcome {
            rule,
            window_ms: 60_000,
            shadow,
            degraded: false,
            decision: Decision {
                allowed,
                limit: 100,
                remaining,
                reset_after: Micros::from_ms(reset_ms),
                retry_after: if allowed {
                    Micros::ZERO
                } else {
                    Micros::from_ms(reset_ms)
                },
                delay: Micros::ZERO,
            },
        }
    }

    #[test]
    fn most_restrictive_rule_heads_the_response_and_shadow_never_denies() {
        let outcomes = [
            outcome("a", true, 10, 5_000, false),
            outcome("b", true, 3, 1_000, false),
            outcome("c", true, 3, 9_000, false),
            outcome("s", false, 0, 30_000, true),
        ];
        let r = CheckResponse::from_outcomes(&outcomes, 1_774_312_800_000);
        assert!(r.allowed);
        assert_eq!(r.policy.as_deref(), Some("c"));
        assert_eq!((r.remaining, r.reset_after_ms, r.reset_at), (3, 9_000, 1_774_312_809));
        assert_eq!(r.rules.len(), 4);
        let denied = CheckResponse::from_outcomes(
            &[
                outcome("a", true, 0, 50_000, false),
                outcome("b", false, 0, 7_000, false),
            ],
            0,
        );
        assert!(!denied.allowed);
        assert_eq!((denied.policy.as_deref(), denied.retry_after_ms), (Some("b"), 7_000));
    }

    #[test]
    fn no_rules_means_allowed_without_policy_and_round_trips() {
        let r = CheckResponse::from_outcomes(&[], 0);
        assert!(r.allowed && r.policy.is_none());
        let json = r.to_json();
        assert!(!json.contains("policy"));
        assert_eq!(CheckResponse::from_json(json.as_bytes()).unwrap(), r);
        let lenient = CheckResponse::from_json(br#"{"allowed":false,"future_field":1}"#).unwrap();
        assert!(!lenient.allowed);
    }

    /// The reader `from_json` replaced: the document's tree, read field by field. What the
    /// member-by-member reader must agree with, on every input.
    fn from_json_tree(body: &[u8]) -> Result<CheckResponse, JsonError> {
        let doc = json::parse(body)?;
        let mut f = doc.object()?;
        let answer = CheckResponse {
            allowed: f.req("allowed", Json::bool),
            limit: number(&mut f, "limit"),
            remaining: number(&mut f, "remaining"),
            reset_after_ms: number(&mut f, "reset_after_ms"),
            retry_after_ms: number(&mut f, "retry_after_ms"),
            reset_at: number(&mut f, "reset_at"),
            policy: f.opt("policy", Json::string),
            window_ms: number(&mut f, "window_ms"),
            rules: f.opt("rules", |v| v.each(RuleResult::read)).unwrap_or_default(),
            delay_ms: number(&mut f, "delay_ms"),
            degraded: f.opt("degraded", Json::bool).unwrap_or(false),
            slots: f.opt("slots", |v| v.each(Slot::read)).unwrap_or_default(),
        };
        f.finish_lenient().map(|()| answer)
    }

    /// An answer's member: a name the reader knows or not, and a value of the kind its name
    /// takes, or (one time in five) of any kind, well formed or not.
    fn member() -> impl Strategy<Value = String> {
        const NUMBERS: &[&str] = &["0", "7", "18446744073709551615"];
        const BOOLS: &[&str] = &["true", "false"];
        const STRINGS: &[&str] = &["\"per-ip\"", "\"a\\\"b\"", "\"\\u00e9\""];
        const RULES: &[&str] = &[
            "[]",
            "[{\"name\":\"a\",\"allowed\":true,\"limit\":5,\"remaining\":3,\"reset_after_ms\":9}]",
        ];
        const SLOTS: &[&str] = &["[]", "[{\"rule\":\"c\",\"at\":12,\"window_ms\":1000}]"];
        const ANY: &[&str] = &[
            "null",
            "18446744073709551616",
            "-1",
            "1.5",
            "1e3",
            "{}",
            "{\"x\":[1,{\"y\":null}]}",
            "[{\"name\":\"a\",\"name\":\"b\"}]",
            "[{\"rule\":\"c\"}]",
            "[1]",
            "tru",
            "\"open",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
            "true",
            "0",
            "\"s\"",
        ];
        let names: [(&str, &[&str]); 14] = [
            ("allowed", BOOLS),
            ("limit", NUMBERS),
            ("remaining", NUMBERS),
            ("reset_after_ms", NUMBERS),
            ("retry_after_ms", NUMBERS),
            ("reset_at", NUMBERS),
            ("policy", STRINGS),
            ("window_ms", NUMBERS),
            ("rules", RULES),
            ("delay_ms", NUMBERS),
            ("degraded", BOOLS),
            ("slots", SLOTS),
            ("future", ANY),
            ("Allowed", BOOLS),
        ];
        (
            0..names.len(),
            0usize..5,
            0usize..64,
            prop::sample::select(vec!["", " ", "\n\t"]),
        )
            .prop_map(move |(n, odds, pick, ws)| {
                let (name, good) = names[n];
                let values = if odds == 0 { ANY } else { good };
                format!("{ws}\"{name}\"{ws}:{ws}{}{ws}", values[pick % values.len()])
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        #[test]
        fn the_member_reader_agrees_with_the_tree_it_replaced(
            allowed in proptest::option::of(prop::sample::select(vec!["true", "false"])),
            members in proptest::collection::vec(member(), 0..8),
            cut in proptest::option::weighted(0.1, 0usize..400),
            tail in prop::sample::select(vec!["", "", "", " ", "x", ",", "}"]),
        ) {
            let members: Vec<String> = allowed.map(|a| format!("\"allowed\":{a}")).into_iter().chain(members).collect();
            let mut text = format!("{{{}}}{tail}", members.join(","));
            if let Some(at) = cut.filter(|at| *at < text.len() && text.is_char_boundary(*at)) {
                text.truncate(at);
            }
            let new = CheckResponse::from_json(text.as_bytes());
            let old = from_json_tree(text.as_bytes());
            proptest::prop_assert_eq!(new.as_ref().ok(), old.as_ref().ok(), "{}: {:?} against {:?}", text, new, old);
        }

        #[test]
        fn any_bytes_read_the_same_either_way(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            proptest::prop_assert_eq!(CheckResponse::from_json(&bytes).ok(), from_json_tree(&bytes).ok());
        }
    }

    #[test]
    fn the_quota_of_an_answer_is_its_headline_rule_and_a_denial_always_says_when_to_retry() {
        let denied = CheckResponse::from_outcomes(&[outcome("b", false, 0, 7_000, false)], 5_000);
        let q = denied.quota(5_000);
        assert_eq!((q.policy, q.limit, q.window_ms), ("b", 100, 60_000));
        assert_eq!(
            (q.reset_after_ms, q.retry_after_ms, q.now_ms),
            (7_000, Some(7_000), 5_000)
        );
        let allowed = CheckResponse::from_outcomes(&[outcome("a", true, 4, 1_000, false)], 0);
        assert_eq!(allowed.quota(0).retry_after_ms, None);
        let bare = CheckResponse::from_json(br#"{"allowed":false,"limit":9,"retry_after_ms":2000}"#).unwrap();
        let q = bare.quota(1);
        assert_eq!((q.policy, q.limit, q.retry_after_ms), ("", 0, Some(2_000)));
    }
}
