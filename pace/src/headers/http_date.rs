//! HTTP-date (RFC 9110 §5.6.7) to unix seconds: IMF-fixdate, RFC 850 and asctime forms.

use sluice_core::rules::days_from_civil;

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// Parses an HTTP-date into unix seconds; `None` if it is not one.
pub(super) fn parse_http_date(s: &str) -> Option<u64> {
    let mut parts = [""; 6];
    let mut n = 0;
    for part in s.split([' ', ',', '-']).filter(|p| !p.is_empty()) {
        *parts.get_mut(n)? = part;
        n += 1;
    }
    // IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT" and RFC 850 "Sunday, 06-Nov-94 08:49:37 GMT"
    // both give [weekday, day, month, year, time, GMT]; asctime "Sun Nov  6 08:49:37 1994"
    // gives [weekday, month, day, time, year].
    let (day, month, year, time) = match parts.get(..n)? {
        [_, day, month, year, time, zone] if zone.eq_ignore_ascii_case("gmt") => (day, month, year, time),
        [_, month, day, time, year] => (day, month, year, time),
        _ => return None,
    };
    let day: u64 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(month))? as u64 + 1;
    let mut year: u64 = year.parse().ok()?;
    if year < 100 {
        // RFC 850 two-digit years: interpret as within 50 years of 2000 (RFC 9110).
        year += if year < 50 { 2000 } else { 1900 };
    }
    let mut hms = time.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || h > 23 || m > 59 || sec > 60 || !(1970..=9999).contains(&year) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + sec)
}

#[cfg(test)]
mod tests {
    use super::parse_http_date;

    #[test]
    fn all_three_forms() {
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), Some(784_111_777));
        assert_eq!(parse_http_date("Tue, 24 Mar 2026 00:42:00 GMT"), Some(1_774_312_920));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "soon",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:00:00 GMT",
        ] {
            assert_eq!(parse_http_date(s), None, "{s}");
        }
    }
}
