//! The one bring-up pipeline. Every way a sandbox comes up runs these stages in order,
//! each written once; an entry point only chooses how each stage is done:
//!
//! | stage | create | resume | restore (fork, snapshot start) |
//! |---|---|---|---|
//! | claim | new id | the paused id, under its lock | new id |
//! | root, disk, runtime start | `Runtime::create` | `Runtime::resume` | `Runtime::restore` |
//! | envd ready | `/health` | `/health` | `/health` |
//! | workload cgroup | `Runtime::confine_workload` | same | same |
//! | `/init` | always | only after a fresh boot | always (new identity), presenting the old token if memory came back |
//! | row | insert | mark resumed | insert |
//! | event | `created` | `resumed` | `created` |
//!
//! A failure after the runtime started anything undoes it: a new sandbox is removed
//! from the runtime; a resumed one is killed and recorded killed, because a
//! half-resumed sandbox is worse than a gone one.

use berth_api::{LogLevel, StringMap};
use berth_net::NetworkPolicy;
use berth_runtime::{SandboxInfo, SandboxSpec};
use berth_store::{Lifecycle, SandboxRecord, SandboxStatus};
use time::OffsetDateTime;

use super::{blocking, kill_in_runtime, load_template, log};
use crate::envd::{self, InitRequest};
use crate::error::{ServiceError, Stage};
use crate::{events, AppState, SharedState, ENVD_VERSION};

/// How the runtime brings the sandbox's root, disk and processes up.
pub(super) enum Boot {
    /// A new sandbox on a template's layers, under `network` (`None`: the default
    /// policy, or none at all where the runtime has no networking).
    Fresh {
        spec: SandboxSpec,
        network: Option<NetworkPolicy>,
    },
    /// The paused sandbox itself: its processes from memory, or (`keep_memory` false or
    /// none kept) a fresh init on its kept disk.
    Resume { keep_memory: bool },
    /// A new sandbox from a checkpoint: from its memory, or a fresh init on its disk.
    /// With `network`, that policy replaces the checkpoint's right after the restore (a
    /// template's start-command checkpoint carries its build sandbox's).
    Restore {
        checkpoint_id: String,
        memory: bool,
        network: Option<NetworkPolicy>,
    },
    /// A sandbox taken from a warm pool (started, envd never initialised), given
    /// `network` when the create asks for one.
    Claimed {
        info: Box<SandboxInfo>,
        network: Option<NetworkPolicy>,
    },
}

impl Boot {
    fn stage(&self) -> Stage {
        match self {
            Boot::Fresh { .. } | Boot::Claimed { .. } => Stage::Create,
            Boot::Resume { .. } => Stage::Resume,
            Boot::Restore { .. } => Stage::Restore,
        }
    }
}

/// What envd is told once it answers: the template's defaults, the sandbox's env vars
/// and identity, its access token.
pub(super) struct Init {
    /// The template store manifest whose defaults (user, workdir, env) the envd
    /// starts with.
    pub manifest_id: String,
    /// That manifest, when the entry point has it loaded already (a create).
    pub manifest: Option<berth_template::Template>,
    pub env_vars: StringMap,
    pub access_token: Option<String>,
    /// The token an envd restored from memory already holds: it only takes a new
    /// `/init` from someone presenting it.
    pub presented_token: Option<String>,
    /// An envd restored from memory of the same sandbox needs nothing (resume); one
    /// restored into a new identity does (fork, snapshot start).
    pub after_memory_restore: bool,
}

/// What the store records about a new sandbox (id, resources and times come from the
/// pipeline).
pub(super) struct NewRow {
    pub team_id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub build_id: String,
    pub metadata: StringMap,
    pub allow_internet_access: Option<bool>,
    pub timeout_secs: i64,
    pub lifecycle: Lifecycle,
    /// The policy the runtime enforces (recorded for the API; `None`: the default).
    pub network: Option<NetworkPolicy>,
    pub traffic_access_token: Option<String>,
    pub volume_mounts: Vec<berth_store::VolumeMountRecord>,
    /// The snapshot it starts from, if any (kept from retention while it lives).
    pub from_snapshot: Option<String>,
}

