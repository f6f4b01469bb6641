//! The template service: names and who may use them, builds (request, COPY uploads,
//! start, progress, the end of a build recorded in the store), tags, deletion with the
//! files it frees, and what a sandbox of a template starts from.
//!
//! **Ownership.** A template row belongs to a team or, with no team, is installed on this
//! host (`base`, `code-interpreter-v1`: the template store's manifests that are not
//! builds, synced into the store at start). Installed templates and a team's own are
//! visible to it; another team's template only when public, and only to use (create
//! from, build on); everything else is answered as missing.
//!
//! **Builds.** `POST /v3/templates` records a waiting build; `POST
//! /v2/templates/{id}/builds/{bid}` hands it to [`berth_build::BuildEngine`], which runs
//! it on its own threads (bounded, surviving client disconnects, cancellable), and a
//! watcher task records the end in the store: ready builds get their tags in the same
//! transaction. A build's result is the template store manifest `build-<build id>`; a
//! sandbox names its build, so rebuilding never changes running sandboxes. At start,
//! builds the store says are building are finished from the engine's record or marked
//! failed (interrupted).
//!
//! **Deletion** refuses a template that running or paused sandboxes or snapshots use,
//! then removes its rows, its manifests and start-command checkpoints, and the layers
//! nothing else names, once no build is running (a running build may just have
//! committed a layer it shares).

pub mod host;
pub mod names;
mod uploads;

use std::sync::Arc;
use std::time::Duration;

use berth_build::{BuildEngine, BuildFailure, BuildState, E2bBuildStart, E2bRegistry, Step};
use berth_store::{
    BuildReason, InstalledTemplate, NewTemplateBuild, Team, TemplateBuildRecord,
    TemplateBuildStatus, TemplateRecord,
};
use berth_template::LayerId;
use parking_lot::Mutex;
use time::OffsetDateTime;

use crate::error::ServiceError;
use crate::sandboxes::{build_id as installed_build_id, load_template};
use crate::{AppState, SandboxResources, ENVD_VERSION};

pub use names::{
    parse_name, snapshot_full_name, snapshot_name, team_slug, validate_tags, NameError,
    TemplateName,
};
pub(crate) use uploads::{upload_handler, upload_url, UPLOAD_ROUTE};

/// Longest one blocking wait of a build watcher.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Manifests written by builds are named `build-<build id>`; the others are installed.
const BUILD_MANIFEST_PREFIX: &str = "build-";

/// The SDKs' default base image (`Template()` without a `from_*`, `from_base_image()`):
/// E2B's base template, which on berth is `base`.
const E2B_BASE_IMAGES: [&str; 2] = ["e2bdev/base", "docker.io/e2bdev/base"];

/// The most a template may ask for; requests above are refused.
#[derive(Debug, Clone, Copy)]
pub struct TemplateLimits {
    pub max_cpu_count: u32,
    pub max_memory_mb: u64,
    pub max_disk_size_mb: u64,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        TemplateLimits {
            max_cpu_count: 8,
            max_memory_mb: 16 * 1024,
            max_disk_size_mb: 64 * 1024,
        }
    }
}

/// The build side of the server: the engine, the key that signs upload URLs, and the
/// layers of deleted templates waiting until no build runs.
pub(crate) struct Builds {
    pub engine: BuildEngine,
    upload_key: ring::hmac::Key,
    pending_layers: Mutex<Vec<LayerId>>,
    /// Held while a host template is checked or built: one such build at a time.
    host_builds: tokio::sync::Mutex<()>,
}

impl Builds {
    pub fn new(engine: BuildEngine) -> Builds {
        let seed: [u8; 32] = rand::random();
        Builds {
            engine,
            upload_key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &seed),
            pending_layers: Mutex::new(Vec::new()),
            host_builds: tokio::sync::Mutex::new(()),
        }
    }
}

/// How the caller relates to a template it can see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Owner,
    Installed,
    /// Another team's public template: usable, not changeable.
    Public,
}

/// A template the caller can see, and how.
pub(crate) struct Visible {
    pub record: TemplateRecord,
    pub access: Access,
}

fn access(team: &Team, record: &TemplateRecord) -> Option<Access> {
    match &record.team_id {
        None => Some(Access::Installed),
        Some(owner) if *owner == team.id => Some(Access::Owner),
        Some(_) if record.public => Some(Access::Public),
        Some(_) => None,
    }
}

