//! Byte tunnels from an API instance to a port inside a sandbox on a node.
//!
//! The API opens a TCP connection to the node's listener and asks, in HTTP/1.1,
//! `POST /internal/v1/tunnel/<sandbox>/<port>` with `Upgrade: berth-tunnel` and the node
//! token. The node connects to the port inside the sandbox first (`Runtime::connect`)
//! and only then answers `101 Switching Protocols`; from there the connection carries
//! the sandbox port's bytes both ways. So a tunnel is a plain [`TcpStream`] to its
//! caller, and the sandbox proxy forwards through it exactly as through a local
//! connection. Failures are answered before the upgrade, by status: 404 the sandbox is
//! not on this node (or gone), 502 nothing listens on that port, 401 a bad token.

use std::io;
use std::str::FromStr;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Empty;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::token::{NodeToken, NODE_TOKEN_HEADER};

/// The `Upgrade` protocol name of a tunnel.
pub const UPGRADE_PROTOCOL: &str = "berth-tunnel";
/// The node's route (axum syntax).
pub const ROUTE: &str = "/internal/v1/tunnel/{sandbox}/{port}";
/// A response head longer than this is not a node's.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Where a node listens: the host and port of its `--advertise-url` (`http://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddr {
    pub host: String,
    pub port: u16,
}

#[derive(Debug, thiserror::Error)]
#[error("node URL {url:?}: {reason} (expected http://HOST:PORT)")]
pub struct NodeAddrError {
    url: String,
    reason: &'static str,
}

impl FromStr for NodeAddr {
    type Err = NodeAddrError;

    fn from_str(url: &str) -> Result<NodeAddr, NodeAddrError> {
        let error = |reason| NodeAddrError {
            url: url.to_owned(),
            reason,
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| error("only http:// is spoken between API and node"))?;
        let authority = rest.trim_end_matches('/');
        if authority.contains('/') || authority.contains('@') {
            return Err(error("it must name only a host and a port"));
        }
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| error("the port is missing"))?;
        let port = port
            .parse()
            .map_err(|_| error("the port is not a number"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(error("the host is missing"));
        }
        Ok(NodeAddr {
            host: host.to_owned(),
            port,
        })
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "http://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "http://{}:{}", self.host, self.port)
        }
    }
}

/// Why a tunnel could not be opened. [`TunnelError::into_io`] gives the error kinds the
/// sandbox proxy's `PortConnector` contract asks for.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("connecting to node {node}: {source}")]
    Connect {
        node: String,
        #[source]
        source: io::Error,
    },
    #[error("node {node} has no sandbox {sandbox}")]
    NotFound { node: String, sandbox: String },
    #[error("nothing listens on port {port} in sandbox {sandbox}")]
    Refused { sandbox: String, port: u16 },
    #[error("node {node} refused the node token (are API and node configured with the same token file?)")]
    Unauthorized { node: String },
    #[error("node {node} answered the tunnel with {status}")]
    Status { node: String, status: u16 },
    #[error("node {node} sent a malformed tunnel answer")]
    Malformed { node: String },
}

