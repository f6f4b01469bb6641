//! Sandboxes made from checkpoints: snapshots (a named checkpoint of a running sandbox,
//! usable as `templateID`) and fork (a checkpoint taken and restored `count` times at
//! once). The source keeps running through both; each new sandbox continues from the
//! source's memory on its own copy of the disk, under its own id, uid range and token.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_api::{ApiError, LogLevel, StringMap};
use berth_store::{Lifecycle, SandboxRecord, SandboxStatus, SnapshotRecord};
use time::OffsetDateTime;

use crate::envd;
use crate::handlers::store_error;
use crate::lifecycle::{self, log};
use crate::{events, AppState, ENVD_VERSION};

/// Most forks started at once: each restore is CPU-bound (CRIU, a disk copy, a chown
/// walk), so more than a few at a time only makes each one slower.
const PARALLEL_RESTORES: usize = 4;

/// Where the runtime's checkpoints live.
fn checkpoint_root(state: &AppState) -> PathBuf {
    state.runtime.state_dir().join("checkpoints")
}

/// What a sandbox started from a checkpoint inherits.
pub struct Origin {
    pub team_id: String,
    /// The template the checkpointed sandbox came from (its envd defaults).
    pub template_id: String,
    /// Reported as the new sandbox's alias (a snapshot's name, or the source's alias).
    pub alias: Option<String>,
    pub build_id: String,
    pub metadata: StringMap,
    pub env_vars: StringMap,
    /// The token the checkpointed envd holds, needed to initialise it again.
    pub envd_token: Option<String>,
    /// Continue from the checkpoint's memory; false: boot afresh on its disk.
    pub memory: bool,
}

/// What a sandbox started from a checkpoint is asked to be.
pub struct Start {
    pub timeout_secs: i64,
    pub secure: bool,
    pub metadata: Option<StringMap>,
    pub env_vars: StringMap,
    pub lifecycle: Lifecycle,
}

/// Start a new sandbox from `checkpoint`, initialise its envd again (new id in
/// `E2B_SANDBOX_ID`, new access token, merged env vars) and record it.
pub async fn start_from_checkpoint(
    state: &Arc<AppState>,
    checkpoint: &Path,
    origin: &Origin,
    start: Start,
) -> Result<SandboxRecord, ApiError> {
    let id = lifecycle::new_sandbox_id();
    let runtime = state.runtime.clone();
    let (path, new_id) = (checkpoint.to_path_buf(), id.clone());
    let memory = origin.memory;
    let info = lifecycle::blocking("starting sandbox from a checkpoint", move || {
        runtime.restore(&path, &new_id, memory)
    })
    .await?;
    let access_token = start.secure.then(lifecycle::new_token);
    let mut env_vars = origin.env_vars.clone();
    env_vars.extend(start.env_vars);
    let ready = async {
        envd::wait_healthy(&state.runtime, &id, lifecycle::ENVD_READY_LIMIT).await?;
        let template = lifecycle::load_template(state, &origin.template_id)
            .await
            .map_err(|err| envd::EnvdError::Http(err.to_string()))?;
        let init = lifecycle::init_request(&template, &env_vars, &id, access_token.clone());
        // A fresh envd has no token yet; a restored one wants the one it holds.
        let presented = origin.envd_token.as_deref().filter(|_| origin.memory);
        envd::init(&state.runtime, &id, &init, presented).await
    }
    .await;
    if let Err(err) = ready {
        lifecycle::remove_unrecorded(state, &id).await;
        return Err(ApiError::Unavailable(format!(
            "sandbox {id} started from a checkpoint but its envd failed: {err}"
        )));
    }
    let now = OffsetDateTime::now_utc();
    let record = SandboxRecord {
        id: id.clone(),
        team_id: origin.team_id.clone(),
        template_id: origin.template_id.clone(),
        alias: origin.alias.clone(),
        build_id: origin.build_id.clone(),
        cpu_count: info.spec.cpu_count,
        memory_mb: info.spec.memory_mb,
        disk_size_mb: info.spec.disk_size_mb,
        metadata: start.metadata.unwrap_or_else(|| origin.metadata.clone()),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: access_token,
        allow_internet_access: None,
        started_at: now,
        end_at: now + time::Duration::seconds(start.timeout_secs),
        status: SandboxStatus::Running,
        env_vars,
        timeout_secs: start.timeout_secs,
        lifecycle: start.lifecycle,
    };
    if let Err(err) = state.store.insert_sandbox(&record) {
        lifecycle::remove_unrecorded(state, &id).await;
        return Err(ApiError::Internal(format!("recording sandbox {id}: {err}")));
    }
    log(
        state,
        &id,
        LogLevel::Info,
        &format!(
            "sandbox started from a checkpoint of template {}",
            origin.template_id
        ),
    );
    events::record(state, &record, events::CREATED, None);
    state.reaper_wakeup.notify_one();
    crate::metrics::sample_soon(state.clone(), id);
    Ok(record)
}

