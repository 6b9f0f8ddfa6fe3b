//! Reading the quota a response advertises, from whichever rate-limit headers it carries.

use std::borrow::Cow;
use std::cmp::Reverse;

use super::http_date::parse_http_date;
use super::structured::{self, parse_u64, Item};
use sluice_core::rules::parse_rfc3339;
use sluice_core::Micros;

/// The quota a response advertised; every field is absent unless a header gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// Requests per window.
    pub limit: Option<u64>,
    /// Requests left in the window.
    pub remaining: Option<u64>,
    /// Milliseconds until the quota resets.
    pub reset_after_ms: Option<u64>,
    /// Milliseconds the server asked the client to wait (`Retry-After`), on an answer that
    /// is not a success: a 2xx's `Retry-After` asks for no wait (slowapi and Flask-Limiter
    /// send one on every answer) and is not read.
    pub retry_after_ms: Option<u64>,
    /// The server refused the request for its rate (a 429). With no quota besides, the
    /// pacer learns the rate from such refusals (`pacing/silent.rs`).
    pub refused: bool,
    /// The name the server gives the quota: the IETF policy, else Discord's
    /// `X-RateLimit-Bucket` or GitHub's `x-ratelimit-resource`. The SDKs key their buckets
    /// by it, so routes the server counts together are paced together.
    pub policy: Option<String>,
    /// The policy's window in milliseconds.
    pub window_ms: Option<u64>,
    /// The limit covers every route of the client, not only this one (Discord's
    /// `X-RateLimit-Global: true` or `X-RateLimit-Scope: global`): the SDKs hold every
    /// bucket of the host, not only the route's, for `retry_after_ms`.
    pub global: bool,
    /// The IETF partition key (`pk`) of the reported policy, as sent (`:…:`). A server
    /// allocates quotas per partition, so the SDKs key their buckets by it as well.
    pub partition: Option<String>,
    /// The reset was given as an instant (an epoch `X-RateLimit-Reset`), not as a delay:
    /// every answer of one fixed window names the same one, so the pacer can learn the
    /// window the headers leave out from how it moves ([`crate::pacing`]).
    pub reset_is_instant: bool,
    /// The quotas counted in other units than requests (OpenAI's and Anthropic's tokens, an
    /// IETF policy's `qu`), one per unit: what a request spends of them depends on the
    /// request, so the SDKs pace each on the cost the caller expects. The fields above are
    /// the requests quota.
    pub quotas: Vec<UnitQuota>,
}

/// A quota counted in another unit than requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitQuota {
    /// The unit: `tokens`, `input-tokens`, `output-tokens`, or an IETF `qu` such as
    /// `content-bytes`.
    pub unit: String,
    /// Units per window.
    pub limit: Option<u64>,
    /// Units left.
    pub remaining: Option<u64>,
    /// Milliseconds until the quota resets.
    pub reset_after_ms: Option<u64>,
    /// The IETF policy's window in milliseconds.
    pub window_ms: Option<u64>,
    /// The IETF policy's name.
    pub policy: Option<String>,
}

impl UnitQuota {
    /// This quota in the shape of a requests quota (the fields a [`crate::pacing::Pacer`]
    /// reads), without `Retry-After`.
    pub fn to_info(&self) -> RateLimitInfo {
        RateLimitInfo {
            limit: self.limit,
            remaining: self.remaining,
            reset_after_ms: self.reset_after_ms,
            policy: self.policy.clone(),
            window_ms: self.window_ms,
            ..RateLimitInfo::default()
        }
    }
}

impl RateLimitInfo {
    /// Whether any rate-limit header was read.
    pub fn is_empty(&self) -> bool {
        *self
            == RateLimitInfo {
                refused: self.refused,
                ..RateLimitInfo::default()
            }
    }

    /// The name of the bucket the server counts this response's requests in: the policy,
    /// with its partition key when it has one (`"burst :cHsd=:"`).
    pub fn bucket_name(&self) -> Option<String> {
        let policy = self.policy.as_deref()?;
        Some(match &self.partition {
            Some(pk) => format!("{policy} {pk}"),
            None => policy.to_owned(),
        })
    }

