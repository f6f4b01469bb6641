//! Host templates: templates berth defines itself (`code-interpreter-v1`,
//! `mcp-gateway`) and builds with its own build engine on first use, or ahead of time
//! (`berth provision --template`).
//!
//! A host template is a build body in E2B's shape (base, steps, start and ready
//! commands) plus a context directory its COPY sources are read from. Its build's
//! result is the template store manifest named after the template itself (not
//! `build-<id>`), so once ready it is an installed template like `base`: visible to
//! every team, synced into the store ([`super::sync_installed`]), started from its
//! start command's memory checkpoint. COPY sources are packed and hashed exactly as a
//! client's uploads are and stored under the [`HOST_FILES_SCOPE`] scope, so an
//! unchanged definition rebuilds from the step cache.
//!
//! A built host template records the digest of the definition it was built from (its
//! steps with their COPY sources' hashes, commands, limits, and the version and config
//! of the template it starts from) in `<name>.definition` beside its context. A berth whose
//! definition differs (a new release, a rebuilt `base`) rebuilds it: [`ensure_built`]
//! does when asked, and `berth up` asks at start for every built one. Until the new
//! build is ready the old one serves; afterwards it stays in the template store as a
//! superseded build, so sandboxes, pauses and snapshots made from it keep their layers.
//!
//! One build per template at a time: callers that find one running wait for it.

use std::path::PathBuf;
use std::sync::Arc;

use berth_build::{BuildState, E2bBuildStart, LogEntry};

use crate::error::ServiceError;
use crate::{AppState, SandboxResources};

/// Scope of host templates' COPY uploads in the build file store (team scopes are
/// team ids, which are UUIDs, so this never collides).
pub const HOST_FILES_SCOPE: &str = "host";

/// A template this host builds itself.
#[derive(Debug, Clone)]
pub struct HostTemplate {
    /// The template's name and id (`code-interpreter-v1`); also its manifest id.
    pub name: String,
    /// Where the steps' COPY sources are read from.
    pub context: PathBuf,
    /// The build: base, steps, start and ready commands.
    pub build: E2bBuildStart,
    /// Limits of the build's sandboxes.
    pub build_resources: SandboxResources,
    /// Limits of the template's sandboxes (installed templates otherwise get the
    /// server's defaults).
    pub resources: SandboxResources,
    /// Env vars every sandbox of the template starts with, under the create's own: the
    /// operator's settings its programs read (`mcp-gateway`'s git URL). Not part of the
    /// build, so changing one rebuilds nothing.
    pub sandbox_envs: berth_api::StringMap,
}

/// The host template named `name`, if there is one.
pub(crate) fn find<'a>(state: &'a AppState, name: &str) -> Option<&'a HostTemplate> {
    state.config.host_templates.iter().find(|t| t.name == name)
}

/// Makes sure host template `name` is built from this berth's definition: returns once
/// its manifest exists and was built from the same definition, else builds it (or
/// waits for the build already running), calling `progress` with each log entry. On
/// success it is an installed template.
pub(crate) async fn ensure_built(
    state: &Arc<AppState>,
    name: &str,
    mut progress: impl FnMut(&LogEntry) + Send,
) -> Result<(), ServiceError> {
    let template = find(state, name)
        .ok_or_else(|| ServiceError::TemplateNotFound(name.to_string()))?
        .clone();
    let builds = super::builds(state)?;
    let engine = builds.engine.clone();
    let _one_build = builds.host_builds.lock().await;
    let (body, digest) = prepare(state, &template).await?;
    let built = state.templates.get(name).is_ok();
    if built && recorded_digest(&template).as_deref() == Some(digest.as_str()) {
        return super::sync_installed(state).await;
    }
    let build_id = format!("host-{name}-{}", uuid::Uuid::new_v4().simple());
    let resources = template.build_resources;
    let request = body.into_request(
        &build_id,
        &template.name,
        HOST_FILES_SCOPE,
        (
            resources.cpu_count,
            resources.memory_mb,
            resources.disk_size_mb,
        ),
    );
    match built {
        true => {
            tracing::info!(template = %name, build = %build_id, "rebuilding host template: its definition changed")
        }
        false => tracing::info!(template = %name, build = %build_id, "building host template"),
    }
    engine.start(request).map_err(ServiceError::Build)?;
    let mut shown = 0;
    let status = loop {
        let waiting = engine.clone();
        let id = build_id.clone();
        let status = tokio::task::spawn_blocking(move || waiting.wait(&id, super::WATCH_INTERVAL))
            .await
            .map_err(|source| ServiceError::Task {
                what: "waiting for a host template build",
                source,
            })?;
        for entry in engine.logs(&build_id, shown, usize::MAX) {
            shown += 1;
            progress(&entry);
        }
        match status {
            Some(status) if matches!(status.state, BuildState::Waiting | BuildState::Building) => {}
            Some(status) => break status,
            None => {
                return Err(ServiceError::HostTemplateBuild {
                    name: name.to_string(),
                    reason: "the build's record is gone".into(),
                })
            }
        }
    };
    if status.state != BuildState::Ready {
        let reason = status.reason.map_or_else(
            || "the build failed".to_string(),
            |r| match r.step {
                Some(step) => format!("step {step}: {}", r.message),
                None => r.message,
            },
        );
        return Err(ServiceError::HostTemplateBuild {
            name: name.to_string(),
            reason,
        });
    }
    berth_build::files::write_atomically(&record_path(&template), digest.as_bytes()).map_err(
        |source| ServiceError::HostTemplateContext {
            name: name.to_string(),
            source,
        },
    )?;
    tracing::info!(template = %name, build = %build_id, "host template ready");
    // Sandboxes prepared from the replaced build are not handed out any more.
    crate::sandboxes::pool::drain(state, Some(name)).await;
    super::sync_installed(state).await
}

