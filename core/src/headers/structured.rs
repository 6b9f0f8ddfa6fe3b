//! A small reader for the structured-field lists of the IETF `RateLimit` headers:
//! `"name";q=100;w=60, "other";q=5;w=1`. Only what those headers need: items that are
//! strings or tokens, and their parameters as raw text.

/// One list member: its bare item (string unquoted) and its `;key=value` parameters.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Item<'a> {
    pub name: String,
    pub params: Vec<(&'a str, &'a str)>,
}

impl Item<'_> {
    /// The parameter `key` as a non-negative integer. `Err` if present but malformed.
    pub fn int(&self, key: &str) -> Result<Option<u64>, ()> {
        match self.params.iter().find(|(k, _)| *k == key) {
            None => Ok(None),
            Some((_, v)) => super::parse::parse_u64(v).map(Some).ok_or(()),
        }
    }
}

/// Splits `s` on commas that are outside quoted strings and byte sequences.
pub(super) fn split_top_level(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut in_string, mut in_bytes, mut escaped) = (0, false, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' if !in_bytes => in_string = !in_string,
            ':' if !in_string => in_bytes = !in_bytes,
            c if c == sep && !in_string && !in_bytes => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Parses a list; `None` if any member is malformed (the whole field is then ignored).
pub(super) fn parse_list(s: &str) -> Option<Vec<Item<'_>>> {
    split_top_level(s, ',')
        .into_iter()
        .map(|m| parse_item(m.trim()))
        .collect()
}

fn parse_item(s: &str) -> Option<Item<'_>> {
    let mut pieces = split_top_level(s, ';').into_iter();
    let bare = pieces.next()?.trim();
    let name = if let Some(inner) = bare.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            out.push(if c == '\\' { chars.next()? } else { c });
        }
        out
    } else if !bare.is_empty()
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "*-_.:/%&!#$'+^`|~".contains(c))
    {
        bare.to_owned()
    } else {
        return None;
    };
    let params = pieces
        .map(|p| {
            let p = p.trim();
            match p.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Some((k.trim(), v.trim())),
                None if !p.is_empty() => Some((p, "?1")),
                _ => None,
            }
        })
        .collect::<Option<Vec<_>>>()?;
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
    }

    #[test]
    fn malformed_items_fail_the_list() {
        assert!(parse_list(r#""open"#).is_none());
        assert!(parse_list(r#""a";=3"#).is_none());
        assert_eq!(parse_list(r#""a";r="#).unwrap()[0].int("r"), Err(()));
    }
}
