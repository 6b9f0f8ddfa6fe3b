//! Text helpers shared by the parts that bound what they send, store or log.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` would act on the text around it rather than show: a control character (C0,
/// DEL, C1), a bidirectional control (which reorders what follows: `\u{202E}gnp.exe` reads
/// `exe.png`), or an invisible format character (zero-width space, joiners, word joiner,
/// byte order mark).
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// `s` with every [`is_hidden`] character written out as `\u{…}` (its code point in hex),
/// for printing an identity or a rule name where a person reads it (logs, the command
/// line; the console does the same in JavaScript): what a client sent shows as it is, and
/// cannot reorder or hide what is printed after it.
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_hidden(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The longest prefix of `s` of at most `max_bytes` bytes that ends on a character boundary
/// (never splits a UTF-8 sequence, so never panics).
pub fn truncate(s: &str, max_bytes: usize) -> &str {
    let mut end = s.len().min(max_bytes);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// Appends the decimal digits of `n`, without the formatting machinery (a proxy writes a
/// dozen numbers a request): two digits a step from a table, as `itoa` does, each byte set
/// on its own (no copy call) and pushed as a character (ASCII: nothing to validate).
pub fn push_u64(out: &mut String, mut n: u64) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut digits = [b'0'; 20]; // u64::MAX has 20 digits
    let mut at = digits.len();
    while n >= 10 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        digits[at] = PAIRS[pair];
        digits[at + 1] = PAIRS[pair + 1];
    }
    // One digit left, or none when the pairs ended it (and `0`, which has one).
    if n > 0 || at == digits.len() {
        at -= 1;
        digits[at] = b'0' + n as u8;
    }
    out.reserve(digits.len() - at);
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

#[cfg(test)]
mod tests {
    use super::{truncate, visible};

    #[test]
    fn hidden_characters_are_written_out_and_the_rest_kept() {
        assert_eq!(visible("\u{202E}gnp.exe"), "\\u{202e}gnp.exe");
        assert_eq!(visible("a\nb\tc\u{7f}\u{85}"), "a\\u{a}b\\u{9}c\\u{7f}\\u{85}");
        assert_eq!(visible("x\u{200B}y\u{2066}z\u{FEFF}"), "x\\u{200b}y\\u{2066}z\\u{feff}");
        // Plain text, other scripts, emoji and a backslash are kept, without a copy.
        for kept in ["198.51.100.7", "user-42", "Łódź ☃ 名前 🦀", "DOMAIN\\user", ""] {
            assert!(
                matches!(visible(kept), std::borrow::Cow::Borrowed(k) if k == kept),
                "{kept:?}"
            );
        }
    }

    #[test]
    fn writes_every_width_of_number() {
        for n in [0, 7, 10, 42, 99, 100, 101, 999, 1_000, 65_536, 1_790_000_031, u64::MAX] {
            let mut out = String::from("x");
            super::push_u64(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }

    #[test]
    fn cuts_on_character_boundaries() {
        assert_eq!(truncate("hello", 3), "hel");
        assert_eq!(truncate("hello", 99), "hello");
        assert_eq!(truncate("héllo", 2), "h", "é is two bytes: not split");
        assert_eq!(truncate("é", 1), "");
        assert_eq!(truncate("", 0), "");
        let long = "é".repeat(200);
        assert_eq!(truncate(&long, 256).len(), 256);
    }
}
