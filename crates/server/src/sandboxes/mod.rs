//! The sandbox service: everything that changes a sandbox's state — create, pause,
//! resume, snapshot, fork, kill, and reconciling with the runtime at start.
//!
//! Every bring-up (create, resume with or without memory, restore from a checkpoint
//! for fork and snapshot starts) is one run of the pipeline in [`pipeline`]: claim →
//! root and disk → runtime start → envd ready → `/init` → row → event, each stage
//! written once. Pause, resume, kill, snapshot and fork of one sandbox hold its lock
//! (`AppState::sandbox_locks`), the single serialisation point, and re-read the row
//! under it. Errors are [`ServiceError`]s; handlers turn them into HTTP answers at the
//! one boundary in `crate::error`.
//!
//! The runtime owns its on-disk layout: this module names checkpoints by id only.

mod checkpoints;
mod from_template;
mod pipeline;
pub(crate) mod pool;
mod recovery;

use std::collections::HashSet;
use std::sync::Arc;

use berth_api::{LogLevel, StringMap};
use berth_net::{E2bNetworkConfig, NetworkPolicy};
use berth_runtime::RuntimeError;
use berth_store::{Lifecycle, SandboxRecord, SandboxStatus};
use berth_template::TemplateError;
use parking_lot::Mutex;

use crate::error::{ServiceError, Stage};
use crate::limits::{check_team_quota, Need};
use crate::prometheus::Operation;
use crate::{events, AppState};

pub use checkpoints::{delete_snapshot, evict_snapshot, fork, snapshot};
pub use recovery::recover;

use pipeline::{Boot, BringUp, Init, NewRow, Row};

/// What a create request asks for, after validation.
pub struct CreateRequest {
    pub team_id: String,
    pub template: String,
    pub timeout_secs: i64,
    pub secure: bool,
    pub metadata: StringMap,
    pub env_vars: StringMap,
    pub allow_internet_access: Option<bool>,
    /// The policy the create names; `None`: E2B's default (internet, public traffic).
    pub network: Option<NetworkPolicy>,
    pub lifecycle: Lifecycle,
    /// Volumes of the team to mount, resolved and validated (`crate::volumes`).
    pub volume_mounts: Vec<berth_store::VolumeMountRecord>,
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

/// The build id of an installed template made of `layer_ids`: its version (stable for
/// the same layers, shaped like a UUID).
pub fn build_id(layer_ids: &[berth_template::LayerId]) -> String {
    berth_template::layers_version(layer_ids)
}

/// Template `name` from the store.
pub(crate) async fn load_template(
    state: &AppState,
    name: &str,
) -> Result<berth_template::Template, ServiceError> {
    let templates = state.templates.clone();
    let owned = name.to_string();
    let found = tokio::task::spawn_blocking(move || templates.get(&owned))
        .await
        .map_err(|source| ServiceError::Task {
            what: "template lookup",
            source,
        })?;
    found.map_err(|source| {
        let name = name.to_string();
        match source {
            TemplateError::NotFound(_) => ServiceError::TemplateNotFound(name),
            TemplateError::InvalidId(_) => ServiceError::InvalidTemplate { name, source },
            TemplateError::MissingLayer { .. } => ServiceError::TemplateIncomplete { name, source },
            source => ServiceError::Template { name, source },
        }
    })
}

/// Runs blocking runtime work for `stage` of sandbox `id` off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    id: &str,
    stage: Stage,
    work: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, ServiceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|source| ServiceError::Task {
            what: "runtime call",
            source,
        })?
        .map_err(|source| ServiceError::Runtime {
            sandbox: id.to_string(),
            stage,
            source,
        })
}

/// The live (running or paused) sandbox `id` of any team; call under its lock.
pub(crate) fn live(state: &AppState, id: &str) -> Result<SandboxRecord, ServiceError> {
    state
        .store
        .live_sandbox_any_team(id)?
        .ok_or_else(|| ServiceError::SandboxNotFound(id.to_string()))
}

/// Create a sandbox from a template (or a snapshot of that name) and wait until its
/// envd is initialised.
pub async fn create(
    state: &Arc<AppState>,
    request: CreateRequest,
) -> Result<SandboxRecord, ServiceError> {
    state
        .prometheus
        .timed(Operation::create, create_untimed(state, request))
        .await
}