/// Host templates that are built (whether from this berth's definition is for
/// [`ensure_built`] to find out, packing each context once).
pub(crate) fn built(state: &AppState) -> Vec<String> {
    state
        .config
        .host_templates
        .iter()
        .filter(|template| state.templates.get(&template.name).is_ok())
        .map(|template| template.name.clone())
        .collect()
}

/// `template`'s build body with its COPY sources packed and stored, and the digest of
/// everything its build's result depends on.
async fn prepare(
    state: &Arc<AppState>,
    template: &HostTemplate,
) -> Result<(E2bBuildStart, String), ServiceError> {
    let engine = super::builds(state)?.engine.clone();
    let templates = state.templates.clone();
    let prepared = template.clone();
    super::blocking("preparing a host template build", move || {
        let mut body = prepared.build.clone();
        pack_copy_sources(&engine, &prepared, &mut body)?;
        let from = body
            .from_template
            .as_deref()
            .and_then(|from| templates.get(from).ok());
        let digest = definition_digest(&prepared, &body, from.as_ref());
        Ok((body, digest))
    })
    .await
}

/// sha256 (hex) of what a host template's build result depends on.
fn definition_digest(
    template: &HostTemplate,
    packed: &E2bBuildStart,
    from: Option<&berth_template::Template>,
) -> String {
    use sha2::{Digest, Sha256};
    let resources = |r: &SandboxResources| (r.cpu_count, r.memory_mb, r.disk_size_mb);
    let definition = serde_json::json!({
        "fromTemplate": packed.from_template,
        // A derived build inherits its base's layers and config (user, env).
        "fromVersion": from.map(|t| t.version()),
        "fromConfig": from.map(|t| t.config()),
        "steps": packed.steps,
        "startCmd": packed.start_cmd,
        "readyCmd": packed.ready_cmd,
        "buildResources": resources(&template.build_resources),
        "resources": resources(&template.resources),
    });
    let digest = Sha256::digest(definition.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where the digest of the definition `template` was last built from is kept: beside
/// its context (which is rewritten at every start).
fn record_path(template: &HostTemplate) -> PathBuf {
    let file = format!("{}.definition", template.name);
    match template.context.parent() {
        Some(dir) => dir.join(file),
        None => PathBuf::from(file),
    }
}

fn recorded_digest(template: &HostTemplate) -> Option<String> {
    std::fs::read_to_string(record_path(template)).ok()
}

/// Packs every COPY source of `body` from the template's context, stores the archive
/// in the build file store and names it in the step (`filesHash`).
fn pack_copy_sources(
    engine: &berth_build::BuildEngine,
    template: &HostTemplate,
    body: &mut E2bBuildStart,
) -> Result<(), ServiceError> {
    let staging = tempfile::tempdir().map_err(|source| ServiceError::HostTemplateContext {
        name: template.name.clone(),
        source,
    })?;
    for (index, step) in body.steps.iter_mut().enumerate() {
        if !matches!(step.kind.as_str(), "COPY" | "ADD") || step.files_hash.is_some() {
            continue;
        }
        let (Some(src), Some(dest)) = (step.args.first(), step.args.get(1)) else {
            continue;
        };
        let archive = staging.path().join(format!("{index}.tar.gz"));
        let context_err = |source| ServiceError::HostTemplateContext {
            name: template.name.clone(),
            source,
        };
        let hash = berth_build::files::pack_copy_source(&template.context, src, dest, &archive)
            .map_err(context_err)?;
        let files = engine.files();
        if !files.has(HOST_FILES_SCOPE, &hash) {
            let file = std::fs::File::open(&archive).map_err(context_err)?;
            files
                .put(HOST_FILES_SCOPE, &hash, file)
                .map_err(ServiceError::Build)?;
        }
        step.files_hash = Some(hash);
    }
    Ok(())
}