impl TunnelError {
    /// As the proxy's connectors report: `NotFound` for a gone sandbox,
    /// `ConnectionRefused` for a closed port, anything else is internal.
    pub fn into_io(self) -> io::Error {
        let kind = match &self {
            TunnelError::NotFound { .. } => io::ErrorKind::NotFound,
            TunnelError::Refused { .. } => io::ErrorKind::ConnectionRefused,
            TunnelError::Connect { source, .. } => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }
}

/// Opens a tunnel to `port` inside `sandbox` on `node`.
pub async fn open(
    node: &NodeAddr,
    token: &NodeToken,
    sandbox: &str,
    port: u16,
) -> Result<TcpStream, TunnelError> {
    let node_name = node.to_string();
    let connect_error = |source| TunnelError::Connect {
        node: node_name.clone(),
        source,
    };
    let mut stream = TcpStream::connect((node.host.as_str(), node.port))
        .await
        .map_err(connect_error)?;
    // Small writes both ways (a request head, then whatever the sandbox port speaks)
    // must not wait for delayed ACKs.
    stream.set_nodelay(true).map_err(connect_error)?;
    let token_value = token.header_value();
    let head = format!(
        "POST /internal/v1/tunnel/{sandbox}/{port} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: {UPGRADE_PROTOCOL}\r\nContent-Length: 0\r\n{NODE_TOKEN_HEADER}: ",
        host = node.host,
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(token_value.as_bytes());
    request.extend_from_slice(b"\r\n\r\n");
    stream.write_all(&request).await.map_err(connect_error)?;
    let status = read_status(&mut stream, &node_name).await?;
    match status {
        101 => Ok(stream),
        404 => Err(TunnelError::NotFound {
            node: node_name,
            sandbox: sandbox.to_owned(),
        }),
        502 => Err(TunnelError::Refused {
            sandbox: sandbox.to_owned(),
            port,
        }),
        401 => Err(TunnelError::Unauthorized { node: node_name }),
        status => Err(TunnelError::Status {
            node: node_name,
            status,
        }),
    }
}

/// Reads the response head (and nothing after it: past a 101 the bytes are the
/// sandbox's) and returns its status code.
async fn read_status(stream: &mut TcpStream, node: &str) -> Result<u16, TunnelError> {
    let malformed = || TunnelError::Malformed {
        node: node.to_owned(),
    };
    let io_error = |source| TunnelError::Connect {
        node: node.to_owned(),
        source,
    };
    let mut buf = vec![0u8; MAX_HEAD_BYTES];
    let head_len = loop {
        let seen = stream.peek(&mut buf).await.map_err(io_error)?;
        if seen == 0 {
            return Err(malformed());
        }
        if let Some(end) = buf[..seen].windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if seen == buf.len() {
            return Err(malformed());
        }
        stream.readable().await.map_err(io_error)?;
    };
    let mut head = vec![0u8; head_len];
    tokio::io::AsyncReadExt::read_exact(stream, &mut head)
        .await
        .map_err(io_error)?;
    let line = head.split(|b| *b == b'\n').next().ok_or_else(malformed)?;
    let line = std::str::from_utf8(line).map_err(|_| malformed())?;
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/1.") => {
            code.parse().map_err(|_| malformed())
        }
        _ => Err(malformed()),
    }
}

/// The node's side: answers a tunnel request once `connect` reached the sandbox port,
/// then splices the upgraded connection to it until either side closes or `closed`
/// resolves (the sandbox paused or died: its connections, the API's pooled ones through
/// this tunnel included, must end then, not linger half-open). `connect`'s error kinds
/// decide the answer: `NotFound` 404, `ConnectionRefused` 502, anything else 500. The
/// caller checks the node token first.
pub async fn serve<B>(
    mut request: http::Request<B>,
    connect: impl std::future::Future<Output = io::Result<TcpStream>>,
    closed: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response<Empty<Bytes>> {
    let upgrade_asked = request.headers().get(header::UPGRADE).is_some_and(|value| {
        value
            .as_bytes()
            .eq_ignore_ascii_case(UPGRADE_PROTOCOL.as_bytes())
    });
    if !upgrade_asked {
        return status(StatusCode::BAD_REQUEST);
    }
    let mut sandbox = match connect.await {
        Ok(stream) => stream,
        Err(error) => {
            let code = match error.kind() {
                io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
                io::ErrorKind::ConnectionRefused => StatusCode::BAD_GATEWAY,
                _ => {
                    tracing::warn!(%error, "tunnel: connecting to the sandbox port");
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            };
            return status(code);
        }
    };
    if let Err(error) = sandbox.set_nodelay(true) {
        tracing::debug!(%error, "tunnel: TCP_NODELAY on the sandbox side");
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let mut api = hyper_util::rt::TokioIo::new(upgraded);
                // Either side closing ends the tunnel; nothing to report.
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut api, &mut sandbox) => {}
                    () = closed => {}
                }
            }
            Err(error) => tracing::debug!(%error, "tunnel: the upgrade did not complete"),
        }
    });
    let mut response = status(StatusCode::SWITCHING_PROTOCOLS);
    let headers = response.headers_mut();
    headers.insert(
        header::CONNECTION,
        http::HeaderValue::from_static("upgrade"),
    );
    headers.insert(
        header::UPGRADE,
        http::HeaderValue::from_static(UPGRADE_PROTOCOL),
    );
    response
}

