//! A small reader for the structured-field lists of the IETF `RateLimit` headers:
//! `"name";q=100;w=60, "other";q=5;w=1`. Only what those headers need: items that are
//! strings or tokens, and their parameters as raw text. Allocates one `Vec` per list (and
//! a `String` for a name with escapes), nothing else.

use std::borrow::Cow;

/// One list member: its bare item (string unquoted) and its raw `;key=value` parameters.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Item<'a> {
    pub name: Cow<'a, str>,
    /// Everything after the bare item, validated: `;k=v;k2=v2`.
    params: &'a str,
}

impl Item<'_> {
    /// The parameter `key` as a non-negative integer. `Err` if present but malformed.
    pub fn int(&self, key: &str) -> Result<Option<u64>, ()> {
        let found = TopLevel::new(self.params, ';')
            .filter_map(param)
            .find(|(k, _)| *k == key);
        match found {
            None => Ok(None),
            Some((_, v)) => super::parse::parse_u64(v).map(Some).ok_or(()),
        }
    }
}

/// The pieces of a string between `sep` characters outside quoted strings and byte
/// sequences (`:base64:`).
struct TopLevel<'a> {
    rest: Option<&'a str>,
    sep: char,
}

impl<'a> TopLevel<'a> {
    fn new(s: &'a str, sep: char) -> Self {
        TopLevel { rest: Some(s), sep }
    }
}

impl<'a> Iterator for TopLevel<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let s = self.rest?;
        let (mut in_string, mut in_bytes, mut escaped) = (false, false, false);
        for (i, c) in s.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' if !in_bytes => in_string = !in_string,
                ':' if !in_string => in_bytes = !in_bytes,
                c if c == self.sep && !in_string && !in_bytes => {
                    self.rest = s.get(i + c.len_utf8()..);
                    return s.get(..i);
                }
                _ => {}
            }
        }
        self.rest = None;
        Some(s)
    }
}

/// A `key=value` (or bare `key`, meaning `?1`) parameter; `None` if the key is empty.
fn param(p: &str) -> Option<(&str, &str)> {
    let p = p.trim();
    match p.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Some((k.trim(), v.trim())),
        None if !p.is_empty() => Some((p, "?1")),
        _ => None,
    }
}

/// Parses a list; `None` if any member is malformed (the whole field is then ignored).
pub(super) fn parse_list(s: &str) -> Option<Vec<Item<'_>>> {
    TopLevel::new(s, ',').map(|m| parse_item(m.trim())).collect()
}

fn parse_item(s: &str) -> Option<Item<'_>> {
    let (bare, params) = match TopLevel::new(s, ';').next() {
        Some(bare) => (bare.trim(), s.get(bare.len()..).unwrap_or("")),
        None => return None,
    };
    let name = if let Some(inner) = bare.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        if inner.contains('\\') {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' { chars.next()? } else { c });
            }
            Cow::Owned(out)
        } else {
            Cow::Borrowed(inner)
        }
    } else if !bare.is_empty()
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "*-_.:/%&!#$'+^`|~".contains(c))
    {
        Cow::Borrowed(bare)
    } else {
        return None;
    };
    // Every parameter must be well formed; the first piece is the bare item itself.
    if !TopLevel::new(params, ';').skip(1).all(|p| param(p).is_some()) {
        return None;
    }
    Some(Item { name, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_items_and_params() {
        let items = parse_list(r#""burst";q=100;w=60, "da\"ily";pk=:AA,E=:;q=1000"#).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].name, "burst");
        assert_eq!(items[0].int("q"), Ok(Some(100)));
        assert_eq!(items[1].name, "da\"ily");
        assert_eq!(items[1].int("q"), Ok(Some(1000)));
        assert_eq!(items[1].int("w"), Ok(None));
        let tokens = parse_list("default;r=5, other").unwrap();
        assert_eq!((tokens[0].name.as_ref(), tokens[0].int("r")), ("default", Ok(Some(5))));
        assert_eq!((tokens[1].name.as_ref(), tokens[1].int("r")), ("other", Ok(None)));
    }

    #[test]
    fn malformed_items_fail_the_list() {
        assert!(parse_list(r#""open"#).is_none());
        assert!(parse_list(r#""a";=3"#).is_none());
        assert!(parse_list(r#""a";r=1;;t=2"#).is_none());
        assert!(parse_list(r#""a", "#).is_none());
        assert_eq!(parse_list(r#""a";r="#).unwrap()[0].int("r"), Err(()));
    }
}