async fn create_untimed(
    state: &Arc<AppState>,
    request: CreateRequest,
) -> Result<SandboxRecord, ServiceError> {
    let team_slug =
        crate::templates::team_slug(&crate::templates::team(state, &request.team_id)?.name);
    let snapshot = match crate::templates::snapshot_name(&request.template, &team_slug) {
        Some(name) => state.store.snapshot(&request.team_id, name)?,
        None => None,
    };
    if let Some(snapshot) = snapshot {
        return checkpoints::create_from_snapshot(state, &snapshot, request).await;
    }
    let template =
        crate::templates::for_sandbox(state, &request.team_id, &request.template).await?;
    check_team_quota(
        state,
        &request.team_id,
        Need::sandboxes(
            1,
            template.resources.cpu_count,
            template.resources.memory_mb,
        ),
    )?;
    let mut id = new_sandbox_id();
    // No volume this sandbox mounts is deleted before its row records the mount.
    let _volumes = match request.volume_mounts.is_empty() {
        true => None,
        false => Some(state.volume_mounting.read().await),
    };
    let traffic_access_token = request
        .network
        .as_ref()
        .is_some_and(|policy| !policy.allow_public_traffic)
        .then(new_token);
    // A fresh boot without volumes can take a warm sandbox of the same layers and size.
    let boot = match from_template::boot(&id, &template, &request)? {
        Boot::Fresh { spec, network } if spec.volumes.is_empty() => {
            match state.pools.claim(&pool::PoolKey::of(&spec)) {
                Some(prepared) => {
                    id = prepared.info.id.clone();
                    Boot::Claimed {
                        info: Box::new(prepared.info),
                        network,
                    }
                }
                None => Boot::Fresh { spec, network },
            }
        }
        boot => boot,
    };
    let mut env_vars = template.envs.clone();
    env_vars.extend(request.env_vars);
    let plan = BringUp {
        id,
        init: Init {
            manifest_id: template.manifest.pinned_reference(),
            manifest: Some(template.manifest.clone()),
            env_vars,
            access_token: request.secure.then(new_token),
            presented_token: None,
            after_memory_restore: true,
        },
        row: Row::Insert(Box::new(NewRow {
            team_id: request.team_id,
            template_id: template.template_id.clone(),
            alias: Some(template.alias.clone()),
            build_id: template.build_id.clone(),
            metadata: request.metadata,
            allow_internet_access: request.allow_internet_access,
            timeout_secs: request.timeout_secs,
            lifecycle: request.lifecycle,
            network: request.network,
            traffic_access_token,
            volume_mounts: request.volume_mounts,
            from_snapshot: None,
        })),
        log_line: from_template::log_line(&template),
    };
    let record = pipeline::bring_up(state, boot, plan).await?;
    crate::templates::record_spawn(state, &template.template_id);
    Ok(record)
}

/// Pause running sandbox `id` (with its memory, or only its disk). Emits `paused`.
pub async fn pause(
    state: &AppState,
    id: &str,
    memory: bool,
    reason: &str,
) -> Result<SandboxRecord, ServiceError> {
    state
        .prometheus
        .timed(Operation::pause, pause_untimed(state, id, memory, reason))
        .await
}

async fn pause_untimed(
    state: &AppState,
    id: &str,
    memory: bool,
    reason: &str,
) -> Result<SandboxRecord, ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let record = live(state, id)?;
    if let SandboxStatus::Paused { .. } = record.status {
        return Err(ServiceError::AlreadyPaused(id.to_string()));
    }
    let runtime = state.runtime.clone();
    let owned = id.to_string();
    blocking(id, Stage::Pause, move || runtime.pause(&owned, memory)).await?;
    // The sandbox's end of every proxied connection is gone: end them, do not let them hang.
    state.connections.close_all(id);
    state.store.mark_paused(id, memory)?;
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
) -> Result<Resumed, ServiceError> {
    state
        .prometheus
        .timed(
            Operation::resume,
            resume_untimed(state, id, timeout_secs, keep_memory),
        )
        .await
}

