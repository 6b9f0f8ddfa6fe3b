//! The canonical form of a request path, the one every rule is matched against.
//!
//! A client must not step around a path rule by spelling the path another way that the
//! server behind the proxy reads as the same: `//api/search`, `/api/./search`,
//! `/api/x/../search` and `/%61pi/search` all reach `/api/search` on Nginx and on most
//! application servers. [`canonical`] turns each of them into `/api/search`:
//!
//! 1. the query (from the first `?`) is dropped, and an absolute-form target
//!    (`http://host/p`) keeps only its path;
//! 2. escapes of unreserved characters are decoded (RFC 3986 §6.2.2.2: letters, digits,
//!    `-`, `.`, `_`, `~`); every other escape stays, its hex digits upper-cased
//!    (§6.2.2.1), so `%2F` is not a `/` and `%2f` is `%2F`; a `%` that does not start a
//!    valid escape stays as it is, and a hex digit escaped right after one stays escaped
//!    (`%4%31` decoded would read `%41`, an escape nobody sent);
//! 3. runs of `/` are merged into one;
//! 4. dot segments are removed (§5.2.4): `.` goes, `..` takes the segment before it, never
//!    above the root;
//! 5. the result starts with `/`.
//!
//! It is idempotent, and it never merges two paths whose decoded segments differ, so it
//! never makes two resources one (property-tested in `core/tests/path_props.rs`).
//! Case is kept: a rule asks for folding with `case_insensitive_paths`.

use std::borrow::Cow;

/// The canonical form of request target `raw` (see the module's documentation). Borrows
/// when `raw` is canonical already, the usual case; allocates otherwise.
pub fn canonical(raw: &str) -> Cow<'_, str> {
    let path = without_query(strip_authority(raw));
    if is_canonical(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    Cow::Owned(remove_dot_segments(&decoded))
}

/// `raw` without `scheme://authority` when it is in absolute form.
fn strip_authority(raw: &str) -> &str {
    if raw.starts_with('/') {
        return raw;
    }
    let Some(colon) = raw.find("://") else {
        return raw;
    };
    let scheme = &raw[..colon];
    if scheme.is_empty() || !scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) {
        return raw;
    }
    let rest = &raw[colon + 3..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    &rest[end..]
}

fn without_query(raw: &str) -> &str {
    match raw.bytes().position(|b| b == b'?' || b == b'#') {
        Some(end) => &raw[..end],
        None => raw,
    }
}

/// Whether `path` needs no change: it starts with `/`, has no `%`, no `//` and no dot
/// segment. Checked first so that a plain path costs one scan and no allocation.
fn is_canonical(path: &str) -> bool {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    let dot_segment = |seg: &[u8]| seg == b"." || seg == b"..";
    let mut segment_start = 1;
    for (i, &c) in b.iter().enumerate().skip(1) {
        match c {
            b'%' => return false,
            b'/' if i == segment_start || dot_segment(&b[segment_start..i]) => return false,
            b'/' => segment_start = i + 1,
            _ => {}
        }
    }
    !dot_segment(&b[segment_start..])
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `c` is unreserved (RFC 3986 §2.3).
pub fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

/// Decodes escapes of unreserved characters and upper-cases the hex of the others; a `%`
/// without two hex digits after it stays.
fn decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len() + 1);
    if b.first() != Some(&b'/') {
        out.push('/');
    }
    let mut i = 0;
    while i < b.len() {
        let escape = (b[i] == b'%')
            .then(|| Some((hex(*b.get(i + 1)?)?, hex(*b.get(i + 2)?)?)))
            .flatten();
        match escape {
            Some((hi, lo)) => {
                let c = hi * 16 + lo;
                if is_unreserved(c) && !(c.is_ascii_hexdigit() && ends_in_open_escape(&out)) {
                    out.push(char::from(c));
                } else {
                    out.push('%');
                    out.push(char::from(b[i + 1].to_ascii_uppercase()));
                    out.push(char::from(b[i + 2].to_ascii_uppercase()));
                }
                i += 3;
            }
            None if b[i] == b'%' => {
                out.push('%');
                i += 1;
            }
            None => {
                // Up to the next `%` at once: `i` stays on a character boundary.
                let next = path[i..].find('%').map_or(b.len(), |n| i + n);
                out.push_str(&path[i..next]);
                i = next;
            }
        }
    }
    out
}

