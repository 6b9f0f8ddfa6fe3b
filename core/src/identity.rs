//! Identity values that name one client each: bounded without merging two clients, and
//! client addresses grouped the way networks hand them out.
//!
//! The filter applies these to what it reads from a request, and the check service to what
//! a caller of its API sends, so both count a client under the same key.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest, Sha256};

use crate::text::{push_u64, truncate};
use crate::wire::MAX_IDENTITY_BYTES;

/// How much of a long value stays readable in front of its digest.
pub const READABLE_PREFIX_BYTES: usize = 128;

/// The IPv6 prefix length clients are grouped by unless configured: a /64 is what one
/// subscriber, one host or one cloud instance is handed, and one holder of it has 2^64
/// addresses to choose from.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// `value` as an identity of at most [`MAX_IDENTITY_BYTES`] bytes: itself when it fits,
/// else its first [`READABLE_PREFIX_BYTES`] bytes (on a character boundary), `~`, and the
/// first 128 bits of its SHA-256 in hex. Two long values that share a prefix stay two
/// identities; to take another client's place a client would need a SHA-256 second
/// preimage. Never cut: a cut would merge every value with the same first bytes.
pub fn bounded(value: &str) -> Cow<'_, str> {
    if value.len() <= MAX_IDENTITY_BYTES {
        return Cow::Borrowed(value);
    }
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(READABLE_PREFIX_BYTES + 1 + 32);
    out.push_str(truncate(value, READABLE_PREFIX_BYTES));
    out.push('~');
    for byte in &digest[..16] {
        let _ = write!(out, "{byte:02x}");
    }
    Cow::Owned(out)
}

/// The identity of client address `ip`: an IPv4 address as itself (an IPv4-mapped IPv6
/// address too: `::ffff:198.51.100.9` is `198.51.100.9`), an IPv6 address as its network of
/// `v6_prefix` bits (`2001:db8:1:2::/64`), or as itself with 128.
pub fn ip_key(ip: IpAddr, v6_prefix: u8) -> String {
    match ip {
        IpAddr::V4(v4) => dotted(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => dotted(v4),
            None if v6_prefix >= 128 => v6.to_string(),
            None => format!("{}/{v6_prefix}", mask(v6, v6_prefix)),
        },
    }
}

/// `ip` in dotted decimal, as its `Display` writes it, without the formatting machinery (a
/// proxy does this once a request).
fn dotted(ip: Ipv4Addr) -> String {
    let mut out = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        push_u64(&mut out, u64::from(octet));
    }
    out
}

fn mask(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let bits = u128::from(ip);
    let kept = match prefix {
        0 => 0,
        p => bits & (u128::MAX << (128 - u32::from(p.min(128)))),
    };
    Ipv6Addr::from(kept)
}

/// An `ip` identity a caller sent, as [`ip_key`] has it: an address, or an address with a
/// prefix length (what a proxy that groups IPv6 clients sends; grouped again, never split
/// finer than it came). A value that is not an address stays as it is.
pub fn ip_identity(value: &str, v6_prefix: u8) -> Cow<'_, str> {
    let (addr, prefix) = match value.split_once('/') {
        Some((addr, len)) => match len.parse::<u8>() {
            Ok(len) if len <= 128 => (addr, len.min(v6_prefix)),
            _ => return Cow::Borrowed(value),
        },
        None => (value, v6_prefix),
    };
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) if value.contains('/') => Cow::Borrowed(value),
        Ok(ip) => {
            let key = ip_key(ip, prefix);
            if key == value {
                Cow::Borrowed(value)
            } else {
                Cow::Owned(key)
            }
        }
        Err(_) => Cow::Borrowed(value),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn an_ipv4_key_is_the_address_as_display_writes_it(bits: u32) {
            let v4 = Ipv4Addr::from(bits);
            prop_assert_eq!(ip_key(IpAddr::V4(v4), 64), v4.to_string());
            prop_assert_eq!(ip_key(IpAddr::V6(v4.to_ipv6_mapped()), 64), v4.to_string());
        }
    }

    #[test]
    fn short_values_stay_and_long_ones_become_distinct_digests() {
        assert_eq!(bounded("key-1"), "key-1");
        let exact = "k".repeat(MAX_IDENTITY_BYTES);
        assert_eq!(bounded(&exact), exact);
        let a = format!("{}A", "k".repeat(300));
        let b = format!("{}B", "k".repeat(300));
        let (da, db) = (bounded(&a), bounded(&b));
        assert_ne!(da, db, "a shared 300-byte prefix does not make one client");
        assert!(da.len() <= MAX_IDENTITY_BYTES);
        assert!(da.starts_with(&"k".repeat(READABLE_PREFIX_BYTES)));
        assert_eq!(da.len(), READABLE_PREFIX_BYTES + 1 + 32, "128 bits of digest in hex");
        assert_eq!(bounded(&a), da, "the same value, the same identity");
        let multibyte = "é".repeat(200);
        assert!(bounded(&multibyte).starts_with('é'));
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(ip_key(ip("2001:db8:1:2:aaaa::1"), 64), "2001:db8:1:2::/64");
        assert_eq!(ip_key(ip("2001:db8:1:2:bbbb::9"), 64), "2001:db8:1:2::/64");
        assert_eq!(ip_key(ip("2001:db8:1:3::1"), 64), "2001:db8:1:3::/64");
        assert_eq!(ip_key(ip("2001:db8:1:2::1"), 128), "2001:db8:1:2::1");
        assert_eq!(ip_key(ip("2001:db8:1:2::1"), 48), "2001:db8:1::/48");
        assert_eq!(ip_key(ip("2001:db8::1"), 0), "::/0");
        assert_eq!(ip_key(ip("::ffff:198.51.100.9"), 64), "198.51.100.9");
        assert_eq!(ip_key(ip("198.51.100.9"), 64), "198.51.100.9");
    }

    #[test]
    fn identities_sent_by_callers_are_grouped_the_same_way() {
        assert_eq!(ip_identity("2001:db8:1:2:aaaa::1", 64), "2001:db8:1:2::/64");
        assert_eq!(ip_identity("2001:db8:1:2::/64", 64), "2001:db8:1:2::/64");
        assert_eq!(ip_identity("2001:db8:1:2:aaaa::/80", 64), "2001:db8:1:2::/64");
        assert_eq!(
            ip_identity("2001:db8:1:2::/48", 64),
            "2001:db8:1::/48",
            "never finer than it came"
        );
        assert_eq!(ip_identity("::ffff:198.51.100.9", 64), "198.51.100.9");
        assert_eq!(ip_identity("198.51.100.9", 64), "198.51.100.9");
        assert!(matches!(ip_identity("198.51.100.9", 64), Cow::Borrowed(_)));
        assert_eq!(ip_identity("not-an-ip", 64), "not-an-ip");
        assert_eq!(ip_identity("2001:db8::1/999", 64), "2001:db8::1/999");
        assert_eq!(ip_identity("2001:db8::1", 128), "2001:db8::1");
    }
}
