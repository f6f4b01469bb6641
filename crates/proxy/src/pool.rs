//! Idle HTTP/1.1 connections to sandbox ports, kept for reuse so that a stream of small
//! requests (the SDKs' RPCs) does not pay a connect into the sandbox each time.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;

use crate::forward::ProxyBody;
use crate::target::SandboxId;

/// Idle connections kept per sandbox port; more concurrent requests open more
/// connections, and those beyond this are closed when they become idle.
const MAX_IDLE_PER_PORT: usize = 32;

pub(crate) type Sender = SendRequest<ProxyBody>;
type PoolKey = (SandboxId, u16);

#[derive(Clone, Default)]
pub(crate) struct ConnectionPool {
    idle: Arc<Mutex<HashMap<PoolKey, Vec<Sender>>>>,
}

impl ConnectionPool {
    /// An idle connection to `port` of the sandbox that has not been closed yet.
    pub(crate) fn take(&self, sandbox_id: &SandboxId, port: u16) -> Option<Sender> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (sandbox_id.clone(), port);
        let senders = idle.get_mut(&key)?;
        let mut found = None;
        while let Some(sender) = senders.pop() {
            if !sender.is_closed() {
                found = Some(sender);
                break;
            }
        }
        if senders.is_empty() {
            idle.remove(&key);
        }
        found
    }

    /// Keeps `sender` for reuse once its last response has been read to the end.
    pub(crate) fn put(&self, sandbox_id: &SandboxId, port: u16, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let senders = idle.entry((sandbox_id.clone(), port)).or_default();
        senders.retain(|kept| !kept.is_closed());
        if senders.len() < MAX_IDLE_PER_PORT {
            senders.push(sender);
        }
    }

    /// Drops every idle connection of a sandbox that is gone.
    pub(crate) fn forget(&self, sandbox_id: &SandboxId) {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        idle.retain(|(id, _), _| id != sandbox_id);
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        idle.values().map(Vec::len).sum()
    }
}

/// The response body of a pooled connection: streams the sandbox's body through and
/// hands the connection back to the pool when the body has been read to its end. A
/// body dropped early takes the connection with it (hyper then closes it).
pub(crate) struct PooledBody {
    inner: Incoming,
    release: Option<Release>,
}

struct Release {
    pool: ConnectionPool,
    sandbox_id: SandboxId,
    port: u16,
    sender: Sender,
}

impl PooledBody {
    pub(crate) fn new(
        inner: Incoming,
        pool: ConnectionPool,
        sandbox_id: SandboxId,
        port: u16,
        sender: Sender,
    ) -> Self {
        let release = Release {
            pool,
            sandbox_id,
            port,
            sender,
        };
        if inner.is_end_stream() {
            // Nothing will ever be polled from an empty body: the connection is free now.
            release
                .pool
                .put(&release.sandbox_id, release.port, release.sender);
            return Self {
                inner,
                release: None,
            };
        }
        Self {
            inner,
            release: Some(release),
        }
    }
}

impl PooledBody {
    fn release_connection(&mut self) {
        if let Some(release) = self.release.take() {
            release
                .pool
                .put(&release.sandbox_id, release.port, release.sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            // Servers stop polling once `is_end_stream` says a sized body is complete,
            // so the end is detected after the last frame as well as on `None`.
            Poll::Ready(None) => self.release_connection(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.release_connection(),
            Poll::Ready(Some(Err(_))) => self.release = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;

    async fn sender_to(address: std::net::SocketAddr) -> Sender {
        let stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        sender
    }

    /// Waits (bounded, not timed) until `condition` holds, letting connection tasks run.
    async fn eventually(mut condition: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if condition() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("condition never held");
    }

    #[tokio::test]
    async fn closed_connections_are_never_handed_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepting = tokio::spawn(async move {
            let mut sockets = Vec::new();
            for _ in 0..3 {
                sockets.push(listener.accept().await.unwrap().0);
            }
            sockets
        });
        let pool = ConnectionPool::default();
        let id = SandboxId::parse("iabc").unwrap();
        let stale = sender_to(address).await;
        let first = sender_to(address).await;
        let second = sender_to(address).await;
        pool.put(&id, 80, first);
        pool.put(&id, 80, second);
        assert_eq!(pool.idle_count(), 2);

        // The sandbox side closes every connection.
        drop(accepting.await.unwrap());
        eventually(|| stale.is_closed()).await;
        pool.put(&id, 80, stale);
        assert!(pool.idle_count() <= 2, "a closed connection was kept");

        // Once the pool's connections have seen the close, none is handed out.
        eventually(|| match pool.take(&id, 80) {
            None => true,
            Some(open) => {
                pool.put(&id, 80, open);
                false
            }
        })
        .await;
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn forget_drops_only_that_sandbox() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _accepting = tokio::spawn(async move {
            let mut sockets = Vec::new();
            loop {
                sockets.push(listener.accept().await.unwrap().0);
            }
        });
        let pool = ConnectionPool::default();
        let gone = SandboxId::parse("igone").unwrap();
        let kept = SandboxId::parse("ikept").unwrap();
        pool.put(&gone, 80, sender_to(address).await);
        pool.put(&gone, 81, sender_to(address).await);
        pool.put(&kept, 80, sender_to(address).await);
        pool.forget(&gone);
        assert!(pool.take(&gone, 80).is_none());
        assert!(pool.take(&kept, 80).is_some());
    }
}