/// Runs blocking store / template store work off the async threads.
async fn blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, ServiceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|source| ServiceError::Task { what, source })?
}

fn builds(state: &AppState) -> Result<&Builds, ServiceError> {
    state.builds.as_ref().ok_or(ServiceError::BuildsUnavailable)
}

/// The team of id `team_id`.
pub(crate) fn team(state: &AppState, team_id: &str) -> Result<Team, ServiceError> {
    state
        .store
        .teams()?
        .into_iter()
        .find(|t| t.id == team_id)
        .ok_or_else(|| ServiceError::TemplateNotFound(format!("(team {team_id})")))
}

/// The template `name` means for `team`, if the team may see it: `namespace/alias` in
/// that namespace; a bare alias in the team's namespace, then among installed templates,
/// then as a template id.
pub(crate) fn find(
    state: &AppState,
    team: &Team,
    name: &TemplateName,
) -> Result<Option<Visible>, ServiceError> {
    let store = &state.store;
    let slug = team_slug(&team.name);
    let candidate = match &name.namespace {
        Some(namespace) if *namespace == slug => {
            store.template_by_alias(Some(&team.id), &name.alias)?
        }
        Some(namespace) => match store
            .teams()?
            .into_iter()
            .find(|t| team_slug(&t.name) == *namespace)
        {
            Some(owner) => store.template_by_alias(Some(&owner.id), &name.alias)?,
            None => None,
        },
        None => match store.template_by_alias(Some(&team.id), &name.alias)? {
            Some(own) => Some(own),
            None => match store.template_by_alias(None, &name.alias)? {
                Some(installed) => Some(installed),
                None => store.template(&name.alias)?,
            },
        },
    };
    Ok(candidate.and_then(|record| access(team, &record).map(|access| Visible { record, access })))
}

/// Like [`find`], but the template must be the caller's own or installed (what the
/// management routes show); anything else is answered as missing.
pub(crate) fn find_manageable(
    state: &AppState,
    team: &Team,
    reference: &str,
) -> Result<Visible, ServiceError> {
    let name = parse_name(reference).map_err(ServiceError::InvalidName)?;
    match find(state, team, &name)? {
        Some(v) if v.access != Access::Public => Ok(v),
        _ => Err(ServiceError::TemplateNotFound(reference.to_string())),
    }
}

/// Like [`find`], but only the caller's own templates (what may be changed).
pub(crate) fn find_owned(
    state: &AppState,
    team: &Team,
    reference: &str,
) -> Result<TemplateRecord, ServiceError> {
    let visible = find_manageable(state, team, reference)?;
    match visible.access {
        Access::Owner => Ok(visible.record),
        _ => Err(ServiceError::TemplateNotOwned(reference.to_string())),
    }
}

/// E2B's `names`: `namespace/alias` for a team's template, the alias for installed ones.
pub(crate) fn names_of(team: &Team, record: &TemplateRecord) -> Vec<String> {
    match &record.team_id {
        Some(_) => vec![format!("{}/{}", team_slug(&team.name), record.alias)],
        None => vec![record.alias.clone()],
    }
}

/// The manifest a sandbox of build `build_id` stands on (its layers, and the defaults
/// its envd starts with): that build's ([`manifest_reference`]), or for rows from
/// before builds were recorded, the template's current one.
pub(crate) fn manifest_of(
    state: &AppState,
    template_id: &str,
    build_id: &str,
) -> Result<String, ServiceError> {
    Ok(match state.store.template_build_by_id(build_id)? {
        Some(build) => manifest_reference(&build),
        None => template_id.to_string(),
    })
}

/// The template store's name for exactly build `build`. A build's own manifest
/// (`build-<id>`) never changes; an installed template's manifest is rewritten when it
/// is rebuilt, so its build is named by its pinned reference, which keeps naming the
/// layers that build's sandboxes, pauses and snapshots stand on.
pub(crate) fn manifest_reference(build: &TemplateBuildRecord) -> String {
    if build.manifest_id.starts_with(BUILD_MANIFEST_PREFIX) || build.manifest_id.contains('@') {
        build.manifest_id.clone()
    } else {
        berth_template::pinned_reference(&build.manifest_id, &build.id)
    }
}