/// The row stage: a new row, or the paused row back to running.
pub(super) enum Row {
    Insert(Box<NewRow>),
    Resumed {
        record: Box<SandboxRecord>,
        timeout_secs: i64,
    },
}

/// One run of the pipeline, besides its [`Boot`].
pub(super) struct BringUp {
    pub id: String,
    pub init: Init,
    pub row: Row,
    /// The sandbox log line written once it runs (a resume's says how it came back).
    pub log_line: String,
}

/// What the runtime start stage produced.
struct Started {
    info: SandboxInfo,
    memory_restored: bool,
}

/// Run the pipeline; the sandbox is running, initialised and recorded when it returns.
pub(super) async fn bring_up(
    state: &SharedState,
    boot: Boot,
    plan: BringUp,
) -> Result<SandboxRecord, ServiceError> {
    let stage = boot.stage();
    // A pooled sandbox answered `/health` when it was prepared; `/init` proves it still
    // does.
    let envd_answered = matches!(boot, Boot::Claimed { .. });
    let started = start_in_runtime(state, &plan.id, boot).await?;
    let ready = initialise(
        state,
        &plan.id,
        stage,
        &plan.init,
        started.memory_restored,
        envd_answered,
    )
    .await;
    if let Err(err) = ready {
        abandon(state, &plan.id, &plan.row).await;
        return Err(err);
    }
    let is_new = matches!(plan.row, Row::Insert(_));
    let record = match record(state, &plan, &started) {
        Ok(record) => record,
        Err(err) => {
            abandon(state, &plan.id, &plan.row).await;
            return Err(err);
        }
    };
    let log_line = match (is_new, started.memory_restored) {
        (true, _) => plan.log_line,
        (false, true) => format!("{}, processes continue from memory", plan.log_line),
        (false, false) => format!("{}, booted afresh on its kept disk", plan.log_line),
    };
    announce(state, &record, &log_line, is_new);
    Ok(record)
}

/// Root and disk, then the processes: whatever the entry point's boot asks of the
/// runtime. On failure the runtime has left nothing (or, for resume, the paused state).
async fn start_in_runtime(state: &AppState, id: &str, boot: Boot) -> Result<Started, ServiceError> {
    let stage = boot.stage();
    let runtime = state.runtime.clone();
    let owned = id.to_string();
    let started = blocking(id, stage, move || match boot {
        Boot::Fresh { spec, network } => {
            let created = match &network {
                Some(policy) => runtime.create_with_network(&spec, policy),
                None => runtime.create(&spec),
            };
            created.map(|info| Started {
                info,
                memory_restored: false,
            })
        }
        Boot::Resume { keep_memory } => {
            runtime.resume(&owned, keep_memory).map(|resumed| Started {
                info: resumed.info,
                memory_restored: resumed.memory_restored,
            })
        }
        Boot::Restore {
            checkpoint_id,
            memory,
            network,
        } => runtime
            .restore(&checkpoint_id, &owned, memory)
            .and_then(|info| {
                if let Some(policy) = &network {
                    if let Err(err) = runtime.set_network_policy(&owned, policy) {
                        // Nothing may run under a policy the caller did not ask for.
                        let _ = runtime.kill(&owned);
                        return Err(err);
                    }
                }
                Ok(Started {
                    info,
                    memory_restored: memory,
                })
            }),
        Boot::Claimed { info, network } => {
            if let Some(policy) = &network {
                runtime.set_network_policy(&owned, policy)?;
            }
            Ok(Started {
                info: *info,
                memory_restored: false,
            })
        }
    })
    .await?;
    Ok(started)
}

