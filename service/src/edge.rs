//! Where the network meets the node: every listener (data, admin, gRPC) accepts through
//! here. TLS, with client certificates when asked for (rustls); a cap on the connections
//! open at once (past it, new ones wait in the kernel's backlog); a header timeout, so a
//! client that sends half a request cannot hold a connection; and a much longer idle
//! timeout for keep-alive connections between requests, so the proxy's pool, not the node,
//! closes them (a request sent on a connection the node is closing would be lost).

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::listen::{Io, Listener};

/// How a node's listeners meet their clients.
#[derive(Clone)]
pub struct Edge {
    /// TLS on every listener, when set.
    pub tls: Option<TlsAcceptor>,
    /// Most connections open at once, per listener.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (and the TLS handshake may take).
    pub header_timeout: Duration,
    /// Longest an HTTP/1.1 keep-alive connection may sit idle between requests: longer than
    /// any proxy keeps a pooled connection by default, so the proxy, not the node, closes it.
    pub idle_timeout: Duration,
    /// Hand each HTTP request its connection's peer address ([`Peer`]), for the admin API's
    /// logs; off on the data listener, whose checks need no extension per request.
    pub peer_addresses: bool,
}

/// The address of the client on the other end of a request's connection (`host:port`, or
/// `unix socket`), a request extension when [`Edge::peer_addresses`] is on.
#[derive(Debug, Clone)]
pub struct Peer(pub String);

impl Default for Edge {
    fn default() -> Self {
        Edge {
            tls: None,
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_millis(IDLE_TIMEOUT_MS),
            peer_addresses: false,
        }
    }
}

/// The default idle timeout: past Envoy's default for a pooled connection (an hour), and
/// nginx's (60 s), Go's (90 s) and Node's (5 s).
pub const IDLE_TIMEOUT_MS: u64 = 65 * 60 * 1000;