    /// The quota counted in `unit`, if the response gave one.
    pub fn quota(&self, unit: &str) -> Option<&UnitQuota> {
        self.quotas.iter().find(|q| q.unit == unit)
    }
}

/// `X-RateLimit-Reset` values at or above this many milliseconds (10⁹ s, September 2001)
/// are epoch times; smaller ones are delta seconds.
const EPOCH_THRESHOLD_MS: u64 = 1_000_000_000_000;

/// Non-negative decimal seconds (`47`, `1.25`, `.5`) as milliseconds, rounded to the
/// nearest; `None` when malformed or beyond `u64` milliseconds. Integer arithmetic only.
fn parse_secs_ms(s: &str) -> Option<u64> {
    let s = s.trim_ascii();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = if int.is_empty() { 0 } else { parse_u64(int)? };
    let digit = |i: usize| frac.as_bytes().get(i).map_or(0, |b| u64::from(b - b'0'));
    let millis = digit(0) * 100 + digit(1) * 10 + digit(2) + u64::from(digit(3) >= 5);
    whole.checked_mul(1000)?.checked_add(millis)
}

/// Non-negative Go-style durations (`20ms`, `1s`, `6m0s`, `1h2m3.5s`, `250us`) as
/// milliseconds, rounded up; `None` when malformed or too large.
fn parse_go_duration_ms(s: &str) -> Option<u64> {
    let mut rest = s.trim_ascii();
    if rest.is_empty() {
        return None;
    }
    let mut total = Micros::ZERO;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(split);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let per_unit = match unit {
            "h" => Micros::from_secs(3_600),
            "m" => Micros::from_secs(60),
            "s" => Micros::SECOND,
            "ms" => Micros::MILLISECOND,
            "us" | "µs" => Micros::MICROSECOND,
            "ns" => Micros::ZERO,
            _ => return None,
        };
        // The number in thousandths (`parse_secs_ms` reads decimals that way), then scaled.
        let thousandths = parse_secs_ms(number)?;
        total = total.checked_add(per_unit.checked_mul(thousandths)? / 1_000)?;
        rest = next;
    }
    Some(total.wait_ms())
}

/// The units of OpenAI's and Anthropic's quotas, requests first.
const NAMED_UNITS: [&str; 4] = ["requests", "tokens", "input-tokens", "output-tokens"];

/// One quota of a family that names its unit (`requests`, `tokens`, …).
#[derive(Default, Clone, Copy)]
struct Named {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_ms: Option<u64>,
}

/// The raw values of the headers of interest, before precedence is applied.
#[derive(Default)]
struct Raw<'a> {
    /// OpenAI- and Anthropic-style quotas: requests, then tokens, input and output tokens.
    named: [Named; 4],
    shopify: Option<(u64, u64)>,
    /// Discord's `X-RateLimit-Bucket`, GitHub's `x-ratelimit-resource`.
    named_bucket: Option<&'a str>,
    /// Discord's `X-RateLimit-Global: true` or `X-RateLimit-Scope: global`.
    global: bool,
    retry_after_ms: Option<u64>,
    x_window_ms: Option<u64>,
    x_limit: Option<u64>,
    x_remaining: Option<u64>,
    x_used: Option<u64>,
    x_reset: Option<&'a str>,
    x_reset_after: Option<u64>,
    draft_limit: Option<u64>,
    draft_remaining: Option<u64>,
    draft_reset: Option<u64>,
    ratelimit: Option<Cow<'a, str>>,
    policy: Option<Cow<'a, str>>,
    retry_after: Option<&'a str>,
}

/// Joins a repeated list field's lines with `, ` (RFC 9110 §5.3); allocates only then.
fn append_line<'a>(slot: &mut Option<Cow<'a, str>>, value: &'a str) {
    *slot = Some(match slot.take() {
        None => Cow::Borrowed(value),
        Some(previous) => Cow::Owned(format!("{previous}, {value}")),
    });
}