/// What a new sandbox of a template starts from.
pub(crate) struct SandboxTemplate {
    pub template_id: String,
    /// Reported as the sandbox's alias.
    pub alias: String,
    pub build_id: String,
    pub manifest: berth_template::Template,
    pub resources: SandboxResources,
    /// Env vars berth gives its sandboxes besides the manifest's (a host template's).
    pub envs: berth_api::StringMap,
}

/// The template (and build, by the name's tag) a sandbox of `reference` starts from,
/// for team `team_id`.
pub(crate) async fn for_sandbox(
    state: &Arc<AppState>,
    team_id: &str,
    reference: &str,
) -> Result<SandboxTemplate, ServiceError> {
    let name = parse_name(reference).map_err(ServiceError::InvalidName)?;
    let team = team(state, team_id)?;
    let visible = match find(state, &team, &name)? {
        Some(visible) => visible,
        // A host template not built yet is built now; the create waits for it.
        None if name.namespace.is_none() && host::find(state, &name.alias).is_some() => {
            host::ensure_built(state, &name.alias, |entry| {
                tracing::info!(template = %name.alias, step = ?entry.step, "{}", entry.message)
            })
            .await?;
            find(state, &team, &name)?
                .ok_or_else(|| ServiceError::TemplateNotFound(reference.to_string()))?
        }
        None => return Err(ServiceError::TemplateNotFound(reference.to_string())),
    };
    let tag = name.tag_or_default().to_string();
    let build = state
        .store
        .template_build_by_tag(&visible.record.id, &tag)?
        .ok_or_else(|| ServiceError::TagNotFound {
            template: reference.to_string(),
            tag: tag.clone(),
        })?;
    if visible.record.team_id.is_some() {
        crate::cluster::node::ensure_build(state, &visible.record.id, &manifest_reference(&build))
            .await?;
    }
    let manifest = load_template(state, &manifest_reference(&build))
        .await
        .map_err(|err| match err {
            ServiceError::TemplateNotFound(_) => ServiceError::TemplateNotFound(reference.into()),
            other => other,
        })?;
    let envs = match visible.access {
        Access::Installed => host::find(state, &visible.record.alias)
            .map(|host| host.sandbox_envs.clone())
            .unwrap_or_default(),
        Access::Owner | Access::Public => berth_api::StringMap::new(),
    };
    let resources = match visible.access {
        Access::Installed => installed_resources(state, &visible.record.alias),
        Access::Owner | Access::Public => SandboxResources {
            cpu_count: build.cpu_count,
            memory_mb: build.memory_mb,
            disk_size_mb: build.disk_size_mb,
        },
    };
    Ok(SandboxTemplate {
        template_id: visible.record.id.clone(),
        alias: match &name.namespace {
            Some(namespace) => format!("{namespace}/{}", name.alias),
            None => name.alias.clone(),
        },
        build_id: build.id,
        manifest,
        resources,
        envs,
    })
}

/// Limits of sandboxes of installed template `name`: a host template's own, else the
/// server's defaults.
fn installed_resources(state: &AppState, name: &str) -> SandboxResources {
    host::find(state, name).map_or(state.config.resources, |t| t.resources)
}

/// Counts a sandbox started from `template_id`; failures are only traced.
pub(crate) fn record_spawn(state: &AppState, template_id: &str) {
    if let Err(err) = state.store.record_template_spawn(template_id) {
        tracing::warn!(template = %template_id, %err, "counting a template spawn");
    }
}

/// What `POST /v3/templates` asks for, validated.
pub(crate) struct BuildRequestInput {
    pub name: String,
    pub tags: Vec<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    pub min_free_disk_mb: Option<u64>,
}

/// The resources of a new build: requested or the server's defaults, within the
/// operator's maximums.
fn build_resources(
    state: &AppState,
    input: &BuildRequestInput,
) -> Result<SandboxResources, ServiceError> {
    let defaults = state.config.resources;
    let limits = state.config.template_limits;
    let cpu_count = input.cpu_count.unwrap_or(defaults.cpu_count);
    let memory_mb = input.memory_mb.unwrap_or(defaults.memory_mb);
    let disk_size_mb = input
        .min_free_disk_mb
        .map_or(defaults.disk_size_mb, |free| {
            free.max(defaults.disk_size_mb)
        });
    let checks = [
        (
            "cpuCount",
            u64::from(cpu_count),
            1,
            u64::from(limits.max_cpu_count),
        ),
        ("memoryMB", memory_mb, 128, limits.max_memory_mb),
        ("minFreeDiskMb", disk_size_mb, 64, limits.max_disk_size_mb),
    ];
    for (what, value, min, max) in checks {
        if value < min || value > max {
            return Err(ServiceError::ResourceOutOfRange {
                what,
                value,
                min,
                max,
            });
        }
    }
    if !memory_mb.is_multiple_of(2) {
        return Err(ServiceError::ResourceOutOfRange {
            what: "memoryMB (an even number)",
            value: memory_mb,
            min: 128,
            max: limits.max_memory_mb,
        });
    }
    Ok(SandboxResources {
        cpu_count,
        memory_mb,
        disk_size_mb,
    })
}

