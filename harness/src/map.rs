//! The ABI's serialized header map: `[n][key_len val_len]*n [key\0 val\0]*n`, little-endian u32s.
//! Names and values are bytes; names are kept as text (HTTP field names are tokens).

/// Serializes `pairs`.
pub fn serialize<V: AsRef<[u8]>>(pairs: &[(String, V)]) -> Vec<u8> {
    let len = |v: &V| v.as_ref().len();
    let mut out = Vec::with_capacity(4 + pairs.iter().map(|(k, v)| 10 + k.len() + len(v)).sum::<usize>());
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(len(v) as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// Parses a serialized map, values as bytes; `None` if it is malformed.
pub fn deserialize(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let u32_at =
        |i: usize| -> Option<usize> { Some(u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?) as usize) };
    let n = u32_at(0)?;
    if n > bytes.len() / 8 {
        return None;
    }
    let mut sizes = Vec::with_capacity(n);
    for i in 0..n {
        sizes.push((u32_at(4 + i * 8)?, u32_at(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut pairs = Vec::with_capacity(n);
    let mut take = |len: usize| -> Option<Vec<u8>> {
        let s = bytes.get(at..at.checked_add(len)?)?;
        at += len + 1;
        Some(s.to_vec())
    };
    for (kl, vl) in sizes {
        let k = String::from_utf8_lossy(&take(kl)?).into_owned();
        pairs.push((k, take(vl)?));
    }
    Some(pairs)
}

/// Parses a serialized map with values as text (invalid UTF-8 replaced): for maps the
/// module builds itself (its calls' and local responses' headers).
pub fn deserialize_text(bytes: &[u8]) -> Option<Vec<(String, String)>> {
    let pairs = deserialize(bytes)?;
    Some(
        pairs
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_garbage() {
        let pairs = vec![(":path".to_owned(), b"/a".to_vec()), ("x".to_owned(), Vec::new())];
        assert_eq!(super::deserialize(&super::serialize(&pairs)), Some(pairs));
        assert_eq!(super::deserialize(&[255, 255, 255, 255]), None);
        assert_eq!(super::deserialize(&[]), None);
    }

    #[test]
    fn values_keep_their_bytes() {
        let pairs = vec![("x-api-key".to_owned(), b"caf\xe9".to_vec())];
        let bytes = super::serialize(&pairs);
        assert_eq!(super::deserialize(&bytes), Some(pairs));
        let text = super::deserialize_text(&bytes).unwrap_or_default();
        assert_eq!(text, [("x-api-key".to_owned(), "caf\u{fffd}".to_owned())]);
    }
}
