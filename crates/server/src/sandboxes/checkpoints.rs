//! Sandboxes made from checkpoints: snapshots (a named checkpoint of a running sandbox,
//! usable as `templateID`) and fork (a checkpoint taken and restored `count` times at
//! once). The source keeps running through both; each new sandbox is a run of the
//! bring-up pipeline with a restore boot: it continues from the source's memory on its
//! own copy of the disk, under its own id, uid range and token.
//!
//! Checkpoints are named by id; a snapshot's checkpoint id is the snapshot's id, a
//! fork's is `fork-<uuid>` and lives only while the fork runs.

use std::path::Path;
use std::sync::Arc;

use berth_api::{LogLevel, StringMap};
use berth_store::{SandboxRecord, SandboxStatus, SnapshotRecord};
use time::OffsetDateTime;

use super::pipeline::{self, Boot, BringUp, Init, NewRow, Row};
use super::{blocking, live, log, new_sandbox_id, new_token, CreateRequest};
use crate::error::{ServiceError, Stage};
use crate::limits::{check_snapshot_storage, check_team_quota, Need};
use crate::{events, AppState};

/// Most forks started at once: each restore is CPU-bound (CRIU filling memory, a disk
/// copy), so more than a few at a time only makes each one slower.
const PARALLEL_RESTORES: usize = 4;

/// The checkpoint id a snapshot row names. Rows written before checkpoints were named
/// by id hold the checkpoint's directory, whose last component is that id.
fn checkpoint_id(stored: &str) -> &str {
    Path::new(stored)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(stored)
}

/// What a sandbox started from a checkpoint inherits.
struct Origin {
    team_id: String,
    /// The template the checkpointed sandbox came from.
    template_id: String,
    /// Its build's manifest (the envd defaults).
    manifest_id: String,
    /// Reported as the new sandbox's alias (a snapshot's name, or the source's alias).
    alias: Option<String>,
    build_id: String,
    metadata: StringMap,
    env_vars: StringMap,
    /// The token the checkpointed envd holds, needed to initialise it again.
    envd_token: Option<String>,
    /// Continue from the checkpoint's memory; false: boot afresh on its disk.
    memory: bool,
    /// The source's network policy (the checkpoint carries it into the runtime too).
    network: Option<serde_json::Value>,
    /// The checkpointed sandbox's volumes, which the new one mounts too (the same ones).
    volume_mounts: Vec<berth_store::VolumeMountRecord>,
    /// The snapshot the checkpoint is (None: a fork's).
    snapshot_id: Option<String>,
}

/// What a sandbox started from a checkpoint is asked to be.
struct Start {
    timeout_secs: i64,
    secure: bool,
    metadata: Option<StringMap>,
    env_vars: StringMap,
    lifecycle: berth_store::Lifecycle,
}

/// One run of the pipeline from checkpoint `checkpoint_id`.
async fn start_from_checkpoint(
    state: &Arc<AppState>,
    checkpoint_id: &str,
    origin: &Origin,
    start: Start,
) -> Result<SandboxRecord, ServiceError> {
    let mut env_vars = origin.env_vars.clone();
    env_vars.extend(start.env_vars);
    let network: Option<berth_net::NetworkPolicy> = origin
        .network
        .as_ref()
        .and_then(|value| serde_json::from_value(value.clone()).ok());
    // No volume the checkpoint mounts is deleted before the new row records the mount.
    let _volumes = match origin.volume_mounts.is_empty() {
        true => None,
        false => Some(state.volume_mounting.read().await),
    };
    let plan = BringUp {
        id: new_sandbox_id(),
        init: Init {
            manifest_id: origin.manifest_id.clone(),
            manifest: None,
            env_vars,
            access_token: start.secure.then(new_token),
            presented_token: origin.envd_token.clone(),
            after_memory_restore: true,
        },
        row: Row::Insert(Box::new(NewRow {
            team_id: origin.team_id.clone(),
            template_id: origin.template_id.clone(),
            alias: origin.alias.clone(),
            build_id: origin.build_id.clone(),
            metadata: start.metadata.unwrap_or_else(|| origin.metadata.clone()),
            allow_internet_access: None,
            timeout_secs: start.timeout_secs,
            lifecycle: start.lifecycle,
            traffic_access_token: network
                .as_ref()
                .is_some_and(|policy| !policy.allow_public_traffic)
                .then(new_token),
            network,
            volume_mounts: origin.volume_mounts.clone(),
            from_snapshot: origin.snapshot_id.clone(),
        })),
        log_line: format!(
            "sandbox started from a checkpoint of template {}",
            origin.template_id
        ),
    };
    let boot = Boot::Restore {
        checkpoint_id: checkpoint_id.to_string(),
        memory: origin.memory,
        network: None,
    };
    pipeline::bring_up(state, boot, plan).await
}

