//! Releases sandboxes whose lease ran out (kill, or pause by configuration). A failed
//! release is retried with exponential backoff; a sandbox that is already gone (404)
//! counts as released. Leases live in the state database, so they survive restarts.

use std::time::Duration;

use berth_client::ClientError;
use tokio_util::sync::CancellationToken;

use crate::config::ReleaseAction;
use crate::server::Mcp;
use crate::store::{unix_now, SandboxRow};

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub released: usize,
    pub failed: usize,
}

impl Mcp {
    /// Runs [`Mcp::sweep_once`] every `lease.sweep_interval` until `shutdown` fires.
    pub fn spawn_sweeper(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let mcp = self.clone();
        let interval = mcp.inner.config.lease.sweep_interval;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(interval) => {}
                }
                mcp.sweep_once().await;
            }
        })
    }

    /// Releases every sandbox whose lease expired and whose retry time has come.
    pub async fn sweep_once(&self) -> SweepReport {
        let mut report = SweepReport::default();
        let expired = match self.inner.store.expired_leases(unix_now()) {
            Ok(expired) => expired,
            Err(error) => {
                tracing::warn!(%error, "reading expired leases failed");
                return report;
            }
        };
        for row in expired {
            match self.release(&row).await {
                Ok(status) => {
                    report.released += 1;
                    if let Err(error) =
                        self.inner
                            .store
                            .set_status(&row.identity, &row.sandbox_id, status, true)
                    {
                        tracing::warn!(sandbox_id = %row.sandbox_id, %error, "recording a release failed");
                    }
                    tracing::info!(sandbox_id = %row.sandbox_id, status, "lease expired; sandbox released");
                }
                Err(reason) => {
                    report.failed += 1;
                    let delay = self.backoff(row.release_attempts);
                    tracing::warn!(sandbox_id = %row.sandbox_id, %reason, retry_in_s = delay.as_secs(), "releasing a sandbox failed");
                    if let Err(error) = self.inner.store.release_failed(
                        &row.identity,
                        &row.sandbox_id,
                        unix_now() + delay.as_secs() as i64,
                    ) {
                        tracing::warn!(sandbox_id = %row.sandbox_id, %error, "recording a failed release failed");
                    }
                }
            }
        }
        report
    }

    fn backoff(&self, attempts: i64) -> Duration {
        let lease = &self.inner.config.lease;
        let factor = 1u32 << attempts.clamp(0, 16) as u32;
        lease
            .initial_backoff
            .saturating_mul(factor)
            .min(lease.max_backoff)
    }

    /// Kills or pauses one sandbox; returns the status to record.
    async fn release(&self, row: &SandboxRow) -> Result<&'static str, String> {
        let connected = self
            .connection(&row.identity)
            .map_err(|error| error.to_string())?
            .ok_or_else(|| "the owner has no connection".to_owned())?;
        let (outcome, status) = match self.inner.config.lease.release_action {
            ReleaseAction::Kill => (connected.api.kill_sandbox(&row.sandbox_id).await, "deleted"),
            ReleaseAction::Pause => (connected.api.pause_sandbox(&row.sandbox_id).await, "paused"),
        };
        match outcome {
            Ok(()) => Ok(status),
            Err(ClientError::Api { status: 404, .. }) => Ok("deleted"),
            // Pausing a sandbox that is already paused.
            Err(ClientError::Api { status: 409, .. })
                if self.inner.config.lease.release_action == ReleaseAction::Pause =>
            {
                Ok(status)
            }
            Err(error) => Err(error.to_string()),
        }
    }
}
