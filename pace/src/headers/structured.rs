//! A small reader for the structured-field lists (RFC 8941) of the IETF `RateLimit`
//! headers: `"name";q=100;w=60, "other";q=5;w=1`. Only what those headers need: members
//! that are strings or tokens, the integer parameters `q`, `w`, `r` and `t` (and `c`, `a`:
//! the names proposed for `q` and `r` after draft -11), the quota unit `qu` (a string) and
//! the partition key `pk` (a byte sequence); others are checked for syntax and skipped. One pass over the bytes, allocation-free (but for
//! a name with escapes). Lenient where it costs nothing: spaces around `;` and `=`.

use std::borrow::Cow;

/// The integer parameters this reader keeps.
const KEYS: [&str; 6] = ["q", "w", "r", "t", "c", "a"];

/// The names proposed after draft -11 for a parameter (`c` for `q`, `a` for `r`); the
/// draft's own name wins when a member has both.
const ALIASES: [(&str, &str); 2] = [("q", "c"), ("r", "a")];

/// One list member: its bare item (string unquoted), its integer parameters (`Err` when
/// present but not a non-negative integer; the last one wins if repeated), its `qu` and its
/// `pk`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Item<'a> {
    pub name: Cow<'a, str>,
    params: [Option<Result<u64, ()>>; 6],
    /// The quota unit (`qu="tokens"`), unquoted.
    pub unit: Option<&'a str>,
    /// The partition key (`pk=:AbC=:`), as sent, colons included.
    pub partition: Option<&'a str>,
}

impl Item<'_> {
    /// The parameter `key` (one of `q`, `w`, `r`, `t`) as a non-negative integer, or its
    /// newer name's (`c`, `a`) when the member has no `key`. `Err` if present but malformed.
    pub fn int(&self, key: &str) -> Result<Option<u64>, ()> {
        let own = self.raw_int(key)?;
        match ALIASES.iter().find(|(k, _)| *k == key) {
            Some((_, alias)) if own.is_none() => self.raw_int(alias),
            _ => Ok(own),
        }
    }

    fn raw_int(&self, key: &str) -> Result<Option<u64>, ()> {
        let slot = KEYS.iter().position(|k| *k == key).and_then(|i| self.params.get(i));
        slot.copied().flatten().transpose()
    }
}

/// A position in a field value.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// Consumes `[OWS] ";" [OWS]` if next; otherwise moves nothing.
    fn semicolon(&mut self) -> bool {
        let save = self.pos;
        self.skip_ows();
        if self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_ows();
            true
        } else {
            self.pos = save;
            false
        }
    }

    /// The bytes from here while `keep` holds. Stops only at ASCII bytes, so the slice
    /// always falls on character boundaries.
    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.s.get(start..self.pos).unwrap_or("")
    }

    /// At `"`: the string's raw inside and whether it has escapes; `None` if unterminated.
    fn string(&mut self) -> Option<(&'a str, bool)> {
        let start = self.pos + 1;
        let mut escaped = false;
        let mut i = start;
        loop {
            match self.s.as_bytes().get(i)? {
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                b'"' => {
                    self.pos = i + 1;
                    return Some((self.s.get(start..i)?, escaped));
                }
                _ => i += 1,
            }
        }
    }

    /// At `:`: a byte sequence `:base64:`, colons included; `None` if unterminated.
    fn byte_sequence(&mut self) -> Option<&'a str> {
        let start = self.pos;
        let len = self.s.as_bytes().get(start + 1..)?.iter().position(|&b| b == b':')?;
        self.pos = start + len + 2;
        self.s.get(start..self.pos)
    }
}

/// A token's characters (RFC 9110 tchar, plus `:` and `/` as RFC 8941 allows).
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b)
}

/// One `key[=value]` parameter (a bare key means `?1`); `None` if malformed.
fn param<'a>(c: &mut Cursor<'a>) -> Option<(&'a str, &'a str)> {
    let key = c.take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'*'));
    if key.is_empty() {
        return None;
    }
    let save = c.pos;
    c.skip_ows();
    if c.peek() != Some(b'=') {
        c.pos = save;
        return Some((key, "?1"));
    }
    c.pos += 1;
    c.skip_ows();
    let value = match c.peek()? {
        b'"' => {
            let start = c.pos;
            c.string()?;
            c.s.get(start..c.pos)?
        }
        b':' => c.byte_sequence()?,
        _ => c.take_while(|b| !matches!(b, b';' | b',' | b' ' | b'\t' | b'"')),
    };
    (!value.is_empty()).then_some((key, value))
}

