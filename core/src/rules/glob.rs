//! Path globs: `*` matches any run of characters (including `/`), `?` exactly one.

/// A compiled, anchored glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: Box<[u8]>,
    any: bool,
}

impl Glob {
    /// Compiles `pattern`; `*` alone matches everything without scanning.
    pub fn new(pattern: &str) -> Glob {
        Glob {
            any: pattern.bytes().all(|b| b == b'*'),
            pattern: pattern.as_bytes().into(),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.pattern).unwrap_or("")
    }

    /// Whether `text` matches the whole pattern. Linear time, no allocation.
    pub fn matches(&self, text: &str) -> bool {
        if self.any {
            return true;
        }
        let (p, t) = (&*self.pattern, text.as_bytes());
        let (mut pi, mut ti) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some(b'*') => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                Some(&c) if c == b'?' || c == t[ti] => {
                    pi += 1;
                    ti += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        pi = sp + 1;
                        ti = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        p[pi.min(p.len())..].iter().all(|&c| c == b'*')
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn cases() {
        let cases = [
            ("*", "/anything", true),
            ("/api/search*", "/api/search", true),
            ("/api/search*", "/api/search/x?q=1", true),
            ("/api/search*", "/api/other", false),
            ("/api/*/items", "/api/v1/items", true),
            ("/api/*/items", "/api/v1/items/2", false),
            ("/a?c", "/abc", true),
            ("/a?c", "/ac", false),
            ("/exact", "/exact", true),
            ("/exact", "/exactly", false),
            ("*.json", "/x/y.json", true),
            ("", "", true),
        ];
        for (p, t, want) in cases {
            assert_eq!(Glob::new(p).matches(t), want, "{p} vs {t}");
        }
    }
}
