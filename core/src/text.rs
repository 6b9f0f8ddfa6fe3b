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
