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
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    send_bytes(port, method, path, &headers, body)
}

/// A request whose header values are bytes, sent as they are: obs-text (0x80–0xFF), which a
/// proxy passes on, or bytes no correct client sends.
pub fn send_bytes(port: u16, method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Reply {
    // `host: sluice.test` unless the caller names the host.
    let host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "host: sluice.test\r\n"
    };
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\n{host}connection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (k, v) in headers {
        raw.extend_from_slice(k.as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(v);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(body);
    parse(&exchange(port, &raw).unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}")))
        .unwrap_or_else(|| panic!("{method} {path} on port {port}: no HTTP answer"))
}

/// Sends `raw` bytes as they are and parses the answer; panics when the server closes the
/// connection without one (every request, however malformed, must get a status line).
pub fn raw(port: u16, raw: &[u8]) -> Reply {
    let what = String::from_utf8_lossy(raw.get(..raw.len().min(80)).unwrap_or_default()).into_owned();
    let answer = exchange(port, raw).unwrap_or_else(|e| panic!("{what:?} on port {port}: {e}"));
    parse(&answer).unwrap_or_else(|| panic!("{what:?} on port {port}: closed without an HTTP answer"))
}

fn exchange(port: u16, raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    // A server may answer and close before reading all of an oversized request: what it
    // answered is read even when the write or the read then fails.
    let sent = stream.write_all(raw);
    let mut answer = Vec::new();
    let read = read_answer(&mut stream, &mut answer);
    if answer.is_empty() {
        sent?;
        read?;
    }
    Ok(answer)
}

/// Reads one answer: its head, then `content-length` bytes of body (to the end of the
/// connection without one). Not to the connection's end regardless: a real Envoy keeps a
/// connection it closes after a local reply open up to its `delayed_close_timeout` (1 s),
/// for the client to close first, as a client that has its whole answer does.
fn read_answer(stream: &mut TcpStream, answer: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| answer.len() >= end + 4 + n) {
                return Ok(());
            }
        }
        match stream.read(&mut chunk)? {
            0 => return Ok(()),
            n => answer.extend_from_slice(&chunk[..n]),
        }
    }
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
