//! The sandbox lifecycle: create (template → runtime → envd ready → `/init` → record →
//! `created` event), kill, and reconciling the store with the runtime at start.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use berth_api::{ApiError, LogLevel, StringMap};
use berth_runtime::{RuntimeError, SandboxSpec};
use berth_store::{SandboxRecord, SandboxStatus};
use berth_template::TemplateError;
use time::OffsetDateTime;

use crate::envd::{self, InitRequest};
use crate::{events, AppState, ServerError, ENVD_VERSION};

/// How long a new sandbox's envd may take to answer `/health`.
const ENVD_READY_LIMIT: Duration = Duration::from_secs(30);

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
    let templates = state.templates.clone();
    let name = request.template.clone();
    let template = tokio::task::spawn_blocking(move || templates.get(&name))
        .await
        .map_err(|err| ApiError::Internal(format!("template lookup failed: {err}")))?
        .map_err(|err| template_error(&request.template, err))?;

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
    let mut env_vars = template.envs.clone();
    env_vars.extend(request.env_vars.clone());
    env_vars.insert("E2B_SANDBOX".into(), "true".into());
    env_vars.insert("E2B_SANDBOX_ID".into(), id.clone());
    env_vars.insert("E2B_TEMPLATE_ID".into(), template.id.clone());
    let init = InitRequest {
        env_vars,
        access_token: access_token.clone(),
        default_user: template.default_user.clone(),
        default_workdir: template.default_workdir.clone(),
        timestamp: OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    };
    let ready = async {
        envd::wait_healthy(&state.runtime, &id, ENVD_READY_LIMIT).await?;
        envd::init(&state.runtime, &id, &init).await
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

/// Kill a running sandbox: remove it from the runtime, mark it killed, emit `killed`.
/// Returns false when it was not running (already killed by someone else).
pub async fn kill(
    state: &AppState,
    sandbox: &SandboxRecord,
    reason: &str,
) -> Result<bool, ApiError> {
    kill_in_runtime(state, &sandbox.id)
        .await
        .map_err(|err| ApiError::Internal(format!("killing sandbox {}: {err}", sandbox.id)))?;
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

/// Reconcile at start: sandboxes the runtime reattached and the store knows stay;
/// rows whose sandbox is gone are marked killed (with an event); sandboxes nobody
/// recorded are killed so nothing runs unaccounted for.
pub async fn recover(state: &Arc<AppState>) -> Result<(), ServerError> {
    let runtime = state.runtime.clone();
    let report = tokio::task::spawn_blocking(move || runtime.recover())
        .await
        .map_err(|err| RuntimeError::Other(format!("recover task failed: {err}")))??;
    let alive: HashSet<String> = report.reattached.iter().map(|s| s.id.clone()).collect();
    let rows = state.store.all_running_sandboxes()?;
    let recorded: HashSet<String> = rows.iter().map(|s| s.id.clone()).collect();
    for row in &rows {
        if !alive.contains(&row.id) && state.store.mark_killed(&row.id)? {
            log(
                state,
                &row.id,
                LogLevel::Warn,
                "sandbox was gone after a berth restart",
            );
            events::record(state, row, events::KILLED, None);
        }
    }
    for orphan in alive.difference(&recorded) {
        tracing::warn!(sandbox = %orphan, "killing a sandbox no record knows of");
        if let Err(err) = kill_in_runtime(state, orphan).await {
            tracing::error!(sandbox = %orphan, %err, "killing an orphaned sandbox");
        }
    }
    tracing::info!(
        reattached = alive.intersection(&recorded).count(),
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