/// Checkpoint running sandbox `id` into `dest` under its lock; 409 when it is paused.
/// Emits `checkpointed` on the source.
async fn checkpoint_running(
    state: &AppState,
    id: &str,
    dest: &Path,
) -> Result<(SandboxRecord, berth_runtime::CheckpointInfo), ApiError> {
    let _guard = state.lock_sandbox(id).await;
    let record = lifecycle::live(state, id)?;
    if let SandboxStatus::Paused { .. } = record.status {
        return Err(ApiError::Conflict(format!(
            "sandbox {id} is paused; resume it first"
        )));
    }
    std::fs::create_dir_all(checkpoint_root(state))
        .map_err(|err| ApiError::Internal(format!("creating the checkpoint directory: {err}")))?;
    let runtime = state.runtime.clone();
    let (owned, path) = (id.to_string(), dest.to_path_buf());
    let info = lifecycle::blocking(&format!("checkpointing sandbox {id}"), move || {
        runtime.checkpoint(&owned, &path)
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

fn origin_of(record: &SandboxRecord) -> Origin {
    Origin {
        team_id: record.team_id.clone(),
        template_id: record.template_id.clone(),
        alias: record.alias.clone(),
        build_id: record.build_id.clone(),
        metadata: record.metadata.clone(),
        env_vars: record.env_vars.clone(),
        envd_token: record.envd_access_token.clone(),
        memory: true,
    }
}

/// Fork running sandbox `id` `count` times: one checkpoint, then `count` sandboxes
/// started from it. One result per fork; the source keeps running untouched.
pub async fn fork(
    state: &Arc<AppState>,
    id: &str,
    count: usize,
    timeout_secs: i64,
) -> Result<Vec<Result<SandboxRecord, ApiError>>, ApiError> {
    let dest = checkpoint_root(state).join(format!("fork-{}", uuid::Uuid::new_v4()));
    let (source, _) = checkpoint_running(state, id, &dest).await?;
    let origin = Arc::new(origin_of(&source));
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_RESTORES));
    let mut forks = tokio::task::JoinSet::new();
    for index in 0..count {
        let (state, origin, limit, dest) =
            (state.clone(), origin.clone(), limit.clone(), dest.clone());
        let secure = source.envd_access_token.is_some();
        forks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let start = Start {
                timeout_secs,
                secure,
                metadata: None,
                env_vars: StringMap::new(),
                lifecycle: Lifecycle::default(),
            };
            (
                index,
                start_from_checkpoint(&state, &dest, &origin, start).await,
            )
        });
    }
    let mut results: Vec<Option<Result<SandboxRecord, ApiError>>> =
        (0..count).map(|_| None).collect();
    while let Some(joined) = forks.join_next().await {
        match joined {
            Ok((index, result)) => results[index] = Some(result),
            Err(err) => tracing::error!(%err, "fork task failed"),
        }
    }
    delete_checkpoint(state, &dest).await;
    log(
        state,
        id,
        LogLevel::Info,
        &format!("sandbox forked {count} time(s)"),
    );
    Ok(results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(ApiError::Internal("fork task failed".into()))))
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
) -> Result<SnapshotRecord, ApiError> {
    let snapshot_id = format!("s{}", &lifecycle::new_sandbox_id()[1..]);
    let name = name.unwrap_or_else(|| snapshot_id.clone());
    let dest = checkpoint_root(state).join(&snapshot_id);
    let (source, info) = checkpoint_running(state, id, &dest).await?;
    let record = SnapshotRecord {
        id: snapshot_id,
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
        path: dest.to_string_lossy().into_owned(),
        size_bytes: info.size_bytes,
        created_at: OffsetDateTime::now_utc(),
        memory,
    };
    let replaced = match state.store.put_snapshot(&record) {
        Ok(replaced) => replaced,
        Err(err) => {
            delete_checkpoint(state, &dest).await;
            return Err(store_error(err));
        }
    };
    if let Some(old) = replaced {
        delete_checkpoint(state, Path::new(&old)).await;
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

/// A new sandbox from snapshot `snapshot`.
pub async fn create_from_snapshot(
    state: &Arc<AppState>,
    snapshot: &SnapshotRecord,
    start: Start,
) -> Result<SandboxRecord, ApiError> {
    let origin = Origin {
        team_id: snapshot.team_id.clone(),
        template_id: snapshot.template_id.clone(),
        alias: Some(snapshot.name.clone()),
        build_id: snapshot.build_id.clone(),
        metadata: StringMap::new(),
        env_vars: snapshot.env_vars.clone(),
        envd_token: snapshot.envd_access_token.clone(),
        memory: snapshot.memory,
    };
    start_from_checkpoint(state, Path::new(&snapshot.path), &origin, start).await
}

/// Delete snapshot `name_or_id` of `team_id` and its checkpoint.
pub async fn delete_snapshot(
    state: &AppState,
    team_id: &str,
    name_or_id: &str,
) -> Result<(), ApiError> {
    let removed = state
        .store
        .delete_snapshot(team_id, name_or_id)
        .map_err(store_error)?;
    delete_checkpoint(state, Path::new(&removed.path)).await;
    Ok(())
}

/// At start: delete checkpoints no snapshot owns (a fork's, or a snapshot's whose
/// recording did not happen, left by a crash).
pub async fn remove_unowned(state: &AppState) -> Result<(), crate::ServerError> {
    let owned: std::collections::HashSet<PathBuf> = state
        .store
        .snapshot_paths()?
        .into_iter()
        .map(PathBuf::from)
        .collect();
    let Ok(entries) = std::fs::read_dir(checkpoint_root(state)) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !owned.contains(&path) {
            tracing::info!(checkpoint = %path.display(), "deleting a checkpoint no snapshot owns");
            delete_checkpoint(state, &path).await;
        }
    }
    Ok(())
}

async fn delete_checkpoint(state: &AppState, path: &Path) {
    let runtime = state.runtime.clone();
    let owned = path.to_path_buf();
    if let Err(err) = lifecycle::blocking("deleting a checkpoint", move || {
        runtime.delete_checkpoint(&owned)
    })
    .await
    {
        tracing::warn!(checkpoint = %path.display(), %err, "deleting a checkpoint");
    }
}