/// One list member.
fn item<'a>(c: &mut Cursor<'a>) -> Option<Item<'a>> {
    let name = match c.peek()? {
        b'"' => match c.string()? {
            (raw, false) => Cow::Borrowed(raw),
            (raw, true) => {
                let mut out = String::with_capacity(raw.len());
                let mut chars = raw.chars();
                while let Some(ch) = chars.next() {
                    out.push(if ch == '\\' { chars.next()? } else { ch });
                }
                Cow::Owned(out)
            }
        },
        b if b.is_ascii_alphabetic() || b == b'*' => Cow::Borrowed(c.take_while(is_token_char)),
        _ => return None,
    };
    let (mut params, mut unit, mut partition) = ([None; 6], None, None);
    while c.semicolon() {
        let (key, value) = param(c)?;
        match key {
            "qu" => unit = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')),
            "pk" => partition = Some(value).filter(|v| v.starts_with(':')),
            _ => {
                let slot = KEYS.iter().position(|k| *k == key).and_then(|i| params.get_mut(i));
                if let Some(slot) = slot {
                    *slot = Some(parse_u64(value).ok_or(()));
                }
            }
        }
    }
    Some(Item {
        name,
        params,
        unit,
        partition,
    })
}

/// The members of a list, in order; an `Err` (then the end) where a member is malformed,
/// which makes the whole field unusable.
pub(super) struct List<'a> {
    c: Cursor<'a>,
    done: bool,
}

/// Reads the list `s` lazily.
pub(super) fn list(s: &str) -> List<'_> {
    let mut c = Cursor { s, pos: 0 };
    c.skip_ows();
    let done = c.peek().is_none();
    List { c, done }
}

impl<'a> Iterator for List<'a> {
    type Item = Result<Item<'a>, ()>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let member = item(&mut self.c).and_then(|member| {
            self.c.skip_ows();
            match self.c.peek() {
                None => {
                    self.done = true;
                    Some(member)
                }
                Some(b',') => {
                    self.c.pos += 1;
                    self.c.skip_ows();
                    self.c.peek().map(|_| member) // a trailing comma is malformed
                }
                Some(_) => None,
            }
        });
        if member.is_none() {
            self.done = true;
        }
        Some(member.ok_or(()))
    }
}

/// Parses a whole list; `None` if any member is malformed.
/// A plain non-negative decimal integer that fits in `u64`; `None` for anything else.
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    let digits = s.trim_ascii().as_bytes();
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

#[cfg(test)]
fn parse_list(s: &str) -> Option<Vec<Item<'_>>> {
    list(s).collect::<Result<_, _>>().ok()
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
        let tokens = parse_list("default;r=5 ; t = 2, other;flag").unwrap();
        assert_eq!((tokens[0].name.as_ref(), tokens[0].int("r")), ("default", Ok(Some(5))));
        assert_eq!(tokens[0].int("t"), Ok(Some(2)));
        assert_eq!((tokens[1].name.as_ref(), tokens[1].int("flag")), ("other", Ok(None)));
        assert_eq!(parse_list(r#""p";r=1;r=2"#).unwrap()[0].int("r"), Ok(Some(2)));
        assert_eq!(parse_list(r#""p";q=1;Q=x;qq=y"#).unwrap()[0].int("q"), Ok(Some(1)));
        // The names proposed after draft -11 stand in for the draft's; the draft's win.
        let renamed = parse_list(r#""p";c=100;a=7;w=60, "q";r=1;a=2;q=3;c=4"#).unwrap();
        assert_eq!((renamed[0].int("q"), renamed[0].int("r")), (Ok(Some(100)), Ok(Some(7))));
        assert_eq!((renamed[1].int("q"), renamed[1].int("r")), (Ok(Some(3)), Ok(Some(1))));
        assert_eq!(parse_list(r#""p";k="a;b,c";r=3"#).unwrap()[0].int("r"), Ok(Some(3)));
        assert_eq!(parse_list("  ").unwrap(), []);
        let unit = parse_list(r#""p";q=9;qu="content-bytes";pk=:cHsd=:;w=10"#).unwrap();
        assert_eq!(
            (unit[0].unit, unit[0].partition),
            (Some("content-bytes"), Some(":cHsd=:"))
        );
        assert_eq!(unit[0].int("w"), Ok(Some(10)));
        assert_eq!(
            parse_list(r#""p";qu=tokens"#).unwrap()[0].unit,
            None,
            "qu must be a string"
        );
        let mut members = list(r#""a";r=1, ?"#);
        assert!(members.next().unwrap().is_ok());
        assert_eq!(members.next(), Some(Err(())));
        assert_eq!(members.next(), None);
    }

    #[test]
    fn malformed_items_fail_the_list() {
        for bad in [
            r#""open"#,
            r#""a";=3"#,
            r#""a";r=1;;t=2"#,
            r#""a", "#,
            r#""a";r="#,
            r#""a";b=:open"#,
            r#""a" "b""#,
            r#""a\"#,
            "1abc",
            "é",
        ] {
            assert!(parse_list(bad).is_none(), "{bad}");
        }
        assert_eq!(parse_list(r#""a";r=x"#).unwrap()[0].int("r"), Err(()));
    }
}