/// Reads the quota from response headers, given the client's clock in unix milliseconds.
///
/// Reads `X-RateLimit-Limit`/`-Remaining`/`-Reset`/`-Reset-After`/`-Used` (and X's
/// `X-Rate-Limit-*`; a limit may be a draft-03 policy list, `10, 10;w=60`, as Envoy and
/// Limitador send it), Shopify's `X-Shopify-Shop-Api-Call-Limit: used/size`, OpenAI's
/// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (Go-style durations) and
/// Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`
/// (RFC 3339 resets), Discord's `X-RateLimit-Bucket` and GitHub's `x-ratelimit-resource` (as
/// the policy name) and Discord's `X-RateLimit-Global`/`-Scope` (as [`RateLimitInfo::global`]), the older drafts' `RateLimit-Limit`/`-Remaining`/`-Reset` and combined
/// `RateLimit: limit=…`, the IETF `RateLimit` and `RateLimit-Policy`, and `Retry-After`
/// (seconds or HTTP-date) or `retry-after-ms`. Of OpenAI's and Anthropic's quotas the
/// requests one is reported in the top-level fields, the others (tokens) in
/// [`RateLimitInfo::quotas`], as are IETF policies whose `qu` is not requests.
/// Names are case-insensitive; values are trimmed; a malformed or overflowing value is
/// ignored as if absent. Precedence: the IETF fields win over the older draft's, which win
/// over `X-RateLimit-*`, field by field, when valid; `X-RateLimit-Reset-After` wins over
/// `X-RateLimit-Reset`, which is epoch seconds at or above 10⁹ and delta seconds below;
/// `Retry-After` sets `retry_after_ms` (a past date gives 0) unless `status` is a success
/// (2xx), whose `Retry-After` asks for no wait. Of several IETF
/// policies the most restrictive (least remaining, then longest reset) is reported. A
/// repeated single-value header keeps its last value; repeated `RateLimit` or
/// `RateLimit-Policy` lines are joined as one list.
pub fn parse_headers<'a, I>(status: u16, headers: I, now_ms: u64) -> RateLimitInfo
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut raw = Raw::default();
    for (name, value) in headers {
        let value = value.trim_ascii();
        // Every name of interest is 9 to 44 bytes long: lower-case it on the stack once.
        let mut lower = [0u8; 44];
        let Some(lower) = lower.get_mut(..name.len()).filter(|l| l.len() >= 9) else {
            continue;
        };
        for (l, b) in lower.iter_mut().zip(name.bytes()) {
            *l = b.to_ascii_lowercase();
        }
        match &*lower {
            b"x-ratelimit-limit" | b"x-rate-limit-limit" => {
                let (limit, window_ms) = limit_list(value).unzip();
                (raw.x_limit, raw.x_window_ms) = (limit, window_ms.flatten());
            }
            b"x-ratelimit-remaining" | b"x-rate-limit-remaining" => raw.x_remaining = parse_u64(value),
            b"x-ratelimit-reset" | b"x-rate-limit-reset" => raw.x_reset = Some(value),
            b"x-shopify-shop-api-call-limit" => raw.shopify = shopify(value),
            b"x-ratelimit-bucket" | b"x-ratelimit-resource" => {
                raw.named_bucket = Some(value).filter(|v| !v.is_empty() && v.len() <= 256);
            }
            b"retry-after-ms" => raw.retry_after_ms = parse_u64(value),
            b"x-ratelimit-global" => raw.global |= value.eq_ignore_ascii_case("true"),
            b"x-ratelimit-scope" => raw.global |= value.eq_ignore_ascii_case("global"),
            _ if read_named(&mut raw, lower, value, now_ms) => {}
            b"x-ratelimit-reset-after" => raw.x_reset_after = parse_secs_ms(value),
            b"x-ratelimit-used" => raw.x_used = parse_u64(value),
            b"ratelimit-limit" => raw.draft_limit = limit_list(value).map(|(limit, _)| limit),
            b"ratelimit-remaining" => raw.draft_remaining = parse_u64(value),
            b"ratelimit-reset" => raw.draft_reset = parse_u64(value),
            b"ratelimit" => append_line(&mut raw.ratelimit, value),
            b"ratelimit-policy" => append_line(&mut raw.policy, value),
            b"retry-after" => raw.retry_after = Some(value),
            _ => {}
        }
    }

    let used_remaining = match (raw.x_limit, raw.x_used) {
        (Some(limit), Some(used)) => limit.checked_sub(used),
        _ => None,
    };
    let (shopify_limit, shopify_remaining) = raw.shopify.unzip();
    let epoch_reset = raw
        .x_reset
        .filter(|_| raw.x_reset_after.is_none())
        .and_then(|r| epoch_reset_ms(r, now_ms));
    let mut info = RateLimitInfo {
        limit: raw.x_limit.or(shopify_limit),
        remaining: raw.x_remaining.or(used_remaining).or(shopify_remaining),
        reset_after_ms: raw
            .x_reset_after
            .or_else(|| raw.x_reset.and_then(|r| reset_to_ms(r, now_ms))),
        reset_is_instant: epoch_reset.is_some(),
        window_ms: raw.x_window_ms,
        policy: raw.named_bucket.map(str::to_owned),
        global: raw.global,
        ..RateLimitInfo::default()
    };
    // OpenAI and Anthropic: the requests quota, and one per unit counted besides.
    let [requests, others @ ..] = raw.named;
    override_with(&mut info, requests.limit, requests.remaining, requests.reset_ms);
    for (named, unit) in others.iter().zip(&NAMED_UNITS[1..]) {
        if named.limit.is_some() || named.remaining.is_some() {
            info.quotas.push(UnitQuota {
                unit: (*unit).to_owned(),
                limit: named.limit,
                remaining: named.remaining,
                reset_after_ms: named.reset_ms,
                ..UnitQuota::default()
            });
        }
    }
    // Older IETF drafts: separate fields, reset in delta seconds.
    override_with(
        &mut info,
        raw.draft_limit,
        raw.draft_remaining,
        raw.draft_reset.and_then(|s| s.checked_mul(1000)),
    );
    if let Some(value) = raw.ratelimit.as_deref() {
        if value.starts_with('"') || !value.contains('=') || value.contains(';') {
            read_ietf(&mut info, value, raw.policy.as_deref());
        } else {
            read_combined(&mut info, value);
        }
    }
    info.refused = status == 429;
    if !(200..300).contains(&status) {
        info.retry_after_ms = raw
            .retry_after_ms
            .or_else(|| raw.retry_after.and_then(|r| retry_after_ms(r, now_ms)));
    }
    info
}