async fn resume_untimed(
    state: &Arc<AppState>,
    id: &str,
    timeout_secs: Option<i64>,
    keep_memory: bool,
) -> Result<Resumed, ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let record = live(state, id)?;
    if record.status == SandboxStatus::Running {
        return Ok(Resumed::WasRunning(record));
    }
    check_team_quota(
        state,
        &record.team_id,
        Need::sandboxes(1, record.cpu_count, record.memory_mb),
    )?;
    let plan = BringUp {
        id: id.to_string(),
        init: Init {
            manifest: None,
            manifest_id: crate::templates::manifest_of(
                state,
                &record.template_id,
                &record.build_id,
            )?,
            env_vars: record.env_vars.clone(),
            access_token: record.envd_access_token.clone(),
            presented_token: None,
            after_memory_restore: false,
        },
        row: Row::Resumed {
            timeout_secs: timeout_secs.unwrap_or(record.timeout_secs),
            record: Box::new(record),
        },
        log_line: "sandbox resumed".into(),
    };
    pipeline::bring_up(state, Boot::Resume { keep_memory }, plan)
        .await
        .map(Resumed::Resumed)
}

/// The network policy sandbox `record` runs under (E2B's default when it names none).
pub fn network_policy(record: &SandboxRecord) -> NetworkPolicy {
    record
        .network
        .as_ref()
        .and_then(|value| serde_json::from_value(value.clone()).ok())
        .unwrap_or_default()
}

/// Replace running sandbox `id`'s egress rules with `update` (E2B's PUT semantics:
/// an omitted field is cleared; public traffic and the host mask stay). `check` may
/// refuse the resulting policy (e.g. a feature not available). The runtime enforces it
/// first, then the row records it.
pub async fn update_network(
    state: &AppState,
    id: &str,
    update: &E2bNetworkConfig,
) -> Result<(), ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let record = live(state, id)?;
    if let SandboxStatus::Paused { .. } = record.status {
        return Err(ServiceError::Paused(id.to_string()));
    }
    let policy = network_policy(&record).from_e2b_update(update)?;
    let runtime = state.runtime.clone();
    let (owned, enforced) = (id.to_string(), policy.clone());
    blocking(id, Stage::UpdateNetwork, move || {
        runtime.set_network_policy(&owned, &enforced)
    })
    .await?;
    state
        .store
        .set_network(id, &serde_json::to_value(&policy).unwrap_or_default())?;
    log(state, id, LogLevel::Info, "network policy replaced");
    events::record(
        state,
        &record,
        events::UPDATED,
        Some(serde_json::json!({ "network": policy.to_e2b().1 })),
    );
    Ok(())
}

/// The sandboxes whose kill has begun and not yet reached the store. The proxy's
/// resolver treats them as gone: a kill ends a client's stream before the row says
/// `killed`, and the SDK's follow-up health probe must hear "not found" (the sandbox
/// was killed), not a failed connection to its dying envd (state unknown).
#[derive(Default)]
pub(crate) struct EndingSandboxes {
    ids: Mutex<HashSet<String>>,
}

impl EndingSandboxes {
    /// Marks `id` as ending until the guard drops.
    pub(crate) fn begin<'a>(&'a self, id: &str) -> EndingGuard<'a> {
        self.ids.lock().insert(id.to_owned());
        EndingGuard {
            ending: self,
            id: id.to_owned(),
        }
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.ids.lock().contains(id)
    }
}

/// Ends an [`EndingSandboxes`] mark: after the store says `killed`, or when the kill
/// failed and the sandbox lives on.
pub(crate) struct EndingGuard<'a> {
    ending: &'a EndingSandboxes,
    id: String,
}

impl Drop for EndingGuard<'_> {
    fn drop(&mut self) {
        self.ending.ids.lock().remove(&self.id);
    }
}

/// Remove sandbox `id` from the runtime; one already gone is fine.
pub(crate) async fn kill_in_runtime(state: &AppState, id: &str) -> Result<(), RuntimeError> {
    let runtime = state.runtime.clone();
    let owned = id.to_string();
    match tokio::task::spawn_blocking(move || runtime.kill(&owned)).await {
        Ok(Ok(())) | Ok(Err(RuntimeError::NotFound(_))) => {
            // Connections the proxy (or a bring-up) left into it are dead now.
            state.connections.close_all(id);
            Ok(())
        }
        Ok(Err(err)) => Err(err),
        Err(_) => Err(RuntimeError::WorkerPanicked("kill")),
    }
}

