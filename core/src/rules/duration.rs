//! Durations of the rule file: an integer and a unit, `500ms`, `1s`, `1m`, `1h`, `1d`.

use crate::time::Micros;

/// The longest duration [`parse_duration`] accepts: 365 days, in milliseconds.
pub const MAX_DURATION_MS: u64 = 365 * 86_400_000;

/// Parses a duration into milliseconds: a whole number and a unit (`ms`, `s`, `m`, `h`,
/// `d`), e.g. `500ms` or `1m`; surrounding whitespace is ignored. `0s` parses to 0 (callers
/// reject it where it means nothing); more than [`MAX_DURATION_MS`] is an error.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "{s:?} is not a duration: expected a whole number and a unit, like 500ms, 1s, 1m, 1h or 1d"
        ));
    }
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => {
            return Err(format!(
                "{s:?} has no unit: write it as {s}ms, {s}s, {s}m, {s}h or {s}d"
            ))
        }
        other => return Err(format!("{s:?} has unknown unit {other:?}: use ms, s, m, h or d")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&ms| ms <= MAX_DURATION_MS)
        .ok_or_else(|| format!("{s:?} is too long: at most 365d"))
}

/// Formats milliseconds in the largest unit that divides them exactly (`90000` → `90s`,
/// `0` → `0ms`); [`parse_duration`] reads it back.
pub fn format_duration(ms: u64) -> String {
    for (scale, unit) in [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")] {
        if ms != 0 && ms % scale == 0 {
            return format!("{}{unit}", ms / scale);
        }
    }
    format!("{ms}ms")
}

/// The longest lease a rule may give, to a proxy or to a region.
const MAX_LEASE_TTL_MS: u64 = 60_000;

/// The lease length written in `field` (`text`; 1 s when absent), at most a minute.
pub(crate) fn lease_length(text: Option<&str>, field: &'static str) -> Result<Micros, (&'static str, String)> {
    let ttl_ms = match text {
        Some(text) => parse_duration(text).map_err(|m| (field, m))?,
        None => 1_000,
    };
    if ttl_ms == 0 || ttl_ms > MAX_LEASE_TTL_MS {
        return Err((field, format!("must be 1ms to {MAX_LEASE_TTL_MS} ms, not {ttl_ms} ms")));
    }
    Ok(Micros::from_ms(ttl_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("1s"), Ok(1_000));
        assert_eq!(parse_duration("1m"), Ok(60_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000));
        assert_eq!(parse_duration("1d"), Ok(86_400_000));
        assert_eq!(parse_duration("0s"), Ok(0));
    }

    #[test]
    fn errors_say_how_to_fix() {
        assert!(parse_duration("60").unwrap_err().contains("no unit"));
        assert!(parse_duration("1w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("s").unwrap_err().contains("whole number"));
        assert!(parse_duration("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("99999999999999999999d")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn round_trip() {
        for ms in [1, 500, 1_000, 90_000, 3_600_000, 86_400_000, 1_500] {
            assert_eq!(parse_duration(&format_duration(ms)), Ok(ms));
        }
    }
}