/// A limit field, or a draft-03 policy list as Envoy's rate limit filter and Limitador send
/// it (`10, 10;w=60, 100;w=3600`): the first member is the limit in force, and the window
/// is that of the first policy with that quota.
fn limit_list(value: &str) -> Option<(u64, Option<u64>)> {
    let mut members = value.split(',');
    let limit = parse_u64(members.next()?)?;
    let window_ms = members.find_map(|m| {
        let (quota, params) = m.split_once(';')?;
        (parse_u64(quota)? == limit).then_some(())?;
        params.split(';').find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k.trim_ascii() == "w")
                .then(|| parse_u64(v)?.checked_mul(1000))
                .flatten()
        })
    });
    Some((limit, window_ms))
}

/// Shopify's `X-Shopify-Shop-Api-Call-Limit: 32/40`, a leaky bucket's used/size: the limit
/// and what remains.
fn shopify(value: &str) -> Option<(u64, u64)> {
    let (used, size) = value.split_once('/')?;
    let (used, size) = (parse_u64(used)?, parse_u64(size)?);
    Some((size, size.saturating_sub(used)))
}

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (resets as Go
/// durations) and Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,
/// output-tokens}-{limit,remaining,reset}` (resets as RFC 3339 times); whether `lower`
/// was one of them.
fn read_named(raw: &mut Raw<'_>, lower: &[u8], value: &str, now_ms: u64) -> bool {
    let Ok(name) = std::str::from_utf8(lower) else {
        return false;
    };
    let (field, unit, reset_ms) = if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        let Some((field, unit)) = rest.split_once('-') else {
            return false;
        };
        (field, unit, parse_go_duration_ms(value))
    } else if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
        let Some((unit, field)) = rest.rsplit_once('-') else {
            return false;
        };
        let at = parse_rfc3339(value).ok();
        (field, unit, at.map(|at| at.saturating_sub(now_ms)))
    } else {
        return false;
    };
    let Some(i) = NAMED_UNITS.iter().position(|u| *u == unit) else {
        return false;
    };
    let quota = &mut raw.named[i];
    match field {
        "limit" => quota.limit = parse_u64(value),
        "remaining" => quota.remaining = parse_u64(value),
        "reset" => quota.reset_ms = reset_ms,
        _ => return false,
    }
    true
}

