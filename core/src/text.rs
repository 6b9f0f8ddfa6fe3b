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

/// Appends the decimal digits of `n` (no formatting machinery: two digits a step, from a
/// table, as `itoa` does).
pub fn push_u64(out: &mut String, mut n: u64) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut buf = [b'0'; 20]; // u64::MAX has 20 digits
    let mut at = buf.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[n as usize * 2..n as usize * 2 + 2]);
    } else {
        at -= 1;
        buf[at] = b'0' + n as u8;
    }
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or("0"));
}

#[cfg(test)]
mod tests {
    use super::truncate;

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
