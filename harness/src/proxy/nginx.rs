//! What ngx_wasm_module hands a filter that Envoy does not, as a real Nginx shows it
//! (docs/real-nginx.md): `:path` is Nginx's parsed `$uri` — every escape decoded, `%2F`
//! included, slashes merged, dot segments resolved — with the raw query after it; and
//! `proxy_get_property("ngx.NAME")` reads Nginx variable `NAME`, of which the proxy serves
//! `remote_addr` and `http_<header>` (the header's name lower-cased, `-` as `_`), and
//! `source.address` is `$remote_addr`, without a port.

use std::net::SocketAddr;

use super::Headers;

/// `headers` as Nginx shows them to a filter, and the properties it answers for `peer`.
pub fn request_view(headers: &Headers, peer: SocketAddr) -> (Headers, Vec<(String, Vec<u8>)>) {
    let mut properties = vec![
        ("source.address".to_owned(), peer.ip().to_string().into_bytes()),
        ("ngx.remote_addr".to_owned(), peer.ip().to_string().into_bytes()),
    ];
    let mut shown = Headers::with_capacity(headers.len());
    for (name, value) in headers {
        if name == ":path" {
            shown.push((name.clone(), parsed_path(value)));
            continue;
        }
        if name == ":authority" {
            // ngx_wasm_module builds `:authority` from the server's `server_name` or the
            // machine's host name and the local port, never from the client's `Host` (seen in
            // a real Nginx); the harness shows the host name alone.
            shown.push((name.clone(), server_name().into_bytes()));
            continue;
        }
        if !name.starts_with(':') {
            let var = format!("ngx.http_{}", name.to_ascii_lowercase().replace('-', "_"));
            properties.push((var, value.clone()));
        }
        shown.push((name.clone(), value.clone()));
    }
    (shown, properties)
}

/// The machine's host name, as Nginx names a server without `server_name`.
fn server_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Nginx's `$uri` of request target `raw`, followed by `?` and the raw query if any.
fn parsed_path(raw: &[u8]) -> Vec<u8> {
    let (path, query) = match raw.iter().position(|&b| b == b'?') {
        Some(q) => (&raw[..q], Some(&raw[q..])),
        None => (raw, None),
    };
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            path[i],
            path.get(i + 1).copied().and_then(hex),
            path.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                decoded.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut trailing = false;
    for seg in decoded.split(|&b| b == b'/').skip(1) {
        trailing = matches!(seg, b"" | b"." | b"..");
        match seg {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = Vec::with_capacity(raw.len());
    for seg in &segments {
        out.push(b'/');
        out.extend_from_slice(seg);
    }
    if trailing || segments.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(query.unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::parsed_path;

    #[test]
    fn paths_are_parsed_as_nginx_does() {
        let p = |raw: &str| String::from_utf8(parsed_path(raw.as_bytes())).unwrap();
        assert_eq!(p("//api//search?q=1"), "/api/search?q=1");
        assert_eq!(p("/api/%73earch"), "/api/search");
        assert_eq!(p("/api/x/../search"), "/api/search");
        assert_eq!(p("/api/./search/"), "/api/search/");
        assert_eq!(p("/a%2Fb"), "/a/b", "Nginx decodes %2F in $uri");
        assert_eq!(p("/"), "/");
    }
}
