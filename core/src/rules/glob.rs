//! Path globs: `*` matches any run of characters (including `/` and the empty run), `?`
//! exactly one character; every other character matches itself. Globs are anchored: the
//! whole path must match.

/// A compiled, anchored glob.
///
/// Compiled once when the rules load; [`Glob::matches`] never allocates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: Box<str>,
    /// The pattern is one or more `*` only: everything matches, nothing to scan.
    any: bool,
    /// The pattern has no wildcard: compare for equality.
    literal: bool,
    /// ASCII letters match either case (the pattern is kept lower-cased).
    fold: bool,
}

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Glob {
        Glob {
            any: !pattern.is_empty() && pattern.bytes().all(|b| b == b'*'),
            literal: !pattern.bytes().any(|b| b == b'*' || b == b'?'),
            pattern: pattern.into(),
            fold: false,
        }
    }

    /// Compiles `pattern` to match paths whatever the case of their ASCII letters
    /// (`/API/Search` as `/api/search`), for servers that read paths that way.
    pub fn case_insensitive(pattern: &str) -> Glob {
        Glob {
            fold: true,
            ..Glob::new(&pattern.to_ascii_lowercase())
        }
    }

    /// Whether every path matches (the pattern is `*`, or `*`s only).
    pub fn matches_any(&self) -> bool {
        self.any
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `text` matches the whole pattern.
    ///
    /// No allocation; linear in `text` for patterns with at most one `*`, and at worst
    /// proportional to `pattern.len() × text.len()` (both are bounded: rule paths by
    /// validation, request paths by the wire limits).
    pub fn matches(&self, text: &str) -> bool {
        if self.any {
            return true;
        }
        if self.literal {
            return if self.fold {
                self.pattern.eq_ignore_ascii_case(text)
            } else {
                *self.pattern == *text
            };
        }
        let (p, t) = (self.pattern.as_bytes(), text.as_bytes());
        // Both indices stay on character boundaries whenever `pi` points at a wildcard,
        // because wildcards are ASCII and literal bytes are compared whole characters at a
        // time; so `?` and backtracking step over whole UTF-8 characters.
        let (mut pi, mut ti) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some(b'*') => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                Some(b'?') => {
                    pi += 1;
                    ti += char_len(t[ti]);
                }
                Some(&c) if c == t[ti] || (self.fold && c == t[ti].to_ascii_lowercase()) => {
                    pi += 1;
                    ti += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        let next = st + char_len(t[st]);
                        pi = sp + 1;
                        ti = next;
                        star = Some((sp, next));
                    }
                    None => return false,
                },
            }
        }
        p.get(pi..).unwrap_or_default().iter().all(|&c| c == b'*')
    }
}

/// Length of the UTF-8 character whose first byte is `lead`.
fn char_len(lead: u8) -> usize {
    match lead {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xff => 4,
        // A continuation byte never starts a step (see `matches`); move on by one anyway.
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn cases() {
        let cases = [
            ("*", "/anything", true),
            ("*", "", true),
            ("**", "/a/b", true),
            ("/api/search*", "/api/search", true),
            ("/api/search*", "/api/search/x?q=1", true),
            ("/api/search*", "/api/other", false),
            ("/api/search*", "/api/searc", false),
            ("/api/*/items", "/api/v1/items", true),
            ("/api/*/items", "/api/v1/v2/items", true),
            ("/api/*/items", "/api/v1/items/2", false),
            ("/api/*/items", "/api//items", true),
            ("/a?c", "/abc", true),
            ("/a?c", "/ac", false),
            ("/a?c", "/abbc", false),
            ("/exact", "/exact", true),
            ("/exact", "/exactly", false),
            ("/exact", "/exac", false),
            ("/Exact", "/exact", false),
            ("*.json", "/x/y.json", true),
            ("*.json", "/x/y.json.bak", false),
            ("*a*b*c", "xxaxxbxxcxxc", true),
            ("*a*b*c", "xxaxxbxxcxxd", false),
            ("/x/*?", "/x/", false),
            ("/x/*?", "/x/1", true),
            ("", "", true),
            ("", "/", false),
            ("/caf?", "/café", true),
            ("/caf?/", "/café/", true),
            ("/?", "/日", true),
            ("/??", "/日", false),
            ("/*本", "/日本", true),
            ("/*/é", "/日本/é", true),
        ];
        for (p, t, want) in cases {
            assert_eq!(Glob::new(p).matches(t), want, "{p} vs {t}");
        }
    }

    #[test]
    fn case_insensitive_globs_fold_ascii_letters_only() {
        let glob = Glob::case_insensitive("/API/search*");
        assert!(glob.matches("/api/search"));
        assert!(glob.matches("/Api/SEARCH/x"));
        assert!(!glob.matches("/api/other"));
        assert!(Glob::case_insensitive("/Exact").matches("/EXACT"));
        assert!(Glob::case_insensitive("/café").matches("/CAFé"));
        assert!(!Glob::case_insensitive("/café").matches("/cafÉ"), "only ASCII folds");
        assert!(!Glob::new("/api/search*").matches("/API/search"));
    }

    #[test]
    fn pathological_patterns_finish() {
        let glob = Glob::new(&"*a".repeat(50));
        assert!(!glob.matches(&"a".repeat(49)));
        assert!(glob.matches(&"a".repeat(4096)));
        assert!(!Glob::new(&format!("{}b", "*a".repeat(50))).matches(&"a".repeat(4096)));
    }
}