/// Kill a running or paused sandbox: remove it (and any checkpoint) from the runtime,
/// mark it killed, emit `killed`. Returns false when it was already killed.
pub async fn kill(
    state: &AppState,
    sandbox: &SandboxRecord,
    reason: &str,
) -> Result<bool, ServiceError> {
    let _guard = state.sandbox_locks.lock(sandbox.id.clone()).await;
    kill_locked(state, sandbox, reason, None).await
}

/// [`kill`] under the sandbox's lock; `event_data` goes into the `killed` event.
async fn kill_locked(
    state: &AppState,
    sandbox: &SandboxRecord,
    reason: &str,
    event_data: Option<serde_json::Value>,
) -> Result<bool, ServiceError> {
    let _ending = state.ending.begin(&sandbox.id);
    kill_in_runtime(state, &sandbox.id)
        .await
        .map_err(|source| ServiceError::Runtime {
            sandbox: sandbox.id.clone(),
            stage: Stage::Kill,
            source,
        })?;
    let was_running = state.store.mark_killed(&sandbox.id)?;
    crate::cluster::node::forget_placement(state, berth_store::PlacedKind::Sandbox, &sandbox.id)?;
    if was_running {
        log(
            state,
            &sandbox.id,
            LogLevel::Info,
            &format!("sandbox killed ({reason})"),
        );
        events::record(state, sandbox, events::KILLED, event_data);
        crate::metrics::forget(state, &sandbox.id);
    }
    Ok(was_running)
}

/// Retention's eviction of paused sandbox `id`: killed as [`kill`] does, with `reason`
/// in its log and `event_data` in its `killed` event, only if it is still paused when
/// its lock is taken (a resume meanwhile wins). Returns whether it was evicted.
pub async fn evict_paused(
    state: &AppState,
    id: &str,
    reason: &str,
    event_data: serde_json::Value,
) -> Result<bool, ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let record = match state.store.live_sandbox_any_team(id)? {
        Some(record) if matches!(record.status, SandboxStatus::Paused { .. }) => record,
        _ => return Ok(false),
    };
    kill_locked(state, &record, reason, Some(event_data)).await
}

/// A running sandbox whose envd (its init) exited on its own, so nothing inside answers
/// any more: removed from the runtime, marked killed and reported (`killed` event, an
/// error line in its log), as E2B reports a sandbox that died. Under the sandbox's lock
/// the runtime is asked again, because a pause that was dumping it (the dump ends its
/// processes) has the sandbox out of the runtime's list by the time the lock is free.
pub async fn reap_exited(state: &AppState, id: &str) -> Result<(), ServiceError> {
    let _guard = state.sandbox_locks.lock(id.to_string()).await;
    let runtime = state.runtime.clone();
    let still_exited = tokio::task::spawn_blocking(move || runtime.exited())
        .await
        .map_err(|source| ServiceError::Task {
            what: "runtime call",
            source,
        })?
        .iter()
        .any(|exited| exited == id);
    let record = state.store.live_sandbox_any_team(id)?;
    let Some(record) = record.filter(|r| still_exited && r.status == SandboxStatus::Running) else {
        return Ok(());
    };
    kill_in_runtime(state, id)
        .await
        .map_err(|source| ServiceError::Runtime {
            sandbox: id.to_string(),
            stage: Stage::Kill,
            source,
        })?;
    if state.store.mark_killed(id)? {
        log(
            state,
            id,
            LogLevel::Error,
            "sandbox ended: its envd (PID 1) exited, taking every process with it",
        );
        events::record(state, &record, events::KILLED, None);
        crate::metrics::forget(state, id);
        tracing::warn!(sandbox = %id, "sandbox ended: its envd exited");
    }
    Ok(())
}

/// Append a log line to a sandbox's log; failures are only traced.
pub fn log(state: &AppState, sandbox_id: &str, level: LogLevel, message: &str) {
    if let Err(err) = state.store.append_log(sandbox_id, level, message) {
        tracing::warn!(sandbox = %sandbox_id, %err, "appending sandbox log");
    }
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
    fn build_ids_are_stable_uuids() {
        let layers = [berth_template::LayerId::of_bytes(b"x")];
        let a = build_id(&layers);
        assert_eq!(a, build_id(&layers));
        assert!(uuid::Uuid::parse_str(&a).is_ok());
    }
}
