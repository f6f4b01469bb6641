//! Counts of the proxy's connections into sandboxes and the bytes they carry, for the
//! operator's metrics. Counted on the socket, so plain requests, streams and upgraded
//! tunnels are all in them, HTTP framing included.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Totals since the proxy started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections opened into sandboxes.
    pub connections_opened: u64,
    /// Connections into sandboxes open now (idle pooled ones included).
    pub connections_open: u64,
    /// Bytes sent into sandboxes.
    pub bytes_to_sandboxes: u64,
    /// Bytes received from sandboxes.
    pub bytes_from_sandboxes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    opened: AtomicU64,
    closed: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

impl Counters {
    pub(crate) fn read(&self) -> ProxyStats {
        let opened = self.opened.load(Ordering::Relaxed);
        ProxyStats {
            connections_opened: opened,
            connections_open: opened.saturating_sub(self.closed.load(Ordering::Relaxed)),
            bytes_to_sandboxes: self.sent.load(Ordering::Relaxed),
            bytes_from_sandboxes: self.received.load(Ordering::Relaxed),
        }
    }
}

/// A connection into a sandbox whose traffic is counted in `counters`, and which
/// counts itself closed when dropped.
pub(crate) struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S> Counted<S> {
    pub(crate) fn new(inner: S, counters: Arc<Counters>) -> Self {
        counters.opened.fetch_add(1, Ordering::Relaxed);
        Counted { inner, counters }
    }
}

impl<S> Drop for Counted<S> {
    fn drop(&mut self) {
        self.counters.closed.fetch_add(1, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        self.counters
            .received
            .fetch_add(read as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.counters
                .sent
                .fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(written)) = &polled {
            self.counters
                .sent
                .fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_each_way_and_open_connections_are_counted() {
        let counters = Arc::new(Counters::default());
        let (near, mut far) = tokio::io::duplex(64);
        let mut counted = Counted::new(near, counters.clone());
        counted.write_all(b"hello").await.unwrap();
        far.write_all(b"hi").await.unwrap();
        let mut two = [0u8; 2];
        counted.read_exact(&mut two).await.unwrap();
        assert_eq!(
            counters.read(),
            ProxyStats {
                connections_opened: 1,
                connections_open: 1,
                bytes_to_sandboxes: 5,
                bytes_from_sandboxes: 2,
            }
        );
        drop(counted);
        assert_eq!(counters.read().connections_open, 0);
    }
}
