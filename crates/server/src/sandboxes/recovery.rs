//! Reconciling the store with the runtime at start.

use std::collections::HashSet;
use std::sync::Arc;

use berth_api::LogLevel;
use time::OffsetDateTime;

use super::{blocking, checkpoints, kill_in_runtime, log};
use crate::error::{ServiceError, Stage};
use crate::{events, AppState};

/// Sandboxes the runtime reattached (or found paused) and the store knows stay; rows
/// whose sandbox is gone are marked killed (with an event); sandboxes nobody recorded
/// are killed so nothing runs, or waits on disk, unaccounted for; checkpoints no
/// snapshot owns are deleted.
pub async fn recover(state: &Arc<AppState>) -> Result<(), ServiceError> {
    let runtime = state.runtime.clone();
    let report = blocking("", Stage::Recover, move || runtime.recover()).await?;
    let alive: HashSet<String> = report.reattached.iter().map(|s| s.id.clone()).collect();
    let paused: HashSet<String> = report.paused.iter().cloned().collect();
    // On a node, another node's sandboxes are not ours to reconcile.
    let mine = |rows| {
        crate::cluster::node::only_mine(
            state,
            berth_store::PlacedKind::Sandbox,
            rows,
            |row: &berth_store::SandboxRecord| row.id.as_str(),
        )
    };
    let running_rows = mine(state.store.all_running_sandboxes()?)?;
    let paused_rows = mine(state.store.all_paused_sandboxes()?)?;
    for row in &running_rows {
        if alive.contains(&row.id) {
            continue;
        }
        if paused.contains(&row.id) {
            // A crash between the runtime's pause and the store's record of it. Only the
            // runtime knows whether memory was kept; resume reads it from there.
            state.store.mark_paused(&row.id, true)?;
            continue;
        }
        if state.store.mark_killed(&row.id)? {
            log(
                state,
                &row.id,
                LogLevel::Warn,
                "sandbox was gone after a berth restart",
            );
            events::record(state, row, events::KILLED, None);
        }
    }
    for row in &paused_rows {
        if alive.contains(&row.id) {
            // A crash between the runtime's resume and the store's record of it.
            let end_at = OffsetDateTime::now_utc() + time::Duration::seconds(row.timeout_secs);
            let execution_id = super::pipeline::new_execution_id();
            state.store.mark_resumed(&row.id, end_at, &execution_id)?;
        } else if !paused.contains(&row.id) && state.store.mark_killed(&row.id)? {
            log(
                state,
                &row.id,
                LogLevel::Warn,
                "paused sandbox was gone after a berth restart",
            );
            events::record(state, row, events::KILLED, None);
        }
    }
    let recorded: HashSet<String> = running_rows
        .iter()
        .chain(&paused_rows)
        .map(|s| s.id.clone())
        .collect();
    let found: HashSet<String> = alive.union(&paused).cloned().collect();
    for orphan in found.difference(&recorded) {
        tracing::warn!(sandbox = %orphan, "killing a sandbox no record knows of");
        if let Err(err) = kill_in_runtime(state, orphan).await {
            tracing::error!(sandbox = %orphan, %err, "killing an orphaned sandbox");
        }
    }
    checkpoints::remove_unowned(state).await?;
    tracing::info!(
        reattached = alive.intersection(&recorded).count(),
        paused = paused.intersection(&recorded).count(),
        cleaned = report.cleaned.len(),
        "recovered sandboxes"
    );
    Ok(())
}