/// Replaces the fields that `limit`, `remaining` and `reset_ms` give.
fn override_with(info: &mut RateLimitInfo, limit: Option<u64>, remaining: Option<u64>, reset_ms: Option<u64>) {
    info.limit = limit.or(info.limit);
    info.remaining = remaining.or(info.remaining);
    if reset_ms.is_some() {
        (info.reset_after_ms, info.reset_is_instant) = (reset_ms, false);
    }
}

/// `X-RateLimit-Reset`: epoch seconds or delta seconds, told apart by magnitude.
fn reset_to_ms(value: &str, now_ms: u64) -> Option<u64> {
    let ms = parse_secs_ms(value)?;
    Some(if ms >= EPOCH_THRESHOLD_MS {
        ms.saturating_sub(now_ms)
    } else {
        ms
    })
}

/// `X-RateLimit-Reset` as milliseconds from now when it is an epoch (whole or fractional
/// seconds); `None` when it is delta seconds or malformed.
fn epoch_reset_ms(value: &str, now_ms: u64) -> Option<u64> {
    let ms = parse_secs_ms(value)?;
    (ms >= EPOCH_THRESHOLD_MS).then(|| ms.saturating_sub(now_ms))
}

/// `Retry-After`: delta seconds (fractions tolerated) or an HTTP-date; a date in the past
/// means now.
fn retry_after_ms(value: &str, now_ms: u64) -> Option<u64> {
    if value.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return parse_secs_ms(value);
    }
    let at = parse_http_date(value)?;
    Some(at.checked_mul(1000)?.saturating_sub(now_ms))
}

/// The older draft's combined form: `limit=100, remaining=50, reset=5`.
fn read_combined(info: &mut RateLimitInfo, value: &str) {
    let (mut limit, mut remaining, mut reset) = (None, None, None);
    for part in value.split([',', ';']) {
        match part.trim_ascii().split_once('=') {
            Some((k, v)) if k.trim_ascii().eq_ignore_ascii_case("limit") => limit = parse_u64(v),
            Some((k, v)) if k.trim_ascii().eq_ignore_ascii_case("remaining") => remaining = parse_u64(v),
            Some((k, v)) if k.trim_ascii().eq_ignore_ascii_case("reset") => reset = parse_u64(v),
            _ => {}
        }
    }
    override_with(info, limit, remaining, reset.and_then(|s| s.checked_mul(1000)));
}

