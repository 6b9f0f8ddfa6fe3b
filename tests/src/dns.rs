//! A DNS server on 127.0.0.1 (UDP) that answers A queries for a few names, as a cluster's DNS
//! answers for a headless Service: one record per ready pod. A real Envoy's `STRICT_DNS`
//! cluster pointed at it (c-ares, `typed_dns_resolver_config`) makes one host per address.
//! AAAA queries for a known name get no records; any other name is NXDOMAIN.

use std::collections::HashMap;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
/// The answers' time to live: short, so that a resolver asks again.
const TTL_S: u32 = 1;

/// The server: answers until dropped.
pub struct DnsServer {
    /// Its UDP port on 127.0.0.1.
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Serves `records` (a name, lower case and without the final dot, and its addresses).
    pub fn start(records: &[(&str, &[Ipv4Addr])]) -> DnsServer {
        let records: HashMap<String, Vec<Ipv4Addr>> = records
            .iter()
            .map(|(name, ips)| (name.to_string(), ips.to_vec()))
            .collect();
        let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP port for DNS");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let port = socket.local_addr().expect("local address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut query = [0u8; 512];
            while !stopped.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut query) else {
                    continue;
                };
                if let Some(answer) = answer(&query[..n], &records) {
                    let _ = socket.send_to(&answer, from);
                }
            }
        });
        DnsServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer to one query; `None` for what is not a query of one question.
fn answer(query: &[u8], records: &HashMap<String, Vec<Ipv4Addr>>) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 || query[4..6] != [0, 1] {
        return None;
    }
    // The question: labels to a zero, then its type and class.
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let question = query.get(12..at + 4)?;
    let qtype = u16::from_be_bytes([query[at], query[at + 1]]);
    let qclass = u16::from_be_bytes([query[at + 2], query[at + 3]]);
    let found = records.get(&labels.join("."));
    let ips: &[Ipv4Addr] = match found {
        Some(ips) if qtype == TYPE_A && qclass == CLASS_IN => ips,
        _ => &[],
    };
    let rcode = if found.is_some() { 0 } else { 3 }; // NXDOMAIN for a name it does not hold
    let mut out = Vec::with_capacity(12 + question.len() + 16 * ips.len());
    out.extend_from_slice(&query[..2]); // the query's id
    out.extend_from_slice(&[0x81 | (query[2] & 0x01), 0x80 | rcode]); // QR, AA, RD as asked, RA
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&u16::try_from(ips.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    for ip in ips {
        out.extend_from_slice(&[0xC0, 12]); // the name: a pointer to the question's
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL_S.to_be_bytes());
        out.extend_from_slice(&[0, 4]);
        out.extend_from_slice(&ip.octets());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query for `name` of type `qtype`, as a resolver sends it.
    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(u8::try_from(label.len()).expect("a short label"));
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    #[test]
    fn a_known_name_gets_its_addresses_and_others_nxdomain() {
        let ips = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)];
        let records = HashMap::from([("a.example".to_owned(), ips.to_vec())]);
        let a = answer(&query("A.example", TYPE_A), &records).expect("an answer");
        assert_eq!(&a[..2], &[0x12, 0x34]);
        assert_eq!(a[3] & 0x0F, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 2, "two records");
        assert_eq!(&a[a.len() - 4..], &[127, 0, 0, 2]);
        let aaaa = answer(&query("a.example", 28), &records).expect("an answer");
        assert_eq!((aaaa[3] & 0x0F, u16::from_be_bytes([aaaa[6], aaaa[7]])), (0, 0));
        let other = answer(&query("b.example", TYPE_A), &records).expect("an answer");
        assert_eq!(other[3] & 0x0F, 3, "NXDOMAIN");
    }
}
