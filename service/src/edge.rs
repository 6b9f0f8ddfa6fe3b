//! Where the network meets the node: every listener (data, admin, gRPC) accepts through
//! here. TLS, with client certificates when asked for (rustls); a cap on the connections
//! open at once (past it, new ones wait in the kernel's backlog); and a header-read timeout
//! that also ends a keep-alive connection left idle (hyper starts it whenever a connection
//! waits for a request), so a client that sends half a request cannot hold a connection.

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
    /// Longest a client may take to send a request's headers, and longest a keep-alive
    /// connection may sit idle (and the TLS handshake may take).
    pub header_timeout: Duration,
}

impl Default for Edge {
    fn default() -> Self {
        Edge {
            tls: None,
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
        }
    }
}

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
/// the listener's cap until it closes.
///
/// Until its first 24 bytes have come, a read that waits past the header
/// timeout fails: hyper's own timeout starts only once the server has told HTTP/1.1 from
/// HTTP/2 by those bytes, so without this a client that sends nothing (or half an HTTP/2
/// preface) would hold its place for ever. Every HTTP/1.1 request (it has a `Host` line) and
/// the HTTP/2 preface are that long.
pub struct Conn {
    io: Box<dyn Io>,
    _place: OwnedSemaphorePermit,
    /// Bytes read so far and the deadline, until 24 have come.
    first_bytes: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
}

/// The bytes that tell HTTP/1.1 from HTTP/2: the HTTP/2 preface's length.
const SNIFFED_BYTES: usize = 24;

impl Conn {
    fn new(io: Box<dyn Io>, place: OwnedSemaphorePermit, timeout: Duration) -> Conn {
        Conn {
            io,
            _place: place,
            first_bytes: Some((0, Box::pin(tokio::time::sleep(timeout)))),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut *this.io).poll_read(cx, buf);
        if let Some((seen, deadline)) = &mut this.first_bytes {
            match &read {
                Poll::Ready(Ok(())) => {
                    *seen += buf.filled().len() - before;
                    if *seen >= SNIFFED_BYTES {
                        this.first_bytes = None;
                    }
                }
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request within the header timeout",
                    )));
                }
                _ => {}
            }
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.io).poll_write(cx, buf)
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
    /// Accepts connections on `listener` until `stop` says so, each once it has a place
    /// under the cap and, with TLS, a finished handshake, and hands them to `each`.
    async fn accept(
        &self,
        listener: Listener,
        mut stop: watch::Receiver<bool>,
        each: impl Fn(Conn) + Clone + Send + 'static,
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
            let io = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(io) => io,
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
                None => each(Conn::new(io, place, self.header_timeout)),
                Some(tls) => {
                    // The handshake in a task of its own: a slow client holds its place, not the loop.
                    let (tls, timeout, each) = (tls.clone(), self.header_timeout, each.clone());
                    tokio::spawn(async move {
                        if let Some(io) = handshake(&tls, io, timeout).await {
                            each(Conn::new(io, place, timeout));
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
            .header_read_timeout(self.header_timeout);
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
            move |conn: Conn| {
                let (builder, router, mut stop) = (builder.clone(), router.clone(), stop.clone());
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
            self.accept(listener, stop, move |conn| {
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
