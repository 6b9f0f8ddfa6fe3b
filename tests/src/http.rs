//! A plain HTTP/1.1 client over `std::net`, one connection per request, that can also send
//! what a correct client never would (oversized or malformed headers).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An answer: status, headers (names lower-cased) and body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
}

impl Reply {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `method path` to 127.0.0.1:`port` with `headers`, and an empty body.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(port, method, path, headers, b"")
}

/// A request with a body (its `content-length` is set here).
pub fn send(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: sluice.test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut raw = head.into_bytes();
    raw.extend_from_slice(body);
    parse(&exchange(port, &raw).unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}")))
        .unwrap_or_else(|| panic!("{method} {path} on port {port}: no HTTP answer"))
}

/// Sends `raw` bytes as they are; the parsed answer, or `None` when the server closed the
/// connection without one (what a proxy may do to garbage).
pub fn raw(port: u16, raw: &[u8]) -> Option<Reply> {
    exchange(port, raw).ok().and_then(|bytes| parse(&bytes))
}

fn exchange(port: u16, raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    stream.write_all(raw)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(answer)
}

fn parse(raw: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Reply {
        status,
        headers,
        body: body.to_owned(),
    })
}
