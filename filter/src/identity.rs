//! Reading a request's identities: client IP (forwarding header with trusted hops, else the
//! connection's address) and header or property identities, bounded by digest
//! (`sluice_core::identity`); and the request's canonical path (`sluice_core::path`).

use std::borrow::Cow;
use std::net::IpAddr;

use sluice_core::path::canonical;
use sluice_core::text::truncate;
use sluice_core::wire::MAX_PATH_BYTES;

use crate::config::IpSource;
use crate::proxy::{LogLevel, Proxy};

/// A header value as text. Header values are bytes: a proxy passes obs-text (0x80–0xFF) on
/// to the filter. Valid UTF-8 is kept as it is. Otherwise `%` and every byte that is not
/// UTF-8 are percent-escaped (`caf\xE9` → `caf%E9`), so distinct values stay distinct
/// identities, each limited as its own. Treating such a value as absent would let a client
/// shed its API key's or user's limits by adding one bad byte; an escaped value reads as a
/// string the client could have sent anyway, so it gains nothing either.
pub fn header_text(raw: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(raw) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(raw.len() * 3);
    for chunk in raw.utf8_chunks() {
        out.push_str(&chunk.valid().replace('%', "%25"));
        for byte in chunk.invalid() {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    Cow::Owned(out)
}

/// The path a check carries, and leases are matched with, for request target `p`: its
/// canonical form (no query, escapes of unreserved characters decoded, `//` merged, dot
/// segments removed), at most [`MAX_PATH_BYTES`] (cut on a character boundary).
pub fn check_path(p: &str) -> String {
    truncate(&canonical(p), MAX_PATH_BYTES).to_owned()
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
    // Envoy's usual form, `1.2.3.4:5678`, read without the general parsers' attempts.
    if let Some((host, port)) = address.rsplit_once(':') {
        if !host.contains(':') && port.parse::<u16>().is_ok() {
            return host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4);
        }
    }
    if let Ok(ip) = address.parse() {
        return Some(ip);
    }
    if let Ok(sock) = address.parse::<std::net::SocketAddr>() {
        return Some(sock.ip());
    }
    None
}

/// The client IP: from the forwarding header with trusted hops, else the connection's
/// (`source.address`).
pub fn request_ip(proxy: &impl Proxy, source: &IpSource) -> Option<IpAddr> {
    // No header to trust (Envoy: its own `source.address` is the client): no host call for it.
    let forwarded = (source.trusted_hops > 0)
        .then(|| proxy.request_header(&source.header))
        .flatten();
    client_ip(forwarded.as_deref(), source.trusted_hops).or_else(|| source_ip(&proxy.property(&["source", "address"])?))
}

/// Envoy appends the peer to `x-forwarded-for` before filters run and hands them the client
/// it chose as `source.address`; a filter that also counts hops of the header takes
/// Envoy's own entry for the client, and every client behind one proxy shares its limit
/// (docs/filter.md, "The client's address"). Said once a worker, on its first request:
/// Envoy names itself there (`xds.node.user_agent_name` is "envoy", seen in a real Envoy;
/// `node.user_agent_name` answers nothing), and ngx_wasm_module, which has no `xds`
/// properties, answers NotFound there but refuses any dotted property outside a request
/// with an `[error]` line in its log (seen in a real Nginx), so not at configuration.
pub fn warn_of_trust_in_envoy(p: &impl Proxy, source: &IpSource) {
    if source.trusted_hops == 0 || p.property(&["xds", "node", "user_agent_name"]).as_deref() != Some("envoy") {
        return;
    }
    p.log(
        LogLevel::Warn,
        &format!(
            "sluice-filter: identities.ip reads {} with trusted_hops {} in Envoy, which appends \
             the peer to that header itself: every client behind one proxy would share a limit. \
             Give \"ip\": {{}} and set the connection manager's use_remote_address and \
             xff_num_trusted_hops instead (docs/filter.md, \"The client's address\")",
            source.header, source.trusted_hops
        ),
    );
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
        assert_eq!(source_ip("1.2.3.4:99999"), None, "not a port");
        assert_eq!(source_ip("1.2.3.256:80"), None);
        assert_eq!(source_ip("::ffff:1.2.3.4"), "::ffff:1.2.3.4".parse().ok());
    }

    #[test]
    fn header_bytes_that_are_not_utf8_are_escaped_and_stay_distinct() {
        assert_eq!(header_text(b"caf\xc3\xa9 100%"), "café 100%");
        assert_eq!(header_text(b"caf\xe9"), "caf%E9");
        assert_eq!(header_text(b"\xff\xfe"), "%FF%FE");
        // `%` is escaped too in such a value: these two stay two identities.
        assert_eq!(header_text(b"%E9\xff"), "%25E9%FF");
        assert_eq!(header_text(b"\xe9%FF"), "%E9%25FF");
    }

    #[test]
    fn paths_are_canonical_without_query_and_bounded() {
        assert_eq!(check_path("/a/b?x=1"), "/a/b");
        assert_eq!(check_path("//a/./x/../b"), "/a/b");
        assert_eq!(check_path("?x=1"), "/");
        assert_eq!(check_path(""), "/");
        let long = format!("/{}", "é".repeat(3_000));
        assert!(check_path(&long).len() <= MAX_PATH_BYTES);
        assert!(check_path(&long).starts_with("/é"));
    }
}
