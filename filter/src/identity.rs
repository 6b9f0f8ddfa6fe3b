//! Reading a request's identities: client IP (forwarding header with trusted hops, else the
//! connection's address) and header identities, bounded in size.

use std::net::IpAddr;

/// Longest identity value sent to the check service (the wire limit).
pub const MAX_VALUE: usize = 256;

/// Cuts `v` to at most [`MAX_VALUE`] bytes on a character boundary.
pub fn bounded(v: &str) -> &str {
    let mut end = v.len().min(MAX_VALUE);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    &v[..end]
}

/// The client IP from a forwarding header with `trusted_hops` trusted proxies (Envoy's
/// `xff_num_trusted_hops`): the `trusted_hops`-th address from the right. `None` when the
/// header is absent, too short, or the address is not an IP: the caller then uses the
/// connection's address, so a client cannot choose its identity by adding entries on the left.
pub fn client_ip(forwarded: Option<&str>, trusted_hops: u32) -> Option<IpAddr> {
    if trusted_hops == 0 {
        return None;
    }
    let value = forwarded?;
    if value.len() > 4096 {
        return None;
    }
    let entry = value.rsplit(',').nth(trusted_hops as usize - 1)?;
    entry.trim().parse().ok()
}

/// The IP of an Envoy `source.address` (`1.2.3.4:5678`, `[::1]:5678`, or a bare address).
pub fn source_ip(address: &str) -> Option<IpAddr> {
    if let Ok(ip) = address.parse() {
        return Some(ip);
    }
    if let Ok(sock) = address.parse::<std::net::SocketAddr>() {
        return Some(sock.ip());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_hops_pick_from_the_right() {
        let xff = Some("6.6.6.6, 1.2.3.4, 10.0.0.1");
        assert_eq!(client_ip(xff, 1), "10.0.0.1".parse().ok());
        assert_eq!(client_ip(xff, 2), "1.2.3.4".parse().ok());
        assert_eq!(client_ip(xff, 4), None);
        assert_eq!(client_ip(xff, 0), None);
        assert_eq!(client_ip(Some("not-an-ip"), 1), None);
        assert_eq!(client_ip(None, 1), None);
    }

    #[test]
    fn source_addresses() {
        assert_eq!(source_ip("1.2.3.4:80"), "1.2.3.4".parse().ok());
        assert_eq!(source_ip("[::1]:80"), "::1".parse().ok());
        assert_eq!(source_ip("::1"), "::1".parse().ok());
        assert_eq!(source_ip("garbage"), None);
    }

    #[test]
    fn values_are_bounded_on_char_boundaries() {
        let long = "é".repeat(200);
        assert!(bounded(&long).len() <= MAX_VALUE);
        assert!(bounded(&long).chars().all(|c| c == 'é'));
    }
}