/// The envd-ready and `/init` stages; `/init` is skipped for an envd that came back from
/// its own memory.
async fn initialise(
    state: &AppState,
    id: &str,
    stage: Stage,
    init: &Init,
    memory_restored: bool,
    envd_answered: bool,
) -> Result<(), ServiceError> {
    let envd_failed = |source| ServiceError::Envd {
        sandbox: id.to_string(),
        stage,
        source,
    };
    if !envd_answered {
        envd::wait_healthy(&state.runtime, &state.connections, id, envd::READY_LIMIT)
            .await
            .map_err(envd_failed)?;
    }
    let runtime = state.runtime.clone();
    let sandbox = id.to_string();
    blocking(id, stage, move || runtime.confine_workload(&sandbox)).await?;
    if memory_restored && !init.after_memory_restore {
        return Ok(());
    }
    let template = match &init.manifest {
        Some(template) => template.clone(),
        None => load_template(state, &init.manifest_id).await?,
    };
    let request = init_request(&template, &init.env_vars, id, init.access_token.clone());
    let presented = init.presented_token.as_deref().filter(|_| memory_restored);
    envd::init(&state.runtime, &state.connections, id, &request, presented)
        .await
        .map_err(envd_failed)
}

/// What envd's `/init` gets for sandbox `id`: the template's env vars, the caller's, and
/// E2B's own, plus the template's default user and workdir.
fn init_request(
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

/// The row stage.
fn record(
    state: &AppState,
    plan: &BringUp,
    started: &Started,
) -> Result<SandboxRecord, ServiceError> {
    let now = OffsetDateTime::now_utc();
    match &plan.row {
        Row::Insert(row) => {
            let spec = &started.info.spec;
            let record = SandboxRecord {
                id: plan.id.clone(),
                team_id: row.team_id.clone(),
                template_id: row.template_id.clone(),
                alias: row.alias.clone(),
                build_id: row.build_id.clone(),
                cpu_count: spec.cpu_count,
                memory_mb: spec.memory_mb,
                disk_size_mb: spec.disk_size_mb,
                metadata: row.metadata.clone(),
                envd_version: ENVD_VERSION.into(),
                envd_access_token: plan.init.access_token.clone(),
                allow_internet_access: row.allow_internet_access,
                started_at: now,
                end_at: now + time::Duration::seconds(row.timeout_secs),
                status: SandboxStatus::Running,
                env_vars: plan.init.env_vars.clone(),
                timeout_secs: row.timeout_secs,
                lifecycle: row.lifecycle,
                network: row
                    .network
                    .as_ref()
                    .and_then(|policy| serde_json::to_value(policy).ok()),
                traffic_access_token: row.traffic_access_token.clone(),
                volume_mounts: row.volume_mounts.clone(),
                execution_id: new_execution_id(),
                from_snapshot: row.from_snapshot.clone(),
            };
            crate::cluster::node::place_here(state, berth_store::PlacedKind::Sandbox, &plan.id)?;
            state.store.insert_sandbox(&record)?;
            Ok(record)
        }
        Row::Resumed {
            record,
            timeout_secs,
        } => {
            let end_at = now + time::Duration::seconds(*timeout_secs);
            let execution_id = new_execution_id();
            state.store.mark_resumed(&plan.id, end_at, &execution_id)?;
            let mut record = (**record).clone();
            record.status = SandboxStatus::Running;
            record.end_at = end_at;
            record.execution_id = execution_id;
            Ok(record)
        }
    }
}

/// A new execution id (a UUID, as E2B's are): each start and resume is one execution.
pub(crate) fn new_execution_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The event stage: log line, lifecycle event, reaper and metrics told.
fn announce(state: &SharedState, record: &SandboxRecord, log_line: &str, is_new: bool) {
    log(state, &record.id, LogLevel::Info, log_line);
    let event = if is_new {
        events::CREATED
    } else {
        events::RESUMED
    };
    events::record(state, record, event, None);
    state.reaper_wakeup.notify_one();
    crate::metrics::sample_soon(state.clone(), record.id.clone());
}

/// Undo a bring-up that failed after the runtime started the sandbox.
async fn abandon(state: &AppState, id: &str, row: &Row) {
    if let Err(err) = kill_in_runtime(state, id).await {
        tracing::error!(sandbox = %id, error = %crate::error::error_chain(&err), "removing a sandbox whose start failed");
    }
    if let Row::Resumed { record, .. } = row {
        match state.store.mark_killed(id) {
            Ok(true) => events::record(state, record, events::KILLED, None),
            Ok(false) => {}
            Err(err) => tracing::error!(sandbox = %id, %err, "recording a failed resume"),
        }
    }
}
