//! RFC 3339 timestamps (`2026-12-31T00:00:00Z`, `...+02:00`, fractional seconds) ⇄ unix ms.

/// The last instant [`parse_rfc3339`] accepts and [`format_rfc3339`] writes back:
/// `9999-12-31T23:59:59.999Z`, in unix milliseconds.
pub const MAX_TIMESTAMP_MS: u64 = 253_402_300_799_999;

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses an RFC 3339 timestamp into unix milliseconds.
///
/// Accepts `Z` (or `z`) and `±HH:MM` offsets, `T`, `t` or a space between date and time,
/// and any number of fractional digits (kept to the millisecond, truncated). The date must
/// exist (no 31 April), and the instant must lie between 1970 and [`MAX_TIMESTAMP_MS`].
pub fn parse_rfc3339(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not an RFC 3339 timestamp like 2026-12-31T00:00:00Z");
    let b = s.trim().as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let part = b.get(r)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let sep = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return Err(err());
    }
    let (y, mo, d) = (
        num(0..4).ok_or_else(err)?,
        num(5..7).ok_or_else(err)?,
        num(8..10).ok_or_else(err)?,
    );
    let (h, mi, sec) = (
        num(11..13).ok_or_else(err)?,
        num(14..16).ok_or_else(err)?,
        num(17..19).ok_or_else(err)?,
    );
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=days_in_month(y, mo)).contains(&d)
        || h > 23
        || mi > 59
        || sec > 60
    {
        return Err(err());
    }
    let mut i = 19;
    let mut millis = 0;
    if sep(i, b".") {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Err(err());
        }
        millis = b[i + 1..i + 1 + digits]
            .iter()
            .chain(b"000")
            .take(3)
            .fold(0, |n, d| n * 10 + u64::from(d - b'0'));
        i += 1 + digits;
    }
    let offset_min: i64 = match b.get(i..) {
        Some([b'Z' | b'z']) => 0,
        Some([sign @ (b'+' | b'-'), ..]) if b.len() == i + 6 && sep(i + 3, b":") => {
            let oh = num(i + 1..i + 3).ok_or_else(err)? as i64;
            let om = num(i + 4..i + 6).ok_or_else(err)? as i64;
            if oh > 23 || om > 59 {
                return Err(err());
            }
            if *sign == b'+' {
                oh * 60 + om
            } else {
                -(oh * 60 + om)
            }
        }
        _ => return Err(err()),
    };
    let local = (days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec) as i64;
    let utc = local - offset_min * 60;
    u64::try_from(utc)
        .ok()
        .and_then(|s| s.checked_mul(1000)?.checked_add(millis))
        .filter(|&ms| ms <= MAX_TIMESTAMP_MS)
        .ok_or_else(|| format!("{s:?} is outside 1970-01-01T00:00:00Z..=9999-12-31T23:59:59.999Z"))
}

/// Formats unix milliseconds as `YYYY-MM-DDTHH:MM:SS(.mmm)Z`.
pub fn format_rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Inverse of days_from_civil (Howard Hinnant's civil_from_days).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    let frac = if ms % 1000 == 0 {
        String::new()
    } else {
        format!(".{:03}", ms % 1000)
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_rfc3339("2026-12-31T00:00:00Z"), Ok(1_798_675_200_000));
        assert_eq!(parse_rfc3339("2026-12-31T02:00:00+02:00"), Ok(1_798_675_200_000));
        assert_eq!(parse_rfc3339("2026-12-30T22:00:00.250-02:00"), Ok(1_798_675_200_250));
        assert_eq!(format_rfc3339(1_798_675_200_250), "2026-12-31T00:00:00.250Z");
        assert_eq!(format_rfc3339(1_798_675_200_000), "2026-12-31T00:00:00Z");
    }

    #[test]
    fn fractions_offsets_and_leap_days() {
        let base = 1_798_675_200_000; // 2026-12-31T00:00:00Z
        assert_eq!(parse_rfc3339("2026-12-31T00:00:00.5Z"), Ok(base + 500));
        assert_eq!(parse_rfc3339("2026-12-31T00:00:00.05Z"), Ok(base + 50));
        assert_eq!(parse_rfc3339("2026-12-31T00:00:00.123456789Z"), Ok(base + 123));
        assert_eq!(parse_rfc3339("2026-12-31t00:00:00z"), Ok(base));
        assert_eq!(parse_rfc3339("2026-12-31 00:00:00Z"), Ok(base));
        assert_eq!(parse_rfc3339("2026-12-31T05:30:00+05:30"), Ok(base));
        assert_eq!(parse_rfc3339("2026-12-30T23:59:00-00:01"), Ok(base));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339("2028-02-29T00:00:00Z"), Ok(1_835_395_200_000));
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        assert_eq!(parse_rfc3339("9999-12-31T23:59:59.999Z"), Ok(MAX_TIMESTAMP_MS));
        assert_eq!(format_rfc3339(MAX_TIMESTAMP_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        for ms in [0, 1, 999, 951_782_400_000, 1_835_395_200_123, MAX_TIMESTAMP_MS] {
            assert_eq!(parse_rfc3339(&format_rfc3339(ms)), Ok(ms));
        }
    }

    #[test]
    fn rejects() {
        for s in [
            "",
            "2027-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-12-00T00:00:00Z",
            "2026-12-31T24:00:00Z",
            "2026-12-31T00:60:00Z",
            "2026-12-31T00:00:61Z",
            "2026-12-31T00:00:00.Z",
            "2026-12-31T00:00:00+24:00",
            "2026-12-31T00:00:00+02:60",
            "2026-12-31T00:00:00+0200",
            "2026-12-31T00:00:00ZZ",
            "1970-01-01T00:00:00+00:01",
            "1969-12-31T23:59:59Z",
            "10000-01-01T00:00:00Z",
            "2026-12-31T00:00:00Zé",
            "２026-12-31T00:00:00Z",
            "2026-12-31",
            "2026-13-01T00:00:00Z",
            "2026-12-31T00:00:00",
            "2026-12-31T00:00:00+2:00",
            "x026-12-31T00:00:00Z",
        ] {
            assert!(parse_rfc3339(s).is_err(), "{s}");
        }
    }
}
