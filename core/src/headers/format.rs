//! Formatting the headers and the 429 body that the filter sends.

use crate::algorithm::Decision;
use crate::lease::book::Left;
use crate::text::push_u64;

/// Which header families to send; the filter's `"headers"` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderMode {
    /// `X-RateLimit-*` and the IETF `RateLimit`/`RateLimit-Policy`.
    #[default]
    All,
    /// Only `X-RateLimit-*`.
    Legacy,
    /// Only the IETF fields.
    Ietf,
    /// No quota headers (a 429 still carries `Retry-After`).
    None,
}

impl HeaderMode {
    /// The mode called `name` (`all`, `legacy`, `ietf` or `none`).
    pub fn from_name(name: &str) -> Option<HeaderMode> {
        Some(match name {
            "all" => HeaderMode::All,
            "legacy" => HeaderMode::Legacy,
            "ietf" => HeaderMode::Ietf,
            "none" => HeaderMode::None,
            _ => return None,
        })
    }
}

/// The quota to advertise: the most restrictive rule of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota<'a> {
    /// The policy (rule) name.
    pub policy: &'a str,
    /// Requests per window.
    pub limit: u64,
    /// Requests left.
    pub remaining: u64,
    /// Milliseconds until the quota resets.
    pub reset_after_ms: u64,
    /// The policy's window in milliseconds; 0 for a limit on requests in flight, which has
    /// none (`RateLimit-Policy` then names its unit, `qu="concurrent-requests"`).
    pub window_ms: u64,
    /// Milliseconds the client must wait; `Some` on a denial only.
    pub retry_after_ms: Option<u64>,
    /// The current time, unix milliseconds (for the absolute `X-RateLimit-Reset`).
    pub now_ms: u64,
}