/// `POST /v3/templates`: the team's template of that name (made if new) gets a waiting
/// build. Returns the template, the build and the tags it will get.
pub(crate) async fn request_build(
    state: &Arc<AppState>,
    team: &Team,
    input: BuildRequestInput,
) -> Result<(TemplateRecord, TemplateBuildRecord), ServiceError> {
    builds(state)?;
    let name = parse_name(&input.name).map_err(ServiceError::InvalidName)?;
    name.require_namespace(&team_slug(&team.name))
        .map_err(ServiceError::InvalidName)?;
    let mut tags: Vec<&str> = name.tag.iter().map(String::as_str).collect();
    tags.extend(input.tags.iter().map(String::as_str));
    let mut tags = validate_tags(tags).map_err(ServiceError::InvalidName)?;
    if tags.is_empty() {
        tags.push(berth_store::DEFAULT_TAG.to_string());
    }
    let resources = build_resources(state, &input)?;
    let build_id = uuid::Uuid::new_v4().to_string();
    let request = NewTemplateBuild {
        team_id: team.id.clone(),
        alias: name.alias,
        new_template_id: new_template_id(),
        manifest_id: format!("{BUILD_MANIFEST_PREFIX}{build_id}"),
        build_id,
        tags,
        cpu_count: resources.cpu_count,
        memory_mb: resources.memory_mb,
        disk_size_mb: resources.disk_size_mb,
        envd_version: ENVD_VERSION.into(),
    };
    let store = state.store.clone();
    let (template, build) = blocking("requesting a template build", move || {
        Ok(store.request_template_build(&request)?)
    })
    .await?;
    // A template's builds, layers and step cache stay on one node.
    crate::cluster::node::place_here(state, berth_store::PlacedKind::Build, &template.id)?;
    Ok((template, build))
}

/// A template id as E2B makes them: 20 characters of `[a-z0-9]`.
fn new_template_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..20)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The caller's build `build_id` of template `template`.
pub(crate) fn owned_build(
    state: &AppState,
    team: &Team,
    template: &str,
    build_id: &str,
) -> Result<(TemplateRecord, TemplateBuildRecord), ServiceError> {
    let record = find_owned(state, team, template)?;
    let build = state
        .store
        .template_build(&record.id, build_id)?
        .ok_or_else(|| ServiceError::BuildNotFound {
            template: template.to_string(),
            build: build_id.to_string(),
        })?;
    Ok((record, build))
}

/// Where a build's base comes from, as the engine takes it: a template the caller may
/// use becomes its build's manifest; E2B's base image is `base`.
fn resolve_base(
    state: &AppState,
    team: &Team,
    body: &mut berth_api::TemplateBuildStartV2,
) -> Result<(), ServiceError> {
    if body.from_template.is_none() {
        if let Some(image) = &body.from_image {
            let repository = image.split(['@', ':']).next().unwrap_or(image);
            if E2B_BASE_IMAGES.contains(&repository) {
                body.from_template = Some(berth_template::BASE_TEMPLATE_ID.into());
                body.from_image = None;
            }
        }
    }
    let Some(reference) = body.from_template.clone() else {
        return Ok(());
    };
    let name = parse_name(&reference).map_err(ServiceError::InvalidName)?;
    let visible = find(state, team, &name)?
        .ok_or_else(|| ServiceError::TemplateNotFound(reference.clone()))?;
    let tag = name.tag_or_default();
    let build = state
        .store
        .template_build_by_tag(&visible.record.id, tag)?
        .ok_or_else(|| ServiceError::TagNotFound {
            template: reference.clone(),
            tag: tag.to_string(),
        })?;
    body.from_template = Some(build.manifest_id);
    Ok(())
}