/// The IETF fields: `RateLimit: "p";r=50;t=30` and `RateLimit-Policy: "p";q=100;w=60`.
///
/// A policy's unit is its declaration's `qu` (requests when absent). Of the members counted
/// in requests the most restrictive one is reported; of each other unit, the most
/// restrictive one goes to [`RateLimitInfo::quotas`].
fn read_ietf(info: &mut RateLimitInfo, value: &str, policy: Option<&str>) {
    let Some(members) = structured::list(value).collect::<Result<Vec<_>, ()>>().ok() else {
        return; // a malformed member makes the whole field unusable
    };
    // The declarations, unless the policy field is malformed.
    let declared: Vec<Item<'_>> = structured::list(policy.unwrap_or(""))
        .collect::<Result<_, ()>>()
        .unwrap_or_default();
    // Per unit, the most restrictive member so far: (unit, remaining, reset, member).
    let mut best: Vec<(&str, u64, Option<u64>, &Item<'_>)> = Vec::new();
    for item in &members {
        let (Ok(Some(remaining)), Ok(reset)) = (item.int("r"), item.int("t")) else {
            return;
        };
        let reset_ms = reset.and_then(|t| t.checked_mul(1000));
        let decl = declared.iter().find(|p| p.name == item.name);
        let unit = decl.and_then(|p| p.unit).or(item.unit).unwrap_or("requests");
        let tighter = |r: u64, t: Option<u64>| (remaining, Reverse(reset_ms)) < (r, Reverse(t));
        match best.iter_mut().find(|(u, ..)| *u == unit) {
            Some(slot) if tighter(slot.1, slot.2) => *slot = (unit, remaining, reset_ms, item),
            Some(_) => {}
            None => best.push((unit, remaining, reset_ms, item)),
        }
    }
    for (unit, remaining, reset_ms, item) in best {
        let decl = declared.iter().find(|p| p.name == item.name);
        let param = |key: &str| decl.and_then(|p| p.int(key).ok().flatten());
        let window_ms = param("w").and_then(|w| w.checked_mul(1000));
        if unit == "requests" {
            info.remaining = Some(remaining);
            if reset_ms.is_some() {
                (info.reset_after_ms, info.reset_is_instant) = (reset_ms, false);
            }
            info.limit = param("q").or(info.limit);
            info.window_ms = window_ms;
            info.policy = Some(item.name.clone().into_owned());
            info.partition = item.partition.or(decl.and_then(|p| p.partition)).map(str::to_owned);
            continue;
        }
        let quota = UnitQuota {
            unit: unit.to_owned(),
            limit: param("q"),
            remaining: Some(remaining),
            reset_after_ms: reset_ms,
            window_ms,
            policy: Some(item.name.clone().into_owned()),
        };
        match info.quotas.iter_mut().find(|q| q.unit == unit) {
            Some(slot) => *slot = quota,
            None => info.quotas.push(quota),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(headers: &[(&str, &str)]) -> RateLimitInfo {
        parse_headers(200, headers.iter().copied(), 1_774_312_800_000)
    }

    fn refused(headers: &[(&str, &str)]) -> RateLimitInfo {
        parse_headers(429, headers.iter().copied(), 1_774_312_800_000)
    }

    #[test]
    fn decimal_seconds_round_to_the_millisecond_without_overflow() {
        assert_eq!(parse_secs_ms("1.25"), Some(1_250));
        assert_eq!(parse_secs_ms(".0005"), Some(1));
        assert_eq!(parse_secs_ms("2."), Some(2_000));
        assert_eq!(parse_secs_ms("1.99999999999999999999"), Some(2_000));
        assert_eq!(parse_secs_ms("18446744073709551"), Some(18_446_744_073_709_551_000));
        assert_eq!(parse_secs_ms("18446744073709552"), None);
        for bad in ["", ".", "-1", "1e3", "1.2.3", "١"] {
            assert_eq!(parse_secs_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn go_durations_read_as_milliseconds_rounded_up() {
        for (text, ms) in [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("1h2m3.5s", 3_723_500),
            ("0s", 0),
            ("1.0005s", 1_001),
            ("250us", 1),
            ("7ns", 0),
        ] {
            assert_eq!(parse_go_duration_ms(text), Some(ms), "{text}");
        }
        for bad in ["", "1", "s", "1x", "-1s", "1.2.3s", "99999999999999999999h"] {
            assert_eq!(parse_go_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_partition_key_names_its_own_bucket() {
        let one = parse(&[("RateLimit", r#""peruser";r=5;pk=:dXNlcjE=:"#)]);
        let two = parse(&[("RateLimit", r#""peruser";r=5;pk=:dXNlcjI=:"#)]);
        assert_eq!(one.bucket_name().as_deref(), Some("peruser :dXNlcjE=:"));
        assert_ne!(one.bucket_name(), two.bucket_name());
        assert_eq!(
            parse(&[("RateLimit", r#""p";r=5"#)]).bucket_name().as_deref(),
            Some("p")
        );
        assert_eq!(parse(&[("X-RateLimit-Remaining", "5")]).bucket_name(), None);
    }

    #[test]
    fn used_gives_remaining_when_remaining_is_missing() {
        let info = parse(&[("X-RateLimit-Limit", "60"), ("X-RateLimit-Used", "15")]);
        assert_eq!(info.remaining, Some(45));
        let info = parse(&[("X-RateLimit-Limit", "60"), ("X-RateLimit-Used", "61")]);
        assert_eq!(info.remaining, None);
    }

    #[test]
    fn repeated_ratelimit_lines_form_one_list() {
        let info = parse(&[
            ("RateLimit-Policy", r#""burst";q=10;w=1"#),
            ("RateLimit", r#""burst";r=9;t=1"#),
            ("RateLimit-Policy", r#""day";q=1000;w=86400"#),
            ("RateLimit", r#""day";r=3;t=600"#),
        ]);
        assert_eq!(info.policy.as_deref(), Some("day"));
        assert_eq!(
            (info.limit, info.remaining, info.window_ms),
            (Some(1_000), Some(3), Some(86_400_000))
        );
    }

    #[test]
    fn ietf_wins_over_x_ratelimit_field_by_field() {
        let info = parse(&[
            ("X-RateLimit-Limit", "500"),
            ("X-RateLimit-Remaining", "400"),
            ("X-RateLimit-Reset", "90"),
            ("RateLimit", r#""p";r=7"#),
        ]);
        // No RateLimit-Policy and no `t`: limit and reset fall back to X-RateLimit.
        assert_eq!(
            (info.limit, info.remaining, info.reset_after_ms),
            (Some(500), Some(7), Some(90_000))
        );
        assert_eq!((info.policy.as_deref(), info.window_ms), (Some("p"), None));
    }

    #[test]
    fn an_epoch_reset_is_an_instant_a_delay_is_not() {
        assert!(parse(&[("X-RateLimit-Reset", "1774312801.5")]).reset_is_instant);
        assert!(parse(&[("X-RateLimit-Reset", "1774312801")]).reset_is_instant);
        assert!(!parse(&[("X-RateLimit-Reset", "2")]).reset_is_instant);
        assert!(!parse(&[("X-RateLimit-Reset", "1774312801"), ("X-RateLimit-Reset-After", "1")]).reset_is_instant);
        // A reset the IETF field gives instead is a delay.
        assert!(!parse(&[("X-RateLimit-Reset", "1774312801"), ("RateLimit", r#""p";r=1;t=5"#)]).reset_is_instant);
    }

    #[test]
    fn retry_after_on_a_success_asks_for_no_wait() {
        let headers = [("Retry-After", "5")];
        for (status, wait) in [
            (200, None),
            (204, None),
            (301, Some(5_000)),
            (429, Some(5_000)),
            (503, Some(5_000)),
        ] {
            let info = parse_headers(status, headers.iter().copied(), 1_774_312_800_000);
            assert_eq!(info.retry_after_ms, wait, "{status}");
        }
    }

    #[test]
    fn retry_after_tolerates_fractions_and_rejects_junk() {
        assert_eq!(refused(&[("Retry-After", "1.5")]).retry_after_ms, Some(1_500));
        assert_eq!(refused(&[("Retry-After", "-3")]).retry_after_ms, None);
        assert_eq!(
            refused(&[("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT")]).retry_after_ms,
            Some(253_402_300_799_000 - 1_774_312_800_000)
        );
        assert!(refused(&[("Retry-After", "Mon, 23 Mar 2026 23:40:00 UTC")]).is_empty());
    }
}
