//! Moving bytes both ways between a sandbox connection and its upstream, with
//! backpressure (each direction writes everything it read before reading more),
//! half-close (EOF on one side shuts down writing on the other, the other direction
//! goes on), an idle timeout, and periodic re-checks of the sandbox's policy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const BUFFER: usize = 32 * 1024;

/// When either direction last moved a byte.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    pub(crate) fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Copies `from` to `to` until EOF, then shuts `to` down for writing.
pub(crate) async fn pump<R, W>(
    mut from: R,
    mut to: W,
    activity: &Activity,
    count: impl Fn(usize),
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        count(n);
        activity.touch();
    }
}

/// How a supervised connection ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Both directions finished (or one failed, which ends both).
    Done,
    Idle,
    /// The policy no longer allows the connection.
    Revoked,
    Shutdown,
}

/// Runs `transfer` (both directions of one connection) until it finishes, the
/// connection idles for `idle`, `still_allowed` turns false (checked every
/// `recheck`), or `stop` fires. Dropping `transfer` closes both sockets.
pub(crate) async fn supervise<F>(
    transfer: F,
    activity: &Activity,
    idle: Duration,
    recheck: Duration,
    stop: &CancellationToken,
    still_allowed: impl Fn() -> bool,
) -> End
where
    F: std::future::Future<Output = std::io::Result<()>>,
{
    tokio::pin!(transfer);
    // Not `interval(recheck)`: its immediate first tick still goes through the timer
    // wheel (1 ms granularity), which would delay every connection's first bytes.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + recheck, recheck);
    loop {
        tokio::select! {
            _ = &mut transfer => return End::Done,
            _ = stop.cancelled() => return End::Shutdown,
            _ = ticks.tick() => {
                if !still_allowed() {
                    return End::Revoked;
                }
                if activity.idle_for() >= idle {
                    return End::Idle;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn half_close_and_backpressure() {
        // client <-> (a_in, a_out) proxy (b_in, b_out) <-> server
        let (mut client, proxy_client_side) = duplex(64);
        let (proxy_server_side, mut server) = duplex(64);
        let activity = Activity::new();
        let (cr, cw) = tokio::io::split(proxy_client_side);
        let (sr, sw) = tokio::io::split(proxy_server_side);
        let act = activity.clone();
        let transfer = tokio::spawn(async move {
            let up = pump(cr, sw, &act, |_| {});
            let down = pump(sr, cw, &act, |_| {});
            tokio::try_join!(up, down).map(|_| ())
        });
        // 1 MiB through 64-byte pipes: only works if both sides keep draining.
        let payload = vec![7u8; 1 << 20];
        let writer = {
            let payload = payload.clone();
            async move {
                client.write_all(&payload).await.unwrap();
                client.shutdown().await.unwrap();
                let mut back = Vec::new();
                client.read_to_end(&mut back).await.unwrap();
                back
            }
        };
        let echo = async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            // The client's EOF arrived, yet the server can still answer: half-close.
            server.write_all(b"done").await.unwrap();
            server.shutdown().await.unwrap();
            got
        };
        let (back, got) = tokio::join!(writer, echo);
        assert_eq!(got, payload);
        assert_eq!(back, b"done");
        transfer.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn idle_connections_end() {
        let activity = Activity::new();
        let stop = CancellationToken::new();
        let never = std::future::pending::<std::io::Result<()>>();
        let end = supervise(
            never,
            &activity,
            Duration::from_millis(50),
            Duration::from_millis(10),
            &stop,
            || true,
        )
        .await;
        assert_eq!(end, End::Idle);
        let never = std::future::pending::<std::io::Result<()>>();
        let end = supervise(
            never,
            &activity,
            Duration::from_secs(60),
            Duration::from_millis(10),
            &stop,
            || false,
        )
        .await;
        assert_eq!(end, End::Revoked);
    }
}
