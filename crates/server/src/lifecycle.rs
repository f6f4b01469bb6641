//! The sandbox lifecycle: create (template → runtime → envd ready → `/init` → record →
//! `created` event), kill, and reconciling the store with the runtime at start.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use berth_api::{ApiError, LogLevel, StringMap};
use berth_runtime::{RuntimeError, SandboxSpec};
use berth_store::{Lifecycle, SandboxRecord, SandboxStatus};
use berth_template::TemplateError;
use time::OffsetDateTime;

use crate::envd::{self, InitRequest};
use crate::{checkpoints, events, AppState, ServerError, ENVD_VERSION};

/// How long a new sandbox's envd may take to answer `/health`.
pub(crate) const ENVD_READY_LIMIT: Duration = Duration::from_secs(30);

/// Longest time to live a sandbox may be given, in seconds (E2B's largest plan: 24 h).
pub const MAX_TIMEOUT_SECS: i64 = 24 * 60 * 60;

/// What a create request asks for, after validation.
pub struct CreateRequest {
    pub team_id: String,
    pub template: String,
    pub timeout_secs: i64,
    pub secure: bool,
    pub metadata: StringMap,
    pub env_vars: StringMap,
    pub allow_internet_access: Option<bool>,
    pub lifecycle: Lifecycle,
}

/// A new sandbox id: `i` + 20 characters of `[a-z0-9]`.
pub fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut id = String::with_capacity(21);
    id.push('i');
    for _ in 0..20 {
        id.push(ALPHABET[rand::random_range(0..ALPHABET.len())] as char);
    }
    id
}

