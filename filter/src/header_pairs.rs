//! A header map as the proxy-wasm ABI passes it whole (`proxy_get_header_map_pairs`, and the
//! maps the filter hands over for a call or a local answer): the number of pairs, each name's
//! and value's length, then each name and value followed by a NUL.
//!
//! Reading the request's headers in one call costs a host about what one header read does
//! (BENCHMARKS.md, "What a host call costs in Envoy"): the check path reads the method, the
//! path, `host` and `:authority` so, in one call where it made four.

/// Header pairs in the ABI's form, each looked up where it lies (no copy a pair).
#[derive(Debug, Default)]
pub struct HeaderPairs(Vec<u8>);

impl HeaderPairs {
    /// The map the host handed over (empty when it had none).
    pub fn from_bytes(bytes: Vec<u8>) -> HeaderPairs {
        HeaderPairs(bytes)
    }

    /// The map of `pairs`.
    pub fn of(pairs: &[(&str, &str)]) -> HeaderPairs {
        HeaderPairs(serialize(pairs))
    }

    /// The map's bytes, for the host.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The first value of header `name` (matched regardless of case: ngx_wasm_module hands
    /// names over as the client wrote them), as bytes; `None` when absent or when the map is
    /// not well formed.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.pairs()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, value)| value)
    }

    /// Each pair in order; it stops where the map is not well formed.
    fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let b = &self.0;
        let word = |at: usize| -> Option<usize> {
            let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
            usize::try_from(u32::from_le_bytes(bytes)).ok()
        };
        let count = word(0).unwrap_or(0);
        // The data begins after the count and two lengths a pair.
        let mut data = count
            .checked_mul(8)
            .and_then(|n| n.checked_add(4))
            .unwrap_or(usize::MAX);
        (0..count).map_while(move |i| {
            let lengths = i.checked_mul(8)?.checked_add(4)?;
            let (name_len, value_len) = (word(lengths)?, word(lengths.checked_add(4)?)?);
            let name = b.get(data..data.checked_add(name_len)?)?;
            let value_at = data.checked_add(name_len)?.checked_add(1)?;
            let value = b.get(value_at..value_at.checked_add(value_len)?)?;
            data = value_at + value_len + 1;
            Some((name, value))
        })
    }
}

/// `pairs` in the ABI's form, in one allocation of its size.
fn serialize(pairs: &[(&str, &str)]) -> Vec<u8> {
    let text: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + 8 * pairs.len() + text);
    let size = |s: &str| (s.len() as u32).to_le_bytes();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (name, value) in pairs {
        out.extend_from_slice(&size(name));
        out.extend_from_slice(&size(value));
    }
    for (name, value) in pairs {
        for s in [name, value] {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_reads_back_each_first_value_whatever_the_case_of_its_name() {
        let map = HeaderPairs::of(&[
            (":path", "/a"),
            ("Host", "example.com"),
            ("host", "second"),
            ("x-e", ""),
        ]);
        assert_eq!(map.get(":path"), Some(&b"/a"[..]));
        assert_eq!(
            map.get("host"),
            Some(&b"example.com"[..]),
            "the first, as a header read gives"
        );
        assert_eq!(map.get("x-e"), Some(&b""[..]));
        assert_eq!(map.get(":method"), None);
        assert_eq!(HeaderPairs::default().get(":path"), None);
    }

    #[test]
    fn a_map_cut_short_or_lying_about_its_lengths_yields_what_is_whole() {
        let whole = HeaderPairs::of(&[("a", "1"), ("b", "2")]).0;
        for cut in 0..whole.len() {
            let map = HeaderPairs::from_bytes(whole[..cut].to_vec());
            assert!(map.pairs().count() <= 2);
            assert!(map.get("b").is_none_or(|v| v == b"2"), "cut at {cut}");
        }
        let mut lying = whole.clone();
        lying[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(HeaderPairs::from_bytes(lying).get("b"), None, "a count past the map");
    }
}
