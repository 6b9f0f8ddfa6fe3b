//! Text helpers shared by the parts that bound what they send, store or log.

/// The longest prefix of `s` of at most `max_bytes` bytes that ends on a character boundary
/// (never splits a UTF-8 sequence, so never panics).
pub fn truncate(s: &str, max_bytes: usize) -> &str {
    let mut end = s.len().min(max_bytes);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// Appends the decimal digits of `n` (no formatting machinery).
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(digits.get(i..).unwrap_or(&[])).unwrap_or(""));
}

#[cfg(test)]
mod tests {
    use super::truncate;

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