/// Why TLS cannot be set up; the message names the file and what to do.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A PEM file that cannot be read or holds nothing usable.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the certificates or key.
    #[error("TLS configuration refused: {0}")]
    Config(String),
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, format!("cannot read PEM certificates: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// A TLS acceptor serving the certificate chain `cert` with key `key` (PEM files). With
/// `client_ca`, clients must present a certificate signed by one of its CAs (mutual TLS).
pub fn tls_acceptor(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, format!("no PEM private key: {e}")))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca)? {
                roots
                    .add(c)
                    .map_err(|e| file_error(ca, format!("not a CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("the certificate and key do not go together: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A connection as the servers read it: plain TCP or TLS over it, holding its place under
/// the listener's cap until it closes, and dropped when its client takes too long.
///
/// hyper's own header timeout starts whenever an HTTP/1.1 connection waits for a request, so
/// it would also end every keep-alive connection idle that long — and a proxy that reuses a
/// pooled connection just as the node closes it loses that check. So the connection keeps its
/// own time (`Watch`): the first 24 bytes (which tell HTTP/1.1 from HTTP/2) and every
/// HTTP/1.1 request's headers are due within the header timeout; between requests an
/// HTTP/1.1 connection may idle for the (much longer) idle timeout. HTTP/2 connections have
/// no deadline here: hyper pings their peers and closes the silent ones.
pub struct Conn {
    io: Box<dyn Io>,
    _place: OwnedSemaphorePermit,
    watch: Watch,
    timeouts: Timeouts,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

/// The bytes that tell HTTP/1.1 from HTTP/2: the HTTP/2 preface's length.
const SNIFFED_BYTES: usize = 24;
const H2_PREFACE: &[u8; SNIFFED_BYTES] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The end of an HTTP/1.1 request's headers.
const HEADERS_END: &[u8; 4] = b"\r\n\r\n";

/// A connection's two deadlines.
#[derive(Clone, Copy)]
struct Timeouts {
    header: Duration,
    idle: Duration,
}

/// What a connection's reads wait for. Reads that wait past the deadline fail in the states
/// that wait for the client: [`Watch::Start`], [`Watch::Headers`] and [`Watch::Idle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// The first bytes: `seen` of them so far, each the HTTP/2 preface's (a byte that is not
    /// makes the connection HTTP/1.1's at once).
    Start { seen: usize },
    /// An HTTP/1.1 request's headers, `matched` bytes into their end.
    Headers { matched: usize },
    /// An HTTP/1.1 request being served, until its response starts.
    Busy,
    /// An HTTP/2 connection.
    H2,
    /// An HTTP/1.1 connection between requests.
    Idle,
}

impl Watch {
    /// The state after reading `bytes`.
    fn read(self, bytes: &[u8]) -> Watch {
        match self {
            Watch::Start { seen } => {
                let take = bytes.len().min(SNIFFED_BYTES - seen);
                if bytes[..take] != H2_PREFACE[seen..seen + take] {
                    // HTTP/1.1: its request began with the preface's first `seen` bytes, then
                    // these; its headers may have ended in either (the preface holds a CRLFCRLF).
                    Watch::Headers { matched: 0 }
                        .read_headers(&H2_PREFACE[..seen])
                        .read_headers(bytes)
                } else if seen + take < SNIFFED_BYTES {
                    Watch::Start { seen: seen + take }
                } else {
                    Watch::H2
                }
            }
            Watch::Headers { .. } => self.read_headers(bytes),
            Watch::Idle if !bytes.is_empty() => Watch::Headers { matched: 0 }.read_headers(bytes),
            other => other,
        }
    }

    fn waits_for_client(self) -> bool {
        !matches!(self, Watch::Busy | Watch::H2)
    }

    /// Follows `bytes` towards the end of the headers: [`Watch::Busy`] once it has come.
    fn read_headers(self, bytes: &[u8]) -> Watch {
        let Watch::Headers { mut matched } = self else {
            return self;
        };
        for &b in bytes {
            matched = if b == HEADERS_END[matched] {
                matched + 1
            } else {
                usize::from(b == HEADERS_END[0])
            };
            if matched == HEADERS_END.len() {
                return Watch::Busy;
            }
        }
        Watch::Headers { matched }
    }
}

/// What the edge makes of a connection whose first bytes come in `chunks`, as its read watch
/// names it (`Start { seen: 3 }`, `Headers { matched: 2 }`, `Busy`, `H2`): the same however
/// the bytes are cut (the fuzz target `edge_sniff` holds it to that, and to HTTP/2 exactly
/// when they begin with the preface).
pub fn sniffed(chunks: &[&[u8]]) -> String {
    let watch = chunks
        .iter()
        .fold(Watch::Start { seen: 0 }, |watch, chunk| watch.read(chunk));
    format!("{watch:?}")
}

impl Conn {
    fn new(io: Box<dyn Io>, place: OwnedSemaphorePermit, timeouts: Timeouts) -> Conn {
        Conn {
            io,
            _place: place,
            watch: Watch::Start { seen: 0 },
            timeouts,
            deadline: Box::pin(tokio::time::sleep(timeouts.header)),
        }
    }

    fn rearm(&mut self, after: Duration) {
        self.deadline.as_mut().reset(tokio::time::Instant::now() + after);
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut *this.io).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) => {
                let was = this.watch;
                this.watch = was.read(&buf.filled()[before..]);
                if was == Watch::Idle && this.watch != Watch::Idle {
                    this.rearm(this.timeouts.header);
                }
            }
            Poll::Pending if this.watch.waits_for_client() && this.deadline.as_mut().poll(cx).is_ready() => {
                let what = if this.watch == Watch::Idle {
                    "idle past the idle timeout"
                } else {
                    "no whole request within the header timeout"
                };
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)));
            }
            _ => {}
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut *self.io).poll_write(cx, buf);
        // A response going out ends an HTTP/1.1 request: the connection idles until the next.
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) && matches!(self.watch, Watch::Busy | Watch::Idle) {
            self.watch = Watch::Idle;
            let idle = self.timeouts.idle;
            self.rearm(idle);
            // Wake the connection at the deadline even if nothing polls its reads before then.
            let _ = self.deadline.as_mut().poll(cx);
        }
        written
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl Edge {
    fn timeouts(&self) -> Timeouts {
        Timeouts {
            header: self.header_timeout,
            idle: self.idle_timeout,
        }
    }

    /// Accepts connections on `listener` until `stop` says so, each once it has a place
    /// under the cap and, with TLS, a finished handshake, and hands them to `each`.
    async fn accept(
        &self,
        listener: Listener,
        mut stop: watch::Receiver<bool>,
        each: impl Fn(Conn, String) + Clone + Send + 'static,
    ) {
        let places = Arc::new(Semaphore::new(self.max_connections));
        loop {
            let place = tokio::select! {
                place = places.clone().acquire_owned() => match place {
                    Ok(place) => place,
                    Err(_) => return,
                },
                () = until_stopped(&mut stop) => return,
            };
            let (io, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: wait a little rather than spin.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = until_stopped(&mut stop) => return,
            };
            match &self.tls {
                None => each(Conn::new(io, place, self.timeouts()), peer),
                Some(tls) => {
                    // The handshake in a task of its own: a slow client holds its place, not the loop.
                    let (tls, timeouts, each) = (tls.clone(), self.timeouts(), each.clone());
                    tokio::spawn(async move {
                        if let Some(io) = handshake(&tls, io, timeouts.header).await {
                            each(Conn::new(io, place, timeouts), peer);
                        }
                    });
                }
            }
        }
    }

    /// Serves `router` over HTTP/1.1 and HTTP/2 on `listener` until `shutdown` completes;
    /// connections then finish the requests they are on (a few seconds at most).
    pub async fn serve_http(&self, listener: impl Into<Listener>, router: Router, shutdown: impl Future<Output = ()>) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            // The connection keeps the time itself (Conn): hyper's would also end idle ones.
            .header_read_timeout(None);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(self.header_timeout))
            .keep_alive_timeout(self.header_timeout);
        let (stop_tx, stop) = watch::channel(false);
        // One clone per connection being served: the count tells when they are all done.
        let serving = Arc::new(());
        let serve_one = {
            let (stop, serving) = (stop.clone(), serving.clone());
            let peers = self.peer_addresses;
            move |conn: Conn, peer: String| {
                let (builder, mut stop) = (builder.clone(), stop.clone());
                let router = if peers {
                    router.clone().layer(axum::Extension(Peer(peer)))
                } else {
                    router.clone()
                };
                let serving = serving.clone();
                tokio::spawn(async move {
                    let served = builder.serve_connection(TokioIo::new(conn), TowerToHyperService::new(router));
                    tokio::pin!(served);
                    tokio::select! {
                        result = served.as_mut() => {
                            if let Err(e) = result {
                                tracing::debug!(error = %e, "connection ended");
                            }
                        }
                        () = until_stopped(&mut stop) => {
                            served.as_mut().graceful_shutdown();
                            let _ = served.await;
                        }
                    }
                    drop(serving);
                });
            }
        };
        let accepting = self.accept(listener.into(), stop, serve_one);
        tokio::pin!(accepting);
        tokio::select! {
            () = &mut accepting => {},
            () = shutdown => {},
        }
        let _ = stop_tx.send(true);
        let drained = async {
            while Arc::strong_count(&serving) > 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(GRACE, drained).await.is_err() {
            tracing::info!(grace = ?GRACE, "connections still open; closing them");
        }
    }

    /// The connections of `listener` for a server that takes a stream of them (tonic),
    /// until `stop` says so.
    pub fn incoming(
        self,
        listener: impl Into<Listener>,
        stop: watch::Receiver<bool>,
    ) -> impl futures_util::Stream<Item = io::Result<Conn>> {
        let listener = listener.into();
        let (tx, rx) = mpsc::channel::<io::Result<Conn>>(64);
        tokio::spawn(async move {
            self.accept(listener, stop, move |conn, _| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(Ok(conn)).await;
                });
            })
            .await;
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// How long a stopping listener waits for its connections' requests in flight.
const GRACE: Duration = Duration::from_secs(2);