/// Whether `out` ends with a `%` that starts no escape yet (`%`, or `%` and one hex digit):
/// a decoded hex digit after it would make one that was never sent, so it stays escaped.
fn ends_in_open_escape(out: &str) -> bool {
    let b = out.as_bytes();
    match b {
        [.., b'%'] => true,
        [.., b'%', h] => h.is_ascii_hexdigit(),
        _ => false,
    }
}

/// Merges `//` and removes `.` and `..` segments of `path`, which starts with `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    // Whether the result ends with `/`: a trailing slash, or a last segment `.` or `..`.
    let mut trailing = false;
    for seg in path[1..].split('/') {
        trailing = false;
        match seg {
            "" => trailing = true,
            "." => trailing = true,
            ".." => {
                segments.pop();
                trailing = true;
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len());
    for seg in &segments {
        out.push('/');
        out.push_str(seg);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn the_spellings_a_server_reads_as_one_path_are_one() {
        for raw in [
            "/api/search",
            "//api/search",
            "/api//search",
            "/api/%73earch",
            "/api/./search",
            "/api/x/../search",
            "/%61pi/search",
            "/%2e/api/search",
            "/api/%2E%2E/api/search",
            "/api/search?q=1",
            "/api/search#frag",
            "http://example.com/api/search?x",
            "api/search",
            "/../api/search",
        ] {
            assert_eq!(canonical(raw), "/api/search", "{raw}");
        }
    }

    #[test]
    fn reserved_escapes_and_invalid_ones_stay() {
        assert_eq!(canonical("/a%2Fb"), "/a%2Fb");
        assert_eq!(canonical("/a%2fb"), "/a%2Fb");
        assert_eq!(canonical("/a%3Fb"), "/a%3Fb");
        assert_eq!(canonical("/a%zz"), "/a%zz");
        assert_eq!(canonical("/a%4"), "/a%4");
        assert_eq!(canonical("/a%"), "/a%");
        assert_eq!(canonical("/a%25"), "/a%25");
        assert_eq!(canonical("/a%2541"), "/a%2541", "no double decoding");
        assert_eq!(canonical("/%4%31"), "/%4%31", "a decoded digit makes no new escape");
        assert_eq!(canonical("/%%34%31"), "/%%341");
        assert_eq!(canonical("/caf%C3%A9"), "/caf%C3%A9", "non-ASCII stays escaped");
        assert_eq!(canonical("/café//x"), "/café/x");
    }

    #[test]
    fn trailing_slashes_and_dots() {
        assert_eq!(canonical("/"), "/");
        assert_eq!(canonical(""), "/");
        assert_eq!(canonical("?x"), "/");
        assert_eq!(canonical("/a/"), "/a/");
        assert_eq!(canonical("/a//"), "/a/");
        assert_eq!(canonical("/a/."), "/a/");
        assert_eq!(canonical("/a/b/.."), "/a/");
        assert_eq!(canonical("/.."), "/");
        assert_eq!(canonical("/..."), "/...");
        assert_eq!(canonical("/.a/..b"), "/.a/..b");
        assert_eq!(canonical("*"), "/*");
    }

    #[test]
    fn a_canonical_path_is_borrowed() {
        assert!(matches!(canonical("/api/search"), std::borrow::Cow::Borrowed(_)));
        assert!(matches!(canonical("/api/search?q=1"), std::borrow::Cow::Borrowed(_)));
        assert!(matches!(canonical("/"), std::borrow::Cow::Borrowed(_)));
        assert!(matches!(canonical("/a/"), std::borrow::Cow::Borrowed(_)));
    }
}
