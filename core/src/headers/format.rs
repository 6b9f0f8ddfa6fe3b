//! Formatting the headers and the 429 body that the filter sends.

use std::fmt::Write;

/// Which header families to send; the filter's `"headers"` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
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
    /// The policy's window in milliseconds.
    pub window_ms: u64,
    /// Milliseconds the client must wait; `Some` on a denial only.
    pub retry_after_ms: Option<u64>,
    /// The current time, unix milliseconds (for the absolute `X-RateLimit-Reset`).
    pub now_ms: u64,
}

/// Whole seconds, rounded up: a client that waits this long is never early.
fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Appends the headers for `quota` to `out` as (name, value) pairs.
///
/// `Retry-After` is sent whenever `retry_after_ms` is set, at least 1 second.
pub fn format_headers(quota: &Quota<'_>, mode: HeaderMode, out: &mut Vec<(&'static str, String)>) {
    if matches!(mode, HeaderMode::All | HeaderMode::Legacy) {
        out.push(("X-RateLimit-Limit", quota.limit.to_string()));
        out.push(("X-RateLimit-Remaining", quota.remaining.to_string()));
        let reset_at = ceil_secs(quota.now_ms.saturating_add(quota.reset_after_ms));
        out.push(("X-RateLimit-Reset", reset_at.to_string()));
    }
    if matches!(mode, HeaderMode::All | HeaderMode::Ietf) {
        let mut name = String::with_capacity(quota.policy.len() + 2);
        push_sf_string(&mut name, quota.policy);
        let mut policy = name.clone();
        let _ = write!(policy, ";q={};w={}", quota.limit, ceil_secs(quota.window_ms));
        out.push(("RateLimit-Policy", policy));
        let _ = write!(name, ";r={};t={}", quota.remaining, ceil_secs(quota.reset_after_ms));
        out.push(("RateLimit", name));
    }
    if let Some(retry) = quota.retry_after_ms {
        out.push(("Retry-After", ceil_secs(retry).max(1).to_string()));
    }
}

/// Writes `s` as a structured-field string: quoted, `"` and `\` escaped, non-printable
/// characters dropped (they cannot appear in an sf-string).
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// The JSON body of a 429: `{"status":"error","code":429,"message":"...","retry_after_seconds":N}`.
pub fn denial_body(retry_after_ms: u64) -> String {
    let secs = ceil_secs(retry_after_ms).max(1);
    format!(
        "{{\"status\":\"error\",\"code\":429,\"message\":\"API rate limit exceeded. Please retry after {secs} seconds.\",\"retry_after_seconds\":{secs}}}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn policy_names_are_escaped() {
        let mut out = String::new();
        push_sf_string(&mut out, "a\"b\\c\nd");
        assert_eq!(out, r#""a\"b\\cd""#);
    }
}