async fn handshake(tls: &TlsAcceptor, io: Box<dyn Io>, timeout: Duration) -> Option<Box<dyn Io>> {
    match tokio::time::timeout(timeout, tls.accept(io)).await {
        Ok(Ok(stream)) => Some(Box::new(stream)),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

/// Resolves once `stop` says stop; never, once its sender is gone without saying it.
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{sniffed, H2_PREFACE};

    #[test]
    fn a_request_whose_headers_end_in_the_sniffed_bytes_is_seen_however_they_are_read() {
        // 18 bytes of HTTP/1.0 request, then the next one's start: its headers end inside the
        // 24 bytes sniffed for the HTTP/2 preface. Read in two, the end was in the first read
        // and looked for in the second only: the connection waited for headers that had come
        // (and a slow answer met the header timeout).
        let bytes = b"GET / HTTP/1.0\r\n\r\nGET /x";
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(sniffed(&[a, b]), "Busy", "read as {a:?} then {b:?}");
        }
        assert_eq!(
            sniffed(&[b"GET / HTTP/1.0\r\n\r\n"]),
            "Busy",
            "shorter than the preface"
        );
        assert_eq!(sniffed(&[b"GET / HT"]), "Headers { matched: 0 }");
        assert_eq!(sniffed(&[&H2_PREFACE[..10], &H2_PREFACE[10..]]), "H2");
        assert_eq!(sniffed(&[&H2_PREFACE[..20]]), "Start { seen: 20 }");
    }
}
