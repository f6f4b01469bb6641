//! The seam between the proxy and the control plane: who the sandbox is and how to
//! reach its ports.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::target::SandboxId;

/// A boxed future, so the traits below stay object safe (`Arc<dyn …>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Implemented by the control plane: looks a sandbox up for the proxy.
pub trait SandboxResolver: Send + Sync + 'static {
    /// The route to a running sandbox. A sandbox that does not exist, is not the
    /// caller's to reach, or is not running must be [`ResolveError::NotFound`].
    fn resolve<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> BoxFuture<'a, Result<Route, ResolveError>>;

    /// Every sandbox a signed file URL may be for: the running (and auto-resumable)
    /// sandboxes created with `secure`, each with its envd access token. The proxy
    /// finds the one whose token signed a URL that names no sandbox.
    fn file_signers(&self) -> BoxFuture<'_, Result<Vec<(SandboxId, String)>, ResolveError>>;

    /// Whether the sandbox is gone for good (killed, being killed, or unknown), asked
    /// after a request into it failed. Must not change the sandbox: a paused one is not
    /// gone, and asking never wakes it.
    fn is_gone<'a>(&'a self, sandbox_id: &'a SandboxId) -> BoxFuture<'a, bool>;
}

/// Opens TCP connections to ports inside one sandbox's network.
pub trait PortConnector: Send + Sync + 'static {
    /// A connection to `port` in the sandbox. Errors are reported by kind:
    /// `ConnectionRefused` means the sandbox runs but nothing listens on the port;
    /// `NotFound` means the sandbox is gone; anything else is an internal failure.
    fn connect(&self, port: u16) -> BoxFuture<'_, io::Result<TcpStream>>;
}

/// What the proxy needs to forward one request to a sandbox.
#[derive(Clone)]
pub struct Route {
    pub connector: Arc<dyn PortConnector>,
    /// Set for sandboxes created with `secure`: envd requests must carry it in
    /// `X-Access-Token`.
    pub envd_access_token: Option<String>,
    /// Required in `e2b-traffic-access-token` on user ports when
    /// `allow_public_traffic` is false.
    pub traffic_access_token: Option<String>,
    pub allow_public_traffic: bool,
    /// E2B's `maskRequestHost`: the `Host` user ports see instead of the client's,
    /// `${PORT}` replaced by the port (envd requests keep theirs).
    pub mask_request_host: Option<String>,
}

/// Why a sandbox could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Unknown, killed, paused, or belonging to nobody the proxy may serve: the SDKs
    /// treat the resulting 502 as "not running".
    #[error("the sandbox was not found")]
    NotFound,
    /// The lookup itself failed (e.g. the state store is unavailable).
    #[error("sandbox lookup failed: {0}")]
    Lookup(String),
}

/// Runs a blocking connect (such as the runtime's `Runtime::connect`, which enters the
/// sandbox's network namespace) on the blocking pool and hands back a tokio stream.
pub async fn connect_blocking<F>(connect: F) -> io::Result<TcpStream>
where
    F: FnOnce() -> io::Result<std::net::TcpStream> + Send + 'static,
{
    let stream = tokio::task::spawn_blocking(connect)
        .await
        .map_err(|join_error| io::Error::other(format!("connect task failed: {join_error}")))??;
    stream.set_nonblocking(true)?;
    TcpStream::from_std(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connect_blocking_yields_a_usable_tokio_stream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.write_all(b"pong").await.unwrap();
        });
        let mut stream = connect_blocking(move || std::net::TcpStream::connect(address))
            .await
            .unwrap();
        let mut reply = [0u8; 4];
        stream.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"pong");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn connect_blocking_passes_errors_through_by_kind() {
        let error = connect_blocking(|| Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused);
    }
}