/// Checkpoint running sandbox `id` as `checkpoint_id` under its lock; 409 when it is
/// paused. Emits `checkpointed` on the source.
async fn checkpoint_running(
    state: &AppState,
    id: &str,
    checkpoint_id: &str,
    durability: berth_runtime::Durability,
) -> Result<(SandboxRecord, berth_runtime::CheckpointInfo), ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let record = live(state, id)?;
    if let SandboxStatus::Paused { .. } = record.status {
        return Err(ServiceError::Paused(id.to_string()));
    }
    let runtime = state.runtime.clone();
    let (owned, checkpoint) = (id.to_string(), checkpoint_id.to_string());
    let info = blocking(id, Stage::Checkpoint, move || {
        runtime.checkpoint(&owned, &checkpoint, durability)
    })
    .await?;
    events::record(
        state,
        &record,
        events::CHECKPOINTED,
        Some(serde_json::json!({ "sizeBytes": info.size_bytes })),
    );
    Ok((record, info))
}

/// Fork running sandbox `id` `count` times: one checkpoint, then `count` sandboxes
/// started from it. One result per fork; the source keeps running untouched.
pub async fn fork(
    state: &Arc<AppState>,
    id: &str,
    count: usize,
    timeout_secs: i64,
) -> Result<Vec<Result<SandboxRecord, ServiceError>>, ServiceError> {
    state
        .prometheus
        .timed(
            crate::prometheus::Operation::fork,
            fork_untimed(state, id, count, timeout_secs),
        )
        .await
}

async fn fork_untimed(
    state: &Arc<AppState>,
    id: &str,
    count: usize,
    timeout_secs: i64,
) -> Result<Vec<Result<SandboxRecord, ServiceError>>, ServiceError> {
    if let Some(source) = state.store.live_sandbox_any_team(id)? {
        let count = u64::try_from(count).unwrap_or(u64::MAX);
        check_team_quota(
            state,
            &source.team_id,
            Need::sandboxes(count, source.cpu_count, source.memory_mb),
        )?;
    }
    let checkpoint = format!("fork-{}", uuid::Uuid::new_v4());
    // Only this fork reads it, and it is deleted when the fork ends.
    let (source, _) =
        checkpoint_running(state, id, &checkpoint, berth_runtime::Durability::Transient).await?;
    let origin = Arc::new(Origin {
        team_id: source.team_id.clone(),
        template_id: source.template_id.clone(),
        manifest_id: crate::templates::manifest_of(state, &source.template_id, &source.build_id)?,
        alias: source.alias.clone(),
        build_id: source.build_id.clone(),
        metadata: source.metadata.clone(),
        env_vars: source.env_vars.clone(),
        envd_token: source.envd_access_token.clone(),
        memory: true,
        network: source.network.clone(),
        volume_mounts: source.volume_mounts.clone(),
        snapshot_id: None,
    });
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_RESTORES));
    let mut forks = tokio::task::JoinSet::new();
    for index in 0..count {
        let (state, origin, limit, checkpoint) = (
            state.clone(),
            origin.clone(),
            limit.clone(),
            checkpoint.clone(),
        );
        let secure = source.envd_access_token.is_some();
        forks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let start = Start {
                timeout_secs,
                secure,
                metadata: None,
                env_vars: StringMap::new(),
                lifecycle: berth_store::Lifecycle::default(),
            };
            (
                index,
                start_from_checkpoint(&state, &checkpoint, &origin, start).await,
            )
        });
    }
    let mut results: Vec<Option<Result<SandboxRecord, ServiceError>>> =
        (0..count).map(|_| None).collect();
    while let Some(joined) = forks.join_next().await {
        match joined {
            Ok((index, result)) => results[index] = Some(result),
            Err(err) => tracing::error!(%err, "fork task failed"),
        }
    }
    delete_checkpoint(state, &checkpoint).await;
    log(
        state,
        id,
        LogLevel::Info,
        &format!("sandbox forked {count} time(s)"),
    );
    Ok(results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| {
                Err(ServiceError::Runtime {
                    sandbox: id.to_string(),
                    stage: Stage::Restore,
                    source: berth_runtime::RuntimeError::WorkerPanicked("fork"),
                })
            })
        })
        .collect())
}