fn engine_body(body: berth_api::TemplateBuildStartV2) -> E2bBuildStart {
    E2bBuildStart {
        from_image: body.from_image,
        from_template: body.from_template,
        from_image_registry: body.from_image_registry.map(|registry| match registry {
            berth_api::FromImageRegistry::Registry { username, password } => {
                E2bRegistry::Registry { username, password }
            }
            berth_api::FromImageRegistry::Aws { .. } => E2bRegistry::Aws {},
            berth_api::FromImageRegistry::Gcp { .. } => E2bRegistry::Gcp {},
        }),
        steps: body
            .steps
            .into_iter()
            .map(|step| Step {
                kind: step.kind,
                args: step.args,
                files_hash: step.files_hash,
                force: step.force,
                force_upload: step.force_upload,
            })
            .collect(),
        start_cmd: body.start_cmd,
        ready_cmd: body.ready_cmd,
        force: body.force,
    }
}

/// `POST /v2/templates/{id}/builds/{bid}`: starts the caller's waiting build.
pub(crate) async fn start_build(
    state: &Arc<AppState>,
    team: &Team,
    template: &str,
    build_id: &str,
    mut body: berth_api::TemplateBuildStartV2,
) -> Result<(), ServiceError> {
    let builds = builds(state)?;
    let (_, build) = owned_build(state, team, template, build_id)?;
    if build.status != TemplateBuildStatus::Waiting {
        return Err(ServiceError::BuildNotWaiting(build_id.to_string()));
    }
    resolve_base(state, team, &mut body)?;
    let request = engine_body(body).into_request(
        &build.id,
        &build.manifest_id,
        &team.id,
        (build.cpu_count, build.memory_mb, build.disk_size_mb),
    );
    if !state.store.start_template_build(&build.id)? {
        return Err(ServiceError::BuildNotWaiting(build_id.to_string()));
    }
    if let Err(err) = builds.engine.start(request) {
        let reason = BuildReason {
            message: err.to_string(),
            step: err.step_name().map(str::to_string),
        };
        state.store.fail_template_build(&build.id, &reason)?;
        return Err(ServiceError::Build(err));
    }
    watch(state.clone(), build.id);
    Ok(())
}

/// Records the end of build `build_id` in the store when the engine finishes it.
pub(crate) fn watch(state: Arc<AppState>, build_id: String) {
    tokio::spawn(async move {
        let Some(builds) = state.builds.as_ref() else {
            return;
        };
        let status = loop {
            let engine = builds.engine.clone();
            let id = build_id.clone();
            // Short waits: a blocking task holds up the runtime's shutdown until it ends.
            let waited =
                tokio::task::spawn_blocking(move || engine.wait(&id, WATCH_INTERVAL)).await;
            match waited {
                Ok(Some(status))
                    if matches!(status.state, BuildState::Ready | BuildState::Error) =>
                {
                    break Some(status)
                }
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break None,
            }
        };
        let failure = BuildFailure {
            message: "the build's record is gone".into(),
            step: None,
        };
        if let Some(status) = &status {
            let took_ms = status
                .finished_at_ms
                .unwrap_or(status.created_at_ms)
                .saturating_sub(status.created_at_ms);
            state
                .prometheus
                .build_finished(status.state == BuildState::Ready, took_ms as f64 / 1000.0);
        }
        let result = match status {
            Some(status) if status.state == BuildState::Ready => {
                state.store.finish_template_build(&build_id).map(drop)
            }
            Some(status) => {
                let reason = status.reason.unwrap_or(failure);
                state
                    .store
                    .fail_template_build(
                        &build_id,
                        &BuildReason {
                            message: reason.message,
                            step: reason.step,
                        },
                    )
                    .map(drop)
            }
            None => state
                .store
                .fail_template_build(
                    &build_id,
                    &BuildReason {
                        message: failure.message,
                        step: None,
                    },
                )
                .map(drop),
        };
        if let Err(err) = result {
            tracing::error!(build = %build_id, %err, "recording the end of a template build");
        }
        collect_garbage(&state).await;
    });
}

/// The engine's view of build `build_id` (None: it never reached the engine).
pub(crate) fn engine_status(state: &AppState, build_id: &str) -> Option<berth_build::BuildStatus> {
    state.builds.as_ref()?.engine.status(build_id)
}

/// Log entries of build `build_id`, all of them (the engine keeps them per build).
pub(crate) fn build_logs(state: &AppState, build_id: &str) -> Vec<berth_build::LogEntry> {
    match state.builds.as_ref() {
        Some(builds) => builds.engine.logs(build_id, 0, usize::MAX),
        None => Vec::new(),
    }
}

