//! The reaper: at each sandbox's end time, kills it, or pauses it when it asked for
//! `autoPause`; and within a few seconds of a sandbox's envd exiting on its own, reports
//! it killed and frees what it held.

use std::time::Duration;

use time::OffsetDateTime;

use crate::sandboxes;
use crate::{ServiceError, SharedState};

/// Idempotency keys are honoured this long after the create they name.
const IDEMPOTENCY_KEY_LIFETIME: time::Duration = time::Duration::hours(24);
/// How often expired idempotency keys are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Longest sleep between checks, so an end time written by another process (or a missed
/// wakeup) is still honoured promptly.
const MAX_SLEEP: Duration = Duration::from_secs(5);

pub async fn run(state: SharedState) {
    let mut last_sweep: Option<std::time::Instant> = None;
    loop {
        let now = OffsetDateTime::now_utc();
        if last_sweep.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
            last_sweep = Some(std::time::Instant::now());
            if let Err(err) = state
                .store
                .forget_idempotency_keys(now - IDEMPOTENCY_KEY_LIFETIME)
            {
                tracing::warn!(%err, "sweeping idempotency keys");
            }
        }
        let expired = state
            .store
            .expired_sandboxes(now)
            .map_err(ServiceError::from)
            .and_then(|rows| {
                crate::cluster::node::only_mine(
                    &state,
                    berth_store::PlacedKind::Sandbox,
                    rows,
                    |row| row.id.as_str(),
                )
            });
        match expired {
            Ok(expired) => {
                for sandbox in expired {
                    if sandbox.lifecycle.auto_pause {
                        let memory = sandbox.lifecycle.auto_pause_memory;
                        match sandboxes::pause(&state, &sandbox.id, memory, "timeout").await {
                            Ok(_) => continue,
                            // Someone paused or killed it meanwhile: nothing left to do.
                            Err(
                                ServiceError::AlreadyPaused(_) | ServiceError::SandboxNotFound(_),
                            ) => continue,
                            // Running past the end time forever is not an option either.
                            Err(err) => {
                                state.prometheus.reaper_failed("pause");
                                tracing::error!(
                                    sandbox = %sandbox.id, %err, "auto-pause failed; killing instead"
                                )
                            }
                        }
                    }
                    if let Err(err) = sandboxes::kill(&state, &sandbox, "timeout").await {
                        state.prometheus.reaper_failed("kill");
                        tracing::error!(sandbox = %sandbox.id, %err, "reaping sandbox");
                    }
                }
            }
            Err(err) => {
                state.prometheus.reaper_failed("list");
                tracing::error!(%err, "listing expired sandboxes")
            }
        }
        let runtime = state.runtime.clone();
        if let Ok(exited) = tokio::task::spawn_blocking(move || runtime.exited()).await {
            for id in exited {
                if let Err(err) = sandboxes::reap_exited(&state, &id).await {
                    state.prometheus.reaper_failed("exited");
                    tracing::error!(sandbox = %id, %err, "reaping a sandbox whose envd exited");
                }
            }
        }
        let sleep = match state.store.next_end_at() {
            Ok(Some(next)) => {
                let until = next - OffsetDateTime::now_utc();
                Duration::try_from(until)
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_SLEEP)
            }
            Ok(None) | Err(_) => MAX_SLEEP,
        };
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = state.reaper_wakeup.notified() => {}
        }
    }
}