/// Snapshot running sandbox `id` as `name` (a snapshot of that name is replaced), with
/// its memory or (`memory` false) only its files. Both take a full checkpoint, whose disk
/// copy is consistent with a stopped instant; a filesystem-only one just never uses the
/// memory.
pub async fn snapshot(
    state: &Arc<AppState>,
    id: &str,
    name: Option<String>,
    memory: bool,
) -> Result<SnapshotRecord, ServiceError> {
    state
        .prometheus
        .timed(
            crate::prometheus::Operation::snapshot,
            snapshot_untimed(state, id, name, memory),
        )
        .await
}

async fn snapshot_untimed(
    state: &Arc<AppState>,
    id: &str,
    name: Option<String>,
    memory: bool,
) -> Result<SnapshotRecord, ServiceError> {
    if let Some(name) = &name {
        if snapshot_name_taken(state, id, name)? {
            return Err(ServiceError::SnapshotNameTaken(name.clone()));
        }
    }
    if let Some(source) = state.store.live_sandbox_any_team(id)? {
        check_snapshot_storage(state, &source.team_id, name.as_deref(), 0)?;
    }
    let snapshot_id = format!("s{}", &new_sandbox_id()[1..]);
    let name = name.unwrap_or_else(|| snapshot_id.clone());
    let (source, info) =
        checkpoint_running(state, id, &snapshot_id, berth_runtime::Durability::Durable).await?;
    if let Err(err) = check_snapshot_storage(state, &source.team_id, Some(&name), info.size_bytes) {
        delete_checkpoint(state, &snapshot_id).await;
        return Err(err);
    }
    if memory {
        // A snapshot is reported made only once it is known to restore: a trial restore
        // with nothing of it running (the source is not locked meanwhile).
        let runtime = state.runtime.clone();
        let checkpoint = snapshot_id.clone();
        if let Err(err) = blocking(id, Stage::Checkpoint, move || {
            runtime.verify_checkpoint(&checkpoint)
        })
        .await
        {
            delete_checkpoint(state, &snapshot_id).await;
            return Err(ServiceError::SnapshotUnrestorable(Box::new(err)));
        }
    }
    let record = SnapshotRecord {
        id: snapshot_id.clone(),
        team_id: source.team_id.clone(),
        name,
        source_sandbox_id: source.id.clone(),
        template_id: source.template_id.clone(),
        build_id: source.build_id.clone(),
        cpu_count: source.cpu_count,
        memory_mb: source.memory_mb,
        disk_size_mb: source.disk_size_mb,
        env_vars: source.env_vars.clone(),
        envd_access_token: source.envd_access_token.clone(),
        checkpoint_id: snapshot_id.clone(),
        size_bytes: info.size_bytes,
        created_at: OffsetDateTime::now_utc(),
        memory,
        network: source.network.clone(),
        volume_mounts: source.volume_mounts.clone(),
    };
    let placed =
        crate::cluster::node::place_here(state, berth_store::PlacedKind::Checkpoint, &snapshot_id);
    let replaced = match placed.and_then(|()| Ok(state.store.put_snapshot(&record)?)) {
        Ok(replaced) => replaced,
        Err(err) => {
            delete_checkpoint(state, &snapshot_id).await;
            return Err(err);
        }
    };
    if let Some(old) = replaced {
        delete_checkpoint(state, checkpoint_id(&old)).await;
    }
    log(
        state,
        id,
        LogLevel::Info,
        &format!(
            "snapshot {} taken ({} bytes)",
            record.name, record.size_bytes
        ),
    );
    Ok(record)
}

