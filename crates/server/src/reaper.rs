//! The reaper: kills every sandbox at its end time.

use std::time::Duration;

use time::OffsetDateTime;

use crate::{lifecycle, SharedState};

/// Longest sleep between checks, so an end time written by another process (or a missed
/// wakeup) is still honoured promptly.
const MAX_SLEEP: Duration = Duration::from_secs(5);

pub async fn run(state: SharedState) {
    loop {
        let now = OffsetDateTime::now_utc();
        match state.store.expired_sandboxes(now) {
            Ok(expired) => {
                for sandbox in expired {
                    if let Err(err) = lifecycle::kill(&state, &sandbox, "timeout").await {
                        tracing::error!(sandbox = %sandbox.id, %err, "reaping sandbox");
                    }
                }
            }
            Err(err) => tracing::error!(%err, "listing expired sandboxes"),
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