/// Cancels the caller's running build.
pub(crate) fn cancel_build(
    state: &AppState,
    team: &Team,
    template: &str,
    build_id: &str,
) -> Result<(), ServiceError> {
    let builds = builds(state)?;
    owned_build(state, team, template, build_id)?;
    builds.engine.cancel(build_id).map_err(ServiceError::Build)
}

/// `DELETE /templates/{id}`: the caller's template, when nothing uses it.
pub(crate) async fn delete(
    state: &Arc<AppState>,
    team: &Team,
    reference: &str,
) -> Result<(), ServiceError> {
    let record = find_owned(state, team, reference)?;
    let (sandboxes, snapshots) = state.store.template_users(&record.id)?;
    if sandboxes > 0 || snapshots > 0 {
        return Err(ServiceError::TemplateInUse {
            template: reference.to_string(),
            sandboxes,
            snapshots,
        });
    }
    if let Some(builds) = state.builds.as_ref() {
        let unfinished = state.store.unfinished_template_builds()?;
        for build in unfinished.iter().filter(|b| b.template_id == record.id) {
            // Its engine record ends as "build cancelled"; the rows go below.
            let _ = builds.engine.cancel(&build.id);
        }
    }
    let removed = state.store.delete_template(&record.id)?;
    // Warm sandboxes of its builds hold their layers: they go first.
    for build in &removed {
        crate::sandboxes::pool::drain(state, Some(&build.manifest_id)).await;
    }
    remove_build_files(state, removed).await?;
    collect_garbage(state).await;
    Ok(())
}

/// Removes the manifests and checkpoints of `removed` builds, and queues their layers
/// for [`collect_garbage`].
async fn remove_build_files(
    state: &Arc<AppState>,
    removed: Vec<TemplateBuildRecord>,
) -> Result<(), ServiceError> {
    let templates = state.templates.clone();
    let runtime = state.runtime.clone();
    let layers = blocking("removing template files", move || {
        let mut layers = Vec::new();
        for build in removed {
            if !build.manifest_id.starts_with(BUILD_MANIFEST_PREFIX) {
                continue;
            }
            let manifest = match templates.get(&build.manifest_id) {
                Ok(manifest) => manifest,
                Err(_) => continue,
            };
            if let Err(err) = templates.remove(&build.manifest_id) {
                tracing::warn!(manifest = %build.manifest_id, %err, "removing a template manifest");
                continue;
            }
            if let Some(checkpoint) = &manifest.checkpoint {
                if let Err(err) = runtime.delete_checkpoint(checkpoint) {
                    tracing::warn!(%checkpoint, %err, "removing a template checkpoint");
                }
            }
            layers.extend(manifest.layer_ids);
        }
        Ok(layers)
    })
    .await?;
    if let Some(builds) = state.builds.as_ref() {
        builds.pending_layers.lock().extend(layers);
    }
    Ok(())
}

/// Deletes queued layers that no manifest names, unless a build is running (it may
/// have just committed one of them for a manifest it has not written yet).
async fn collect_garbage(state: &Arc<AppState>) {
    let Some(builds) = state.builds.as_ref() else {
        return;
    };
    if builds.engine.active_builds() > 0 {
        return;
    }
    let candidates = std::mem::take(&mut *builds.pending_layers.lock());
    if candidates.is_empty() {
        return;
    }
    let templates = state.templates.clone();
    let result = blocking("removing template layers", move || {
        templates
            .remove_layers_if_unreferenced(&candidates)
            .map_err(ServiceError::TemplateListing)
    })
    .await;
    match result {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(layers = removed.len(), "removed layers no template uses")
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(%err, "removing unused template layers"),
    }
}

