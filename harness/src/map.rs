//! The ABI's serialized header map: `[n][key_len val_len]*n [key\0 val\0]*n`, little-endian u32s.

/// Serializes `pairs`.
pub fn serialize(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + pairs.iter().map(|(k, v)| 10 + k.len() + v.len()).sum::<usize>());
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Parses a serialized map; `None` if it is malformed.
pub fn deserialize(bytes: &[u8]) -> Option<Vec<(String, String)>> {
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
    let mut take = |len: usize| -> Option<String> {
        let s = bytes.get(at..at + len)?;
        at += len + 1;
        Some(String::from_utf8_lossy(s).into_owned())
    };
    for (kl, vl) in sizes {
        let k = take(kl)?;
        let v = take(vl)?;
        pairs.push((k, v));
    }
    Some(pairs)
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_garbage() {
        let pairs = vec![(":path".to_owned(), "/a".to_owned()), ("x".to_owned(), String::new())];
        assert_eq!(super::deserialize(&super::serialize(&pairs)), Some(pairs));
        assert_eq!(super::deserialize(&[255, 255, 255, 255]), None);
        assert_eq!(super::deserialize(&[]), None);
    }
}
