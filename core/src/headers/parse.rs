//! Reading the quota a response advertises, from whichever rate-limit headers it carries.

use serde::{Deserialize, Serialize};

use super::http_date::parse_http_date;
use super::structured::{self, Item};

/// The quota a response advertised; every field is absent unless a header gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitInfo {
    /// Requests per window.
    pub limit: Option<u64>,
    /// Requests left in the window.
    pub remaining: Option<u64>,
    /// Milliseconds until the quota resets.
    pub reset_after_ms: Option<u64>,
    /// Milliseconds the server asked the client to wait (`Retry-After`).
    pub retry_after_ms: Option<u64>,
    /// The IETF policy name.
    pub policy: Option<String>,
    /// The policy's window in milliseconds.
    pub window_ms: Option<u64>,
}

impl RateLimitInfo {
    /// Whether any rate-limit header was read.
    pub fn is_empty(&self) -> bool {
        *self == RateLimitInfo::default()
    }
}

/// Values above this are epoch seconds, below it delta seconds (`X-RateLimit-Reset`).
const EPOCH_THRESHOLD_SECS: f64 = 1_000_000_000.0;

/// A plain non-negative integer of at most 19 digits; `None` for anything else.
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Non-negative decimal seconds (`1.25`) as milliseconds, rounded to the nearest.
fn parse_secs_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    let whole = if int.is_empty() { 0 } else { parse_u64(int)? };
    let value: f64 = format!("{whole}.{frac}0").parse().ok()?;
    let ms = (value * 1000.0).round();
    (ms < 9.0e15).then_some(ms as u64)
}

#[derive(Default)]
struct Raw<'a> {
    x_limit: Option<u64>,
    x_remaining: Option<u64>,
    x_reset: Option<&'a str>,
    x_reset_after: Option<u64>,
    draft_limit: Option<u64>,
    draft_remaining: Option<u64>,
    draft_reset: Option<u64>,
    ratelimit: Option<&'a str>,
    policy: Option<&'a str>,
    retry_after: Option<&'a str>,
}

/// Reads the quota from response headers, given the client's clock in unix milliseconds.
///
/// Precedence: the IETF fields win over `X-RateLimit-*` when both are valid;
/// `X-RateLimit-Reset-After` wins over `X-RateLimit-Reset`; `Retry-After` always sets
/// `retry_after_ms`; of several IETF policies the most restrictive (least remaining, then
/// longest reset) is reported. `status` is accepted for symmetry with callers and future
/// rules; the headers alone decide today.
pub fn parse_headers<'a, I>(_status: u16, headers: I, now_ms: u64) -> RateLimitInfo
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut raw = Raw::default();
    for (name, value) in headers {
        let value = value.trim();
        let slot = |n: &str| name.eq_ignore_ascii_case(n);
        if slot("x-ratelimit-limit") {
            raw.x_limit = parse_u64(value);
        } else if slot("x-ratelimit-remaining") {
            raw.x_remaining = parse_u64(value);
        } else if slot("x-ratelimit-reset") {
            raw.x_reset = Some(value);
        } else if slot("x-ratelimit-reset-after") {
            raw.x_reset_after = parse_secs_ms(value);
        } else if slot("ratelimit-limit") {
            raw.draft_limit = parse_u64(value);
        } else if slot("ratelimit-remaining") {
            raw.draft_remaining = parse_u64(value);
        } else if slot("ratelimit-reset") {
            raw.draft_reset = parse_u64(value);
        } else if slot("ratelimit") {
            raw.ratelimit = Some(value);
        } else if slot("ratelimit-policy") {
            raw.policy = Some(value);
        } else if slot("retry-after") {
            raw.retry_after = Some(value);
        }
    }

    let mut info = RateLimitInfo {
        limit: raw.x_limit,
        remaining: raw.x_remaining,
        reset_after_ms: raw
            .x_reset_after
            .or_else(|| raw.x_reset.and_then(|r| reset_to_ms(r, now_ms))),
        ..RateLimitInfo::default()
    };
    // Older IETF drafts: separate fields, reset in delta seconds.
    override_with(
        &mut info,
        raw.draft_limit,
        raw.draft_remaining,
        raw.draft_reset.map(|s| s.saturating_mul(1000)),
    );
    if let Some(value) = raw.ratelimit {
        if value.trim_start().starts_with('"') || !value.contains('=') || value.contains(';') {
            read_ietf(&mut info, value, raw.policy);
        } else {
            read_combined(&mut info, value);
        }
    }
    info.retry_after_ms = raw.retry_after.and_then(|r| retry_after_ms(r, now_ms));
    info
}