/// A random token (hex) for envd access.
pub fn new_token() -> String {
    let bytes: [u8; 24] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a requested time to live.
pub fn validate_timeout(seconds: i64) -> Result<i64, ApiError> {
    if !(0..=MAX_TIMEOUT_SECS).contains(&seconds) {
        return Err(ApiError::BadRequest(format!(
            "timeout must be between 0 and {MAX_TIMEOUT_SECS} seconds, got {seconds}"
        )));
    }
    Ok(seconds)
}

fn template_error(template: &str, err: TemplateError) -> ApiError {
    match err {
        TemplateError::NotFound(_) => {
            ApiError::NotFound(format!("template \"{template}\" not found"))
        }
        TemplateError::InvalidId(_) => {
            ApiError::BadRequest(format!("invalid template id \"{template}\": {err}"))
        }
        TemplateError::MissingLayer { .. } => ApiError::Unavailable(format!(
            "template \"{template}\" is incomplete on this host: {err}"
        )),
        other => ApiError::Internal(format!("loading template \"{template}\": {other}")),
    }
}

/// A build id for a template: stable for the same layers, shaped like a UUID.
pub fn build_id(layer_ids: &[berth_template::LayerId]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for id in layer_ids {
        hasher.update(id.as_str().as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// What envd's `/init` gets for sandbox `id`: the template's env vars, the caller's, and
/// E2B's own, plus the template's default user and workdir.
pub(crate) fn init_request(
    template: &berth_template::Template,
    env_vars: &StringMap,
    id: &str,
    access_token: Option<String>,
) -> InitRequest {
    let mut all = template.envs.clone();
    all.extend(env_vars.clone());
    all.insert("E2B_SANDBOX".into(), "true".into());
    all.insert("E2B_SANDBOX_ID".into(), id.to_string());
    all.insert("E2B_TEMPLATE_ID".into(), template.id.clone());
    InitRequest {
        env_vars: all,
        access_token,
        default_user: template.default_user.clone(),
        default_workdir: template.default_workdir.clone(),
        timestamp: OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    }
}

pub(crate) async fn load_template(
    state: &AppState,
    name: &str,
) -> Result<berth_template::Template, ApiError> {
    let templates = state.templates.clone();
    let owned = name.to_string();
    tokio::task::spawn_blocking(move || templates.get(&owned))
        .await
        .map_err(|err| ApiError::Internal(format!("template lookup failed: {err}")))?
        .map_err(|err| template_error(name, err))
}

/// Runs blocking runtime work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| ApiError::Internal(format!("{what}: task failed: {err}")))?
        .map_err(|err| ApiError::Internal(format!("{what}: {err}")))
}

/// The live sandbox `id`, read under its lock.
pub(crate) fn live(state: &AppState, id: &str) -> Result<SandboxRecord, ApiError> {
    state
        .store
        .live_sandbox_any_team(id)
        .map_err(crate::handlers::store_error)?
        .ok_or_else(|| ApiError::sandbox_not_found(id))
}

/// Pause running sandbox `id` (with its memory, or only its disk): 409 when it is
/// already paused. Emits `paused`.
pub async fn pause(
    state: &AppState,
    id: &str,
    memory: bool,
    reason: &str,
) -> Result<SandboxRecord, ApiError> {
    let _guard = state.lock_sandbox(id).await;
    let record = live(state, id)?;
    if let SandboxStatus::Paused { .. } = record.status {
        return Err(ApiError::Conflict(format!(
            "sandbox {id} is already paused"
        )));
    }
    let runtime = state.runtime.clone();
    let owned = id.to_string();
    blocking(&format!("pausing sandbox {id}"), move || {
        runtime.pause(&owned, memory)
    })
    .await?;
    // The sandbox's end of every proxied connection is gone: end them, do not let them hang.
    state.connections.close_all(id);
    state
        .store
        .mark_paused(id, memory)
        .map_err(crate::handlers::store_error)?;
    let what = if memory {
        "memory and files"
    } else {
        "files only"
    };
    log(
        state,
        id,
        LogLevel::Info,
        &format!("sandbox paused, {what} kept ({reason})"),
    );
    events::record(
        state,
        &record,
        events::PAUSED,
        Some(serde_json::json!({ "memory": memory })),
    );
    crate::metrics::forget(state, id);
    Ok(record)
}

/// How [`resume`] found the sandbox.
pub enum Resumed {
    /// It was running; nothing changed.
    WasRunning(SandboxRecord),
    /// It was paused and runs again, until the record's new end time.
    Resumed(SandboxRecord),
}

/// Resume paused sandbox `id` for `timeout_secs` (default: its create timeout), with its
/// memory unless `keep_memory` is false. A running sandbox is returned as is. Emits
/// `resumed`.
pub async fn resume(
    state: &Arc<AppState>,
    id: &str,
    timeout_secs: Option<i64>,
    keep_memory: bool,
) -> Result<Resumed, ApiError> {
    let _guard = state.lock_sandbox(id).await;
    let mut record = live(state, id)?;
    if record.status == SandboxStatus::Running {
        return Ok(Resumed::WasRunning(record));
    }
    let runtime = state.runtime.clone();
    let owned = id.to_string();
    let resumed = blocking(&format!("resuming sandbox {id}"), move || {
        runtime.resume(&owned, keep_memory)
    })
    .await?;
    let ready = async {
        envd::wait_healthy(&state.runtime, id, ENVD_READY_LIMIT).await?;
        if resumed.memory_restored {
            return Ok(());
        }
        // A fresh envd: it needs the sandbox's settings again.
        let template = load_template(state, &record.template_id)
            .await
            .map_err(|err| envd::EnvdError::Http(err.to_string()))?;
        let init = init_request(
            &template,
            &record.env_vars,
            id,
            record.envd_access_token.clone(),
        );
        envd::init(&state.runtime, id, &init, None).await
    }
    .await;
    if let Err(err) = ready {
        // Half-resumed is worse than gone: the caller gets an error and no sandbox.
        let _ = kill_in_runtime(state, id).await;
        if state.store.mark_killed(id).unwrap_or(false) {
            events::record(state, &record, events::KILLED, None);
        }
        return Err(ApiError::Unavailable(format!(
            "sandbox {id} resumed but its envd failed: {err}"
        )));
    }
    let end_at = OffsetDateTime::now_utc()
        + time::Duration::seconds(timeout_secs.unwrap_or(record.timeout_secs));
    state
        .store
        .mark_resumed(id, end_at)
        .map_err(crate::handlers::store_error)?;
    record.status = SandboxStatus::Running;
    record.end_at = end_at;
    let how = if resumed.memory_restored {
        "processes continue from memory"
    } else {
        "booted afresh on its kept disk"
    };
    log(
        state,
        id,
        LogLevel::Info,
        &format!("sandbox resumed, {how}"),
    );
    events::record(state, &record, events::RESUMED, None);
    state.reaper_wakeup.notify_one();
    crate::metrics::sample_soon(state.clone(), id.to_string());
    Ok(Resumed::Resumed(record))
}

/// Remove a sandbox that never made it into the store (its start failed half-way).
pub(crate) async fn remove_unrecorded(state: &AppState, id: &str) {
    if let Err(err) = kill_in_runtime(state, id).await {
        tracing::error!(sandbox = %id, %err, "removing a sandbox whose start failed");
    }
}

async fn kill_in_runtime(state: &AppState, id: &str) -> Result<(), RuntimeError> {
    let runtime = state.runtime.clone();
    let id = id.to_string();
    match tokio::task::spawn_blocking(move || runtime.kill(&id)).await {
        Ok(Ok(())) | Ok(Err(RuntimeError::NotFound(_))) => Ok(()),
        Ok(Err(err)) => Err(err),
        Err(join) => Err(RuntimeError::Other(format!("kill task failed: {join}"))),
    }
}

/// Create a sandbox and wait until envd inside it is initialised.
pub async fn create(
    state: &Arc<AppState>,
    request: CreateRequest,
) -> Result<SandboxRecord, ApiError> {
    let snapshot = state
        .store
        .snapshot(&request.team_id, &request.template)
        .map_err(crate::handlers::store_error)?;
    if let Some(snapshot) = snapshot {
        let start = checkpoints::Start {
            timeout_secs: request.timeout_secs,
            secure: request.secure,
            metadata: Some(request.metadata),
            env_vars: request.env_vars,
            lifecycle: request.lifecycle,
        };
        return checkpoints::create_from_snapshot(state, &snapshot, start).await;
    }
    let template = load_template(state, &request.template).await?;

    let id = new_sandbox_id();
    let resources = state.config.resources;
    let spec = SandboxSpec {
        id: id.clone(),
        template: template.id.clone(),
        layers: template.layers.clone(),
        cpu_count: resources.cpu_count,
        memory_mb: resources.memory_mb,
        disk_size_mb: resources.disk_size_mb,
    };
    let runtime = state.runtime.clone();
    tokio::task::spawn_blocking(move || runtime.create(&spec))
        .await
        .map_err(|err| ApiError::Internal(format!("create task failed: {err}")))?
        .map_err(|err| ApiError::Internal(format!("starting sandbox: {err}")))?;

    let access_token = request.secure.then(new_token);
    let init = init_request(&template, &request.env_vars, &id, access_token.clone());
    let ready = async {
        envd::wait_healthy(&state.runtime, &id, ENVD_READY_LIMIT).await?;
        envd::init(&state.runtime, &id, &init, None).await
    }
    .await;
    if let Err(err) = ready {
        if let Err(kill_err) = kill_in_runtime(state, &id).await {
            tracing::error!(sandbox = %id, %kill_err, "removing a sandbox whose envd failed");
        }
        return Err(ApiError::Unavailable(format!(
            "sandbox {id} started but its envd failed: {err}"
        )));
    }

    let now = OffsetDateTime::now_utc();
    let record = SandboxRecord {
        id: id.clone(),
        team_id: request.team_id.clone(),
        template_id: template.id.clone(),
        alias: Some(template.id.clone()),
        build_id: build_id(&template.layer_ids),
        cpu_count: resources.cpu_count,
        memory_mb: resources.memory_mb,
        disk_size_mb: resources.disk_size_mb,
        metadata: request.metadata,
        envd_version: ENVD_VERSION.into(),
        envd_access_token: access_token,
        allow_internet_access: request.allow_internet_access,
        started_at: now,
        end_at: now + time::Duration::seconds(request.timeout_secs),
        status: SandboxStatus::Running,
        env_vars: request.env_vars,
        timeout_secs: request.timeout_secs,
        lifecycle: request.lifecycle,
    };
    if let Err(err) = state.store.insert_sandbox(&record) {
        if let Err(kill_err) = kill_in_runtime(state, &id).await {
            tracing::error!(sandbox = %id, %kill_err, "removing an unrecorded sandbox");
        }
        return Err(ApiError::Internal(format!("recording sandbox {id}: {err}")));
    }
    log(
        state,
        &id,
        LogLevel::Info,
        &format!("sandbox created from template {}", template.id),
    );
    events::record(state, &record, events::CREATED, None);
    state.reaper_wakeup.notify_one();
    crate::metrics::sample_soon(state.clone(), id);
    Ok(record)
}

/// Kill a running or paused sandbox: remove it (and any checkpoint) from the runtime,
/// mark it killed, emit `killed`. Returns false when it was already killed.
pub async fn kill(
    state: &AppState,
    sandbox: &SandboxRecord,
    reason: &str,
) -> Result<bool, ApiError> {
    let _guard = state.lock_sandbox(&sandbox.id).await;
    kill_in_runtime(state, &sandbox.id)
        .await
        .map_err(|err| ApiError::Internal(format!("killing sandbox {}: {err}", sandbox.id)))?;
    state.connections.close_all(&sandbox.id);
    let was_running = state
        .store
        .mark_killed(&sandbox.id)
        .map_err(|err| ApiError::Internal(format!("recording kill of {}: {err}", sandbox.id)))?;
    if was_running {
        log(
            state,
            &sandbox.id,
            LogLevel::Info,
            &format!("sandbox killed ({reason})"),
        );
        events::record(state, sandbox, events::KILLED, None);
        crate::metrics::forget(state, &sandbox.id);
    }
    Ok(was_running)
}

/// Append a log line to a sandbox's log; failures are only traced.
pub fn log(state: &AppState, sandbox_id: &str, level: LogLevel, message: &str) {
    if let Err(err) = state.store.append_log(sandbox_id, level, message) {
        tracing::warn!(sandbox = %sandbox_id, %err, "appending sandbox log");
    }
}

/// Reconcile at start: sandboxes the runtime reattached (or found paused) and the store
/// knows stay; rows whose sandbox is gone are marked killed (with an event); sandboxes
/// nobody recorded are killed so nothing runs, or waits on disk, unaccounted for.
pub async fn recover(state: &Arc<AppState>) -> Result<(), ServerError> {
    let runtime = state.runtime.clone();
    let report = tokio::task::spawn_blocking(move || runtime.recover())
        .await
        .map_err(|err| RuntimeError::Other(format!("recover task failed: {err}")))??;
    let alive: HashSet<String> = report.reattached.iter().map(|s| s.id.clone()).collect();
    let paused: HashSet<String> = report.paused.iter().cloned().collect();
    let running_rows = state.store.all_running_sandboxes()?;
    let paused_rows = state.store.all_paused_sandboxes()?;
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
            state.store.mark_resumed(&row.id, end_at)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_have_e2b_shape() {
        let id = new_sandbox_id();
        assert_eq!(id.len(), 21);
        assert!(id.starts_with('i'));
        assert!(id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_ne!(id, new_sandbox_id());
    }

    #[test]
    fn timeouts_outside_range_are_refused() {
        assert!(validate_timeout(-1).is_err());
        assert!(validate_timeout(MAX_TIMEOUT_SECS + 1).is_err());
        assert_eq!(validate_timeout(300).unwrap(), 300);
    }

    #[test]
    fn build_ids_are_stable_uuids() {
        let layers = [berth_template::LayerId::of_bytes(b"x")];
        let a = build_id(&layers);
        assert_eq!(a, build_id(&layers));
        assert!(uuid::Uuid::parse_str(&a).is_ok());
    }
}