fn status(code: StatusCode) -> Response<Empty<Bytes>> {
    let mut response = Response::new(Empty::new());
    *response.status_mut() = code;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn node_urls_are_host_and_port() {
        let addr: NodeAddr = "http://10.0.0.7:3100/".parse().unwrap();
        assert_eq!(
            addr,
            NodeAddr {
                host: "10.0.0.7".into(),
                port: 3100
            }
        );
        assert_eq!(addr.to_string(), "http://10.0.0.7:3100");
        let v6: NodeAddr = "http://[fd00::1]:3100".parse().unwrap();
        assert_eq!(v6.host, "fd00::1");
        assert_eq!(v6.to_string(), "http://[fd00::1]:3100");
        for bad in [
            "https://a:1",
            "http://a",
            "http://a:x",
            "http://a:1/path",
            "http://:1",
            "http://u@a:1",
        ] {
            assert!(bad.parse::<NodeAddr>().is_err(), "{bad}");
        }
    }

    /// A node serving tunnels to sandbox `s1` (an echo server on loopback), knowing no
    /// other sandbox, and `closed` (a port nothing listens on); `closing` ends its
    /// tunnels.
    async fn node(token: NodeToken, closing: tokio_util::sync::CancellationToken) -> NodeAddr {
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let app = axum::Router::new().route(
            ROUTE,
            axum::routing::post(
                move |axum::extract::Path((sandbox, port)): axum::extract::Path<(String, u16)>,
                      request: axum::extract::Request| {
                    let token = token.clone();
                    let closing = closing.clone();
                    async move {
                        if !token.admits(request.headers()) {
                            return status(StatusCode::UNAUTHORIZED);
                        }
                        let connect = async move {
                            match (sandbox.as_str(), port) {
                                ("s1", 1) => TcpStream::connect(("127.0.0.1", echo_port)).await,
                                ("s1", _) => TcpStream::connect(("127.0.0.1", closed_port)).await,
                                _ => {
                                    Err(io::Error::new(io::ErrorKind::NotFound, "no such sandbox"))
                                }
                            }
                        };
                        serve(request, connect, closing.clone().cancelled_owned()).await
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        NodeAddr {
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[tokio::test]
    async fn a_tunnel_carries_bytes_both_ways_and_failures_come_back_typed() {
        let good = NodeToken::repeated('g');
        let closing = tokio_util::sync::CancellationToken::new();
        let node = node(good.clone(), closing.clone()).await;

        let mut tunnel = open(&node, &good, "s1", 1).await.unwrap();
        // Bytes written right after the head reach the sandbox, and its answer is ours.
        tunnel.write_all(b"hello through the tunnel").await.unwrap();
        let mut echoed = [0u8; 24];
        tunnel.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"hello through the tunnel");
        // The sandbox pausing ends the tunnel: the API's side reads its end.
        closing.cancel();
        let mut rest = Vec::new();
        assert_eq!(tunnel.read_to_end(&mut rest).await.unwrap(), 0);

        let gone = open(&node, &good, "s2", 1).await.unwrap_err();
        assert!(matches!(gone, TunnelError::NotFound { .. }), "{gone}");
        assert_eq!(gone.into_io().kind(), io::ErrorKind::NotFound);
        let refused = open(&node, &good, "s1", 2).await.unwrap_err();
        assert!(
            matches!(refused, TunnelError::Refused { port: 2, .. }),
            "{refused}"
        );
        assert_eq!(refused.into_io().kind(), io::ErrorKind::ConnectionRefused);
        let stranger = open(&node, &NodeToken::repeated('x'), "s1", 1)
            .await
            .unwrap_err();
        assert!(
            matches!(stranger, TunnelError::Unauthorized { .. }),
            "{stranger}"
        );
    }
}
