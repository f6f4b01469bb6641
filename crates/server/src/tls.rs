//! TLS on the one listener, beside plain HTTP: the first byte of every connection says
//! which it is (0x16 opens a TLS handshake; no HTTP request starts with it). A TLS
//! client gets a leaf issued by the installation's serving CA for exactly the name it
//! asked for (SNI), if that name is the sandbox domain's host, a name under it, or
//! `localhost` or a name under it; one that sends no SNI (an address in the URL) gets a
//! leaf for the address it connected to. Behind the handshake it is the same router:
//! API, proxy, dashboard and `/mcp` over TLS exactly as over plain HTTP (ALPN offers
//! `http/1.1` only, as the proxy's upgrades expect).
//!
//! Sniffing and handshakes run in a task per connection, so a slow client holds up no
//! other; a connection that sends nothing for [`FIRST_BYTE_LIMIT`] is closed.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use berth_ca::CertificateAuthority;
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The byte a TLS handshake record starts with.
const TLS_HANDSHAKE: u8 = 0x16;
/// How long a new connection may stay silent before it is closed.
pub const FIRST_BYTE_LIMIT: Duration = Duration::from_secs(60);
/// How long a TLS handshake may take.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(30);
/// Accepted connections waiting for the server to take them.
const BACKLOG: usize = 128;

/// Which names get a certificate, and the leaves.
#[derive(Debug)]
struct NameResolver {
    ca: Arc<CertificateAuthority>,
    /// The sandbox domain's host (no port), lower case.
    domain_host: Option<String>,
}

impl NameResolver {
    /// The leaf for `name` (an SNI name), if it is one berth serves.
    fn served(&self, name: &str) -> Option<String> {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let under = |host: &str| name == host || name.ends_with(&format!(".{host}"));
        let allowed = under("localhost") || self.domain_host.as_deref().is_some_and(under);
        allowed.then_some(name)
    }

    fn leaf(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.ca
            .leaf(name)
            .inspect_err(|e| tracing::warn!(%name, error = %e, "cannot issue a TLS certificate"))
            .ok()
    }
}

/// rustls' view of one connection: the SNI name's leaf, else the local address's.
#[derive(Debug)]
struct ConnectionResolver {
    names: Arc<NameResolver>,
    local: SocketAddr,
}

impl rustls::server::ResolvesServerCert for ConnectionResolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match hello.server_name() {
            Some(sni) => {
                let name = self.names.served(sni);
                if name.is_none() {
                    tracing::debug!(%sni, "TLS for a name berth does not serve");
                }
                self.names.leaf(&name?)
            }
            None => self.names.leaf(&self.local.ip().to_string()),
        }
    }
}

/// The serving side of TLS: the CA and the names it issues leaves for.
#[derive(Debug, Clone)]
pub struct ServingTls {
    names: Arc<NameResolver>,
}

impl ServingTls {
    /// Leaves from `ca` for `domain`'s host (a `host:port` domain's port is dropped) and
    /// names under it, and for `localhost` and names under it.
    pub fn new(ca: Arc<CertificateAuthority>, domain: Option<&str>) -> ServingTls {
        let domain_host = domain.map(|d| {
            let host = d.rsplit_once(':').map_or(d, |(host, port)| {
                if port.chars().all(|c| c.is_ascii_digit()) {
                    host
                } else {
                    d
                }
            });
            host.trim_end_matches('.').to_ascii_lowercase()
        });
        ServingTls {
            names: Arc::new(NameResolver { ca, domain_host }),
        }
    }

    fn acceptor(&self, local: SocketAddr) -> tokio_rustls::TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(ConnectionResolver {
                names: self.names.clone(),
                local,
            }));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

/// One accepted connection, plain or TLS.
pub enum Connection {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Connection::Plain(stream) => stream.is_write_vectored(),
            Connection::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A listener whose connections may be plain HTTP or TLS.
pub struct SniffingListener {
    connections: tokio::sync::mpsc::Receiver<(Connection, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for SniffingListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl SniffingListener {
    pub fn new(listener: TcpListener, tls: ServingTls) -> io::Result<SniffingListener> {
        let local = listener.local_addr()?;
        let (sender, connections) = tokio::sync::mpsc::channel(BACKLOG);
        let accepting = tokio::spawn(accept_loop(listener, tls, sender));
        Ok(SniffingListener {
            connections,
            local,
            accepting,
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: ServingTls,
    sender: tokio::sync::mpsc::Sender<(Connection, SocketAddr)>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!(%err, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Without TCP_NODELAY a small write after another (a handshake's records, a
        // response head then its body) waits for the client's delayed ACK: ~40 ms.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::warn!(%err, "setting TCP_NODELAY on an accepted connection");
        }
        let sender = sender.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            if let Some(connection) = classify(stream, &tls).await {
                let _ = sender.send((connection, peer)).await;
            }
        });
    }
}

/// Plain or TLS (handshake done), by the first byte; None when the connection closed,
/// stayed silent or failed its handshake.
async fn classify(stream: TcpStream, tls: &ServingTls) -> Option<Connection> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTE_LIMIT, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return None,
    }
    if first[0] != TLS_HANDSHAKE {
        return Some(Connection::Plain(stream));
    }
    let local = stream.local_addr().ok()?;
    match tokio::time::timeout(HANDSHAKE_LIMIT, tls.acceptor(local).accept(stream)).await {
        Ok(Ok(stream)) => Some(Connection::Tls(Box::new(stream))),
        Ok(Err(err)) => {
            tracing::debug!(%err, "TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

impl axum::serve::Listener for SniffingListener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        match self.connections.recv().await {
            Some(accepted) => accepted,
            // The accept loop never ends on its own.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(domain: Option<&str>) -> Arc<NameResolver> {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::load_or_create(dir.path(), "test").unwrap();
        ServingTls::new(Arc::new(ca), domain).names
    }

    #[test]
    fn leaves_only_for_the_domain_and_localhost() {
        let names = resolver(Some("sandboxes.example.com:8443"));
        assert_eq!(
            names.served("50005-abc.sandboxes.example.com."),
            Some("50005-abc.sandboxes.example.com".into())
        );
        assert_eq!(
            names.served("Sandboxes.Example.com"),
            Some("sandboxes.example.com".into())
        );
        assert_eq!(
            names.served("50005-abc.localhost"),
            Some("50005-abc.localhost".into())
        );
        assert_eq!(names.served("example.com"), None);
        assert_eq!(names.served("evilsandboxes.example.com"), None);
        assert_eq!(names.served("bank.test"), None);
        assert!(names.leaf("50005-abc.localhost").is_some());
        assert!(names.leaf("127.0.0.1").is_some(), "addresses get IP SANs");
        let default = resolver(None);
        assert_eq!(default.served("localhost"), Some("localhost".into()));
        assert_eq!(default.served("example.com"), None);
    }
}
