//! What a node listens on: `HOST:PORT`, or `unix:PATH` for a Unix domain socket — the
//! cheaper way for a proxy on the same machine to call the node (ngx_wasm_module opens a
//! connection for every call it dispatches and takes `unix:` addresses; a Unix socket spares
//! each one the TCP handshake and a port in TIME_WAIT). Who may connect to a socket is
//! whoever the file's permissions let in.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::str::FromStr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

/// A listener's address, as `--listen` and the other `--*-listen` flags take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `HOST:PORT`.
    Tcp(SocketAddr),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<ListenAddr, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs the socket's path, e.g. unix:/run/sluice/check.sock".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("{s:?} is not HOST:PORT (an IP address and a port, e.g. 127.0.0.1:8081) or unix:PATH"))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// What a connection is read and written through: a TCP or Unix stream, or TLS over one.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A bound listener.
pub enum Listener {
    /// On a TCP port.
    Tcp(TcpListener),
    /// On a Unix domain socket.
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Listener {
        Listener::Tcp(listener)
    }
}

impl Listener {
    /// Binds `addr`. A Unix socket file left by an earlier node is replaced; any other file
    /// at the path is an error, never removed.
    pub async fn bind(addr: &ListenAddr) -> io::Result<Listener> {
        match addr {
            ListenAddr::Tcp(addr) => TcpListener::bind(addr).await.map(Listener::Tcp),
            ListenAddr::Unix(path) => {
                match std::fs::symlink_metadata(path) {
                    Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            "the path exists and is not a socket",
                        ))
                    }
                    Err(_) => {}
                }
                UnixListener::bind(path).map(Listener::Unix)
            }
        }
    }

    /// The next connection and its peer's address, with `TCP_NODELAY` on a TCP one (a check
    /// is one small write each way: Nagle's algorithm would hold it for the peer's delayed
    /// ACK).
    pub(crate) async fn accept(&self) -> io::Result<(Box<dyn Io>, String)> {
        match self {
            Listener::Tcp(listener) => {
                let (tcp, peer) = listener.accept().await?;
                let _ = tcp.set_nodelay(true);
                Ok((Box::new(tcp), peer.to_string()))
            }
            Listener::Unix(listener) => Ok((Box::new(listener.accept().await?.0), "unix socket".to_owned())),
        }
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        match self {
            Listener::Tcp(listener) => listener.local_addr().map(ListenAddr::Tcp),
            Listener::Unix(listener) => {
                let addr = listener.local_addr()?;
                let path = addr.as_pathname().map(PathBuf::from).unwrap_or_default();
                Ok(ListenAddr::Unix(path))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ListenAddr;

    #[test]
    fn addresses_parse_and_say_what_is_wrong() {
        assert_eq!(
            "127.0.0.1:8081".parse(),
            Ok(ListenAddr::Tcp(([127, 0, 0, 1], 8081).into()))
        );
        assert_eq!("unix:/run/s.sock".parse(), Ok(ListenAddr::Unix("/run/s.sock".into())));
        assert_eq!(ListenAddr::Unix("/run/s.sock".into()).to_string(), "unix:/run/s.sock");
        let e = "localhost:8081".parse::<ListenAddr>().unwrap_err();
        assert!(e.contains("is not HOST:PORT") && e.contains("unix:PATH"), "{e}");
        assert!("unix:"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("needs the socket's path"));
    }
}
