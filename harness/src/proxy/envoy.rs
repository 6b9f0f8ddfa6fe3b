//! What Envoy's HTTP connection manager does to a request before any filter sees it, with
//! `use_remote_address: true` (as examples/envoy.yaml sets it, and as a real Envoy 1.40 shows
//! it): the peer's address is appended to `x-forwarded-for`, and the client's address — the
//! `source.address` a filter reads — is the `xff_num_trusted_hops`-th address from the right
//! of the header as it came; the peer's when that is 0, or the header has no address there.

use std::net::{IpAddr, SocketAddr};

use super::Headers;

const XFF: &str = "x-forwarded-for";

/// `headers` with the peer appended to `x-forwarded-for`, and the `source.address` Envoy
/// derives for a request from `peer` when it trusts `trusted_hops` proxies in front.
pub fn request_view(headers: &Headers, peer: SocketAddr, trusted_hops: u32) -> (Headers, String) {
    let came = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(XFF))
        .map(|(_, v)| v);
    // Entries are split as bytes: one that is not text makes only itself unreadable.
    let client = came
        .filter(|_| trusted_hops > 0)
        .and_then(|v| v.rsplit(|&b| b == b',').nth(trusted_hops as usize - 1))
        .and_then(|entry| std::str::from_utf8(entry).ok())
        .and_then(|entry| entry.trim().parse::<IpAddr>().ok());
    let source = client.map_or_else(|| peer.to_string(), |ip| SocketAddr::new(ip, 0).to_string());
    // Envoy keeps the client's `Host` as `:authority` only.
    let mut shown: Headers = headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(XFF) && !name.eq_ignore_ascii_case("host"))
        .cloned()
        .collect();
    let mut value = came.cloned().unwrap_or_default();
    if !value.is_empty() {
        value.extend_from_slice(b",");
    }
    value.extend_from_slice(peer.ip().to_string().as_bytes());
    shown.push((XFF.to_owned(), value));
    (shown, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(xff: Option<&str>, hops: u32) -> (String, String) {
        let mut headers: Headers = vec![(":path".into(), b"/".to_vec())];
        if let Some(v) = xff {
            headers.push((XFF.into(), v.as_bytes().to_vec()));
        }
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let (shown, source) = request_view(&headers, peer, hops);
        let xff = shown
            .iter()
            .find(|(n, _)| n == XFF)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
        (xff.unwrap_or_default(), source)
    }

    #[test]
    fn the_peer_is_appended_and_the_trusted_hops_name_the_client() {
        assert_eq!(view(None, 0), ("127.0.0.1".into(), "127.0.0.1:5000".into()));
        assert_eq!(
            view(Some("1.1.1.1"), 0),
            ("1.1.1.1,127.0.0.1".into(), "127.0.0.1:5000".into())
        );
        // One proxy in front appended the client: that is whom Envoy counts.
        assert_eq!(view(Some("9.9.9.9, 1.1.1.1"), 1).1, "1.1.1.1:0");
        // Two: the second from the right.
        assert_eq!(view(Some("9.9.9.9, 1.1.1.1, 10.0.0.2"), 2).1, "1.1.1.1:0");
        // Too short, or not an address: the peer.
        assert_eq!(view(Some("1.1.1.1"), 2).1, "127.0.0.1:5000");
        assert_eq!(view(Some("nope"), 1).1, "127.0.0.1:5000");
        // A byte that is not text spoils only its own entry.
        let mut headers: Headers = vec![(XFF.into(), b"\xfe\xff, 1.1.1.1".to_vec())];
        headers.push((":path".into(), b"/".to_vec()));
        let (_, source) = request_view(&headers, "127.0.0.1:5000".parse().unwrap(), 1);
        assert_eq!(source, "1.1.1.1:0");
    }
}
