//! The sweeper component: releases sandboxes whose lease ran out (kill, or pause by
//! configuration). A failed release is retried with exponential backoff; a sandbox that
//! is already gone (404) counts as released. Leases live in the state database, so they
//! survive restarts; the release goes through the owner's connection as
//! [`Connections::for_release`] finds it.

use std::sync::Arc;
use std::time::Duration;

use berth_client::ClientError;
use tokio_util::sync::CancellationToken;

use crate::config::{LeaseConfig, ReleaseAction};
use crate::connections::Connections;
use crate::sessions::SandboxStatus;
use crate::store::{unix_now, SandboxRow, Store};

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub released: usize,
    pub failed: usize,
}

/// Why one release did not happen (retried later).
#[derive(Debug, thiserror::Error)]
enum ReleaseError {
    #[error("the owner has no connection")]
    NoConnection,
    #[error(transparent)]
    Connection(#[from] crate::error::McpError),
    #[error(transparent)]
    Api(#[from] ClientError),
}

pub(crate) struct Sweeper {
    store: Arc<Store>,
    connections: Arc<Connections>,
    lease: LeaseConfig,
}

impl Sweeper {
    pub(crate) fn new(
        store: Arc<Store>,
        connections: Arc<Connections>,
        lease: LeaseConfig,
    ) -> Self {
        Self {
            store,
            connections,
            lease,
        }
    }

    /// Runs [`Sweeper::sweep_once`] every `lease.sweep_interval` until `shutdown` fires,
    /// handing each pass's report to `reported`.
    pub(crate) fn spawn(
        self: Arc<Self>,
        shutdown: CancellationToken,
        reported: impl Fn(&SweepReport) + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(self.lease.sweep_interval) => {}
                }
                reported(&self.sweep_once().await);
            }
        })
    }

    /// Releases every sandbox whose lease expired and whose retry time has come.
    pub(crate) async fn sweep_once(&self) -> SweepReport {
        let mut report = SweepReport::default();
        let expired = match self.store.expired_leases(unix_now()) {
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
                        self.store
                            .set_status(&row.identity, &row.sandbox_id, status.as_str(), true)
                    {
                        tracing::warn!(sandbox_id = %row.sandbox_id, %error, "recording a release failed");
                    }
                    tracing::info!(sandbox_id = %row.sandbox_id, status = status.as_str(), "lease expired; sandbox released");
                }
                Err(reason) => {
                    report.failed += 1;
                    let delay = self.backoff(row.release_attempts);
                    tracing::warn!(sandbox_id = %row.sandbox_id, %reason, retry_in_s = delay.as_secs(), "releasing a sandbox failed");
                    if let Err(error) = self.store.release_failed(
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
        let factor = 1u32 << attempts.clamp(0, 16) as u32;
        self.lease
            .initial_backoff
            .saturating_mul(factor)
            .min(self.lease.max_backoff)
    }

    /// Kills or pauses one sandbox; returns the status to record.
    async fn release(&self, row: &SandboxRow) -> Result<SandboxStatus, ReleaseError> {
        let connected = self
            .connections
            .for_release(&row.identity)?
            .ok_or(ReleaseError::NoConnection)?;
        let (outcome, status) = match self.lease.release_action {
            ReleaseAction::Kill => (
                connected.api.kill_sandbox(&row.sandbox_id).await,
                SandboxStatus::Deleted,
            ),
            ReleaseAction::Pause => (
                connected.api.pause_sandbox(&row.sandbox_id).await,
                SandboxStatus::Paused,
            ),
        };
        match outcome {
            Ok(()) => Ok(status),
            Err(ClientError::Api { status: 404, .. }) => Ok(SandboxStatus::Deleted),
            // Pausing a sandbox that is already paused.
            Err(ClientError::Api { status: 409, .. })
                if self.lease.release_action == ReleaseAction::Pause =>
            {
                Ok(status)
            }
            Err(error) => Err(error.into()),
        }
    }
}