/// Removes the superseded builds of installed templates (see `TemplateStore::put`)
/// that no running or paused sandbox and no snapshot was made from, then the layers
/// only they used (their checkpoints go with the unreferenced ones in [`recover`]). At
/// start only, before anything is served: no create can be on its way from one then.
async fn remove_unused_superseded(state: &Arc<AppState>) -> Result<(), ServiceError> {
    let templates = state.templates.clone();
    let store = state.store.clone();
    let layers = blocking("removing superseded template builds", move || {
        let mut layers = Vec::new();
        for build in templates.superseded().map_err(ServiceError::TemplateListing)? {
            let version = build.version();
            if store.template_build_users(&build.id, &version)? != (0, 0) {
                continue;
            }
            templates
                .remove_superseded(&build.id, &version)
                .map_err(ServiceError::TemplateListing)?;
            tracing::info!(template = %build.id, build = %version, "removed a superseded build nothing uses");
            layers.extend(build.layer_ids);
        }
        Ok(layers)
    })
    .await?;
    if let Some(builds) = state.builds.as_ref() {
        builds.pending_layers.lock().extend(layers);
    }
    collect_garbage(state).await;
    Ok(())
}

/// At start: installed templates synced from the template store; builds the store says
/// are building finished from the engine's record, or marked failed; checkpoints of
/// templates that are gone deleted.
pub(crate) async fn recover(state: &Arc<AppState>) -> Result<(), ServiceError> {
    sync_installed(state).await?;
    remove_unused_superseded(state).await?;
    let unfinished = crate::cluster::node::only_mine(
        state,
        berth_store::PlacedKind::Build,
        state.store.unfinished_template_builds()?,
        |build| build.template_id.as_str(),
    )?;
    for build in unfinished {
        if build.status == TemplateBuildStatus::Waiting {
            continue;
        }
        match engine_status(state, &build.id) {
            Some(status) if status.state == BuildState::Ready => {
                state.store.finish_template_build(&build.id)?;
            }
            Some(status) if matches!(status.state, BuildState::Waiting | BuildState::Building) => {
                watch(state.clone(), build.id.clone());
            }
            Some(status) => {
                let reason = status.reason.unwrap_or(BuildFailure {
                    message: berth_build::BuildError::Interrupted.to_string(),
                    step: None,
                });
                state.store.fail_template_build(
                    &build.id,
                    &BuildReason {
                        message: reason.message,
                        step: reason.step,
                    },
                )?;
            }
            None => {
                state.store.fail_template_build(
                    &build.id,
                    &BuildReason {
                        message: berth_build::BuildError::Interrupted.to_string(),
                        step: None,
                    },
                )?;
            }
        }
    }
    if let Some(builds) = state.builds.as_ref() {
        let engine = builds.engine.clone();
        let removed = tokio::task::spawn_blocking(move || engine.remove_unreferenced_checkpoints())
            .await
            .map_err(|source| ServiceError::Task {
                what: "removing stale template checkpoints",
                source,
            })?;
        match removed {
            Ok(ids) if !ids.is_empty() => {
                tracing::info!(checkpoints = ?ids, "removed checkpoints of templates that are gone")
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "removing stale template checkpoints"),
        }
    }
    Ok(())
}

/// The store's installed templates made to match the template store's manifests that
/// are not builds.
pub(crate) async fn sync_installed(state: &Arc<AppState>) -> Result<(), ServiceError> {
    let templates = state.templates.clone();
    let store = state.store.clone();
    let defaults = state.config.resources;
    // A node knows only its own installed templates; another node may have more.
    let remove_missing = state.config.role.node().is_none();
    let host_resources: Vec<(String, SandboxResources)> = state
        .config
        .host_templates
        .iter()
        .map(|t| (t.name.clone(), t.resources))
        .collect();
    blocking("syncing installed templates", move || {
        let installed: Vec<InstalledTemplate> = templates
            .list()
            .map_err(ServiceError::TemplateListing)?
            .into_iter()
            .filter(|t| !t.id.starts_with(BUILD_MANIFEST_PREFIX))
            .map(|t| {
                let resources = host_resources
                    .iter()
                    .find(|(name, _)| *name == t.id)
                    .map_or(defaults, |(_, r)| *r);
                InstalledTemplate {
                    build_id: installed_build_id(&t.layer_ids),
                    name: t.id,
                    cpu_count: resources.cpu_count,
                    memory_mb: resources.memory_mb,
                    disk_size_mb: resources.disk_size_mb,
                    envd_version: ENVD_VERSION.into(),
                    created_at: OffsetDateTime::from_unix_timestamp(t.created_at as i64)
                        .unwrap_or(OffsetDateTime::UNIX_EPOCH),
                }
            })
            .collect();
        let removed = store.sync_installed_templates(&installed, remove_missing)?;
        if !removed.is_empty() {
            tracing::info!(
                ?removed,
                "installed templates no longer in the template store"
            );
        }
        Ok(())
    })
    .await
}