/// Is `name` a template the owner of sandbox `id` could start (a snapshot of that name
/// would hide it)?
fn snapshot_name_taken(state: &AppState, id: &str, name: &str) -> Result<bool, ServiceError> {
    let Some(source) = state.store.live_sandbox_any_team(id)? else {
        return Ok(false);
    };
    let Ok(parsed) = crate::templates::parse_name(name) else {
        return Ok(false);
    };
    let team = crate::templates::team(state, &source.team_id)?;
    Ok(crate::templates::find(state, &team, &parsed)?.is_some())
}

/// A new sandbox from snapshot `snapshot`, as `request` asks (its template is the
/// snapshot's name).
pub(super) async fn create_from_snapshot(
    state: &Arc<AppState>,
    snapshot: &SnapshotRecord,
    request: CreateRequest,
) -> Result<SandboxRecord, ServiceError> {
    if !request.volume_mounts.is_empty() && request.volume_mounts != snapshot.volume_mounts {
        return Err(ServiceError::SnapshotVolumeMounts(snapshot.name.clone()));
    }
    check_team_quota(
        state,
        &snapshot.team_id,
        Need::sandboxes(1, snapshot.cpu_count, snapshot.memory_mb),
    )?;
    // Until the new sandbox's row names the snapshot, this keeps retention off it.
    let _start = SnapshotStart::begin(state, snapshot)?;
    // On a node, a snapshot made on another node (and its template's build) comes here
    // first.
    crate::cluster::node::ensure_checkpoint(state, checkpoint_id(&snapshot.checkpoint_id)).await?;
    let manifest_id =
        crate::templates::manifest_of(state, &snapshot.template_id, &snapshot.build_id)?;
    crate::cluster::node::ensure_build(state, &snapshot.template_id, &manifest_id).await?;
    let origin = Origin {
        team_id: snapshot.team_id.clone(),
        template_id: snapshot.template_id.clone(),
        manifest_id,
        alias: Some(snapshot.name.clone()),
        build_id: snapshot.build_id.clone(),
        metadata: StringMap::new(),
        env_vars: snapshot.env_vars.clone(),
        envd_token: snapshot.envd_access_token.clone(),
        memory: snapshot.memory,
        network: snapshot.network.clone(),
        volume_mounts: snapshot.volume_mounts.clone(),
        snapshot_id: Some(snapshot.id.clone()),
    };
    let start = Start {
        timeout_secs: request.timeout_secs,
        secure: request.secure,
        metadata: Some(request.metadata),
        env_vars: request.env_vars,
        lifecycle: request.lifecycle,
    };
    start_from_checkpoint(
        state,
        checkpoint_id(&snapshot.checkpoint_id),
        &origin,
        start,
    )
    .await
}

/// Delete snapshot `name_or_id` of `team_id` and its checkpoint; emits
/// `sandbox.snapshot.deleted` (reason `request`).
pub async fn delete_snapshot(
    state: &AppState,
    team_id: &str,
    name_or_id: &str,
) -> Result<(), ServiceError> {
    let removed = state.store.delete_snapshot(team_id, name_or_id)?;
    let checkpoint = checkpoint_id(&removed.checkpoint_id);
    delete_checkpoint(state, checkpoint).await;
    crate::cluster::node::forget_placement(state, berth_store::PlacedKind::Checkpoint, checkpoint)?;
    events::record_snapshot_deleted(state, &removed, serde_json::json!({ "reason": "request" }));
    Ok(())
}