fn override_with(info: &mut RateLimitInfo, limit: Option<u64>, remaining: Option<u64>, reset_ms: Option<u64>) {
    if limit.is_some() || remaining.is_some() || reset_ms.is_some() {
        info.limit = limit.or(info.limit);
        info.remaining = remaining.or(info.remaining);
        info.reset_after_ms = reset_ms.or(info.reset_after_ms);
    }
}

/// `X-RateLimit-Reset`: epoch seconds or delta seconds, told apart by magnitude.
fn reset_to_ms(value: &str, now_ms: u64) -> Option<u64> {
    let ms = parse_secs_ms(value)?;
    if ms as f64 / 1000.0 >= EPOCH_THRESHOLD_SECS {
        Some(ms.saturating_sub(now_ms))
    } else {
        Some(ms)
    }
}

/// `Retry-After`: delta seconds or an HTTP-date (a date in the past means now).
fn retry_after_ms(value: &str, now_ms: u64) -> Option<u64> {
    if let Some(secs) = parse_u64(value) {
        return secs.checked_mul(1000);
    }
    let at = parse_http_date(value)?;
    Some(at.saturating_mul(1000).saturating_sub(now_ms))
}

/// The older draft's combined form: `limit=100, remaining=50, reset=5`.
fn read_combined(info: &mut RateLimitInfo, value: &str) {
    let (mut limit, mut remaining, mut reset) = (None, None, None);
    for part in value.split([',', ';']) {
        match part.trim().split_once('=') {
            Some((k, v)) if k.trim().eq_ignore_ascii_case("limit") => limit = parse_u64(v),
            Some((k, v)) if k.trim().eq_ignore_ascii_case("remaining") => remaining = parse_u64(v),
            Some((k, v)) if k.trim().eq_ignore_ascii_case("reset") => reset = parse_u64(v),
            _ => {}
        }
    }
    override_with(info, limit, remaining, reset.and_then(|s| s.checked_mul(1000)));
}

/// One advertised policy, joined from `RateLimit` and `RateLimit-Policy`.
struct Advertised {
    name: String,
    remaining: u64,
    reset_ms: Option<u64>,
    quota: Option<u64>,
    window_ms: Option<u64>,
}

/// The IETF fields: `RateLimit: "p";r=50;t=30` and `RateLimit-Policy: "p";q=100;w=60`.
fn read_ietf(info: &mut RateLimitInfo, value: &str, policy: Option<&str>) {
    let Some(items) = structured::parse_list(value) else {
        return;
    };
    let policies: Vec<Item<'_>> = policy.and_then(structured::parse_list).unwrap_or_default();
    let mut best: Option<Advertised> = None;
    for item in &items {
        let (Ok(Some(remaining)), Ok(reset)) = (item.int("r"), item.int("t")) else {
            return; // a malformed member makes the whole field unusable
        };
        let declared = policies.iter().find(|p| p.name == item.name);
        let quota = declared.and_then(|p| p.int("q").ok().flatten());
        let window_ms = declared
            .and_then(|p| p.int("w").ok().flatten())
            .and_then(|w| w.checked_mul(1000));
        let candidate = Advertised {
            name: item.name.clone(),
            remaining,
            reset_ms: reset.and_then(|t| t.checked_mul(1000)),
            quota,
            window_ms,
        };
        let tighter = best.as_ref().is_none_or(|b| {
            (candidate.remaining, std::cmp::Reverse(candidate.reset_ms)) < (b.remaining, std::cmp::Reverse(b.reset_ms))
        });
        if tighter {
            best = Some(candidate);
        }
    }
    if let Some(b) = best {
        info.remaining = Some(b.remaining);
        info.reset_after_ms = b.reset_ms.or(info.reset_after_ms);
        info.limit = b.quota.or(info.limit);
        info.window_ms = b.window_ms;
        info.policy = Some(b.name);
    }
}