impl<'a> Quota<'a> {
    /// The quota one limit's decision advertises as `policy`, whose window is `window_ms`, at
    /// `now_ms`: times rounded up to whole milliseconds, `retry_after_ms` on a denial only.
    pub fn from_decision(policy: &'a str, decision: &Decision, window_ms: u64, now_ms: u64) -> Quota<'a> {
        Quota {
            policy,
            limit: decision.limit,
            remaining: decision.remaining,
            reset_after_ms: decision.reset_after.wait_ms(),
            window_ms,
            retry_after_ms: (!decision.allowed).then(|| decision.retry_after.wait_ms()),
            now_ms,
        }
    }

    /// The quota a spend of a lease advertises as `policy` at `now_ms`: what the proxy's
    /// leases say the quota holds ([`Left`]); never a denial (a lease only ever admits).
    pub fn from_lease(policy: &'a str, left: &Left, now_ms: u64) -> Quota<'a> {
        Quota {
            policy,
            limit: left.limit,
            remaining: left.remaining,
            reset_after_ms: left.reset_after_ms,
            window_ms: left.window_ms,
            retry_after_ms: None,
            now_ms,
        }
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early.
fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The `Retry-After` seconds for a denial: `retry_after_ms` rounded up, at least 1 (a
/// denial never says "retry after 0 seconds"). The header and the 429 body both use it.
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    ceil_secs(retry_after_ms).max(1)
}

/// The most headers one quota produces.
const MAX_HEADERS: usize = 6;

/// A reusable set of formatted headers: every value lives in one `String`, so that once
/// warmed up, [`write_headers`] formats a full set without allocating.
#[derive(Debug, Clone, Default)]
pub struct HeaderBuf {
    text: String,
    entries: [(&'static str, usize, usize); MAX_HEADERS],
    len: usize,
}

impl HeaderBuf {
    /// An empty set.
    pub fn new() -> HeaderBuf {
        HeaderBuf {
            text: String::with_capacity(160),
            ..HeaderBuf::default()
        }
    }

    /// Forgets every header, keeping the memory.
    pub fn clear(&mut self) {
        self.text.clear();
        self.len = 0;
    }

    /// How many headers are held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no header is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The headers as `(name, value)` pairs, in the order of docs/design.md.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.entries
            .iter()
            .take(self.len)
            .map(|&(name, start, end)| (name, self.text.get(start..end).unwrap_or("")))
    }

    /// The value of header `name` (ASCII case-insensitive), if held.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v)
    }

    /// Appends a header whose value `write` produces.
    fn push(&mut self, name: &'static str, write: impl FnOnce(&mut String)) {
        let Some(entry) = self.entries.get_mut(self.len) else {
            return;
        };
        let start = self.text.len();
        write(&mut self.text);
        *entry = (name, start, self.text.len());
        self.len += 1;
    }
}

/// The `RateLimit-Policy` parameter of a quota of requests in flight (a concurrency limit,
/// `window_ms` 0): the IETF draft's quota unit for them, in place of a window it has not.
const CONCURRENT: &str = ";qu=\"concurrent-requests\"";

/// Formats the headers for `quota` into `buf` (cleared first), in the order of docs/design.md:
/// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (unix seconds of
/// `now_ms + reset_after_ms`, rounded up), `RateLimit-Policy` (`"name";q=limit;w=window
/// seconds`, or `"name";q=limit;qu="concurrent-requests"` without a window), `RateLimit` (`"name";r=remaining;t=reset seconds`, rounded up) and, whenever
/// `retry_after_ms` is set, `Retry-After` ([`retry_after_secs`]: rounded up, at least 1).
/// `mode` selects the families; `Retry-After` is sent in every mode.
pub fn write_headers(quota: &Quota<'_>, mode: HeaderMode, buf: &mut HeaderBuf) {
    buf.clear();
    // Room for a full set at once: a buffer made empty (a stream's) would otherwise grow
    // several times on its first set.
    buf.text.reserve(160);
    if matches!(mode, HeaderMode::All | HeaderMode::Legacy) {
        let reset_at = ceil_secs(quota.now_ms.saturating_add(quota.reset_after_ms));
        buf.push("X-RateLimit-Limit", |s| push_u64(s, quota.limit));
        buf.push("X-RateLimit-Remaining", |s| push_u64(s, quota.remaining));
        buf.push("X-RateLimit-Reset", |s| push_u64(s, reset_at));
    }
    if matches!(mode, HeaderMode::All | HeaderMode::Ietf) {
        buf.push("RateLimit-Policy", |s| {
            if quota.window_ms == 0 {
                // No window: a limit on requests at once, in the draft's own unit.
                push_sf_string(s, quota.policy);
                s.push_str(";q=");
                push_u64(s, quota.limit);
                s.push_str(CONCURRENT);
            } else {
                push_item(s, quota.policy, [("q", quota.limit), ("w", ceil_secs(quota.window_ms))])
            }
        });
        let reset = ceil_secs(quota.reset_after_ms);
        buf.push("RateLimit", |s| {
            push_item(s, quota.policy, [("r", quota.remaining), ("t", reset)])
        });
    }
    if let Some(retry) = quota.retry_after_ms {
        buf.push("Retry-After", |s| push_u64(s, retry_after_secs(retry)));
    }
}

/// The response header a browser reads to let a page on another origin see other headers
/// (the Fetch standard's CORS-safelisted response headers leave out every rate-limit one).
pub const EXPOSE_HEADERS: &str = "access-control-expose-headers";

/// An `Access-Control-Expose-Headers` value naming `names` besides those `existing` (the
/// response's own, if any) names: theirs first, then each of ours they lack, compared without
/// case, none twice. `None` when they name all of ours already: nothing to write.
pub fn expose_headers<'a>(existing: Option<&str>, names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut out = existing.map(str::trim).unwrap_or("").to_owned();
    let named = |out: &str, name: &str| out.split(',').any(|n| n.trim().eq_ignore_ascii_case(name));
    let before = out.len();
    for name in names {
        if !named(&out, name) {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(name);
        }
    }
    (out.len() > before).then_some(out)
}

/// Appends the headers for `quota` to `out` as owned `(name, value)` pairs: the
/// convenience form of [`write_headers`], which allocates one `String` per header.
pub fn format_headers(quota: &Quota<'_>, mode: HeaderMode, out: &mut Vec<(&'static str, String)>) {
    let mut buf = HeaderBuf::new();
    write_headers(quota, mode, &mut buf);
    out.extend(buf.iter().map(|(name, value)| (name, value.to_owned())));
}

/// Writes a structured-field item: the policy name as a string, then `;key=value` params.
fn push_item(out: &mut String, policy: &str, params: [(&str, u64); 2]) {
    push_sf_string(out, policy);
    for (key, value) in params {
        out.push(';');
        out.push_str(key);
        out.push('=');
        push_u64(out, value);
    }
}

/// Writes `s` as a structured-field string: quoted, `"` and `\` escaped, characters that
/// cannot appear in an sf-string (controls, non-ASCII) dropped.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    if s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\') {
        out.push_str(s); // the usual case: nothing to escape or drop
        out.push('"');
        return;
    }
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// The JSON body of a 429:
/// `{"status":"error","code":429,"message":"API rate limit exceeded. Please retry after N seconds.","retry_after_seconds":N}`
/// with `N` = [`retry_after_secs`]. Appends to `out`.
pub fn write_denial_body(retry_after_ms: u64, out: &mut String) {
    let secs = retry_after_secs(retry_after_ms);
    out.push_str(r#"{"status":"error","code":429,"message":"API rate limit exceeded. Please retry after "#);
    push_u64(out, secs);
    out.push_str(r#" seconds.","retry_after_seconds":"#);
    push_u64(out, secs);
    out.push('}');
}

/// The JSON body of a 429 as a new `String`; see [`write_denial_body`].
pub fn denial_body(retry_after_ms: u64) -> String {
    let mut out = String::with_capacity(112);
    write_denial_body(retry_after_ms, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Micros;

    fn quota(retry: Option<u64>) -> Quota<'static> {
        Quota {
            policy: "search-per-user",
            limit: 100,
            remaining: 0,
            reset_after_ms: 47_000,
            window_ms: 60_000,
            retry_after_ms: retry,
            now_ms: 1_774_312_813_000,
        }
    }

    #[test]
    fn formats_design_md_example_exactly() {
        let mut out = Vec::new();
        format_headers(&quota(Some(47_000)), HeaderMode::All, &mut out);
        let got: Vec<(&str, &str)> = out.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("X-RateLimit-Limit", "100"),
                ("X-RateLimit-Remaining", "0"),
                ("X-RateLimit-Reset", "1774312860"),
                ("RateLimit-Policy", "\"search-per-user\";q=100;w=60"),
                ("RateLimit", "\"search-per-user\";r=0;t=47"),
                ("Retry-After", "47"),
            ]
        );
        assert_eq!(
            denial_body(47_000),
            r#"{"status":"error","code":429,"message":"API rate limit exceeded. Please retry after 47 seconds.","retry_after_seconds":47}"#
        );
    }

    #[test]
    fn a_limit_on_requests_in_flight_names_its_unit_and_no_window() {
        let q = Quota {
            policy: "gpu",
            limit: 8,
            remaining: 0,
            reset_after_ms: 1_000,
            window_ms: 0,
            retry_after_ms: Some(1_000),
            now_ms: 1_774_312_813_000,
        };
        let mut out = Vec::new();
        format_headers(&q, HeaderMode::Ietf, &mut out);
        let got: Vec<(&str, &str)> = out.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("RateLimit-Policy", "\"gpu\";q=8;qu=\"concurrent-requests\""),
                ("RateLimit", "\"gpu\";r=0;t=1"),
                ("Retry-After", "1"),
            ]
        );
    }

    #[test]
    fn modes_select_families_and_retry_after_rounds_up_to_at_least_one() {
        let mut out = Vec::new();
        format_headers(&quota(Some(1)), HeaderMode::None, &mut out);
        assert_eq!(out, [("Retry-After", "1".to_owned())]);
        out.clear();
        format_headers(&quota(None), HeaderMode::Ietf, &mut out);
        assert_eq!(
            out.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["RateLimit-Policy", "RateLimit"]
        );
    }

    #[test]
    fn header_buf_is_reusable_and_numbers_are_exact() {
        let mut buf = HeaderBuf::new();
        let mut q = quota(Some(47_000));
        write_headers(&q, HeaderMode::All, &mut buf);
        assert_eq!(buf.len(), 6);
        q.limit = u64::MAX;
        q.remaining = 0;
        q.retry_after_ms = None;
        write_headers(&q, HeaderMode::Legacy, &mut buf);
        let got: Vec<_> = buf.iter().collect();
        assert_eq!(
            got,
            [
                ("X-RateLimit-Limit", "18446744073709551615"),
                ("X-RateLimit-Remaining", "0"),
                ("X-RateLimit-Reset", "1774312860"),
            ]
        );
        assert_eq!(buf.get("x-ratelimit-remaining"), Some("0"));
        assert_eq!(buf.get("Retry-After"), None);
        q.now_ms = u64::MAX;
        q.reset_after_ms = u64::MAX;
        write_headers(&q, HeaderMode::Legacy, &mut buf);
        assert_eq!(buf.get("X-RateLimit-Reset"), Some("18446744073709552"));
        assert_eq!(denial_body(0), denial_body(1_000));
    }

    #[test]
    fn a_decision_advertises_waits_rounded_up_and_retry_after_on_denials_only() {
        let mut d = Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_after: Micros::new(1_500),
            retry_after: Micros::new(1),
            delay: Micros::ZERO,
        };
        let q = Quota::from_decision("local", &d, 1_000, 7);
        assert_eq!(
            (q.policy, q.limit, q.remaining, q.window_ms, q.now_ms),
            ("local", 10, 0, 1_000, 7)
        );
        assert_eq!((q.reset_after_ms, q.retry_after_ms), (2, Some(1)));
        d.allowed = true;
        assert_eq!(Quota::from_decision("local", &d, 1_000, 7).retry_after_ms, None);
    }

    #[test]
    fn a_lease_advertises_what_it_holds_and_never_a_retry() {
        let left = Left {
            remaining: 41,
            limit: 100,
            reset_after_ms: 12_345,
            window_ms: 60_000,
            lease: 9,
        };
        let q = Quota::from_lease("per-ip", &left, 7);
        assert_eq!(
            q,
            Quota {
                policy: "per-ip",
                limit: 100,
                remaining: 41,
                reset_after_ms: 12_345,
                window_ms: 60_000,
                retry_after_ms: None,
                now_ms: 7,
            }
        );
    }

    #[test]
    fn policy_names_are_escaped() {
        let mut out = String::new();
        push_sf_string(&mut out, "a\"b\\c\nd");
        assert_eq!(out, r#""a\"b\\cd""#);
    }

    #[test]
    fn exposed_names_merge_with_the_responses_own_without_repeats() {
        let ours = ["X-RateLimit-Limit", "RateLimit", "Retry-After"];
        assert_eq!(
            expose_headers(None, ours).as_deref(),
            Some("X-RateLimit-Limit, RateLimit, Retry-After")
        );
        assert_eq!(
            expose_headers(Some(" ETag,ratelimit "), ours).as_deref(),
            Some("ETag,ratelimit, X-RateLimit-Limit, Retry-After")
        );
        assert_eq!(
            expose_headers(Some("retry-after, x-ratelimit-limit, RATELIMIT"), ours),
            None
        );
        assert_eq!(expose_headers(Some("x"), []), None);
        assert_eq!(expose_headers(Some(""), ["A", "a"]).as_deref(), Some("A"));
    }
}