/// Retention's eviction of snapshot `snapshot_id` of `team_id`: deleted with its
/// checkpoint unless it is in use now — a sandbox is being started from it, or a live
/// (running or paused) sandbox was. `event_data` goes into its
/// `sandbox.snapshot.deleted` event, and `reason` into berth's log. Returns whether
/// it was evicted.
pub async fn evict_snapshot(
    state: &AppState,
    team_id: &str,
    snapshot_id: &str,
    reason: &str,
    event_data: serde_json::Value,
) -> Result<bool, ServiceError> {
    let removed = {
        // Starts register under this lock after re-reading the row, so a start either
        // sees the row gone or is seen here.
        let starts = state.snapshot_starts.lock();
        if starts.contains_key(snapshot_id) || state.store.snapshots_in_use()?.contains(snapshot_id)
        {
            return Ok(false);
        }
        match state.store.delete_snapshot(team_id, snapshot_id) {
            Ok(removed) => removed,
            Err(berth_store::StoreError::NotFound { .. }) => return Ok(false),
            Err(err) => return Err(err.into()),
        }
    };
    delete_checkpoint(state, checkpoint_id(&removed.checkpoint_id)).await;
    tracing::warn!(
        snapshot = %removed.id,
        name = %removed.name,
        team = %removed.team_id,
        size_bytes = removed.size_bytes,
        "retention deleted a snapshot: {reason}"
    );
    events::record_snapshot_deleted(state, &removed, event_data);
    Ok(true)
}

/// A start from a snapshot in flight, registered in `AppState::snapshot_starts` while
/// it lives.
struct SnapshotStart<'a> {
    state: &'a AppState,
    snapshot_id: String,
}

impl<'a> SnapshotStart<'a> {
    /// Registers a start from `snapshot`, unless retention deleted it meanwhile.
    fn begin(state: &'a AppState, snapshot: &SnapshotRecord) -> Result<Self, ServiceError> {
        let mut starts = state.snapshot_starts.lock();
        if state
            .store
            .snapshot(&snapshot.team_id, &snapshot.id)?
            .is_none()
        {
            return Err(ServiceError::TemplateNotFound(snapshot.name.clone()));
        }
        *starts.entry(snapshot.id.clone()).or_default() += 1;
        Ok(SnapshotStart {
            state,
            snapshot_id: snapshot.id.clone(),
        })
    }
}

impl Drop for SnapshotStart<'_> {
    fn drop(&mut self) {
        let mut starts = self.state.snapshot_starts.lock();
        if let Some(count) = starts.get_mut(&self.snapshot_id) {
            *count -= 1;
            if *count == 0 {
                starts.remove(&self.snapshot_id);
            }
        }
    }
}

/// At start: delete checkpoints no snapshot owns (a fork's, or a snapshot's whose
/// recording did not happen, left by a crash). Template checkpoints (`tpl-…`) are the
/// template service's: it keeps those a template names and removes the rest.
pub(super) async fn remove_unowned(state: &AppState) -> Result<(), ServiceError> {
    let owned: std::collections::HashSet<String> = state
        .store
        .snapshot_checkpoints()?
        .iter()
        .map(|stored| checkpoint_id(stored).to_string())
        .collect();
    let runtime = state.runtime.clone();
    let held = blocking("", Stage::Recover, move || runtime.checkpoints()).await?;
    let unowned = held.iter().filter(|id| {
        !owned.contains(*id) && !id.starts_with(berth_build::TEMPLATE_CHECKPOINT_PREFIX)
    });
    for checkpoint in unowned {
        tracing::info!(%checkpoint, "deleting a checkpoint no snapshot owns");
        delete_checkpoint(state, checkpoint).await;
    }
    Ok(())
}

/// Delete checkpoint `checkpoint_id`; a failure is logged (the checkpoint is then left
/// for the next start's [`remove_unowned`]).
async fn delete_checkpoint(state: &AppState, checkpoint_id: &str) {
    let runtime = state.runtime.clone();
    let owned = checkpoint_id.to_string();
    if let Err(err) = blocking("", Stage::DeleteCheckpoint, move || {
        runtime.delete_checkpoint(&owned)
    })
    .await
    {
        tracing::warn!(checkpoint = %checkpoint_id, error = %crate::error::error_chain(&err), "deleting a checkpoint");
    }
}
