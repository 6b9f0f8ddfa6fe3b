//! A request's host as rules compare it: the `Host`/`:authority` name without its port,
//! whatever the case of its letters; a rule's `hosts` entry is a name, or `*.` and a
//! suffix for every subdomain.

/// Most bytes of a host (a DNS name is at most 253; a bracketed IPv6 address and a port fit).
pub const MAX_HOST_BYTES: usize = 255;

/// `host` without its port: `example.com:8080` → `example.com`, `[::1]:80` → `[::1]`.
pub fn without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether `host` can be a request's host: 1 to [`MAX_HOST_BYTES`] printable ASCII bytes,
/// none of them a space or `/ ? # @ { } ,`.
pub fn is_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= MAX_HOST_BYTES
        && host
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'@' | b'{' | b'}' | b','))
}

/// A rule's `hosts` entry as it is compared: its port dropped, lower case; or why it cannot
/// be one.
pub(crate) fn rule_host(entry: &str) -> Result<String, String> {
    let name = without_port(entry);
    let pattern = name.strip_prefix("*.").unwrap_or(name);
    if !is_host(name) || pattern.is_empty() || pattern.contains('*') {
        return Err(format!(
            "{entry:?} is not a host name: 1 to {MAX_HOST_BYTES} bytes of a name (or `*.` and a domain), \
             no spaces, `/`, `?`, `#`, `@`, braces or commas, `*` only as a leading `*.`"
        ));
    }
    Ok(name.to_ascii_lowercase())
}

/// Whether the request's `host` (any case, with or without a port) is `entry`, a
/// `rule_host`: the same name, or for `*.domain` a name ending in `.domain`.
pub fn matches(entry: &str, host: &str) -> bool {
    let host = without_port(host);
    match entry.strip_prefix("*.") {
        Some(domain) => {
            host.len() > domain.len() + 1
                && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                && host[host.len() - domain.len()..].eq_ignore_ascii_case(domain)
        }
        None => host.eq_ignore_ascii_case(entry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_compare_without_port_and_case() {
        assert_eq!(without_port("Example.com:8080"), "Example.com");
        assert_eq!(without_port("[::1]:443"), "[::1]");
        assert_eq!(without_port("::1"), "::1".rsplit_once(':').map_or("::1", |(n, _)| n));
        assert!(matches("api.example.com", "API.Example.com:8443"));
        assert!(!matches("api.example.com", "api.example.com.evil"));
        assert!(matches("*.example.com", "a.b.EXAMPLE.com"));
        assert!(!matches("*.example.com", "example.com"));
        assert!(!matches("*.example.com", "badexample.com"));
    }

    #[test]
    fn bad_rule_hosts_are_named() {
        assert_eq!(rule_host("API.example.com:80"), Ok("api.example.com".into()));
        assert_eq!(rule_host("*.Example.com"), Ok("*.example.com".into()));
        for bad in ["", "a b", "a/b", "*", "*.", "a.*.com", "x*", &"a".repeat(256)] {
            assert!(rule_host(bad).is_err(), "{bad:?} taken");
        }
    }
}
